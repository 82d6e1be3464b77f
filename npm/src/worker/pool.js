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
 */

import { IS_NODE } from '../env.js';
import { RuvLLMError } from '../errors.js';
import { MAX_THREADS } from '../protocol.js';

/** Words of the control block (an Int32Array over the first bytes of the pool memory). */
export const CTL = Object.freeze({
  GEN: 0, // bumped by the caller for each dispatch (and for stop)
  DONE: 1, // units of the current dispatch done
  STOP: 2, // 1: workers leave their loop
  FAILED: 3, // 1: a worker's unit threw (the caller throws after the dispatch)
  THREADS: 4, // threads of the pool, the caller included
  SLICES: 14, // slices of each matrix in the current dispatch (units: JOBS * SLICES)
  JOBS: 5, // matrices in the current dispatch
  FAST: 6, // 1: decoding products of quantized matrices take x quantized (xq, d, xs)
  T: 7, // rows of x
  X: 8, // where x is (float32, T * K)
  XQ: 9, // quantize_x's outputs: xq int16 (T, K), d (T, G), xs (T, G), then the relaxed build's split x
  D: 10,
  XS: 11,
  NEXT: 12, // the next unit to claim, in the low 16 bits; the generation's low 15 bits above them
  UNITS: 13, // units of the current dispatch: JOBS * SLICES
  SPIN: 15, // microseconds a thread may spin on a word before it sleeps (0: sleep at once): see DEFAULT_SPIN_US
  SCRATCH: 16, // SCRATCH + i: thread i's scratch (TILE_ROWS * K float32), i < MAX_THREADS
  WAITING: 80, // 1 while the caller sleeps for the last units of a dispatch (else nobody notifies it)
  SLEEPERS: 81, // workers asleep on GEN (the caller notifies only when some are)
  TRANSPOSED: 82, // 1: the dispatch is learning's backward product, y += x[:, N0:N1] @ W[N0:N1] (KernelPool.transposed)
  N0: 83,
  N1: 84,
  JOB: 96, // JOB + JOB_WORDS * j: matrix j of the dispatch (JOB_FIELDS)
});
export const MAX_JOBS = 8;
/**
 * Slices of each matrix per thread: more units than threads, so a thread that starts late (woken after
 * the others, or preempted) still finds work, and one that is not scheduled holds back only a small one.
 */
const SLICES_PER_THREAD = 4;
const JOB_WORDS = 12;
const JOB_FIELDS = Object.freeze({ FORM: 0, W: 1, SCALES: 2, MINS: 3, OFFSET: 4, Y: 5, N: 6, K: 7 });
const CONTROL_BYTES = 4096;
/** Matrix forms: float32 weights, int8 codes (scale per 32), int8 codes (scale per 16, no mins), q4 nibbles. */
export const FORMS = Object.freeze(['dense', 'q8', 'q8h', 'q4']);
const GROUP = 32;
const TILE_ROWS = 16; // kernels.c: weight rows per tile, and the slices' granularity
const GROUPED_MAX_ROWS = 4; // kernels.c: the most rows of x contracted group by group (decoding)
const PAGE = 65536;
/** `n` rounded up to a multiple of 16, in arithmetic that stays exact past 2 GiB (unlike `& ~15`). */
const align16 = (n) => Math.ceil(n / 16) * 16;
/**
 * Microseconds a thread spins on a word (the next dispatch) before it sleeps in Atomics.wait. A wake-up
 * through Atomics.wait takes ~13 µs and more in a VM, as long as a small model's product on one thread:
 * the caller did most units before the other thread started. Spinning keeps the threads awake across
 * the gaps between products (attention, norms: Python's share of a token), and ends within this budget
 * once products stop. A dispatch on one thread runs in the caller alone without telling them, so when
 * 'auto' keeps choosing one (a busy machine) their spin runs out within the budget and they sleep,
 * leaving the cores to others. Measured on whole models, 1 and 2 threads stepped token by token in one
 * process (bench/threads.js): decoding at 2 threads against 1 went from 0.85-1.11x to 1.11-1.23x on
 * SmolLM2 and from 1.23-1.28x to 1.28-1.33x on Gemma 3 270M with it, and stayed ~1.5x on the 1B.
 */
export const DEFAULT_SPIN_US = 1000;
/** The caller spins this long for the units other threads are still computing before it sleeps. */
const FINISH_SPIN_MS = 1;
/** The caller's sleeps while others finish a dispatch last at most this long before it looks again. */
const CHECK_MS = 100;
/** A dispatch with no unit counted for this long has stalled (a unit takes milliseconds). */
const STALL_MS = 60000;

/** Output features [n0, n1) of N that thread `i` of `threads` computes: whole tiles, spread evenly. */
export function slice(N, i, threads) {
  const tiles = Math.ceil(N / TILE_ROWS);
  const lo = Math.floor((tiles * i) / threads) * TILE_ROWS;
  const hi = Math.min(N, Math.floor((tiles * (i + 1)) / threads) * TILE_ROWS);
  return [Math.min(lo, N), hi];
}

/**
 * Columns [k0, k1) of K that unit `i` of `slices` computes in a backward product (KernelPool.transposed):
 * whole groups of 32, spread evenly.
 */
export function columns(K, i, slices) {
  const groups = Math.ceil(K / GROUP);
  const lo = Math.floor((groups * i) / slices) * GROUP;
  const hi = Math.min(K, Math.floor((groups * (i + 1)) / slices) * GROUP);
  return [Math.min(lo, K), hi];
}

/** The tag of generation `gen` in the NEXT word. */
const tagOf = (gen) => (gen & 0x7fff) << 16;
/** NEXT between dispatches: an index past any unit count, so nothing can be claimed. */
const CLOSED = 0xffff;

/**
 * The first half of opening a dispatch of `units` units (`slices` per matrix): NEXT is closed before the
 * counts change. A thread still in `work` for the dispatch before may have read NEXT (all of that
 * dispatch claimed) and not yet the unit count: were the new, larger count written first, that thread's
 * claim would pass its check and its compare-and-swap on the old tag, and count units of the old
 * dispatch into the new one (seen: "60 of 36 units done", a stall). `open` then lets the units be taken.
 * @param {Int32Array} ctl
 */
export function announce(ctl, slices, units) {
  Atomics.store(ctl, CTL.NEXT, CLOSED);
  Atomics.store(ctl, CTL.SLICES, slices);
  Atomics.store(ctl, CTL.UNITS, units);
  Atomics.store(ctl, CTL.DONE, 0);
}

/**
 * The second half: dispatch `gen`'s units may be claimed from here on, and the threads are told.
 * @param {Int32Array} ctl
 */
export function open(ctl, gen) {
  Atomics.store(ctl, CTL.NEXT, tagOf(gen));
  Atomics.store(ctl, CTL.GEN, gen);
}

/**
 * Unit `unit` of the dispatch described in the control block (`slices` per matrix): one slice of one
 * matrix, computed with thread `i`'s scratch.
 * @param {Record<string, Function>} k the instance's exports
 * @param {Int32Array} ctl
 */
function runUnit(k, ctl, unit, i, slices) {
  const T = ctl[CTL.T];
  const fast = ctl[CTL.FAST] === 1 && T <= GROUPED_MAX_ROWS;
  const x = ctl[CTL.X];
  const at = CTL.JOB + JOB_WORDS * Math.floor(unit / slices);
  const form = FORMS[ctl[at + JOB_FIELDS.FORM]];
  const [w, scales, mins, offset, y, N, K] = [
    ctl[at + JOB_FIELDS.W],
    ctl[at + JOB_FIELDS.SCALES],
    ctl[at + JOB_FIELDS.MINS],
    ctl[at + JOB_FIELDS.OFFSET],
    ctl[at + JOB_FIELDS.Y],
    ctl[at + JOB_FIELDS.N],
    ctl[at + JOB_FIELDS.K],
  ];
  if (ctl[CTL.TRANSPOSED] === 1) {
    const [k0, k1] = columns(K, unit % slices, slices);
    const [n0, n1] = [ctl[CTL.N0], ctl[CTL.N1]];
    if (k1 <= k0) return;
    if (form === 'dense') k.dense_t(x, w, y, T, N, K, n0, n1, k0, k1);
    else k[`${form}_t`](x, w, scales, mins, offset, y, ctl[CTL.SCRATCH + i], T, N, K, n0, n1, k0, k1);
    return;
  }
  const [n0, n1] = slice(N, unit % slices, slices);
  if (n1 <= n0) return;
  if (form === 'dense') k.dense_rows(x, w, y, T, N, K, n0, n1);
  else if (fast)
    k[`${form}_fast_rows`](ctl[CTL.XQ], ctl[CTL.D], ctl[CTL.XS], w, scales, mins, offset, y, T, N, K, n0, n1);
  else k[`${form}_exact_rows`](x, w, scales, mins, offset, y, ctl[CTL.SCRATCH + i], T, N, K, n0, n1);
}

/**
 * Thread `i`'s share of dispatch `gen`: claim units until none is left (or the dispatch is over), run
 * each and count it done; the thread that counts the last one wakes the caller. Runs in the caller
 * (i = 0) and in each worker.
 * @param {Record<string, Function>} k the instance's exports
 * @param {Int32Array} ctl
 */
export function work(k, ctl, gen, i) {
  const tag = tagOf(gen);
  for (;;) {
    const next = Atomics.load(ctl, CTL.NEXT);
    if ((next & ~0xffff) !== tag || (next & 0xffff) >= Atomics.load(ctl, CTL.UNITS)) return;
    if (Atomics.compareExchange(ctl, CTL.NEXT, next, next + 1) !== next) continue;
    // claimed: the dispatch cannot end before this unit is counted, so the job stays as read here
    const units = ctl[CTL.UNITS];
    try {
      runUnit(k, ctl, next & 0xffff, i, ctl[CTL.SLICES]);
    } catch {
      Atomics.store(ctl, CTL.FAILED, 1);
    }
    if (Atomics.add(ctl, CTL.DONE, 1) + 1 === units && Atomics.load(ctl, CTL.WAITING) > 0)
      Atomics.notify(ctl, CTL.DONE);
  }
}

/**
 * Wait until `ctl[word]` is no longer `value`: spin while the pool's SPIN budget (microseconds) lasts,
 * then sleep in Atomics.wait (`ms` at most, when given: 'timed-out' then). While it
 * sleeps, `ctl[sleepers]` counts it, so whoever changes the word notifies only when someone sleeps: a
 * notify costs ~12 µs (a futex wake), each dispatch had two. No wake-up is lost: the sleeper adds itself
 * before Atomics.wait compares the word, the changer changes the word before it reads the count (all
 * sequentially consistent), so either the changer sees the sleeper or the sleeper sees the new value.
 * @param {Int32Array} ctl
 * @returns {string} 'ok' (the word changed) or 'timed-out'
 */
export function waitWhile(ctl, word, value, sleepers, ms = Infinity) {
  const budget = Atomics.load(ctl, CTL.SPIN);
  if (budget > 0) {
    const end = performance.now() + budget / 1000;
    for (let n = 1; ; n++) {
      if (Atomics.load(ctl, word) !== value) return 'ok';
      if ((n & 255) === 0 && performance.now() > end) break;
    }
  }
  Atomics.add(ctl, sleepers, 1);
  try {
    if (ms !== Infinity) return Atomics.wait(ctl, word, value, ms) === 'timed-out' ? 'timed-out' : 'ok';
    while (Atomics.load(ctl, word) === value) Atomics.wait(ctl, word, value);
    return 'ok';
  } finally {
    Atomics.sub(ctl, sleepers, 1);
  }
}

/** A shared memory of at least `pages` pages, with the largest maximum this runtime lets us reserve. */
function sharedMemory(pages, maxPages) {
  for (let maximum = maxPages; maximum >= pages; maximum = Math.floor(maximum / 2)) {
    try {
      return new WebAssembly.Memory({ initial: pages, maximum, shared: true });
    } catch (error) {
      if (!(error instanceof RangeError)) throw error;
    }
  }
  throw new RuvLLMError('load', `cannot reserve a shared WebAssembly memory of ${pages} pages for the kernel threads`);
}

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

/** One phase's state in Adaptive. */
class Phase {
  /** @param {number} count the count its dispatches run on first */
  constructor(count) {
    this.count = count; // the count its dispatches run on now
  }
  /** @type {Map<number, Map<number, number>>} by size class, then count: milliseconds per unit of work */
  per = new Map();
  /** @type {Map<number, number>} by size class: the work seen, its weight in the comparison */
  weight = new Map();
  /** @type {Map<number, { ms: number, work: number }>} this epoch's time and work by size class */
  epoch = new Map();
  dispatches = 0; // in this epoch
  epochs = 0;
  measured = new Set(); // the counts an epoch has run on
  interval = Adaptive.FIRST_INTERVAL;
  nextProbe = 0;
  probing = false;
}

/** Adaptive's phase for decoding rows (T <= GROUPED_MAX_ROWS). */
const DECODE = 'decode';

/**
 * One thread or all of them for the dispatches of a phase (the pool has one: decoding), whichever
 * measured faster, in epochs: EPOCH dispatches in a row run on one count, timed per unit of work
 * (milliseconds / (T * N * K)) for each size class of product (the work rounded to a power of two, as a
 * small product pays more for its synchronisation than a large one), and the counts are compared over
 * the classes, weighted by the work each has seen. All threads are tried for an epoch, then one (a
 * device's cores are there to be used); the faster is kept and the other tried again for one epoch
 * after `interval` epochs (FIRST_INTERVAL, doubling to MOST_INTERVAL while the choice holds,
 * FIRST_INTERVAL again when it changes), as runtime/threads.py's Adaptive does for BLAS threads.
 *
 * Not a choice per size of product: a dispatch on one thread lets the others' spin run out, so the next
 * one on all of them wakes sleeping threads, and deciding each size on its own timed every all-thread
 * try after one-thread dispatches of other sizes, wake-ups included. The 1B's attention products then
 * stayed on one thread, and 'auto' decoded at 0.85x of a fixed 2 threads in Chromium
 * (benchmarks/RESULTS.md, session 34). A prompt's rows run on decoding's `best` count (all of them
 * until decoding measured both): its products are longer and bound by compute more than decoding's, so
 * more threads help them at least as much, and a prompt is too short to spend epochs on one thread (the
 * 1B's 32-token prompt took 1.1-1.3x 2 threads' time while it tried). Any count gives the same bits, so
 * switching is always safe.
 */
export class Adaptive {
  static EPOCH = 32;
  static FIRST_INTERVAL = 2;
  static MOST_INTERVAL = 64;

  /** @param {number} most */
  constructor(most) {
    this.most = most;
    /** @type {Map<string, Phase>} */
    this.phases = new Map();
  }

  /** @returns {Phase} */
  #phase(key) {
    let phase = this.phases.get(key);
    if (!phase) {
      phase = new Phase(this.most);
      this.phases.set(key, phase);
    }
    return phase;
  }

  /**
   * The count whose epochs measured faster: per size class, then weighted by the work each class has
   * seen, over the classes measured on both counts.
   * @param {Phase} phase
   */
  #best(phase) {
    let one = 0;
    let all = 0;
    for (const [size, per] of phase.per) {
      if (!per.has(1) || !per.has(this.most)) continue;
      const weight = /** @type {number} */ (phase.weight.get(size));
      one += weight * /** @type {number} */ (per.get(1));
      all += weight * /** @type {number} */ (per.get(this.most));
    }
    return one < all ? 1 : this.most;
  }

  /** The thread count for the next dispatch of phase `key`. */
  choose(key) {
    return this.#phase(key).count;
  }

  /** The count that measured faster in phase `key`; all of them until both were measured. */
  best(key) {
    const phase = this.#phase(key);
    return phase.measured.size === 2 ? this.#best(phase) : this.most;
  }

  /** A dispatch of phase `key` on `count` threads took `ms` for `work` (T * N * K). */
  record(key, count, ms, work) {
    const phase = this.#phase(key);
    if (count !== phase.count) return; // (chosen before its epoch ended)
    const size = Math.round(Math.log2(work));
    const seen = phase.epoch.get(size);
    if (seen) {
      seen.ms += ms;
      seen.work += work;
    } else {
      phase.epoch.set(size, { ms, work });
    }
    if (++phase.dispatches < Adaptive.EPOCH) return;
    const before = phase.measured.size === 2 ? this.#best(phase) : null;
    for (const [size, { ms, work }] of phase.epoch) {
      const per = phase.per.get(size) ?? new Map();
      const old = per.get(count);
      per.set(count, old === undefined || phase.probing ? ms / work : 0.5 * (old + ms / work));
      phase.per.set(size, per);
      phase.weight.set(size, (phase.weight.get(size) ?? 0) + work);
    }
    phase.epoch.clear();
    phase.dispatches = 0;
    phase.epochs += 1;
    phase.measured.add(count);
    if (phase.measured.size < 2) {
      phase.count = 1; // all of them were tried first: now one
      return;
    }
    if (phase.probing) {
      const held = this.#best(phase) === before;
      phase.interval = held ? Math.min(2 * phase.interval, Adaptive.MOST_INTERVAL) : Adaptive.FIRST_INTERVAL;
      phase.probing = false;
      phase.nextProbe = phase.epochs + phase.interval;
    } else if (before === null) {
      phase.nextProbe = phase.epochs + phase.interval; // both counts measured once: the faster holds
    } else if (phase.epochs >= phase.nextProbe) {
      phase.probing = true;
      phase.count = this.#best(phase) === 1 ? this.most : 1; // the other count, for one epoch
      return;
    }
    phase.count = this.#best(phase);
  }
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
  #top = CONTROL_BYTES; // first byte never handed out
  #free = []; // released regions, { at, bytes }, handed out again before the memory grows
  #sizes = new Map(); // address -> bytes of each region `place` made (released with its matrix)
  #io = { at: 0, bytes: 0 }; // x, quantize_x's outputs and the outputs of a dispatch
  #scratchFloats = 0; // each thread's scratch, in float32
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
    this.exports = exports;
    this.threads = threads;
    this.spin = spin;
    this.ctl = new Int32Array(memory.buffer, 0, CONTROL_BYTES / 4);
    this.ctl[CTL.THREADS] = threads;
    this.ctl[CTL.SPIN] = spin;
  }

  /** Bytes reserved in the pool memory so far. */
  get bytes() {
    return this.#top;
  }

  /**
   * `bytes` bytes of the pool memory, aligned to 16: a released region they fit in (the smallest), else
   * new space at the end, growing the memory when needed. Their address.
   */
  alloc(bytes) {
    bytes = align16(bytes);
    let best = -1;
    this.#free.forEach((r, i) => {
      if (r.bytes >= bytes && (best < 0 || r.bytes < this.#free[best].bytes)) best = i;
    });
    if (best >= 0) {
      const region = this.#free[best];
      if (region.bytes - bytes >= 256) this.#free[best] = { at: region.at + bytes, bytes: region.bytes - bytes };
      else this.#free.splice(best, 1);
      return region.at;
    }
    const at = align16(this.#top);
    const end = at + bytes;
    const have = this.memory.buffer.byteLength;
    if (end > have) {
      try {
        this.memory.grow(Math.ceil((end - have) / PAGE));
      } catch (error) {
        throw new RuvLLMError('load', `the kernel threads' memory cannot grow to ${end} bytes: ${error.message}`);
      }
    }
    this.#top = end;
    return at;
  }

  /** A copy of `bytes` (any typed array) in the pool memory: its address. */
  place(bytes) {
    const source = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const at = this.alloc(source.byteLength);
    new Uint8Array(this.memory.buffer, at, source.byteLength).set(source);
    this.#sizes.set(at, source.byteLength);
    return at;
  }

  /** Forget matrix `handle` and hand its placed parts out again. */
  release(handle) {
    const m = this.#matrices[handle];
    if (!m) return;
    this.#matrices[handle] = null;
    for (const at of [m.w, m.scales, m.mins]) {
      const bytes = this.#sizes.get(at);
      if (!at || bytes === undefined) continue;
      this.#sizes.delete(at);
      this.#free.push({ at, bytes: align16(bytes) });
    }
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
    if (TILE_ROWS * K > this.#scratchFloats) this.#scratch(TILE_ROWS * K);
    this.#matrices.push({ form: FORMS.indexOf(form), w, scales, mins, offset, N, K });
    return this.#matrices.length - 1;
  }

  /** Give every thread `floats` float32 of scratch (the old scratch stays unused: growth is rare). */
  #scratch(floats) {
    for (let i = 0; i < this.threads; i++) this.ctl[CTL.SCRATCH + i] = this.alloc(4 * floats);
    this.#scratchFloats = floats;
  }

  /** `bytes` bytes of input/output space for one dispatch (kept and grown, never shrunk). */
  #ioSpace(bytes) {
    if (bytes > this.#io.bytes) {
      const size = Math.max(bytes, 2 * this.#io.bytes);
      this.#io = { at: this.alloc(size), bytes: size };
    }
    return this.#io.at;
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
    const at = this.#ioSpace(align16(xBytes) + align16(qBytes) + yBytes.reduce((a, b) => a + b, 0));
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
    const at = this.#ioSpace(dyBytes + align16(4 * T * m.K));
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
