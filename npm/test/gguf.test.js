// Gemma 3 270M from its GGUF in Pyodide under Node, by hub name from a local server laid out as the
// hub is (no hub is reachable here), against the CPython engine loading the same file. Needs a local
// Pyodide distribution (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1) and the GGUF
// (`./build.sh gemma`); skipped, saying how to get them, without.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createReadStream, existsSync, statSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { RuvLLM, RuvLLMError } from '../src/index.js';
import { DIST, HAVE_DIST } from './support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const GGUF = join(ROOT, 'build', 'downloads', 'gemma-3-270m-q4_k_m.gguf');
const PYTHON = process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python');
const SKIP = !HAVE_DIST
  ? `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`
  : existsSync(GGUF)
    ? false
    : `no ${GGUF}: ./build.sh gemma fetches it`;
const PYODIDE = { indexURL: DIST };
const run = promisify(execFile);

async function cpython(prompt, chat) {
  const args = ['-m', 'ruvllm', 'generate', GGUF, '--prompt', prompt, '--temperature', '0', '--max-tokens', '24'];
  const { stdout } = await run(PYTHON, [...args, '--json', ...(chat ? ['--chat'] : [])], { maxBuffer: 1 << 24 });
  return JSON.parse(stdout);
}

/** A server answering /<owner>/<repo>/resolve/main/<file> with the GGUF; counts the bytes it sent. */
async function hubServer() {
  const served = { bytes: 0, requests: [] };
  const server = createServer((request, response) => {
    served.requests.push(request.url);
    if (request.url !== '/google/gemma-3-270m-GGUF/resolve/main/gemma-3-270m-q4_k_m.gguf') {
      response.writeHead(404).end('not found');
      return;
    }
    response.writeHead(200, { 'Content-Length': statSync(GGUF).size, 'Content-Type': 'application/octet-stream' });
    const stream = createReadStream(GGUF, { highWaterMark: 1 << 16 });
    stream.on('data', (chunk) => (served.bytes += chunk.length));
    stream.pipe(response);
    response.on('close', () => stream.destroy());
  });
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  return { server, served, endpoint: `http://127.0.0.1:${server.address().port}` };
}

const NAME = 'hf:google/gemma-3-270m-GGUF/gemma-3-270m-q4_k_m.gguf';

describe('Gemma 3 GGUF in Pyodide under Node', { skip: SKIP }, () => {
  let hub;
  let llm;
  before(async () => {
    hub = await hubServer();
    const cache = await mkdtemp(join(tmpdir(), 'ruvllm-gguf-cache-'));
    process.env.RUVLLM_CACHE_DIR = cache;
    const phases = [];
    llm = await RuvLLM.load({
      model: NAME,
      hfEndpoint: hub.endpoint,
      pyodide: PYODIDE,
      contextLength: 512,
      onProgress: (p) => phases.push(p.phase),
    });
    assert.deepEqual([...new Set(phases)], ['runtime', 'plan', 'download', 'load']);
    assert.deepEqual(
      [llm.info.architecture, llm.info.parameters, llm.info.chatTemplate, llm.info.kernels],
      ['Gemma3ForCausalLM', 268098176, 'built-in gemma', 'wasm'],
    );
    assert.equal(llm.info.downloadedBytes, statSync(GGUF).size);
    // kept where CPython's `ruvllm download` of the same name keeps it (a plain server: its size checked)
    const kept = join(cache, 'hub', 'google', 'gemma-3-270m-GGUF', 'main', 'gemma-3-270m-q4_k_m.gguf');
    assert.equal(statSync(kept).size, statSync(GGUF).size);
  });
  after(async () => {
    await llm?.dispose();
    hub?.server.close();
  });

  for (const [prompt, chat] of [
    ['The capital of France is', false],
    ['Write a haiku about the sea.', true],
  ]) {
    test(`greedy tokens equal CPython's on the same GGUF: ${chat ? 'chat' : 'raw'} "${prompt}"`, async () => {
      const expected = await cpython(prompt, chat);
      const input = chat ? [{ role: 'user', content: prompt }] : prompt;
      assert.deepEqual(await llm.tokenize(input), expected.prompt_token_ids);
      const chunks = [];
      const stream = chat
        ? llm.chat(input, { temperature: 0, maxTokens: 24 })
        : llm.generate(input, { temperature: 0, maxTokens: 24 });
      for await (const c of stream) chunks.push(c);
      assert.deepEqual(
        chunks.map((c) => c.tokenId).filter((id) => id !== null),
        expected.token_ids.filter((id) => id !== null),
      );
      assert.equal(chunks.map((c) => c.text).join(''), expected.text);
    });
  }

  test('a plan that cannot fit is refused from the header, before the tensor data is fetched', async () => {
    const before = hub.served.bytes;
    await assert.rejects(
      RuvLLM.load({
        model: NAME,
        hfEndpoint: hub.endpoint,
        pyodide: PYODIDE,
        memoryBudget: 64 * 2 ** 20,
        cache: false,
      }),
      (e) =>
        e instanceof RuvLLMError && e.type === 'load' && /does not fit the memory budget of 64 MiB/.test(e.message),
    );
    await new Promise((done) => setTimeout(done, 500));
    const sent = hub.served.bytes - before;
    assert.ok(sent < statSync(GGUF).size / 4, `the server sent ${sent} bytes`);
  });

  test('a hub name that does not exist is a download error naming the URL', async () => {
    await assert.rejects(
      RuvLLM.load({ model: 'hf:google/nope/x.gguf', hfEndpoint: hub.endpoint, pyodide: PYODIDE, cache: false }),
      (e) =>
        e.type === 'download' &&
        e.message.includes(`${hub.endpoint}/google/nope/resolve/main/x.gguf answered HTTP 404`),
    );
  });
});
