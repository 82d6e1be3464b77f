/**
 * One extra thread of the kernel thread pool (pool.js): instantiates kernels-shared.wasm on the pool's
 * shared memory, says it is ready, then loops: wait for the next dispatch (a spin of at most the
 * pool's SPIN microseconds, then Atomics.wait), take units of it until none is left (`work`, in
 * pool-protocol.js, all it imports of the pool). It leaves the loop when the pool sets STOP, and is then
 * terminated. No message per product.
 */

import { IS_NODE } from '../env.js';
import { CONTROL_BYTES, CTL, waitWhile, work } from './pool-protocol.js';

/** @type {any} the worker's channel: Node's parentPort, or the worker's global scope in browsers */
const port = IS_NODE ? (await import('node:worker_threads')).parentPort : globalThis;

function serve({ module, memory, id }) {
  let exports;
  try {
    exports = new WebAssembly.Instance(module, { env: { memory } }).exports;
  } catch (error) {
    port.postMessage({ error: `cannot instantiate the kernels: ${error.message}` });
    return;
  }
  const ctl = new Int32Array(memory.buffer, 0, CONTROL_BYTES / 4);
  let seen = Atomics.load(ctl, CTL.GEN);
  port.postMessage({ ready: true });
  for (;;) {
    waitWhile(ctl, CTL.GEN, seen, CTL.SLEEPERS);
    seen = Atomics.load(ctl, CTL.GEN);
    if (Atomics.load(ctl, CTL.STOP)) break;
    work(exports, ctl, seen, id);
  }
  if (IS_NODE) port.close();
  else globalThis.close();
}

// The first message starts the thread; the loop then blocks this worker's event loop until STOP.
if (IS_NODE) port.once('message', (init) => setTimeout(() => serve(init)));
else port.addEventListener('message', (event) => setTimeout(() => serve(event.data)), { once: true });
