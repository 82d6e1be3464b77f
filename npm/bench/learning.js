// What learning from feedback costs a chat, in Pyodide (Node: this script; Chromium:
// benchmarks/browser/learning.html, driven by benchmarks/learning_bench.py, which also runs CPython).
// For each adapter config: a chat turn, Good on its answer, then: how long until the first update is
// applied, until the whole lesson is done, and the next turn's time to first token, against the same
// next turn without feedback.
//
//   node npm/bench/learning.js [answer tokens]   -> one JSON line per adapter config

import scenario from './learning-scenario.json' with { type: 'json' };

/** The adapters compared (the old default: q_proj and v_proj on every layer; today's default). */
export const CONFIGS = scenario.configs;

async function turn(llm, messages, answerTokens) {
  let text = '';
  let first;
  for await (const c of llm.chat(messages, { temperature: 0, maxTokens: answerTokens, ignoreEos: true })) {
    first ??= c.stats;
    text += c.text;
  }
  return { text, ttftMs: first.ttftMs, cachedTokens: first.cachedTokens };
}

/** The scenario on a loaded model, for one adapter config, answers of `answerTokens`: timings in ms. */
export async function learningScenario(llm, config, lesson = {}, answerTokens = scenario.answer_tokens) {
  // learning's preparation, made in idle time after load (what a user reading the first answer gives it)
  const loaded = performance.now();
  while ((await llm.adapters()).preparing) await new Promise((resolve) => setTimeout(resolve, 100));
  const preparingMs = performance.now() - loaded;
  await llm.newAdapter({ name: 'bench', ...config });
  const messages = [{ role: 'user', content: scenario.question }];
  const answer = await turn(llm, messages, answerTokens);
  const next = [
    ...messages,
    { role: 'assistant', content: answer.text },
    { role: 'user', content: scenario.follow_up },
  ];
  const ordinary = await turn(llm, next, answerTokens); // the next turn without feedback
  await turn(llm, messages, answerTokens); // the cache holds the answer again, as right after it was given
  const started = performance.now();
  let firstUpdateMs;
  const report = await llm.adapt(
    { messages, completion: answer.text, reward: 1, adapter: 'bench', ...lesson },
    { onProgress: (p) => p.applied && (firstUpdateMs ??= performance.now() - started) },
  );
  const lessonMs = performance.now() - started;
  const after = await turn(llm, next, answerTokens);
  const again = performance.now();
  let secondUpdateMs;
  await llm.adapt(
    { messages: next, completion: after.text, reward: 1, adapter: 'bench', ...lesson },
    { onProgress: (p) => p.applied && (secondUpdateMs ??= performance.now() - again) },
  );
  return {
    preparing_ms: preparingMs,
    second_lesson_first_update_ms: secondUpdateMs,
    first_update_ms: firstUpdateMs,
    lesson_ms: lessonMs,
    steps: report.steps,
    step_ms: report.stepMs,
    ordinary_next_ttft_ms: ordinary.ttftMs,
    next_ttft_after_feedback_ms: after.ttftMs,
    cached_tokens_after_feedback: after.cachedTokens,
  };
}

if (typeof process !== 'undefined' && process.argv[1] && import.meta.url.endsWith(process.argv[1].split('/').pop())) {
  const { join, resolve } = await import('node:path');
  const { fileURLToPath } = await import('node:url');
  const { RuvLLM } = await import('../src/index.js');
  const { DIST } = await import('../test/support/dist.js');
  const root = resolve(fileURLToPath(new URL('../..', import.meta.url)));
  const answerTokens = Number(process.argv[2] ?? scenario.answer_tokens);
  for (const { label, config, lesson } of CONFIGS) {
    const llm = await RuvLLM.load({
      model: join(root, 'models', 'smollm2-135m-instruct'),
      pyodide: { indexURL: DIST },
    });
    console.log(
      JSON.stringify({
        runtime: 'pyodide-node',
        adapter: label,
        ...(await learningScenario(llm, config, lesson, answerTokens)),
      }),
    );
    await llm.dispose();
  }
}
