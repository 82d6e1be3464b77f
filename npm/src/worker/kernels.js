/**
 * The WebAssembly SIMD kernels (kernels/kernels.c in the ruvllm repository) as JavaScript sees them, for
 * the benchmarks and tests that drive them without a model. They start the way any Pyodide starts them:
 * by the wheel's own Python (ruvllm/host.py compiles the kernels.wasm the wheel carries, checks a known
 * answer on a memory of its own, and instantiates it on Pyodide's memory, so the kernels read and write
 * NumPy's arrays in place). The worker has the model's loader start them (bridge.ModelLoader.start_kernels):
 * their exports never cross to JavaScript and back.
 *
 * kernels: 'auto' uses them when this runtime validates SIMD128 and they pass the known-answer test;
 * 'wasm' requires them (a 'load' error says why they cannot run); 'numpy' never starts them. host.py
 * takes the relaxed SIMD build where the runtime validates it and it passes the test too (`relaxed`).
 */

import { callBridge } from './python.js';

/**
 * The kernels' exports, instantiated on Pyodide's memory, by a model loader of their own (what the
 * worker's loader does: bridge.ModelLoader.start_kernels says what each choice means); `exports: null`
 * and the reason when they cannot run (only for 'auto': with 'wasm' the reason is a 'load' error).
 * relaxed: the exports are the relaxed SIMD build's (the thread pool then loads its shared twin).
 * @param {any} py Pyodide, with the ruvllm wheel installed
 * @param {string} [choice]
 * @returns {{ exports: object | null, running: boolean, reason: string | null, relaxed: boolean }}
 */
export function startKernels(py, choice = 'auto') {
  const bridge = py.pyimport('ruvllm.bridge');
  const loader = bridge.new_loader();
  bridge.destroy();
  try {
    const started = callBridge(loader, 'start_kernels', choice);
    return { ...started, exports: started.running ? loader.kernel_exports : null };
  } finally {
    loader.destroy();
  }
}
