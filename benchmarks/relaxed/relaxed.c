// Relaxed SIMD, measured (issue 25 item 4): the fast decode kernels with
// i32x4.relaxed_dot_i8x16_i7x16_add_s instead of widening to int16 and i32x4.dot_i16x8_s.
//
// This file is a benchmark, not a kernel the engine loads: it includes kernels/kernels.c unchanged (so
// the plain kernels in the same module are the ones the engine runs, built by the same compiler) and
// adds relaxed variants. Built by benchmarks/relaxed/bench.mjs with clang-19 -mrelaxed-simd (Debian's
// clang 14 has no relaxed dot builtin). docs/kernels.md has the figures. The q4 relaxed16 variant is
// what the engine's relaxed build of kernels.c (-DRUVLLM_RELAXED) now runs; the others stay measured and
// unused, so their x quantization (14, 15 or 8 bits) stays here, beside kernels.c's 15-bit split.
//
// The relaxed dot multiplies signed bytes (a) by 7-bit bytes (b) and adds groups of 4 products to
// int32 lanes. Its result is deterministic only when every byte of b is in 0..127; otherwise an engine
// may read b as signed or unsigned and may saturate the pairwise int16 sums (x86's pmaddubsw does).
// Every call below keeps b in 0..127:
// - q4 (codes 0..15 before the offset): b = the raw codes, a = x. x as int16 does not fit a byte, so x
//   is quantized to 15 bits and split: xq = 128 hi + lo, hi in -128..127, lo in 0..127; two dots per
//   16 codes instead of one; the offset (q4_0's 8) comes off as offset * sum(xq) per group.
// - q8 (signed codes): b must be x. x is quantized to 14 bits and shifted: xq + 8192 = 128 hi + lo with
//   hi, lo in 0..127, and sum(code * xq) = 128 (dot(c, hi) - 64 sum(c)) + dot(c, lo), sum(c) from a third
//   relaxed dot with ones.
// - q4 with x as int8 (llama.cpp's q8_0 activations, one dot per 16 codes): the speed bound, at the
//   +1.26% perplexity docs/kernels.md measured for int8 activations (over the 0.5% bar).
// - q4 relaxed16: q4's split x through the int16 form of the dot (i16x8.relaxed_dot_i8x16_i7x16_s).
// And, at the end, the float32 decode loops (dense, q4 exact) with f32x4.relaxed_madd.

#include "../../kernels/kernels.c"

#define RDOT(a, b, c) wasm_i32x4_relaxed_dot_i8x16_i7x16_add(a, b, c)
#define RDOT16(a, b) wasm_i16x8_relaxed_dot_i8x16_i7x16(a, b)

// The bare instruction, for the known-answer test: out[0:4] = relaxed_dot(a[0:16], b[0:16], c[0:4]).
EXPORT(relaxed_dot_probe) void relaxed_dot_probe(const i8 *a, const i8 *b, const i32 *c, i32 *out) {
  wasm_v128_store(out, RDOT(wasm_v128_load(a), wasm_v128_load(b), wasm_v128_load(c)));
}

// and its int16 form: out[0:8] = relaxed_dot(a[0:16], b[0:16]) (pairs of products, as int16)
EXPORT(relaxed_dot16_probe) void relaxed_dot16_probe(const i8 *a, const i8 *b, short *out) {
  wasm_v128_store(out, RDOT16(wasm_v128_load(a), wasm_v128_load(b)));
}

// x (T, K) -> xb (T, 2K bytes): per group of 32, 64 bytes [hi 0..31, lo 0..31]; d (T, G); xs (T, G) the
// exact group sums of x; sq (T, G) = d * sum(xq) per group (the offset's share).
// bits 15: xq = round(x / d) in -16383..16383, d = max|x| / 16383, hi = xq >> 7 (signed), lo = xq & 127.
// bits 14: xq in -8191..8191 (d = max|x| / 8191), xq + 8192 = 128 hi + lo, both 0..127.
// bits 8:  xq in -127..127 (d = max|x| / 127), stored as 32 bytes per group [xq 0..31] (xb is T x K).
EXPORT(quantize_x_split) void quantize_x_split(const float *x, i8 *xb, float *d, float *xs, float *sq, i32 T, i32 K,
                                               i32 bits) {
  const i32 G = K / GROUP, stride = bits == 8 ? GROUP : 2 * GROUP;
  const float top = bits == 15 ? 16383.0f : bits == 14 ? 8191.0f : 127.0f;
  for (i32 t = 0; t < T; t++) {
    for (i32 g = 0; g < G; g++) {
      const QuantizedGroup group = quantize_group(x + (long)t * K + g * GROUP, top);
      v128_t q0 = group.h[0], q1 = group.h[1], q2 = group.h[2], q3 = group.h[3];
      i8 *out = xb + (long)t * G * stride + g * stride;
      if (bits == 8) {
        wasm_v128_store(out, wasm_i8x16_narrow_i16x8(q0, q1));
        wasm_v128_store(out + 16, wasm_i8x16_narrow_i16x8(q2, q3));
      } else {
        v128_t shift = wasm_i16x8_splat(bits == 14 ? 8192 : 0), low = wasm_i16x8_splat(127);
        q0 = wasm_i16x8_add(q0, shift), q1 = wasm_i16x8_add(q1, shift);
        q2 = wasm_i16x8_add(q2, shift), q3 = wasm_i16x8_add(q3, shift);
        wasm_v128_store(out, wasm_i8x16_narrow_i16x8(wasm_i16x8_shr(q0, 7), wasm_i16x8_shr(q1, 7)));
        wasm_v128_store(out + 16, wasm_i8x16_narrow_i16x8(wasm_i16x8_shr(q2, 7), wasm_i16x8_shr(q3, 7)));
        wasm_v128_store(out + 32, wasm_i8x16_narrow_i16x8(wasm_v128_and(q0, low), wasm_v128_and(q1, low)));
        wasm_v128_store(out + 48, wasm_i8x16_narrow_i16x8(wasm_v128_and(q2, low), wasm_v128_and(q3, low)));
      }
      d[t * G + g] = group.d;
      xs[t * G + g] = group.sum;
      sq[t * G + g] = group.d * (float)group_integer_sum(group.q);
    }
  }
}

// y = x @ W.T for x from quantize_x_split (bits as there: 15 or 8 for q4, 14 for q8; xbits 16 is q4's 15
// bits through the int16 relaxed dot).
__attribute__((always_inline)) static inline void quant_relaxed(i32 bits, i32 xbits, const i8 *xb, const float *d,
                                                               const float *xs, const float *sq, const void *weights,
                                                               const float *scales, const float *mins, i32 offset,
                                                               float *y, i32 T, i32 N, i32 K) {
  const i32 G = K / GROUP, row_bytes = bits == 8 ? K : K / 2, stride = xbits == 8 ? GROUP : 2 * GROUP;
  const v128_t off = wasm_i8x16_splat((i8)offset), zero = wasm_i32x4_splat(0), ones = wasm_i8x16_splat(1);
  for (i32 n = 0; n < N; n++) {
    const u8 *row = (const u8 *)weights + (long)n * row_bytes;
    const float *sc = scales + (long)n * G;
    for (i32 t = 0; t < T; t++) {
      const i8 *xt = xb + (long)t * G * stride;
      const float *dt = d + t * G;
      v128_t acc = wasm_f32x4_splat(0);
      for (i32 g = 0; g < G; g++) {
        const i8 *xg = xt + g * stride;
        v128_t dotv;
        if (bits == 4) {
          v128_t p = wasm_v128_load(row + g * (GROUP / 2));
          v128_t ca = wasm_v128_and(p, wasm_i8x16_splat(15)), cb = wasm_u8x16_shr(p, 4);
          v128_t h = zero;
          if (xbits != 16) h = RDOT(wasm_v128_load(xg), ca, RDOT(wasm_v128_load(xg + 16), cb, zero));
          if (xbits == 16) {
            // the int16 form (one pmaddubsw on x86): pairs of |hi or lo| * 15 <= 3840, two of them added
            // still fit int16; hi's sums times 128 and lo's sums meet in int32 through i32x4.dot_i16x8_s
            v128_t h16 = wasm_i16x8_add(RDOT16(wasm_v128_load(xg), ca), RDOT16(wasm_v128_load(xg + 16), cb));
            v128_t l16 = wasm_i16x8_add(RDOT16(wasm_v128_load(xg + 32), ca), RDOT16(wasm_v128_load(xg + 48), cb));
            dotv = wasm_i32x4_add(wasm_i32x4_dot_i16x8(h16, wasm_i16x8_splat(128)), wasm_i32x4_extadd_pairwise_i16x8(l16));
          } else if (xbits == 8) {
            dotv = h;
          } else {
            v128_t l = RDOT(wasm_v128_load(xg + 32), ca, RDOT(wasm_v128_load(xg + 48), cb, zero));
            dotv = wasm_i32x4_add(wasm_i32x4_shl(h, 7), l);
          }
        } else {
          v128_t ca = wasm_i8x16_sub(wasm_v128_load(row + g * GROUP), off);
          v128_t cb = wasm_i8x16_sub(wasm_v128_load(row + g * GROUP + 16), off);
          v128_t h = RDOT(ca, wasm_v128_load(xg), RDOT(cb, wasm_v128_load(xg + 16), zero));
          v128_t l = RDOT(ca, wasm_v128_load(xg + 32), RDOT(cb, wasm_v128_load(xg + 48), zero));
          v128_t c = RDOT(ca, ones, RDOT(cb, ones, zero));
          dotv = wasm_i32x4_add(wasm_i32x4_shl(wasm_i32x4_sub(h, wasm_i32x4_shl(c, 6)), 7), l);
        }
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_splat(sc[g] * dt[g]), wasm_f32x4_convert_i32x4(dotv)));
      }
      float s = hsum(acc);
      if (bits == 4 && offset) s -= (float)offset * mins_dot(sc, sq + t * G, G);
      if (mins) s += mins_dot(mins + (long)n * G, xs + t * G, G);
      y[(long)t * N + n] = s;
    }
  }
}

EXPORT(q4_relaxed)
void q4_relaxed(const i8 *xb, const float *d, const float *xs, const float *sq, const u8 *packed, const float *scales,
                const float *mins, i32 offset, float *y, i32 T, i32 N, i32 K) {
  quant_relaxed(4, 15, xb, d, xs, sq, packed, scales, mins, offset, y, T, N, K);
}

// the same x (15 bits, split) as q4_relaxed, through the int16 form of the relaxed dot
EXPORT(q4_relaxed16)
void q4_relaxed16(const i8 *xb, const float *d, const float *xs, const float *sq, const u8 *packed,
                  const float *scales, const float *mins, i32 offset, float *y, i32 T, i32 N, i32 K) {
  quant_relaxed(4, 16, xb, d, xs, sq, packed, scales, mins, offset, y, T, N, K);
}

EXPORT(q4_relaxed_x8)
void q4_relaxed_x8(const i8 *xb, const float *d, const float *xs, const float *sq, const u8 *packed,
                   const float *scales, const float *mins, i32 offset, float *y, i32 T, i32 N, i32 K) {
  quant_relaxed(4, 8, xb, d, xs, sq, packed, scales, mins, offset, y, T, N, K);
}

EXPORT(q8_relaxed)
void q8_relaxed(const i8 *xb, const float *d, const float *xs, const float *sq, const i8 *codes, const float *scales,
                const float *mins, i32 offset, float *y, i32 T, i32 N, i32 K) {
  quant_relaxed(8, 14, xb, d, xs, sq, codes, scales, mins, offset, y, T, N, K);
}

// ---- relaxed madd in the float32 products (decoding: one row of x) ---------------------------------------
//
// f32x4.relaxed_madd(a, b, c) is a * b + c, fused or not as the engine likes (so results may differ
// between machines in the last bits). Copies of the plain decode loops with every multiply-add fused.

#define MADD(a, b, c) wasm_f32x4_relaxed_madd(a, b, c)

// dense's decode tile (tile_4x1) with madd; N a multiple of 4, K of 4
EXPORT(dense_madd) void dense_madd(const float *x, const float *w, float *y, i32 N, i32 K) {
  for (i32 n = 0; n + 4 <= N; n += 4) {
    const float *w0 = w + (long)n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    v128_t a0 = wasm_f32x4_splat(0), a1 = a0, a2 = a0, a3 = a0;
    for (i32 k = 0; k + 4 <= K; k += 4) {
      v128_t u = wasm_v128_load(x + k);
      a0 = MADD(u, wasm_v128_load(w0 + k), a0);
      a1 = MADD(u, wasm_v128_load(w1 + k), a1);
      a2 = MADD(u, wasm_v128_load(w2 + k), a2);
      a3 = MADD(u, wasm_v128_load(w3 + k), a3);
    }
    y[n] = hsum(a0), y[n + 1] = hsum(a1), y[n + 2] = hsum(a2), y[n + 3] = hsum(a3);
  }
}

// q4_exact's decode path (codes to float32 in registers, times x, times the scale) with madd
EXPORT(q4_exact_madd)
void q4_exact_madd(const float *x, const u8 *packed, const float *scales, const float *mins, i32 offset, float *y,
                   float *scratch, i32 N, i32 K) {
  const i32 G = K / GROUP;
  const v128_t off = wasm_i8x16_splat((i8)offset);
  if (mins) group_sums(x, scratch, 1, K);
  for (i32 n = 0; n < N; n++) {
    const u8 *row = packed + (long)n * (K / 2);
    const float *sc = scales + (long)n * G;
    v128_t acc = wasm_f32x4_splat(0);
    for (i32 g = 0; g < G; g++) {
      v128_t a, b, c0, c1, c2, c3, c4, c5, c6, c7;
      const float *xg = x + g * GROUP;
      load_q4(row, g, off, &a, &b);
      CODES_TO_F32(a, c0, c1, c2, c3);
      CODES_TO_F32(b, c4, c5, c6, c7);
      v128_t lo = MADD(c1, wasm_v128_load(xg + 4), wasm_f32x4_mul(c0, wasm_v128_load(xg)));
      v128_t hi = MADD(c5, wasm_v128_load(xg + 20), wasm_f32x4_mul(c4, wasm_v128_load(xg + 16)));
      lo = MADD(c3, wasm_v128_load(xg + 12), MADD(c2, wasm_v128_load(xg + 8), lo));
      hi = MADD(c7, wasm_v128_load(xg + 28), MADD(c6, wasm_v128_load(xg + 24), hi));
      acc = MADD(wasm_f32x4_splat(sc[g]), wasm_f32x4_add(lo, hi), acc);
    }
    float s = hsum(acc);
    if (mins) s += mins_dot(mins + (long)n * G, scratch, G);
    y[n] = s;
  }
}
