/**
 * The GPU's thread: owns the WebGPU device and the decode plan's executor (executor.js), and answers the
 * Pyodide worker's calls (client.js). Those calls are synchronous on the caller's side: Python waits in
 * Atomics.wait while this worker, whose event loop runs free, awaits the GPU (a readback is a promise in
 * WebGPU) and then writes the answer into the shared `data` buffer and wakes it through `ctl`:
 *   ctl[0] 0 pending, 1 answered, 2 failed (the error's text in data); ctl[1] the answer's bytes in data;
 *   ctl[2] its number (a region's address).
 * Calls are answered one at a time, in order.
 */

import { IS_NODE } from '../../env.js';
import { requestGpu } from './device.js';
import { GpuExecutor } from './executor.js';

/** @type {any} the worker's channel: Node's parentPort, or the worker's global scope in browsers */
const port = IS_NODE ? (await import('node:worker_threads')).parentPort : globalThis;

/** @type {GpuExecutor | null} */
let executor = null;
/** @type {Int32Array} */
let ctl;
/** @type {SharedArrayBuffer} */
let data;

/** Answer a call: `status` 1 with `bytes` (and `value`), or 2 with an error's text. */
function answer(status, bytes = new Uint8Array(0), value = 0) {
  if (bytes.byteLength > data.byteLength) {
    status = 2;
    bytes = new TextEncoder().encode(`the answer (${bytes.byteLength} bytes) is larger than the shared buffer`);
  }
  new Uint8Array(data).set(bytes);
  Atomics.store(ctl, 1, bytes.byteLength);
  Atomics.store(ctl, 2, value | 0);
  Atomics.store(ctl, 0, status);
  Atomics.notify(ctl, 0);
}

async function call(message) {
  if (message.data) data = message.data; // (a larger buffer, sent when an answer would not fit)
  if (executor === null) throw new Error('the GPU is not started');
  switch (message.op) {
    case 'region':
      return { value: executor.region(message.bytes, message.row ?? 0) };
    case 'free':
      executor.free(message.at);
      return {};
    case 'write':
      await executor.write(message.at, new Uint8Array(message.bytes));
      return {};
    case 'fetch':
      return { bytes: await executor.fetch(message.at, message.bytes) };
    case 'plan': {
      const inputs = message.inputs.map(({ at, bytes }) => ({ at, data: new Uint8Array(bytes) }));
      const { program, state, T, outputs, pick } = message;
      const results = await executor.plan(program, state, T, inputs, outputs, pick ?? 0);
      const total = results.reduce((sum, r) => sum + r.byteLength, 0);
      const bytes = new Uint8Array(total);
      let at = 0;
      for (const r of results) {
        bytes.set(r, at);
        at += r.byteLength;
      }
      return { bytes };
    }
    case 'stats': {
      const stats = { ...executor.totals, gpuBytes: executor.bytes };
      return { bytes: new TextEncoder().encode(JSON.stringify(stats)) };
    }
    default:
      throw new Error(`the GPU worker has no call ${message.op}`);
  }
}

async function start({ ctl: control, data: shared, broken, software }) {
  ctl = new Int32Array(control);
  data = shared;
  const { device, adapter, reason } = await requestGpu({ software });
  if (!device) return { adapter, reason };
  device.lost.then((info) => {
    executor = null;
    lost = `the GPU device was lost (${info.reason}: ${info.message})`;
  });
  executor = await GpuExecutor.create(device, { broken }); // (the tests' shader broken on purpose, if any)
  return { adapter, reason: null };
}

/** @type {string | null} why the device is gone, once it is */
let lost = null;
let queue = Promise.resolve();
const onMessage = (message) => {
  if (message.type === 'start') {
    start(message).then(
      (started) => port.postMessage({ type: 'started', ...started }),
      (error) =>
        port.postMessage({ type: 'started', adapter: null, reason: `WebGPU failed to start: ${error.message}` }),
    );
    return;
  }
  queue = queue.then(async () => {
    try {
      if (lost) throw new Error(lost);
      const { bytes, value } = await call(message);
      answer(1, bytes, value);
    } catch (error) {
      answer(2, new TextEncoder().encode(String(error?.message ?? error)));
    }
  });
};
if (IS_NODE) port.on('message', onMessage);
else port.addEventListener('message', (event) => onMessage(event.data));
