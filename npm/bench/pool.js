// A quick figure for the kernel thread pool (src/worker/pool.js): what one dispatch costs (a tiny
// product), and a SmolLM2-shaped q4 decode product set (q, k, v, o, gate, up, down of one layer,
// times 30 layers) on 1 thread and on 2+ threads with and without the spin, interleaved; and what a
// decode plan's step costs to hand to the threads. The machine's
// load changes these a lot: run `uptime` beside it and repeat.
//   node bench/pool.js [THREADS=2] [ROUNDS=5] [SPIN=DEFAULT_SPIN_US microseconds before a thread sleeps]
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

import { DEFAULT_SPIN_US } from '../src/worker/pool-protocol.js';
import { startPool } from '../src/worker/pool.js';

const threads = Number(process.argv[2] ?? 2);
const rounds = Number(process.argv[3] ?? 5);
const spin = Number(process.argv[4] ?? DEFAULT_SPIN_US);
const module = new WebAssembly.Module(readFileSync(new URL('../wasm/kernels-shared.wasm', import.meta.url)));
const median = (a) => [...a].sort((p, q) => p - q)[Math.floor(a.length / 2)];

// one layer of SmolLM2-135M: [N, K]
const LAYER = [
  [576, 576],
  [192, 576],
  [192, 576],
  [576, 576],
  [1536, 576],
  [1536, 576],
  [576, 1536],
];
async function setUp(n, spin) {
  const pool = await startPool(module, { threads: n, spin });
  const layers = [];
  for (let l = 0; l < 30; l++)
    layers.push(
      LAYER.map(([N, K]) => {
        const w = pool.place(new Uint8Array((N * K) / 2).map((_, i) => (i * 2654435761) >>> 24));
        const scales = pool.place(new Float32Array((N * K) / 32).fill(0.01));
        const mins = pool.place(new Float32Array((N * K) / 32).fill(-0.05));
        return { handle: pool.matrix({ form: 'q4', w, scales, mins, N, K }), N, K };
      }),
    );
  return { pool, layers };
}
const setups = {
  '1 thread': await setUp(1, 0),
  [`${threads} threads, no spin`]: await setUp(threads, 0),
  [`${threads} threads, spin ${spin} µs`]: await setUp(threads, spin),
};

// what a dispatch costs: a tiny product (16 x 32 float32, one row), on 1 thread and on `threads`
async function tiny(n, spin) {
  const pool = await startPool(module, { threads: n, spin });
  const h = pool.matrix({ form: 'dense', w: pool.place(new Float32Array(16 * 32).fill(0.5)), N: 16, K: 32 });
  const [x1, y1] = [new Float32Array(32).fill(1), new Float32Array(16)];
  const times = [];
  for (let i = 0; i < 3000; i++) {
    const t0 = performance.now();
    pool.run([h], x1, 1, [y1]);
    times.push(performance.now() - t0);
  }
  await pool.dispose();
  return median(times) * 1000;
}
const [one, many, spun] = [await tiny(1, 0), await tiny(threads, 0), await tiny(threads, spin)];
console.log(
  `tiny product (a dispatch): ${one.toFixed(1)} µs on 1 thread, ${many.toFixed(1)} µs on ${threads}, ` +
    `${spun.toFixed(1)} µs on ${threads} with the spin`,
);

// what a decode plan's step costs to hand to the threads (kernels.c run_plan_pool): a program of tiny
// product steps (16 x 32 float32, one row; each its own dispatch), on 1 thread (run alone) and on `threads`
async function planSteps(n, spin) {
  const STEPS = 200;
  const pool = await startPool(module, { threads: n, spin });
  const w = pool.place(new Float32Array(16 * 32).fill(0.5));
  const [x, y] = [pool.place(new Float32Array(32).fill(1)), pool.region(4 * 16)];
  const program = new Int32Array(16 * (STEPS + 1)); // kernels.c PLAN_PRODUCT (2), FORM_DENSE (0), QUANTIZE (1)
  for (let i = 0; i < STEPS; i++) program.set([2, 0, w, 0, 0, 0, 16, 32, x, y, 16, 0, 1, 0, 0], 16 * i);
  const at = pool.place(program);
  const state = pool.place(new Int32Array([1, 0, 0, 1, -1, 0, 0, 0]));
  const times = [];
  for (let i = 0; i < 500; i++) {
    const t0 = performance.now();
    pool.plan(at, state, 1);
    times.push(performance.now() - t0);
  }
  await pool.dispose();
  return (median(times) * 1000) / STEPS;
}
const [alone, handed] = [await planSteps(1, spin), await planSteps(threads, spin)];
console.log(
  `a decode plan's tiny step: ${alone.toFixed(2)} µs run alone, ${handed.toFixed(2)} µs handed to ${threads} ` +
    `threads (spinning): ${(handed - alone).toFixed(2)} µs a dispatch`,
);

const x = new Float32Array(1536).map((_, i) => Math.sin(i));
const ys = new Float32Array(1536);
function token({ pool, layers }) {
  const t0 = performance.now();
  for (const layer of layers) for (const m of layer) pool.run([m.handle], x, 1, [ys], true);
  return performance.now() - t0;
}
const times = Object.fromEntries(Object.keys(setups).map((name) => [name, []]));
for (let r = 0; r < rounds; r++)
  for (const name in setups) for (let i = 0; i < 10; i++) times[name].push(token(setups[name]));
for (const name in setups)
  console.log(`q4 decode token (210 products), ${name}: median ${median(times[name]).toFixed(2)} ms`);
for (const name in setups) await setups[name].pool.dispose();
