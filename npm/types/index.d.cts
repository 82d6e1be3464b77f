/**
 * Types of the CommonJS entry of @ruvector/ruvllm (`require('@ruvector/ruvllm')`): an asynchronous door
 * to the ES module, since Node 20 cannot require() an ES module.
 *
 * @example
 * const { RuvLLM } = require('@ruvector/ruvllm');
 * const llm = await RuvLLM.load({ model: './models/smollm2-135m-instruct/' }); // in an async function
 */
import type * as api from './index.js' with { 'resolution-mode': 'import' };

export type {
  LoadOptions,
  GenerateOptions,
  Chunk,
  ModelInfo,
  RuvLLMErrorType,
} from './index.js' with { 'resolution-mode': 'import' };

/** RuvLLM.load of the ES module: the same model object. */
export declare const RuvLLM: {
  load(options: api.LoadOptions): Promise<api.RuvLLM>;
};

/**
 * The error classes, as the CommonJS door has them: `instanceof` holds for every error the package throws
 * (the ES module's own classes are `(await importModule()).RuvLLMError`).
 */
export declare const RuvLLMError: typeof api.RuvLLMError;
export type RuvLLMError = api.RuvLLMError;
export declare const AbortError: typeof api.AbortError;
export type AbortError = api.AbortError;

/**
 * The ES module itself ({ RuvLLM, RuvLLMError, AbortError }), e.g. for `instanceof` checks.
 * @example
 * const { RuvLLMError } = await importModule();
 */
export declare function importModule(): Promise<typeof api>;
