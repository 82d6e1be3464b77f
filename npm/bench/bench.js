// npm run bench: load time, prefill, TTFT, decode speed and memory of a model in Pyodide under Node (through
// this package), beside `ruvllm bench` on CPython with the same prompt, measured in the same run.
//
//   RUVLLM_PYODIDE_DIST=... npm run bench -- [--model DIR|FILE.gguf] [--prompt-length N] [--gen-length M]
//        [--compute auto,f32,q8,q4] [--kernels auto,wasm,numpy] [--arithmetic exact,fast] [--threads 1,2]
//        [--runs R] [--warmup] [--cpython-compute f32] [--no-cpython] [--no-plan] [--hot-tokens H --cold int8|int4]
//        [--json]
//
// --compute, --kernels, --arithmetic and --threads take comma-separated lists: Pyodide runs every combination
// (arithmetic only matters to the wasm kernels; threads is the load option: 1..64 or auto). --model is a model
// folder or a GGUF file. --runs repeats the whole list, interleaved (1, 2, 1, 2 threads with --runs 2) so the
// noise of a shared machine shows between the runs of one configuration; --warmup first loads and runs the first
// configuration once, unmeasured (the process's first load pays one-time costs). Each Pyodide row has the heaps
// apart: Pyodide's WebAssembly memory (info.heapBytes) and the kernel thread pool's (info.poolBytes, which holds
// the weights when threads > 1); peak RSS is the process's high-water mark so far, so it only grows down the
// table. With more than one thread count the ratios to the first (e.g. 2 vs 1 threads) follow the table, run by
// run. CPython runs with --cpython-compute (default f32, its fastest form with OpenBLAS) on 1 thread and on 2,
// unless --no-cpython (a 3B model on CPython is slow and large). --no-plan loads with plan: false (each product
// driven from Python, not the decode plan).
//
// Issue 25's rows (see benchmarks/README.md):
//   npm run bench -- --model ../build/downloads/SmolLM2-135M-Instruct.Q4_1.gguf --kernels wasm --threads 1,2 \
//        --runs 2 --warmup --no-cpython
import { execFile } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
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
    threads: { type: 'string', default: '1' },
    runs: { type: 'string', default: '1' },
    warmup: { type: 'boolean', default: false },
    'cpython-compute': { type: 'string', default: 'f32' },
    'no-cpython': { type: 'boolean', default: false },
    'no-plan': { type: 'boolean', default: false },
    'hot-tokens': { type: 'string' },
    cold: { type: 'string', default: 'int8' },
    json: { type: 'boolean', default: false },
    pyodide: { type: 'string', default: DIST },
    python: { type: 'string', default: process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python') },
  },
});

/** A positive integer option, or a one-line error naming it. */
function positive(name) {
  const text = values[name];
  if (!/^[1-9][0-9]*$/.test(text)) fail(`--${name} must be a positive integer, got ${JSON.stringify(text)}`);
  return Number(text);
}

function fail(message) {
  console.error(message);
  process.exit(1);
}

const PROMPT = positive('prompt-length');
const GEN = positive('gen-length');
const RUNS = positive('runs');
const HOT = values['hot-tokens'] ? positive('hot-tokens') : undefined;
const MODEL = resolve(values.model);
const MiB = 2 ** 20;

if (!existsSync(MODEL)) fail(`--model ${values.model}: no such folder or GGUF file`);
if (!statSync(MODEL).isDirectory() && !MODEL.endsWith('.gguf'))
  fail(`--model ${values.model}: expected a model folder or a .gguf file`);
if (!existsSync(join(values.pyodide, 'pyodide.asm.wasm')))
  fail(`no Pyodide distribution at ${values.pyodide}: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)`);
const THREADS = values.threads.split(',').map((t) => {
  if (t === 'auto') return t;
  if (!/^[1-9][0-9]*$/.test(t))
    fail(`--threads takes a comma-separated list of 'auto' and integers >= 1, got ${JSON.stringify(t)}`);
  return Number(t);
});

async function pyodideRun(compute, kernels, arithmetic, threads) {
  const started = performance.now();
  const llm = await RuvLLM.load({
    model: MODEL,
    pyodide: { indexURL: values.pyodide },
    compute,
    kernels,
    arithmetic,
    threads,
    plan: !values['no-plan'],
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
  const count = info.threads?.count ?? 1;
  return {
    runtime: `Pyodide ${info.plan.compute} ${how} ${threads}t${info.decodePlan ? '' : ' (no plan)'}`,
    config: [compute, kernels, arithmetic].join(':'),
    compute: info.plan.compute,
    threads_asked: threads,
    threads: count,
    threads_reason: info.threads?.reason ?? null,
    load_ms: loadMs,
    prompt_tokens: ids.length,
    prefill_ms: last.stats.prefillMs,
    prefill_tok_s: (ids.length * 1000) / last.stats.prefillMs,
    ttft_ms: last.stats.ttftMs,
    decode_tok_s: last.stats.decodeTokS,
    peak_rss_bytes: process.resourceUsage().maxRSS * 1024,
    wasm_heap_bytes: info.heapBytes,
    pool_bytes: info.poolBytes ?? 0,
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
    MODEL,
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
  const started = performance.now();
  const { stdout } = await promisify(execFile)(values.python, args, { env });
  const result = JSON.parse(stdout);
  return {
    runtime: `CPython ${threads} thread${threads > 1 ? 's' : ''}`,
    ...result,
    threads,
    load_ms: null, // the subprocess's wall time would count Python's start-up too
    wall_ms: performance.now() - started,
    prefill_tok_s: (result.prompt_tokens * 1000) / result.prefill_ms,
    wasm_heap_bytes: null,
    pool_bytes: null,
  };
}

const list = (name) => values[name].split(',');
const pyodideRuns = [];
for (const compute of list('compute'))
  for (const kernels of list('kernels'))
    for (const arithmetic of kernels === 'numpy' ? ['exact'] : list('arithmetic'))
      for (const threads of THREADS) pyodideRuns.push([compute, kernels, arithmetic, threads]);
const results = [];
// the process's first load pays one-time costs (reading the files into the page cache, Pyodide's first boot)
if (values.warmup) await pyodideRun(...pyodideRuns[0]);
if (!values['no-cpython']) results.push(await cpythonRun(1));
for (let run = 0; run < RUNS; run++)
  for (const config of pyodideRuns) {
    const result = await pyodideRun(...config);
    result.run = run;
    if (RUNS > 1) result.runtime += ` #${run + 1}`;
    results.push(result);
  }
if (!values['no-cpython']) results.push(await cpythonRun(2));

const mib = (bytes) => (bytes == null ? '-' : (bytes / MiB).toFixed(0));
if (values.json) {
  console.log(JSON.stringify(results, null, 1));
} else {
  const rows = [
    ['compute', (r) => r.compute],
    ['threads (count)', (r) => String(r.threads)],
    ['load (s)', (r) => (r.load_ms == null ? '-' : (r.load_ms / 1000).toFixed(2))],
    ['prompt tokens', (r) => String(r.prompt_tokens)],
    ['prefill (ms)', (r) => r.prefill_ms.toFixed(0)],
    ['prefill (tok/s)', (r) => r.prefill_tok_s.toFixed(1)],
    ['TTFT (ms)', (r) => r.ttft_ms.toFixed(0)],
    ['decode (tok/s)', (r) => r.decode_tok_s.toFixed(2)],
    ['wasm heap (MiB)', (r) => mib(r.wasm_heap_bytes)],
    ['pool (MiB)', (r) => mib(r.pool_bytes)],
    ['peak RSS (MiB)', (r) => mib(r.peak_rss_bytes)],
    ['weights (MiB)', (r) => (r.weight_bytes / MiB).toFixed(1)],
    ['KV hot / cold (MiB)', (r) => `${(r.kv_hot_bytes / MiB).toFixed(1)} / ${(r.kv_cold_bytes / MiB).toFixed(1)}`],
  ];
  const header = ['', ...results.map((r) => r.runtime)];
  const table = [header, ...rows.map(([name, f]) => [name, ...results.map(f)])];
  const widths = header.map((_, i) => Math.max(...table.map((r) => r[i].length)));
  console.log(
    `model ${MODEL}; ${PROMPT}-token prompt, ${GEN} greedy tokens${HOT ? `; KV ${HOT} hot + ${values.cold}` : ''}`,
  );
  for (const row of table)
    console.log(row.map((cell, i) => (i ? cell.padStart(widths[i]) : cell.padEnd(widths[i]))).join('  '));
  const pyodide = results.filter((r) => r.run !== undefined);
  for (const r of pyodide)
    if (r.threads_asked !== r.threads)
      console.log(
        `${r.runtime}: asked ${r.threads_asked} threads, got ${r.threads} (${r.threads_reason ?? 'no reason given'})`,
      );
  if (THREADS.length > 1) {
    // each thread count against the first, within one configuration and one run (the closest in time)
    console.log('');
    for (const r of pyodide) {
      if (r.threads_asked === THREADS[0]) continue;
      const base = pyodide.find((b) => b.run === r.run && b.config === r.config && b.threads_asked === THREADS[0]);
      console.log(
        `${r.runtime} / ${base.runtime}: load ${(r.load_ms / base.load_ms).toFixed(2)}x,` +
          ` prefill ${(r.prefill_tok_s / base.prefill_tok_s).toFixed(2)}x, decode ${(r.decode_tok_s / base.decode_tok_s).toFixed(2)}x` +
          ` (tok/s ratios; load is a time ratio), memory ${mib(r.wasm_heap_bytes + r.pool_bytes)} vs` +
          ` ${mib(base.wasm_heap_bytes + base.pool_bytes)} MiB (heap + pool)`,
      );
    }
  }
  if (!values['no-cpython']) {
    const cpu1 = results[0];
    console.log('');
    for (const pyo of pyodide)
      console.log(
        `${pyo.runtime} / CPython ${cpu1.compute} 1 thread: decode ${(pyo.decode_tok_s / cpu1.decode_tok_s).toFixed(2)}x, prefill time ${(pyo.prefill_ms / cpu1.prefill_ms).toFixed(1)}x`,
      );
  }
}
