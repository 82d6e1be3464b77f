// The decode plan on a GPU through WebGPU (src/worker/gpu/: the GPU's thread, its shaders, Python's check
// at load) in Pyodide under Node, with Dawn (the `webgpu` package). Without a GPU, Dawn runs on Chromium's
// SwiftShader (its Vulkan driver, named by VK_ICD_FILENAMES): right answers, never a speed.
// - SmolLM2 and Gemma 3 with device 'webgpu': info names the adapter and the check's figures, and the
//   greedy tokens of held-out-style prompts (each read back alone: the plan's pick) equal the CPU plan's,
//   or part only at a near-tie (its top-2 margin printed).
// - A shader broken on purpose (RUVLLM_GPU_BREAK): 'auto' falls back to the CPU and says why, with the
//   check's figures; 'webgpu' refuses to load, naming them.
// - 'auto' does not take a software adapter; 'cpu' starts no GPU.
// - A generation on the GPU aborted, then another; dispose ends the GPU's thread.
// - A lesson with the plan on the GPU: it runs on the CPU, and the GPU then answers with the adapter, as
//   the CPU does with the adapter's files loaded (and without it, as before).
// Needs a local Pyodide distribution and the `webgpu` package (devDependency); Gemma `./build.sh gemma`.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { AbortError, RuvLLM, RuvLLMError } from '../src/index.js';
import { requestGpu } from '../src/worker/gpu/device.js';
import { DIST, HAVE_DIST } from './support/dist.js';
import { assertSameOrNearTie, greedy } from './support/greedy.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const PYODIDE = { indexURL: DIST };
const SWIFTSHADER = '/usr/lib/chromium/vk_swiftshader_icd.json';
if (!process.env.VK_ICD_FILENAMES && existsSync(SWIFTSHADER)) process.env.VK_ICD_FILENAMES = SWIFTSHADER;
const HAVE_DAWN = (() => {
  try {
    createRequire(import.meta.url).resolve('webgpu');
    return true;
  } catch {
    return false;
  }
})();
/** Why no adapter is found here (no Vulkan loader, no driver), or null: the GPU's tests need one. */
const NO_ADAPTER = HAVE_DAWN ? (await requestGpu()).reason : null;
const SMOLLM2 = join(ROOT, 'models', 'smollm2-135m-instruct');
const GEMMA = join(ROOT, 'build', 'downloads', 'gemma-3-270m-q4_k_m.gguf');
const skipFor = (model, how) =>
  !HAVE_DIST
    ? `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)`
    : !HAVE_DAWN
      ? "no 'webgpu' package (cd npm && npm ci)"
      : NO_ADAPTER
        ? `no WebGPU adapter (${NO_ADAPTER}): ./build.sh test installs the Vulkan loader for SwiftShader`
        : existsSync(model)
          ? false
          : `no ${model}: ${how}`;
/** The largest logprob gap between the two top tokens at which the GPU and the CPU may pick differently. */
const NEAR_TIE = 0.05;
const PROMPTS = [
  ['The three primary colors are', false],
  ['What is the capital of France?', true],
];

/** The text of a generation. */
async function text(llm, prompt, options) {
  let out = '';
  for await (const chunk of llm.generate(prompt, options)) out += chunk.text;
  return out;
}

/** A greedy generation's token ids, as the sampler takes them (on the GPU: read back alone, a pick). */
async function greedyIds(llm, prompt, chat, maxTokens) {
  const options = { maxTokens, temperature: 0 };
  const chunks = chat ? llm.chat([{ role: 'user', content: prompt }], options) : llm.generate(prompt, options);
  const ids = [];
  for await (const chunk of chunks) ids.push(chunk.tokenId);
  return ids;
}

/**
 * The GPU's greedy tokens against the CPU's: the same, or parted at a near-tie of the CPU's (its top-2
 * logprobs); the GPU read back one pick a plan call (12 bytes: plan.py TopLogits), not the logits.
 */
async function sameTokens(t, gpu, cpu, prompts, maxTokens) {
  for (const [prompt, chat] of prompts) {
    const before = await gpu.deviceStats();
    const got = await greedyIds(gpu, prompt, chat, maxTokens);
    const after = await gpu.deviceStats();
    const [calls, bytes] = [after.calls - before.calls, after.readBytes - before.readBytes];
    assert.ok(calls > 0 && bytes <= 12 * calls, `greedy decoding read back ${bytes} bytes in ${calls} calls`);
    const want = await greedyIds(cpu, prompt, chat, maxTokens);
    const top = await greedy(cpu, prompt, chat, maxTokens);
    const [g, w] = [got.map((token) => ({ token })), want.map((token, i) => ({ token, top: top[i].top }))];
    assertSameOrNearTie(t, g, w, prompt, 'the GPU and the CPU', NEAR_TIE);
  }
}

function assertOnGpu(info) {
  const { device } = info;
  assert.equal(device.path, 'webgpu', `the plan is not on the GPU: ${device.reason}`);
  assert.equal(device.reason, null);
  assert.match(device.adapter.architecture, /swiftshader/i);
  assert.ok(device.adapter.maxBindingBytes >= 2 ** 27, 'the device did not ask for the adapter largest bindings');
  const { check } = device;
  assert.ok(check.passed && check.nearTies && check.rows === 8, JSON.stringify(check));
  assert.ok(check.relative < check.bound, JSON.stringify(check));
  assert.deepEqual([info.decodePlan, info.planNote], [true, null]);
}

describe(
  'SmolLM2 on the GPU (WebGPU through Dawn) in Pyodide under Node',
  { skip: skipFor(SMOLLM2, './build.sh all makes it') },
  () => {
    test("device 'webgpu': the check passes, and the greedy tokens are the CPU plan's", async (t) => {
      const gpu = await RuvLLM.load({ model: SMOLLM2, pyodide: PYODIDE, threads: 1, device: 'webgpu' });
      const cpu = await RuvLLM.load({ model: SMOLLM2, pyodide: PYODIDE, threads: 1, device: 'cpu' });
      try {
        assertOnGpu(gpu.info);
        t.diagnostic(`the check: ${JSON.stringify(gpu.info.device.check)}`);
        assert.deepEqual(cpu.info.device, {
          path: 'cpu',
          reason: "device: 'cpu' (asked for)",
          check: null,
          adapter: null,
        });
        await sameTokens(t, gpu, cpu, PROMPTS, 12);
      } finally {
        await Promise.all([gpu.dispose(), cpu.dispose()]);
      }
    });

    test("'auto' does not take a software adapter, and says so", async () => {
      const llm = await RuvLLM.load({ model: SMOLLM2, pyodide: PYODIDE, threads: 1 });
      try {
        assert.equal(llm.info.device.path, 'cpu');
        assert.match(llm.info.device.reason, /software one \(swiftshader\), slower than the CPU's kernels/);
      } finally {
        await llm.dispose();
      }
    });

    test('a shader broken on purpose: auto falls back to the CPU saying why, webgpu refuses to load', async () => {
      process.env.RUVLLM_GPU_BREAK = 'gated';
      process.env.RUVLLM_GPU_SOFTWARE = '1';
      try {
        const llm = await RuvLLM.load({ model: SMOLLM2, pyodide: PYODIDE, threads: 1 });
        try {
          const { device } = llm.info;
          assert.equal(device.path, 'cpu');
          assert.match(device.reason, /the GPU's logits failed the check against the CPU \(largest difference/);
          assert.ok(!device.check.passed && device.check.relative > device.check.bound, JSON.stringify(device.check));
          assert.match(device.adapter.architecture, /swiftshader/i);
          const answer = await text(llm, 'The sky is', { maxTokens: 4, temperature: 0 });
          assert.ok(answer.length > 0);
        } finally {
          await llm.dispose();
        }
        await assert.rejects(
          RuvLLM.load({ model: SMOLLM2, pyodide: PYODIDE, threads: 1, device: 'webgpu' }),
          (e) =>
            e instanceof RuvLLMError &&
            e.type === 'load' &&
            /device 'webgpu': the GPU's logits failed the check/.test(e.message),
        );
      } finally {
        delete process.env.RUVLLM_GPU_BREAK;
        delete process.env.RUVLLM_GPU_SOFTWARE;
      }
    });

    test('a generation on the GPU aborted, then another; dispose ends the GPU', async () => {
      const llm = await RuvLLM.load({ model: SMOLLM2, pyodide: PYODIDE, threads: 1, device: 'webgpu' });
      try {
        const controller = new AbortController();
        let chunks = 0;
        await assert.rejects(
          (async () => {
            for await (const chunk of llm.generate('Count to ten:', {
              maxTokens: 40,
              temperature: 0,
              signal: controller.signal,
            })) {
              void chunk;
              chunks += 1;
              if (chunks === 2) controller.abort();
            }
          })(),
          (e) => e instanceof AbortError,
        );
        const answer = await text(llm, 'Count to ten:', { maxTokens: 3, temperature: 0 });
        assert.ok(answer.length > 0);
      } finally {
        await llm.dispose();
      }
    });

    test('a lesson runs on the CPU, and the GPU then answers with the adapter, as the CPU does', async (t) => {
      const gpu = await RuvLLM.load({ model: SMOLLM2, pyodide: PYODIDE, threads: 1, device: 'webgpu' });
      let cpu = null;
      try {
        assert.equal(gpu.info.device.path, 'webgpu');
        const before = (await greedy(gpu, 'The secret code is', false, 6)).map((c) => c.token);
        await gpu.newAdapter({ name: 'facts', targets: ['down_proj'] });
        const report = await gpu.adapt({ prompt: 'The secret code is', completion: ' BLUE-42.', adapter: 'facts' });
        assert.ok(report.logProbAfter - report.logProbBefore > 3, JSON.stringify(report));
        const learned = (await greedy(gpu, 'The secret code is', false, 6)).map((c) => c.token);
        assert.notDeepEqual(learned, before, 'the GPU answers as before the lesson');
        assert.equal((await gpu.adapters()).decodePlan, true); // (the adapter's program, on the GPU)
        const files = await gpu.saveAdapter('facts');
        const dir = await mkdtemp(join(tmpdir(), 'ruvllm-gpu-adapter-'));
        for (const [name, bytes] of Object.entries(files)) await writeFile(join(dir, name), bytes);
        cpu = await RuvLLM.load({ model: SMOLLM2, pyodide: PYODIDE, threads: 1, device: 'cpu' });
        await cpu.loadAdapter(dir, { name: 'facts' });
        await cpu.setAdapter('facts');
        await sameTokens(t, gpu, cpu, [['The secret code is', false]], 6);
        await gpu.setAdapter(null);
        assert.deepEqual(
          (await greedy(gpu, 'The secret code is', false, 6)).map((c) => c.token),
          before,
        );
      } finally {
        await Promise.all([gpu.dispose(), cpu?.dispose()]);
      }
    });
  },
);

describe(
  'Gemma 3 on the GPU (WebGPU through Dawn) in Pyodide under Node',
  { skip: skipFor(GEMMA, './build.sh gemma fetches it') },
  () => {
    test("device 'webgpu': the check passes, and the greedy tokens are the CPU plan's", async (t) => {
      const gpu = await RuvLLM.load({ model: GEMMA, pyodide: PYODIDE, threads: 1, device: 'webgpu' });
      const cpu = await RuvLLM.load({ model: GEMMA, pyodide: PYODIDE, threads: 1, device: 'cpu' });
      try {
        assertOnGpu(gpu.info);
        t.diagnostic(`the check: ${JSON.stringify(gpu.info.device.check)}`);
        await sameTokens(t, gpu, cpu, PROMPTS.slice(0, 1), 10);
      } finally {
        await Promise.all([gpu.dispose(), cpu.dispose()]);
      }
    });
  },
);
