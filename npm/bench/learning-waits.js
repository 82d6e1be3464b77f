// What background learning costs the requests made meanwhile, in Pyodide under Node: a fresh model (its
// default adapter's projection job starts at load), a chat answer of --max-tokens tokens, Good on it
// at once; from its first step on, a small request (tokenize) every 250 ms until the lesson is done.
// Prints one JSON line: how long those requests waited (median, p90, max), when each phase of the
// lesson began (its progress events, elapsed since it was given), and its report.
//
//   node npm/bench/learning-waits.js [--max-tokens 16] [--question "What is the secret code?"]
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { RuvLLM } from '../src/index.js';
import { DIST } from '../test/support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const { values } = parseArgs({
  options: {
    'max-tokens': { type: 'string', default: '16' },
    question: { type: 'string', default: 'What is the secret code?' },
  },
});

const llm = await RuvLLM.load({ model: join(ROOT, 'models', 'smollm2-135m-instruct'), pyodide: { indexURL: DIST } });
try {
  const messages = [{ role: 'user', content: values.question }];
  let completion = '';
  for await (const chunk of llm.chat(messages, { temperature: 0, maxTokens: Number(values['max-tokens']) }))
    completion += chunk.text;
  await llm.newAdapter({ name: 'feedback' });
  const phases = []; // [phase, step, elapsed ms] at each change
  const waits = [];
  let applied = false;
  let learning = true;
  const probe = async () => {
    while (!applied && learning) await new Promise((resolve) => setTimeout(resolve, 20));
    while (learning) {
      const started = performance.now();
      await llm.tokenize('hi');
      waits.push(performance.now() - started);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  };
  const probing = probe();
  const report = await llm.adapt(
    { messages, completion, reward: 1, adapter: 'feedback' },
    {
      onProgress: (p) => {
        applied ||= p.applied;
        const last = phases.at(-1);
        if (!last || last[0] !== p.phase || (p.phase === 'learning' && last[1] !== p.step))
          phases.push([p.phase, p.step, Math.round(p.elapsedMs)]);
      },
    },
  );
  learning = false;
  await probing;
  waits.sort((a, b) => a - b);
  const at = (q) => Math.round(waits[Math.min(waits.length - 1, Math.floor(q * waits.length))]);
  const lessonTokens = (await llm.tokenize(messages)).length + (await llm.tokenize(completion)).length;
  console.log(
    JSON.stringify({
      lesson_tokens: lessonTokens,
      request_wait_ms: { requests: waits.length, median: at(0.5), p90: at(0.9), max: at(1) },
      phases,
      report,
    }),
  );
} finally {
  await llm.dispose();
}
