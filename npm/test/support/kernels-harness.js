// Runs the WebAssembly kernels (wasm/kernels.wasm) on arrays given by tests/test_kernels.py, in a plain
// WebAssembly runtime (Node, no Pyodide), and answers with their outputs; the test compares them with
// NumPy's products.
//
// stdin: JSON {cases: [{call, T, N, K, offset, arrays: {name: base64 bytes}}]}, call one of dense,
// q8_exact, q4_exact, q8_fast, q4_fast; arrays x (float32 T*K), w (the matrix's bytes), scales, and
// mins when the matrix has them. stdout: JSON [base64 of y (float32 T*N)] in the order of the cases.
import { readFileSync } from 'node:fs';

const module = new WebAssembly.Module(readFileSync(new URL('../../wasm/kernels.wasm', import.meta.url)));
const request = JSON.parse(readFileSync(0, 'utf8'));
const GROUP = 32;

function run({ call, T, N, K, offset, arrays }) {
  const memory = new WebAssembly.Memory({ initial: 2 });
  const { exports } = new WebAssembly.Instance(module, { env: { memory } });
  let top = 1024; // address 0 means "no mins"; start past it
  const alloc = (bytes) => {
    const at = top;
    top += Math.ceil(bytes / 16) * 16 + 16;
    const pages = Math.ceil(top / 65536) - memory.buffer.byteLength / 65536;
    if (pages > 0) memory.grow(pages);
    return at;
  };
  const put = (b64) => {
    const bytes = Buffer.from(b64, 'base64');
    const at = alloc(bytes.length);
    new Uint8Array(memory.buffer, at, bytes.length).set(bytes);
    return at;
  };
  const x = put(arrays.x);
  const w = put(arrays.w);
  const scales = arrays.scales ? put(arrays.scales) : 0;
  const mins = arrays.mins ? put(arrays.mins) : 0;
  const y = alloc(T * N * 4);
  const G = K / GROUP;
  if (call === 'dense') exports.dense(x, w, y, T, N, K);
  else if (call.endsWith('_exact')) {
    const scratch = alloc(4 * Math.max(T * G, 16 * K));
    exports[call](x, w, scales, mins, offset, y, scratch, T, N, K);
  } else {
    const xq = alloc(2 * T * K); // int16
    const d = alloc(4 * T * G);
    const xs = alloc(4 * T * G);
    exports.quantize_x(x, xq, d, xs, T, K);
    exports[call](xq, d, xs, w, scales, mins, offset, y, T, N, K);
  }
  return Buffer.from(new Uint8Array(memory.buffer, y, T * N * 4)).toString('base64');
}

process.stdout.write(JSON.stringify(request.cases.map(run)));
