// `threads` in RuvLLM.load: SmolLM2 in Pyodide under Node on 1, 2 and 3 threads gives CPython's greedy
// tokens (exact arithmetic) and the one-thread tokens (fast arithmetic); info.threads says how many
// threads run; dispose() and a failed load leave no thread behind (the program exits by itself). Needs
// a local Pyodide distribution and the built kernels.
import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { copyFile, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { RuvLLM } from '../src/index.js';
import { DIST, HAVE_DIST } from './support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct');
const PYTHON = process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python');
const BUILT = existsSync(new URL('../wasm/kernels-shared.wasm', import.meta.url));
const SKIP = !HAVE_DIST
  ? `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)`
  : !BUILT
    ? 'the kernels are not built: ./build.sh kernels'
    : false;
const PYODIDE = { indexURL: DIST };
const PROMPT = 'The three primary colors are';
const GREEDY = { temperature: 0, maxTokens: 16, ignoreEos: true };
const run = promisify(execFile);

async function greedyIds(llm, prompt) {
  const ids = [];
  for await (const chunk of llm.generate(prompt, GREEDY)) ids.push(chunk.tokenId);
  return ids;
}

/** CPython's greedy ids (`ruvllm generate --json`), 16 tokens, end-of-sequence ignored. */
async function cpythonIds(prompt, model = MODEL) {
  const args = ['-m', 'ruvllm', 'generate', model, '--prompt', prompt, '--temperature', '0', '--max-tokens', '16'];
  const { stdout } = await run(PYTHON, [...args, '--json', '--ignore-eos'], { maxBuffer: 1 << 24 });
  return JSON.parse(stdout).token_ids;
}

/** A Node program run to its end: a thread left running keeps it alive, and the timeout (a hang guard) ends it. */
async function runProgram(source) {
  const folder = await mkdtemp(join(tmpdir(), 'ruvllm-threads-'));
  try {
    const file = join(folder, 'program.mjs');
    await writeFile(file, source);
    return spawnSync(process.execPath, [file], { encoding: 'utf8', timeout: 300000 });
  } finally {
    await rm(folder, { recursive: true });
  }
}
const INDEX = JSON.stringify(fileURLToPath(new URL('../src/index.js', import.meta.url)));

describe('threads', { skip: SKIP }, () => {
  // a long prompt (over 4 rows: the tiled prefill path) and decoding (1 row)
  const long = `${PROMPT} red, yellow and blue. In painting, mixing two of them gives a secondary color:`;

  test('greedy tokens at 1, 2 and 3 threads equal CPython (exact), and at 3 one thread (fast)', async () => {
    const expected = { short: await cpythonIds(PROMPT), long: await cpythonIds(long) };
    let fastOne = null;
    const heap = {}; // Pyodide's memory after loading, by thread count (exact runs)
    const runs = [1, 2, 3].map((threads) => [threads, 'exact']).concat([1, 3].map((threads) => [threads, 'fast']));
    for (const [threads, arithmetic] of runs) {
      const llm = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE, threads, arithmetic });
      try {
        assert.deepEqual(llm.info.threads.count, threads);
        assert.equal(llm.info.threads.adaptive, false);
        if (threads === 1) assert.match(llm.info.threads.reason, /threads: 1/);
        else assert.equal(llm.info.threads.reason, null);
        // with the pool, its memory holds the weights (and Pyodide's memory no longer does)
        if (threads === 1) assert.equal(llm.info.poolBytes, 0);
        else assert.ok(llm.info.poolBytes >= llm.info.weightBytes, `${llm.info.poolBytes} < ${llm.info.weightBytes}`);
        const got = { short: await greedyIds(llm, PROMPT), long: await greedyIds(llm, long) };
        if (arithmetic === 'exact') heap[threads] = llm.info.heapBytes;
        if (arithmetic === 'exact') assert.deepEqual(got, expected, `exact at ${threads} threads`);
        else if (fastOne === null) fastOne = got;
        else assert.deepEqual(got, fastOne, `fast at ${threads} threads`);
      } finally {
        await llm.dispose();
      }
    }
    // the weights (106 MiB) are in the pool's memory, and the file never was in Pyodide's: its heap is
    // smaller by most of them (171 -> 78 MiB when measured)
    const weightBytes = 106 * 2 ** 20;
    for (const threads of [2, 3]) assert.ok(heap[threads] + weightBytes / 2 < heap[1], JSON.stringify(heap));
  });

  test("a GGUF at 2 threads (its file outside Pyodide's memory) gives CPython's ids; sha256 is checked", async () => {
    const gguf = join(ROOT, 'build', 'downloads', 'SmolLM2-135M-Instruct.Q4_1.gguf');
    const name = 'SmolLM2-135M-Instruct.Q4_1.gguf';
    const expected = await cpythonIds(PROMPT, gguf);
    const digest = createHash('sha256')
      .update(await readFile(gguf))
      .digest('hex');
    const llm = await RuvLLM.load({
      model: gguf,
      pyodide: PYODIDE,
      threads: 2,
      arithmetic: 'exact',
      sha256: { [name]: digest },
    });
    try {
      assert.equal(llm.info.threads.count, 2);
      assert.deepEqual(await greedyIds(llm, PROMPT), expected);
    } finally {
      await llm.dispose();
    }
    await assert.rejects(
      RuvLLM.load({ model: gguf, pyodide: PYODIDE, threads: 2, sha256: { [name]: '0'.repeat(64) } }),
      (e) =>
        e.type === 'download' &&
        e.message.includes(`${name}: sha256 mismatch: expected ${'0'.repeat(64)}, got ${digest}`),
    );
  });

  test("the default, 'auto', runs the cores of this machine (at most 8) adaptively, with CPython's tokens", async () => {
    const llm = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE, arithmetic: 'exact' }); // (no threads option)
    try {
      const cores = (await import('node:os')).availableParallelism();
      assert.equal(llm.info.threads.count, Math.min(cores, 8));
      assert.equal(llm.info.threads.adaptive, cores > 1);
      if (cores === 1) assert.match(llm.info.threads.reason, /reports 1 core/);
      // each kind of product switches between one thread and all as it measures them: the same tokens
      assert.deepEqual(await greedyIds(llm, PROMPT), await cpythonIds(PROMPT));
    } finally {
      await llm.dispose();
    }
  });

  test("with kernels: 'numpy' one thread runs and info.threads says why", async () => {
    const llm = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE, threads: 2, kernels: 'numpy' });
    try {
      assert.equal(llm.info.threads.count, 1);
      assert.match(llm.info.threads.reason, /WebAssembly kernels do not run here/);
    } finally {
      await llm.dispose();
    }
  });

  test('after an abort the pool computes on; after dispose() and a failed load no thread is left: the program exits', async () => {
    // a copy of the model with a corrupted weight file: the load fails after the threads started
    const broken = await mkdtemp(join(tmpdir(), 'ruvllm-broken-'));
    try {
      for (const name of await readdir(MODEL)) await copyFile(join(MODEL, name), join(broken, name));
      const weights = (await readdir(broken)).find((n) => n.endsWith('.safetensors'));
      await writeFile(join(broken, weights), 'not safetensors');
      const program = `
        import { RuvLLM } from ${INDEX};
        const pyodide = ${JSON.stringify(PYODIDE)};
        const llm = await RuvLLM.load({ model: ${JSON.stringify(MODEL)}, pyodide, threads: 3 });
        console.log('threads', llm.info.threads.count);
        const controller = new AbortController(); // aborted mid-generation: the pool is free for the next
        try {
          for await (const _ of llm.generate('Hi', { maxTokens: 50, signal: controller.signal })) controller.abort();
        } catch (error) {
          console.log('aborted', error.name);
        }
        let tokens = 0;
        for await (const _ of llm.generate('Hi', { maxTokens: 2, ignoreEos: true })) tokens++;
        console.log('after', tokens);
        await llm.dispose();
        try {
          await RuvLLM.load({ model: ${JSON.stringify(broken + '/')}, pyodide, threads: 3 });
        } catch (error) {
          console.log('failed', error.type);
        }
      `;
      const result = await runProgram(program);
      assert.equal(result.signal, null, 'the program did not exit by itself');
      assert.equal(result.status, 0, result.stderr);
      assert.equal(result.stdout, 'threads 3\naborted AbortError\nafter 2\nfailed load\n');
    } finally {
      await rm(broken, { recursive: true });
    }
  });
});
