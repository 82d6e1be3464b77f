// The real SmolLM2 model in Pyodide under Node, against the CPython engine. Needs a local Pyodide
// distribution (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1); skipped, with how to get one, without it.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFile, mkdir, mkdtemp, open, readFile, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { AbortError, RuvLLM, RuvLLMError } from '../src/index.js';
import { DIST, HAVE_DIST } from './support/dist.js';
import { NO_RELAXED, relaxedHere } from './support/relaxed.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct');
const PYTHON = process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python');
const SKIP = HAVE_DIST
  ? false
  : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`;
const run = promisify(execFile);
const PYODIDE = { indexURL: DIST };
const GREEDY = { temperature: 0, maxTokens: 24, ignoreEos: true };

/** What `ruvllm generate --json` answers on CPython: greedy, `maxTokens` tokens, with the given flags. */
async function cpython(prompt, maxTokens, ...flags) {
  const args = ['-m', 'ruvllm', 'generate', MODEL, '--prompt', prompt, '--temperature', '0'];
  const options = { maxBuffer: 1 << 24 };
  const { stdout } = await run(PYTHON, [...args, '--max-tokens', String(maxTokens), '--json', ...flags], options);
  return JSON.parse(stdout);
}

/** CPython's greedy answer as the SmolLM2 tests compare it: 24 tokens, end-of-sequence ignored. */
const cpythonGreedy = (prompt, chat) => cpython(prompt, 24, '--ignore-eos', ...(chat ? ['--chat'] : []));

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

async function loadError(options) {
  try {
    const llm = await RuvLLM.load({ pyodide: PYODIDE, ...options });
    await llm.dispose();
  } catch (error) {
    assert.ok(error instanceof RuvLLMError, `expected a RuvLLMError, got ${error}`);
    return error;
  }
  assert.fail('the load succeeded');
}

describe('SmolLM2 in Pyodide under Node', { skip: SKIP }, () => {
  let llm;
  before(async () => {
    const progress = [];
    llm = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE, onProgress: (p) => progress.push(p) });
    const downloads = progress.filter((p) => p.phase === 'download');
    assert.equal(downloads.at(-1).loaded, downloads.at(-1).total);
    assert.ok(llm.info.heapBytes > 0 && llm.info.parameters === 134515008);
    // By default the WebAssembly kernels compute, on the model's own q4 values (CPython: f32 with BLAS),
    // with 'fast' arithmetic: the greedy tokens below equal CPython's (measured; its perplexity is within
    // 0.002% of exact). 'exact' arithmetic guarantees them: tested below.
    assert.deepEqual([llm.info.kernels, llm.info.arithmetic, llm.info.kernelsNote], ['wasm', 'fast', null]);
    assert.equal(llm.info.relaxedSimd, !NO_RELAXED && relaxedHere()); // (Node 20: the plain build)
    assert.equal(llm.info.plan.compute, 'q4');
  });
  after(async () => llm?.dispose());

  const cases = [
    ['Once upon a time', false],
    ['The three primary colors are', false],
    ['What is the capital of France?', true],
    ['Write a short poem about the sea.', true],
  ];
  for (const [prompt, chat] of cases) {
    test(`greedy tokens equal CPython: ${chat ? 'chat' : 'raw'} "${prompt}"`, async () => {
      const expected = await cpythonGreedy(prompt, chat);
      const ids = await llm.tokenize(chat ? [{ role: 'user', content: prompt }] : prompt);
      assert.deepEqual(ids, expected.prompt_token_ids);
      const chunks = await collect(llm.generate(ids, GREEDY));
      assert.deepEqual(
        chunks.map((c) => c.tokenId),
        expected.token_ids,
      );
      assert.equal(chunks.map((c) => c.text).join(''), expected.text);
      assert.equal(chunks.at(-1).finishReason, expected.finish_reason);
    });
  }

  test('ruvllm-js --json carries the same token ids as ruvllm --json', async () => {
    const expected = await cpythonGreedy('What is the capital of France?', true);
    const args = [
      join(ROOT, 'npm', 'bin', 'ruvllm-js.js'),
      'generate',
      MODEL,
      '--prompt',
      'What is the capital of France?',
      '--chat',
    ];
    const { stdout } = await run(process.execPath, [
      ...args,
      '--temperature',
      '0',
      '--max-tokens',
      '24',
      '--ignore-eos',
      '--json',
      '--pyodide',
      DIST,
    ]);
    const got = JSON.parse(stdout);
    assert.deepEqual(Object.keys(got), ['text', 'token_ids', 'prompt_token_ids', 'finish_reason', 'stats']);
    assert.deepEqual(Object.keys(got.stats), Object.keys(expected.stats));
    assert.deepEqual(got.token_ids, expected.token_ids);
    assert.deepEqual(got.prompt_token_ids, expected.prompt_token_ids);
    assert.equal(got.text, expected.text);
  });

  test('an abort in the middle of a stream stops it, and the model keeps working', async () => {
    const controller = new AbortController();
    const seen = [];
    await assert.rejects(
      async () => {
        for await (const c of llm.generate('Once upon a time', {
          ...GREEDY,
          maxTokens: 200,
          signal: controller.signal,
        })) {
          seen.push(c.tokenId);
          if (seen.length === 3) controller.abort();
        }
      },
      (e) => e instanceof AbortError,
    );
    assert.equal(seen.length, 3);
    const expected = await cpythonGreedy('Once upon a time', false);
    assert.deepEqual(
      (await collect(llm.generate('Once upon a time', GREEDY))).map((c) => c.tokenId),
      expected.token_ids,
    );
  });

  // After an abort the worker must stop the aborted generation within a few tokens, not run it to
  // maxTokens (before the fix it did: the next request waited ~200 token times). Counted, not timed: the
  // KV cache's positions after the abort say how far it went (the next request is answered after it).
  for (const how of ['break', 'signal']) {
    test(`after an abort (${how}) the worker stops the generation within a few tokens`, async () => {
      const prompt = 'Once upon a time';
      const promptTokens = (await llm.tokenize(prompt)).length;
      const controller = new AbortController();
      let seen = 0;
      const stream = llm.generate(prompt, { ...GREEDY, maxTokens: 400, ignoreEos: true, signal: controller.signal });
      try {
        for await (const _ of stream) {
          if (++seen === 4) {
            if (how === 'break') break;
            controller.abort();
          }
        }
      } catch (error) {
        assert.ok(error instanceof AbortError, `expected an AbortError, got ${error}`);
      }
      const { seenPositions } = await llm.cacheStats();
      // the worker may have run ahead of this thread by some tokens on a busy machine: far fewer than 400
      assert.ok(
        seenPositions <= promptTokens + seen + 64,
        `${seenPositions} positions computed after an abort at token ${seen} of 400 (prompt ${promptTokens})`,
      );
      const next = await collect(llm.generate('Hello', { temperature: 0, maxTokens: 1 }));
      assert.equal(next.length, 1); // and the worker answers the next request
    });
  }

  test('an abort while a long prompt is read stops reading it', async () => {
    const longPrompt = Array.from({ length: 4000 }, (_, i) => 2000 + (i % 5000)); // 125 chunks of 32 positions
    const controller = new AbortController();
    const stream = collect(llm.generate(longPrompt, { maxTokens: 1, signal: controller.signal }));
    await new Promise((done) => setTimeout(done, 300));
    controller.abort();
    await assert.rejects(stream, (e) => e instanceof AbortError);
    const { seenPositions } = await llm.cacheStats();
    assert.ok(seenPositions < longPrompt.length, `${seenPositions} of ${longPrompt.length} prompt positions read`);
    const next = await collect(llm.generate('Hello', { temperature: 0, maxTokens: 1 }));
    assert.equal(next.length, 1);
  });

  test('two consecutive generations are independent', async () => {
    const first = await collect(llm.chat([{ role: 'user', content: 'Name a fruit.' }], GREEDY));
    await collect(
      llm.generate('Something else entirely, to fill the cache', { maxTokens: 8, temperature: 0.9, seed: 4 }),
    );
    const second = await collect(llm.chat([{ role: 'user', content: 'Name a fruit.' }], GREEDY));
    assert.deepEqual(
      second.map((c) => c.tokenId),
      first.map((c) => c.tokenId),
    );
  });

  test('seeded sampling reproduces', async () => {
    const options = { temperature: 1, topK: 0, topP: 1, minP: 0, seed: 7, maxTokens: 16, ignoreEos: true };
    const a = await collect(llm.generate('My favourite animal is', options));
    const b = await collect(llm.generate('My favourite animal is', options));
    assert.deepEqual(
      a.map((c) => c.tokenId),
      b.map((c) => c.tokenId),
    );
  });

  test('a prompt longer than the context is a context_full error', async () => {
    await assert.rejects(
      collect(llm.generate('word '.repeat(5000))),
      (e) => e instanceof RuvLLMError && e.type === 'context_full' && /but the context window is 4096/.test(e.message),
    );
  });

  test('invalid options are invalid_argument errors naming the option', async () => {
    // refused by the facade (src/options.js) before the request is posted
    await assert.rejects(
      async () => collect(llm.generate('x', { temperature: -1 })),
      (e) => e.type === 'invalid_argument' && e.message === 'options.temperature must be a finite number >= 0, got -1',
    );
    await assert.rejects(
      async () => collect(llm.generate('x', { topP: 1.5 })),
      (e) => e.type === 'invalid_argument' && e.message === 'options.topP must be a finite number in (0, 1], got 1.5',
    );
    await assert.rejects(
      async () => collect(llm.generate('x', { temprature: 1 })),
      (e) =>
        e.type === 'invalid_argument' &&
        /^options\.temprature is not an option of generate \(did you mean temperature\?\)/.test(e.message),
    );
  });
});

describe('bad models in Pyodide under Node', { skip: SKIP }, () => {
  test('a bad model URL is a download error naming the file', async () => {
    const server = createServer((req, res) => {
      res.writeHead(404);
      res.end();
    });
    await new Promise((done) => server.listen(0, '127.0.0.1', done));
    const url = `http://127.0.0.1:${server.address().port}/no/such/model/`;
    const error = await loadError({ model: url });
    server.close();
    assert.equal(error.type, 'download');
    assert.equal(error.message, `config.json: ${url}config.json answered HTTP 404 Not Found`);
  });

  test('a corrupted weight file is a load error naming the file', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'ruvllm-corrupt-'));
    for (const name of ['config.json', 'tokenizer.json', 'tokenizer_config.json', 'generation_config.json'])
      await copyFile(join(MODEL, name), join(dir, name));
    const bytes = await readFile(join(MODEL, 'model.safetensors'));
    bytes.fill(0x7b, 8, 40); // the JSON header turns into garbage
    const handle = await open(join(dir, 'model.safetensors'), 'w');
    await handle.write(bytes);
    await handle.close();
    const error = await loadError({ model: dir });
    assert.equal(error.type, 'load');
    assert.match(error.message, /^model\.safetensors: the header is not valid JSON/);
  });

  test('a weight file that fails its sha256 is a download error', async () => {
    const error = await loadError({ model: MODEL, sha256: { 'model.safetensors': '0'.repeat(64) } });
    assert.equal(error.type, 'download');
    assert.match(error.message, /^model\.safetensors: sha256 mismatch: expected 0{64}, got [0-9a-f]{64}$/);
  });
});

describe('memory options in Pyodide under Node', { skip: SKIP }, () => {
  test('q4 weights and a two-tier cache give the tokens CPython gives with the same options', async () => {
    // 37 prompt tokens + 47 fed back: past 8 hot + a 64-position migration batch, so the cold tier fills.
    const flags = ['--chat', '--ignore-eos', '--compute', 'q4', '--hot-tokens', '8', '--cold', 'int8'];
    const expected = await cpython('What is the capital of France?', 48, ...flags);
    const plans = [];
    const llm = await RuvLLM.load({
      model: MODEL,
      pyodide: PYODIDE,
      compute: 'q4',
      kv: { hotTokens: 8, cold: 'int8' },
      onProgress: (p) => p.phase === 'plan' && plans.push(p.plan),
    });
    try {
      assert.equal(plans.length, 1);
      assert.equal(plans[0].compute, 'q4');
      assert.deepEqual(llm.info.plan, plans[0]);
      assert.ok(llm.info.plan.weightBytes < 120e6);
      const messages = [{ role: 'user', content: 'What is the capital of France?' }];
      const chunks = await collect(llm.chat(messages, { ...GREEDY, maxTokens: 48 }));
      assert.deepEqual(
        chunks.map((c) => c.tokenId),
        expected.token_ids,
      );
      const stats = await llm.cacheStats();
      assert.ok(stats.coldPositions > 0 && stats.coldFormat === 'int8', JSON.stringify(stats));
      assert.equal(stats.hotPositions + stats.coldPositions, expected.prompt_token_ids.length + 47);
      // the next turn starts with what the cache holds: only the new tokens are computed
      const next = [
        ...messages,
        { role: 'assistant', content: chunks.map((c) => c.text).join('') },
        { role: 'user', content: 'And of Italy?' },
      ];
      const again = await collect(llm.chat(next, { ...GREEDY, maxTokens: 4 }));
      assert.ok(again[0].stats.cachedTokens >= expected.prompt_token_ids.length, JSON.stringify(again[0].stats));
    } finally {
      await llm.dispose();
    }
  });

  for (const [options, described] of [
    [{ arithmetic: 'exact' }, ['wasm', 'exact', 'q4']],
    [{ kernels: 'numpy', compute: 'q4' }, ['numpy', 'exact', 'q4']],
  ]) {
    test(`${JSON.stringify(options)} gives the tokens CPython gives`, async () => {
      const expected = await cpythonGreedy('Write a short poem about the sea.', true);
      const other = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE, ...options });
      try {
        assert.deepEqual([other.info.kernels, other.info.arithmetic, other.info.plan.compute], described);
        const chunks = await collect(other.generate(expected.prompt_token_ids, GREEDY));
        assert.deepEqual(
          chunks.map((c) => c.tokenId),
          expected.token_ids,
        );
      } finally {
        await other.dispose();
      }
    });
  }

  test('a plan that cannot fit the memory budget fails before the download', async () => {
    const phases = [];
    const error = await loadError({
      model: MODEL,
      memoryBudget: 32 * 2 ** 20,
      onProgress: (p) => phases.push(p.phase),
    });
    assert.equal(error.type, 'load');
    assert.match(
      error.message,
      /^the model does not fit the memory budget of 32 MiB: in its smallest form \(q4\) it needs weights/,
    );
    assert.ok(!phases.includes('download'), `phases: ${phases}`);
  });
});

describe('MicroLoRA in Pyodide under Node', { skip: SKIP }, () => {
  test('learning runs in idle time: a generation asked for after the first step starts within one slice', async () => {
    const llm = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE });
    try {
      await llm.newAdapter({ name: 'bg' });
      const events = [];
      const progress = [];
      let stepped;
      const firstStep = new Promise((resolve) => (stepped = resolve));
      const feedback = {
        prompt: 'The secret code is',
        completion: ' BLUE-42.',
        adapter: 'bg',
        steps: 8,
        untilGreedy: false,
      };
      const lesson = llm.adapt(feedback, {
        onProgress: (p) => {
          progress.push(p);
          events.push({ learning: p.step, version: p.version });
          if (p.applied) stepped();
        },
      });
      await firstStep; // applied: the next answer already uses it
      // the instant loop: its first step a slice at a time, each slice's progress told, then the step;
      // before it, the fresh adapter's spectra (keyed rows), their job started at load, when not made yet
      assert.deepEqual(events.at(-1), { learning: 1, version: 1 });
      assert.ok(
        progress.slice(0, -1).every((p) => ['preparing', 'learning'].includes(p.phase) && p.step === 0 && !p.applied),
        JSON.stringify(progress),
      );
      // Two requests go out together: `adapters`, answered once the worker has taken them in, and the
      // generation. What the worker sent before that answer was on its way when they arrived (as many
      // slices as this thread was late to ask, on a busy machine), so only the slices after it count.
      const taken = llm.adapters().then(() => events.push({ taken: true }));
      for await (const chunk of llm.generate('Hello', { maxTokens: 3, temperature: 0 }))
        events.push({ chunk: chunk.text });
      await taken;
      const report = await lesson;
      const firstChunk = events.findIndex((e) => 'chunk' in e);
      const slicesBetween = events.slice(events.findIndex((e) => 'taken' in e) + 1, firstChunk).length;
      assert.ok(slicesBetween <= 1, `learning slices between taking the request and its first chunk: ${slicesBetween}`);
      assert.ok(
        events.slice(firstChunk).some((e) => 'learning' in e),
        'learning resumed after the generation',
      );
      assert.equal(report.steps, 8);
      assert.ok(report.logProbAfter > report.logProbBefore, JSON.stringify(report));
      // what it did, in order: the fresh adapter's spectra made, counted in units, if its job (started
      // at load) had not finished; its first step (the instant loop); its other steps; the rehearsal;
      // done. Never cancelled; the wall time grows.
      const applied = progress.slice(progress.findIndex((p) => p.applied));
      const phases = applied.map((p) => p.phase).filter((phase, i, all) => i === 0 || all[i - 1] !== phase);
      assert.deepEqual(phases, ['learning', 'rehearsing', 'done']);
      const preparing = progress.filter((p) => p.phase === 'preparing');
      assert.ok(
        preparing.every(
          (p, i) =>
            p.step === 0 &&
            p.prepared.done < p.prepared.total &&
            (i === 0 || p.prepared.done > preparing[i - 1].prepared.done),
        ),
        JSON.stringify(preparing.map((p) => p.prepared)),
      );
      const steps = applied.map((p) => p.step);
      assert.ok(steps.every((step, i) => i === 0 || step >= steps[i - 1]) && steps.at(-1) === 8, `${steps}`);
      assert.ok(new Set(applied.filter((p) => p.phase === 'learning').map((p) => p.step)).size > 1, `${steps}`);
      assert.ok(progress.every((p, i) => i === 0 || p.elapsedMs >= progress[i - 1].elapsedMs));
      assert.ok(report.wallMs >= progress.at(-2).elapsedMs && report.outcome === 'most_steps', JSON.stringify(report));
      const versions = { bg: 8 + report.rehearsalSteps }; // every optimizer step, rehearsal ones included
      const { adapters: described, ...listed } = await llm.adapters();
      // (a LoRA adapter runs in the decode plan: only an X-LoRA mixture takes forwards out of it)
      const plan = { decodePlan: true, planNote: null };
      assert.deepEqual(listed, { names: ['bg'], active: 'bg', versions, learning: 0, preparing: false, ...plan });
      assert.deepEqual(
        described.map((a) => [a.name, a.kind, a.version, a.active]),
        [['bg', 'lora', versions.bg, true]],
      );

      // a lesson cancelled (its signal aborted) keeps the steps it took and takes no more
      const controller = new AbortController();
      const long = llm.adapt(
        { ...feedback, completion: ' GREEN-7.', steps: 500 },
        { signal: controller.signal, onProgress: (p) => p.applied && controller.abort() },
      );
      await assert.rejects(long, (e) => e instanceof AbortError && e.message === 'learning cancelled');
      const after = await llm.adapters();
      assert.equal(after.learning, 0);
      assert.ok(after.versions.bg > versions.bg && after.versions.bg < versions.bg + 12, JSON.stringify(after));
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert.deepEqual(await llm.adapters(), after); // nothing learned since
    } finally {
      await llm.dispose();
    }
  });

  test('a lesson on what greedy decoding already gives takes no step and says why, at once', async () => {
    const llm = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE });
    try {
      const prompt = 'The capital of France is';
      // one token: a longer answer may hold a near tie that the lesson's products (many rows at once)
      // round the other way than decoding's (a row at a time)
      const answer = (await collect(llm.generate(prompt, { temperature: 0, maxTokens: 1 }))).map((c) => c.text);
      const progress = [];
      const report = await llm.adapt(
        { prompt, completion: answer.join(''), adapter: 'fresh' },
        { onProgress: (p) => progress.push(p) },
      );
      assert.equal(report.steps, 0);
      assert.equal(report.outcome, 'already');
      assert.ok(Math.abs(report.logProbAfter - report.logProbBefore) < 1e-3, JSON.stringify(report)); // (rounding)
      const applied = progress.find((p) => p.applied);
      // told as soon as the first check is done, and it does not wait for the fresh adapter's projection
      assert.deepEqual([applied.phase, applied.step, applied.outcome], ['rehearsing', 0, 'already']);
      assert.ok(!progress.some((p) => p.phase === 'preparing' || p.phase === 'cancelled'), JSON.stringify(progress));
      assert.deepEqual((await llm.adapters()).versions, { fresh: 0 });
    } finally {
      await llm.dispose();
    }
  });

  test('adapt learns a fact, saves an adapter CPython reads, and loads one CPython wrote', async () => {
    const llm = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE });
    try {
      const greedy = async (prompt) =>
        (await collect(llm.generate(prompt, { temperature: 0, maxTokens: 6 }))).map((c) => c.text).join('');
      const before = await greedy('The secret code is');
      assert.ok(!before.startsWith(' BLUE-42'));
      await llm.newAdapter({ name: 'facts', targets: ['down_proj'] });
      const report = await llm.adapt({ prompt: 'The secret code is', completion: ' BLUE-42.', adapter: 'facts' });
      assert.ok(report.logProbAfter - report.logProbBefore > 3, JSON.stringify(report));
      assert.ok(report.stepMs > 0);
      // the answer changed (whether greedy decoding already gives the fact is tests/test_learning.py's
      // question: a lesson that ends a step short of it is left to the next rehearsal)
      const learned = await greedy('The secret code is');
      assert.notEqual(learned, before);
      await llm.setAdapter(null);
      assert.equal(await greedy('The secret code is'), before);

      // our files load in CPython, which then generates the same tokens
      const files = await llm.saveAdapter('facts');
      assert.deepEqual(Object.keys(files).sort(), [
        'adapter_config.json',
        'adapter_model.safetensors',
        'learning_state.safetensors',
      ]);
      const dir = await mkdtemp(join(tmpdir(), 'ruvllm-adapter-'));
      for (const [name, bytes] of Object.entries(files)) await writeFile(join(dir, name), bytes);
      const cpu = await cpython('The secret code is', 6, '--adapter', dir);
      await llm.setAdapter('facts');
      assert.deepEqual(
        (await collect(llm.generate('The secret code is', { temperature: 0, maxTokens: 6 }))).map((c) => c.tokenId),
        cpu.token_ids,
      );

      // an adapter written by CPython loads here by path, and switches per request
      const name = await llm.loadAdapter(dir, { name: 'from-cpython' });
      assert.equal(name, 'from-cpython');
      const viaRequest = await collect(
        llm.generate('The secret code is', { temperature: 0, maxTokens: 6, adapter: 'from-cpython' }),
      );
      assert.deepEqual(
        viaRequest.map((c) => c.tokenId),
        cpu.token_ids,
      );
      const base = await collect(llm.generate('The secret code is', { temperature: 0, maxTokens: 6, adapter: null }));
      assert.notDeepEqual(
        base.map((c) => c.tokenId),
        cpu.token_ids,
      );
      await assert.rejects(
        llm.setAdapter('nope'),
        (e) => e.type === 'invalid_argument' && /no adapter named 'nope'/.test(e.message),
      );

      // X-LoRA: the fact's adapter and a blank one mixed per token; its router learns from feedback; the
      // mixture saves in PEFT's layout (experts in subfolders), CPython reads it and gives the same
      // tokens, and it loads back here without reloading the model
      await llm.newAdapter({ name: 'blank', targets: ['down_proj'] });
      const mixed = await llm.mixAdapters('both', ['facts', 'blank']);
      assert.deepEqual(mixed, { name: 'both', experts: ['facts', 'blank'], topK: null });
      const routeReport = await llm.adapt({ prompt: 'The secret code is', completion: ' BLUE-42.', adapter: 'both' });
      assert.ok(routeReport.logProbAfter > routeReport.logProbBefore, JSON.stringify(routeReport));
      const held = (await llm.adapters()).adapters.find((a) => a.name === 'both');
      assert.deepEqual([held.kind, held.experts, held.active], ['xlora', ['facts', 'blank'], true]);
      assert.ok(held.version > 0);
      const mixFiles = await llm.saveAdapter('both');
      assert.deepEqual(Object.keys(mixFiles).sort(), [
        'adapter_config.json',
        'adapter_model.safetensors',
        'blank/adapter_config.json',
        'blank/adapter_model.safetensors',
        'facts/adapter_config.json',
        'facts/adapter_model.safetensors',
      ]);
      const mixDir = await mkdtemp(join(tmpdir(), 'ruvllm-xlora-'));
      for (const [name, bytes] of Object.entries(mixFiles)) {
        await mkdir(dirname(join(mixDir, name)), { recursive: true });
        await writeFile(join(mixDir, name), bytes);
      }
      const cpuMixed = await cpython('The secret code is', 6, '--adapter', mixDir);
      const here = await collect(llm.generate('The secret code is', { temperature: 0, maxTokens: 6 }));
      assert.deepEqual(
        here.map((c) => c.tokenId),
        cpuMixed.token_ids,
      );
      assert.equal(await llm.loadAdapter(mixDir, { name: 'reloaded' }), 'reloaded');
      // a crafted config whose expert names are paths: refused before anything is fetched from them
      const config = JSON.parse(new TextDecoder().decode(mixFiles['adapter_config.json']));
      const evil = await mkdtemp(join(tmpdir(), 'ruvllm-evil-'));
      await writeFile(join(evil, 'adapter_config.json'), JSON.stringify({ ...config, adapters: { '../facts': '' } }));
      await writeFile(join(evil, 'adapter_model.safetensors'), mixFiles['adapter_model.safetensors']);
      await assert.rejects(
        llm.loadAdapter(evil, { name: 'evil' }),
        (e) =>
          e instanceof RuvLLMError && e.type === 'load' && e.message.includes('"../facts" is not a plain folder name'),
      );
      const reloaded = await collect(
        llm.generate('The secret code is', { temperature: 0, maxTokens: 6, adapter: 'reloaded' }),
      );
      assert.deepEqual(
        reloaded.map((c) => c.tokenId),
        cpuMixed.token_ids,
      );
    } finally {
      await llm.dispose();
    }
  });
});
