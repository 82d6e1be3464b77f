// The decode plan (py_src/ruvllm/model/plan.py: a whole forward in one call of the kernels) in Pyodide
// under Node: SmolLM2 and Gemma 3 270M give the greedy tokens they give without it (`plan: false`, the
// products driven from Python), or part from them only at a near-tie, whose top-2 margin the test
// prints. The plan is the fast arithmetic in another order (docs/kernels.md): its logits differ from
// the path without it by ~1e-4 of their scale, so only a near-tie can part them. On the kernel thread
// pool (2 and 3 threads) the plan gives one thread's tokens and logprobs bit for bit, across a long chat
// whose cache moves positions to its cold tier and evicts some too.
// Needs a local Pyodide distribution; Gemma needs `./build.sh gemma` (each skipped, saying how, without).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { AbortError, RuvLLM } from '../src/index.js';
import { DIST, HAVE_DIST } from './support/dist.js';
import { assertSameOrNearTie, greedy } from './support/greedy.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const PYODIDE = { indexURL: DIST };
const NO_DIST = `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)`;
const MODELS = [
  ['SmolLM2', join(ROOT, 'models', 'smollm2-135m-instruct'), './build.sh all makes it'],
  ['Gemma 3', join(ROOT, 'build', 'downloads', 'gemma-3-270m-q4_k_m.gguf'), './build.sh gemma fetches it'],
];
/** The largest logprob gap between the two top tokens at which the two paths may pick differently. */
const NEAR_TIE = 0.05;
const PROMPTS = [
  ['Once upon a time', false],
  ['The three primary colors are', false],
  ['What is the capital of France?', true],
  ['Write a short poem about the sea.', true],
];

for (const [name, model, how] of MODELS) {
  const skip = !HAVE_DIST ? NO_DIST : existsSync(model) ? false : `no ${model}: ${how}`;
  describe(`${name} through the decode plan in Pyodide under Node`, { skip }, () => {
    test('greedy tokens equal those without the plan, or part at a near-tie', async (t) => {
      const planned = await RuvLLM.load({ model, pyodide: PYODIDE, threads: 1 });
      const unplanned = await RuvLLM.load({ model, pyodide: PYODIDE, threads: 1, plan: false });
      try {
        assert.deepEqual([planned.info.decodePlan, planned.info.planNote], [true, null]);
        assert.deepEqual([unplanned.info.decodePlan, unplanned.info.planNote], [false, 'off (plan=False)']);
        for (const [prompt, chat] of PROMPTS) {
          const [got, want] = [await greedy(planned, prompt, chat), await greedy(unplanned, prompt, chat)];
          assertSameOrNearTie(t, got, want, prompt, 'the two paths', NEAR_TIE);
        }
      } finally {
        await Promise.all([planned.dispose(), unplanned.dispose()]);
      }
    });

    // (Gemma, slower to load, at 1 and 3: three threads split its 4 heads and its products unevenly)
    const counts = name === 'SmolLM2' ? [1, 2, 3] : [1, 3];
    test(`through the plan, ${counts.join(', ')} threads give the same tokens and logprobs, bit for bit`, async () => {
      const seen = {};
      for (const threads of counts) {
        const llm = await RuvLLM.load({ model, pyodide: PYODIDE, threads });
        try {
          assert.deepEqual([llm.info.decodePlan, llm.info.threads.count], [true, threads]);
          seen[threads] = [];
          for (const [prompt, chat] of PROMPTS) seen[threads].push(await greedy(llm, prompt, chat));
        } finally {
          await llm.dispose();
        }
      }
      for (const threads of counts.slice(1)) assert.deepEqual(seen[threads], seen[1], `${threads} threads`);
    });

    const chatSkip = name === 'SmolLM2' ? false : 'SmolLM2 covers it (the cache is the same code for every family)';
    test(
      "a long chat with a cold tier and a byte budget: 2 threads give 1 thread's answers, bit for bit",
      { skip: chatSkip },
      async () => {
        // each turn reuses the cache of the turns before (its prefix); 16 float32 positions per layer, the
        // older ones as int4 codes, and a budget that evicts some of those before the chat ends
        const kv = { hotTokens: 16, cold: 'int4', budgetBytes: 1_200_000 };
        const turns = ['Name three rivers in Europe.', 'Which of them is the longest?', 'And the shortest?'];
        const answers = {};
        for (const threads of [1, 2]) {
          const llm = await RuvLLM.load({ model, pyodide: PYODIDE, threads, kv });
          try {
            const messages = [];
            answers[threads] = [];
            for (const content of turns) {
              messages.push({ role: 'user', content });
              const body = { messages, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 2 };
              const answer = await llm.chat.completions.create(body);
              const { message, logprobs } = answer.choices[0];
              answers[threads].push(logprobs.content);
              messages.push({ role: 'assistant', content: message.content });
            }
            const stats = await llm.cacheStats();
            if (threads === 2) assert.ok(stats.evictedPositions > 0, JSON.stringify(stats));
          } finally {
            await llm.dispose();
          }
        }
        assert.deepEqual(answers[2], answers[1]);
      },
    );

    test('an abort between tokens leaves the plan and its cache usable', async () => {
      const llm = await RuvLLM.load({ model, pyodide: PYODIDE, threads: 1 });
      try {
        const controller = new AbortController();
        const seen = [];
        await assert.rejects(async () => {
          for await (const c of llm.generate('Once upon a time', {
            temperature: 0,
            maxTokens: 64,
            signal: controller.signal,
          })) {
            seen.push(c.tokenId);
            if (seen.length === 3) controller.abort();
          }
        }, AbortError);
        const again = [];
        for await (const c of llm.generate('Once upon a time', { temperature: 0, maxTokens: 3 })) again.push(c.tokenId);
        assert.deepEqual(again, seen.slice(0, 3));
      } finally {
        await llm.dispose();
      }
    });
  });
}
