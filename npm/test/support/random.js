// A deterministic generator (xorshift32), so a failure can be re-run and a benchmark's inputs repeat:
// the kernels' tests (pool.test.js) and the relaxed-SIMD benchmark (benchmarks/relaxed/bench.mjs) share it.

/**
 * Numbers in [0, 1) from `seed`.
 * @param {number} seed
 * @returns {() => number}
 */
export function random(seed) {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 2 ** 32;
  };
}
