/**
 * The decode plan on a WebGPU device: the memory the plan's buffers, the KV cache and the weights live
 * in, and the executor of its programs (py_src/ruvllm/model/plan.py writes them; kernels.c run_plan is the
 * CPU's executor of the same programs).
 *
 * Memory: Python sees the kernels' memory as addresses (KernelMemory). Here an address is virtual: each
 * `region` is a GPU buffer of its own (several of whole rows, for a matrix past the largest binding) at a
 * range of a 32-bit address space handed out as the thread pool's memory hands out its regions
 * (pool-memory.js), so the plan's steps, which carry addresses and offsets into them (qkv + 4 H E),
 * resolve to a buffer and an offset. `write` and `fetch` copy bytes in
 * and out; `plan` runs a program for T rows: the call's inputs written, every step a few dispatches in
 * one compute pass, one submit, and one readback of the outputs asked for.
 *
 * A program's words, the state and the cache table are read here to size each dispatch (the rows, the
 * slots in use): regions of at most SHADOW_BYTES keep a copy in JavaScript of what was written to them.
 */

import { PARAM_STRIDE, PARAM_WORDS, PRODUCT_ROWS, SHADERS, WORKGROUP, brokenOn } from './shaders.js';

/** kernels.c's step opcodes (plan.py's END ... LORA), words per step, and a product's flags. */
const OP = { END: 0, NORM: 1, PRODUCT: 2, BIAS: 3, ROPE: 4, APPEND: 5, ATTEND: 6, ADD: 7, GATED: 8, COPY: 9, LORA: 10 };
const STEP_WORDS = 16;
/** The product shader of each form (plan.py's FORMS: dense, q8, q8h, q4). */
const FORM_SHADERS = ['dense', 'q8', 'q8h', 'q4'];
const TAIL = 2;
const HALF = 4; // (scales and mins in float16)
/** Regions this small keep a JavaScript copy of what is written to them (programs, state, tables). */
const SHADOW_BYTES = 1 << 20;
/** The first address handed out (0 means "none" to the plan: a product without mins). */
const FIRST_ADDRESS = 256;
const ALIGN = 256;
/** A pick's blocks: at least PICK_BLOCK logits each, at most PICK_GROUPS of them (the merge's candidates: K each). */
const PICK_BLOCK = 1024;
const PICK_GROUPS = 256;
/** Workgroups along one dimension of a dispatch (WebGPU's default maxComputeWorkgroupsPerDimension). */
const MAX_GROUPS = 65535;

/** WebGPU's flags (the spec's values: not every runtime defines GPUBufferUsage and the rest globally). */
const USAGE = { MAP_READ: 0x1, COPY_SRC: 0x4, COPY_DST: 0x8, UNIFORM: 0x40, STORAGE: 0x80 };
const COMPUTE_STAGE = 0x4;
const MAP_READ = 0x1;

const align = (n, to) => Math.ceil(n / to) * to;
const f32Bits = (value) => new Uint32Array(new Float32Array([value]).buffer)[0];
const ONE = f32Bits(1);

/**
 * @typedef {{ start: number, bytes: number, buffer: GPUBuffer }} Chunk  a buffer holding bytes start.. of a region
 * @typedef {{ at: number, bytes: number, chunks: Chunk[], shadow: Uint8Array | null }} Region
 * @typedef {{ shader: string, buffers: GPUBuffer[], params: number[], groups: [number, number, number],
 *   weightBytes?: number }} Dispatch
 * @typedef {{ module: GPUShaderModule, layout: GPUBindGroupLayout, pipeline: GPUComputePipeline }} Pipeline
 */

export class GpuExecutor {
  /** @type {Region[]} sorted by address */
  #regions = [];
  #free = []; // released ranges of the address space, { at, bytes }
  #top = FIRST_ADDRESS;
  #ids = 0;
  #bindGroups = new Map();
  /** @type {GPUBuffer | null} the uniform buffer of a call's Params blocks */
  #params = null;
  /** @type {GPUBuffer | null} attention's scores, T * H * S floats */
  #scores = null;
  /** @type {GPUBuffer | null} where a call's outputs are copied to be read */
  #readback = null;
  /** @type {GPUBuffer | null} a pick's candidates, each block's */
  #found = null;
  /** @type {{ at: number, N: number } | null} the last row of logits the last call's program wrote */
  #logits = null;
  /** What the last plan call did: dispatches, submits, bytes read back (the tests' figures). */
  last = { dispatches: 0, submits: 0, readBytes: 0, weightBytes: 0 };
  /**
   * Everything so far: plan calls, their submits and dispatches, bytes read back and written, and the
   * bytes of weights the products read (the benchmark's: a decoded token reads each matrix once).
   */
  totals = { calls: 0, submits: 0, dispatches: 0, readBytes: 0, writtenBytes: 0, weightBytes: 0 };

  /**
   * @param {GPUDevice} device
   * @param {Record<string, Pipeline>} pipelines
   */
  constructor(device, pipelines, maxBinding = Infinity) {
    this.device = device;
    this.pipelines = pipelines;
    /** The largest buffer one binding may hold: the device's, or less where asked (the tests' splits). */
    this.maxBinding = Math.min(device.limits.maxStorageBufferBindingSize, maxBinding);
    // stand-ins for absent operands, a different one for each binding of a dispatch (two writable
    // bindings of one buffer are refused)
    this.dummies = Array.from({ length: 4 }, () => device.createBuffer({ size: 256, usage: USAGE.STORAGE }));
  }

  /**
   * An executor on `device`, its shaders compiled.
   * @param {GPUDevice} device
   * @param {{ broken?: string | null, maxBinding?: number }} [options] the tests' hooks: broken, a shader
   *   whose output is scaled by 1.5 (shaders.js brokenOn); maxBinding, bytes of the largest binding to
   *   use, below the device's (matrices split in parts)
   */
  static async create(device, { broken = null, maxBinding = Infinity } = {}) {
    const pipelines = {};
    device.pushErrorScope('validation');
    for (const [name, { code, bindings }] of Object.entries(SHADERS)) {
      const source = name === broken ? brokenOn(code) : code;
      const module = device.createShaderModule({ code: source, label: name });
      const layout = device.createBindGroupLayout({
        label: name,
        entries: [
          {
            binding: 0,
            visibility: COMPUTE_STAGE,
            buffer: { type: 'uniform', hasDynamicOffset: true, minBindingSize: 4 * PARAM_WORDS },
          },
          ...bindings.map((kind, i) => ({
            binding: i + 1,
            visibility: COMPUTE_STAGE,
            buffer: { type: /** @type {GPUBufferBindingType} */ (kind === 'read' ? 'read-only-storage' : 'storage') },
          })),
        ],
      });
      const pipeline = await device.createComputePipelineAsync({
        label: name,
        layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
        compute: { module, entryPoint: 'main' },
      });
      pipelines[name] = { module, layout, pipeline };
    }
    const error = await device.popErrorScope();
    if (error) throw new Error(`WebGPU refused the plan's shaders: ${error.message}`);
    return new GpuExecutor(device, pipelines, maxBinding);
  }

  /** Bytes of GPU memory the regions hold. */
  get bytes() {
    return this.#regions.reduce((sum, r) => sum + r.chunks.reduce((n, c) => n + c.buffer.size, 0), 0);
  }

  // ---- memory ----

  /**
   * A new region of `bytes` bytes (zeroed): its address. One buffer holds it, or, past the largest binding
   * (maxStorageBufferBindingSize, or the `maxBinding` asked for), several, each a whole number of its rows
   * of `rowBytes` (a matrix too large for one binding: its products run a dispatch per part).
   */
  region(bytes, rowBytes = 0) {
    const size = align(Math.max(bytes, 4), 4);
    const limit = this.maxBinding;
    let per = size;
    if (size > limit) {
      // whole rows, a multiple of 16 bytes in all (the shaders read codes in 16-byte words)
      const step = rowBytes > 0 ? 16 / gcd(rowBytes, 16) : 0;
      const rows = step ? Math.floor(limit / rowBytes / step) * step : 0;
      if (!rows)
        throw new Error(
          `a buffer of ${size} bytes is over this GPU's largest binding (${limit} bytes), and not a matrix of rows to split`,
        );
      per = rows * rowBytes;
    }
    const at = this.#alloc(align(size, ALIGN));
    const chunks = [];
    for (let start = 0; start < size; start += per) {
      const length = Math.min(per, size - start);
      const usage = USAGE.STORAGE | USAGE.COPY_SRC | USAGE.COPY_DST;
      chunks.push({ start, bytes: length, buffer: this.device.createBuffer({ size: align(length, 4), usage }) });
    }
    const shadow = size <= SHADOW_BYTES ? new Uint8Array(size) : null;
    const region = { at, bytes: size, chunks, shadow };
    const i = this.#regions.findIndex((r) => r.at > at);
    this.#regions.splice(i < 0 ? this.#regions.length : i, 0, region);
    return at;
  }

  /** Release the region at `at` (its buffers are destroyed). */
  free(at) {
    const i = this.#regions.findIndex((r) => r.at === at);
    if (i < 0) throw new Error(`no GPU region starts at ${at}`);
    const [region] = this.#regions.splice(i, 1);
    for (const chunk of region.chunks) chunk.buffer.destroy();
    this.#free.push({ at: region.at, bytes: align(region.bytes, ALIGN) });
    this.#bindGroups.clear(); // (some held its buffers)
  }

  #alloc(bytes) {
    let best = -1;
    this.#free.forEach((r, i) => {
      if (r.bytes >= bytes && (best < 0 || r.bytes < this.#free[best].bytes)) best = i;
    });
    if (best >= 0) {
      const range = this.#free[best];
      if (range.bytes > bytes) this.#free[best] = { at: range.at + bytes, bytes: range.bytes - bytes };
      else this.#free.splice(best, 1);
      return range.at;
    }
    const at = this.#top;
    if (at + bytes > 2 ** 32) throw new Error('the GPU memory of the decode plan is past 4 GiB of addresses');
    this.#top += bytes;
    return at;
  }

  /** The region holding address `at` and the offset there, checking that `bytes` bytes fit. */
  resolve(at, bytes = 0) {
    const regions = this.#regions;
    let lo = 0;
    let hi = regions.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const r = regions[mid];
      if (at < r.at) hi = mid - 1;
      else if (at >= r.at + r.bytes) lo = mid + 1;
      else {
        if (at + bytes > r.at + r.bytes)
          throw new Error(`${bytes} bytes at ${at} run past the end of their GPU region (${r.bytes} bytes at ${r.at})`);
        return { region: r, offset: at - r.at };
      }
    }
    throw new Error(`address ${at} is in no GPU region`);
  }

  /** `data` written at address `at`. */
  async write(at, data) {
    const { region, offset } = this.resolve(at, data.byteLength);
    this.totals.writtenBytes += data.byteLength;
    region.shadow?.set(data, offset);
    for (const { chunk, from, to } of pieces(region, offset, data.byteLength)) {
      const part = data.subarray(from - offset, to - offset);
      const local = from - chunk.start;
      if (local % 4 === 0 && part.byteLength % 4 === 0) {
        this.device.queue.writeBuffer(chunk.buffer, local, part);
        continue;
      }
      // (WebGPU writes whole words: the words around the bytes are read first)
      const start = local - (local % 4);
      const words = await this.#read(chunk.buffer, start, align(local + part.byteLength, 4) - start);
      words.set(part, local - start);
      this.device.queue.writeBuffer(chunk.buffer, start, words);
    }
  }

  /** `bytes` bytes at address `at`, copied out. */
  async fetch(at, bytes) {
    const { region, offset } = this.resolve(at, bytes);
    const out = new Uint8Array(bytes);
    for (const { chunk, from, to } of pieces(region, offset, bytes)) {
      const local = from - chunk.start;
      const start = local - (local % 4);
      const words = await this.#read(chunk.buffer, start, align(local + to - from, 4) - start);
      out.set(words.subarray(local - start, local - start + to - from), from - offset);
    }
    return out;
  }

  async #read(buffer, offset, bytes) {
    const staging = this.device.createBuffer({ size: bytes, usage: USAGE.MAP_READ | USAGE.COPY_DST });
    const encoder = this.device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffer, offset, staging, 0, bytes);
    this.device.queue.submit([encoder.finish()]);
    await staging.mapAsync(MAP_READ);
    const out = new Uint8Array(staging.getMappedRange().slice(0));
    staging.destroy();
    return out;
  }

  /** `count` int32 words at address `at`, from the region's JavaScript copy. */
  words(at, count) {
    const { region, offset } = this.resolve(at, 4 * count);
    if (!region.shadow) throw new Error(`the words at ${at} are in a GPU region too large to be read as a program`);
    return new Int32Array(region.shadow.buffer, offset, count);
  }

  // ---- running a program ----

  /**
   * Run the program at `program` with the state at `state` for `T` rows (kernels.c run_plan): `inputs`
   * written first, `outputs` ({ at, bytes }) read back after, in order.
   * @param {number} program
   * @param {number} state
   * @param {number} T
   * @param {{ at: number, data: Uint8Array }[]} inputs
   * @param {{ at: number, bytes: number }[]} outputs
   * @param {number} [pick] K > 0: the logits' K largest (the pick shaders) go to the one output in place
   *   of the logits, as words [non-finite logits, K ids, K float32 values] (plan.py TopLogits)
   */
  async plan(program, state, T, inputs, outputs, pick = 0) {
    for (const { at, data } of inputs) await this.write(at, data);
    const dispatches = this.#dispatches(program, this.words(state, 8), T);
    if (pick) dispatches.push(...this.#pick(pick, outputs));
    const device = this.device;
    device.pushErrorScope('validation');
    device.pushErrorScope('out-of-memory');
    const params = new Uint32Array((dispatches.length * PARAM_STRIDE) / 4 || 1);
    dispatches.forEach((d, i) => params.set(d.params, (i * PARAM_STRIDE) / 4));
    if (!this.#params || this.#params.size < params.byteLength) {
      this.#params?.destroy();
      this.#params = device.createBuffer({
        size: align(Math.max(params.byteLength, 4096), 4096),
        usage: USAGE.UNIFORM | USAGE.COPY_DST,
      });
      this.#bindGroups.clear();
    }
    device.queue.writeBuffer(this.#params, 0, params);
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    /** @type {GPUComputePipeline | null} */
    let current = null;
    dispatches.forEach((d, i) => {
      const { pipeline } = this.pipelines[d.shader];
      if (current !== pipeline) pass.setPipeline((current = pipeline));
      pass.setBindGroup(0, this.#bindGroup(d), [i * PARAM_STRIDE]);
      pass.dispatchWorkgroups(d.groups[0], d.groups[1], d.groups[2]);
    });
    pass.end();
    const total = outputs.reduce((sum, o) => sum + align(o.bytes, 4), 0);
    /** @type {GPUBuffer | null} */
    let staging = null;
    if (total) {
      if (!this.#readback || this.#readback.size < total) {
        this.#readback?.destroy();
        this.#readback = device.createBuffer({
          size: align(total, 4096),
          usage: USAGE.MAP_READ | USAGE.COPY_DST,
        });
      }
      staging = this.#readback;
      let put = 0;
      for (const { at, bytes } of outputs) {
        const { buffer, index } = this.#floats(at - (at % 4), Math.ceil(bytes / 4));
        const length = align((at % 4) + bytes, 4);
        encoder.copyBufferToBuffer(buffer, 4 * index, staging, put, length);
        put += length;
      }
    }
    device.queue.submit([encoder.finish()]);
    const oom = await device.popErrorScope();
    const refused = (await device.popErrorScope()) ?? oom; // (both scopes popped, whichever caught it)
    if (refused) throw new Error(`WebGPU refused the decode plan's work: ${refused.message}`);
    const weightBytes = dispatches.reduce((sum, d) => sum + (d.weightBytes ?? 0), 0);
    this.last = { dispatches: dispatches.length, submits: 1, readBytes: total, weightBytes };
    const { totals } = this;
    totals.weightBytes += weightBytes;
    totals.calls += 1;
    totals.submits += 1;
    totals.dispatches += dispatches.length;
    totals.readBytes += total;
    if (!staging) {
      await device.queue.onSubmittedWorkDone();
      return [];
    }
    await staging.mapAsync(MAP_READ, 0, align(total, 4));
    const mapped = new Uint8Array(staging.getMappedRange(0, align(total, 4)));
    const results = [];
    let get = 0;
    for (const { at, bytes } of outputs) {
      const skip = at % 4; // (copies start at the word holding the first byte; regions are word aligned)
      results.push(mapped.slice(get + skip, get + skip + bytes));
      get += align(skip + bytes, 4);
    }
    staging.unmap();
    return results;
  }

  #bindGroup({ shader, buffers }) {
    const key = `${shader}:${buffers.map((b) => this.#bufferId(b)).join(',')}`;
    let group = this.#bindGroups.get(key);
    if (!group) {
      group = this.device.createBindGroup({
        layout: this.pipelines[shader].layout,
        entries: [
          { binding: 0, resource: { buffer: this.#params, size: 4 * PARAM_WORDS } },
          ...buffers.map((buffer, i) => ({ binding: i + 1, resource: { buffer } })),
        ],
      });
      this.#bindGroups.set(key, group);
    }
    return group;
  }

  #bufferIds = new WeakMap();
  #bufferId(buffer) {
    let id = this.#bufferIds.get(buffer);
    if (id === undefined) this.#bufferIds.set(buffer, (id = ++this.#ids));
    return id;
  }

  /** The float32 at address `at` (and `count` after it, in the same buffer): its buffer and its index there. */
  #floats(at, count = 0) {
    const { region, offset } = this.resolve(at >>> 0, 4 * count);
    if (offset % 4) throw new Error(`address ${at} of a float32 array is not a multiple of 4`);
    if (region.chunks.length > 1)
      throw new Error(
        `an array of ${region.bytes} bytes is over this GPU's largest binding (${this.maxBinding} bytes); ` +
          'only a matrix is split into parts',
      );
    return { buffer: region.chunks[0].buffer, index: offset / 4 };
  }

  /**
   * A matrix's rows as parts that each lie in one buffer, whose first row is r0: rows [r0, r1) and that
   * buffer, of the region at `at` (rows of `rowBytes`; 0: an absent operand, `dummy`).
   * @returns {{ r0: number, r1: number, buffer: GPUBuffer }[]}
   */
  #rows(at, rowBytes, N, dummy) {
    if (!at) return [{ r0: 0, r1: N, buffer: dummy }];
    const { region, offset } = this.resolve(at >>> 0, N * rowBytes);
    if (offset) throw new Error('a matrix of the plan does not start its GPU region');
    return region.chunks.map((c) => ({
      r0: c.start / rowBytes,
      r1: Math.min(N, (c.start + c.bytes) / rowBytes),
      buffer: c.buffer,
    }));
  }

  #scoresBuffer(floats) {
    const bytes = align(Math.max(4 * floats, 256), 256);
    if (!this.#scores || this.#scores.size < bytes) {
      this.#scores?.destroy();
      this.#scores = this.device.createBuffer({ size: align(2 * bytes, 65536), usage: USAGE.STORAGE });
      this.#bindGroups.clear();
    }
    return this.#scores;
  }

  /** The dispatches of one call of the program at `program`, for the state's rows. */
  #dispatches(program, state, T) {
    const [rowsT, pos0, last, logits, tap, tapped] = state;
    if (rowsT !== T) throw new Error(`the plan's state says ${rowsT} rows, the call ${T}`);
    this.#logits = null;
    /** @type {Dispatch[]} */
    const out = [];
    const threads = (n) => groupsOf(Math.ceil(n / WORKGROUP));
    for (let at = program >>> 0; ; at += 4 * STEP_WORDS) {
      const s = this.words(at, STEP_WORDS);
      const op = s[0];
      if (op === OP.END) break;
      switch (op) {
        case OP.NORM: {
          const [, x, w, y, heads, E, ldx, ldy, eps, tail] = s;
          let rows = T;
          let xAt = x >>> 0;
          if (tail && last) {
            xAt += 4 * (T - 1) * ldx;
            rows = 1;
          }
          const X = this.#floats(xAt);
          const Y = this.#floats(y);
          const W = this.#floats(w);
          const inPlace = X.buffer === Y.buffer;
          out.push({
            shader: inPlace ? 'norm_in_place' : 'norm',
            buffers: inPlace ? [W.buffer, Y.buffer] : [W.buffer, X.buffer, Y.buffer],
            params: [X.index, Y.index, heads, E, ldx, ldy, eps, W.index],
            groups: groupsOf(rows * heads),
          });
          break;
        }
        case OP.PRODUCT: {
          const [, form, w, scales, mins, offset, N, K, x, y, ldy, , flags] = s;
          if (flags & TAIL && !logits) break;
          const rows = flags & TAIL && last ? 1 : T;
          if (flags & TAIL) this.#logits = { at: (y >>> 0) + 4 * (rows - 1) * ldy, N };
          out.push(...this.#products(form, w, scales, mins, offset, N, K, rows, x, y, ldy, flags & HALF));
          break;
        }
        case OP.BIAS: {
          const [, y, b, N, ldy] = s;
          const Y = this.#floats(y);
          const B = this.#floats(b);
          out.push({
            shader: 'bias',
            buffers: [B.buffer, Y.buffer],
            params: [Y.index, 0, N, ldy, T, B.index],
            groups: threads(T * N),
          });
          break;
        }
        case OP.ROPE: {
          const [, x, cos, sin, heads, E, ldx] = s;
          const X = this.#floats(x);
          const C = this.#floats(cos);
          const S = this.#floats(sin);
          out.push({
            shader: 'rope',
            buffers: [X.buffer, C.buffer, S.buffer],
            params: [X.index, ldx, heads, E, T, C.index, S.index],
            groups: threads((T * heads * E) / 2),
          });
          break;
        }
        case OP.APPEND: {
          const [, src, ld, entryAt, KV, E, which] = s;
          const entry = this.words(entryAt >>> 0, 16);
          const [, , capacity, count] = entry;
          const X = this.#floats(src);
          const C = this.#floats(entry[which]);
          out.push({
            shader: 'append',
            buffers: [X.buffer, C.buffer],
            params: [X.index, ld, KV, E, T, capacity, count - T, C.index],
            groups: threads(T * KV * E),
          });
          break;
        }
        case OP.ATTEND:
          out.push(...this.#attend(s, T, pos0));
          break;
        case OP.ADD: {
          const [, y, x, n] = s;
          const Y = this.#floats(y);
          const X = this.#floats(x);
          out.push({
            shader: 'add',
            buffers: [Y.buffer, X.buffer],
            params: [Y.index, X.index, T * n],
            groups: threads(T * n),
          });
          break;
        }
        case OP.GATED: {
          const [, kind, gu, y, F] = s;
          const G = this.#floats(gu);
          const Y = this.#floats(y);
          out.push({
            shader: 'gated',
            buffers: [G.buffer, Y.buffer],
            params: [kind, G.index, Y.index, F, T],
            groups: threads(T * F),
          });
          break;
        }
        case OP.COPY: {
          const [, layer, x, n] = s;
          if (tap !== layer) break;
          const Y = this.#floats(tapped);
          const X = this.#floats(x);
          out.push({
            shader: 'copy',
            buffers: [Y.buffer, X.buffer],
            params: [Y.index, X.index, T * n],
            groups: threads(T * n),
          });
          break;
        }
        case OP.LORA: {
          const [, x, A, r, K, B, N, y, ldy, scale, low, , gates, count] = s;
          const X = this.#floats(x);
          const L = this.#floats(low);
          const Y = this.#floats(y);
          const [none, other] = this.dummies;
          out.push(this.#product(0, this.#floats(A).buffer, none, other, 0, r, K, T, X, K, L, r, false, false));
          const Gt = this.#floats(gates);
          out.push({
            shader: 'gate',
            buffers: [Gt.buffer, L.buffer],
            params: [L.index, r, T, count, scale, Gt.index],
            groups: threads(T),
          });
          out.push(this.#product(0, this.#floats(B).buffer, none, other, 0, N, r, T, L, r, Y, ldy, false, true));
          break;
        }
        default:
          throw new Error(`the decode plan has a step with an unknown opcode ${op}`);
      }
    }
    return out;
  }

  /**
   * A product step's dispatches: one, or one per part of the rows of a matrix split over several buffers
   * (past the largest binding), each part's rows in one buffer of the codes, of the scales and of the mins.
   * @returns {Dispatch[]}
   */
  #products(form, w, scales, mins, offset, N, K, rows, x, y, ldy, half) {
    const small = (half ? 2 : 4) * (K / 32); // bytes of a row's mins, and of its scales (twice: q8h)
    const bytes = {
      w: [4 * K, K, K, K / 2][form],
      scales: form ? small * (form === 2 ? 2 : 1) : 0,
      mins: mins ? small : 0,
    };
    const W = this.#rows(w, bytes.w, N, null);
    const S = this.#rows(form ? scales : 0, bytes.scales, N, this.dummies[0]);
    const M = this.#rows(mins, bytes.mins, N, this.dummies[1]);
    const X = this.#floats(x);
    const Y = this.#floats(y);
    const cuts = [...new Set([...W, ...S, ...M].map((p) => p.r0).filter((r) => r < N))].sort((a, b) => a - b);
    const at = (parts, r) => parts.find((p) => p.r0 <= r && r < p.r1) ?? parts[0];
    return cuts.map((r0, i) => {
      const r1 = i + 1 < cuts.length ? cuts[i + 1] : N;
      const [wp, sp, mp] = [at(W, r0), at(S, r0), at(M, r0)];
      const Yr = { ...Y, index: Y.index + r0 };
      const d = this.#product(
        form,
        wp.buffer,
        sp.buffer,
        mp.buffer,
        offset,
        r1 - r0,
        K,
        rows,
        X,
        K,
        Yr,
        ldy,
        !!mins,
        false,
      );
      d.params[8] = r0 - wp.r0; // (each row's index in its part's buffers)
      d.params[11] = form ? r0 - sp.r0 : 0;
      d.params[15] = mins ? r0 - mp.r0 : 0;
      if (half) d.shader += '_half';
      d.weightBytes = (r1 - r0) * (bytes.w + bytes.scales + bytes.mins);
      return d;
    });
  }

  /**
   * A product's dispatch: y (rows, N) at Y, row stride ldy, (+)= x (rows, K) at X @ W.T.
   * @returns {Dispatch}
   */
  #product(form, w, scales, mins, offset, N, K, rows, X, ldx, Y, ldy, hasMins, accumulate) {
    if (form && (X.index % 4 || ldx % 4 || K % 32))
      throw new Error(`a quantized product's x is not in whole groups (K ${K}, ldx ${ldx}, at float ${X.index})`);
    const fours = X.index % 4 === 0 && ldx % 4 === 0 && K % 4 === 0;
    const [x, y] = groupsOf(Math.ceil(N / WORKGROUP));
    return {
      shader: form === 0 && fours ? 'dense4' : FORM_SHADERS[form],
      buffers: [w, scales, mins, X.buffer, Y.buffer],
      params: [
        form,
        N,
        K,
        rows,
        X.index,
        ldx,
        Y.index,
        ldy,
        0,
        offset,
        hasMins ? 1 : 0,
        0,
        accumulate ? 1 : 0,
        ONE,
        N,
        0,
      ],
      groups: [x, y, Math.ceil(rows / PRODUCT_ROWS)],
    };
  }

  /**
   * A pick's two dispatches (shaders.js PICK_BLOCKS, PICK_MERGE): the K largest of the logits the last
   * call's program wrote (its last row), into the one output.
   * @returns {Dispatch[]}
   */
  #pick(K, outputs) {
    if (!this.#logits) throw new Error('a pick of the logits from a program that computed none');
    if (outputs.length !== 1 || outputs[0].bytes < 4 * (1 + 2 * K))
      throw new Error(`a pick of ${K} logits needs one output of ${4 * (1 + 2 * K)} bytes`);
    const { at, N } = this.#logits;
    const B = Math.max(PICK_BLOCK, Math.ceil(N / PICK_GROUPS)); // logits a workgroup
    const G = Math.ceil(N / B);
    const bytes = align(4 * (2 * G * K + G), 256);
    if (!this.#found || this.#found.size < bytes) {
      this.#found?.destroy();
      this.#found = this.device.createBuffer({ size: align(bytes, 65536), usage: USAGE.STORAGE });
      this.#bindGroups.clear();
    }
    const L = this.#floats(at, N);
    const out = this.#floats(outputs[0].at);
    return [
      { shader: 'pick_blocks', buffers: [L.buffer, this.#found], params: [L.index, N, K, B, G], groups: groupsOf(G) },
      { shader: 'pick_merge', buffers: [this.#found, out.buffer], params: [out.index, G, K], groups: [1, 1, 1] },
    ];
  }

  /**
   * Attention's three dispatches: scores, softmax, the values mixed.
   * @returns {Dispatch[]}
   */
  #attend(s, T, pos0) {
    const [, q, ldq, entryAt, out, ldo, H, KV, E, window, scale] = s;
    const entry = this.words(entryAt >>> 0, 16);
    const [k, v, capacity, count, first, ck, cv, cks, cvs, coldCapacity, coldCountWord, positions, bits] = entry;
    const coldCount = ck ? coldCountWord : 0;
    const S = coldCount + count;
    const scores = this.#scoresBuffer(T * H * S);
    const Q = this.#floats(q);
    const O = this.#floats(out);
    const cold = (at, i) => (coldCount ? this.#floats(at).buffer : this.dummies[i]);
    const shared = [H, KV, E, T, pos0, window, scale, capacity, count, first, coldCapacity, coldCount, bits, S];
    return [
      {
        shader: 'scores',
        buffers: [Q.buffer, this.#floats(k).buffer, cold(ck, 0), cold(cks, 1), cold(positions, 2), scores],
        params: [Q.index, ldq, ...shared],
        groups: groupsOf(Math.ceil((T * H * S) / WORKGROUP)),
      },
      { shader: 'softmax', buffers: [scores], params: [0, 0, ...shared], groups: groupsOf(T * H) },
      {
        shader: 'mix',
        buffers: [O.buffer, this.#floats(v).buffer, cold(cv, 0), cold(cvs, 1), scores],
        params: [O.index, ldo, ...shared],
        groups: groupsOf(Math.ceil((T * H * E) / WORKGROUP)),
      },
    ];
  }
}

/**
 * `n` workgroups as a dispatch's x and y (the shaders fold them back: group_of).
 * @param {number} n
 * @returns {[number, number, number]}
 */
function groupsOf(n) {
  if (n <= MAX_GROUPS) return [Math.max(n, 1), 1, 1];
  const y = Math.ceil(n / MAX_GROUPS);
  return [Math.ceil(n / y), y, 1];
}

const gcd = (a, b) => (b ? gcd(b, a % b) : a);

/**
 * The pieces of bytes [offset, offset + bytes) of a region, one per buffer it crosses: the chunk, and
 * the piece's first and end offsets in the region.
 * @param {Region} region
 * @param {number} offset
 * @param {number} bytes
 */
function pieces(region, offset, bytes) {
  const out = [];
  for (const chunk of region.chunks) {
    const from = Math.max(offset, chunk.start);
    const to = Math.min(offset + bytes, chunk.start + chunk.bytes);
    if (from < to) out.push({ chunk, from, to });
  }
  return out;
}
