// The kernel thread pool (src/worker/pool.js): products on 1, 2 and 3 threads are the single-thread
// kernels' products bit for bit, for every matrix form, exact and fast arithmetic, awkward shapes (N not
// a multiple of the thread count or of the tile height, K of one group, many and few rows), also after
// the pool memory grows between products; and dispose() ends every thread, so a program exits by itself.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { RuvLLMError } from '../src/errors.js';
import { startKernels } from '../src/worker/kernels.js';
import { startPool } from '../src/worker/pool.js';
import { Adaptive, PLAN } from '../src/worker/pool-chooser.js';
import { CTL, DEFAULT_SPIN_US, announce, columns, open, slice, work } from '../src/worker/pool-protocol.js';
import { startPython } from '../src/worker/python.js';
import { startThreads } from '../src/worker/threads.js';
import { DIST, HAVE_DIST } from './support/dist.js';
import { randomMatrices, referenceProduct, referenceTransposed } from './support/kernels-reference.js';
import { random } from './support/random.js';
import { NO_RELAXED, RELAXED_RUN, runTestsRelaxed } from './support/relaxed.js';

// The build under test: the plain one, or (in the Node the last test below starts) the relaxed SIMD one.
const BUILD = RELAXED_RUN ? 'kernels-relaxed' : 'kernels';
const WASM = new URL(`../wasm/${BUILD}.wasm`, import.meta.url);
const SHARED = new URL(`../wasm/${BUILD}-shared.wasm`, import.meta.url);
const SKIP = existsSync(WASM) && existsSync(SHARED) ? false : `the kernels are not built: ./build.sh kernels`;
const GROUP = 32;

/** A random matrix of `form` (N, K): its parts as typed arrays, as matrices.py keeps them. */
function matrix(form, N, K, rand) {
  const G = K / GROUP;
  const floats = (n, lo, hi) => Float32Array.from({ length: n }, () => lo + (hi - lo) * rand());
  if (form === 'dense') return { form, N, K, w: floats(N * K, -1, 1) };
  if (form === 'q4') {
    const withMins = rand() < 0.5;
    return {
      form,
      N,
      K,
      w: Uint8Array.from({ length: (N * K) / 2 }, () => Math.floor(256 * rand())),
      scales: floats(N * G, 0.001, 0.05),
      mins: withMins ? floats(N * G, -0.3, 0) : null,
      offset: withMins ? 0 : 8,
    };
  }
  const scaleCount = form === 'q8h' ? 2 * N * G : N * G;
  return {
    form,
    N,
    K,
    w: Int8Array.from({ length: N * K }, () => Math.floor(256 * rand()) - 128),
    scales: floats(scaleCount, 0.0005, 0.01),
    mins: form === 'q8' ? floats(N * G, -0.2, 0.2) : null,
    offset: 0,
  };
}

/** The single-thread product (kernels.wasm's whole-product exports, as WasmKernels calls them). */
const reference = (m, x, T, fast) => referenceProduct(new WebAssembly.Module(readFileSync(WASM)), m, x, T, fast);

/** The matrix placed in the pool: its handle. */
function place(pool, m) {
  const parts = { form: m.form, N: m.N, K: m.K, w: pool.place(m.w), offset: m.offset ?? 0 };
  if (m.scales) parts.scales = pool.place(m.scales);
  if (m.mins) parts.mins = pool.place(m.mins);
  return pool.matrix(parts);
}

const bits = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
const module = SKIP ? null : new WebAssembly.Module(readFileSync(SHARED));

// [form, N, K]: N of one row, below a tile, not a multiple of 16 or of 2 or 3, several tiles
const SHAPES = [
  ['q4', 1, 32],
  ['q4', 37, 64],
  ['q4', 130, 96],
  ['q8', 5, 32],
  ['q8', 49, 64],
  ['q8h', 17, 64],
  ['q8h', 100, 32],
  ['dense', 3, 40],
  ['dense', 50, 64],
  ['dense', 161, 36],
];
const ROWS = [1, 2, 4, 5, 21];

test('a thread late from the dispatch before claims none of the next one, whatever its unit count', () => {
  // The interleaving a busy machine made (3 threads on 2 cores: "60 of 36 units done", then a stall): a
  // dispatch of 12 units ends, the next (36: q, k and v) is announced, and a thread that read NEXT during
  // the first only now reads the unit count. Computing units here needs no kernels: the job's slices are
  // empty (N = 0), so `work` only claims and counts.
  const ctl = new Int32Array(new SharedArrayBuffer(4096));
  const kernels = {};
  const claimed = (gen) => {
    const before = Atomics.load(ctl, CTL.DONE);
    work(kernels, ctl, gen, 1);
    return Atomics.load(ctl, CTL.DONE) - before;
  };
  announce(ctl, 12, 12);
  open(ctl, 7);
  assert.equal(claimed(7), 12);
  announce(ctl, 12, 36); // the caller is preempted here, before `open`
  assert.equal(claimed(7), 0, 'the late thread claimed units of the old dispatch into the new one');
  assert.equal(Atomics.load(ctl, CTL.DONE), 0);
  open(ctl, 8);
  assert.equal(claimed(7), 0);
  assert.equal(claimed(8), 36);
  assert.equal(claimed(8), 0);
});

describe('the kernel thread pool', { skip: SKIP }, () => {
  test('slices cover the output features once, in whole tiles', () => {
    for (const N of [1, 15, 16, 17, 100, 1000])
      for (const threads of [1, 2, 3, 5, 8]) {
        let next = 0;
        for (let i = 0; i < threads; i++) {
          const [n0, n1] = slice(N, i, threads);
          if (n1 <= n0) continue;
          assert.equal(n0, next);
          assert.equal(n0 % 16, 0);
          next = n1;
        }
        assert.equal(next, N);
      }
  });

  // threads wait by a spin (the default), then asleep, or asleep at once (spin 0)
  for (const [threads, spin] of [
    [1, DEFAULT_SPIN_US],
    [2, DEFAULT_SPIN_US],
    [2, 0],
    [3, DEFAULT_SPIN_US],
  ]) {
    test(`products on ${threads} thread(s), spin ${spin} µs, equal the single-thread kernels bit for bit`, async () => {
      const pool = await startPool(module, { threads, spin });
      try {
        const rand = random(threads * 7919);
        for (const [form, N, K] of SHAPES) {
          const m = matrix(form, N, K, rand);
          const handle = place(pool, m);
          for (const T of ROWS) {
            const x = Float32Array.from({ length: T * K }, () => 4 * rand() - 2);
            for (const fast of [false, true]) {
              const y = new Float32Array(T * N);
              pool.run([handle], x, T, [y], fast);
              const want = reference(m, x, T, fast);
              assert.ok(bits(y).equals(bits(want)), `${form} N=${N} K=${K} T=${T} fast=${fast}`);
            }
          }
          pool.alloc(3 * 65536 + 5); // the memory grows between products
        }
      } finally {
        await pool.dispose();
      }
    });
  }

  test("learning's backward product (y += dy @ W) on 1, 2 and 3 threads equals the single-thread kernel bit for bit", async () => {
    for (const K of [32, 40, 96, 1000])
      for (const slices of [1, 2, 3, 12]) {
        let next = 0;
        for (let i = 0; i < slices; i++) {
          const [k0, k1] = columns(K, i, slices);
          if (k1 <= k0) continue;
          assert.equal(k0, next);
          assert.equal(k0 % 32, 0);
          next = k1;
        }
        assert.equal(next, K);
      }
    const single = new WebAssembly.Module(readFileSync(WASM));
    for (const threads of [1, 2, 3]) {
      const pool = await startPool(module, { threads });
      try {
        const rand = random(threads * 104729);
        for (const [form, N, K] of SHAPES) {
          const m = matrix(form, N, K, rand);
          const handle = place(pool, m);
          for (const T of [1, 5]) {
            const dy = Float32Array.from({ length: T * N }, () => 4 * rand() - 2);
            const start = Float32Array.from({ length: T * K }, () => rand());
            for (const rows of [
              [0, N],
              [Math.floor(N / 3), N],
            ]) {
              const y = start.slice();
              pool.transposed(handle, dy, T, y, ...rows);
              const want = referenceTransposed(single, m, dy, start, T, [...rows, 0, K]);
              assert.ok(bits(y).equals(bits(want)), `${form} N=${N} K=${K} T=${T} rows ${rows}`);
            }
          }
        }
        const m = matrix('q8', 4, 32, rand);
        assert.throws(
          () => pool.transposed(place(pool, m), new Float32Array(4), 1, new Float32Array(32), 0, 5),
          /rows 0..5/,
        );
      } finally {
        await pool.dispose();
      }
    }
  });

  test('a caller asleep for the last units is woken by the thread that counts the last one', async (t) => {
    // prompt-sized products: units of milliseconds, past the caller's short spin, so it sleeps (spin 0)
    const pool = await startPool(module, { threads: 2, spin: 0 });
    try {
      const rand = random(17);
      const [N, K, T] = [2048, 4096, 64];
      const m = matrix('dense', N, K, rand);
      const handle = place(pool, m);
      const x = Float32Array.from({ length: T * K }, () => 4 * rand() - 2);
      const want = reference(m, x, T, false);
      for (let i = 0; i < 8; i++) {
        const y = new Float32Array(T * N);
        pool.run([handle], x, T, [y]);
        assert.ok(bits(y).equals(bits(want)), `product ${i}`);
      }
      t.diagnostic(`the caller slept for the last units of ${pool.waits} of 8 dispatches`);
      // woken by the last unit's notify, never by its own CHECK_MS timeout with the work done
      assert.equal(pool.lateWakes, 0);
    } finally {
      await pool.dispose();
    }
  });

  test('Adaptive tries all threads, then one, an epoch each, keeps the faster and tries the other again later', () => {
    const a = new Adaptive(4);
    // an epoch of dispatches on the chosen count (each of 1000 units of work, msPerWork(count) ms a
    // unit): the counts it ran on
    const epoch = (msPerWork) => {
      const counts = new Set();
      for (let i = 0; i < Adaptive.EPOCH; i++) {
        const count = a.choose('decode');
        counts.add(count);
        a.record('decode', count, msPerWork(count) * 1000, 1000);
      }
      return [...counts];
    };
    const allFaster = (count) => (count === 4 ? 1e-6 : 2e-6);
    assert.deepEqual(epoch(allFaster), [4]); // all of them first, for a whole epoch
    assert.deepEqual(epoch(allFaster), [1]); // then one
    const chosen = [];
    for (let i = 0; i < 12; i++) chosen.push(...epoch(allFaster));
    assert.deepEqual(chosen.slice(0, Adaptive.FIRST_INTERVAL), [4, 4]); // the faster holds ...
    assert.ok(chosen.includes(1), `one thread is tried again: ${chosen}`); // ... and the other is tried again
    assert.ok(chosen.filter((c) => c === 1).length <= 3, `${chosen}`); // less and less often while it holds
    assert.equal(a.best('decode'), 4);
    for (let i = 0; i < 12; i++) epoch((count) => (count === 4 ? 5e-6 : 2e-6)); // the machine got busy
    assert.deepEqual([a.choose('decode'), a.best('decode')], [1, 1]);
    assert.deepEqual([a.choose('other'), a.best('other')], [4, 4]); // each phase on its own: all first
    // a decode plan's calls (each a whole token) take epochs of PLAN_EPOCH calls
    for (let i = 0; i < Adaptive.PLAN_EPOCH; i++) a.record(PLAN, a.choose(PLAN), 10, 1);
    assert.equal(a.choose(PLAN), 1);
    assert.ok(Adaptive.PLAN_EPOCH < Adaptive.EPOCH);
    // a dispatch recorded on a count other than the phase's (chosen before its epoch ended) is not counted
    const b = new Adaptive(2);
    b.record('decode', 1, 1, 1);
    assert.equal(b.phases.get('decode').dispatches, 0);
  });

  test('an adaptive pool switches between one thread and all, with the same bits', async () => {
    const pool = await startPool(module, { threads: 3, adaptive: true, spin: DEFAULT_SPIN_US });
    try {
      const rand = random(11);
      const m = matrix('q4', 100, 64, rand);
      const handle = place(pool, m);
      for (let i = 0; i < 6 * Adaptive.EPOCH; i++) {
        const T = i % 2 ? 1 : 7; // (decoding rows, tried on 3 threads and on 1; prompt rows follow them)
        const x = Float32Array.from({ length: T * 64 }, () => rand() - 0.5);
        const y = new Float32Array(T * 100);
        const onAll = pool.dispatches.get(3) ?? 0;
        const gen = Atomics.load(pool.ctl, CTL.GEN);
        pool.run([handle], x, T, [y], true);
        assert.ok(bits(y).equals(bits(reference(m, x, T, true))), `product ${i}`);
        // a dispatch on one thread runs in the caller alone: the threads are not told of it (GEN stays)
        // and their spin is left as it was, so those spinning are awake for a dispatch on all of them
        const onOne = (pool.dispatches.get(3) ?? 0) === onAll;
        assert.equal(Atomics.load(pool.ctl, CTL.GEN) === gen, onOne, `product ${i}`);
        assert.equal(Atomics.load(pool.ctl, CTL.SPIN), DEFAULT_SPIN_US, `product ${i}`);
      }
      assert.ok(pool.dispatches.get(1) > 0 && pool.dispatches.get(3) > 0, `${[...pool.dispatches]}`);
      // once products stop, the threads' spin runs out and they sleep (a hang guard, not a timing)
      for (let waited = 0; Atomics.load(pool.ctl, CTL.SLEEPERS) < 2; waited += 10) {
        assert.ok(waited < 30000, `${Atomics.load(pool.ctl, CTL.SLEEPERS)} of 2 threads asleep after 30 s`);
        await new Promise((done) => setTimeout(done, 10));
      }
    } finally {
      await pool.dispose();
    }
  });

  test('a fused dispatch (matrices sharing x) gives each product, and survives the memory growing', async () => {
    const pool = await startPool(module, { threads: 3 });
    try {
      const rand = random(42);
      const ms = [matrix('q4', 70, 64, rand), matrix('q8', 33, 64, rand), matrix('dense', 18, 64, rand)];
      const handles = ms.map((m) => place(pool, m));
      for (const T of [1, 3, 9]) {
        for (const fast of [false, true]) {
          const x = Float32Array.from({ length: T * 64 }, () => rand() - 0.5);
          const ys = ms.map((m) => new Float32Array(T * m.N));
          pool.run(handles, x, T, ys, fast);
          ms.forEach((m, j) => assert.ok(bits(ys[j]).equals(bits(reference(m, x, T, fast))), `${m.form} T=${T}`));
          pool.alloc(40 * 2 ** 20); // 40 MiB more between dispatches
        }
      }
    } finally {
      await pool.dispose();
    }
  });

  test('matrices placed past 2 GiB of the pool memory (addresses above 2^31) give the same products', async () => {
    const pool = await startPool(module, { threads: 2 });
    try {
      pool.alloc(2 ** 31 + 12345); // untouched: the pages are reserved, not written
      const rand = random(7);
      const ms = [matrix('q4', 40, 64, rand), matrix('q8', 33, 64, rand), matrix('dense', 18, 64, rand)];
      const handles = ms.map((m) => place(pool, m));
      assert.ok(pool.bytes > 2 ** 31);
      for (const fast of [false, true]) {
        const x = Float32Array.from({ length: 2 * 64 }, () => rand() - 0.5);
        const ys = ms.map((m) => new Float32Array(2 * m.N));
        pool.run(handles, x, 2, ys, fast);
        ms.forEach((m, j) => assert.ok(bits(ys[j]).equals(bits(reference(m, x, 2, fast))), `${m.form} fast=${fast}`));
      }
    } finally {
      await pool.dispose();
    }
  });

  test('a released matrix is refused and its space is handed out again', async () => {
    const pool = await startPool(module, { threads: 2 });
    try {
      const m = matrix('q4', 40, 64, random(3));
      const handle = place(pool, m);
      const top = pool.bytes;
      pool.release(handle);
      assert.throws(
        () => pool.run([handle], new Float32Array(64), 1, [new Float32Array(40)]),
        (e) => e instanceof RuvLLMError && /was released/.test(e.message),
      );
      for (let i = 0; i < 20; i++) pool.release(place(pool, m)); // the same space each time
      const again = place(pool, m);
      assert.equal(pool.bytes, top);
      const y = new Float32Array(40);
      pool.run([again], new Float32Array(64).fill(1), 1, [y]);
      assert.ok(bits(y).equals(bits(reference(m, new Float32Array(64).fill(1), 1, false))));
    } finally {
      await pool.dispose();
    }
  });

  test('a product that traps in any thread is an inference error, and the pool keeps working', async () => {
    const pool = await startPool(module, { threads: 3 });
    try {
      const outside = pool.matrix({ form: 'dense', w: 2 ** 31 - 4096, N: 256, K: 32 }); // past the memory
      assert.throws(
        () => pool.run([outside], new Float32Array(32), 1, [new Float32Array(256)]),
        (e) => e instanceof RuvLLMError && e.type === 'inference' && /a kernel thread failed/.test(e.message),
      );
      const m = matrix('q8', 64, 32, random(5));
      const x = new Float32Array(32).fill(0.25);
      const y = new Float32Array(64);
      pool.run([place(pool, m)], x, 1, [y]);
      assert.ok(bits(y).equals(bits(reference(m, x, 1, false))));
    } finally {
      await pool.dispose();
    }
  });

  test("a decode plan's steps on 1, 2 and 3 threads (run_plan_pool) give run_plan's bits", async () => {
    // A program of the steps that split, over random buffers in the pool memory (kernels.c's layouts, as
    // model/plan.py writes them): q, k and v products sharing x (q4, q8, dense), attention over a cache of
    // 37 positions (3 query heads a key/value head), the gated MLP, and the logits of the last row.
    const rand = random(9);
    const floats = (n) => Float32Array.from({ length: n }, () => rand() * 2 - 1);
    const [D, H, KV, E, F, V, S] = [64, 6, 2, 16, 96, 70, 37];
    const products = [matrix('q4', H * E, D, rand), matrix('q8', KV * E, D, rand), matrix('dense', KV * E, D, rand)];
    const [down, lmHead] = [matrix('q8h', D, F, rand), matrix('q4', V, D, rand)];
    const [k, v] = [floats(KV * S * E), floats(KV * S * E)];
    for (const T of [1, 7]) {
      const [xs, gus] = [floats(T * D), floats(T * 2 * F)];
      const outputs = {};
      for (const count of [0, 1, 2, 3]) {
        // count 0: run_plan itself, on a pool of one thread
        const pool = await startPool(module, { threads: Math.max(count, 1) });
        try {
          const at = (a) => pool.place(a);
          const parts = (m) => [at(m.w), m.scales ? at(m.scales) : 0, m.mins ? at(m.mins) : 0, m.offset ?? 0];
          const forms = { dense: 0, q8: 1, q8h: 2, q4: 3 };
          const x = at(xs);
          const qkv = pool.region(4 * T * (H + 2 * KV) * E);
          const att = pool.region(4 * T * H * E);
          const gu = at(gus);
          const s = pool.region(4 * T * F);
          const logits = pool.region(4 * V);
          const xq = pool.region(T * (4 * 2 * F + 12 * ((2 * F) / 32)));
          const stride = 16 * 2 * F;
          const scratch = pool.region(4 * 3 * stride);
          const scores = pool.region(4 * 3 * 64);
          const entry = at(new Int32Array([at(k), at(v), S, S, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0]));
          const width = (H + 2 * KV) * E;
          const product = (m, src, dst, ldy, flags) =>
            [2, forms[m.form], ...parts(m), m.N, m.K, src, dst, ldy, xq, flags, scratch, stride].concat([0]);
          const steps = [
            product(products[0], x, qkv, width, 1),
            product(products[1], x, qkv + 4 * H * E, width, 0),
            product(products[2], x, qkv + 4 * (H + KV) * E, width, 0),
            [6, qkv, width, entry, att, H * E, H, KV, E, 0, new Int32Array(new Float32Array([0.25]).buffer)[0]],
            [8, 0, gu, s, F],
            product(down, s, x, D, 1),
            product(lmHead, x, logits, V, 3), // the logits: QUANTIZE | TAIL, the last row only
          ];
          const words = new Int32Array(16 * (steps.length + 1)); // (the last step: END)
          steps.forEach((step, n) => words.set(step, 16 * n));
          const program = at(words);
          const state = at(new Int32Array([T, S - T, 1, 1, -1, 0, scores, 64]));
          if (count === 0) pool.exports.run_plan(program, state);
          else pool.plan(program, state, T);
          const read = (address, n) => new Uint8Array(pool.memory.buffer, address, n).slice();
          outputs[count] = [read(qkv, 4 * T * width), read(att, 4 * T * H * E), read(s, 4 * T * F), read(x, 4 * T * D)];
          outputs[count].push(read(logits, 4 * V));
        } finally {
          await pool.dispose();
        }
      }
      for (const count of [1, 2, 3])
        outputs[count].forEach((got, i) =>
          assert.ok(Buffer.from(got).equals(Buffer.from(outputs[0][i])), `T ${T}, ${count} threads, output ${i}`),
        );
    }
  });

  test('a decode plan whose step traps is an inference error, and the pool then computes products right', async () => {
    const pool = await startPool(module, { threads: 3 });
    try {
      // one product step (kernels.c PLAN_PRODUCT, dense, quantize) whose weights lie past the memory
      const [x, y] = [pool.place(new Float32Array(32)), pool.region(4 * 256)];
      const step = [2, 0, 2 ** 31 - 4096, 0, 0, 0, 256, 32, x, y, 256, 0, 1, 0, 0, 0];
      const program = pool.place(new Int32Array([...step, ...new Array(16).fill(0)]));
      const state = pool.place(new Int32Array([1, 0, 0, 1, -1, 0, 0, 0]));
      assert.throws(
        () => pool.plan(program, state, 1),
        (e) => e instanceof RuvLLMError && e.type === 'inference' && /decode plan/.test(e.message),
      );
      const m = matrix('q8', 64, 32, random(6));
      const input = new Float32Array(32).fill(0.5);
      const out = new Float32Array(64);
      pool.run([place(pool, m)], input, 1, [out]); // (not read as a step of the plan: PLAN was cleared)
      assert.ok(bits(out).equals(bits(reference(m, input, 1, false))));
    } finally {
      await pool.dispose();
    }
  });

  test('a wrong thread count is an invalid_argument error', async () => {
    for (const threads of [0, 1.5, 65, NaN])
      await assert.rejects(
        startPool(module, { threads }),
        (e) =>
          e instanceof RuvLLMError && e.type === 'invalid_argument' && /threads must be an integer/.test(e.message),
      );
  });

  test('dispose() ends every thread: a program exits by itself, and the pool refuses products after', () => {
    const pool = fileURLToPath(new URL('../src/worker/pool.js', import.meta.url));
    const script = `
      import { readFileSync } from 'node:fs';
      import { startPool } from ${JSON.stringify(pool)};
      const module = new WebAssembly.Module(readFileSync(${JSON.stringify(fileURLToPath(SHARED))}));
      const p = await startPool(module, { threads: 3 });
      const w = p.place(new Float32Array(64 * 32).fill(0.5));
      const h = p.matrix({ form: 'dense', w, N: 64, K: 32 });
      const y = new Float32Array(64);
      p.run([h], new Float32Array(32).fill(1), 1, [y]);
      await p.dispose();
      try { p.run([h], new Float32Array(32), 1, [y]); } catch (e) { console.log(e.type, e.message); }
      console.log('sum', y.reduce((a, b) => a + b, 0));
    `;
    // a hang guard only: a pool thread left running keeps the process alive
    const file = join(mkdtempSync(join(tmpdir(), 'ruvllm-pool-')), 'dispose.mjs');
    writeFileSync(file, script);
    const run = spawnSync(process.execPath, [file], { encoding: 'utf8', timeout: 60000 });
    rmSync(dirname(file), { recursive: true });
    assert.equal(run.signal, null, 'the program did not exit by itself');
    assert.equal(run.status, 0, run.stderr);
    assert.match(run.stdout, /^inference the kernel threads were stopped\nsum 1024\n$/);
  });
});

// Inside Pyodide: the provider the engine uses with threads (py_src/ruvllm/quant/pool.py) against the
// single-thread one (quant/wasm.py), bit for bit, before and after Pyodide's heap grows.
const PROVIDERS = `${randomMatrices(1)}
from ruvllm.quant.pool import PoolKernels
from ruvllm.quant.wasm import WasmKernels

def products(provider):
    return [provider.prepare(m) for m in matrices]

def merged_differs(threads_api):
    """A float32 matrix whose weights the pool holds, changed (copied out, as merging an adapter does)
    and prepared again: do the pool's products differ from the single-thread ones of the new weights?"""
    m = DenseMatrix(w.copy(), "einsum")
    m.use_provider(PoolKernels(threads_api, "exact"))
    if isinstance(m.weight, np.ndarray):
        return "the pool did not take the weights"
    x = rng.standard_normal((3, 576)).astype(np.float32)
    before = m(x)
    weight = np.asarray(m.weight)
    weight += np.float32(0.5) * rng.standard_normal(m.weight.shape).astype(np.float32)
    m.weight = weight
    m.use_provider(m.provider)
    one = WasmKernels(kernel_exports, "exact").prepare(DenseMatrix(weight.copy(), "einsum"))
    return before.tobytes() == m(x).tobytes() or m(x).tobytes() != one(x).tobytes()

def stand_in_problems(threads_api):
    """Matrices of every form whose arrays the pool took (use_provider): what their NumPy paths (embedding
    rows, row ranges, dequantize, the arrays themselves) read differently from the arrays they had."""
    from ruvllm.quant.pool import RemoteArray
    problems = []
    pool = PoolKernels(threads_api, "exact")
    ids = np.array([[3, 4, 5], [0, 199, 7]])
    for m in matrices:
        twin = type(m).__new__(type(m))
        twin.__dict__.update({k: v.copy() if isinstance(v, np.ndarray) else v for k, v in m.__dict__.items()})
        twin.use_provider(pool)
        held = [k for k, v in twin.__dict__.items() if isinstance(v, RemoteArray)]
        left = [k for k, v in twin.__dict__.items() if isinstance(v, np.ndarray) and v.size > 1]
        if not held or left:
            problems.append(f"{type(m).__name__}: the pool holds {held}, the heap still {left}")
        checks = {
            "rows": (twin.rows(ids[0]), m.rows(ids[0])),
            "dequantize": (twin.dequantize(), m.dequantize()),
        }
        for k in held:
            mine, theirs = getattr(twin, k), getattr(m, k)
            checks[k] = (np.asarray(mine), theirs)
            checks[f"{k}[2:9]"] = (mine[2:9], theirs[2:9])
            checks[f"{k}[-1]"] = (mine[-1], theirs[-1])
            checks[f"{k}[2-D ids]"] = (mine[ids], theirs[ids])
        for name, (got, want) in checks.items():
            if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
                problems.append(f"{type(m).__name__}: {name} differs")
        try:
            getattr(twin, held[0])[200]
            problems.append(f"{type(m).__name__}: row 200 of 200 was read")
        except IndexError:
            pass
    return problems

def transient_blocks(threads_api):
    """Short-lived matrices prepared one after another (a learning step's blocks)."""
    provider = PoolKernels(threads_api, "exact")
    for _ in range(30):
        block = DenseMatrix(rng.standard_normal((64, 576)).astype(np.float32), "einsum")
        block.use_provider(provider)
        block(np.ones((1, 576), np.float32))

def fused_problems(threads_api, arithmetic):
    """Matrices sharing x fused into one dispatch: what differs from the single-thread products."""
    problems = []
    pool, one = PoolKernels(threads_api, arithmetic), WasmKernels(kernel_exports, arithmetic)
    members = []
    for m in matrices[:3]:
        twin = type(m).__new__(type(m))
        twin.__dict__.update(m.__dict__)
        twin.use_provider(pool)
        members.append(twin)
    if not pool.fuse(members):
        return ["not fused"]
    singles = [one.prepare(m) for m in matrices[:3]]
    for T in (1, 3, 40):
        x = rng.standard_normal((T, 576)).astype(np.float32)
        first = members[0](x)
        if len(pool.fused[members[0]._product.pool[1]].kept) != 2:
            problems.append(f"T={T}: the siblings' products were not kept")
        got = [first, members[1](x), members[2](x.copy())]  # (a copy: the same bits)
        other = x + np.float32(1)
        got_other = members[1](other)  # x changed: its own dispatch
        for i, (g, single) in enumerate(zip(got, singles)):
            if g.tobytes() != single(x).tobytes():
                problems.append(f"T={T}: member {i} differs")
        if got_other.tobytes() != singles[1](other).tobytes():
            problems.append(f"T={T}: another x took a kept product")
    members[1].use_provider(pool)  # prepared again (an adapter merge): the group ends
    if pool.fused:
        problems.append("the group outlived a member prepared again")
    x = rng.standard_normal((1, 576)).astype(np.float32)
    for i, (m, single) in enumerate(zip(members, singles)):
        if m(x).tobytes() != single(x).tobytes():
            problems.append(f"after the group ended: member {i} differs")
    return problems

def backward_problems(threads_api):
    """Learning's backward product dy @ W (backprop.transposed_product, 64 rows of W a unit) of every
    form: what differs between the pool and one thread (bits), or from NumPy's (values)."""
    from ruvllm.learning import backprop
    backprop.TRANSPOSED_BLOCK = 64
    problems = []
    providers = (PoolKernels(threads_api, "exact"), WasmKernels(kernel_exports, "exact"))
    dy = np.random.default_rng(9).standard_normal((5, 200)).astype(np.float32)
    for m in matrices:
        got = []
        for provider in providers:
            twin = type(m).__new__(type(m))
            twin.__dict__.update({k: v.copy() if isinstance(v, np.ndarray) else v for k, v in m.__dict__.items()})
            twin.use_provider(provider)
            if provider.transposed(twin) is None:
                problems.append(f"{type(m).__name__}: no backward product")
            got.append(backprop.transposed_product(dy, twin))
        want = dy.astype(np.float64) @ m.dequantize().astype(np.float64)
        if got[0].tobytes() != got[1].tobytes():
            problems.append(f"{type(m).__name__}: the pool's bits differ")
        if not np.allclose(got[1], want, rtol=1e-4, atol=1e-4):
            problems.append(f"{type(m).__name__}: differs from NumPy's")
    return problems

def differing(threads_api):
    """Products (of every form, 1, 3 and 40 rows, exact and fast) whose bits differ between the pool and one thread."""
    differ = 0
    for arithmetic in ("exact", "fast"):
        pairs = zip(products(WasmKernels(kernel_exports, arithmetic)), products(PoolKernels(threads_api, arithmetic)))
        for one, pool in pairs:
            for T in (1, 3, 40):
                x = rng.standard_normal((T, 576)).astype(np.float32)
                differ += int(one(x).tobytes() != pool(x).tobytes())
    return differ
`;

describe(
  'the thread pool inside Pyodide',
  { skip: SKIP || (HAVE_DIST ? false : `no local Pyodide at ${DIST}`) },
  () => {
    test('PoolKernels products are WasmKernels products bit for bit at 2 and 3 threads', async () => {
      const { py } = await startPython({ indexURL: DIST });
      const kernels = await startKernels(py, 'wasm');
      assert.equal(kernels.exports.relaxed_simd(), RELAXED_RUN ? 1 : 0); // host.py took the build under test
      py.globals.set('kernel_exports', kernels.exports);
      py.runPython(PROVIDERS);
      for (const count of [2, 3]) {
        const threads = await startThreads(py, kernels, count);
        try {
          assert.equal(threads.count, count);
          assert.equal(threads.reason, null);
          py.globals.set('threads_api', threads.api);
          assert.equal(py.runPython('differing(threads_api)'), 0);
          py.runPython('ballast = np.ones(2**27, dtype=np.float32)'); // 512 MiB: Pyodide's memory grows
          assert.equal(py.runPython('differing(threads_api)'), 0);
          py.runPython('del ballast');
          assert.equal(py.runPython('merged_differs(threads_api)'), false);
          assert.deepEqual(py.runPython('stand_in_problems(threads_api)').toJs(), []);
          for (const arithmetic of ['exact', 'fast'])
            assert.deepEqual(py.runPython(`fused_problems(threads_api, "${arithmetic}")`).toJs(), []);
          assert.deepEqual(py.runPython('backward_problems(threads_api)').toJs(), []);
          py.runPython('transient_blocks(threads_api)');
          const bytes = threads.pool.bytes;
          py.runPython('transient_blocks(threads_api)'); // the space of collected products is reused
          assert.equal(threads.pool.bytes, bytes);
        } finally {
          await threads.pool.dispose();
        }
      }
      const one = await startThreads(py, kernels, 1);
      assert.deepEqual([one.pool, one.count], [null, 1]);
      assert.match(one.reason, /threads: 1/);
      const numpy = await startThreads(py, { running: false }, 2);
      assert.deepEqual([numpy.pool, numpy.count], [null, 1]);
      assert.match(numpy.reason, /WebAssembly kernels do not run here/);
    });
  },
);

test(
  'the relaxed SIMD build: the same tests of bits, on the bare pool and inside Pyodide',
  { skip: RELAXED_RUN || SKIP || NO_RELAXED },
  // the 4 thread counts, and Pyodide's (skipped without a local Pyodide)
  () => runTestsRelaxed(import.meta.url, 'bit for bit', 4),
);
