// Runs the WebAssembly kernels (wasm/kernels.wasm, or the build named on the command line) on arrays
// given by tests/test_kernels.py, in a plain WebAssembly runtime (Node, no Pyodide), and answers with
// their outputs; the test compares them with NumPy's products.
//
// stdin: JSON {cases: [{call, T, N, K, offset, arrays: {name: base64 bytes}}]}, call one of dense,
// q8_exact, q4_exact, q8_fast, q4_fast, or mix (attention's: y (T, N) = x (T, K) @ w (K, N)); arrays x
// (float32 T*K), w (the matrix's bytes), scales, and mins when the matrix has them. stdout: JSON [base64
// of y (float32 T*N)] in the order of the cases. The backward's dense_t, q8_t, q8h_t, q4_t: x is dy
// (float32 T*N), y the starting y (float32 T*K), `range` [n0, n1, k0, k1]; the answer is y (T*K).
import { readFileSync } from 'node:fs';

import { referenceMix, referenceProduct, referenceTransposed } from './kernels-reference.js';

// argv: the module to run (wasm/kernels.wasm when not given; tests/test_kernels.py runs every build)
const file = process.argv[2] ?? new URL('../../wasm/kernels.wasm', import.meta.url);
const module = new WebAssembly.Module(readFileSync(file));
const request = JSON.parse(readFileSync(0, 'utf8'));

function run({ call, T, N, K, offset, arrays, range }) {
  const bytes = (name) => (arrays[name] ? new Uint8Array(Buffer.from(arrays[name], 'base64')) : null);
  if (call === 'mix') {
    // attention's mix: x is p (T, K), w is v (K, N): y (T, N) = p @ v
    const y = referenceMix(module, bytes('x'), bytes('w'), T, K, N);
    return Buffer.from(y.buffer).toString('base64');
  }
  const x = bytes('x');
  if (call.endsWith('_t')) {
    const matrix = {
      form: call.slice(0, -2),
      N,
      K,
      offset,
      w: bytes('w'),
      scales: bytes('scales'),
      mins: bytes('mins'),
    };
    const y = referenceTransposed(module, matrix, x, bytes('y'), T, range);
    return Buffer.from(y.buffer).toString('base64');
  }
  const matrix = {
    form: call.split('_')[0],
    N,
    K,
    offset,
    w: bytes('w'),
    scales: bytes('scales'),
    mins: bytes('mins'),
  };
  const y = referenceProduct(module, matrix, x, T, call.endsWith('_fast'), Infinity);
  return Buffer.from(y.buffer).toString('base64');
}

process.stdout.write(JSON.stringify(request.cases.map(run)));
