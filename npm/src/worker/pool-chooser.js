/**
 * The kernel thread pool's (pool.js) thread count for `threads: 'auto'`: each dispatch runs on one thread
 * or all of them, whichever measured faster. Adaptive says how it measures, and why not per product size.
 */

/** One phase's state in Adaptive. */
class Phase {
  /**
   * @param {number} count the count its dispatches run on first
   * @param {number} epoch dispatches in a row on one count
   */
  constructor(count, epoch) {
    this.count = count; // the count its dispatches run on now
    this.epoch = epoch;
  }
  /** @type {Map<number, Map<number, number>>} by size class, then count: milliseconds per unit of work */
  per = new Map();
  /** @type {Map<number, number>} by size class: the work seen, its weight in the comparison */
  weight = new Map();
  /** @type {Map<number, { ms: number, work: number }>} this epoch's time and work by size class */
  spent = new Map();
  dispatches = 0; // in this epoch
  epochs = 0;
  measured = new Set(); // the counts an epoch has run on
  interval = Adaptive.FIRST_INTERVAL;
  nextProbe = 0;
  probing = false;
}

/** Adaptive's phase for decoding rows (T <= GROUPED_MAX_ROWS). */
export const DECODE = 'decode';
/** Adaptive's phase for a decode plan's calls of a few rows (KernelPool.plan): one per token. */
export const PLAN = 'plan';

/**
 * One thread or all of them for the dispatches of a phase (the pool has two: decoding's products, and
 * the decode plan's calls, each a token), whichever measured faster, in epochs: EPOCH dispatches (a
 * plan's: PLAN_EPOCH calls) in a row run on one count, timed per unit of work
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
  /**
   * A decode plan's call is a whole token (16-30 ms for the small models), not one product: its epochs
   * are 8 calls, so a try of the other count costs 8 tokens. Measured on a busy machine (another process
   * holding one of the two cores), SmolLM2 stepped token by token: with epochs of 32, a third of the first
   * 384 tokens ran on 2 threads (the first epoch and the tries), and 'auto' decoded at 0.84-0.93x of one
   * thread (benchmarks/RESULTS.md, issue 38 session 2).
   */
  static PLAN_EPOCH = 8;
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
      phase = new Phase(this.most, key === PLAN ? Adaptive.PLAN_EPOCH : Adaptive.EPOCH);
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
    const seen = phase.spent.get(size);
    if (seen) {
      seen.ms += ms;
      seen.work += work;
    } else {
      phase.spent.set(size, { ms, work });
    }
    if (++phase.dispatches < phase.epoch) return;
    const before = phase.measured.size === 2 ? this.#best(phase) : null;
    for (const [size, { ms, work }] of phase.spent) {
      const per = phase.per.get(size) ?? new Map();
      const old = per.get(count);
      per.set(count, old === undefined || phase.probing ? ms / work : 0.5 * (old + ms / work));
      phase.per.set(size, per);
      phase.weight.set(size, (phase.weight.get(size) ?? 0) + work);
    }
    phase.spent.clear();
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
