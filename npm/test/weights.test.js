// Downloading weights: progress, shards, local folders, and the download errors a user must see.
import assert from 'node:assert/strict';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { RuvLLMError } from '../src/errors.js';
import { feedLoader } from '../src/worker/weights.js';
import { fakeLoader } from './support/loader.js';

const SIZE = 3 * 1024 * 1024 + 17;
const BODY = Uint8Array.from({ length: SIZE }, (_, i) => (i * 31) & 255);
new DataView(BODY.buffer).setBigUint64(0, 100n, true); // like a safetensors file: a 100-byte header follows
let server;
let base;

before(async () => {
  server = createServer((req, res) => {
    const path = req.url;
    if (path === '/good/model.safetensors' || path.startsWith('/sharded/model-0000')) {
      const body = path.startsWith('/sharded')
        ? BODY.subarray(0, 1000 + Number(path['/sharded/model-0000'.length]))
        : BODY;
      res.writeHead(200, { 'Content-Length': body.length });
      res.end(body);
    } else if (path === '/sharded/model.safetensors.index.json') {
      const map = {
        a: 'model-00001-of-00002.safetensors',
        b: 'model-00002-of-00002.safetensors',
        c: 'model-00001-of-00002.safetensors',
      };
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ weight_map: map }));
    } else if (path === '/truncated/model.safetensors') {
      res.writeHead(200, { 'Content-Length': SIZE });
      res.write(BODY.subarray(0, 1024 * 1024), () => res.destroy());
    } else if (path === '/chunked/model.safetensors') {
      res.writeHead(200, { 'Transfer-Encoding': 'chunked' });
      res.end(BODY.subarray(0, 100));
    } else {
      res.writeHead(404);
      res.end('not found');
    }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${server.address().port}`;
});

after(() => server.close());

test('progress climbs to the total and every byte reaches the loader', async () => {
  const loader = fakeLoader();
  const events = [];
  const plans = [];
  const result = await feedLoader(loader, `${base}/good/`, {
    cache: false,
    onProgress: (p) => events.push(p),
    onPlan: (p) => plans.push(p),
  });
  assert.deepEqual(result, {
    total: SIZE,
    fromCache: false,
    plan: { compute: 'f32', totalBytes: 1 },
    files: { 'model.safetensors': SIZE }, // every file read, name -> size (a hub folder's .complete record)
  });
  assert.equal(plans.length, 1);
  // The first 8 bytes announce a 100-byte header: exactly 108 bytes went to planning, then everything.
  assert.deepEqual(loader.headers['model.safetensors'], { size: SIZE, length: 108 });
  assert.equal(loader.files['model.safetensors'].got, SIZE);
  assert.ok(loader.files['model.safetensors'].done);
  assert.ok(events.length >= 2);
  for (let i = 1; i < events.length; i++) assert.ok(events[i].loaded >= events[i - 1].loaded);
  const last = events.at(-1);
  assert.deepEqual(last, {
    phase: 'download',
    file: 'model.safetensors',
    fileLoaded: SIZE,
    fileTotal: SIZE,
    loaded: SIZE,
    total: SIZE,
    fromCache: false,
  });
});

test('sharded weights follow model.safetensors.index.json', async () => {
  const loader = fakeLoader();
  const result = await feedLoader(loader, `${base}/sharded`, { cache: false });
  assert.deepEqual(Object.keys(loader.files), ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']);
  assert.equal(result.total, 1001 + 1002);
});

test('a local folder is read from disk (Node)', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'ruvllm-'));
  await writeFile(join(dir, 'model.safetensors'), BODY);
  const loader = fakeLoader();
  assert.equal((await feedLoader(loader, dir, {})).total, SIZE);
  await assert.rejects(feedLoader(fakeLoader(), join(dir, 'nope'), {}), (e) => {
    assert.ok(e instanceof RuvLLMError);
    assert.equal(e.type, 'download');
    assert.match(e.message, /^model\.safetensors: cannot read .*nope\/model\.safetensors: no such file$/);
    return true;
  });
});

test('a load that fails before a local file is read closes that file cleanly and fails with its own error', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'ruvllm-'));
  const shards = ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'];
  await writeFile(
    join(dir, 'model.safetensors.index.json'),
    JSON.stringify({ weight_map: { a: shards[0], b: shards[1] } }),
  );
  for (const shard of shards) await writeFile(join(dir, shard), BODY.subarray(0, 1000));
  const loader = fakeLoader();
  const message = `${shards[0]}: not a safetensors file`;
  loader.give_header = () => JSON.stringify({ error: { type: 'load', message } }); // the second is never read
  await assert.rejects(feedLoader(loader, dir, {}), (e) => {
    assert.ok(e instanceof RuvLLMError, `expected a RuvLLMError, got ${e}`);
    assert.equal(e.type, 'load');
    assert.equal(e.message, message);
    return true;
  });
});

async function downloadError(url) {
  try {
    await feedLoader(fakeLoader(), url, { cache: false });
  } catch (error) {
    assert.ok(error instanceof RuvLLMError, `expected a RuvLLMError, got ${error}`);
    assert.equal(error.type, 'download');
    return error.message;
  }
  assert.fail('no error');
}

test('a missing file names the file and the HTTP status', async () => {
  assert.equal(
    await downloadError(`${base}/missing/`),
    `model.safetensors: ${base}/missing/model.safetensors answered HTTP 404 Not Found`,
  );
});

test('a download cut off midway is a download error naming the file', async () => {
  assert.match(await downloadError(`${base}/truncated/`), /^model\.safetensors: the download failed midway: /);
});

test('a response without a size is refused before anything is allocated', async () => {
  assert.match(await downloadError(`${base}/chunked/`), /^model\.safetensors: the server did not say how large it is/);
});

test('an unreachable server is a download error', async () => {
  const closed = createServer();
  await new Promise((resolve) => closed.listen(0, '127.0.0.1', resolve));
  const port = closed.address().port;
  await new Promise((resolve) => closed.close(resolve));
  assert.match(
    await downloadError(`http://127.0.0.1:${port}/m/`),
    /^model\.safetensors(\.index\.json)?: cannot fetch http:\/\/127\.0\.0\.1:\d+\/m\/model\.safetensors/,
  );
});
