// Where the tests and benchmarks find a local Pyodide distribution (see docs/pyodide.md).
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

import { PYODIDE_VERSION } from '../../src/worker/python.js';

export const DIST = process.env.RUVLLM_PYODIDE_DIST || join(homedir(), '.cache', 'ruvllm', 'pyodide', PYODIDE_VERSION);
export const HAVE_DIST = existsSync(join(DIST, 'pyodide.asm.wasm')) && existsSync(join(DIST, 'pyodide-lock.json'));
