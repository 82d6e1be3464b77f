/**
 * `device` in RuvLLM.load: where the decode plan runs. 'auto' and 'webgpu' start the GPU's thread
 * (gpu-worker.js) and offer Python its memory (py_src/ruvllm/runtime/device.py): the plan is built there
 * and checked against the CPU's forward before it runs every forward; 'cpu' keeps the kernels.
 *
 * Python calls the GPU's memory synchronously (region, free, fetch, write, plan: what PoolMemory calls
 * of the thread pool's memory, threads.js), from inside a bridge call: each call posts a message to the
 * GPU's thread and waits on a shared word until it answers (gpu-worker.js). That needs memory shared
 * with a worker: in Node always, in a browser on a cross-origin isolated page (as threads do).
 */

import { IS_NODE } from '../../env.js';
import { RuvLLMError } from '../../errors.js';

/** A call the GPU has not answered in this long has failed (a prompt chunk on a software GPU takes seconds). */
const CALL_TIMEOUT_MS = 600000;
const WAIT_SLICE_MS = 1000;
/** The shared buffer for answers starts this large and grows with the largest answer asked for. */
const FIRST_DATA_BYTES = 1 << 20;

/** Why this runtime cannot run the GPU's thread, or null when it can. */
function noSharing() {
  if (typeof SharedArrayBuffer !== 'function' || (!IS_NODE && globalThis.crossOriginIsolated !== true))
    return 'this page is not cross-origin isolated (no SharedArrayBuffer): serve it with COOP/COEP headers to use the GPU';
  return null;
}

/** The GPU's thread, started; resolves once it has a device or knows why not. */
async function spawn(init) {
  const url = new URL('./gpu-worker.js', import.meta.url);
  if (IS_NODE) {
    const { Worker } = await import('node:worker_threads');
    const worker = new Worker(url);
    const started = new Promise((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
      worker.once('exit', (code) => reject(new Error(`the GPU's thread exited with code ${code}`)));
    });
    worker.postMessage(init);
    return { worker, started: await started, terminate: () => worker.terminate() };
  }
  const worker = new Worker(url, { type: 'module' });
  const started = await new Promise((resolve, reject) => {
    worker.addEventListener('message', (e) => resolve(e.data), { once: true });
    worker.addEventListener('error', (e) => reject(new Error(e.message || "the GPU's thread failed")), { once: true });
    worker.postMessage(init);
  });
  return { worker, started, terminate: async () => worker.terminate() };
}

/**
 * The GPU for `choice` ('auto' | 'webgpu' | 'cpu'): `api` (what Python's gpu_memory calls) and the
 * adapter's description, or `api: null` and why not. 'webgpu' without a usable GPU is a load error.
 * @param {any} py Pyodide
 * @param {string} choice
 * @param {{ broken?: string, software?: boolean }} [testing] the tests' hooks:
 *   shaders broken on purpose, and a software adapter taken by 'auto' too
 */
export async function startGpu(py, choice = 'auto', testing = {}) {
  const none = (reason) => {
    if (choice === 'webgpu') throw new RuvLLMError('load', `device 'webgpu': ${reason}`);
    return { api: null, adapter: null, reason, dispose: async () => {} };
  };
  if (choice === 'cpu')
    return { api: null, adapter: null, reason: "device: 'cpu' (asked for)", dispose: async () => {} };
  const why = noSharing();
  if (why) return none(why);
  const ctl = new SharedArrayBuffer(16);
  const data = new SharedArrayBuffer(FIRST_DATA_BYTES);
  let spawned;
  try {
    // 'auto' refuses a software adapter (SwiftShader: slower than the kernels); 'webgpu' takes what there is
    const software = choice === 'webgpu' || testing.software === true;
    spawned = await spawn({ type: 'start', ctl, data, broken: testing.broken ?? null, software });
  } catch (error) {
    return none(`the GPU's thread did not start (${error.message})`);
  }
  const { adapter, reason } = spawned.started;
  if (reason) {
    await spawned.terminate();
    return none(reason);
  }
  const channel = new Channel(spawned.worker, ctl, data);
  const dispose = async () => {
    channel.closed = true; // (Python may still free regions as it collects: those calls return at once)
    await spawned.terminate();
  };
  return { api: pythonApi(py, channel), adapter, reason: null, dispose };
}

/** Synchronous calls of the GPU's thread (the caller blocks: a worker, never a page's main thread). */
class Channel {
  /** Set once the GPU's thread is ended: a call then fails at once (a free does nothing). */
  closed = false;

  constructor(worker, ctl, data) {
    this.worker = worker;
    this.ctl = new Int32Array(ctl);
    this.data = data;
  }

  /**
   * Post `message` and wait for its answer: its bytes (a view of the shared buffer, valid until the next
   * call) and number. `answerBytes`: the most the answer may hold (the buffer grows first if needed).
   */
  call(message, transfer = [], answerBytes = 0) {
    if (this.closed) throw new RuvLLMError('inference', 'the GPU is no longer in use (the model was disposed)');
    if (answerBytes > this.data.byteLength) {
      this.data = new SharedArrayBuffer(Math.max(answerBytes, 2 * this.data.byteLength));
      message = { ...message, data: this.data };
    }
    Atomics.store(this.ctl, 0, 0);
    this.worker.postMessage(message, transfer);
    const deadline = Date.now() + CALL_TIMEOUT_MS;
    while (Atomics.load(this.ctl, 0) === 0) {
      Atomics.wait(this.ctl, 0, 0, WAIT_SLICE_MS);
      if (Atomics.load(this.ctl, 0) === 0 && Date.now() > deadline)
        throw new RuvLLMError('inference', `the GPU did not answer ${message.op} in ${CALL_TIMEOUT_MS / 1000} s`);
    }
    const bytes = new Uint8Array(this.data, 0, Atomics.load(this.ctl, 1));
    if (Atomics.load(this.ctl, 0) === 2)
      throw new RuvLLMError('inference', `WebGPU: ${new TextDecoder().decode(bytes.slice())}`);
    return { bytes, value: Atomics.load(this.ctl, 2) >>> 0 };
  }
}

/**
 * What Python's PoolMemory calls (runtime/device.py gpu_memory): addresses in Pyodide's memory on one side
 * (NumPy data pointers), the GPU's on the other (executor.js). Pyodide's memory is looked up on every
 * call: its buffer changes when it grows.
 * @param {any} py
 * @param {Channel} channel
 */
function pythonApi(py, channel) {
  const heap = () => py._module.memory.buffer;
  const u = (address) => address >>> 0;
  const copy = (address, bytes) => new Uint8Array(heap(), u(address), bytes).slice().buffer;
  return {
    threads: 1,
    /** A region of `bytes` bytes in the GPU's memory (a matrix's rows of `row` bytes): its address. */
    region: (bytes, row = 0) => channel.call({ op: 'region', bytes, row }).value,
    free: (at) => {
      if (!channel.closed) channel.call({ op: 'free', at: u(at) });
    },
    /** `bytes` bytes at `at` of the GPU's memory, copied to `address` of Pyodide's. */
    fetch: (at, bytes, address) => {
      const answer = channel.call({ op: 'fetch', at: u(at), bytes }, [], bytes);
      new Uint8Array(heap(), u(address), bytes).set(answer.bytes);
    },
    /** `bytes` bytes at `address` of Pyodide's memory, copied to `at` of the GPU's. */
    write: (address, bytes, at) => {
      const buffer = copy(address, bytes);
      channel.call({ op: 'write', at: u(at), bytes: buffer }, [buffer]);
    },
    /**
     * A decode plan's call: the copies described at `copies` of Pyodide's memory (uint32 rows: direction
     * 0 in before the run, 1 out after it; address in Pyodide's memory; address in the GPU's; bytes),
     * then the program at `program` with the state at `state` for T rows, on the GPU; `pick` K > 0: the
     * logits' K largest in place of them (executor.js plan).
     */
    plan: (program, state, T, copies, count, pick = 0) => {
      const rows = new Uint32Array(heap(), u(copies), 4 * count).slice();
      const inputs = [];
      const outputs = [];
      for (let i = 0; i < count; i++) {
        const [into, address, at, bytes] = rows.subarray(4 * i, 4 * i + 4);
        if (into === 0) inputs.push({ at, bytes: copy(address, bytes) });
        else outputs.push({ address, at, bytes });
      }
      const total = outputs.reduce((sum, o) => sum + o.bytes, 0);
      const message = { op: 'plan', program: u(program), state: u(state), T, inputs, outputs, pick };
      const answer = channel.call(
        message,
        inputs.map((i) => i.bytes),
        total,
      );
      let from = 0;
      const buffer = heap();
      for (const { address, bytes } of outputs) {
        new Uint8Array(buffer, address, bytes).set(answer.bytes.subarray(from, from + bytes));
        from += bytes;
      }
    },
    /** Totals so far (plan calls, submits, dispatches, bytes read back and written) and the GPU memory in use. */
    stats: () => JSON.parse(new TextDecoder().decode(channel.call({ op: 'stats' }, [], 4096).bytes.slice())),
  };
}
