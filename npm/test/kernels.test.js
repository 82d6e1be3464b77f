// The WebAssembly SIMD kernels as the worker starts them (src/worker/kernels.js, through the wheel's
// host.py), and inside Pyodide:
// products of every compute form against NumPy's, before and after Pyodide's memory grows. The
// Pyodide part needs a local distribution (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1).
// tests/test_kernels.py checks the kernels' arithmetic in a plain wasm runtime, without Pyodide.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { describe, test } from 'node:test';

import { RuvLLMError } from '../src/errors.js';
import { startKernels } from '../src/worker/kernels.js';
import { startPython } from '../src/worker/python.js';
import { DIST, HAVE_DIST } from './support/dist.js';
import { randomMatrices } from './support/kernels-reference.js';
import { NO_RELAXED, RELAXED_RUN, relaxedHere, runTestsRelaxed } from './support/relaxed.js';

const BUILT = existsSync(new URL('../wasm/kernels.wasm', import.meta.url));
const NOT_BUILT = BUILT ? false : 'the kernels are not built: ./build.sh kernels';
const SKIP = !BUILT
  ? NOT_BUILT
  : HAVE_DIST
    ? false
    : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`;

describe('starting the kernels', () => {
  test("'auto' and 'wasm' start them from the wheel's Python (host.py); 'numpy' does not", { skip: SKIP }, async () => {
    const { py } = await startPython({ indexURL: DIST });
    for (const choice of ['auto', 'wasm']) {
      const { exports, reason } = await startKernels(py, choice);
      assert.equal(reason, null);
      assert.equal(typeof exports.q4_exact, 'function');
    }
    assert.deepEqual(await startKernels(py, 'numpy'), { exports: null, running: false, reason: null, relaxed: false });
    // the known-answer test checks every answer it computes: each one made wrong in turn fails it
    const verdicts = py.runPython(`
import js
import ruvllm.host as h
from pyodide.ffi import to_js
module, real = js.WebAssembly.Module.new(to_js(h.kernels_wasm())), h.known_answer
def made_wrong(name):
    case = real()
    case[name] = case[name] + 1
    return case
verdicts = [h._self_test(js, module)]
for name in ("answer", "answer_fast", "answer_fast8"):
    h.known_answer = lambda: made_wrong(name)
    verdicts.append(h._self_test(js, module))
h.known_answer = real
verdicts`);
    assert.deepEqual(verdicts.toJs(), [true, false, false, false]);
    verdicts.destroy();
    // a wheel without its kernels: 'auto' says why it runs NumPy's, 'wasm' is a load error saying it
    py.runPython('import ruvllm.host as h; h.kernels_wasm = lambda: None; h.kernel_exports.cache_clear()');
    const auto = await startKernels(py, 'auto');
    assert.equal(auto.exports, null);
    assert.match(auto.reason, /this ruvllm wheel has no quant\/kernels.wasm/);
    assert.throws(
      () => startKernels(py, 'wasm'),
      (e) =>
        e instanceof RuvLLMError &&
        e.type === 'load' &&
        /cannot use the WebAssembly kernels: this ruvllm wheel/.test(e.message),
    );
  });

  // host.py takes the relaxed SIMD build where the runtime validates it and its known-answer test
  // passes, else the plain one
  test(
    'the relaxed SIMD build where it validates and answers right, the plain one elsewhere',
    { skip: SKIP || NO_RELAXED },
    async () => {
      const { py } = await startPython({ indexURL: DIST });
      const { exports, relaxed } = await startKernels(py, 'wasm');
      assert.equal(exports.relaxed_simd(), relaxedHere() ? 1 : 0);
      assert.equal(relaxed, relaxedHere());
      if (!RELAXED_RUN) {
        runTestsRelaxed(import.meta.url, 'the relaxed SIMD build where', 1); // this test, where it validates
        return;
      }
      // the relaxed build failing its known-answer test: the plain one runs, for 'wasm' too
      py.runPython(`
import ruvllm.host as h
tested = []
right = h._self_test
h._self_test = lambda js, module: (tested.append(module), len(tested) > 1 and right(js, module))[1]
h.kernel_exports.cache_clear()`);
      const plain = await startKernels(py, 'wasm');
      assert.equal(plain.exports.relaxed_simd(), 0);
      assert.equal(plain.relaxed, false);
      assert.equal(py.runPython('len(tested)'), 2); // the relaxed build, refused; then the plain one
    },
  );

  test('a wrong choice is an invalid_argument error naming the choices', { skip: SKIP }, async () => {
    const { py } = await startPython({ indexURL: DIST });
    assert.throws(
      () => startKernels(py, 'simd'),
      (e) => e.type === 'invalid_argument' && /auto, wasm, numpy, got "simd"/.test(e.message),
    );
  });
});

// Every form, decoding (1 row) and prompt (40 rows) products, with the wasm provider and with NumPy;
// then Pyodide's memory grows by ~1 GiB and the same prepared matrices multiply new arrays again.
const PRODUCTS = `${randomMatrices(0)}
from ruvllm.quant.wasm import WasmKernels
def twins(arithmetic):
    """A copy of each matrix (the same arrays) whose products run in the kernels."""
    provider = WasmKernels(kernel_exports, arithmetic)
    out = []
    for m in matrices:
        twin = type(m).__new__(type(m))
        twin.__dict__.update(m.__dict__)
        twin.use_provider(provider)
        out.append(twin)
    return out

exact, fast = twins("exact"), twins("fast")

def worst_error(copies):
    """Largest |wasm - NumPy| / max|NumPy| over every form, for fresh x of 1 and 40 rows."""
    worst = 0.0
    for T in (1, 40):
        x = rng.standard_normal((T, 576)).astype(np.float32)
        for m, twin in zip(matrices, copies):
            ref = m(x)
            worst = max(worst, float(np.abs(twin(x) - ref).max() / np.abs(ref).max()))
    return worst
`;

describe('the kernels inside Pyodide', { skip: SKIP }, () => {
  test('products equal NumPy before and after the heap grows', async () => {
    const { py } = await startPython({ indexURL: DIST });
    const { exports } = await startKernels(py, 'wasm');
    py.globals.set('kernel_exports', exports);
    py.runPython(PRODUCTS);
    const errors = () => py.runPython('[worst_error(exact), worst_error(fast)]').toJs();
    const before = errors();
    const heapBefore = py._module.memory.buffer.byteLength;
    py.runPython('ballast = np.ones(2**28, dtype=np.float32)'); // 1 GiB: the memory must grow
    const heapAfter = py._module.memory.buffer.byteLength;
    const after = errors();
    assert.ok(heapAfter > heapBefore + 2 ** 29, `the heap grew from ${heapBefore} to ${heapAfter}`);
    // exact: float32 rounding only; fast: x rounded to 15 bits per group of 32
    for (const [when, [exact, fast]] of [
      ['before', before],
      ['after', after],
    ]) {
      assert.ok(exact < 1e-5, `${when} growth: exact relative error ${exact}`);
      assert.ok(fast < 1e-3, `${when} growth: fast relative error ${fast}`);
    }
    py.runPython('del ballast');
  });
});
