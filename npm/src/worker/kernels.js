/**
 * The WebAssembly SIMD kernels (kernels/kernels.c in the ruvllm repository, built by ./build.sh into
 * wasm/kernels.wasm of this package): instantiated on Pyodide's own WebAssembly.Memory, so they read
 * and write NumPy's arrays in place, then handed to the bridge, which installs them into the engine.
 *
 * kernels: 'auto' uses them when this runtime validates SIMD128 and they pass a known-answer test;
 * 'wasm' requires them (a 'load' error says why they cannot run); 'numpy' never loads them.
 */

import { RuvLLMError } from '../errors.js';
import { KERNEL_CHOICES } from '../protocol.js';
import { readPackageFile } from './python.js';

/**
 * A known answer: y = x @ W.T for x = [1, 2, ..., 32] and two rows of q4 codes (0..15, the second row
 * reversed) with scale 0.5 and min -1, through the decoding (1 row) and the tiled (5 rows) paths, and
 * a float32 product. Run on a memory of its own, so a runtime whose SIMD computes wrongly is found
 * before the kernels touch Pyodide's memory.
 */
function selfTest(module) {
  const memory = new WebAssembly.Memory({ initial: 2 }); // the module declares a minimum of 2 pages
  const exports = /** @type {Record<string, (...args: number[]) => number>} */ (
    new WebAssembly.Instance(module, { env: { memory } }).exports
  );
  const f32 = new Float32Array(memory.buffer);
  const u8 = new Uint8Array(memory.buffer);
  const at = { x: 0, packed: 1024, scales: 2048, mins: 2064, y: 2080, scratch: 4096, dense: 8192 }; // bytes
  const code = (n, k) => (n === 0 ? k % 16 : 15 - (k % 16));
  for (let t = 0; t < 5; t++) for (let k = 0; k < 32; k++) f32[at.x / 4 + t * 32 + k] = k + 1;
  for (let n = 0; n < 2; n++) {
    for (let j = 0; j < 16; j++) u8[at.packed + n * 16 + j] = code(n, j) | (code(n, j + 16) << 4);
    f32[at.scales / 4 + n] = 0.5;
    f32[at.mins / 4 + n] = -1;
    for (let k = 0; k < 32; k++) f32[at.dense / 4 + n * 32 + k] = 0.5 * code(n, k) - 1;
  }
  const expected = [0, 1].map((n) => {
    let s = 0;
    for (let k = 0; k < 32; k++) s += (k + 1) * (0.5 * code(n, k) - 1);
    return s;
  });
  const q4 = (rows) => exports.q4_exact(at.x, at.packed, at.scales, at.mins, 0, at.y, at.scratch, rows, 2, 32);
  const runs = [() => q4(1), () => q4(5), () => exports.dense(at.x, at.dense, at.y, 1, 2, 32)];
  for (const run of runs) {
    f32.fill(NaN, at.y / 4, at.y / 4 + 10);
    run();
    for (let i = 0; i < 2; i++) if (f32[at.y / 4 + i] !== expected[i]) return false;
  }
  return true;
}

/** Pyodide's WebAssembly.Memory, or null where this Pyodide does not expose it. */
function pyodideMemory(py) {
  // Pyodide has no public handle on its memory
  const memory = py._module?.memory;
  return memory instanceof WebAssembly.Memory ? memory : null;
}

/**
 * The kernels' exports, instantiated on Pyodide's memory; `null` and the reason when they cannot run
 * (only for 'auto': with 'wasm' the reason is a 'load' error).
 */
export async function startKernels(py, choice = 'auto') {
  if (!KERNEL_CHOICES.includes(choice)) {
    throw new RuvLLMError(
      'invalid_argument',
      `options.kernels must be ${KERNEL_CHOICES.join(', ')}, got ${JSON.stringify(choice)}`,
    );
  }
  if (choice === 'numpy') return { exports: null, reason: null };
  const unavailable = (reason) => {
    if (choice === 'wasm') throw new RuvLLMError('load', `cannot use the WebAssembly kernels: ${reason}`);
    return { exports: null, reason };
  };
  let bytes;
  try {
    bytes = await readPackageFile('../../wasm/kernels.wasm');
  } catch (error) {
    return unavailable(`this package has no wasm/kernels.wasm (${error.message}); ./build.sh kernels makes it`);
  }
  if (!WebAssembly.validate(bytes)) return unavailable('this runtime does not support WebAssembly SIMD128');
  const memory = pyodideMemory(py);
  if (!memory) return unavailable('this Pyodide does not expose its WebAssembly memory (pyodide._module.memory)');
  const module = await WebAssembly.compile(bytes);
  if (!selfTest(module)) return unavailable("this runtime's SIMD128 gave a wrong answer on the kernels' self-test");
  const instance = await WebAssembly.instantiate(module, { env: { memory } });
  return { exports: instance.exports, reason: null };
}
