/**
 * The WebAssembly SIMD kernels (kernels/kernels.c in the ruvllm repository), started the way any
 * Pyodide starts them: by the wheel's own Python (ruvllm/host.py compiles the kernels.wasm the wheel
 * carries, checks a known answer on a memory of its own, and instantiates it on Pyodide's memory, so
 * the kernels read and write NumPy's arrays in place). The bridge then installs them into the engine.
 *
 * kernels: 'auto' uses them when this runtime validates SIMD128 and they pass the known-answer test;
 * 'wasm' requires them (a 'load' error says why they cannot run); 'numpy' never starts them. host.py
 * takes the relaxed SIMD build where the runtime validates it and it passes the test too (`relaxed`).
 */

import { RuvLLMError } from '../errors.js';
import { KERNEL_CHOICES } from '../protocol.js';

/**
 * The kernels' exports, instantiated on Pyodide's memory; `null` and the reason when they cannot run
 * (only for 'auto': with 'wasm' the reason is a 'load' error). relaxed: the exports are the relaxed SIMD
 * build's (the thread pool then loads its shared twin).
 * @param {any} py Pyodide, with the ruvllm wheel installed
 * @returns {Promise<{ exports: object | null, reason: string | null, relaxed: boolean }>}
 */
export async function startKernels(py, choice = 'auto') {
  if (!KERNEL_CHOICES.includes(choice)) {
    throw new RuvLLMError(
      'invalid_argument',
      `options.kernels must be ${KERNEL_CHOICES.join(', ')}, got ${JSON.stringify(choice)}`,
    );
  }
  if (choice === 'numpy') return { exports: null, reason: null, relaxed: false };
  const host = py.pyimport('ruvllm.host');
  const started = host.kernel_exports();
  const [exports, reason] = started.toJs({ depth: 1 });
  started.destroy();
  host.destroy();
  if (exports === null || exports === undefined) {
    if (choice === 'wasm') throw new RuvLLMError('load', `cannot use the WebAssembly kernels: ${reason}`);
    return { exports: null, reason, relaxed: false };
  }
  return { exports, reason: null, relaxed: exports.relaxed_simd() === 1 };
}
