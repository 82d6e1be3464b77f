// Not run: type-checked by tsc (the repository's tsconfig.json, in `./build.sh test`). The JavaScript
// facade must be what types/index.d.ts promises: each assignment fails to check when a method, its
// parameters or its answer drift from the declarations.
import * as js from '../src/index.js';
import type * as api from '../types/index.js';

// RuvLLM.load, and through its answer every member of a loaded model
export const load: typeof api.RuvLLM.load = js.RuvLLM.load;
export const model = (llm: js.RuvLLM): api.RuvLLM => llm;

// the error classes: constructible as declared, and their instances as declared
export const RuvLLMError: new (type: api.RuvLLMErrorType, message: string) => api.RuvLLMError = js.RuvLLMError;
export const AbortError: new (message?: string) => api.AbortError = js.AbortError;
