// ruvllm's kernel provider for Pyodide: matrix products in WebAssembly SIMD128.
//
// NumPy inside Pyodide has no BLAS and no SIMD; this module is to the engine in the browser what a BLAS
// is to NumPy on CPython. It is instantiated on Pyodide's own WebAssembly.Memory, so every pointer below
// is an address in that memory: the NumPy arrays themselves, read and written in place (no copies).
// The NumPy kernels of py_src/ruvllm/quant/matrices.py stay the reference and the fallback; the layouts
// read here are exactly the ones matrices.py keeps.
//
// Freestanding: no libc, no data section, no stack in linear memory (every local lives in a wasm local;
// nothing takes an address). Instantiating the module therefore writes nothing into CPython's heap;
// kernels/check.py refuses a build that breaks this. Scratch space comes from NumPy buffers the caller
// passes in.
//
// Layouts (row-major; T rows of x, N output features, K input features, G = K / 32 groups):
//   x       float32 (T, K)           activations
//   y       float32 (T, N)           y = x @ W.T, written (not accumulated)
//   w       float32 (N, K)           DenseMatrix
//   codes   int8    (N, K)           Int8Matrix: w[n, k] = scales[n, g] * (codes[n, k] - offset) + mins[n, g]
//   packed  uint8   (N, K / 2)       Int4Matrix, ggml nibble order: in group g (16 bytes from 16 g), byte j
//                                    holds weight 32 g + j in its low nibble and weight 32 g + 16 + j in its
//                                    high nibble; codes 0..15, minus offset (8 for q4_0, 0 for q4_1)
//   scales  float32 (N, G)
//   mins    float32 (N, G), or 0: no mins (address 0 is never a NumPy buffer)
//
// Two kinds of arithmetic:
//   exact   codes become float32 in registers; a weight is scale * code (+ min) exactly as NumPy forms
//           it, so products differ from NumPy's only in the order of float32 sums.
//   fast    x is quantized to 15 bits per group of 32 (quantize_x: xq = round(x / d), d = max|x| / 16383);
//           codes and xq meet in 16-bit integer dot products (i32x4.dot_i16x8_s), one float multiply
//           per group. SIMD128 has no 8-bit dot product, so llama.cpp's int8 activations (q8_0) would be
//           widened to 16 bits here anyway: they cost the same time and ~700x the perplexity increase
//           (docs/kernels.md has the measurements). 15 bits, not 16, so that the relaxed build below
//           computes the same scheme (its perplexity is the same: docs/kernels.md).
//
// Two builds of this file (build.sh): the plain one, SIMD128 only, and the relaxed one
// (-DRUVLLM_RELAXED -mrelaxed-simd), whose q4 fast path splits x's 15 bits into a signed high byte and a
// 7-bit low byte and multiplies the raw codes (0..15) by them with i16x8.relaxed_dot_i8x16_i7x16_s
// (one pmaddubsw per 16 codes on x86). Every operand of the relaxed dot stays where its result is
// deterministic (7-bit bytes in 0..127, pair sums that fit int16), so the relaxed build gives the same
// integers per group as the plain one; only float32 sums differ in order (the offset of q4_0 comes off
// per row, not per code). The loader (ruvllm/host.py) takes the relaxed build only where the runtime
// validates it and it passes the known-answer test, and the thread pool then runs its shared twin, so
// products have the same bits at every thread count.
// Many rows of x (prefill) go through a tile of weight rows expanded to float32 in the scratch buffer,
// so each weight is decoded once for all T rows; a few rows (decode) are contracted group by group.

#include <wasm_simd128.h>

typedef signed char i8;
typedef unsigned char u8;
typedef int i32;

#define EXPORT(name) __attribute__((export_name(#name)))
#define GROUP 32
#ifdef RUVLLM_RELAXED
#define RELAXED 1
#else
#define RELAXED 0
#endif

// 1 in the relaxed build (the loader and the thread pool ask which build they run)
EXPORT(relaxed_simd) i32 relaxed_simd(void) { return RELAXED; }

// ---- helpers ----------------------------------------------------------------------------------------------

static inline float hsum(v128_t v) {
  v128_t s = wasm_f32x4_add(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
  s = wasm_f32x4_add(s, wasm_i32x4_shuffle(s, s, 1, 0, 3, 2));
  return wasm_f32x4_extract_lane(s, 0);
}

// Small integers (|i| < 2^22) to float32, exactly. clang 14 turns wasm_f32x4_convert_i32x4 of lanes
// widened from int8 into 4 scalar conversions (seen in the disassembly); instead, the float whose bits
// are those of 1.5 * 2^23 plus i is 1.5 * 2^23 + i, and one subtraction leaves i.
static inline v128_t small_to_f32(v128_t i) {
  const v128_t magic = wasm_i32x4_splat(0x4B400000);
  return wasm_f32x4_sub(wasm_i32x4_add(i, magic), wasm_f32x4_splat(12582912.0f));
}

// The 16 int8 codes of v as 4 float32 vectors, in order.
#define CODES_TO_F32(v, f0, f1, f2, f3)                                      \
  do {                                                                       \
    v128_t lo16 = wasm_i16x8_extend_low_i8x16(v);                            \
    v128_t hi16 = wasm_i16x8_extend_high_i8x16(v);                           \
    f0 = small_to_f32(wasm_i32x4_extend_low_i16x8(lo16));                    \
    f1 = small_to_f32(wasm_i32x4_extend_high_i16x8(lo16));                   \
    f2 = small_to_f32(wasm_i32x4_extend_low_i16x8(hi16));                    \
    f3 = small_to_f32(wasm_i32x4_extend_high_i16x8(hi16));                   \
  } while (0)

// The 32 codes of group g of a row, as two int8x16 vectors (weights 0..15, 16..31 of the group).
static inline void load_q8(const i8 *row, i32 g, v128_t *a, v128_t *b) {
  *a = wasm_v128_load(row + g * GROUP);
  *b = wasm_v128_load(row + g * GROUP + 16);
}

static inline void load_q4(const u8 *row, i32 g, v128_t offset, v128_t *a, v128_t *b) {
  v128_t p = wasm_v128_load(row + g * (GROUP / 2));
  *a = wasm_i8x16_sub(wasm_v128_and(p, wasm_i8x16_splat(15)), offset);
  *b = wasm_i8x16_sub(wasm_u8x16_shr(p, 4), offset);
}

// The 32 codes of group g, minus `offset`, from int8 codes (bits 8) or packed nibbles (bits 4).
static inline void load_codes(i32 bits, const u8 *row, i32 g, v128_t offset, v128_t *a, v128_t *b) {
  if (bits == 8) {
    load_q8((const i8 *)row, g, a, b);
    *a = wasm_i8x16_sub(*a, offset), *b = wasm_i8x16_sub(*b, offset);
  } else {
    load_q4(row, g, offset, a, b);
  }
}

// sum over groups of mins[g] * xs[g] (the mins' share of a row's product)
static float mins_dot(const float *mins, const float *xs, i32 G) {
  v128_t acc = wasm_f32x4_splat(0.0f);
  i32 g = 0;
  for (; g + 4 <= G; g += 4) acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_v128_load(mins + g), wasm_v128_load(xs + g)));
  float s = hsum(acc);
  for (; g < G; g++) s += mins[g] * xs[g];
  return s;
}

// xs[t, g] = sum of x over group g of row t
static void group_sums(const float *x, float *xs, i32 T, i32 K) {
  i32 G = K / GROUP;
  for (i32 t = 0; t < T; t++) {
    for (i32 g = 0; g < G; g++) {
      const float *p = x + (long)t * K + g * GROUP;
      v128_t s = wasm_f32x4_add(wasm_f32x4_add(wasm_v128_load(p), wasm_v128_load(p + 4)),
                                wasm_f32x4_add(wasm_v128_load(p + 8), wasm_v128_load(p + 12)));
      s = wasm_f32x4_add(s, wasm_f32x4_add(wasm_f32x4_add(wasm_v128_load(p + 16), wasm_v128_load(p + 20)),
                                           wasm_f32x4_add(wasm_v128_load(p + 24), wasm_v128_load(p + 28))));
      xs[t * G + g] = hsum(s);
    }
  }
}

// ---- float32 products -------------------------------------------------------------------------------------

// y[t, n] for 4 rows of w and 2 rows of x: 8 accumulators, each loaded value used twice or four times.
static void tile_4x2(const float *x, const float *w, i32 K, float *y, i32 ldy) {
  const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K, *x0 = x, *x1 = x + K;
  v128_t a00 = wasm_f32x4_splat(0), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  i32 k = 0;
  for (; k + 4 <= K; k += 4) {
    v128_t u = wasm_v128_load(x0 + k), v = wasm_v128_load(x1 + k);
    v128_t b0 = wasm_v128_load(w0 + k), b1 = wasm_v128_load(w1 + k);
    v128_t b2 = wasm_v128_load(w2 + k), b3 = wasm_v128_load(w3 + k);
    a00 = wasm_f32x4_add(a00, wasm_f32x4_mul(u, b0));
    a01 = wasm_f32x4_add(a01, wasm_f32x4_mul(u, b1));
    a02 = wasm_f32x4_add(a02, wasm_f32x4_mul(u, b2));
    a03 = wasm_f32x4_add(a03, wasm_f32x4_mul(u, b3));
    a10 = wasm_f32x4_add(a10, wasm_f32x4_mul(v, b0));
    a11 = wasm_f32x4_add(a11, wasm_f32x4_mul(v, b1));
    a12 = wasm_f32x4_add(a12, wasm_f32x4_mul(v, b2));
    a13 = wasm_f32x4_add(a13, wasm_f32x4_mul(v, b3));
  }
  float s00 = hsum(a00), s01 = hsum(a01), s02 = hsum(a02), s03 = hsum(a03);
  float s10 = hsum(a10), s11 = hsum(a11), s12 = hsum(a12), s13 = hsum(a13);
  for (; k < K; k++) {
    s00 += x0[k] * w0[k], s01 += x0[k] * w1[k], s02 += x0[k] * w2[k], s03 += x0[k] * w3[k];
    s10 += x1[k] * w0[k], s11 += x1[k] * w1[k], s12 += x1[k] * w2[k], s13 += x1[k] * w3[k];
  }
  y[0] = s00, y[1] = s01, y[2] = s02, y[3] = s03;
  y[ldy] = s10, y[ldy + 1] = s11, y[ldy + 2] = s12, y[ldy + 3] = s13;
}

// y[t, n] for 4 rows of w and one row of x (decoding: 4 independent sums, x loaded once for 4 rows).
static void tile_4x1(const float *x, const float *w, i32 K, float *y) {
  const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
  v128_t a0 = wasm_f32x4_splat(0), a1 = a0, a2 = a0, a3 = a0;
  i32 k = 0;
  for (; k + 4 <= K; k += 4) {
    v128_t u = wasm_v128_load(x + k);
    a0 = wasm_f32x4_add(a0, wasm_f32x4_mul(u, wasm_v128_load(w0 + k)));
    a1 = wasm_f32x4_add(a1, wasm_f32x4_mul(u, wasm_v128_load(w1 + k)));
    a2 = wasm_f32x4_add(a2, wasm_f32x4_mul(u, wasm_v128_load(w2 + k)));
    a3 = wasm_f32x4_add(a3, wasm_f32x4_mul(u, wasm_v128_load(w3 + k)));
  }
  float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
  for (; k < K; k++) s0 += x[k] * w0[k], s1 += x[k] * w1[k], s2 += x[k] * w2[k], s3 += x[k] * w3[k];
  y[0] = s0, y[1] = s1, y[2] = s2, y[3] = s3;
}

static float dot(const float *x, const float *w, i32 K) {
  v128_t a0 = wasm_f32x4_splat(0), a1 = a0;
  i32 k = 0;
  for (; k + 8 <= K; k += 8) {
    a0 = wasm_f32x4_add(a0, wasm_f32x4_mul(wasm_v128_load(x + k), wasm_v128_load(w + k)));
    a1 = wasm_f32x4_add(a1, wasm_f32x4_mul(wasm_v128_load(x + k + 4), wasm_v128_load(w + k + 4)));
  }
  float s = hsum(wasm_f32x4_add(a0, a1));
  for (; k < K; k++) s += x[k] * w[k];
  return s;
}

// y[:, 0:n] (row stride ldy) = x @ w[0:n].T
static void dense_block(const float *x, i32 T, const float *w, i32 n, i32 K, float *y, i32 ldy) {
  i32 r = 0;
  for (; r + 4 <= n; r += 4) {
    i32 t = 0;
    for (; t + 2 <= T; t += 2) tile_4x2(x + (long)t * K, w + (long)r * K, K, y + (long)t * ldy + r, ldy);
    for (; t < T; t++) tile_4x1(x + (long)t * K, w + (long)r * K, K, y + (long)t * ldy + r);
  }
  for (; r < n; r++)
    for (i32 t = 0; t < T; t++) y[(long)t * ldy + r] = dot(x + (long)t * K, w + (long)r * K, K);
}

EXPORT(dense) void dense(const float *x, const float *w, float *y, i32 T, i32 N, i32 K) {
  dense_block(x, T, w, N, K, y, N);
}

// ---- quantized, exact -------------------------------------------------------------------------------------

// The two halves of one group's sum (weights 0..15 and 16..31), for matrices with a scale per 16 weights.
static inline void half_dots_f32(v128_t a, v128_t b, const float *x, v128_t *lo, v128_t *hi) {
  v128_t c0, c1, c2, c3, c4, c5, c6, c7;
  CODES_TO_F32(a, c0, c1, c2, c3);
  CODES_TO_F32(b, c4, c5, c6, c7);
  *lo = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(c0, wasm_v128_load(x)), wasm_f32x4_mul(c1, wasm_v128_load(x + 4))),
                       wasm_f32x4_add(wasm_f32x4_mul(c2, wasm_v128_load(x + 8)), wasm_f32x4_mul(c3, wasm_v128_load(x + 12))));
  *hi = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(c4, wasm_v128_load(x + 16)), wasm_f32x4_mul(c5, wasm_v128_load(x + 20))),
                       wasm_f32x4_add(wasm_f32x4_mul(c6, wasm_v128_load(x + 24)), wasm_f32x4_mul(c7, wasm_v128_load(x + 28))));
}

// sum over the 32 weights of one group of code * x, as 4 lanes
static inline v128_t group_dot_f32(v128_t a, v128_t b, const float *x) {
  v128_t lo, hi;
  half_dots_f32(a, b, x, &lo, &hi);
  return wasm_f32x4_add(lo, hi);
}

// One group of codes expanded to float32 weights: out[0:32] = scale * code (+ min), as NumPy forms them;
// weights 0..15 take scale s0 and 16..31 scale s1 (the same but in matrices with groups of 16).
static inline void expand_group(v128_t a, v128_t b, float s0, float s1, float min, i32 has_min, float *out) {
  v128_t c0, c1, c2, c3, c4, c5, c6, c7, s = wasm_f32x4_splat(s0), t = wasm_f32x4_splat(s1), m = wasm_f32x4_splat(min);
  CODES_TO_F32(a, c0, c1, c2, c3);
  CODES_TO_F32(b, c4, c5, c6, c7);
  c0 = wasm_f32x4_mul(c0, s), c1 = wasm_f32x4_mul(c1, s), c2 = wasm_f32x4_mul(c2, s), c3 = wasm_f32x4_mul(c3, s);
  c4 = wasm_f32x4_mul(c4, t), c5 = wasm_f32x4_mul(c5, t), c6 = wasm_f32x4_mul(c6, t), c7 = wasm_f32x4_mul(c7, t);
  if (has_min) {
    c0 = wasm_f32x4_add(c0, m), c1 = wasm_f32x4_add(c1, m), c2 = wasm_f32x4_add(c2, m), c3 = wasm_f32x4_add(c3, m);
    c4 = wasm_f32x4_add(c4, m), c5 = wasm_f32x4_add(c5, m), c6 = wasm_f32x4_add(c6, m), c7 = wasm_f32x4_add(c7, m);
  }
  wasm_v128_store(out, c0), wasm_v128_store(out + 4, c1), wasm_v128_store(out + 8, c2);
  wasm_v128_store(out + 12, c3), wasm_v128_store(out + 16, c4), wasm_v128_store(out + 20, c5);
  wasm_v128_store(out + 24, c6), wasm_v128_store(out + 28, c7);
}

// Rows of W per tile when many rows of x are multiplied: TILE_ROWS * K float32 in the scratch buffer.
#define TILE_ROWS 16
// Up to this many rows of x, codes are contracted group by group (no expansion).
#define GROUPED_MAX_ROWS 4

// The whole exact product for either code layout; `bits` is 8 (codes) or 4 (packed), and `halves` 1 for
// int8 matrices with a scale per 16 weights (GGUF Q6_K, Q3_K; no mins), constants at each call site, so
// each instantiation keeps only its own loads.
__attribute__((always_inline)) static inline void quant_exact(i32 bits, i32 halves, const float *x, const void *weights,
                                                             const float *scales, const float *mins, i32 offset,
                                                             float *y, float *scratch, i32 T, i32 N, i32 K, i32 ldy) {
  const i32 G = K / GROUP, row_bytes = bits == 8 ? K : K / 2, SG = halves ? 2 * G : G;
  const v128_t off = wasm_i8x16_splat((i8)offset);
  if (T <= GROUPED_MAX_ROWS) {
    float *xs = scratch;  // (T, G) group sums of x, for the mins
    if (mins) group_sums(x, xs, T, K);
    for (i32 n = 0; n < N; n++) {
      const u8 *row = (const u8 *)weights + (long)n * row_bytes;
      const float *sc = scales + (long)n * SG;
      for (i32 t = 0; t < T; t++) {
        const float *xt = x + (long)t * K;
        v128_t acc = wasm_f32x4_splat(0);
        for (i32 g = 0; g < G; g++) {
          v128_t a, b;
          load_codes(bits, row, g, off, &a, &b);
          if (halves) {
            v128_t lo, hi;
            half_dots_f32(a, b, xt + g * GROUP, &lo, &hi);
            acc = wasm_f32x4_add(acc, wasm_f32x4_add(wasm_f32x4_mul(wasm_f32x4_splat(sc[2 * g]), lo),
                                                     wasm_f32x4_mul(wasm_f32x4_splat(sc[2 * g + 1]), hi)));
          } else {
            acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_splat(sc[g]), group_dot_f32(a, b, xt + g * GROUP)));
          }
        }
        float s = hsum(acc);
        if (mins) s += mins_dot(mins + (long)n * G, xs + t * G, G);
        y[(long)t * ldy + n] = s;
      }
    }
    return;
  }
  for (i32 r0 = 0; r0 < N; r0 += TILE_ROWS) {
    i32 n = N - r0 < TILE_ROWS ? N - r0 : TILE_ROWS;
    for (i32 r = 0; r < n; r++) {
      const u8 *row = (const u8 *)weights + (long)(r0 + r) * row_bytes;
      const float *sc = scales + (long)(r0 + r) * SG, *mn = mins ? mins + (long)(r0 + r) * G : 0;
      for (i32 g = 0; g < G; g++) {
        v128_t a, b;
        load_codes(bits, row, g, off, &a, &b);
        float s0 = halves ? sc[2 * g] : sc[g], s1 = halves ? sc[2 * g + 1] : sc[g];
        expand_group(a, b, s0, s1, mn ? mn[g] : 0.0f, mn != 0, scratch + (long)r * K + g * GROUP);
      }
    }
    dense_block(x, T, scratch, n, K, y + r0, ldy);
  }
}

EXPORT(q8_exact)
void q8_exact(const float *x, const i8 *codes, const float *scales, const float *mins, i32 offset, float *y,
              float *scratch, i32 T, i32 N, i32 K) {
  quant_exact(8, 0, x, codes, scales, mins, offset, y, scratch, T, N, K, N);
}

// int8 codes with a scale per 16 weights (scales (N, K / 16)); no mins (the argument is ignored).
EXPORT(q8h_exact)
void q8h_exact(const float *x, const i8 *codes, const float *scales, const float *mins, i32 offset, float *y,
               float *scratch, i32 T, i32 N, i32 K) {
  (void)mins;
  quant_exact(8, 1, x, codes, scales, 0, offset, y, scratch, T, N, K, N);
}

EXPORT(q4_exact)
void q4_exact(const float *x, const u8 *packed, const float *scales, const float *mins, i32 offset, float *y,
              float *scratch, i32 T, i32 N, i32 K) {
  quant_exact(4, 0, x, packed, scales, mins, offset, y, scratch, T, N, K, N);
}

// ---- quantized, fast (activations as int16) ---------------------------------------------------------------

// x (T, K) -> quantize_x's outputs, one after the other from xq, QUANTIZED_X_BYTES(T, K) bytes in all
// (callers size the space by that formula, whichever build they run):
//   xq  int16 (T, K)       x ~ d * xq per group, |xq| <= 16383
//   d   float32 (T, G)     max|x| / 16383 per group
//   xs  float32 (T, G)     the exact group sums of x (for the mins)
//   xb  int8 (T, G, 64)    relaxed build only: per group, xq = 128 hi + lo: hi (-128..127) of its 32
//                          values, then lo (0..127)
//   sq  float32 (T, G)     relaxed build only: d * sum(xq) per group (q4_0's offset comes off with it)
// The fast products take xq, d and xs, and find xb and sq after xs (they know T and K).
#define QUANTIZED_X_BYTES(T, K) ((T) * (4 * (K) + 12 * ((K) / GROUP)))
#define XQ_TOP 16383.0f

// One group of x quantized: the 32 floats at p as round(x / d) with d = max|x| / top (0 for a group of
// zeros), in eight vectors of four int32 (x's order) and in four of eight int16, with d and the group's
// float sum. quantize_x and the relaxed benchmark's variants (benchmarks/relaxed/relaxed.c) share it, so
// they quantize alike.
typedef struct {
  v128_t q[8], h[4];
  float d, sum;
} QuantizedGroup;

static inline QuantizedGroup quantize_group(const float *p, float top) {
  QuantizedGroup out;
  v128_t v0 = wasm_v128_load(p), v1 = wasm_v128_load(p + 4), v2 = wasm_v128_load(p + 8);
  v128_t v3 = wasm_v128_load(p + 12), v4 = wasm_v128_load(p + 16), v5 = wasm_v128_load(p + 20);
  v128_t v6 = wasm_v128_load(p + 24), v7 = wasm_v128_load(p + 28);
  v128_t m = wasm_f32x4_max(wasm_f32x4_max(wasm_f32x4_abs(v0), wasm_f32x4_abs(v1)),
                            wasm_f32x4_max(wasm_f32x4_abs(v2), wasm_f32x4_abs(v3)));
  m = wasm_f32x4_max(m, wasm_f32x4_max(wasm_f32x4_max(wasm_f32x4_abs(v4), wasm_f32x4_abs(v5)),
                                       wasm_f32x4_max(wasm_f32x4_abs(v6), wasm_f32x4_abs(v7))));
  m = wasm_f32x4_max(m, wasm_i32x4_shuffle(m, m, 2, 3, 0, 1));
  m = wasm_f32x4_max(m, wasm_i32x4_shuffle(m, m, 1, 0, 3, 2));
  out.d = wasm_f32x4_extract_lane(m, 0) / top;
  v128_t inv = wasm_f32x4_splat(out.d > 0.0f ? 1.0f / out.d : 0.0f);
#define Q(v) wasm_i32x4_trunc_sat_f32x4(wasm_f32x4_nearest(wasm_f32x4_mul(v, inv)))
  out.q[0] = Q(v0), out.q[1] = Q(v1), out.q[2] = Q(v2), out.q[3] = Q(v3);
  out.q[4] = Q(v4), out.q[5] = Q(v5), out.q[6] = Q(v6), out.q[7] = Q(v7);
#undef Q
  for (i32 i = 0; i < 4; i++) out.h[i] = wasm_i16x8_narrow_i32x4(out.q[2 * i], out.q[2 * i + 1]);
  out.sum = hsum(wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_add(v0, v1), wasm_f32x4_add(v2, v3)),
                                wasm_f32x4_add(wasm_f32x4_add(v4, v5), wasm_f32x4_add(v6, v7))));
  return out;
}

// The sum of a quantized group's 32 integers.
static inline i32 group_integer_sum(const v128_t *a) {
  v128_t n = wasm_i32x4_add(wasm_i32x4_add(wasm_i32x4_add(a[0], a[1]), wasm_i32x4_add(a[2], a[3])),
                            wasm_i32x4_add(wasm_i32x4_add(a[4], a[5]), wasm_i32x4_add(a[6], a[7])));
  n = wasm_i32x4_add(n, wasm_i32x4_shuffle(n, n, 2, 3, 0, 1));
  n = wasm_i32x4_add(n, wasm_i32x4_shuffle(n, n, 1, 0, 3, 2));
  return wasm_i32x4_extract_lane(n, 0);
}

EXPORT(quantize_x) void quantize_x(const float *x, short *xq, float *d, float *xs, i32 T, i32 K) {
  const i32 G = K / GROUP;
  i8 *xb = (i8 *)(xs + T * G);
  float *sq = (float *)(xb + (long)T * 2 * K);
  for (i32 t = 0; t < T; t++) {
    for (i32 g = 0; g < G; g++) {
      const QuantizedGroup group = quantize_group(x + (long)t * K + g * GROUP, XQ_TOP);
      const v128_t q0 = group.h[0], q1 = group.h[1], q2 = group.h[2], q3 = group.h[3];
      short *out = xq + (long)t * K + g * GROUP;
      wasm_v128_store(out, q0);
      wasm_v128_store(out + 8, q1);
      wasm_v128_store(out + 16, q2);
      wasm_v128_store(out + 24, q3);
      d[t * G + g] = group.d;
      xs[t * G + g] = group.sum;
      if (RELAXED) {
        const v128_t low = wasm_i16x8_splat(127);
        i8 *split = xb + ((long)t * G + g) * 2 * GROUP;
        wasm_v128_store(split, wasm_i8x16_narrow_i16x8(wasm_i16x8_shr(q0, 7), wasm_i16x8_shr(q1, 7)));
        wasm_v128_store(split + 16, wasm_i8x16_narrow_i16x8(wasm_i16x8_shr(q2, 7), wasm_i16x8_shr(q3, 7)));
        wasm_v128_store(split + 32, wasm_i8x16_narrow_i16x8(wasm_v128_and(q0, low), wasm_v128_and(q1, low)));
        wasm_v128_store(split + 48, wasm_i8x16_narrow_i16x8(wasm_v128_and(q2, low), wasm_v128_and(q3, low)));
        sq[t * G + g] = group.d * (float)group_integer_sum(group.q);
      }
    }
  }
}

// The two halves of one group's int16 sum (weights 0..15 and 16..31), as 4 int32 lanes each.
static inline void half_dots_i16(v128_t a, v128_t b, const short *xq, v128_t *lo, v128_t *hi) {
  *lo = wasm_i32x4_add(wasm_i32x4_dot_i16x8(wasm_i16x8_extend_low_i8x16(a), wasm_v128_load(xq)),
                       wasm_i32x4_dot_i16x8(wasm_i16x8_extend_high_i8x16(a), wasm_v128_load(xq + 8)));
  *hi = wasm_i32x4_add(wasm_i32x4_dot_i16x8(wasm_i16x8_extend_low_i8x16(b), wasm_v128_load(xq + 16)),
                       wasm_i32x4_dot_i16x8(wasm_i16x8_extend_high_i8x16(b), wasm_v128_load(xq + 24)));
}

// sum over one group of code * xq, as 4 int32 lanes (|code| <= 127, |xq| <= 32767: no overflow)
static inline v128_t group_dot_i16(v128_t a, v128_t b, const short *xq) {
  v128_t lo, hi;
  half_dots_i16(a, b, xq, &lo, &hi);
  return wasm_i32x4_add(lo, hi);
}

// Relaxed build: sum over group g of raw code (0..15) * xq, as 4 int32 lanes, from the split x (64 bytes:
// hi, then lo). Each int16 lane of a relaxed dot adds two products |hi or lo| * 15 <= 1920, two such
// dots added stay within int16 (7680), and hi's sums times 128 meet lo's in int32: exact integers.
static inline v128_t group_dot_relaxed(const u8 *row, i32 g, const i8 *split) {
#if RELAXED
  v128_t p = wasm_v128_load(row + g * (GROUP / 2));
  v128_t ca = wasm_v128_and(p, wasm_i8x16_splat(15)), cb = wasm_u8x16_shr(p, 4);
  v128_t hi = wasm_i16x8_add(wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(split), ca),
                             wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(split + 16), cb));
  v128_t lo = wasm_i16x8_add(wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(split + 32), ca),
                             wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(split + 48), cb));
  return wasm_i32x4_add(wasm_i32x4_dot_i16x8(hi, wasm_i16x8_splat(128)), wasm_i32x4_extadd_pairwise_i16x8(lo));
#else
  (void)row, (void)g, (void)split;
  return wasm_i32x4_splat(0);  // (never called: the plain build has no relaxed dot)
#endif
}

// y = x @ W.T with x given by quantize_x (xq, d, xs); a few rows of x at a time (decoding). `halves` as
// in quant_exact.
__attribute__((always_inline)) static inline void quant_fast(i32 bits, i32 halves, const short *xq, const float *d,
                                                            const float *xs, const void *weights,
                                                            const float *scales, const float *mins, i32 offset,
                                                            float *y, i32 T, i32 N, i32 K, i32 ldy) {
  const i32 G = K / GROUP, row_bytes = bits == 8 ? K : K / 2, SG = halves ? 2 * G : G;
  const v128_t off = wasm_i8x16_splat((i8)offset);
  const i8 *xb = (const i8 *)(xs + T * G);               // quantize_x's split x (relaxed build)
  const float *sq = (const float *)(xb + (long)T * 2 * K);
  for (i32 n = 0; n < N; n++) {
    const u8 *row = (const u8 *)weights + (long)n * row_bytes;
    const float *sc = scales + (long)n * SG;
    for (i32 t = 0; t < T; t++) {
      const short *xt = xq + (long)t * K;
      const float *dt = d + t * G;
      v128_t acc = wasm_f32x4_splat(0);
      if (RELAXED && bits == 4) {
        for (i32 g = 0; g < G; g++) {
          v128_t dotg = wasm_f32x4_convert_i32x4(group_dot_relaxed(row, g, xb + ((long)t * G + g) * 2 * GROUP));
          acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_splat(sc[g] * dt[g]), dotg));
        }
        float s = hsum(acc);
        if (offset) s -= (float)offset * mins_dot(sc, sq + t * G, G);  // sum (code - offset) xq
        if (mins) s += mins_dot(mins + (long)n * G, xs + t * G, G);
        y[(long)t * ldy + n] = s;
        continue;
      }
      for (i32 g = 0; g < G; g++) {
        v128_t a, b;
        load_codes(bits, row, g, off, &a, &b);
        if (halves) {
          v128_t lo, hi;
          half_dots_i16(a, b, xt + g * GROUP, &lo, &hi);
          acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_splat(sc[2 * g] * dt[g]), wasm_f32x4_convert_i32x4(lo)));
          acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_splat(sc[2 * g + 1] * dt[g]), wasm_f32x4_convert_i32x4(hi)));
        } else {
          v128_t dotg = wasm_f32x4_convert_i32x4(group_dot_i16(a, b, xt + g * GROUP));
          acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_splat(sc[g] * dt[g]), dotg));
        }
      }
      float s = hsum(acc);
      if (mins) s += mins_dot(mins + (long)n * G, xs + t * G, G);
      y[(long)t * ldy + n] = s;
    }
  }
}

EXPORT(q8_fast)
void q8_fast(const short *xq, const float *d, const float *xs, const i8 *codes, const float *scales,
             const float *mins, i32 offset, float *y, i32 T, i32 N, i32 K) {
  quant_fast(8, 0, xq, d, xs, codes, scales, mins, offset, y, T, N, K, N);
}

EXPORT(q8h_fast)
void q8h_fast(const short *xq, const float *d, const float *xs, const i8 *codes, const float *scales,
              const float *mins, i32 offset, float *y, i32 T, i32 N, i32 K) {
  (void)mins;
  quant_fast(8, 1, xq, d, xs, codes, scales, 0, offset, y, T, N, K, N);
}

EXPORT(q4_fast)
void q4_fast(const short *xq, const float *d, const float *xs, const u8 *packed, const float *scales,
             const float *mins, i32 offset, float *y, i32 T, i32 N, i32 K) {
  quant_fast(4, 0, xq, d, xs, packed, scales, mins, offset, y, T, N, K, N);
}

// ---- row slices (the kernel thread pool: npm/src/worker/pool.js) ------------------------------------------
//
// Output features n0 <= n < n1 of the product above, written into the whole y (T, N): each thread of the
// pool computes one slice of each matrix. Every y[t, n] is summed in one order wherever its row lands,
// provided n0 is a multiple of 4 (dense and the tiled exact path group weight rows by 4 from the slice's
// start; the pool uses multiples of 16, the tile height), so the slices together equal the whole
// product bit for bit. Arguments as in the whole-product exports, then n0 and n1.

EXPORT(dense_rows)
void dense_rows(const float *x, const float *w, float *y, i32 T, i32 N, i32 K, i32 n0, i32 n1) {
  dense_block(x, T, w + (long)n0 * K, n1 - n0, K, y + n0, N);
}

#define ROWS_EXACT(name, bits, halves, has_mins)                                                                  \
  EXPORT(name)                                                                                                    \
  void name(const float *x, const u8 *weights, const float *scales, const float *mins, i32 offset, float *y,      \
            float *scratch, i32 T, i32 N, i32 K, i32 n0, i32 n1) {                                                \
    const i32 G = K / GROUP, row_bytes = bits == 8 ? K : K / 2, SG = halves ? 2 * G : G;                         \
    const float *mn = has_mins && mins ? mins + (long)n0 * G : 0;                                                 \
    quant_exact(bits, halves, x, weights + (long)n0 * row_bytes, scales + (long)n0 * SG, mn, offset, y + n0,     \
                scratch, T, n1 - n0, K, N);                                                                       \
  }

#define ROWS_FAST(name, bits, halves, has_mins)                                                                   \
  EXPORT(name)                                                                                                    \
  void name(const short *xq, const float *d, const float *xs, const u8 *weights, const float *scales,            \
            const float *mins, i32 offset, float *y, i32 T, i32 N, i32 K, i32 n0, i32 n1) {                       \
    const i32 G = K / GROUP, row_bytes = bits == 8 ? K : K / 2, SG = halves ? 2 * G : G;                         \
    const float *mn = has_mins && mins ? mins + (long)n0 * G : 0;                                                 \
    quant_fast(bits, halves, xq, d, xs, weights + (long)n0 * row_bytes, scales + (long)n0 * SG, mn, offset,      \
               y + n0, T, n1 - n0, K, N);                                                                         \
  }

ROWS_EXACT(q8_exact_rows, 8, 0, 1)
ROWS_EXACT(q8h_exact_rows, 8, 1, 0)
ROWS_EXACT(q4_exact_rows, 4, 0, 1)
ROWS_FAST(q8_fast_rows, 8, 0, 1)
ROWS_FAST(q8h_fast_rows, 8, 1, 0)
ROWS_FAST(q4_fast_rows, 4, 0, 1)

// ---- attention's mix -----------------------------------------------------------------------------------------
//
// y (Q, E) = p (Q, S) @ v (S, E): each output row the weighted sum of the value rows, for attention (the
// scores are `dense`: q (Q, E) @ keys (S, E).T). Two rows of p and 16 columns of v at a time, summed in
// registers; the columns past the last 16 (E not a multiple of 16) one by one. Every y[q, e] is summed
// over s in ascending order, whatever Q and E.

static void mix_2x16(const float *p0, const float *p1, const float *v, float *y0, float *y1, i32 S, i32 E) {
  v128_t a0 = wasm_f32x4_splat(0), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (i32 s = 0; s < S; s++) {
    const float *vs = v + (long)s * E;
    const v128_t v0 = wasm_v128_load(vs), v1 = wasm_v128_load(vs + 4), v2 = wasm_v128_load(vs + 8),
                 v3 = wasm_v128_load(vs + 12);
    const v128_t w0 = wasm_f32x4_splat(p0[s]), w1 = wasm_f32x4_splat(p1[s]);
    a0 = wasm_f32x4_add(a0, wasm_f32x4_mul(w0, v0)), a1 = wasm_f32x4_add(a1, wasm_f32x4_mul(w0, v1));
    a2 = wasm_f32x4_add(a2, wasm_f32x4_mul(w0, v2)), a3 = wasm_f32x4_add(a3, wasm_f32x4_mul(w0, v3));
    b0 = wasm_f32x4_add(b0, wasm_f32x4_mul(w1, v0)), b1 = wasm_f32x4_add(b1, wasm_f32x4_mul(w1, v1));
    b2 = wasm_f32x4_add(b2, wasm_f32x4_mul(w1, v2)), b3 = wasm_f32x4_add(b3, wasm_f32x4_mul(w1, v3));
  }
  wasm_v128_store(y0, a0), wasm_v128_store(y0 + 4, a1), wasm_v128_store(y0 + 8, a2), wasm_v128_store(y0 + 12, a3);
  wasm_v128_store(y1, b0), wasm_v128_store(y1 + 4, b1), wasm_v128_store(y1 + 8, b2), wasm_v128_store(y1 + 12, b3);
}

static void mix_1x16(const float *p0, const float *v, float *y0, i32 S, i32 E) {
  v128_t a0 = wasm_f32x4_splat(0), a1 = a0, a2 = a0, a3 = a0;
  for (i32 s = 0; s < S; s++) {
    const float *vs = v + (long)s * E;
    const v128_t w0 = wasm_f32x4_splat(p0[s]);
    a0 = wasm_f32x4_add(a0, wasm_f32x4_mul(w0, wasm_v128_load(vs)));
    a1 = wasm_f32x4_add(a1, wasm_f32x4_mul(w0, wasm_v128_load(vs + 4)));
    a2 = wasm_f32x4_add(a2, wasm_f32x4_mul(w0, wasm_v128_load(vs + 8)));
    a3 = wasm_f32x4_add(a3, wasm_f32x4_mul(w0, wasm_v128_load(vs + 12)));
  }
  wasm_v128_store(y0, a0), wasm_v128_store(y0 + 4, a1), wasm_v128_store(y0 + 8, a2), wasm_v128_store(y0 + 12, a3);
}

static float mix_1x1(const float *p, const float *v, i32 S, i32 E) {
  float sum = 0.0f;
  for (i32 s = 0; s < S; s++) sum += p[s] * v[(long)s * E];
  return sum;
}

EXPORT(mix) void mix(const float *p, const float *v, float *y, i32 Q, i32 S, i32 E) {
  const i32 E16 = E & ~15;
  i32 q = 0;
  for (; q + 2 <= Q; q += 2) {
    const float *p0 = p + (long)q * S;
    float *y0 = y + (long)q * E;
    for (i32 e = 0; e < E16; e += 16) mix_2x16(p0, p0 + S, v + e, y0 + e, y0 + E + e, S, E);
    for (i32 e = E16; e < E; e++) y0[e] = mix_1x1(p0, v + e, S, E), y0[E + e] = mix_1x1(p0 + S, v + e, S, E);
  }
  if (q < Q) {  // an odd last row
    const float *p0 = p + (long)q * S;
    float *y0 = y + (long)q * E;
    for (i32 e = 0; e < E16; e += 16) mix_1x16(p0, v + e, y0 + e, S, E);
    for (i32 e = E16; e < E; e++) y0[e] = mix_1x1(p0, v + e, S, E);
  }
}

// ---- the backward pass's product: y += dy @ W ----------------------------------------------------------------
//
// y[:, k0:k1] (T, K) += dy[:, n0:n1] (T, N) @ W[n0:n1, k0:k1]: the gradient through a matrix (dx = dy W,
// learning/backprop.py) read from the matrix as it is kept, with no transposed or expanded copy of W.
// Columns T_COLS at a time (that slice of y stays in cache), rows of W four at a time, expanded from their
// codes into the scratch (4 * min(K, T_COLS) float32) once for all T rows of dy; a row of dy whose four
// coefficients are zero (an unlikelihood lesson's logits) adds nothing and is skipped. Each y[t, k] adds
// the rows n in ascending order whatever T and the column range, so column slices (the thread pool's
// units) together equal the whole product bit for bit. k0 is a multiple of 32 (GROUP); k1 too, or K.
#define T_COLS 256

// y[t, 0:width] += sum_r dy[t, r] * w[r, 0:width] over the n (1 to 4) rows r of w (row stride ldw), for
// every t (rows of dy at stride N, of y at stride ldy). A missing row takes row 0 with coefficient 0. Two
// rows of y at a time share each load of w; a row whose four coefficients are zero is left as it is.
static inline void add_row(float *yt, v128_t c0, v128_t c1, v128_t c2, v128_t c3, const float *w0, const float *w1,
                           const float *w2, const float *w3, i32 k) {
  v128_t v = wasm_v128_load(yt + k);
  v = wasm_f32x4_add(v, wasm_f32x4_mul(c0, wasm_v128_load(w0 + k)));
  v = wasm_f32x4_add(v, wasm_f32x4_mul(c1, wasm_v128_load(w1 + k)));
  v = wasm_f32x4_add(v, wasm_f32x4_mul(c2, wasm_v128_load(w2 + k)));
  v = wasm_f32x4_add(v, wasm_f32x4_mul(c3, wasm_v128_load(w3 + k)));
  wasm_v128_store(yt + k, v);
}

static inline void add_tail(float *yt, const float *a, i32 n, const float *w0, const float *w1, const float *w2,
                            const float *w3, i32 k, i32 width) {
  const float a0 = a[0], a1 = n > 1 ? a[1] : 0.0f, a2 = n > 2 ? a[2] : 0.0f, a3 = n > 3 ? a[3] : 0.0f;
  for (; k < width; k++) {
    float v = yt[k];
    v += a0 * w0[k];
    v += a1 * w1[k];
    v += a2 * w2[k];
    v += a3 * w3[k];
    yt[k] = v;
  }
}

static inline i32 all_zero(const float *a, i32 n) {
  return a[0] == 0.0f && (n < 2 || a[1] == 0.0f) && (n < 3 || a[2] == 0.0f) && (n < 4 || a[3] == 0.0f);
}

static void add_rows(const float *dy, i32 N, i32 T, i32 n, const float *w, i32 ldw, float *y, i32 ldy, i32 width) {
  const float *w0 = w, *w1 = n > 1 ? w + ldw : w, *w2 = n > 2 ? w + 2 * ldw : w, *w3 = n > 3 ? w + 3 * ldw : w;
  const i32 W4 = width & ~3;
  for (i32 t = 0; t < T;) {
    const float *a = dy + (long)t * N, *b = a + N;
    float *ya = y + (long)t * ldy, *yb = ya + ldy;
    const i32 skip_a = all_zero(a, n), pair = t + 1 < T && !skip_a && !all_zero(b, n);
    if (skip_a) {
      t += 1;
      continue;
    }
    const v128_t a0 = wasm_f32x4_splat(a[0]), a1 = wasm_f32x4_splat(n > 1 ? a[1] : 0.0f),
                 a2 = wasm_f32x4_splat(n > 2 ? a[2] : 0.0f), a3 = wasm_f32x4_splat(n > 3 ? a[3] : 0.0f);
    if (!pair) {
      for (i32 k = 0; k < W4; k += 4) add_row(ya, a0, a1, a2, a3, w0, w1, w2, w3, k);
      add_tail(ya, a, n, w0, w1, w2, w3, W4, width);
      t += 1;
      continue;
    }
    const v128_t b0 = wasm_f32x4_splat(b[0]), b1 = wasm_f32x4_splat(n > 1 ? b[1] : 0.0f),
                 b2 = wasm_f32x4_splat(n > 2 ? b[2] : 0.0f), b3 = wasm_f32x4_splat(n > 3 ? b[3] : 0.0f);
    for (i32 k = 0; k < W4; k += 4) {
      const v128_t x0 = wasm_v128_load(w0 + k), x1 = wasm_v128_load(w1 + k), x2 = wasm_v128_load(w2 + k),
                   x3 = wasm_v128_load(w3 + k);
      v128_t u = wasm_v128_load(ya + k), v = wasm_v128_load(yb + k);
      u = wasm_f32x4_add(u, wasm_f32x4_mul(a0, x0)), v = wasm_f32x4_add(v, wasm_f32x4_mul(b0, x0));
      u = wasm_f32x4_add(u, wasm_f32x4_mul(a1, x1)), v = wasm_f32x4_add(v, wasm_f32x4_mul(b1, x1));
      u = wasm_f32x4_add(u, wasm_f32x4_mul(a2, x2)), v = wasm_f32x4_add(v, wasm_f32x4_mul(b2, x2));
      u = wasm_f32x4_add(u, wasm_f32x4_mul(a3, x3)), v = wasm_f32x4_add(v, wasm_f32x4_mul(b3, x3));
      wasm_v128_store(ya + k, u), wasm_v128_store(yb + k, v);
    }
    add_tail(ya, a, n, w0, w1, w2, w3, W4, width);
    add_tail(yb, b, n, w0, w1, w2, w3, W4, width);
    t += 2;
  }
}

EXPORT(dense_t)
void dense_t(const float *dy, const float *w, float *y, i32 T, i32 N, i32 K, i32 n0, i32 n1, i32 k0, i32 k1) {
  for (i32 c0 = k0; c0 < k1; c0 += T_COLS) {
    const i32 width = k1 - c0 < T_COLS ? k1 - c0 : T_COLS;
    for (i32 r0 = n0; r0 < n1; r0 += 4) {
      const i32 n = n1 - r0 < 4 ? n1 - r0 : 4;
      add_rows(dy + r0, N, T, n, w + (long)r0 * K + c0, K, y + c0, K, width);
    }
  }
}

__attribute__((always_inline)) static inline void quant_transposed(i32 bits, i32 halves, const float *dy,
                                                                  const void *weights, const float *scales,
                                                                  const float *mins, i32 offset, float *y,
                                                                  float *scratch, i32 T, i32 N, i32 K, i32 n0,
                                                                  i32 n1, i32 k0, i32 k1) {
  const i32 G = K / GROUP, row_bytes = bits == 8 ? K : K / 2, SG = halves ? 2 * G : G;
  const v128_t off = wasm_i8x16_splat((i8)offset);
  for (i32 c0 = k0; c0 < k1; c0 += T_COLS) {
    const i32 width = k1 - c0 < T_COLS ? k1 - c0 : T_COLS;  // a multiple of GROUP
    for (i32 r0 = n0; r0 < n1; r0 += 4) {
      const i32 n = n1 - r0 < 4 ? n1 - r0 : 4;
      for (i32 r = 0; r < n; r++) {
        const u8 *row = (const u8 *)weights + (long)(r0 + r) * row_bytes;
        const float *sc = scales + (long)(r0 + r) * SG, *mn = mins ? mins + (long)(r0 + r) * G : 0;
        for (i32 g = c0 / GROUP; g < (c0 + width) / GROUP; g++) {
          v128_t a, b;
          load_codes(bits, row, g, off, &a, &b);
          float s0 = halves ? sc[2 * g] : sc[g], s1 = halves ? sc[2 * g + 1] : sc[g];
          expand_group(a, b, s0, s1, mn ? mn[g] : 0.0f, mn != 0, scratch + r * width + (g * GROUP - c0));
        }
      }
      add_rows(dy + r0, N, T, n, scratch, width, y + c0, K, width);
    }
  }
}

#define TRANSPOSED(name, bits, halves, has_mins)                                                                  \
  EXPORT(name)                                                                                                    \
  void name(const float *dy, const u8 *weights, const float *scales, const float *mins, i32 offset, float *y,     \
            float *scratch, i32 T, i32 N, i32 K, i32 n0, i32 n1, i32 k0, i32 k1) {                                \
    quant_transposed(bits, halves, dy, weights, scales, has_mins ? mins : 0, offset, y, scratch, T, N, K, n0, n1,  \
                     k0, k1);                                                                                     \
  }

TRANSPOSED(q8_t, 8, 0, 1)
TRANSPOSED(q8h_t, 8, 1, 0)
TRANSPOSED(q4_t, 4, 0, 1)

// ---- the decode plan's steps ----------------------------------------------------------------------------------
//
// Everything of a token's forward (py_src/ruvllm/model/forward.py) besides the products above, over float32
// rows. Rows of x are at stride ldx (floats); `heads` groups of E values per row where a step works per head.
// No libm: exp and tanh are written here (docs/kernels.md gives their precision). Each step is exported for
// the tests; run_plan runs a whole token's list of them.

// e^x for 4 lanes: x = n ln2 + r (|r| <= ln2 / 2), e^r by Cephes' expf polynomial (degree 6, within ~1 ulp),
// 2^n put into the exponent bits. x below -87.3 gives 0, above ln(2^127.5) e^88.376 (no infinity).
static inline v128_t exp4(v128_t x) {
  const v128_t lo = wasm_f32x4_splat(-87.3f), hi = wasm_f32x4_splat(88.3762626647949f);
  v128_t under = wasm_f32x4_lt(x, lo);
  x = wasm_f32x4_min(wasm_f32x4_max(x, lo), hi);
  v128_t n = wasm_f32x4_nearest(wasm_f32x4_mul(x, wasm_f32x4_splat(1.44269504088896341f)));
  v128_t r = wasm_f32x4_sub(x, wasm_f32x4_mul(n, wasm_f32x4_splat(0.693359375f)));
  r = wasm_f32x4_sub(r, wasm_f32x4_mul(n, wasm_f32x4_splat(-2.12194440e-4f)));
  v128_t p = wasm_f32x4_splat(1.9875691500e-4f);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.3981999507e-3f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(8.3334519073e-3f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(4.1665795894e-2f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.6666665459e-1f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(5.0000001201e-1f));
  p = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(wasm_f32x4_mul(p, r), r), r), wasm_f32x4_splat(1.0f));
  v128_t scale = wasm_i32x4_shl(wasm_i32x4_add(wasm_i32x4_trunc_sat_f32x4(n), wasm_i32x4_splat(127)), 23);
  return wasm_v128_andnot(wasm_f32x4_mul(p, scale), under);
}

// tanh for 4 lanes as 1 - 2 / (e^2x + 1): absolute error within 1.8e-7, measured (what SiLU and GELU-tanh need; the
// relative error near 0 is larger, where the activations multiply it by x).
static inline v128_t tanh4(v128_t x) {
  v128_t e = exp4(wasm_f32x4_add(x, x));
  return wasm_f32x4_sub(wasm_f32x4_splat(1.0f), wasm_f32x4_div(wasm_f32x4_splat(2.0f), wasm_f32x4_add(e, wasm_f32x4_splat(1.0f))));
}

static inline float lane0(v128_t v) { return wasm_f32x4_extract_lane(v, 0); }

EXPORT(exp_f32) void exp_f32(const float *x, float *y, i32 n) {
  i32 i = 0;
  for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, exp4(wasm_v128_load(x + i)));
  for (; i < n; i++) y[i] = lane0(exp4(wasm_f32x4_splat(x[i])));
}

EXPORT(tanh_f32) void tanh_f32(const float *x, float *y, i32 n) {
  i32 i = 0;
  for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, tanh4(wasm_v128_load(x + i)));
  for (; i < n; i++) y[i] = lane0(tanh4(wasm_f32x4_splat(x[i])));
}

// y = x / sqrt(mean(x^2) + eps) * w over each group of E values (`heads` groups in a row), as forward.rms_norm
// forms it (a division, then the product with the weight); y may be x.
EXPORT(rms_norm)
void rms_norm(const float *x, const float *w, float *y, i32 rows, i32 heads, i32 E, i32 ldx, i32 ldy, float eps) {
  for (i32 r = 0; r < rows; r++) {
    for (i32 h = 0; h < heads; h++) {
      const float *v = x + (long)r * ldx + h * E;
      float *out = y + (long)r * ldy + h * E;
      float s = dot(v, v, E);
      float root = __builtin_sqrtf(s / (float)E + eps);
      v128_t d = wasm_f32x4_splat(root);
      i32 i = 0;
      for (; i + 4 <= E; i += 4)
        wasm_v128_store(out + i, wasm_f32x4_mul(wasm_f32x4_div(wasm_v128_load(v + i), d), wasm_v128_load(w + i)));
      for (; i < E; i++) out[i] = v[i] / root * w[i];
    }
  }
}

// RoPE in place, Hugging Face's halves: (x[i], x[i + E/2]) rotated by the angle whose cos and sin are
// row r's (rows, E/2) tables, in every head; as rope.apply_rope forms it (no fused multiply-add: the same bits).
EXPORT(rope) void rope(float *x, const float *cos, const float *sin, i32 rows, i32 heads, i32 E, i32 ldx) {
  const i32 half = E / 2;
  for (i32 r = 0; r < rows; r++) {
    const float *c = cos + (long)r * half, *s = sin + (long)r * half;
    for (i32 h = 0; h < heads; h++) {
      float *a = x + (long)r * ldx + h * E, *b = a + half;
      i32 i = 0;
      for (; i + 4 <= half; i += 4) {
        v128_t x1 = wasm_v128_load(a + i), x2 = wasm_v128_load(b + i), ci = wasm_v128_load(c + i), si = wasm_v128_load(s + i);
        wasm_v128_store(a + i, wasm_f32x4_sub(wasm_f32x4_mul(x1, ci), wasm_f32x4_mul(x2, si)));
        wasm_v128_store(b + i, wasm_f32x4_add(wasm_f32x4_mul(x2, ci), wasm_f32x4_mul(x1, si)));
      }
      for (; i < half; i++) {
        float x1 = a[i], x2 = b[i];
        a[i] = x1 * c[i] - x2 * s[i];
        b[i] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

// The gated MLP's middle: y (rows, F) = act(gate) * up, from gu (rows, 2F): gate then up in each row.
// kind 0: SiLU, x (0.5 + 0.5 tanh(x / 2)); kind 1: GELU's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
static inline v128_t activate(i32 kind, v128_t g) {
  const v128_t half = wasm_f32x4_splat(0.5f);
  if (kind == 0) return wasm_f32x4_mul(g, wasm_f32x4_add(half, wasm_f32x4_mul(half, tanh4(wasm_f32x4_mul(half, g)))));
  v128_t cube = wasm_f32x4_mul(wasm_f32x4_mul(wasm_f32x4_splat(0.044715f), g), wasm_f32x4_mul(g, g));
  v128_t inner = wasm_f32x4_mul(wasm_f32x4_splat(0.7978845608028654f), wasm_f32x4_add(g, cube));
  return wasm_f32x4_mul(wasm_f32x4_mul(half, g), wasm_f32x4_add(wasm_f32x4_splat(1.0f), tanh4(inner)));
}

// Columns c0 <= i < c1 of it (the thread pool's units; c0 a multiple of 4): a lane computes what the whole
// step's lane does, and the last columns one at a time take lane 0 of the same operations, so the bits are
// the same however the columns are cut.
static void gated_columns(i32 kind, const float *gu, float *y, i32 rows, i32 F, i32 c0, i32 c1) {
  for (i32 r = 0; r < rows; r++) {
    const float *g = gu + (long)r * 2 * F, *u = g + F;
    float *out = y + (long)r * F;
    i32 i = c0;
    for (; i + 4 <= c1; i += 4) wasm_v128_store(out + i, wasm_f32x4_mul(activate(kind, wasm_v128_load(g + i)), wasm_v128_load(u + i)));
    for (; i < c1; i++) out[i] = lane0(wasm_f32x4_mul(activate(kind, wasm_f32x4_splat(g[i])), wasm_f32x4_splat(u[i])));
  }
}

EXPORT(gated) void gated(i32 kind, const float *gu, float *y, i32 rows, i32 F) { gated_columns(kind, gu, y, rows, F, 0, F); }

// y[r, 0:n] += x[r, 0:n] (rows at stride ldy and ldx)
EXPORT(add_to) void add_to(float *y, const float *x, i32 rows, i32 n, i32 ldy, i32 ldx) {
  for (i32 r = 0; r < rows; r++) {
    float *a = y + (long)r * ldy;
    const float *b = x + (long)r * ldx;
    i32 i = 0;
    for (; i + 4 <= n; i += 4) wasm_v128_store(a + i, wasm_f32x4_add(wasm_v128_load(a + i), wasm_v128_load(b + i)));
    for (; i < n; i++) a[i] += b[i];
  }
}

// y[r, 0:n] = x[r, 0:n]
static void copy_rows(float *y, const float *x, i32 rows, i32 n, i32 ldy, i32 ldx) {
  for (i32 r = 0; r < rows; r++) {
    float *a = y + (long)r * ldy;
    const float *b = x + (long)r * ldx;
    i32 i = 0;
    for (; i + 4 <= n; i += 4) wasm_v128_store(a + i, wasm_v128_load(b + i));
    for (; i < n; i++) a[i] = b[i];
  }
}

// An address from an int32 word (a plan's step, a cache's entry), and float32 bits from one.
#define AT(type, word) ((type *)(__SIZE_TYPE__)(unsigned)(word))

static inline float bits_float(i32 word) {
  union { i32 i; float f; } u;
  u.i = word;
  return u.f;
}

// A layer's KV cache as attention reads it: ENTRY_WORDS int32 words (model/plan.py writes them).
//   [0] keys, [1] values: the float32 tier (KV, capacity, E) each; [2] its capacity; [3] slots in use (the
//   new rows' already written); [4] the position of slot 0 (its slots hold consecutive positions);
//   [5] key codes, [6] value codes: the cold tier (KV, cold capacity, E) int8, or (KV, cold capacity, E/2)
//   int4 (byte j: codes j and j + E/2, each + 8, low nibble first); [7] key scales, [8] value scales
//   (KV, cold capacity) float32: x = scale * code; [9] its capacity; [10] slots in use; [11] their
//   positions (int32, ascending, all before the float32 tier's); [12] code bits, 8 or 4.
#define ENTRY_WORDS 16

static inline v128_t i8_lanes_to_f32(v128_t v, i32 part) {  // lanes 4 part .. 4 part + 3 of 16 int8
  v128_t h = part < 2 ? wasm_i16x8_extend_low_i8x16(v) : wasm_i16x8_extend_high_i8x16(v);
  return small_to_f32((part & 1) ? wasm_i32x4_extend_high_i16x8(h) : wasm_i32x4_extend_low_i16x8(h));
}

// The 16 codes at `row` from value c (int8), or from byte c of an int4 row (nibble 0: values c..c+15 of
// the first half, 1: of the second), as int8 lanes.
static inline v128_t cold_codes16(const u8 *row, i32 c, i32 bits, i32 nibble) {
  v128_t p = wasm_v128_load(row + c);
  if (bits == 8) return p;
  p = nibble ? wasm_u8x16_shr(p, 4) : wasm_v128_and(p, wasm_i8x16_splat(15));
  return wasm_i8x16_sub(p, wasm_i8x16_splat(8));
}

static inline float cold_code(const u8 *row, i32 e, i32 bits, i32 E) {
  if (bits == 8) return (float)((const i8 *)row)[e];
  const i32 half = E / 2;
  return (float)((e < half ? row[e] & 15 : row[e - half] >> 4) - 8);
}

// q . codes of one cold row (E values)
static float cold_dot(const float *q, const u8 *row, i32 E, i32 bits) {
  const i32 span = bits == 8 ? E : E / 2, S16 = span & ~15;
  v128_t acc = wasm_f32x4_splat(0.0f);
  for (i32 c = 0; c < S16; c += 16) {
    for (i32 nibble = 0; nibble < (bits == 8 ? 1 : 2); nibble++) {
      v128_t codes = cold_codes16(row, c, bits, nibble);
      const float *qc = q + c + nibble * span;
      for (i32 part = 0; part < 4; part++)
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(i8_lanes_to_f32(codes, part), wasm_v128_load(qc + 4 * part)));
    }
  }
  float sum = hsum(acc);
  for (i32 c = S16; c < span; c++) {
    sum += q[c] * cold_code(row, c, bits, E);
    if (bits == 4) sum += q[c + span] * cold_code(row, c + span, bits, E);
  }
  return sum;
}

// o += w * codes of one cold row
static void cold_mix(float *o, float w, const u8 *row, i32 E, i32 bits) {
  const i32 span = bits == 8 ? E : E / 2, S16 = span & ~15;
  const v128_t wv = wasm_f32x4_splat(w);
  for (i32 c = 0; c < S16; c += 16) {
    for (i32 nibble = 0; nibble < (bits == 8 ? 1 : 2); nibble++) {
      v128_t codes = cold_codes16(row, c, bits, nibble);
      float *oc = o + c + nibble * span;
      for (i32 part = 0; part < 4; part++)
        wasm_v128_store(oc + 4 * part, wasm_f32x4_add(wasm_v128_load(oc + 4 * part),
                                                      wasm_f32x4_mul(wv, i8_lanes_to_f32(codes, part))));
    }
  }
  for (i32 c = S16; c < span; c++) {
    o[c] += w * cold_code(row, c, bits, E);
    if (bits == 4) o[c + span] += w * cold_code(row, c + span, bits, E);
  }
}

// Attention of T new rows over a layer's cache (`entry`, above). Row t (position pos0 + t), query head h
// (key/value head h / (H / KV)) at q + t ldq + h E, sees the cached positions at or before its own, and
// with a window only those less than `window` before it; its output goes to out + t ldo + h E. Its scores:
// the dot product with each key (a cold key's: with its codes, times its scale) times `scale`; then
// exp(score - max) / their sum; then the values summed: the float32 tier's in slot order, then the cold
// tier's added. scratch holds one query's scores (cold slots in use + float32 slots in use floats).
// attend_heads: query heads h0 <= h < h1 only (the thread pool's units; each head's rows are computed alike
// whichever unit holds them).
static void attend_heads(const float *q, i32 ldq, const i32 *entry, float *out, i32 ldo, float *scratch, i32 T,
                         i32 H, i32 KV, i32 E, i32 pos0, i32 window, float scale, i32 h0, i32 h1) {
  const i32 G = H / KV, E16 = E & ~15, capacity = entry[2], count = entry[3], first = entry[4];
  const i32 bits = entry[12], cold_capacity = entry[9], cold_count = entry[10];
  const i32 width = bits == 8 ? E : E / 2, *cold_positions = AT(const i32, entry[11]);
  for (i32 h = h0; h < h1; h++) {
    const long head = (long)(h / G);
    const float *k = AT(const float, entry[0]) + head * capacity * E, *v = AT(const float, entry[1]) + head * capacity * E;
    const u8 *ck = AT(const u8, entry[5]) + head * cold_capacity * width, *cv = AT(const u8, entry[6]) + head * cold_capacity * width;
    const float *cks = AT(const float, entry[7]) + head * cold_capacity, *cvs = AT(const float, entry[8]) + head * cold_capacity;
    for (i32 t = 0; t < T; t++) {
      const i32 position = pos0 + t;
      i32 hi = position - first + 1, lo = 0, clo = cold_count;
      if (hi > count) hi = count;
      if (window > 0) {
        if (position - window + 1 - first > lo) lo = position - window + 1 - first;
        for (clo = 0; clo < cold_count && position - cold_positions[clo] >= window;) clo++;
      } else {
        clo = 0;
      }
      const float *qt = q + (long)t * ldq + h * E;
      float *o = out + (long)t * ldo + h * E;
      const i32 C = cold_count - clo, S = C + (hi > lo ? hi - lo : 0);
      float top = -3.0e38f;
      for (i32 j = clo; j < cold_count; j++) {
        float s = cold_dot(qt, ck + (long)j * width, E, bits) * cks[j] * scale;
        scratch[j - clo] = s;
        top = s > top ? s : top;
      }
      for (i32 j = lo; j < hi; j++) {
        float s = dot(qt, k + (long)j * E, E) * scale;
        scratch[C + j - lo] = s;
        top = s > top ? s : top;
      }
      v128_t total = wasm_f32x4_splat(0.0f), m = wasm_f32x4_splat(top);
      i32 j = 0;
      for (; j + 4 <= S; j += 4) {
        v128_t e = exp4(wasm_f32x4_sub(wasm_v128_load(scratch + j), m));
        wasm_v128_store(scratch + j, e);
        total = wasm_f32x4_add(total, e);
      }
      float sum = hsum(total);
      for (; j < S; j++) sum += scratch[j] = lane0(exp4(wasm_f32x4_splat(scratch[j] - top)));
      v128_t d = wasm_f32x4_splat(sum);
      for (j = 0; j + 4 <= S; j += 4) wasm_v128_store(scratch + j, wasm_f32x4_div(wasm_v128_load(scratch + j), d));
      for (; j < S; j++) scratch[j] /= sum;
      const float *vs = v + (long)lo * E, *p = scratch + C;
      const i32 hot = S - C;
      for (i32 e = 0; e < E16; e += 16) mix_1x16(p, vs + e, o + e, hot, E);
      for (i32 e = E16; e < E; e++) o[e] = mix_1x1(p, vs + e, hot, E);
      for (j = clo; j < cold_count; j++) cold_mix(o, scratch[j - clo] * cvs[j], cv + (long)j * width, E, bits);
    }
  }
}

EXPORT(attend)
void attend(const float *q, i32 ldq, const i32 *entry, float *out, i32 ldo, float *scratch, i32 T, i32 H, i32 KV,
            i32 E, i32 pos0, i32 window, float scale) {
  attend_heads(q, ldq, entry, out, ldo, scratch, T, H, KV, E, pos0, window, scale, 0, H);
}

// ---- the decode plan: a token's steps, run in one call -------------------------------------------------------
//
// py_src/ruvllm/model/plan.py writes a model's forward once, at load, as a program: steps of STEP_WORDS int32
// words, an opcode then its operands (addresses, sizes, float32 bits), ending with PLAN_END. Each call runs
// it for the rows the state gives:
//   state[0] T        new rows (tokens) in the activations
//   state[1] pos0     the absolute position of row 0
//   state[2] last     1: the tail steps (final norm, logits) take the last row only
//   state[3] logits   0: stop before the logits product (the caller multiplies the normed rows itself)
//   state[4] tap      the layer whose entering rows are copied out (learning's residual tap), or -1
//   state[5] tapped   where they go: row 0's address
//   state[6] scores   attention's scratch (one query's scores), thread i's at scores + i * state[7] floats
//   state[7] stride   floats of each thread's scores
// A layer's cache is a table entry (attend's `entry`), read at each call, so buffers that grew are found
// where they are now; the new rows' keys and values go to the float32 tier's slots count - T .. count - 1.
#define STEP_WORDS 16
enum { PLAN_END, PLAN_NORM, PLAN_PRODUCT, PLAN_BIAS, PLAN_ROPE, PLAN_APPEND, PLAN_ATTEND, PLAN_ADD, PLAN_GATED, PLAN_COPY, PLAN_LORA };
enum { FORM_DENSE, FORM_Q8, FORM_Q8H, FORM_Q4 };
#define PRODUCT_QUANTIZE 1  // quantize x first (the first product of those that share it)
#define PRODUCT_TAIL 2      // the logits: the tail rows; skipped when the state says so


// A product step: [op, form, w, scales, mins, offset, N, K, x, y, ldy, xq, flags, scratch, scratch stride]. Few
// rows take the fast arithmetic (x quantized into xq: QUANTIZED_X_BYTES(T, K), by the first product of those
// that share it); more go through the exact tiles (scratch: TILE_ROWS * K floats per thread, thread i's at
// scratch + i * stride floats). The rows of a step: T, or 1 for the logits of the last row only.
static inline i32 product_rows(const i32 *s, const i32 *state) {
  return (s[12] & PRODUCT_TAIL) && state[2] ? 1 : state[0];
}

// Quantize a product step's x when the step says so and its rows take the fast arithmetic.
static void product_quantize(const i32 *s, i32 T) {
  if (!(s[12] & PRODUCT_QUANTIZE) || s[1] == FORM_DENSE || T > GROUPED_MAX_ROWS) return;
  const i32 K = s[7], G = K / GROUP;
  short *xq = AT(short, s[11]);
  float *d = (float *)(xq + T * K);
  quantize_x(AT(const float, s[8]), xq, d, d + T * G, T, K);
}

// Output features n0 <= n < n1 of a product step (x quantized already), with thread `thread`'s scratch. n0 is
// a multiple of TILE_ROWS, so every output is summed as the whole product sums it (the row slices above).
static void product_part(const i32 *s, i32 T, i32 n0, i32 n1, i32 thread) {
  const i32 form = s[1], offset = s[5], K = s[7], ldy = s[10], n = n1 - n0, G = K / GROUP;
  const float *x = AT(const float, s[8]);
  float *y = AT(float, s[9]) + n0, *scratch = AT(float, s[13]) + (long)thread * s[14];
  if (form == FORM_DENSE) {
    dense_block(x, T, AT(const float, s[2]) + (long)n0 * K, n, K, y, ldy);
    return;
  }
  const u8 *w = AT(const u8, s[2]) + (long)n0 * (form == FORM_Q4 ? K / 2 : K);
  const float *scales = AT(const float, s[3]) + (long)n0 * (form == FORM_Q8H ? 2 * G : G);
  const float *mins = form == FORM_Q8H || !s[4] ? 0 : AT(const float, s[4]) + (long)n0 * G;
  if (T > GROUPED_MAX_ROWS) {
    if (form == FORM_Q8) quant_exact(8, 0, x, w, scales, mins, offset, y, scratch, T, n, K, ldy);
    else if (form == FORM_Q8H) quant_exact(8, 1, x, w, scales, 0, offset, y, scratch, T, n, K, ldy);
    else quant_exact(4, 0, x, w, scales, mins, offset, y, scratch, T, n, K, ldy);
    return;
  }
  const short *xq = AT(const short, s[11]);
  const float *d = (const float *)(xq + T * K), *xs = d + T * G;
  if (form == FORM_Q8) quant_fast(8, 0, xq, d, xs, w, scales, mins, offset, y, T, n, K, ldy);
  else if (form == FORM_Q8H) quant_fast(8, 1, xq, d, xs, w, scales, 0, offset, y, T, n, K, ldy);
  else quant_fast(4, 0, xq, d, xs, w, scales, mins, offset, y, T, n, K, ldy);
}

// A LoRA adapter on a product's output (learning/lora.py LoRAMatrix): y (rows at stride ldy) += scale *
// gated(x @ A.T) @ B.T, with A (r, K) and B (N, r) float32. low (T, r) and tmp (T, N) are buffers; each of
// the `count` gates (four words: rows start, stop, then float32 low and high) scales its rows of a row of
// x @ A.T by how open it is at their norm s: clip((s - low) / (high - low), 0, 1), or s >= low when
// high <= low (lora.Gate).
EXPORT(lora)
void lora(const float *x, const float *A, i32 r, i32 K, const float *B, i32 N, float *y, i32 ldy, float scale,
          float *low, float *tmp, const i32 *gates, i32 count, i32 T) {
  dense_block(x, T, A, r, K, low, r);
  for (i32 t = 0; t < T; t++) {
    float *row = low + (long)t * r;
    for (i32 g = 0; g < count; g++) {
      const i32 *gate = gates + 4 * g;
      const float lo = bits_float(gate[2]), hi = bits_float(gate[3]);
      float *part = row + gate[0];
      const i32 n = gate[1] - gate[0];
      const float s = __builtin_sqrtf(dot(part, part, n));
      float open;
      if (hi <= lo) {
        open = s >= lo ? 1.0f : 0.0f;
      } else {
        open = (s - lo) / (hi - lo);
        open = open < 0.0f ? 0.0f : open > 1.0f ? 1.0f : open;
      }
      for (i32 i = 0; i < n; i++) part[i] *= open;
    }
    for (i32 i = 0; i < r; i++) row[i] *= scale;
  }
  dense_block(low, T, B, N, r, tmp, N);
  add_to(y, tmp, T, N, ldy, N);
}

// One step whole, on the calling thread (thread 0's scratch).
static void plan_step(const i32 *s, const i32 *state) {
  const i32 T = state[0], pos0 = state[1], last = state[2], logits = state[3];
  switch (s[0]) {
    case PLAN_NORM: {  // [op, x, w, y, heads, E, ldx, ldy, eps, tail]
      const float *x = AT(const float, s[1]);
      i32 rows = T;
      if (s[9] && last) x += (long)(T - 1) * s[6], rows = 1;
      rms_norm(x, AT(const float, s[2]), AT(float, s[3]), rows, s[4], s[5], s[6], s[7], bits_float(s[8]));
      break;
    }
    case PLAN_PRODUCT:
      if (!(s[12] & PRODUCT_TAIL) || logits) {
        const i32 rows = product_rows(s, state);
        product_quantize(s, rows);
        product_part(s, rows, 0, s[6], 0);
      }
      break;
    case PLAN_BIAS:  // [op, y, b, N, ldy]: b added to each row (a row stride of 0 reads it again)
      add_to(AT(float, s[1]), AT(const float, s[2]), T, s[3], s[4], 0);
      break;
    case PLAN_ROPE:  // [op, x, cos, sin, heads, E, ldx]
      rope(AT(float, s[1]), AT(const float, s[2]), AT(const float, s[3]), T, s[4], s[5], s[6]);
      break;
    case PLAN_APPEND: {  // [op, src, ld, entry, KV, E, which]: rows' keys (which 0) or values (1) into slots
      const i32 *entry = AT(const i32, s[3]);
      const i32 KV = s[4], E = s[5], capacity = entry[2], count = entry[3];
      float *cache = AT(float, entry[s[6]]);
      for (i32 h = 0; h < KV; h++)
        copy_rows(cache + ((long)h * capacity + count - T) * E, AT(const float, s[1]) + h * E, T, E, E, s[2]);
      break;
    }
    case PLAN_ATTEND:  // [op, q, ldq, entry, out, ldo, H, KV, E, window, scale]
      attend(AT(const float, s[1]), s[2], AT(const i32, s[3]), AT(float, s[4]), s[5], AT(float, state[6]), T, s[6],
             s[7], s[8], pos0, s[9], bits_float(s[10]));
      break;
    case PLAN_ADD:  // [op, y, x, n]
      add_to(AT(float, s[1]), AT(const float, s[2]), T, s[3], s[3], s[3]);
      break;
    case PLAN_GATED:  // [op, kind, gu, y, F]
      gated(s[1], AT(const float, s[2]), AT(float, s[3]), T, s[4]);
      break;
    case PLAN_LORA:  // [op, x, A, r, K, B, N, y, ldy, scale, low, tmp, gates, count]
      lora(AT(const float, s[1]), AT(const float, s[2]), s[3], s[4], AT(const float, s[5]), s[6], AT(float, s[7]),
           s[8], bits_float(s[9]), AT(float, s[10]), AT(float, s[11]), AT(const i32, s[12]), s[13], T);
      break;
    case PLAN_COPY:  // [op, layer, x, n]: the rows entering `layer`, when it is the tapped one
      if (state[4] == s[1]) copy_rows(AT(float, state[5]), AT(const float, s[2]), T, s[3], s[3], s[3]);
      break;
    default:
      break;  // (an unknown step: plan.py writes none)
  }
}

EXPORT(run_plan) void run_plan(const i32 *program, const i32 *state) {
  for (const i32 *s = program; s[0] != PLAN_END; s += STEP_WORDS) plan_step(s, state);
}

// ---- the decode plan on the kernel thread pool (kernels-shared.wasm) ----------------------------------------
//
// run_plan_pool runs a program as run_plan does, on `count` threads of the pool (npm/src/worker/pool.js) that
// share this memory: the thread that calls it walks the steps and runs the small ones alone; each step that
// splits is a dispatch of the pool's protocol (pool-protocol.js: the control block `ctl`, a generation, units
// claimed one at a time by a compare-and-swap on a word tagged with it, counted done), which the pool's
// workers take part in from their loop, calling plan_unit for each unit they claim. What splits: a run of
// products sharing x (q, k, v; gate, up) as one dispatch, each product's output features in slices of whole
// tiles; attention by query head (and row blocks in a prompt); the gated MLP by columns. Every
// output is computed by the same code whichever thread takes its unit, so the bits are run_plan's at any
// thread count. The caller spins for the others' last units (they take microseconds), then sleeps on the
// done count in slices of 100 ms; a dispatch with no unit done in 60 s, or a unit that failed in a worker,
// ends the call with a negative result (JavaScript then stops the pool).
#ifdef __wasm_atomics__
enum { CTL_GEN = 0, CTL_DONE = 1, CTL_FAILED = 3, CTL_NEXT = 12, CTL_UNITS = 13, CTL_SLICES = 14, CTL_WAITING = 80,
       CTL_SLEEPERS = 81, CTL_PLAN = 85, CTL_PLAN_STATE = 86 };  // pool-protocol.js CTL: the same words
#define SLICES_PER_THREAD 4  // pool.js: units per thread of each product, so one that starts late still finds work
#define FINISH_SPIN 200000   // loads of the done count before the caller sleeps (~0.1-1 ms)
#define CHECK_NS 100000000LL // the caller's sleeps last at most this long before it looks again
#define STALL_CHECKS 600     // ... and this many without a unit done is a stall (60 s)

static inline i32 load(i32 *word) { return __atomic_load_n(word, __ATOMIC_SEQ_CST); }
static inline void store(i32 *word, i32 value) { __atomic_store_n(word, value, __ATOMIC_SEQ_CST); }

// The rows [r0, r1) of T that part `part` of `parts` covers.
static inline i32 part_start(i32 T, i32 part, i32 parts) { return (i32)((long)T * part / parts); }

// Unit `unit` of the plan dispatch in the control block, on thread `thread`. Called by the workers (through
// pool-protocol.js runUnit) and by the caller.
EXPORT(plan_unit) void plan_unit(i32 *ctl, i32 unit, i32 thread) {
  const i32 slices = ctl[CTL_SLICES], part = unit % slices;
  const i32 *s = AT(const i32, ctl[CTL_PLAN]) + (long)(unit / slices) * STEP_WORDS, *state = AT(const i32, ctl[CTL_PLAN_STATE]);
  const i32 T = state[0];
  switch (s[0]) {
    case PLAN_PRODUCT: {
      const i32 N = s[6], tiles = (N + TILE_ROWS - 1) / TILE_ROWS;
      const i32 n0 = (i32)((long)tiles * part / slices) * TILE_ROWS, n1 = (i32)((long)tiles * (part + 1) / slices) * TILE_ROWS;
      if (n0 < N) product_part(s, product_rows(s, state), n0, n1 < N ? n1 : N, thread);
      break;
    }
    case PLAN_ATTEND: {  // slices: H heads times row blocks
      const i32 H = s[6], blocks = slices / H, h = part % H, b = part / H;
      const i32 t0 = part_start(T, b, blocks), t1 = part_start(T, b + 1, blocks);
      const float *q = AT(const float, s[1]) + (long)t0 * s[2];
      float *out = AT(float, s[4]) + (long)t0 * s[5], *scores = AT(float, state[6]) + (long)thread * state[7];
      attend_heads(q, s[2], AT(const i32, s[3]), out, s[5], scores, t1 - t0, H, s[7], s[8], state[1] + t0, s[9],
                   bits_float(s[10]), h, h + 1);
      break;
    }
    case PLAN_GATED: {  // slices: column blocks, whole groups of 4
      const i32 F = s[4], c0 = 4 * part_start(F / 4, part, slices);
      const i32 c1 = part + 1 == slices ? F : 4 * part_start(F / 4, part + 1, slices);
      gated_columns(s[1], AT(const float, s[2]), AT(float, s[3]), T, F, c0, c1);
      break;
    }
    default:
      break;
  }
}

// Run `steps` steps from `s` as one dispatch of `slices` units each on `count` threads, the caller among them.
// 0, or -1 (no progress for STALL_CHECKS sleeps: the caller gives up), or -2 (a worker's unit failed).
static i32 dispatch(i32 *ctl, const i32 *s, i32 steps, i32 slices, i32 count) {
  const i32 units = steps * slices, gen = load(ctl + CTL_GEN) + 1, tag = (gen & 0x7fff) << 16;
  ctl[CTL_PLAN] = (i32)(__SIZE_TYPE__)s;
  store(ctl + CTL_NEXT, 0xffff);  // announce (closed first: pool-protocol.js announce says why), then open
  store(ctl + CTL_SLICES, slices);
  store(ctl + CTL_UNITS, units);
  store(ctl + CTL_DONE, 0);
  store(ctl + CTL_NEXT, tag);
  store(ctl + CTL_GEN, gen);
  if (load(ctl + CTL_SLEEPERS) > 0) __builtin_wasm_memory_atomic_notify(ctl + CTL_GEN, (unsigned)(count - 1));
  for (;;) {  // claim units as the workers do (pool-protocol.js work)
    const i32 next = load(ctl + CTL_NEXT);
    if ((next & ~0xffff) != tag || (next & 0xffff) >= units) break;
    if (__sync_val_compare_and_swap(ctl + CTL_NEXT, next, next + 1) != next) continue;
    plan_unit(ctl, next & 0xffff, 0);
    __atomic_fetch_add(ctl + CTL_DONE, 1, __ATOMIC_SEQ_CST);
  }
  for (i32 n = 0; n < FINISH_SPIN && load(ctl + CTL_DONE) != units; n++) {
  }
  for (i32 seen = -1, still = 0;;) {
    const i32 done = load(ctl + CTL_DONE);
    if (done == units) break;
    if (done != seen) seen = done, still = 0;
    else if (++still > STALL_CHECKS) return -1;
    __atomic_fetch_add(ctl + CTL_WAITING, 1, __ATOMIC_SEQ_CST);
    __builtin_wasm_memory_atomic_wait32(ctl + CTL_DONE, done, CHECK_NS);
    __atomic_fetch_sub(ctl + CTL_WAITING, 1, __ATOMIC_SEQ_CST);
  }
  if (load(ctl + CTL_FAILED)) {
    store(ctl + CTL_FAILED, 0);
    return -2;
  }
  return 0;
}

// The products from s on that share its x (and its rows): the first quantizes it, the others do not.
static i32 product_run(const i32 *s) {
  i32 n = 1;
  while (s[n * STEP_WORDS] == PLAN_PRODUCT && !(s[n * STEP_WORDS + 12] & PRODUCT_QUANTIZE) &&
         s[n * STEP_WORDS + 8] == s[8] && (s[n * STEP_WORDS + 12] & PRODUCT_TAIL) == (s[12] & PRODUCT_TAIL))
    n++;
  return n;
}

EXPORT(run_plan_pool) i32 run_plan_pool(const i32 *program, const i32 *state, i32 *ctl, i32 count) {
  const i32 T = state[0];
  i32 failed = 0;
  ctl[CTL_PLAN_STATE] = (i32)(__SIZE_TYPE__)state;
  for (const i32 *s = program; s[0] != PLAN_END && !failed;) {
    i32 steps = 1;
    if (count < 2) {
      plan_step(s, state);
    } else if (s[0] == PLAN_PRODUCT) {
      steps = product_run(s);
      if (!(s[12] & PRODUCT_TAIL) || state[3]) {
        product_quantize(s, product_rows(s, state));
        failed = dispatch(ctl, s, steps, SLICES_PER_THREAD * count, count);
      }
    } else if (s[0] == PLAN_ATTEND) {
      failed = dispatch(ctl, s, 1, s[6] * (T > GROUPED_MAX_ROWS ? count : 1), count);
    } else if (s[0] == PLAN_GATED) {  // (SiLU-gating a row of 1536 takes ~6 µs, a dispatch 0.4 µs)
      failed = dispatch(ctl, s, 1, 2 * count, count);
    } else {
      plan_step(s, state);
    }
    s += steps * STEP_WORDS;
  }
  ctl[CTL_PLAN] = 0;  // (the pool's own products read this word: not a plan dispatch)
  return failed;
}
#endif
