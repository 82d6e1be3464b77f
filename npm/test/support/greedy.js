/**
 * Greedy answers with the top-2 logprobs of each token, and the comparison of two paths' answers that
 * the decode plan's tests make (plan.test.js: with and without the plan; gpu.test.js: the GPU and the
 * CPU): the same tokens, or parted only where the reference's two candidates were a near-tie.
 */
import assert from 'node:assert/strict';

/** The greedy answer's tokens, each with the two most likely tokens' logprobs there. */
export async function greedy(llm, prompt, chat, maxTokens = 24) {
  const common = { max_tokens: maxTokens, temperature: 0 };
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

/**
 * `got` has `want`'s tokens, or parts from them where `want`'s top-2 margin is under `nearTie` (the
 * margin printed as a diagnostic of test context `t`, `paths` naming the two).
 */
export function assertSameOrNearTie(t, got, want, prompt, paths, nearTie) {
  const parted = want.findIndex((w, i) => got[i]?.token !== w.token);
  if (parted < 0) {
    assert.equal(got.length, want.length);
    return;
  }
  const margin = want[parted].top[0] - want[parted].top[1];
  t.diagnostic(`"${prompt}": ${paths} part at token ${parted}, top-2 margin ${margin.toFixed(4)}`);
  assert.ok(margin < nearTie, `"${prompt}" parts at token ${parted} with a top-2 margin of ${margin}`);
}
