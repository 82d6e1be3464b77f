// The Node file cache: files given by URL are kept on disk (the cache root's urls/ folder), checked before
// use, written atomically. (test/shared-cache.test.js: the root's rule and its hub/ folder, shared with CPython.)
// The cache logic runs against a local server that counts requests; the last tests load the real model
// in Pyodide and need a local distribution (skipped, with how to get one, without it).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, readdir, rm, truncate, utimes, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { homedir, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { RuvLLM, RuvLLMError } from '../src/index.js';
import { cacheRoot } from '../src/worker/cache-folder.js';
import { openFile, readBytes, readJson } from '../src/worker/files.js';
import { feedLoader } from '../src/worker/weights.js';
import { fakeLoader } from './support/loader.js';
import { DIST, HAVE_DIST } from './support/dist.js';

const SIZE = 2 * 1024 * 1024 + 5;
const BODY = Uint8Array.from({ length: SIZE }, (_, i) => (i * 7 + (i >> 11)) & 255);
new DataView(BODY.buffer).setBigUint64(0, 100n, true); // like a safetensors file: a 100-byte header follows
const CONFIG = JSON.stringify({ model_type: 'llama', hidden_size: 8 });
const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex');

let server;
let base;
const hits = new Map(); // request path -> count

before(async () => {
  server = createServer((req, res) => {
    hits.set(req.url, (hits.get(req.url) ?? 0) + 1);
    const path = req.url.replace(/^\/[a-z]+\//, '/'); // /m/, /slow/, /cut/ ... serve the same files
    if (req.url.startsWith('/nobody/')) {
      res.writeHead(204); // "no content": a response without a body
      res.end();
    } else if (req.url.startsWith('/cut/') && path === '/model.safetensors') {
      res.writeHead(200, { 'Content-Length': SIZE });
      res.write(BODY.subarray(0, SIZE >> 1), () => res.destroy()); // the connection drops midway
    } else if (path === '/model.safetensors') {
      res.writeHead(200, { 'Content-Length': SIZE, ETag: '"v1"', 'Last-Modified': 'Tue, 01 Jul 2025 10:00:00 GMT' });
      if (!req.url.startsWith('/slow/')) return res.end(BODY);
      // in eight pieces, so that concurrent downloads overlap
      const piece = Math.ceil(SIZE / 8);
      const send = (i) => {
        if (i * piece >= SIZE) return res.end();
        res.write(BODY.subarray(i * piece, (i + 1) * piece), () => setTimeout(send, 10, i + 1));
      };
      send(0);
    } else if (path === '/config.json') {
      res.writeHead(200, { 'Content-Type': 'application/json' }); // chunked: no Content-Length
      res.end(CONFIG);
    } else {
      res.writeHead(404);
      res.end('not found');
    }
  });
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  base = `http://127.0.0.1:${server.address().port}`;
});

const made = []; // temporary folders, removed at the end (a cached model is 100 MB)
async function temporaryFolder(prefix) {
  made.push(await mkdtemp(join(tmpdir(), prefix)));
  return made.at(-1);
}

after(async () => {
  server.close();
  await Promise.all(made.map((dir) => rm(dir, { recursive: true, force: true })));
});

let cache; // this test's cache root (RUVLLM_CACHE_DIR): entries by URL are in its urls/ folder
beforeEach(async () => {
  cache = await temporaryFolder('ruvllm-cache-');
  process.env.RUVLLM_CACHE_DIR = cache;
  hits.clear();
});

const urls = () => join(cache, 'urls');
const entryOf = (url) => join(urls(), createHash('sha256').update(url).digest('hex'));

async function read(url, options = {}) {
  const slash = url.lastIndexOf('/') + 1;
  const file = await openFile(url.slice(0, slash), url.slice(slash), options);
  const parts = [];
  for await (const chunk of file.chunks) parts.push(chunk);
  await file.stored;
  return { bytes: Buffer.concat(parts), fromCache: file.fromCache, size: file.size };
}

/** The entries by URL (partial/ holds downloads under way, and is listed separately). */
async function entries() {
  if (!existsSync(urls())) return [];
  return (await readdir(urls())).filter((name) => name !== 'partial');
}

async function partials() {
  return existsSync(join(urls(), 'partial')) ? readdir(join(urls(), 'partial')) : [];
}

test('the cache root is RUVLLM_CACHE_DIR, else $XDG_CACHE_HOME/ruvllm, else ~/.cache/ruvllm', async () => {
  assert.equal(await cacheRoot({ RUVLLM_CACHE_DIR: '/srv/cache', XDG_CACHE_HOME: '/xdg' }), '/srv/cache');
  assert.equal(await cacheRoot({ XDG_CACHE_HOME: '/xdg' }), '/xdg/ruvllm');
  assert.equal(await cacheRoot({ XDG_CACHE_HOME: 'relative' }), join(homedir(), '.cache', 'ruvllm')); // XDG: relative is ignored
  assert.equal(await cacheRoot({}), join(homedir(), '.cache', 'ruvllm'));
  assert.equal(await cacheRoot({ RUVLLM_CACHE_DIR: 'here' }), resolve('here'));
});

test('a file given by URL is downloaded once, then read from the cache folder', async () => {
  const url = `${base}/m/model.safetensors`;
  const first = await read(url);
  assert.equal(first.fromCache, false);
  assert.deepEqual(new Uint8Array(first.bytes), BODY);
  const second = await read(url);
  assert.equal(second.fromCache, true);
  assert.equal(second.size, SIZE);
  assert.deepEqual(new Uint8Array(second.bytes), BODY);
  assert.equal(hits.get('/m/model.safetensors'), 1);

  // one folder per URL in the root's urls/, named by its sha256: the bytes and what was recorded about them
  assert.deepEqual(await readdir(cache), ['urls']);
  assert.deepEqual(await entries(), [createHash('sha256').update(url).digest('hex')]);
  assert.deepEqual((await readdir(entryOf(url))).sort(), ['data', 'entry.json']);
  const entry = JSON.parse(await readFile(join(entryOf(url), 'entry.json'), 'utf8'));
  assert.deepEqual(entry, {
    url,
    size: SIZE,
    sha256: sha256(BODY),
    etag: '"v1"',
    lastModified: 'Tue, 01 Jul 2025 10:00:00 GMT',
  });
  assert.deepEqual(await partials(), []);
});

test('small JSON files go through the same cache, even without a Content-Length', async () => {
  assert.deepEqual(await readJson(`${base}/m/`, 'config.json'), JSON.parse(CONFIG));
  assert.deepEqual(await readJson(`${base}/m/`, 'config.json'), JSON.parse(CONFIG));
  assert.equal(hits.get('/m/config.json'), 1);
  const entry = JSON.parse(await readFile(join(entryOf(`${base}/m/config.json`), 'entry.json'), 'utf8'));
  assert.deepEqual(entry, { url: `${base}/m/config.json`, size: CONFIG.length, sha256: sha256(Buffer.from(CONFIG)) });
});

test('a second load of the weights asks the server nothing for them, and reports fromCache', async () => {
  const events = [[], []];
  const results = [];
  for (const seen of events) {
    results.push(await feedLoader(fakeLoader(), `${base}/m/`, { cache: true, onProgress: (p) => seen.push(p) }));
  }
  assert.equal(hits.get('/m/model.safetensors'), 1);
  assert.deepEqual(
    results.map((r) => [r.total, r.fromCache]),
    [
      [SIZE, false],
      [SIZE, true],
    ],
  );
  assert.ok(events[0].every((p) => p.fromCache === false));
  assert.ok(events[1].length > 0 && events[1].every((p) => p.fromCache === true));
  assert.equal(events[1].at(-1).loaded, SIZE);
});

test('cache: false downloads every time and writes nothing', async () => {
  const url = `${base}/m/model.safetensors`;
  await read(url); // an entry exists; cache: false must not use it either
  const before = await readFile(join(entryOf(url), 'entry.json'), 'utf8');
  for (let i = 0; i < 2; i++) assert.equal((await read(url, { cache: false })).fromCache, false);
  assert.deepEqual(await readJson(`${base}/m/`, 'config.json', { cache: false }), JSON.parse(CONFIG));
  assert.equal(hits.get('/m/model.safetensors'), 3);
  assert.deepEqual(await entries(), [createHash('sha256').update(url).digest('hex')]);
  assert.equal(await readFile(join(entryOf(url), 'entry.json'), 'utf8'), before);
  assert.deepEqual(await partials(), []);
});

for (const [damage, spoil] of [
  ['truncated', (dir) => truncate(join(dir, 'data'), SIZE >> 1)],
  [
    'altered (same size)',
    async (dir) => {
      const bytes = await readFile(join(dir, 'data'));
      bytes[SIZE - 10] ^= 0xff;
      await writeFile(join(dir, 'data'), bytes);
    },
  ],
  ['with a damaged record', (dir) => writeFile(join(dir, 'entry.json'), '{"url": ')],
]) {
  test(`a cached file ${damage} is found out before use, and downloaded again`, async () => {
    const url = `${base}/m/model.safetensors`;
    await read(url);
    await spoil(entryOf(url));
    const again = await read(url);
    assert.equal(again.fromCache, false);
    assert.deepEqual(new Uint8Array(again.bytes), BODY);
    assert.equal(hits.get('/m/model.safetensors'), 2);
    // the entry is whole again
    assert.equal(sha256(await readFile(join(entryOf(url), 'data'))), sha256(BODY));
    assert.equal((await read(url)).fromCache, true);
    assert.equal(hits.get('/m/model.safetensors'), 2);
  });
}

test('an interrupted download leaves no cache entry', async () => {
  const url = `${base}/cut/model.safetensors`;
  await assert.rejects(
    read(url),
    (e) => e instanceof RuvLLMError && e.type === 'download' && /the download failed midway/.test(e.message),
  );
  assert.deepEqual(await entries(), []);
  assert.deepEqual(await partials(), []);
  await assert.rejects(read(url), RuvLLMError); // and the next try goes to the server again
  assert.equal(hits.get('/cut/model.safetensors'), 2);
});

test('a download the reader stops midway leaves no cache entry', async () => {
  const file = await openFile(`${base}/slow/`, 'model.safetensors');
  for await (const _ of file.chunks) break;
  assert.equal(await file.stored, false);
  assert.deepEqual(await entries(), []);
  assert.deepEqual(await partials(), []);
});

test('a cached file closed before it is read is let go without an error', async () => {
  // a load that fails on a later file closes the files it opened before reading them
  const url = `${base}/m/model.safetensors`;
  await read(url);
  const file = await openFile(`${base}/m/`, 'model.safetensors');
  assert.equal(file.fromCache, true);
  await file.close();
  assert.equal(hits.get('/m/model.safetensors'), 1);
});

test('a file the server answers without a body (204) reads as no bytes', async () => {
  const { bytes, fromCache } = await read(`${base}/nobody/config.json`, { cache: false });
  assert.deepEqual([bytes.length, fromCache], [0, false]);
});

test('concurrent downloads of one URL leave one whole entry', async () => {
  const url = `${base}/slow/model.safetensors`;
  const runs = await Promise.all([1, 2, 3, 4].map(() => read(url)));
  for (const run of runs) assert.deepEqual(new Uint8Array(run.bytes), BODY);
  assert.equal(hits.get('/slow/model.safetensors'), 4);
  assert.deepEqual(await entries(), [createHash('sha256').update(url).digest('hex')]);
  assert.deepEqual(await partials(), []);
  const cached = await read(url);
  assert.equal(cached.fromCache, true);
  assert.deepEqual(new Uint8Array(cached.bytes), BODY);
});

test('a cache folder that cannot be made costs only the caching', async () => {
  const file = join(cache, 'a-file');
  await writeFile(file, 'not a folder');
  process.env.RUVLLM_CACHE_DIR = join(file, 'models'); // mkdir fails (ENOTDIR), even for root
  const url = `${base}/m/model.safetensors`;
  for (let i = 0; i < 2; i++) assert.deepEqual(new Uint8Array((await read(url)).bytes), BODY);
  assert.equal(hits.get('/m/model.safetensors'), 2);
  assert.deepEqual(await readJson(`${base}/m/`, 'config.json'), JSON.parse(CONFIG));
});

test('local folders are never cached', async () => {
  const dir = await temporaryFolder('ruvllm-local-');
  await writeFile(join(dir, 'model.safetensors'), BODY);
  assert.equal((await readBytes(dir, 'model.safetensors')).length, SIZE);
  assert.equal((await feedLoader(fakeLoader(), dir, {})).fromCache, false);
  assert.deepEqual(await entries(), []);
  assert.deepEqual(await partials(), []);
});

test('downloads left behind by a stopped run are cleared once an hour old', async () => {
  // a worker that is terminated (an aborted load) runs no cleanup: its partial download stays behind
  const stale = join(urls(), 'partial', 'stale');
  const fresh = join(urls(), 'partial', 'fresh');
  for (const dir of [stale, fresh]) {
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'data'), 'half a file');
  }
  const twoHoursAgo = new Date(Date.now() - 2 * 3600e3);
  await utimes(join(stale, 'data'), twoHoursAgo, twoHoursAgo);
  await read(`${base}/m/model.safetensors`);
  assert.deepEqual(await partials(), ['fresh']);
});

test('the cache option must be a boolean', async () => {
  await assert.rejects(RuvLLM.load({ model: 'x', cache: 'no' }), (e) => {
    assert.equal(e.type, 'invalid_argument');
    assert.equal(e.message, 'options.cache must be true or false, got "no"');
    return true;
  });
});

// --- the real model in Pyodide, served over HTTP ------------------------------------------------

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct');
const SKIP = HAVE_DIST
  ? false
  : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`;

describe('the file cache with SmolLM2 in Pyodide under Node', { skip: SKIP }, () => {
  let modelServer;
  let modelUrl;
  const requests = new Map();
  before(async () => {
    // /cut/ serves the same model, but drops the connection halfway through the weights
    modelServer = createServer(async (req, res) => {
      requests.set(req.url, (requests.get(req.url) ?? 0) + 1);
      const cut = req.url.startsWith('/cut/');
      let bytes;
      try {
        bytes = await readFile(join(MODEL, req.url.replace(/^\/cut\//, '/').slice(1)));
      } catch {
        res.writeHead(404);
        return res.end();
      }
      res.writeHead(200, { 'Content-Length': bytes.length });
      if (cut && req.url.endsWith('.safetensors')) res.write(bytes.subarray(0, bytes.length >> 1), () => res.destroy());
      else res.end(bytes);
    });
    await new Promise((done) => modelServer.listen(0, '127.0.0.1', done));
    modelUrl = `http://127.0.0.1:${modelServer.address().port}/`;
  });
  after(() => modelServer.close());

  async function greedyRun(options) {
    const progress = [];
    const onProgress = (p) => progress.push(p);
    const llm = await RuvLLM.load({ model: modelUrl, pyodide: { indexURL: DIST }, onProgress, ...options });
    try {
      const ids = [];
      for await (const c of llm.generate('Once upon a time', { temperature: 0, maxTokens: 8, ignoreEos: true }))
        ids.push(c.tokenId);
      return { ids, info: llm.info, downloads: progress.filter((p) => p.phase === 'download') };
    } finally {
      await llm.dispose();
    }
  }

  test('a second load of the same URL asks nothing for the weights and gives the same tokens', async () => {
    requests.clear();
    const first = await greedyRun({});
    assert.equal(requests.get('/model.safetensors'), 1);
    assert.equal(first.info.fromCache, false);
    const second = await greedyRun({});
    assert.equal(requests.get('/model.safetensors'), 1);
    assert.equal(requests.get('/tokenizer.json'), 1);
    assert.equal(second.info.fromCache, true);
    assert.ok(second.downloads.length > 0 && second.downloads.every((p) => p.fromCache === true));
    assert.deepEqual(second.ids, first.ids);
    assert.equal(first.ids.length, 8);
  });

  test('a load whose weights download breaks off caches the small files, not the weights', async () => {
    const url = `${modelUrl}cut/`;
    await assert.rejects(
      RuvLLM.load({ model: url, pyodide: { indexURL: DIST } }),
      (e) => e instanceof RuvLLMError && e.type === 'download',
    );
    const cached = await entries();
    assert.ok(cached.includes(createHash('sha256').update(`${url}config.json`).digest('hex')));
    assert.ok(!cached.includes(createHash('sha256').update(`${url}model.safetensors`).digest('hex')));
    assert.deepEqual(await partials(), []);
  });

  test('cache: false downloads again and writes nothing', async () => {
    requests.clear();
    await greedyRun({ cache: false });
    assert.equal(requests.get('/model.safetensors'), 1);
    assert.deepEqual(await readdir(cache), []);
  });
});
