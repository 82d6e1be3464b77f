/**
 * The WebGPU executor (src/worker/gpu/executor.js) as a process CPython talks to over its stdin and
 * stdout (tests/gpu_host.py), so the decode plan's tests run every family's programs on a GPU without
 * Pyodide. Each message, both ways: a 4-byte little-endian length, a JSON header, a 4-byte length, then
 * that many bytes of payload. Requests: region {bytes}, free {at}, write {at} + the bytes, fetch {at,
 * bytes}, plan {program, state, T, inputs: [{at, bytes}], outputs: [{at, bytes}], pick} + the inputs' bytes
 * one after another, info {}. Answers: {ok: true, ...} + bytes (a fetch's, a plan's outputs), or {error}.
 *
 * Without a GPU, Dawn runs on a software Vulkan: VK_ICD_FILENAMES names one (Chromium's SwiftShader).
 */

import { GpuExecutor } from '../../src/worker/gpu/executor.js';
import { requestGpu } from '../../src/worker/gpu/device.js';

const { device, adapter, reason } = await requestGpu();

/** A shader broken on purpose (RUVLLM_GPU_BREAK=name: its output scaled), for the tests of the check. */
const broken = process.env.RUVLLM_GPU_BREAK || null;
/** A largest binding below the device's (RUVLLM_GPU_MAX_BINDING bytes): the tests of matrices split in parts. */
const maxBinding = Number(process.env.RUVLLM_GPU_MAX_BINDING) || Infinity;
const executor = device ? await GpuExecutor.create(device, { broken, maxBinding }) : null;

const input = [];
let waiting = null;
process.stdin.on('data', (chunk) => {
  input.push(chunk);
  waiting?.();
});
process.stdin.on('end', () => process.exit(0));

/** The next `n` bytes of stdin. */
async function take(n) {
  for (;;) {
    const have = input.reduce((sum, c) => sum + c.length, 0);
    if (have >= n) break;
    await new Promise((resolve) => (waiting = resolve));
  }
  const all = Buffer.concat(input);
  input.length = 0;
  if (all.length > n) input.push(all.subarray(n));
  return all.subarray(0, n);
}

function answer(header, payload = new Uint8Array(0)) {
  const json = Buffer.from(JSON.stringify(header));
  const lengths = Buffer.alloc(4);
  lengths.writeUInt32LE(json.length);
  const size = Buffer.alloc(4);
  size.writeUInt32LE(payload.byteLength);
  process.stdout.write(
    Buffer.concat([lengths, json, size, Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength)]),
  );
}

async function handle(request, payload) {
  if (request.op === 'info') return [{ adapter, reason }];
  if (!executor) throw new Error(reason);
  switch (request.op) {
    case 'region':
      return [{ at: executor.region(request.bytes, request.row ?? 0) }];
    case 'free':
      executor.free(request.at);
      return [{}];
    case 'write':
      await executor.write(request.at, new Uint8Array(payload));
      return [{}];
    case 'fetch':
      return [{}, await executor.fetch(request.at, request.bytes)];
    case 'plan': {
      let at = 0;
      const inputs = request.inputs.map(({ at: to, bytes }) => {
        const data = new Uint8Array(payload.subarray(at, at + bytes));
        at += bytes;
        return { at: to, data };
      });
      const { program, state, T, outputs, pick } = request;
      const results = await executor.plan(program, state, T, inputs, outputs, pick ?? 0);
      return [{ last: executor.last }, Buffer.concat(results)];
    }
    default:
      throw new Error(`unknown request ${request.op}`);
  }
}

for (;;) {
  const header = await take(4);
  const request = JSON.parse((await take(header.readUInt32LE())).toString());
  const size = (await take(4)).readUInt32LE();
  const payload = size ? Buffer.from(await take(size)) : Buffer.alloc(0);
  try {
    const [result, bytes] = await handle(request, payload);
    answer({ ok: true, ...result }, bytes);
  } catch (error) {
    answer({ error: String(error?.message ?? error) });
  }
}
