// Latency of one MicroLoRA adapt step on SmolLM2 in Pyodide under Node (see benchmarks/adapt_latency.py).
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { RuvLLM } from '../src/index.js';
import { DIST } from '../test/support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const PROMPT =
  'Our team meets every Tuesday at ten in the small room on the third floor. Remember this: the code to the room is';
const COMPLETION = ' 4471, and the key is kept at the front desk.';
const llm = await RuvLLM.load({
  model: join(ROOT, 'models', 'smollm2-135m-instruct'),
  pyodide: { indexURL: DIST },
});
const results = {};
for (const targets of [['q_proj', 'v_proj'], ['down_proj']]) {
  await llm.newAdapter({ name: 'bench', targets });
  await llm.adapt({ prompt: PROMPT, completion: COMPLETION, adapter: 'bench', steps: 1 });
  results[targets.join('+')] = (
    await llm.adapt({ prompt: PROMPT, completion: COMPLETION, adapter: 'bench', steps: 4 })
  ).stepMs;
}
console.log(JSON.stringify({ step_ms: results }));
await llm.dispose();
