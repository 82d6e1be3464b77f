/**
 * The dispatch protocol of the kernel thread pool (pool.js), shared by the thread that calls `run` and
 * the workers (pool-worker.js): the control block at the start of the pool memory, the cut of a job into
 * units, and how a thread claims, computes and counts them, and waits for the next word to change.
 * Nothing here allocates or starts a thread, so a worker imports only this.
 */

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
  PLAN: 85, // a decode plan's dispatch: its first step's address (kernels.c run_plan_pool); 0: a product
  PLAN_STATE: 86, // the plan's state (kernels.c run_plan)
  JOB: 96, // JOB + JOB_WORDS * j: matrix j of the dispatch (JOB_FIELDS)
});
export const MAX_JOBS = 8;
export const JOB_WORDS = 12;
export const JOB_FIELDS = Object.freeze({ FORM: 0, W: 1, SCALES: 2, MINS: 3, OFFSET: 4, Y: 5, N: 6, K: 7 });
/** Bytes of the control block; the pool memory hands out what follows (pool-memory.js). */
export const CONTROL_BYTES = 4096;
/** Matrix forms: float32 weights, int8 codes (scale per 32), int8 codes (scale per 16, no mins), q4 nibbles. */
export const FORMS = Object.freeze(['dense', 'q8', 'q8h', 'q4']);
export const GROUP = 32;
export const TILE_ROWS = 16; // kernels.c: weight rows per tile, and the slices' granularity
export const GROUPED_MAX_ROWS = 4; // kernels.c: the most rows of x contracted group by group (decoding)
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
 * matrix, computed with thread `i`'s scratch; or, in a decode plan's dispatch, the unit kernels.c cuts
 * (plan_unit).
 * @param {Record<string, Function>} k the instance's exports
 * @param {Int32Array} ctl
 */
export function runUnit(k, ctl, unit, i, slices) {
  if (ctl[CTL.PLAN] !== 0) {
    k.plan_unit(0, unit, i); // (the control block is at address 0)
    return;
  }
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
