// npm run bench: prefill, TTFT, decode speed and memory of a model in Pyodide under Node (through this
// package), beside `ruvllm bench` on CPython with the same prompt, measured in the same run.
//
//   RUVLLM_PYODIDE_DIST=... npm run bench -- [--model DIR] [--prompt-length N] [--gen-length M]
//        [--compute auto,f32,q8,q4] [--kernels auto,wasm,numpy] [--arithmetic exact,fast]
//        [--cpython-compute f32] [--hot-tokens H --cold int8|int4] [--json]
//
// --compute, --kernels and --arithmetic take comma-separated lists: Pyodide runs every combination
// (arithmetic only matters to the wasm kernels). CPython runs with --cpython-compute (default f32, its
// fastest form with OpenBLAS), on 1 thread and on 2.
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';

import { RuvLLM } from '../src/index.js';
import { DIST } from '../test/support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const { values } = parseArgs({
  options: {
    model: { type: 'string', default: join(ROOT, 'models', 'smollm2-135m-instruct') },
    'prompt-length': { type: 'string', default: '128' },
    'gen-length': { type: 'string', default: '64' },
    compute: { type: 'string', default: 'auto' },
    kernels: { type: 'string', default: 'auto' },
    arithmetic: { type: 'string', default: 'fast' },
    'cpython-compute': { type: 'string', default: 'f32' },
    'hot-tokens': { type: 'string' },
    cold: { type: 'string', default: 'int8' },
    json: { type: 'boolean', default: false },
    pyodide: { type: 'string', default: DIST },
    python: { type: 'string', default: process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python') },
  },
});
const PROMPT = Number(values['prompt-length']);
const GEN = Number(values['gen-length']);
const HOT = values['hot-tokens'] ? Number(values['hot-tokens']) : undefined;
const MiB = 2 ** 20;

if (!existsSync(join(values.pyodide, 'pyodide.asm.wasm'))) {
  console.error(`no Pyodide distribution at ${values.pyodide}: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)`);
  process.exit(1);
}

async function pyodideRun(compute, kernels, arithmetic) {
  const started = performance.now();
  const llm = await RuvLLM.load({
    model: values.model,
    pyodide: { indexURL: values.pyodide },
    compute,
    kernels,
    arithmetic,
    kv: HOT ? { hotTokens: HOT, cold: values.cold } : undefined,
  });
  const loadMs = performance.now() - started;
  const text = readFileSync(join(ROOT, 'py_src', 'ruvllm', 'data', 'calibration.txt'), 'utf8');
  let ids = await llm.tokenize(text);
  while (ids.length < PROMPT) ids = ids.concat(ids);
  ids = ids.slice(0, PROMPT);
  let last;
  for await (const c of llm.generate(ids, { temperature: 0, maxTokens: GEN, ignoreEos: true })) last = c;
  const kv = await llm.cacheStats();
  const info = llm.info;
  await llm.dispose();
  const how = info.kernels === 'wasm' ? `wasm ${info.arithmetic}` : 'numpy';
  return {
    runtime: `Pyodide ${info.plan.compute} ${how}`,
    compute: info.plan.compute,
    load_ms: loadMs,
    prompt_tokens: ids.length,
    prefill_ms: last.stats.prefillMs,
    ttft_ms: last.stats.ttftMs,
    decode_tok_s: last.stats.decodeTokS,
    peak_rss_bytes: process.resourceUsage().maxRSS * 1024,
    wasm_heap_bytes: info.heapBytes,
    weight_bytes: info.plan.weightBytes,
    kv_hot_bytes: kv.hotBytes,
    kv_cold_bytes: kv.coldBytes,
  };
}

async function cpythonRun(threads) {
  const env = { ...process.env, OPENBLAS_NUM_THREADS: String(threads), OMP_NUM_THREADS: String(threads) };
  const args = [
    '-m',
    'ruvllm',
    'bench',
    values.model,
    '--prompt-length',
    String(PROMPT),
    '--gen-length',
    String(GEN),
    '--compute',
    values['cpython-compute'],
    '--format',
    'json',
    '--threads', // ruvllm chooses BLAS threads itself (threadpoolctl): the variables above are not enough
    String(threads),
  ];
  if (HOT) args.push('--hot-tokens', String(HOT), '--cold', values.cold);
  const { stdout } = await promisify(execFile)(values.python, args, { env });
  return {
    runtime: `CPython ${threads} thread${threads > 1 ? 's' : ''}`,
    ...JSON.parse(stdout),
    wasm_heap_bytes: null,
  };
}

const list = (name) => values[name].split(',');
const pyodideRuns = [];
for (const compute of list('compute'))
  for (const kernels of list('kernels'))
    for (const arithmetic of kernels === 'numpy' ? ['exact'] : list('arithmetic'))
      pyodideRuns.push([compute, kernels, arithmetic]);
const results = [await cpythonRun(1)];
for (const run of pyodideRuns) results.push(await pyodideRun(...run));
results.push(await cpythonRun(2));
if (values.json) {
  console.log(JSON.stringify(results, null, 1));
} else {
  const rows = [
    ['compute', (r) => r.compute],
    ['prompt tokens', (r) => String(r.prompt_tokens)],
    ['prefill (ms)', (r) => r.prefill_ms.toFixed(0)],
    ['TTFT (ms)', (r) => r.ttft_ms.toFixed(0)],
    ['decode (tok/s)', (r) => r.decode_tok_s.toFixed(2)],
    ['peak RSS (MiB)', (r) => (r.peak_rss_bytes / MiB).toFixed(0)],
    ['wasm heap (MiB)', (r) => (r.wasm_heap_bytes ? (r.wasm_heap_bytes / MiB).toFixed(0) : '-')],
    ['weights (MiB)', (r) => (r.weight_bytes / MiB).toFixed(1)],
    ['KV hot / cold (MiB)', (r) => `${(r.kv_hot_bytes / MiB).toFixed(1)} / ${(r.kv_cold_bytes / MiB).toFixed(1)}`],
  ];
  const header = ['', ...results.map((r) => r.runtime)];
  const table = [header, ...rows.map(([name, f]) => [name, ...results.map(f)])];
  const widths = header.map((_, i) => Math.max(...table.map((r) => r[i].length)));
  console.log(
    `model ${values.model}; ${PROMPT}-token prompt, ${GEN} greedy tokens${HOT ? `; KV ${HOT} hot + ${values.cold}` : ''}`,
  );
  for (const row of table)
    console.log(row.map((cell, i) => (i ? cell.padStart(widths[i]) : cell.padEnd(widths[i]))).join('  '));
  const cpu1 = results[0];
  console.log('');
  for (const pyo of results.slice(1, -1))
    console.log(
      `${pyo.runtime} / CPython ${cpu1.compute} 1 thread: decode ${(pyo.decode_tok_s / cpu1.decode_tok_s).toFixed(2)}x, prefill time ${(pyo.prefill_ms / cpu1.prefill_ms).toFixed(1)}x`,
    );
}
