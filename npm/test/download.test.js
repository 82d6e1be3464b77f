// Downloads that go wrong: a server that never answers or stops midway (a stall timeout names the URL),
// an abort, a load that fails after opening its files. None may hang, and none may leave a partial copy
// in the cache folder. Against a local server; the loads through RuvLLM.load fail before Pyodide boots.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, beforeEach, test } from 'node:test';

import { AbortError, RuvLLM, RuvLLMError } from '../src/index.js';
import { openFile, readJson } from '../src/worker/files.js';
import { feedLoader } from '../src/worker/weights.js';
import { fakeLoader } from './support/loader.js';

const SIZE = 1 << 20;
const BODY = new Uint8Array(SIZE);
new DataView(BODY.buffer).setBigUint64(0, 100n, true); // a safetensors-like 100-byte header follows

let server;
let base;
const hits = new Map();
const authorization = new Map(); // URL: the Authorization header it came with
const open = new Set(); // sockets, so that the stalled ones can be closed at the end

before(async () => {
  server = createServer((req, res) => {
    hits.set(req.url, (hits.get(req.url) ?? 0) + 1);
    authorization.set(req.url, req.headers.authorization ?? null);
    const [, mode, name] = req.url.split('/');
    if (mode === 'silent') return; // accepts the connection, never answers
    if (name === 'model.safetensors.index.json') {
      if (mode !== 'shards') return res.writeHead(404).end();
      const map = { a: 'model-1.safetensors', b: 'model-2.safetensors' };
      return res.writeHead(200).end(JSON.stringify({ weight_map: map }));
    }
    if (mode === 'shards' && name === 'model-2.safetensors') {
      res.writeHead(200, { 'Transfer-Encoding': 'chunked' }); // no size: the load refuses it
      return res.end(BODY);
    }
    res.writeHead(200, { 'Content-Length': SIZE });
    if (mode === 'stall') return res.write(BODY.subarray(0, SIZE >> 2)); // a quarter, then nothing
    res.end(BODY);
  });
  server.on('connection', (socket) => {
    open.add(socket);
    socket.on('close', () => open.delete(socket));
  });
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  base = `http://127.0.0.1:${server.address().port}`;
});

let cache;
const made = [];
beforeEach(async () => {
  cache = await mkdtemp(join(tmpdir(), 'ruvllm-download-'));
  made.push(cache);
  process.env.RUVLLM_CACHE_DIR = cache;
  hits.clear();
});

after(async () => {
  for (const socket of open) socket.destroy();
  server.close();
  await Promise.all(made.map((dir) => rm(dir, { recursive: true, force: true })));
});

const partial = () => join(cache, 'urls', 'partial'); // downloads under way (cache-folder.js)
const partials = async () => (existsSync(partial()) ? readdir(partial()) : []);

const stalled = (url, ms) => (e) =>
  e instanceof RuvLLMError &&
  e.type === 'download' &&
  e.message.endsWith(`${url} sent nothing for ${ms / 1000} s; giving up (the stallTimeoutMs load option)`);

test('a token (hfToken or $HF_TOKEN) goes to the hub endpoint only', async () => {
  const hub = { hfEndpoint: base, hfToken: 'hf_secret' };
  const ask = (url, options) => readJson(url, 'config.json', { cache: false, ...options }).catch(() => null); // (not JSON)
  await ask(`${base}/m/`, { hub });
  assert.equal(authorization.get('/m/config.json'), 'Bearer hf_secret');
  const elsewhere = { hfEndpoint: 'https://huggingface.co', hfToken: 'hf_secret' };
  await ask(`${base}/n/`, { hub: elsewhere });
  assert.equal(authorization.get('/n/config.json'), null); // this server is not the hub
});

test('a server that accepts the connection and never answers fails after the stall timeout, naming the URL', async () => {
  await assert.rejects(
    readJson(`${base}/silent/`, 'config.json', { stallTimeoutMs: 200 }),
    stalled(`${base}/silent/config.json`, 200),
  );
});

test('a body that stops midway fails after the stall timeout, and leaves no partial copy', async () => {
  const file = await openFile(`${base}/stall/`, 'model.safetensors', { stallTimeoutMs: 200 });
  let got = 0;
  await assert.rejects(
    async () => {
      for await (const chunk of file.chunks) got += chunk.length;
    },
    stalled(`${base}/stall/model.safetensors`, 200),
  );
  assert.equal(got, SIZE >> 2);
  assert.equal(await file.stored, false);
  assert.deepEqual(await partials(), []);
});

test('a file is not given up on while the reader is busy elsewhere: only waits on the server count', async () => {
  const file = await openFile(`${base}/m/`, 'model.safetensors', { stallTimeoutMs: 100 });
  await new Promise((done) => setTimeout(done, 300)); // the reader does other work (another shard, Python)
  let got = 0;
  for await (const chunk of file.chunks) got += chunk.length;
  assert.equal(got, SIZE);
  assert.equal(await file.stored, true);
});

test('an abort stops a download midway with an AbortError and removes its partial copy', async () => {
  const controller = new AbortController();
  const file = await openFile(`${base}/stall/`, 'model.safetensors', { signal: controller.signal });
  await assert.rejects(async () => {
    for await (const _ of file.chunks) controller.abort();
  }, AbortError);
  assert.equal(await file.stored, false);
  assert.deepEqual(await partials(), []);
  await assert.rejects(openFile(`${base}/m/`, 'model.safetensors', { signal: controller.signal }), AbortError);
});

test('a load that fails after opening its files (a refused plan, a shard without a size) leaves no partial copy', async () => {
  await assert.rejects(feedLoader(fakeLoader({ refusePlan: true }), `${base}/m/`, {}), /the plan does not fit/);
  assert.deepEqual(await partials(), []);
  await assert.rejects(
    feedLoader(fakeLoader(), `${base}/shards/`, {}),
    (e) => e.type === 'download' && /model-2.safetensors: the server did not say how large it is/.test(e.message),
  );
  assert.deepEqual(await partials(), []);
  await assert.rejects(feedLoader(fakeLoader({ gguf: 'm.gguf', refusePlan: true }), `${base}/m/`, {}), /does not fit/);
  assert.deepEqual(await partials(), []);
});

test('RuvLLM.load of a silent server fails with a download error naming the URL, then loads start afresh', async () => {
  const url = `${base}/silent/`;
  await assert.rejects(RuvLLM.load({ model: url, stallTimeoutMs: 300 }), stalled(`${url}config.json`, 300));
  // each load has its own worker: the next one is not held up by the stalled one
  await assert.rejects(RuvLLM.load({ model: url, stallTimeoutMs: 300 }), stalled(`${url}config.json`, 300));
  assert.equal(hits.get('/silent/config.json'), 2);
});

test('an aborted RuvLLM.load rejects with an AbortError once the worker has removed its partial download', async () => {
  const controller = new AbortController();
  const loading = RuvLLM.load({ model: `${base}/stall/`, signal: controller.signal });
  // the worker is downloading config.json (a quarter of it came, then the server went quiet)
  while (!(await partials()).length) await new Promise((done) => setTimeout(done, 20));
  controller.abort();
  await assert.rejects(loading, (e) => e instanceof AbortError && e.message === 'loading aborted');
  assert.deepEqual(await partials(), []);
});
