// One load of the demo model in Pyodide under Node, as benchmarks/boot_bench.py runs it (one process
// per visit): prints { boot_ms, plan_ms, python_ms, load_ms, boot, text } as JSON.
//   node benchmarks/boot_node.mjs PYODIDE_DIST MODEL_FOLDER [true|false (bootCache; default: not given)]
// The boot snapshot goes to $RUVLLM_CACHE_DIR/boot (the caller gives each run its own folder).
import { RuvLLM } from '../npm/src/index.js';

const [dist, model, bootCache] = process.argv.slice(2);
const started = performance.now();
let bootMs = null;
let planMs = null; // the first step after the boot in every version of the worker (for before/after)
const llm = await RuvLLM.load({
  model,
  pyodide: { indexURL: dist },
  ...(bootCache === undefined ? {} : { bootCache: bootCache !== 'false' }),
  onProgress: (p) => {
    if (p.boot) bootMs = performance.now() - started;
    if (p.phase === 'plan' && planMs === null) planMs = performance.now() - started;
  },
});
const loadMs = performance.now() - started;
let text = '';
for await (const c of llm.generate('The capital of France is', { temperature: 0, maxTokens: 8 })) text += c.text;
const boot = llm.info.boot ?? null; // versions before the boot snapshot have none
const result = { boot_ms: bootMs, plan_ms: planMs, python_ms: boot?.ms ?? null, load_ms: loadMs, boot, text };
await llm.dispose();
process.stdout.write(`${JSON.stringify(result)}\n`);
