// The single-thread kernels (wasm/kernels.wasm's whole-product exports, called as quant/wasm.py calls
// them) on a memory of their own: the reference the kernel tests compare against.
const GROUP = 32;

/**
 * y = x @ W.T (float32, T * N) for matrix `m` = { form: 'dense' | 'q8' | 'q8h' | 'q4', N, K, w, scales,
 * mins (or null), offset } (typed arrays), with the fast arithmetic when `fast` and T <= fastRows (as
 * the engine runs it: decoding products only; the kernels take any T).
 * @param {WebAssembly.Module} module kernels.wasm
 */
export function referenceProduct(module, m, x, T, fast, fastRows = 4) {
  const memory = new WebAssembly.Memory({ initial: 2 });
  const k = /** @type {any} */ (new WebAssembly.Instance(module, { env: { memory } })).exports;
  let top = 1024; // address 0 means "no mins"; start past it
  const alloc = (bytes) => {
    const at = top;
    top += Math.ceil(bytes / 16) * 16 + 16;
    const pages = Math.ceil(top / 65536) - memory.buffer.byteLength / 65536;
    if (pages > 0) memory.grow(pages);
    return at;
  };
  const put = (a) => {
    const bytes = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    const at = alloc(bytes.length);
    new Uint8Array(memory.buffer, at, bytes.length).set(bytes);
    return at;
  };
  const { N, K } = m;
  const G = K / GROUP;
  const xAt = put(x);
  const y = alloc(4 * T * N);
  if (m.form === 'dense') {
    k.dense(xAt, put(m.w), y, T, N, K);
  } else {
    const w = put(m.w);
    const scales = put(m.scales);
    const mins = m.mins ? put(m.mins) : 0;
    if (fast && T <= fastRows) {
      const xq = alloc(T * (4 * K + 12 * G)); // quantize_x's outputs (kernels.c QUANTIZED_X_BYTES)
      const d = xq + 2 * T * K;
      const xs = d + 4 * T * G;
      k.quantize_x(xAt, xq, d, xs, T, K);
      k[`${m.form}_fast`](xq, d, xs, w, scales, mins, m.offset, y, T, N, K);
    } else {
      k[`${m.form}_exact`](xAt, w, scales, mins, m.offset, y, alloc(4 * Math.max(T * G, 16 * K)), T, N, K);
    }
  }
  return new Float32Array(memory.buffer.slice(y, y + 4 * T * N));
}

/**
 * y + dy[:, n0:n1] @ W[n0:n1, k0:k1] in columns k0..k1 of y (float32, T * K; the others as given) through
 * the backward pass's exports (`dense_t`, `q8_t`, `q8h_t`, `q4_t`), for matrix `m` as in referenceProduct;
 * dy float32 (T, N), y the starting values (float32, T * K).
 * @param {WebAssembly.Module} module kernels.wasm
 */
export function referenceTransposed(module, m, dy, y, T, [n0, n1, k0, k1]) {
  const { N, K } = m;
  const bytes = dy.byteLength + y.byteLength + m.w.byteLength + (m.scales?.byteLength ?? 0);
  const memory = new WebAssembly.Memory({ initial: Math.ceil((2 * bytes + 16 * 4 * K + 8192) / 65536) + 1 });
  const k = /** @type {any} */ (new WebAssembly.Instance(module, { env: { memory } })).exports;
  let top = 1024; // address 0 means "no mins"; start past it
  const put = (a) => {
    const at = top;
    top += Math.ceil(a.byteLength / 16) * 16 + 16;
    new Uint8Array(memory.buffer, at, a.byteLength).set(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
    return at;
  };
  const dyAt = put(dy);
  const yAt = put(y);
  if (m.form === 'dense') {
    k.dense_t(dyAt, put(m.w), yAt, T, N, K, n0, n1, k0, k1);
  } else {
    const w = put(m.w);
    const scales = put(m.scales);
    const mins = m.mins ? put(m.mins) : 0;
    const scratch = top;
    k[`${m.form}_t`](dyAt, w, scales, mins, m.offset, yAt, scratch, T, N, K, n0, n1, k0, k1);
  }
  return new Float32Array(memory.buffer.slice(yAt, yAt + 4 * T * K));
}

/**
 * y = p @ v (float32, Q * E) through the `mix` export (attention's mix: p (Q, S), v (S, E)).
 * @param {WebAssembly.Module} module kernels.wasm
 */
export function referenceMix(module, p, v, Q, S, E) {
  const bytes = 4 * (Q * S + S * E + Q * E) + 3 * 16 + 1024;
  const memory = new WebAssembly.Memory({ initial: Math.ceil(bytes / 65536) + 1 });
  const k = /** @type {any} */ (new WebAssembly.Instance(module, { env: { memory } })).exports;
  const pAt = 1024;
  const vAt = pAt + Math.ceil((4 * Q * S) / 16) * 16;
  const yAt = vAt + Math.ceil((4 * S * E) / 16) * 16;
  new Uint8Array(memory.buffer, pAt, p.byteLength).set(p);
  new Uint8Array(memory.buffer, vAt, v.byteLength).set(v);
  k.mix(pAt, vAt, yAt, Q, S, E);
  return new Float32Array(memory.buffer.slice(yAt, yAt + 4 * Q * E));
}

/**
 * Python (for Pyodide) that makes `matrices`: one random 200 x 576 float32 matrix in every form the
 * kernels compute (float32, q8, q4_0 and q4_1 as int8 codes, q4_0 and q4_1 as nibbles).
 * @param {number} seed
 */
export const randomMatrices = (seed) => `
import numpy as np
from ruvllm.files.formats import get_format
from ruvllm.quant.matrices import DenseMatrix, Int4Matrix, Int8Matrix

rng = np.random.default_rng(${seed})
w = rng.standard_normal((200, 576)).astype(np.float32)
matrices = [DenseMatrix(w, "einsum")]
for fmt in ("q8", "q4_0", "q4_1"):
    parts = get_format(fmt).quantize(w)
    matrices.append(Int8Matrix.from_parts(fmt, parts, "einsum"))
    if fmt != "q8":
        matrices.append(Int4Matrix.from_parts(fmt, parts, "einsum"))
`;
