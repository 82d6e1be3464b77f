/**
 * The kernel thread pool (issue 25): the WebAssembly SIMD kernels on several threads at once.
 *
 * One shared WebAssembly.Memory belongs to the pool. It holds a control block, each thread's scratch,
 * the inputs and outputs of the product under way, and the matrices placed in it (codes, scales, mins;
 * float32 weights). Each extra thread is a worker (worker_threads in Node, a module Web Worker in
 * browsers: pool-worker.js) running its own instance of kernels-shared.wasm on that memory; the thread
 * that calls `run` (the Pyodide worker's) takes part as thread 0.
 *
 * A dispatch: the caller writes the job (the matrices of one product, or of several sharing an input:
 * q/k/v) into the control block, copies x in (and quantizes it once for fast arithmetic), bumps the
 * generation word and notifies. The work is cut into units, one per (matrix, slice): each matrix's
 * output features in 4 slices per thread that start at multiples of 16 rows, so each output is summed in
 * the one order the single-thread kernels use (the same bits at every thread count, whoever computes
 * it). Every thread, the caller included, claims units one at a time (a compare-and-swap on a word
 * tagged with the generation) until none is left, and counts each one done; the caller then waits for
 * the units others are still computing and copies y out. A thread that wakes late, or not at all (a
 * busy machine), only leaves more units to the others: nobody waits for a thread that has not started.
 * Waiting is Atomics.wait, after a spin bounded in time (DEFAULT_SPIN_US), and a thread notifies only
 * when another sleeps: no message per product.
 *
 * The pool's parts: pool-protocol.js, the control block and what the caller and the workers both run
 * (claiming, computing and counting units; waiting); pool-memory.js, the shared memory and its regions;
 * pool-chooser.js, the thread count of each dispatch under 'auto'; pool-worker.js, a worker's loop. This
 * file holds the pool itself (its matrices, `run`, `transposed` and a decode plan's `plan`, the caller's side
 * of a dispatch) and starts it.
 */

import { IS_NODE } from '../env.js';
import { RuvLLMError } from '../errors.js';
import { MAX_THREADS } from '../protocol.js';
import { Adaptive, DECODE, PLAN } from './pool-chooser.js';
import { PAGE, PoolMemory, align16, sharedMemory } from './pool-memory.js';
import {
  CONTROL_BYTES,
  CTL,
  DEFAULT_SPIN_US,
  FORMS,
  GROUP,
  GROUPED_MAX_ROWS,
  JOB_FIELDS,
  JOB_WORDS,
  MAX_JOBS,
  TILE_ROWS,
  announce,
  open,
  runUnit,
  waitWhile,
  work,
} from './pool-protocol.js';

/**
 * Slices of each matrix per thread: more units than threads, so a thread that starts late (woken after
 * the others, or preempted) still finds work, and one that is not scheduled holds back only a small one.
 */
const SLICES_PER_THREAD = 4;
/** The caller spins this long for the units other threads are still computing before it sleeps. */
const FINISH_SPIN_MS = 1;
/** The caller's sleeps while others finish a dispatch last at most this long before it looks again. */
const CHECK_MS = 100;
/** A dispatch with no unit counted for this long has stalled (a unit takes milliseconds). */
const STALL_MS = 60000;

/** Start one worker on the pool memory; resolves once its instance is ready. */
async function startWorker(module, memory, id) {
  const url = new URL('./pool-worker.js', import.meta.url);
  const init = { module, memory, id };
  if (IS_NODE) {
    const { Worker } = await import('node:worker_threads');
    const worker = new Worker(url);
    const ready = new Promise((resolve, reject) => {
      worker.once('message', (m) => (m?.ready ? resolve(null) : reject(new Error(m?.error ?? 'no answer'))));
      worker.once('error', reject);
      worker.once('exit', (code) => reject(new Error(`exited with code ${code}`)));
    });
    worker.postMessage(init);
    try {
      await ready;
    } catch (error) {
      await worker.terminate();
      throw error;
    }
    return { terminate: () => worker.terminate() };
  }
  const worker = new Worker(url, { type: 'module' });
  const ready = new Promise((resolve, reject) => {
    worker.addEventListener('message', (e) => (e.data?.ready ? resolve(null) : reject(new Error(e.data?.error))), {
      once: true,
    });
    worker.addEventListener('error', (e) => reject(new Error(e.message || 'worker error')), { once: true });
  });
  worker.postMessage(init);
  try {
    await ready;
  } catch (error) {
    worker.terminate();
    throw error;
  }
  return { terminate: async () => worker.terminate() };
}

/**
 * Start a pool of `threads` threads (the caller and threads - 1 workers) running `module`, a compiled
 * kernels-shared.wasm. A worker that cannot start ends the others and fails the whole start.
 * adaptive: each dispatch runs on one thread or all of them, whichever measured faster (Adaptive);
 * else always on all of them. spin: microseconds a thread spins for the next dispatch before it sleeps
 * (DEFAULT_SPIN_US).
 * @param {WebAssembly.Module} module
 * @param {{ threads: number, spin?: number, maxBytes?: number, adaptive?: boolean }} options
 */
export async function startPool(module, { threads, spin = DEFAULT_SPIN_US, maxBytes = 2 ** 32, adaptive = false }) {
  if (!Number.isInteger(threads) || threads < 1 || threads > MAX_THREADS)
    throw new RuvLLMError('invalid_argument', `threads must be an integer from 1 to ${MAX_THREADS}, got ${threads}`);
  const memory = sharedMemory(2, Math.min(65536, Math.floor(maxBytes / PAGE))); // the module declares 2 pages
  const instance = await WebAssembly.instantiate(module, { env: { memory } });
  const pool = new KernelPool(memory, /** @type {any} */ (instance.exports), threads, spin);
  if (adaptive && threads > 1) pool.adaptive = new Adaptive(threads);
  try {
    for (let id = 1; id < threads; id++) pool.workers.push(await startWorker(module, memory, id));
  } catch (error) {
    await pool.dispose();
    throw new RuvLLMError('load', `cannot start the kernel threads: ${error.message}`);
  }
  return pool;
}

export class KernelPool {
  /** @type {{ terminate(): Promise<unknown> }[]} */
  workers = [];
  /** @type {PoolMemory} the regions of the pool memory */
  #space;
  #matrices = []; // handle -> { form, w, scales, mins, offset, N, K }
  #disposed = false;
  /** @type {Adaptive | null} how many threads each dispatch runs on (null: all) */
  adaptive = null;
  /** Dispatches whose end the caller found after a CHECK_MS sleep, not by a wake-up (should stay 0). */
  lateWakes = 0;
  /** Dispatches whose last units the caller waited for past its spin (asleep, unless the pool spins). */
  waits = 0;
  /** Dispatches so far by the thread count they ran on. */
  dispatches = new Map();

  /**
   * @param {WebAssembly.Memory} memory
   * @param {Record<string, Function>} exports the caller's instance
   */
  constructor(memory, exports, threads, spin) {
    this.memory = memory;
    this.#space = new PoolMemory(memory);
    this.exports = exports;
    this.threads = threads;
    this.spin = spin;
    this.ctl = new Int32Array(memory.buffer, 0, CONTROL_BYTES / 4);
    this.ctl[CTL.THREADS] = threads;
    this.ctl[CTL.SPIN] = spin;
  }

  /** Bytes reserved in the pool memory so far. */
  get bytes() {
    return this.#space.bytes;
  }

  /** `bytes` bytes of the pool memory, aligned to 16 (PoolMemory.alloc): their address. */
  alloc(bytes) {
    return this.#space.alloc(bytes);
  }

  /** A copy of `bytes` (any typed array) in the pool memory: its address. */
  place(bytes) {
    return this.#space.place(bytes);
  }

  /** `bytes` bytes of the pool memory until `free`: their address. */
  region(bytes) {
    return this.#space.region(bytes);
  }

  /** Hand out again what `place` or `region` made at `at`. */
  free(at) {
    this.#space.free(at);
  }

  /** Forget matrix `handle` and hand its placed parts out again. */
  release(handle) {
    const m = this.#matrices[handle];
    if (!m) return;
    this.#matrices[handle] = null;
    for (const at of [m.w, m.scales, m.mins]) this.#space.free(at);
  }

  /**
   * Register a matrix whose parts are already in the pool memory (addresses from `place`); the handle
   * names it in `run`. form: 'dense' (w: float32 (N, K)), 'q8', 'q8h' or 'q4' (w: the codes; scales,
   * mins (0: none) and the code offset as matrices.py keeps them).
   */
  matrix({ form, w, scales = 0, mins = 0, offset = 0, N, K }) {
    if (!FORMS.includes(form)) throw new RuvLLMError('invalid_argument', `unknown matrix form ${form}`);
    if (K % GROUP !== 0 && form !== 'dense')
      throw new RuvLLMError('invalid_argument', `a quantized matrix needs K a multiple of ${GROUP}, got ${K}`);
    this.#space.scratch(this.threads, TILE_ROWS * K, this.ctl);
    this.#matrices.push({ form: FORMS.indexOf(form), w, scales, mins, offset, N, K });
    return this.#matrices.length - 1;
  }

  /**
   * y_j = x @ W_j.T for the matrices `handles` (all with the same K), on every thread. x: float32 (T, K);
   * ys: one float32 (T, N_j) array per matrix, written. fast: decoding products (T <= 4) of quantized
   * matrices take x quantized to 15 bits per group (kernels.c quantize_x), as WasmKernels does.
   * @param {number[]} handles
   * @param {Float32Array} x
   * @param {number} T
   * @param {Float32Array[]} ys
   */
  run(handles, x, T, ys, fast = false) {
    if (this.#disposed) throw new RuvLLMError('inference', 'the kernel threads were stopped');
    if (handles.length < 1 || handles.length > MAX_JOBS)
      throw new RuvLLMError('invalid_argument', `a dispatch takes 1 to ${MAX_JOBS} matrices, got ${handles.length}`);
    const jobs = handles.map((h) => this.#matrices[h]);
    if (jobs.some((m) => !m)) throw new RuvLLMError('invalid_argument', 'a matrix of this dispatch was released');
    const K = jobs[0].K;
    if (jobs.some((m) => m.K !== K)) throw new RuvLLMError('invalid_argument', 'matrices of one dispatch share K');
    const G = K / GROUP;
    const xBytes = 4 * T * K;
    const quantize = fast && T <= GROUPED_MAX_ROWS && jobs.some((m) => FORMS[m.form] !== 'dense');
    const qBytes = quantize ? T * (4 * K + 12 * G) : 0; // kernels.c QUANTIZED_X_BYTES
    const yBytes = jobs.map((m) => align16(4 * T * m.N));
    const at = this.#space.io(align16(xBytes) + align16(qBytes) + yBytes.reduce((a, b) => a + b, 0));
    const xAt = at;
    const qAt = at + align16(xBytes);
    let yAt = qAt + align16(qBytes);
    const buffer = this.memory.buffer;
    new Float32Array(buffer, xAt, T * K).set(x.subarray(0, T * K));
    const ctl = this.ctl;
    ctl[CTL.T] = T;
    ctl[CTL.X] = xAt;
    ctl[CTL.FAST] = quantize ? 1 : 0;
    if (quantize) {
      ctl[CTL.XQ] = qAt;
      ctl[CTL.D] = qAt + 2 * T * K;
      ctl[CTL.XS] = qAt + 2 * T * K + 4 * T * G;
      this.exports.quantize_x(xAt, ctl[CTL.XQ], ctl[CTL.D], ctl[CTL.XS], T, K);
    }
    const outputs = [];
    jobs.forEach((m, j) => {
      const base = CTL.JOB + JOB_WORDS * j;
      ctl[base + JOB_FIELDS.FORM] = m.form;
      ctl[base + JOB_FIELDS.W] = m.w;
      ctl[base + JOB_FIELDS.SCALES] = m.scales;
      ctl[base + JOB_FIELDS.MINS] = m.mins;
      ctl[base + JOB_FIELDS.OFFSET] = m.offset;
      ctl[base + JOB_FIELDS.Y] = yAt;
      ctl[base + JOB_FIELDS.N] = m.N;
      ctl[base + JOB_FIELDS.K] = m.K;
      outputs.push(yAt);
      yAt += yBytes[j];
    });
    ctl[CTL.JOBS] = jobs.length;
    if (!this.adaptive) {
      this.#dispatch(this.threads);
    } else if (T > GROUPED_MAX_ROWS) {
      this.#dispatch(this.adaptive.best(DECODE)); // a prompt's rows: see Adaptive
    } else {
      const work = T * K * jobs.reduce((sum, m) => sum + m.N, 0);
      const count = this.adaptive.choose(DECODE);
      const start = performance.now();
      this.#dispatch(count);
      this.adaptive.record(DECODE, count, performance.now() - start, work);
    }
    outputs.forEach((y, j) => ys[j].set(new Float32Array(buffer, y, T * jobs[j].N)));
  }

  /**
   * y (T, K) += dy[:, n0:n1] @ W[n0:n1] for matrix `handle` (learning's backward product: kernels.c
   * `*_t`, from the copy of W the pool holds), on every thread, each taking slices of the K columns
   * (whole groups of 32), so the bits are the single-thread kernel's at any thread count.
   * @param {number} handle
   * @param {Float32Array} dy (T, N)
   * @param {number} T
   * @param {Float32Array} y (T, K), added to
   */
  transposed(handle, dy, T, y, n0, n1) {
    if (this.#disposed) throw new RuvLLMError('inference', 'the kernel threads were stopped');
    const m = this.#matrices[handle];
    if (!m) throw new RuvLLMError('invalid_argument', 'the matrix of this product was released');
    if (!(0 <= n0 && n0 <= n1 && n1 <= m.N))
      throw new RuvLLMError('invalid_argument', `rows ${n0}..${n1} are not rows of a matrix of ${m.N}`);
    const dyBytes = align16(4 * T * m.N);
    const at = this.#space.io(dyBytes + align16(4 * T * m.K));
    const buffer = this.memory.buffer;
    new Float32Array(buffer, at, T * m.N).set(dy.subarray(0, T * m.N));
    new Float32Array(buffer, at + dyBytes, T * m.K).set(y.subarray(0, T * m.K));
    const ctl = this.ctl;
    ctl[CTL.T] = T;
    ctl[CTL.X] = at;
    ctl[CTL.FAST] = 0;
    ctl[CTL.N0] = n0;
    ctl[CTL.N1] = n1;
    const base = CTL.JOB;
    ctl[base + JOB_FIELDS.FORM] = m.form;
    ctl[base + JOB_FIELDS.W] = m.w;
    ctl[base + JOB_FIELDS.SCALES] = m.scales;
    ctl[base + JOB_FIELDS.MINS] = m.mins;
    ctl[base + JOB_FIELDS.OFFSET] = m.offset;
    ctl[base + JOB_FIELDS.Y] = at + dyBytes;
    ctl[base + JOB_FIELDS.N] = m.N;
    ctl[base + JOB_FIELDS.K] = m.K;
    ctl[CTL.JOBS] = 1;
    ctl[CTL.TRANSPOSED] = 1;
    try {
      this.#dispatch(this.threads); // (a step's products are large: every thread)
    } finally {
      ctl[CTL.TRANSPOSED] = 0;
    }
    y.set(new Float32Array(buffer, at + dyBytes, T * m.K));
  }

  /**
   * Run a decode plan's program (kernels.c run_plan_pool): `program` and `state` are addresses in the pool
   * memory, the state's T its rows. Its steps that split run on every thread, or on one where 'auto'
   * measured that faster (the PLAN phase: a token is one dispatch of Adaptive's; a prompt chunk takes its
   * best count, as `run` does).
   * @param {number} program
   * @param {number} state
   * @param {number} T
   */
  plan(program, state, T) {
    if (this.#disposed) throw new RuvLLMError('inference', 'the kernel threads were stopped');
    let count = this.threads;
    if (this.adaptive) count = T > GROUPED_MAX_ROWS ? this.adaptive.best(PLAN) : this.adaptive.choose(PLAN);
    this.dispatches.set(count, (this.dispatches.get(count) ?? 0) + 1);
    const start = performance.now();
    let result;
    try {
      result = this.exports.run_plan_pool(program, state, 0, count);
    } catch {
      throw new RuvLLMError('inference', 'a kernel thread failed on a step of the decode plan');
    } finally {
      this.ctl[CTL.PLAN] = 0; // (a trap leaves it set, and the pool's own products read it)
    }
    if (this.adaptive && T <= GROUPED_MAX_ROWS) this.adaptive.record(PLAN, count, performance.now() - start, T);
    if (result === -1) {
      void this.dispose();
      throw new RuvLLMError(
        'inference',
        `the kernel threads stopped: a step of the decode plan made no progress for ${STALL_MS / 1000} s; ` +
          'load with threads: 1 to compute without them',
      );
    }
    if (result !== 0) throw new RuvLLMError('inference', 'a kernel thread failed on a step of the decode plan');
  }

  /**
   * `count` threads take units of the job in the control block; returns when all are done. On one thread
   * ('auto' measured it faster, or tries it; a pool of one) the caller computes the job alone and the
   * threads are not told: those spinning for the next dispatch go on spinning, within their budget, so a
   * dispatch on all of them right after finds them awake. (Before, such a dispatch set the spin to 0 and
   * sent them to sleep: see Adaptive.)
   */
  #dispatch(count) {
    const ctl = this.ctl;
    this.dispatches.set(count, (this.dispatches.get(count) ?? 0) + 1);
    if (count === 1) {
      try {
        for (let j = 0; j < ctl[CTL.JOBS]; j++) runUnit(this.exports, ctl, j, 0, 1); // each matrix whole
      } catch {
        throw new RuvLLMError('inference', 'a kernel thread failed on a product');
      }
      return;
    }
    const slices = SLICES_PER_THREAD * count;
    const units = ctl[CTL.JOBS] * slices;
    const gen = (ctl[CTL.GEN] + 1) | 0;
    announce(ctl, slices, units);
    open(ctl, gen);
    if (Atomics.load(ctl, CTL.SLEEPERS) > 0) Atomics.notify(ctl, CTL.GEN, count - 1);
    work(this.exports, ctl, gen, 0);
    // Units still out are being computed (claimed): spin for them, as they take microseconds in decoding,
    // rather than sleep, which costs a wake-up and may move this thread to a core with cold caches.
    const end = performance.now() + FINISH_SPIN_MS;
    for (let n = 1; Atomics.load(ctl, CTL.DONE) !== units; n++) if ((n & 63) === 0 && performance.now() > end) break;
    // The caller sleeps in slices of CHECK_MS, re-reading DONE after each: a wake-up that never comes
    // costs one slice, not the rest of the run, and no progress for STALL_MS is an error, not a hang.
    let stillFor = 0;
    if (Atomics.load(ctl, CTL.DONE) !== units) this.waits += 1;
    for (let seen = -1; ;) {
      const done = Atomics.load(ctl, CTL.DONE);
      if (done === units) break;
      if (done !== seen) [seen, stillFor] = [done, 0];
      else if (stillFor >= STALL_MS) this.#stalled(done, units);
      if (waitWhile(ctl, CTL.DONE, done, CTL.WAITING, CHECK_MS) === 'timed-out') {
        stillFor += CHECK_MS;
        if (Atomics.load(ctl, CTL.DONE) === units) this.lateWakes += 1; // (done, but nobody woke us)
      }
    }
    if (Atomics.load(ctl, CTL.FAILED)) {
      Atomics.store(ctl, CTL.FAILED, 0);
      throw new RuvLLMError('inference', 'a kernel thread failed on a product');
    }
  }

  /** No unit of the dispatch was counted for STALL_MS: the pool is stopped, and the product fails. */
  #stalled(done, units) {
    const claimed = Atomics.load(this.ctl, CTL.NEXT) & 0xffff;
    void this.dispose(); // (its workers end; later products are refused)
    throw new RuvLLMError(
      'inference',
      `the kernel threads stopped: ${done} of ${units} units of a product done (${claimed} taken) after ` +
        `${STALL_MS / 1000} s without progress; load with threads: 1 to compute without them`,
    );
  }

  /** Stop the workers (they leave their loop) and end them. Safe to call twice. */
  async dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    Atomics.store(this.ctl, CTL.STOP, 1);
    Atomics.add(this.ctl, CTL.GEN, 1);
    Atomics.notify(this.ctl, CTL.GEN);
    await Promise.all(this.workers.map((w) => w.terminate()));
    this.workers = [];
  }
}
