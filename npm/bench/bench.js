// npm run bench: prefill, TTFT, decode speed and peak memory of SmolLM2 in Pyodide under Node, beside
// the same figures from the CPython engine measured in the same run.
//
//   RUVLLM_PYODIDE_DIST=... npm run bench [-- --model DIR --prompt-tokens N --gen-tokens M]
import { execFile } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';

import { RuvLLM } from '../src/index.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const { values } = parseArgs({
  options: {
    model: { type: 'string', default: join(ROOT, 'models', 'smollm2-135m-instruct') },
    'gen-tokens': { type: 'string', default: '64' },
    pyodide: { type: 'string', default: process.env.RUVLLM_PYODIDE_DIST || join(homedir(), '.cache', 'ruvllm', 'pyodide', '314.0.1') },
    python: { type: 'string', default: process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python') },
  },
});
const GEN = Number(values['gen-tokens']);
const PROMPT = 'The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined '
  + 'movable metal type, oil-based ink and a wooden press adapted from wine making. Within fifty years, presses';
const MiB = 2 ** 20;

if (!existsSync(join(values.pyodide, 'pyodide.asm.wasm'))) {
  console.error(`no Pyodide distribution at ${values.pyodide}: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)`);
  process.exit(1);
}

async function pyodideRun() {
  const t0 = performance.now();
  const llm = await RuvLLM.load({ model: values.model, pyodide: { indexURL: values.pyodide } });
  const loadMs = performance.now() - t0;
  const rssAfterLoad = process.resourceUsage().maxRSS * 1024;
  const ids = await llm.tokenize(PROMPT);
  let last;
  for await (const c of llm.generate(ids, { temperature: 0, maxTokens: GEN, ignoreEos: true })) last = c;
  const peakRss = process.resourceUsage().maxRSS * 1024;
  const info = llm.info;
  await llm.dispose();
  return { loadMs, promptTokens: ids.length, ...last.stats, heapBytes: info.heapBytes, rssAfterLoad, peakRss };
}

const PYTHON_BENCH = `
import json, resource, sys, time
import ruvllm
t0 = time.perf_counter()
model = ruvllm.load(sys.argv[1])
load_ms = (time.perf_counter() - t0) * 1000
rss_after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ids = model.tokenizer.encode(sys.argv[2])
for chunk in model.generate(ids, temperature=0, max_tokens=int(sys.argv[3]), ignore_eos=True):
    last = chunk
s = last.stats
print(json.dumps({"loadMs": load_ms, "promptTokens": len(ids), "prefillMs": s.prefill_ms, "ttftMs": s.ttft_ms,
                  "decodeTokS": s.decode_tok_s, "rssAfterLoad": rss_after_load,
                  "peakRss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
`;

async function cpythonRun(threads) {
  const env = { ...process.env, OPENBLAS_NUM_THREADS: String(threads), OMP_NUM_THREADS: String(threads) };
  const { stdout } = await promisify(execFile)(values.python, ['-c', PYTHON_BENCH, values.model, PROMPT, String(GEN)], { env });
  return JSON.parse(stdout);
}

const weightsBytes = statSync(join(values.model, 'model.safetensors')).size;
console.log(`model ${values.model} (model.safetensors ${(weightsBytes / MiB).toFixed(1)} MiB); prompt and ${GEN} greedy tokens`);
const cpu1 = await cpythonRun(1);
const pyo = await pyodideRun();
const cpu2 = await cpythonRun(2);

const rows = [
  ['load (ms)', (r) => r.loadMs.toFixed(0)],
  ['prompt tokens', (r) => String(r.promptTokens)],
  ['prefill (ms)', (r) => r.prefillMs.toFixed(0)],
  ['TTFT (ms)', (r) => r.ttftMs.toFixed(0)],
  ['decode (tok/s)', (r) => r.decodeTokS.toFixed(2)],
  ['peak RSS after load (MiB)', (r) => (r.rssAfterLoad / MiB).toFixed(0)],
  ['peak RSS (MiB)', (r) => (r.peakRss / MiB).toFixed(0)],
  ['wasm heap (MiB)', (r) => (r.heapBytes ? (r.heapBytes / MiB).toFixed(0) : '-')],
];
const header = ['', 'Pyodide (Node)', 'CPython 1 thread', 'CPython 2 threads'];
const table = [header, ...rows.map(([name, f]) => [name, f(pyo), f(cpu1), f(cpu2)])];
const widths = header.map((_, i) => Math.max(...table.map((r) => r[i].length)));
for (const row of table) console.log(row.map((cell, i) => (i ? cell.padStart(widths[i]) : cell.padEnd(widths[i]))).join('  '));
console.log(`\nPyodide / CPython (1 thread): decode ${(pyo.decodeTokS / cpu1.decodeTokS).toFixed(2)}x, prefill time ${(pyo.prefillMs / cpu1.prefillMs).toFixed(1)}x`);
