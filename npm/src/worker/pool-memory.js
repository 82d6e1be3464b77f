/**
 * The kernel thread pool's memory (pool.js): one shared WebAssembly.Memory, on which every thread's
 * instance of kernels-shared.wasm runs. After the control block (pool-protocol.js) it holds the matrices
 * placed in it (codes, scales, mins; float32 weights), each thread's scratch and the inputs and outputs
 * of the dispatch under way. PoolMemory hands out its regions and takes back those of released matrices.
 */

import { RuvLLMError } from '../errors.js';
import { CONTROL_BYTES, CTL } from './pool-protocol.js';

export const PAGE = 65536;
/** `n` rounded up to a multiple of 16, in arithmetic that stays exact past 2 GiB (unlike `& ~15`). */
export const align16 = (n) => Math.ceil(n / 16) * 16;

/** A shared memory of at least `pages` pages, with the largest maximum this runtime lets us reserve. */
export function sharedMemory(pages, maxPages) {
  for (let maximum = maxPages; maximum >= pages; maximum = Math.floor(maximum / 2)) {
    try {
      return new WebAssembly.Memory({ initial: pages, maximum, shared: true });
    } catch (error) {
      if (!(error instanceof RangeError)) throw error;
    }
  }
  throw new RuvLLMError('load', `cannot reserve a shared WebAssembly memory of ${pages} pages for the kernel threads`);
}

/** The regions of the pool memory: 16-byte aligned, grown at the end, released ones handed out again. */
export class PoolMemory {
  #top = CONTROL_BYTES; // first byte never handed out
  #free = []; // released regions, { at, bytes }, handed out again before the memory grows
  #sizes = new Map(); // address -> bytes of each region `place` made (freed with its matrix)
  #io = { at: 0, bytes: 0 }; // x, quantize_x's outputs and the outputs of a dispatch
  #scratchFloats = 0; // each thread's scratch, in float32

  /** @param {WebAssembly.Memory} memory */
  constructor(memory) {
    this.memory = memory;
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

  /** `bytes` bytes of the pool memory that `free` hands out again (a decode plan's buffers): their address. */
  region(bytes) {
    const at = this.alloc(bytes);
    this.#sizes.set(at, bytes);
    return at;
  }

  /** Hand out again the region `place` or `region` made at `at` (nothing for 0, or an address they did not make). */
  free(at) {
    const bytes = this.#sizes.get(at);
    if (!at || bytes === undefined) return;
    this.#sizes.delete(at);
    this.#free.push({ at, bytes: align16(bytes) });
  }

  /** `bytes` bytes of input/output space for one dispatch (kept and grown, never shrunk). */
  io(bytes) {
    if (bytes > this.#io.bytes) {
      const size = Math.max(bytes, 2 * this.#io.bytes);
      this.#io = { at: this.alloc(size), bytes: size };
    }
    return this.#io.at;
  }

  /**
   * At least `floats` float32 of scratch for each of `threads` threads, thread i's address in
   * `ctl[CTL.SCRATCH + i]`. When it grows, the old scratch stays unused: growth is rare.
   * @param {Int32Array} ctl the control block
   */
  scratch(threads, floats, ctl) {
    if (floats <= this.#scratchFloats) return;
    for (let i = 0; i < threads; i++) ctl[CTL.SCRATCH + i] = this.alloc(4 * floats);
    this.#scratchFloats = floats;
  }
}
