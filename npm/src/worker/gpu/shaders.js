/**
 * The decode plan's steps (kernels/kernels.c plan_step, written by py_src/ruvllm/model/plan.py) as WGSL
 * compute shaders, float32 throughout: every WebGPU adapter has it (shader-f16 is an option some lack).
 *
 * Every shader reads its operands' sizes and offsets from a block of 16 words (`Params`, a uniform bound
 * at a dynamic offset: executor.js writes one block per dispatch, all of a call's in one write) and
 * addresses the buffers as flat arrays. Activations (the plan's buffers, the KV cache's float32 tier,
 * learning's residual tap) are bound `read_write` even where a shader only reads them: a step may read
 * and write the same buffer (a head norm in place), and WebGPU lets a buffer be bound twice in one
 * dispatch only when every binding of it is writable storage. Weights (codes, scales, mins; float32
 * matrices, norms, biases, adapters) are bound `read`.
 *
 * Matrix codes are 32-bit words of packed bytes (WGSL has no 8-bit type), in the kernels' layouts
 * (py_src/ruvllm/quant/matrices.py): per group of 32 weights along K, w = scale * (code - offset) (+ min),
 *   q8   int8 codes (N, K): word i of a group holds codes 4i .. 4i+3, low byte first;
 *   q8h  the same with two scales per group (codes 0..15, 16..31), no mins;
 *   q4   (N, K/2) bytes: byte j of a group holds code j (low nibble) and code j + 16 (high nibble).
 * The KV cache's cold tier: int8 (KV, capacity, E), or int4 (KV, capacity, E/2) bytes whose byte c holds
 * codes c and c + E/2, each + 8, low nibble first (kernels.c ENTRY_WORDS).
 *
 * tanh is clamped to |x| <= 15 before WGSL's tanh: some drivers compute it as (e^2x - 1) / (e^2x + 1),
 * which is NaN past |x| ~ 44 (and tanh(15) is 1 in float32 already).
 */

/**
 * `code` with its (first) output scaled by 1.5: a shader broken on purpose, for the tests of the check
 * at load (runtime/device.py must refuse what it computes).
 */
export function brokenOn(code) {
  return code.replace(/(\n\s*)(y|out)\[([^\]]+)\] = /, '$1$2[$3] = 1.5 * ');
}

/** Words of a dispatch's Params block, and the bytes between two blocks (the dynamic offset alignment). */
export const PARAM_WORDS = 16;
export const PARAM_STRIDE = 256;
/** Threads of every workgroup. */
export const WORKGROUP = 64;
/** Rows of x a product's workgroup takes at once (its accumulators). */
export const PRODUCT_ROWS = 8;

const HEADER = /* wgsl */ `
struct Params { w: array<vec4<u32>, 4> }
@group(0) @binding(0) var<uniform> p: Params;
fn u(i: u32) -> u32 { return p.w[i / 4u][i % 4u]; }
fn f(i: u32) -> f32 { return bitcast<f32>(p.w[i / 4u][i % 4u]); }
// A workgroup's number in a dispatch folded over x and y (more than 65535 in a row).
fn group_of(id: vec3<u32>, n: vec3<u32>) -> u32 { return id.x + id.y * n.x; }
fn safe_tanh(x: f32) -> f32 { return tanh(clamp(x, -15.0, 15.0)); }
`;

/**
 * y = x / sqrt(mean(x^2) + eps) * w over each group of E values: a workgroup per (row, head).
 * Params: 0 x, 1 y, 2 heads, 3 E, 4 ldx, 5 ldy, 6 eps, 7 w (offsets in floats).
 */
const NORM_CODE = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
var<workgroup> sums: array<f32, ${WORKGROUP}>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let unit = group_of(id, n);
  let heads = u(2u); let E = u(3u);
  let row = unit / heads; let head = unit % heads;
  let src = u(0u) + row * u(4u) + head * E;
  let dst = u(1u) + row * u(5u) + head * E;
  var s = 0.0;
  for (var i = lane; i < E; i += ${WORKGROUP}u) { let v = x[src + i]; s += v * v; }
  sums[lane] = s;
  workgroupBarrier();
  for (var stride = ${WORKGROUP / 2}u; stride > 0u; stride /= 2u) {
    if (lane < stride) { sums[lane] += sums[lane + stride]; }
    workgroupBarrier();
  }
  let root = sqrt(sums[0] / f32(E) + f(6u));
  workgroupBarrier();
  for (var i = lane; i < E; i += ${WORKGROUP}u) { y[dst + i] = x[src + i] / root * w[u(7u) + i]; }
}`;
/** In place (x is y: one binding, as WebGPU forbids a buffer bound twice where one binding writes). */
const NORM_IN_PLACE = NORM_CODE.replace('@group(0) @binding(2) var<storage, read_write> x: array<f32>;\n', '')
  .replace('@binding(3) var<storage, read_write> y', '@binding(2) var<storage, read_write> y')
  .replaceAll('x[', 'y[');

/**
 * y[t, n] (+)= alpha * sum_k x[t, k] W[n, k] for W in codes: form 1 q8, 2 q8h, 3 q4. A thread per output
 * feature (its row of W read once a row of x, in 16-byte words), PRODUCT_ROWS rows of x a dispatch's z.
 * (Measured on SwiftShader, the lm_head of SmolLM2 in q4: a thread per feature took a quarter of the time
 * of 16 threads per feature summed in workgroup memory; GPUs with wide subgroups may want those back.)
 * `half`: scales and mins are float16, two to a 32-bit word (plan.py's HALF: 20 bytes a group of q4, not 24).
 * Params: 0 form, 1 N, 2 K, 3 T, 4 x, 5 ldx, 6 y, 7 ldy, 8 the first row's index in the codes' buffer, 9
 * code offset (int32), 10 has mins, 11 the first row's in the scales' buffer, 12 accumulate, 13 alpha, 14
 * features (N: the threads past it idle), 15 the first row's in the mins' buffer (a matrix split in parts:
 * executor.js). x, ldx and K are multiples of 4 (a group is 32).
 */
/** Each form's share of a product's group g (forms: 1 q8, 2 q8h, 3 q4). */
const PRODUCT_GROUP = {
  1: `let d = q8_dots(w[2u * (wrow * G + g)], w[2u * (wrow * G + g) + 1u], xa, offset);
      acc += scale(srow * G + g) * (d.x + d.y);`,
  2: `let d = q8_dots(w[2u * (wrow * G + g)], w[2u * (wrow * G + g) + 1u], xa, offset);
      acc += scale(2u * (srow * G + g)) * d.x + scale(2u * (srow * G + g) + 1u) * d.y;`,
  3: `let d = q4_dots(w[wrow * G + g], xa, offset);
      acc += scale(srow * G + g) * (d.x + d.y);`,
};
const product = (form, half) => /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<${half ? 'u32' : 'f32'}>;
@group(0) @binding(3) var<storage, read> mins: array<${half ? 'u32' : 'f32'}>;
${
  half
    ? `fn scale(i: u32) -> f32 { return unpack2x16float(scales[i / 2u])[i % 2u]; }
fn min_of(i: u32) -> f32 { return unpack2x16float(mins[i / 2u])[i % 2u]; }`
    : `fn scale(i: u32) -> f32 { return scales[i]; }
fn min_of(i: u32) -> f32 { return mins[i]; }`
}
@group(0) @binding(4) var<storage, read_write> x: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
fn i8s(word: u32) -> vec4<f32> {
  let v = bitcast<vec4<i32>>(vec4<u32>(word << 24u, word << 16u, word << 8u, word)) >> vec4<u32>(24u);
  return vec4<f32>(v);
}
fn nibbles(word: u32, shift: u32) -> vec4<f32> {
  return vec4<f32>(f32((word >> shift) & 15u), f32((word >> (shift + 8u)) & 15u),
                   f32((word >> (shift + 16u)) & 15u), f32((word >> (shift + 24u)) & 15u));
}
// A group's 32 codes (minus the offset) against x's 32 values from vec4 xa: the dot products of codes
// 0..15 and of 16..31, and the sum of x (for the group's min).
fn q4_dots(q: vec4<u32>, xa: u32, offset: vec4<f32>) -> vec3<f32> {
  let a0 = x[xa]; let a1 = x[xa + 1u]; let a2 = x[xa + 2u]; let a3 = x[xa + 3u];
  let b0 = x[xa + 4u]; let b1 = x[xa + 5u]; let b2 = x[xa + 6u]; let b3 = x[xa + 7u];
  let lo = dot(nibbles(q.x, 0u) - offset, a0) + dot(nibbles(q.y, 0u) - offset, a1)
         + dot(nibbles(q.z, 0u) - offset, a2) + dot(nibbles(q.w, 0u) - offset, a3);
  let hi = dot(nibbles(q.x, 4u) - offset, b0) + dot(nibbles(q.y, 4u) - offset, b1)
         + dot(nibbles(q.z, 4u) - offset, b2) + dot(nibbles(q.w, 4u) - offset, b3);
  let s = a0 + a1 + a2 + a3 + b0 + b1 + b2 + b3;
  return vec3<f32>(lo, hi, s.x + s.y + s.z + s.w);
}
fn q8_dots(a: vec4<u32>, b: vec4<u32>, xa: u32, offset: vec4<f32>) -> vec3<f32> {
  let a0 = x[xa]; let a1 = x[xa + 1u]; let a2 = x[xa + 2u]; let a3 = x[xa + 3u];
  let b0 = x[xa + 4u]; let b1 = x[xa + 5u]; let b2 = x[xa + 6u]; let b3 = x[xa + 7u];
  let lo = dot(i8s(a.x) - offset, a0) + dot(i8s(a.y) - offset, a1)
         + dot(i8s(a.z) - offset, a2) + dot(i8s(a.w) - offset, a3);
  let hi = dot(i8s(b.x) - offset, b0) + dot(i8s(b.y) - offset, b1)
         + dot(i8s(b.z) - offset, b2) + dot(i8s(b.w) - offset, b3);
  let s = a0 + a1 + a2 + a3 + b0 + b1 + b2 + b3;
  return vec3<f32>(lo, hi, s.x + s.y + s.z + s.w);
}
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
  let K = u(2u);
  let row = group_of(id, n) * ${WORKGROUP}u + local;
  if (row >= u(14u)) { return; }
  let G = K / 32u;
  let wrow = row + u(8u);  // (a row's index in the buffer of its part: codes, scales and mins each their own)
  let srow = row + u(11u);
  let mrow = row + u(15u);
  let offset = vec4<f32>(f32(bitcast<i32>(u(9u))));
  let has_mins = u(10u) != 0u;
  let t0 = id.z * ${PRODUCT_ROWS}u;
  let t1 = min(t0 + ${PRODUCT_ROWS}u, u(3u));
  let alpha = f(13u);
  for (var t = t0; t < t1; t++) {
    let xb = (u(4u) + t * u(5u)) / 4u;
    var acc = 0.0;
    for (var g = 0u; g < G; g++) {
      let xa = xb + g * 8u;
      ${PRODUCT_GROUP[form]}
      if (has_mins) { acc += min_of(mrow * G + g) * d.z; }
    }
    let at = u(6u) + t * u(7u) + row;
    if (u(12u) != 0u) { y[at] += alpha * acc; } else { y[at] = alpha * acc; }
  }
}`;

/**
 * The same product for W in float32 (form 0): a thread per output feature; `width` 4 reads W and x in
 * vec4s (K, x and ldx multiples of 4), 1 one value at a time (any K: an adapter's B, K = its rank).
 * Params as PRODUCT's.
 */
const dense = (width) => /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read> w: array<${width === 4 ? 'vec4<f32>' : 'f32'}>;
@group(0) @binding(2) var<storage, read> scales: array<f32>;
@group(0) @binding(3) var<storage, read> mins: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<${width === 4 ? 'vec4<f32>' : 'f32'}>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
  let K = u(2u) / ${width}u;
  let row = group_of(id, n) * ${WORKGROUP}u + local;
  if (row >= u(14u)) { return; }
  let wb = (row + u(8u)) * K;
  let t0 = id.z * ${PRODUCT_ROWS}u;
  let t1 = min(t0 + ${PRODUCT_ROWS}u, u(3u));
  let alpha = f(13u);
  for (var t = t0; t < t1; t++) {
    let xb = (u(4u) + t * u(5u)) / ${width}u;
    var acc = ${width === 4 ? 'vec4<f32>(0.0)' : '0.0'};
    for (var k = 0u; k < K; k++) { acc += w[wb + k] * x[xb + k]; }
    let sum = ${width === 4 ? 'acc.x + acc.y + acc.z + acc.w' : 'acc'};
    let at = u(6u) + t * u(7u) + row;
    if (u(12u) != 0u) { y[at] += alpha * sum; } else { y[at] = alpha * sum; }
  }
}`;

/** Params: 0 y, 1 b, 2 N, 3 ldy, 4 rows, 5 b offset. y[t, n] += b[n]. */
const BIAS = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let i = group_of(id, n) * ${WORKGROUP}u + lane;
  let N = u(2u);
  if (i >= N * u(4u)) { return; }
  y[u(0u) + (i / N) * u(3u) + i % N] += b[u(5u) + i % N];
}`;

/**
 * RoPE in place, Hugging Face's halves. Params: 0 x, 1 ldx, 2 heads, 3 E, 4 rows, 5 cos, 6 sin (offsets
 * in floats; the tables (rows, E/2)).
 */
const ROPE = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> cos: array<f32>;
@group(0) @binding(3) var<storage, read_write> sin: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let i = group_of(id, n) * ${WORKGROUP}u + lane;
  let heads = u(2u); let half = u(3u) / 2u;
  if (i >= u(4u) * heads * half) { return; }
  let r = i / (heads * half); let h = (i / half) % heads; let j = i % half;
  let a = u(0u) + r * u(1u) + h * u(3u) + j; let b = a + half;
  let c = cos[u(5u) + r * half + j]; let s = sin[u(6u) + r * half + j];
  let x1 = x[a]; let x2 = x[b];
  x[a] = x1 * c - x2 * s;
  x[b] = x2 * c + x1 * s;
}`;

/**
 * Rows' keys or values into the float32 tier. Params: 0 src, 1 ld, 2 KV, 3 E, 4 rows, 5 capacity,
 * 6 first slot written (count - rows), 7 the tier's offset.
 */
const APPEND = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> cache: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let i = group_of(id, n) * ${WORKGROUP}u + lane;
  let E = u(3u); let KV = u(2u);
  if (i >= u(4u) * KV * E) { return; }
  let t = i / (KV * E); let h = (i / E) % KV; let e = i % E;
  cache[u(7u) + (h * u(5u) + u(6u) + t) * E + e] = src[u(0u) + t * u(1u) + h * E + e];
}`;

/** Value e of a cold row of E values whose codes start at byte `base` of `codes` (int8, or int4 + 8). */
const COLD_CODE = /* wgsl */ `fn code(base: u32, e: u32, E: u32, bits: u32) -> f32 {
  if (bits == 8u) {
    let b = base + e;
    return f32(bitcast<i32>(codes[b / 4u] << (24u - 8u * (b % 4u))) >> 24u);
  }
  let half = E / 2u;
  let c = select(e - half, e, e < half);
  let b = base + c;
  let byte = (codes[b / 4u] >> (8u * (b % 4u))) & 255u;
  return f32(i32(select(byte >> 4u, byte & 15u, e < half)) - 8);
}`;

/**
 * The scores of attention: one thread per (row, query head, slot), the cold tier's slots first. A slot
 * the row may not see (after its position, or out of its window) scores -inf (as -3e38).
 * Params: 0 q, 1 ldq, 2 H, 3 KV, 4 E, 5 rows, 6 pos0, 7 window, 8 scale, 9 capacity, 10 count (float32
 * slots in use), 11 first (the position of slot 0), 12 cold capacity, 13 cold count, 14 bits (8, 4),
 * 15 S (slots in all: cold count + count).
 */
const SCORES = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> codes: array<u32>;
@group(0) @binding(4) var<storage, read_write> scales: array<f32>;
@group(0) @binding(5) var<storage, read_write> positions: array<i32>;
@group(0) @binding(6) var<storage, read_write> scores: array<f32>;
${COLD_CODE}
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let i = group_of(id, n) * ${WORKGROUP}u + lane;
  let H = u(2u); let E = u(4u); let S = u(15u); let cold = u(13u);
  if (i >= u(5u) * H * S) { return; }
  let t = i / (H * S); let h = (i / S) % H; let j = i % S;
  let head = h / (H / u(3u));
  let position = i32(u(6u) + t);
  let window = i32(u(7u));
  let qt = u(0u) + t * u(1u) + h * E;
  var s = -3.0e38;
  if (j < cold) {
    let slot = head * u(12u) + j;
    if (window == 0 || position - positions[j] < window) {
      let width = select(E / 2u, E, u(14u) == 8u);
      var d = 0.0;
      for (var e = 0u; e < E; e++) { d += q[qt + e] * code(slot * width, e, E, u(14u)); }
      s = d * scales[slot] * f(8u);
    }
  } else {
    let slot = i32(j - cold);
    let first = i32(u(11u));
    let visible = slot < position - first + 1 && (window == 0 || slot >= position - window + 1 - first);
    if (visible) {
      let kt = (head * u(9u) + u32(slot)) * E;
      var d = 0.0;
      for (var e = 0u; e < E; e++) { d += q[qt + e] * k[kt + e]; }
      s = d * f(8u);
    }
  }
  scores[i] = s;
}`;

/** exp(s - max) / sum over each (row, head)'s S scores, in place: a workgroup each. Params: 15 S. */
const SOFTMAX = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read_write> scores: array<f32>;
var<workgroup> part: array<f32, ${WORKGROUP}>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let S = u(15u);
  let base = group_of(id, n) * S;
  var top = -3.0e38;
  for (var j = lane; j < S; j += ${WORKGROUP}u) { top = max(top, scores[base + j]); }
  part[lane] = top;
  workgroupBarrier();
  for (var stride = ${WORKGROUP / 2}u; stride > 0u; stride /= 2u) {
    if (lane < stride) { part[lane] = max(part[lane], part[lane + stride]); }
    workgroupBarrier();
  }
  top = part[0];
  workgroupBarrier();
  var sum = 0.0;
  for (var j = lane; j < S; j += ${WORKGROUP}u) {
    let e = exp(scores[base + j] - top);
    scores[base + j] = e;
    sum += e;
  }
  part[lane] = sum;
  workgroupBarrier();
  for (var stride = ${WORKGROUP / 2}u; stride > 0u; stride /= 2u) {
    if (lane < stride) { part[lane] += part[lane + stride]; }
    workgroupBarrier();
  }
  let total = part[0];
  for (var j = lane; j < S; j += ${WORKGROUP}u) { scores[base + j] /= total; }
}`;

/**
 * The values mixed by the weights SOFTMAX left: one thread per (row, query head, value). Params as
 * SCORES, with 0 out and 1 ldo in place of q and ldq.
 */
const MIX = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> codes: array<u32>;
@group(0) @binding(4) var<storage, read_write> scales: array<f32>;
@group(0) @binding(5) var<storage, read_write> scores: array<f32>;
${COLD_CODE}
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let i = group_of(id, n) * ${WORKGROUP}u + lane;
  let H = u(2u); let E = u(4u); let S = u(15u); let cold = u(13u);
  if (i >= u(5u) * H * E) { return; }
  let t = i / (H * E); let h = (i / E) % H; let e = i % E;
  let head = h / (H / u(3u));
  let weights = (t * H + h) * S;
  var o = 0.0;
  let width = select(E / 2u, E, u(14u) == 8u);
  for (var j = 0u; j < cold; j++) {
    let slot = head * u(12u) + j;
    let pj = scores[weights + j];
    if (pj != 0.0) { o += pj * scales[slot] * code(slot * width, e, E, u(14u)); }
  }
  let count = S - cold;
  let vt = head * u(9u) * E + e;
  for (var j = 0u; j < count; j++) { o += scores[weights + cold + j] * v[vt + j * E]; }
  out[u(0u) + t * u(1u) + h * E + e] = o;
}`;

/** Params: 0 y, 1 x, 2 n (values in all). y += x. */
const ADD = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let i = group_of(id, n) * ${WORKGROUP}u + lane;
  if (i < u(2u)) { y[u(0u) + i] += x[u(1u) + i]; }
}`;

/** Params: 0 y, 1 x, 2 n. y = x (learning's residual tap). */
const COPY = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let i = group_of(id, n) * ${WORKGROUP}u + lane;
  if (i < u(2u)) { y[u(0u) + i] = x[u(1u) + i]; }
}`;

/**
 * The gated MLP's middle, y (rows, F) = act(gate) * up from gu (rows, 2F). Params: 0 kind (0 SiLU, 1
 * GELU's tanh form), 1 gu, 2 y, 3 F, 4 rows.
 */
const GATED = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read_write> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let i = group_of(id, n) * ${WORKGROUP}u + lane;
  let F = u(3u);
  if (i >= u(4u) * F) { return; }
  let r = i / F; let c = i % F;
  let g = gu[u(1u) + r * 2u * F + c];
  var a = 0.0;
  if (u(0u) == 0u) { a = g * (0.5 + 0.5 * safe_tanh(0.5 * g)); }
  else { a = 0.5 * g * (1.0 + safe_tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))); }
  y[u(2u) + r * F + c] = a * gu[u(1u) + r * 2u * F + F + c];
}`;

/**
 * A LoRA adapter's gates and scale on x @ A.T (rows, r), in place: a thread per row (lora.Gate: each
 * gate scales its part of the row by how open it is at the part's norm). Params: 0 low, 1 r, 2 rows,
 * 3 gates (their count), 4 scale, 5 the gates' offset (4 words each: start, stop, float32 low, high).
 */
const GATE = /* wgsl */ `${HEADER}
@group(0) @binding(1) var<storage, read> gates: array<u32>;
@group(0) @binding(2) var<storage, read_write> low: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let t = group_of(id, n) * ${WORKGROUP}u + lane;
  if (t >= u(2u)) { return; }
  let row = u(0u) + t * u(1u);
  for (var g = 0u; g < u(3u); g++) {
    let at = u(5u) + 4u * g;
    let start = gates[at]; let stop = gates[at + 1u];
    let lo = bitcast<f32>(gates[at + 2u]); let hi = bitcast<f32>(gates[at + 3u]);
    var s = 0.0;
    for (var i = start; i < stop; i++) { s += low[row + i] * low[row + i]; }
    s = sqrt(s);
    var open = 0.0;
    if (hi <= lo) { open = select(0.0, 1.0, s >= lo); } else { open = clamp((s - lo) / (hi - lo), 0.0, 1.0); }
    for (var i = start; i < stop; i++) { low[row + i] *= open; }
  }
  for (var i = 0u; i < u(1u); i++) { low[row + i] *= f(4u); }
}`;

/**
 * A pick: a row's K largest logits, best first, equal ones by their ids (the lower first), NaN and
 * infinities counted and never picked (their bits tested: WGSL may assume floats finite), as
 * runtime/sampling.py top_candidates orders them. Two dispatches: each workgroup finds its block's K
 * (PICK_BLOCKS), then one workgroup the K best of those (PICK_MERGE). Each takes the best candidate
 * after the previous pick in that order, K times: nothing is sorted or moved.
 */
const PICK_COMMON = /* wgsl */ `${HEADER}
const NONE = 0xffffffffu;
// Whether (v, i) comes before (bv, bi): a larger value, or the same and a lower id; no candidate last.
fn before(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return i != NONE && (bi == NONE || v > bv || (v == bv && i < bi));
}
fn finite(v: f32) -> bool { return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u; }
var<workgroup> best_v: array<f32, ${WORKGROUP}>;
var<workgroup> best_i: array<u32, ${WORKGROUP}>;
var<workgroup> counts: array<u32, ${WORKGROUP}>;
// The lanes' best (v, i), for every lane to read at best_v[0], best_i[0].
fn reduce_best(lane: u32, v: f32, i: u32) {
  best_v[lane] = v; best_i[lane] = i;
  workgroupBarrier();
  for (var stride = ${WORKGROUP / 2}u; stride > 0u; stride /= 2u) {
    if (lane < stride && before(best_v[lane + stride], best_i[lane + stride], best_v[lane], best_i[lane])) {
      best_v[lane] = best_v[lane + stride]; best_i[lane] = best_i[lane + stride];
    }
    workgroupBarrier();
  }
}
// The lanes' counts summed, at counts[0].
fn reduce_count(lane: u32, n: u32) {
  counts[lane] = n;
  workgroupBarrier();
  for (var stride = ${WORKGROUP / 2}u; stride > 0u; stride /= 2u) {
    if (lane < stride) { counts[lane] += counts[lane + stride]; }
    workgroupBarrier();
  }
}
`;

/**
 * Params: 0 logits, 1 V, 2 K, 3 B (logits a block), 4 G (blocks). found: block b's K picks at words
 * 2 (b K + k) (float32 bits, id; NONE past its finite logits), then G counts of non-finite logits.
 */
const PICK_BLOCKS = /* wgsl */ `${PICK_COMMON}
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> found: array<u32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) lane: u32) {
  let block = group_of(id, n);
  let K = u(2u);
  let first = block * u(3u); let end = min(first + u(3u), u(1u));
  var bad = 0u;
  for (var i = first + lane; i < end; i += ${WORKGROUP}u) { bad += select(1u, 0u, finite(logits[u(0u) + i])); }
  reduce_count(lane, bad);
  if (lane == 0u) { found[2u * u(4u) * K + block] = counts[0]; }
  var pv = 0.0; var pi = NONE;
  for (var k = 0u; k < K; k++) {
    var bv = 0.0; var bi = NONE;
    for (var i = first + lane; i < end; i += ${WORKGROUP}u) {
      let v = logits[u(0u) + i];
      if (finite(v) && (k == 0u || before(pv, pi, v, i)) && before(v, i, bv, bi)) { bv = v; bi = i; }
    }
    reduce_best(lane, bv, bi);
    pv = best_v[0]; pi = best_i[0];
    workgroupBarrier();
    if (lane == 0u) { found[2u * (block * K + k)] = bitcast<u32>(pv); found[2u * (block * K + k) + 1u] = pi; }
  }
}`;

/** Params: 0 out (its offset in words), 1 G, 2 K. out: [non-finite logits, K ids, K float32 bits]. */
const PICK_MERGE = /* wgsl */ `${PICK_COMMON}
@group(0) @binding(1) var<storage, read_write> found: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(local_invocation_index) lane: u32) {
  let K = u(2u); let n = u(1u) * K;
  var bad = 0u;
  for (var b = lane; b < u(1u); b += ${WORKGROUP}u) { bad += found[2u * n + b]; }
  reduce_count(lane, bad);
  if (lane == 0u) { out[u(0u)] = counts[0]; }
  var pv = 0.0; var pi = NONE;
  for (var k = 0u; k < K; k++) {
    var bv = 0.0; var bi = NONE;
    for (var j = lane; j < n; j += ${WORKGROUP}u) {
      let v = bitcast<f32>(found[2u * j]); let i = found[2u * j + 1u];
      if ((k == 0u || before(pv, pi, v, i)) && before(v, i, bv, bi)) { bv = v; bi = i; }
    }
    reduce_best(lane, bv, bi);
    pv = best_v[0]; pi = best_i[0];
    workgroupBarrier();
    if (lane == 0u) { out[u(0u) + 1u + k] = pi; out[u(0u) + 1u + K + k] = bitcast<u32>(pv); }
  }
}`;

/**
 * Each shader: its WGSL and its bindings after the Params (binding 0), in order: 'read' for read-only
 * storage, 'write' for read_write storage.
 * @type {Record<string, { code: string, bindings: ('read' | 'write')[] }>}
 */
export const SHADERS = {
  norm: { code: NORM_CODE, bindings: ['read', 'write', 'write'] },
  norm_in_place: { code: NORM_IN_PLACE, bindings: ['read', 'write'] },
  q8: { code: product(1, false), bindings: ['read', 'read', 'read', 'write', 'write'] },
  q8h: { code: product(2, false), bindings: ['read', 'read', 'read', 'write', 'write'] },
  q4: { code: product(3, false), bindings: ['read', 'read', 'read', 'write', 'write'] },
  q8_half: { code: product(1, true), bindings: ['read', 'read', 'read', 'write', 'write'] },
  q8h_half: { code: product(2, true), bindings: ['read', 'read', 'read', 'write', 'write'] },
  q4_half: { code: product(3, true), bindings: ['read', 'read', 'read', 'write', 'write'] },
  dense: { code: dense(1), bindings: ['read', 'read', 'read', 'write', 'write'] },
  dense4: { code: dense(4), bindings: ['read', 'read', 'read', 'write', 'write'] },
  bias: { code: BIAS, bindings: ['read', 'write'] },
  rope: { code: ROPE, bindings: ['write', 'write', 'write'] },
  append: { code: APPEND, bindings: ['write', 'write'] },
  scores: { code: SCORES, bindings: ['write', 'write', 'write', 'write', 'write', 'write'] },
  softmax: { code: SOFTMAX, bindings: ['write'] },
  mix: { code: MIX, bindings: ['write', 'write', 'write', 'write', 'write'] },
  add: { code: ADD, bindings: ['write', 'write'] },
  copy: { code: COPY, bindings: ['write', 'write'] },
  gated: { code: GATED, bindings: ['write', 'write'] },
  gate: { code: GATE, bindings: ['read', 'write'] },
  pick_blocks: { code: PICK_BLOCKS, bindings: ['write', 'write'] },
  pick_merge: { code: PICK_MERGE, bindings: ['write', 'write'] },
};
