// The real SmolLM2 in Pyodide under Node, after bad input: an abort in the middle of the weights' download,
// prompts far too long for the context window, bad options. Each fails at once with a typed error, leaves
// nothing behind, and the next load or request works. Needs a local Pyodide distribution
// (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1); skipped, saying how to get one, without it.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, open, readdir, readFile, rm, symlink } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { AbortError, RuvLLM, RuvLLMError } from '../src/index.js';
import { DIST, HAVE_DIST } from './support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct');
const SKIP = HAVE_DIST
  ? false
  : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`;
const PYODIDE = { indexURL: DIST };
const HUGE = 'All work and no play makes Jack a dull boy. '.repeat(120_000); // 5.3 MB

async function collect(stream) {
  const items = [];
  for await (const item of stream) items.push(item);
  return items;
}

describe('SmolLM2 in Pyodide under Node, after bad input', { skip: SKIP }, () => {
  let server;
  let url;
  let cache;
  let llm;
  before(async () => {
    cache = await mkdtemp(join(tmpdir(), 'ruvllm-robust-'));
    process.env.RUVLLM_CACHE_DIR = cache;
    // the weights go out 1 MiB every 20 ms (about 2 s in all), so that an abort lands in the middle
    server = createServer(async (req, res) => {
      const path = join(MODEL, req.url.slice(1));
      if (!existsSync(path)) return res.writeHead(404).end();
      if (!req.url.endsWith('.safetensors')) return res.writeHead(200).end(await readFile(path));
      const file = await open(path);
      const { size } = await file.stat();
      res.writeHead(200, { 'Content-Length': size });
      res.on('close', () => file.close().catch(() => {}));
      const piece = Buffer.alloc(1 << 20);
      for (let at = 0; at < size && !res.destroyed; at += piece.length) {
        const { bytesRead } = await file.read(piece, 0, piece.length, at);
        await new Promise((done) => res.write(piece.subarray(0, bytesRead), done));
        await new Promise((done) => setTimeout(done, 20));
      }
      res.end();
    });
    await new Promise((done) => server.listen(0, '127.0.0.1', done));
    url = `http://127.0.0.1:${server.address().port}/`;
  });
  after(async () => {
    await llm?.dispose();
    server.close();
    await rm(cache, { recursive: true, force: true });
  });

  test('a load aborted while the weights download removes its partial copy; the next load works', async () => {
    const controller = new AbortController();
    const onProgress = (p) => {
      if (p.phase === 'download' && p.fileLoaded > 8 << 20) controller.abort();
    };
    await assert.rejects(
      RuvLLM.load({ model: url, pyodide: PYODIDE, signal: controller.signal, onProgress }),
      (e) => e instanceof AbortError && e.message === 'loading aborted',
    );
    assert.deepEqual(await readdir(join(cache, 'urls', 'partial')), []); // downloads under way (cache-folder.js)
    llm = await RuvLLM.load({ model: url, pyodide: PYODIDE });
    const chunks = await collect(llm.generate('Once upon a time', { temperature: 0, maxTokens: 4, ignoreEos: true }));
    assert.equal(chunks.length, 4);
    assert.equal(llm.info.contextLength, 4096);
  });

  test('a prompt far longer than the context window is refused by its length, before it is tokenized', async () => {
    const tooLong = (e) =>
      e instanceof RuvLLMError &&
      e.type === 'context_full' &&
      /has 5,280,000 characters, at least 65,185 tokens with this tokenizer: more than the context window of 4,096$/.test(
        e.message,
      );
    await assert.rejects(async () => collect(llm.generate(HUGE)), tooLong);
    await assert.rejects(async () => collect(llm.chat([{ role: 'user', content: HUGE }])), tooLong);
    await assert.rejects(() => llm.completions.create({ prompt: HUGE, max_tokens: 1 }), tooLong);
    await assert.rejects(() => llm.chat.completions.create({ messages: [{ role: 'user', content: HUGE }] }), tooLong);
    await assert.rejects(
      () => llm.adapt({ prompt: 'Q: ', completion: HUGE }),
      (e) => e.type === 'invalid_argument' && /^the completion has 5,280,000 characters/.test(e.message),
    );
    // a prompt just too long for the window, but not by its length alone, is tokenized and refused by count
    await assert.rejects(
      async () => collect(llm.generate('All work and no play. '.repeat(1000))),
      (e) => e.type === 'context_full' && e.message === 'the prompt has 6001 tokens but the context window is 4096',
    );
  });

  test('bad options are refused by name, and the same model answers the next request', async () => {
    const refused = (message) => (e) =>
      e instanceof RuvLLMError && e.type === 'invalid_argument' && e.message === message;
    await assert.rejects(
      async () => collect(llm.generate('Hi', { temperature: NaN })),
      refused('options.temperature must be a finite number >= 0, got NaN'),
    );
    await assert.rejects(
      async () => collect(llm.generate('Hi', { maxTokens: 2 ** 64 })),
      refused('options.maxTokens must be an integer in [1, 4096] (the context length), got 18446744073709552000'),
    );
    await assert.rejects(
      () => llm.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], temperature: NaN }),
      refused('body.temperature must be a finite number, got NaN'),
    );
    const chunks = await collect(llm.chat([{ role: 'user', content: 'Hi' }], { temperature: 0, maxTokens: 3 }));
    assert.equal(chunks.length, 3);
  });

  test('a schema no answer can hold is refused naming its keyword, and the next request is answered', async () => {
    const format = (schema) => ({ type: 'json_schema', json_schema: { name: 's', schema } });
    const body = (schema) => ({ messages: [{ role: 'user', content: 'Hi' }], response_format: format(schema) });
    await assert.rejects(
      () => llm.chat.completions.create(body({ type: 'string', minLength: 1e9 })),
      (e) =>
        e instanceof RuvLLMError &&
        e.type === 'invalid_argument' &&
        e.message ===
          "response_format.json_schema.schema: json_schema: 'minLength' 1,000,000,000 at the root needs more than the " +
            '41,472 bytes a document may have (the default max_tokens of constrained output, 512 of at most 81 bytes each)',
    );
    await assert.rejects(
      () => llm.chat.completions.create(body({ type: 'string', pattern: '('.repeat(5000) + 'a' + ')'.repeat(5000) })),
      (e) => e.type === 'invalid_argument' && /groups nest deeper than 32 levels at the root$/.test(e.message),
    );
    const answer = await llm.chat.completions.create({ ...body({ type: 'integer' }), max_tokens: 4, temperature: 0 });
    assert.ok(Number.isInteger(JSON.parse(answer.choices[0].message.content)));
  });

  test('dispose() during a generation stops it at the next token, not at its end', async () => {
    const stream = llm.generate('Once upon a time', { temperature: 0, maxTokens: 4000, ignoreEos: true });
    let after = 0;
    let disposed = null;
    await assert.rejects(
      async () => {
        for await (const _ of stream) {
          if (disposed) after += 1;
          else disposed = llm.dispose();
        }
      },
      (e) => e instanceof AbortError && e.message === 'aborted: the model was disposed',
    );
    await disposed;
    assert.ok(after <= 2, `${after} tokens came after dispose()`); // (4000 before: the whole generation)
    await assert.rejects(llm.tokenize('x'), (e) => e.message === 'this model was disposed');
    llm = null;
  });

  test('a distribution folder without a runtime file is a load error that names it (the worker lives on)', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'ruvllm-dist-'));
    try {
      for (const name of await readdir(DIST)) {
        if (name !== 'pyodide.asm.wasm') await symlink(join(DIST, name), join(folder, name));
      }
      await assert.rejects(
        RuvLLM.load({ model: MODEL, pyodide: { indexURL: folder } }),
        (e) =>
          e instanceof RuvLLMError &&
          e.type === 'load' &&
          e.message.startsWith(`pyodide.indexURL ${folder}/ is not a Pyodide distribution: it has no pyodide.asm.wasm`),
      );
    } finally {
      await rm(folder, { recursive: true, force: true });
    }
  });
});
