// Relaxed SIMD, measured (issue 25 item 4): plain fast kernels vs relaxed_dot_i8x16_i7x16 variants on
// SmolLM2-shaped q4 and q8 matrices, one row of x (decoding), interleaved runs.
//
//   node --experimental-wasm-relaxed-simd benchmarks/relaxed/bench.mjs [--reps 15] [--json out.json]
//   python benchmarks/relaxed/chromium.py          (the same code in Chromium, through Playwright)
//
// The module is benchmarks/relaxed/relaxed.c (kernels/kernels.c plus the relaxed variants), compiled
// with clang-19 into build/relaxed/relaxed.wasm (`--build`, or when missing). Before timing, a
// known-answer test checks the bare instruction (exact int32 results where the spec makes them
// deterministic, one of the allowed results where it does not) and the kernels on integer inputs, and
// every variant is compared with a float64 reference of the exact product against the fast path's bound.
// Plain and relaxed run in one module built by one compiler, alternately, each round in turn order;
// the figures are medians over rounds and the median of the per-round ratios.

import { random } from '../../npm/test/support/random.js';

export const SHAPES = [
  [576, 576],
  [1536, 576],
  [576, 1536],
  [49152, 576],
];
const GROUP = 32;

// ---- memory ----------------------------------------------------------------------------------------------

function arena(memory) {
  let top = 1024;
  return (bytes) => {
    const at = top;
    top = (top + bytes + 15) & ~15;
    if (top > memory.buffer.byteLength) memory.grow(Math.ceil((top - memory.buffer.byteLength) / 65536));
    return at;
  };
}


// ---- the known-answer test -------------------------------------------------------------------------------

// The relaxed dot of one 32-bit lane: 4 products a[i] * b[i], summed in pairs (the int16 intermediate an
// engine may saturate), then added to c modulo 2^32. bSigned / saturate choose among what the spec allows
// when a byte of b has its top bit set.
function laneDot(a, b, c, bSigned, saturate) {
  const bb = b.map((v) => (bSigned ? (v << 24) >> 24 : v & 255));
  const sat = (v) => (saturate ? Math.max(-32768, Math.min(32767, v)) : v);
  const p0 = sat(a[0] * bb[0] + a[1] * bb[1]);
  const p1 = sat(a[2] * bb[2] + a[3] * bb[3]);
  return (c + p0 + p1) | 0;
}

export function selfTest(exports, memory) {
  const alloc = arena(memory);
  const pa = alloc(16),
    pb = alloc(16),
    pc = alloc(16),
    po = alloc(16);
  const probe = (a, b, c) => {
    new Int8Array(memory.buffer, pa, 16).set(a);
    new Int8Array(memory.buffer, pb, 16).set(b.map((v) => (v << 24) >> 24));
    new Int32Array(memory.buffer, pc, 4).set(c);
    exports.relaxed_dot_probe(pa, pb, pc, po);
    return Array.from(new Int32Array(memory.buffer, po, 4));
  };
  // the int16 form: 8 lanes, each a pair of products (bytes of b in 0..127: |sum| <= 32512, no saturation)
  const probe16 = (a, b) => {
    new Int8Array(memory.buffer, pa, 16).set(a);
    new Int8Array(memory.buffer, pb, 16).set(b.map((v) => (v << 24) >> 24));
    exports.relaxed_dot16_probe(pa, pb, po);
    return Array.from(new Int16Array(memory.buffer, po, 8));
  };
  const pairs = (a, b, bSigned, saturate) =>
    [0, 1, 2, 3, 4, 5, 6, 7].map((l) => {
      const v = laneDot([a[2 * l], a[2 * l + 1], 0, 0], [b[2 * l], b[2 * l + 1], 0, 0], 0, bSigned, saturate);
      return (v << 16) >> 16;
    });
  const failures = [];
  // deterministic: every byte of b in 0..127 (the edges: -128 and 127 in a, 0 and 127 in b, 64, 63)
  const det = [
    [Array(16).fill(-128), Array(16).fill(127), [0, 0, 0, 0]],
    [Array(16).fill(127), Array(16).fill(127), [0, 0, 0, 0]],
    [Array(16).fill(-128), Array(16).fill(127), [-2147483648, 2147483647, -1, 1]],
    [Array(16).fill(127), Array(16).fill(127), [2147483647, -2147483648, 65024, -65024]],
    [
      [-128, -1, 0, 1, 127, -64, 63, 64, -127, 2, -3, 100, -100, 7, -8, 15],
      [0, 1, 63, 64, 127, 126, 1, 0, 127, 127, 127, 127, 64, 63, 15, 8],
      [5, -5, 1000000, -1000000],
    ],
  ];
  const r = random(7);
  for (let i = 0; i < 200; i++) {
    const a = Array.from({ length: 16 }, () => Math.floor(r() * 256) - 128);
    const b = Array.from({ length: 16 }, () => Math.floor(r() * 128));
    const c = Array.from({ length: 4 }, () => Math.floor(r() * 4294967296) - 2147483648);
    det.push([a, b, c]);
  }
  for (const [a, b, c] of det) {
    const got = probe(a, b, c);
    const want = [0, 1, 2, 3].map((l) =>
      laneDot(a.slice(4 * l, 4 * l + 4), b.slice(4 * l, 4 * l + 4), c[l], true, false),
    );
    if (got.join() !== want.join()) failures.push(`dot(${a}; ${b}; ${c}) = ${got}, expected ${want}`);
    const got16 = probe16(a, b),
      want16 = pairs(a, b, true, false);
    if (got16.join() !== want16.join()) failures.push(`dot16(${a}; ${b}) = ${got16}, expected ${want16}`);
  }
  // implementation-defined: bytes of b with the top bit set; the result must be one the spec allows
  const loose = [
    [Array(16).fill(-128), Array(16).fill(255), [0, 0, 0, 0]],
    [Array(16).fill(127), Array(16).fill(128), [0, 0, 0, 0]],
    [Array(16).fill(-128), Array(16).fill(128), [0, 0, 0, 0]],
    [
      [127, 127, -128, -128, 1, -1, 100, 100, -128, 127, 0, 0, 64, 64, -64, -64],
      [200, 200, 200, 200, 128, 255, 255, 129, 255, 1, 255, 255, 130, 130, 250, 250],
      [0, 7, -7, 1],
    ],
  ];
  const seen = new Set();
  for (const [a, b, c] of loose) {
    const got = probe(a, b, c);
    const modes = [];
    for (const bSigned of [true, false])
      for (const saturate of [false, true]) {
        const want = [0, 1, 2, 3].map((l) =>
          laneDot(a.slice(4 * l, 4 * l + 4), b.slice(4 * l, 4 * l + 4), c[l], bSigned, saturate),
        );
        if (got.join() === want.join())
          modes.push(`${bSigned ? 'signed' : 'unsigned'} b${saturate ? ', saturating' : ''}`);
      }
    if (modes.length === 0) failures.push(`dot(${a}; ${b}; ${c}) = ${got}: none of the results the spec allows`);
    else seen.add(modes.join(' | '));
    const got16 = probe16(a, b).join();
    const modes16 = [];
    for (const bSigned of [true, false])
      for (const saturate of [false, true])
        if (pairs(a, b, bSigned, saturate).join() === got16)
          modes16.push(`int16 form: ${bSigned ? 'signed' : 'unsigned'} b${saturate ? ', saturating' : ', wrapping'}`);
    if (modes16.length === 0) failures.push(`dot16(${a}; ${b}) = ${got16}: none of the results the spec allows`);
    else seen.add(modes16.join(' | '));
  }
  // the kernels on integer inputs: d = 1 (max|x| = 16383 or 8191 in every group), scales 1, so y is an
  // exact integer sum of code * x
  const K = 64,
    N = 3,
    G = K / GROUP;
  const x = new Float32Array(K);
  for (let k = 0; k < K; k++) x[k] = ((k * 7919) % 16383) - 8191;
  const px = alloc(4 * K),
    pxb = alloc(2 * K),
    pd = alloc(4 * G),
    pxs = alloc(4 * G),
    psq = alloc(4 * G),
    psc = alloc(4 * N * G),
    py = alloc(4 * N),
    pw = alloc(N * K);
  new Float32Array(memory.buffer, psc, N * G).fill(1);
  const kat = (bits, offset, codes, xv, kernel = bits === 4 ? 'q4_relaxed' : 'q8_relaxed') => {
    new Float32Array(memory.buffer, px, K).set(xv);
    exports.quantize_x_split(px, pxb, pd, pxs, psq, 1, K, bits === 4 ? 15 : 14);
    if (bits === 4) {
      const packed = new Uint8Array(memory.buffer, pw, (N * K) / 2);
      for (let n = 0; n < N; n++)
        for (let g = 0; g < G; g++)
          for (let j = 0; j < 16; j++)
            packed[n * (K / 2) + g * 16 + j] = codes[n * K + g * 32 + j] | (codes[n * K + g * 32 + 16 + j] << 4);
      exports[kernel](pxb, pd, pxs, psq, pw, psc, 0, offset, py, 1, N, K);
    } else {
      new Int8Array(memory.buffer, pw, N * K).set(codes);
      exports.q8_relaxed(pxb, pd, pxs, psq, pw, psc, 0, offset, py, 1, N, K);
    }
    const got = Array.from(new Float32Array(memory.buffer, py, N));
    const want = [];
    for (let n = 0; n < N; n++) {
      let s = 0;
      for (let k = 0; k < K; k++) s += (codes[n * K + k] - offset) * xv[k];
      want.push(s);
    }
    if (got.join() !== want.join()) failures.push(`${kernel} offset ${offset}: y = ${got}, expected ${want}`);
  };
  const x15 = Float32Array.from(x, (v, k) => (k % 32 === 3 ? 16383 : k % 32 === 9 ? -16383 : v));
  const x14 = Float32Array.from(x, (v, k) => (k % 32 === 5 ? -8191 : k % 32 === 30 ? 8191 : Math.trunc(v / 2)));
  const c4 = Array.from({ length: N * K }, (_, i) => (i < K ? 15 : i < 2 * K ? 0 : (i * 5) % 16));
  const c8 = Array.from({ length: N * K }, (_, i) =>
    i < K ? 127 : i < 2 * K ? -128 + (i % 2) : ((i * 37) % 255) - 127,
  );
  kat(4, 0, c4, x15);
  kat(4, 8, c4, x15);
  kat(4, 0, c4, x15, 'q4_relaxed16');
  kat(4, 8, c4, x15, 'q4_relaxed16');
  kat(8, 0, c8, x14);
  kat(
    8,
    1,
    c8.map((v) => Math.max(v, -127)),
    x14,
  );
  return { ok: failures.length === 0, failures, implementationDefined: [...seen] };
}

// ---- the products ----------------------------------------------------------------------------------------

function makeShape(exports, memory, alloc, N, K, seed) {
  const r = random(seed),
    G = K / GROUP;
  const m = {
    N,
    K,
    G,
    x: alloc(4 * K),
    xq: alloc(2 * K),
    xb: alloc(2 * K),
    d: alloc(4 * G),
    xs: alloc(4 * G),
    sq: alloc(4 * G),
    y: alloc(4 * N),
    packed: alloc((N * K) / 2),
    codes: alloc(N * K),
    scales: alloc(4 * N * G),
    mins: alloc(4 * N * G),
    w: alloc(4 * N * K),
    scratch: alloc(4 * G),
  };
  const x = new Float32Array(memory.buffer, m.x, K);
  for (let k = 0; k < K; k++) x[k] = (r() + r() + r() - 1.5) * (k % 97 === 0 ? 8 : 1); // a few outliers
  const packed = new Uint8Array(memory.buffer, m.packed, (N * K) / 2);
  for (let i = 0; i < packed.length; i++) packed[i] = Math.floor(r() * 256);
  const codes = new Int8Array(memory.buffer, m.codes, N * K);
  for (let i = 0; i < codes.length; i++) codes[i] = Math.floor(r() * 255) - 127;
  const scales = new Float32Array(memory.buffer, m.scales, N * G);
  const mins = new Float32Array(memory.buffer, m.mins, N * G);
  for (let i = 0; i < scales.length; i++) ((scales[i] = 0.002 + 0.01 * r()), (mins[i] = -0.08 * r()));
  const w = new Float32Array(memory.buffer, m.w, N * K);
  for (let i = 0; i < w.length; i++) w[i] = (r() - 0.5) * 0.1;
  return m;
}

// The variants: [name, form, function that computes y from m.x].
function variants(e) {
  return [
    [
      'q4 plain',
      'q4',
      (m, off, mins) => (
        e.quantize_x(m.x, m.xq, m.d, m.xs, 1, m.K),
        e.q4_fast(m.xq, m.d, m.xs, m.packed, m.scales, mins, off, m.y, 1, m.N, m.K)
      ),
    ],
    [
      'q4 relaxed',
      'q4',
      (m, off, mins) => (
        e.quantize_x_split(m.x, m.xb, m.d, m.xs, m.sq, 1, m.K, 15),
        e.q4_relaxed(m.xb, m.d, m.xs, m.sq, m.packed, m.scales, mins, off, m.y, 1, m.N, m.K)
      ),
    ],
    [
      'q4 relaxed16',
      'q4',
      (m, off, mins) => (
        e.quantize_x_split(m.x, m.xb, m.d, m.xs, m.sq, 1, m.K, 15),
        e.q4_relaxed16(m.xb, m.d, m.xs, m.sq, m.packed, m.scales, mins, off, m.y, 1, m.N, m.K)
      ),
    ],
    [
      'q4 relaxed x8',
      'q4',
      (m, off, mins) => (
        e.quantize_x_split(m.x, m.xb, m.d, m.xs, m.sq, 1, m.K, 8),
        e.q4_relaxed_x8(m.xb, m.d, m.xs, m.sq, m.packed, m.scales, mins, off, m.y, 1, m.N, m.K)
      ),
    ],
    [
      'q8 plain',
      'q8',
      (m, off, mins) => (
        e.quantize_x(m.x, m.xq, m.d, m.xs, 1, m.K),
        e.q8_fast(m.xq, m.d, m.xs, m.codes, m.scales, mins, off, m.y, 1, m.N, m.K)
      ),
    ],
    [
      'q8 relaxed',
      'q8',
      (m, off, mins) => (
        e.quantize_x_split(m.x, m.xb, m.d, m.xs, m.sq, 1, m.K, 14),
        e.q8_relaxed(m.xb, m.d, m.xs, m.sq, m.codes, m.scales, mins, off, m.y, 1, m.N, m.K)
      ),
    ],
    // float32 products with relaxed madd (the exact arithmetic: no quantized x)
    ['f32 plain', 'f32', (m) => e.dense(m.x, m.w, m.y, 1, m.N, m.K)],
    ['f32 madd', 'f32', (m) => e.dense_madd(m.x, m.w, m.y, m.N, m.K)],
    ['q4x plain', 'q4x', (m, o, mins) => e.q4_exact(m.x, m.packed, m.scales, mins, o, m.y, m.scratch, 1, m.N, m.K)],
    ['q4x madd', 'q4x', (m, o, mins) => e.q4_exact_madd(m.x, m.packed, m.scales, mins, o, m.y, m.scratch, m.N, m.K)],
  ];
}
// the step of x's quantization per group, as a fraction of max|x|, for each variant
const STEP = {
  'q4 plain': 32767,
  'q4 relaxed': 16383,
  'q4 relaxed16': 16383,
  'q4 relaxed x8': 127,
  'q8 plain': 32767,
  'q8 relaxed': 8191,
};

// Each variant against the exact product in float64: max |y - exact| and its ratio to the fast path's
// bound (half a quantization step of x per group times sum |code - offset| * scale, as in
// tests/test_kernels.py), for q4 with mins (Q4_1), q4 with offset 8 (Q4_0) and q8 (Q8_0). The exact
// products (f32, q4x) against the exact path's bound instead: 1e-5 sum |w| |x|.
function accuracy(e, memory, m) {
  const out = [];
  const x = new Float32Array(memory.buffer, m.x, m.K);
  const amax = [];
  for (let g = 0; g < m.G; g++) amax.push(Math.max(...Array.from(x.subarray(g * GROUP, g * GROUP + GROUP), Math.abs)));
  const rows = Math.min(m.N, 2048);
  for (const [name, form, run] of variants(e)) {
    const exactForm = form === 'f32' || form === 'q4x';
    const weightKinds = {
      q4: [
        ['q4_1', 0, true],
        ['q4_0', 8, false],
      ],
      q4x: [
        ['q4_1', 0, true],
        ['q4_0', 8, false],
      ],
      q8: [['q8_0', 0, false]],
      f32: [['f32', 0, false]],
    };
    for (const [label, off, withMins] of weightKinds[form]) {
      run(m, off, withMins ? m.mins : 0);
      const y = new Float32Array(memory.buffer, m.y, m.N);
      const packed = new Uint8Array(memory.buffer, m.packed, (m.N * m.K) / 2);
      const codes = new Int8Array(memory.buffer, m.codes, m.N * m.K);
      const scales = new Float32Array(memory.buffer, m.scales, m.N * m.G);
      const mins = new Float32Array(memory.buffer, m.mins, m.N * m.G);
      const wf = new Float32Array(memory.buffer, m.w, m.N * m.K);
      let worst = 0,
        worstRatio = 0;
      for (let n = 0; n < rows; n++) {
        let exact = 0,
          bound = 0,
          S = 0;
        for (let g = 0; g < m.G; g++) {
          const s = scales[n * m.G + g];
          let gs = 0;
          for (let j = 0; j < GROUP; j++) {
            const k = g * GROUP + j;
            let c;
            if (form === 'f32') {
              exact += wf[n * m.K + k] * x[k];
              S += Math.abs(wf[n * m.K + k] * x[k]);
              continue;
            }
            if (form === 'q4' || form === 'q4x') {
              const byte = packed[n * (m.K / 2) + g * 16 + (j % 16)];
              c = (j < 16 ? byte & 15 : byte >> 4) - off;
            } else c = codes[n * m.K + k] - off;
            const w = s * c + (withMins ? mins[n * m.G + g] : 0);
            exact += w * x[k];
            S += Math.abs(w * x[k]);
            gs += Math.abs(s * c);
          }
          if (!exactForm) bound += (gs * amax[g]) / STEP[name] / 2;
        }
        const err = Math.abs(y[n] - exact);
        worst = Math.max(worst, err);
        const allowed = exactForm ? 1e-5 * S + 1e-30 : bound * 1.001 + 1e-4;
        worstRatio = Math.max(worstRatio, err / allowed);
      }
      out.push({ variant: name, weights: label, shape: `${m.N}x${m.K}`, maxError: worst, ofBound: worstRatio });
    }
  }
  return out;
}

const median = (a) => {
  const s = [...a].sort((p, q) => p - q);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

export async function runBench(bytes, { reps = 15, targetMs = 25, log = () => {} } = {}) {
  const memory = new WebAssembly.Memory({ initial: 1200, maximum: 4096 });
  const valid = WebAssembly.validate(bytes);
  if (!valid) return { valid };
  const { instance } = await WebAssembly.instantiate(bytes, { env: { memory } });
  const e = instance.exports;
  const test = selfTest(e, memory);
  const alloc = arena(memory);
  const shapes = SHAPES.map(([N, K], i) => makeShape(e, memory, alloc, N, K, 11 + i));
  const acc = shapes.flatMap((m) => accuracy(e, memory, m));
  const vs = variants(e);
  // calibrate: calls per timing so that each takes ~targetMs
  const calls = new Map();
  for (const m of shapes)
    for (const [name, , run] of vs) {
      for (let i = 0; i < 3; i++) run(m, 0, name.startsWith('q4') ? m.mins : 0); // warm up (and tier up)
      const t0 = performance.now();
      run(m, 0, name.startsWith('q4') ? m.mins : 0);
      calls.set(`${name} ${m.N}x${m.K}`, Math.max(1, Math.round(targetMs / Math.max(performance.now() - t0, 0.01))));
    }
  const times = new Map();
  for (let rep = 0; rep < reps; rep++) {
    for (const m of shapes) {
      const order = rep % 2 ? [...vs].reverse() : vs;
      for (const [name, , run] of order) {
        const key = `${name} ${m.N}x${m.K}`,
          n = calls.get(key),
          mins = name.startsWith('q4') ? m.mins : 0;
        const t0 = performance.now();
        for (let i = 0; i < n; i++) run(m, 0, mins);
        const us = ((performance.now() - t0) * 1000) / n;
        if (!times.has(key)) times.set(key, []);
        times.get(key).push(us);
      }
    }
    log(`round ${rep + 1}/${reps}`);
  }
  const rows = [];
  for (const m of shapes)
    for (const [name, form] of vs) {
      if (name.endsWith('plain')) continue;
      const plain = times.get(`${form} plain ${m.N}x${m.K}`),
        mine = times.get(`${name} ${m.N}x${m.K}`);
      rows.push({
        shape: `${m.N}x${m.K}`,
        variant: name,
        plainUs: median(plain),
        relaxedUs: median(mine),
        speedup: median(plain.map((p, i) => p / mine[i])),
        speedupMin: Math.min(...plain.map((p, i) => p / mine[i])),
        speedupMax: Math.max(...plain.map((p, i) => p / mine[i])),
      });
    }
  return { valid, selfTest: test, accuracy: acc, timings: rows, reps };
}

export function format(result) {
  const lines = [];
  if (!result.valid) return 'the module does not validate (no relaxed SIMD in this engine)';
  const { ok, failures } = result.selfTest;
  lines.push(
    `known-answer test: ${ok ? 'passed' : `FAILED (${failures.length} cases), e.g. ${failures.slice(0, 2).join('; ')}`}`,
  );
  lines.push(`implementation-defined cases: ${result.selfTest.implementationDefined.join('; ')}`);
  lines.push("accuracy (max |y - exact|, and its ratio to the fast path's bound; <= 1 is within):");
  for (const a of result.accuracy)
    lines.push(
      `  ${a.shape.padEnd(9)} ${a.variant.padEnd(14)} ${a.weights}  ${a.maxError.toExponential(2)}  ${a.ofBound.toFixed(3)}`,
    );
  lines.push(`timings (T=1, median of ${result.reps} interleaved rounds, us per product incl. quantizing x):`);
  for (const t of result.timings)
    lines.push(
      `  ${t.shape.padEnd(9)} ${t.variant.padEnd(14)} plain ${t.plainUs.toFixed(1).padStart(8)}  relaxed ${t.relaxedUs.toFixed(1).padStart(8)}  ` +
        `speedup x${t.speedup.toFixed(3)} (rounds ${t.speedupMin.toFixed(2)}-${t.speedupMax.toFixed(2)})`,
    );
  return lines.join('\n');
}

// ---- Node ------------------------------------------------------------------------------------------------

if (typeof process !== 'undefined' && process.argv?.[1] && import.meta.url.endsWith(process.argv[1].split('/').pop())) {
  const { readFileSync, writeFileSync, existsSync, mkdirSync } = await import('node:fs');
  const { execFileSync } = await import('node:child_process');
  const path = await import('node:path');
  const { fileURLToPath } = await import('node:url');
  const here = path.dirname(fileURLToPath(import.meta.url));
  const root = path.resolve(here, '../..');
  const out = path.join(root, 'build/relaxed/relaxed.wasm');
  const args = process.argv.slice(2);
  const opt = (name, dflt) => (args.includes(name) ? args[args.indexOf(name) + 1] : dflt);
  if (args.includes('--build') || !existsSync(out)) buildModule(root, out, { execFileSync, mkdirSync });
  const result = await runBench(readFileSync(out), { reps: Number(opt('--reps', 15)), log: (s) => console.error(s) });
  result.engine = `node ${process.version} ${process.execArgv.join(' ')}`.trim();
  console.log(result.engine + '\n' + format(result));
  if (opt('--json')) writeFileSync(opt('--json'), JSON.stringify(result, null, 1));
}

export function buildModule(root, out, { execFileSync, mkdirSync }) {
  const clang = '/usr/lib/llvm-19/bin/clang';
  const obj = out.replace(/\.wasm$/, '.o');
  mkdirSync(out.slice(0, out.lastIndexOf('/')), { recursive: true });
  const flags = [
    '--target=wasm32',
    '-O3',
    '-msimd128',
    '-mrelaxed-simd',
    '-nostdlib',
    '-ffreestanding',
    '-fno-builtin',
  ];
  execFileSync(
    clang,
    [...flags, '-Wall', '-Wextra', '-Werror', '-c', '-o', obj, `${root}/benchmarks/relaxed/relaxed.c`],
    { stdio: 'inherit' },
  );
  execFileSync(
    clang,
    ['--target=wasm32', '-nostdlib', '-Wl,--no-entry', '-Wl,--import-memory', '-Wl,--strip-all', '-o', out, obj],
    {
      stdio: 'inherit',
    },
  );
  execFileSync('python3', [`${root}/kernels/check.py`, obj, out], { stdio: 'inherit' });
}
