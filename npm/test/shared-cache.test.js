// One cache root for both runtimes: Node's cacheRoot and CPython's hub.cache_root give the same answers,
// both refuse the retired $RUVLLM_MODELS_DIR with the same message, and a file of an hf: name downloaded by
// one runtime is read by the other from <root>/hub without a request, against a local server laid out as
// the hub. The Python side runs RUVLLM_PYTHON (default: the repository's .venv) on this checkout's py_src;
// the loads in Pyodide need a local distribution (skipped, with how to get one, without it).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, readdir, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join, resolve } from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { RuvLLM, RuvLLMError } from '../src/index.js';
import { hubLocation } from '../src/hub.js';
import { cacheRoot } from '../src/worker/cache-folder.js';
import { openFile, readBytes } from '../src/worker/files.js';
import { DIST, HAVE_DIST } from './support/dist.js';
import { hubServer } from './support/hub-server.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const PYTHON = process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python');
const NO_PYTHON = existsSync(PYTHON)
  ? false
  : `no Python at ${PYTHON}: set RUVLLM_PYTHON to one with ruvllm's dependencies (./build.sh setup)`;
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct');
const run = promisify(execFile);

/** A small GGUF file (only its magic matters to the caches) and a small model folder. */
const GGUF = Buffer.concat([
  Buffer.from('GGUF'),
  Buffer.from(Array.from({ length: 300_000 }, (_, i) => (i * 7) & 255)),
]);
const SAFETENSORS = Buffer.concat([Buffer.from([2, 0, 0, 0, 0, 0, 0, 0]), Buffer.from('{}'), Buffer.alloc(64)]);
const FOLDER = {
  'config.json': Buffer.from('{"model_type": "llama"}'),
  'tokenizer.json': Buffer.from('{"model": {}}'),
  'model.safetensors': SAFETENSORS,
};

/** The environment of a Python run on this checkout, with `extra` (undefined values removed). */
function pythonEnv(extra) {
  const env = {
    ...process.env,
    PYTHONPATH: [join(ROOT, 'py_src'), process.env.PYTHONPATH].filter(Boolean).join(delimiter),
  };
  for (const [name, value] of Object.entries(extra)) {
    if (value === undefined) delete env[name];
    else env[name] = value;
  }
  return env;
}

/** `ruvllm download NAME` in CPython: { code, stdout, stderr }. */
async function ruvllmDownload(name, env) {
  try {
    const { stdout, stderr } = await run(PYTHON, ['-m', 'ruvllm', 'download', name], { env: pythonEnv(env) });
    return { code: 0, stdout, stderr };
  } catch (error) {
    return { code: error.code, stdout: error.stdout, stderr: error.stderr };
  }
}

/** Read a whole file of an hf: name through the worker's files.js, as a load does. */
async function readHubFile(model, name, endpoint) {
  const location = hubLocation(model);
  const slash = `${endpoint}/${location.owner}/${location.repo}/resolve/${location.revision}/${location.dir}`;
  const file = await openFile(slash, name, { hub: { hfEndpoint: endpoint, location } });
  const parts = [];
  for await (const chunk of file.chunks) parts.push(chunk);
  return { bytes: Buffer.concat(parts), fromCache: file.fromCache, stored: await file.stored };
}

describe('one cache root for Node and CPython', { skip: NO_PYTHON }, () => {
  let hub;
  let cache; // RUVLLM_CACHE_DIR of each test
  const made = [];
  const saved = { cache: process.env.RUVLLM_CACHE_DIR, models: process.env.RUVLLM_MODELS_DIR };
  before(async () => {
    hub = await hubServer({
      'acme/tiny-gguf': { 'sub/tiny.gguf': GGUF, 'bad.gguf': Buffer.from('not a gguf') },
      'acme/tiny': FOLDER,
    });
  });
  beforeEach(async () => {
    cache = await mkdtemp(join(tmpdir(), 'ruvllm-shared-'));
    made.push(cache);
    process.env.RUVLLM_CACHE_DIR = cache;
    delete process.env.RUVLLM_MODELS_DIR;
    hub.requests.length = 0;
    hub.corrupt.clear();
  });
  after(async () => {
    await hub.close();
    for (const [name, value] of [
      ['RUVLLM_CACHE_DIR', saved.cache],
      ['RUVLLM_MODELS_DIR', saved.models],
    ]) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
    await Promise.all(made.map((dir) => rm(dir, { recursive: true, force: true })));
  });
  /** The environment of `ruvllm` in these tests: this cache root, the local hub. */
  const settings = () => ({ RUVLLM_CACHE_DIR: cache, RUVLLM_MODELS_DIR: undefined, RUVLLM_HF_ENDPOINT: hub.endpoint });

  test('the cache root is the same in Node and in Python for the same environment, errors included', async () => {
    const home = '/home/someone';
    const cases = [
      [{ RUVLLM_CACHE_DIR: '/srv/cache', XDG_CACHE_HOME: '/xdg', HOME: home }, '/srv/cache'],
      [{ RUVLLM_CACHE_DIR: '/srv/cache/', HOME: home }, '/srv/cache'],
      [{ RUVLLM_CACHE_DIR: 'here/../there', HOME: home }, resolve('there')],
      [{ RUVLLM_CACHE_DIR: '~/caches', HOME: home }, `${home}/caches`],
      [{ XDG_CACHE_HOME: '/xdg/', HOME: home }, '/xdg/ruvllm'],
      [{ XDG_CACHE_HOME: 'relative/xdg', HOME: home }, `${home}/.cache/ruvllm`], // XDG: relative is ignored
      [{ XDG_CACHE_HOME: '', HOME: home }, `${home}/.cache/ruvllm`],
      [{ HOME: home }, `${home}/.cache/ruvllm`],
      [{ RUVLLM_MODELS_DIR: `${home}/.cache/ruvllm/hub`, HOME: home }, `${home}/.cache/ruvllm`], // the same folder
      [{ RUVLLM_MODELS_DIR: '/srv/cache/hub', RUVLLM_CACHE_DIR: '/srv/cache', HOME: home }, '/srv/cache'],
      [{ RUVLLM_MODELS_DIR: '/data/models', HOME: home }, /move the models of \/data\/models into its hub\/ folder/],
      [{ RUVLLM_MODELS_DIR: '/data/hub', RUVLLM_CACHE_DIR: '/srv', HOME: home }, /Set RUVLLM_CACHE_DIR=\/data to keep/],
    ];
    const node = [];
    for (const [env] of cases) node.push(await cacheRoot(env).catch((e) => ({ type: e.type, message: e.message })));
    const script = String.raw`
import json, sys
from ruvllm.errors import InvalidArgumentError
from ruvllm.files import hub
out = []
for env in json.loads(sys.argv[1]):
    try:
        out.append(str(hub.cache_root(env)))
    except InvalidArgumentError as e:
        out.append({"type": e.type, "message": e.message})
print(json.dumps(out))
`;
    const envs = JSON.stringify(cases.map(([env]) => env));
    const { stdout } = await run(PYTHON, ['-c', script, envs], { env: pythonEnv({}) });
    assert.deepEqual(node, JSON.parse(stdout));
    cases.forEach(([, expected], i) => {
      if (typeof expected === 'string') assert.equal(node[i], expected);
      else assert.match(node[i].message, expected, JSON.stringify(cases[i][0]));
    });
  });

  test('$RUVLLM_MODELS_DIR set fails in both, saying that RUVLLM_CACHE_DIR replaced it, before any request', async () => {
    const models = join(cache, 'models');
    const message =
      `$RUVLLM_MODELS_DIR is no longer read (it is ${models}): $RUVLLM_CACHE_DIR replaced it, the root of everything ` +
      `ruvllm caches, hub downloads being kept in its hub/ folder (now ${cache}/hub). Set RUVLLM_CACHE_DIR instead ` +
      `and move the models of ${models} into its hub/ folder, and unset RUVLLM_MODELS_DIR`;
    const name = 'hf:acme/tiny-gguf/sub/tiny.gguf';
    process.env.RUVLLM_MODELS_DIR = models;
    await assert.rejects(RuvLLM.load({ model: name, hfEndpoint: hub.endpoint }), (e) => {
      assert.ok(e instanceof RuvLLMError);
      assert.deepEqual([e.type, e.message], ['invalid_argument', message]);
      return true;
    });
    const python = await ruvllmDownload(name, { ...settings(), RUVLLM_MODELS_DIR: models });
    assert.deepEqual([python.code, python.stdout, python.stderr], [1, '', `ruvllm download: error: ${message}\n`]);
    assert.deepEqual(hub.requests, []);
    assert.equal(existsSync(join(cache, 'hub')), false);
  });

  test('a GGUF file `ruvllm download` fetched is read by Node from the hub folder, with no request', async () => {
    const name = 'hf:acme/tiny-gguf/sub/tiny.gguf';
    const python = await ruvllmDownload(name, settings());
    const path = join(cache, 'hub', 'acme', 'tiny-gguf', 'main', 'sub', 'tiny.gguf');
    assert.deepEqual([python.code, python.stdout], [0, `${path}\n`], python.stderr);
    hub.requests.length = 0;
    const read = await readHubFile(name, 'tiny.gguf', hub.endpoint);
    assert.deepEqual([read.fromCache, read.stored], [true, false]);
    assert.ok(read.bytes.equals(GGUF));
    assert.deepEqual(hub.requests, []);
  });

  test('a GGUF file Node downloaded by its hf: name is where `ruvllm download` looks: Python asks nothing', async () => {
    const name = 'hf:acme/tiny-gguf/sub/tiny.gguf';
    const read = await readHubFile(name, 'tiny.gguf', hub.endpoint);
    assert.deepEqual([read.fromCache, read.stored], [false, true]);
    // the hub's answer was read as transfer.py reads it: a redirect to the bytes, then its sha256 checked
    assert.deepEqual(hub.requests, [
      '/acme/tiny-gguf/resolve/main/sub/tiny.gguf',
      '/lfs/acme/tiny-gguf/resolve/main/sub/tiny.gguf',
    ]);
    const folder = join(cache, 'hub', 'acme', 'tiny-gguf', 'main', 'sub');
    assert.deepEqual(await readdir(folder), ['tiny.gguf']); // no partial file left
    assert.ok((await readFile(join(folder, 'tiny.gguf'))).equals(GGUF));
    hub.requests.length = 0;
    const python = await ruvllmDownload(name, settings());
    assert.deepEqual([python.code, python.stdout, python.stderr], [0, `${join(folder, 'tiny.gguf')}\n`, '']);
    assert.deepEqual(hub.requests, []);
    assert.equal((await readHubFile(name, 'tiny.gguf', hub.endpoint)).fromCache, true); // and Node again
    assert.deepEqual(hub.requests, []);
  });

  test('a model folder `ruvllm download` fetched is read by Node without a request, its missing optional files too', async () => {
    const python = await ruvllmDownload('hf:acme/tiny', settings());
    assert.equal(python.code, 0, python.stderr);
    hub.requests.length = 0;
    const location = hubLocation('hf:acme/tiny');
    const base = `${hub.endpoint}/acme/tiny/resolve/main/`;
    const options = { hub: { hfEndpoint: hub.endpoint, location } };
    assert.ok((await readBytes(base, 'config.json', options)).every((b, i) => b === FOLDER['config.json'][i]));
    // its .complete record (Python's) names the files it has: generation_config.json is not on the hub
    assert.equal(await openFile(base, 'generation_config.json', { ...options, optional: true }), null);
    assert.deepEqual(hub.requests, []);
  });

  test("Node's hub downloads are checked as Python's: a sha256 or format that is wrong is not kept", async () => {
    hub.corrupt.add('/acme/tiny-gguf/resolve/main/sub/tiny.gguf');
    const spoilt = await readHubFile('hf:acme/tiny-gguf/sub/tiny.gguf', 'tiny.gguf', hub.endpoint);
    assert.equal(spoilt.stored, false); // (the load itself goes on: the loader checks what it reads)
    const bad = await readHubFile('hf:acme/tiny-gguf/bad.gguf', 'bad.gguf', hub.endpoint);
    assert.equal(bad.stored, false);
    assert.deepEqual(await readdir(join(cache, 'hub', 'acme', 'tiny-gguf', 'main', 'sub')), []);
    assert.deepEqual(await readdir(join(cache, 'hub', 'acme', 'tiny-gguf', 'main')), ['sub']);
  });

  test('partial files of a hub file are named as Python names them; those unchanged for an hour are removed', async () => {
    const folder = join(cache, 'hub', 'acme', 'tiny-gguf', 'main', 'sub');
    await mkdir(folder, { recursive: true });
    const stale = join(folder, '.tiny.gguf.0123456789ab.part'); // transfer.py's form: .{name}.{tag}.part
    const fresh = join(folder, `.tiny.gguf.${createHash('sha256').update(GGUF).digest('hex').slice(0, 16)}.part`);
    for (const file of [stale, fresh]) await writeFile(file, 'a part');
    const twoHoursAgo = new Date(Date.now() - 2 * 3600e3);
    await utimes(stale, twoHoursAgo, twoHoursAgo);
    assert.equal((await readHubFile('hf:acme/tiny-gguf/sub/tiny.gguf', 'tiny.gguf', hub.endpoint)).stored, true);
    assert.deepEqual((await readdir(folder)).sort(), [fresh.slice(folder.length + 1), 'tiny.gguf'].sort());
    const python = await run(PYTHON, ['-m', 'ruvllm', 'list'], { env: pythonEnv(settings()) });
    assert.match(python.stdout, /hf:acme\/tiny-gguf\/sub\/tiny\.gguf +gguf/);
  });
});

// --- a real model, in Pyodide ---------------------------------------------------------------------------------

const SKIP =
  NO_PYTHON ||
  (HAVE_DIST
    ? false
    : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`);

describe('SmolLM2 by its hf: name, downloaded by one runtime and loaded by the other', { skip: SKIP }, () => {
  let hub;
  let cache;
  const saved = process.env.RUVLLM_CACHE_DIR;
  before(async () => {
    hub = await hubServer({ 'acme/smollm2': MODEL });
  });
  beforeEach(async () => {
    cache = await mkdtemp(join(tmpdir(), 'ruvllm-shared-model-'));
    process.env.RUVLLM_CACHE_DIR = cache;
    hub.requests.length = 0;
  });
  after(async () => {
    await hub.close();
    if (saved === undefined) delete process.env.RUVLLM_CACHE_DIR;
    else process.env.RUVLLM_CACHE_DIR = saved;
  });
  const env = () => ({ RUVLLM_CACHE_DIR: cache, RUVLLM_MODELS_DIR: undefined, RUVLLM_HF_ENDPOINT: hub.endpoint });

  async function greedy() {
    const llm = await RuvLLM.load({ model: 'hf:acme/smollm2', hfEndpoint: hub.endpoint, pyodide: { indexURL: DIST } });
    try {
      const ids = [];
      for await (const c of llm.generate('Once upon a time', { temperature: 0, maxTokens: 4, ignoreEos: true }))
        ids.push(c.tokenId);
      return { ids, fromCache: llm.info.fromCache };
    } finally {
      await llm.dispose();
    }
  }

  test('`ruvllm download hf:acme/smollm2`, then RuvLLM.load in Node: no request to the hub', async () => {
    try {
      const python = await ruvllmDownload('hf:acme/smollm2', env());
      assert.equal(python.code, 0, python.stderr);
      hub.requests.length = 0;
      const loaded = await greedy();
      assert.equal(loaded.fromCache, true);
      assert.equal(loaded.ids.length, 4);
      assert.deepEqual(hub.requests, []);
    } finally {
      await rm(cache, { recursive: true, force: true });
    }
  });

  test('RuvLLM.load in Node, then `ruvllm download hf:acme/smollm2`: no request to the hub', async () => {
    try {
      assert.equal((await greedy()).fromCache, false);
      const folder = join(cache, 'hub', 'acme', 'smollm2', 'main');
      const record = JSON.parse(await readFile(join(folder, '.complete'), 'utf8'));
      assert.equal(record.name, 'hf:acme/smollm2');
      assert.deepEqual(
        Object.keys(record.files).sort(),
        (await readdir(MODEL)).filter((n) => n !== '.complete').sort(),
      );
      hub.requests.length = 0;
      const python = await ruvllmDownload('hf:acme/smollm2', env());
      assert.deepEqual([python.code, python.stdout, python.stderr], [0, `${folder}\n`, '']);
      assert.deepEqual(hub.requests, []);
    } finally {
      await rm(cache, { recursive: true, force: true });
    }
  });
});
