// The decode plan (py_src/ruvllm/model/plan.py: a whole forward in one call of the kernels) in Pyodide
// under Node, on one thread: SmolLM2 and Gemma 3 270M give the greedy tokens they give without it
// (`plan: false`, the products driven from Python), or part from them only at a near-tie, whose top-2
// margin the test prints. The plan is the fast arithmetic in another order (docs/kernels.md): its
// logits differ from the path without it by ~1e-4 of their scale, so only a near-tie can part them.
// Needs a local Pyodide distribution; Gemma needs `./build.sh gemma` (each skipped, saying how, without).
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { AbortError, RuvLLM } from '../src/index.js';
import { DIST, HAVE_DIST } from './support/dist.js';

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

/** The greedy answer's tokens, each with the two most likely tokens' logprobs there. */
async function greedy(llm, prompt, chat) {
  const common = { max_tokens: 24, temperature: 0 };
  if (chat) {
    const body = { ...common, messages: [{ role: 'user', content: prompt }], logprobs: true, top_logprobs: 2 };
    const answer = await llm.chat.completions.create(body);
    return answer.choices[0].logprobs.content.map((c) => ({
      token: c.token,
      top: c.top_logprobs.map((t) => t.logprob),
    }));
  }
  const answer = await llm.completions.create({ ...common, prompt, logprobs: 2 });
  const { tokens, top_logprobs: top } = answer.choices[0].logprobs;
  return tokens.map((token, i) => ({ token, top: Object.values(top[i]).sort((a, b) => b - a) }));
}

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
          const parted = want.findIndex((w, i) => got[i]?.token !== w.token);
          if (parted < 0) {
            assert.equal(got.length, want.length);
            continue;
          }
          const margin = want[parted].top[0] - want[parted].top[1];
          t.diagnostic(`"${prompt}": the two paths part at token ${parted}, top-2 margin ${margin.toFixed(4)}`);
          assert.ok(margin < NEAR_TIE, `"${prompt}" parts at token ${parted} with a top-2 margin of ${margin}`);
        }
      } finally {
        await Promise.all([planned.dispose(), unplanned.dispose()]);
      }
    });

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
