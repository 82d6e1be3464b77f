// One load of the demo model in Pyodide under Node, as benchmarks/boot_bench.py runs it (one process
// per visit): prints { boot_ms, plan_ms, python_ms, load_ms, boot, text } as JSON (the figures and the
// timed load: benchmarks/browser/boot-timing.js, shared with the page benchmarks/browser/boot.html).
//   node benchmarks/boot_node.mjs PYODIDE_DIST MODEL_FOLDER [true|false (bootCache; default: not given)]
// The boot snapshot goes to $RUVLLM_CACHE_DIR/boot (the caller gives each run its own folder).
import { RuvLLM } from '../npm/src/index.js';
import { timedLoad } from './browser/boot-timing.js';

const [dist, model, bootCache] = process.argv.slice(2);
const { result, llm } = await timedLoad(RuvLLM, { model, indexURL: dist, bootCache });
await llm.dispose();
process.stdout.write(`${JSON.stringify(result)}\n`);
