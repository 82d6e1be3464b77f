/**
 * `threads` in RuvLLM.load: how many threads compute the matrix products. Above 1, the worker starts
 * the kernel thread pool (pool.js) beside the single-thread kernels, and Python's provider
 * (py_src/ruvllm/quant/pool.py) places each matrix in the pool's memory and runs its products there,
 * through the small API made here (addresses in Pyodide's memory in, one call per product).
 *
 * The thread count: an integer from 1 to MAX_THREADS (every product on all of them), or 'auto': the
 * logical cores (navigator.hardwareConcurrency, os.availableParallelism()), at most AUTO_MAX, each
 * product on one thread or all, whichever measures faster (pool-chooser.js Adaptive). One thread runs
 * when the WebAssembly kernels do not (kernels: 'numpy', or no SIMD128), when this page is not
 * cross-origin isolated (no SharedArrayBuffer to share with workers), or when 1 is asked; `reason` says
 * which.
 */

import { IS_NODE } from '../env.js';
import { RuvLLMError } from '../errors.js';
import { MAX_THREADS } from '../protocol.js';
import { readPackageFile } from './python.js';
import { startPool } from './pool.js';

/** 'auto' takes at most this many threads (decoding is bound by memory bandwidth beyond a few). */
export const AUTO_MAX = 8;
/**
 * The default: 'auto', every core the runtime reports (at most AUTO_MAX) where memory can be shared, as
 * wllama and onnxruntime-web use threads by default on an isolated page. Decoding still runs on one
 * thread where that measures faster (a small model's short products in a busy tab: pool-chooser.js
 * Adaptive), so a page or program that gains nothing from more threads loses little (benchmarks/RESULTS.md,
 * issue 25).
 */
export const DEFAULT_THREADS = 'auto';

/** The logical cores this runtime reports (at least 1). */
async function cores() {
  if (IS_NODE) return (await import('node:os')).availableParallelism();
  return globalThis.navigator?.hardwareConcurrency || 1;
}

/** Why this runtime cannot share memory with workers, or null when it can. */
function noSharing() {
  if (typeof SharedArrayBuffer !== 'function' || (!IS_NODE && globalThis.crossOriginIsolated !== true))
    return 'this page is not cross-origin isolated (no SharedArrayBuffer): serve it with COOP/COEP headers to use more';
  return null;
}

/**
 * The pool for `threads` (the option as given), or `pool: null` and why one thread runs.
 * @param {any} py Pyodide
 * @param {{ running: boolean, relaxed?: boolean }} kernels whether the single-thread kernels run, and which
 *   build (the loader's start_kernels, or kernels.js startKernels)
 * @param {'auto' | number | undefined} threads
 * @param {{ spin?: number }} [tuning] the pool's spin budget (pool-protocol.js DEFAULT_SPIN_US when not
 *   given)
 */
export async function startThreads(py, kernels, threads = DEFAULT_THREADS, { spin } = {}) {
  const one = (reason) => ({ pool: null, api: null, count: 1, reason, adaptive: false });
  const wanted = threads === 'auto' ? Math.min(await cores(), AUTO_MAX, MAX_THREADS) : threads;
  if (wanted === 1) return one(threads === 'auto' ? 'threads: this runtime reports 1 core' : 'threads: 1 (asked for)');
  if (!kernels.running) return one('the WebAssembly kernels do not run here (info.kernelsNote, or kernels: numpy)');
  const why = noSharing();
  if (why) return one(why);
  // the shared twin of the build the single-thread kernels run (host.py picked it), so a product has the
  // same bits on any number of threads
  const file = kernels.relaxed ? 'kernels-relaxed-shared.wasm' : 'kernels-shared.wasm';
  let module;
  try {
    module = await WebAssembly.compile(await readPackageFile(`../../wasm/${file}`));
  } catch (error) {
    const reason = `this package has no usable wasm/${file} (${error.message}); ./build.sh kernels makes it`;
    if (threads === 'auto') return one(reason);
    throw new RuvLLMError('load', `cannot start ${threads} threads: ${reason}`);
  }
  let pool;
  try {
    pool = await startPool(module, { threads: wanted, adaptive: threads === 'auto', spin });
  } catch (error) {
    if (threads === 'auto') return one(error.message);
    throw error;
  }
  return { pool, api: pythonApi(py, pool), count: wanted, reason: null, adaptive: threads === 'auto' };
}

/**
 * What Python's PoolKernels calls: integers in (addresses in Pyodide's memory), so each call crosses
 * cheaply. Pyodide's memory is looked up on every call: its buffer changes when it grows.
 * @param {any} py
 * @param {import('./pool.js').KernelPool} pool
 */
function pythonApi(py, pool) {
  const heap = () => py._module.memory.buffer;
  // Addresses as unsigned: NumPy's data pointers are signed 32-bit integers in wasm32 (above 2 GiB,
  // negative), and a Python int of a pool address is taken as it comes.
  const u = (address) => address >>> 0;
  const shapes = [];
  const files = new Map(); // OutsideFile's buffers (weight files arriving), by number
  let fileNumber = 0;
  const groups = []; // fuse's groups of handles (null: ended)
  return {
    threads: pool.threads,
    /** `bytes` bytes at `address` of Pyodide's memory, copied into the pool: their address there. */
    place: (address, bytes) => pool.place(new Uint8Array(heap(), u(address), bytes)),
    /** A matrix whose parts were placed: its handle (see KernelPool.matrix). */
    matrix: (form, w, scales, mins, offset, N, K) => {
      const handle = pool.matrix({ form, w, scales, mins, offset, N, K });
      shapes[handle] = { N, K };
      return handle;
    },
    /** Matrices multiplied by the same x (q, k, v): one dispatch for all of them (`fused`). Its number. */
    fuse: (...handles) => {
      groups.push(handles);
      return groups.length - 1;
    },
    unfuse: (group) => {
      groups[group] = null;
    },
    /**
     * y_i (T, N_i) = x (T, K) at `x` @ W_i.T for the matrices of `group`, in one dispatch; the outputs lie
     * one after another from `y`.
     */
    fused: (group, x, T, fast, y) => {
      const handles = groups[group];
      const buffer = heap();
      let at = u(y);
      const outputs = handles.map((h) => {
        const out = new Float32Array(buffer, at, T * shapes[h].N);
        at += 4 * T * shapes[h].N;
        return out;
      });
      pool.run(handles, new Float32Array(buffer, u(x), T * shapes[handles[0]].K), T, outputs, fast === true);
    },
    /** `bytes` bytes at `at` of the pool's memory, copied to `address` of Pyodide's (a RemoteArray read). */
    fetch: (at, bytes, address) => {
      new Uint8Array(heap(), u(address), bytes).set(new Uint8Array(pool.memory.buffer, u(at), bytes));
    },
    /** `bytes` bytes of the pool's memory, until `free` (the decode plan's buffers and cache): their address. */
    region: (bytes) => pool.region(bytes),
    free: (at) => pool.free(u(at)),
    /** `bytes` bytes at `address` of Pyodide's memory, copied to `at` of the pool's. */
    write: (address, bytes, at) => {
      new Uint8Array(pool.memory.buffer, u(at), bytes).set(new Uint8Array(heap(), u(address), bytes));
    },
    /**
     * A decode plan's call (KernelPool.plan): `count` copies described at `copies` of Pyodide's memory
     * (int32 rows: direction, address in Pyodide's memory, address in the pool's, bytes; direction 0 is
     * copied in before the call, 1 out after it), then the program at `program` with the state at
     * `state` (pool addresses) for T rows.
     */
    plan: (program, state, T, copies, count) => {
      const rows = new Int32Array(heap(), u(copies), 4 * count).slice();
      const shared = pool.memory.buffer;
      for (let i = 0; i < count; i++) {
        const [into, address, at, bytes] = [rows[4 * i], rows[4 * i + 1], rows[4 * i + 2], rows[4 * i + 3]];
        if (into === 0) new Uint8Array(shared, u(at), bytes).set(new Uint8Array(heap(), u(address), bytes));
      }
      pool.plan(u(program), u(state), T);
      const buffer = heap();
      for (let i = 0; i < count; i++) {
        const [into, address, at, bytes] = [rows[4 * i], rows[4 * i + 1], rows[4 * i + 2], rows[4 * i + 3]];
        if (into === 1) new Uint8Array(buffer, u(address), bytes).set(new Uint8Array(shared, u(at), bytes));
      }
    },
    /** A buffer of `bytes` bytes in JavaScript memory for a weight file arriving (OutsideFile): its number. */
    file: (bytes) => {
      files.set(++fileNumber, new Uint8Array(bytes));
      return fileNumber;
    },
    /** `bytes` bytes at `address` of Pyodide's memory, copied to `offset` of file `id`. */
    put: (id, offset, address, bytes) => files.get(id).set(new Uint8Array(heap(), u(address), bytes), offset),
    /** `bytes` bytes at `offset` of file `id`, copied to `address` of Pyodide's memory. */
    read: (id, offset, bytes, address) =>
      new Uint8Array(heap(), u(address), bytes).set(files.get(id).subarray(offset, offset + bytes)),
    /** Forget file `id`: its memory goes with the next garbage collection. */
    drop: (id) => files.delete(id),
    /** Forget a matrix: its parts' space is handed out again (Python: when its product is collected). */
    release: (handle) => pool.release(handle),
    /** y (T, K) at `y` += dy[:, n0:n1] (dy (T, N) at `dy`) @ W[n0:n1], both in Pyodide's memory. */
    transposed: (handle, dy, T, y, n0, n1) => {
      const { N, K } = shapes[handle];
      const buffer = heap();
      pool.transposed(handle, new Float32Array(buffer, u(dy), T * N), T, new Float32Array(buffer, u(y), T * K), n0, n1);
    },
    /** y (T, N) at `y` = x (T, K) at `x` @ W.T, both in Pyodide's memory. */
    product: (handle, x, T, y, fast) => {
      const { N, K } = shapes[handle];
      const buffer = heap();
      pool.run(
        [handle],
        new Float32Array(buffer, u(x), T * K),
        T,
        [new Float32Array(buffer, u(y), T * N)],
        fast === true,
      );
    },
  };
}
