// The boot snapshot (src/worker/snapshot.js, boot-cache.js): the first load saves Python's memory with
// NumPy and ruvllm imported, later loads restore it and answer exactly as a fresh start does; a damaged
// snapshot is made again, one that does not restore turns snapshots off for its version, and
// bootCache: false neither reads nor writes one. The loads need a local Pyodide distribution
// (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1) and are skipped, saying how to get one, without it.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, readFile, readdir, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

import { RuvLLM, RuvLLMError } from '../src/index.js';
import { DamagedEntry, decodeEntry, encodeEntry } from '../src/worker/boot-cache.js';
import { sharedLibraries } from '../src/worker/snapshot.js';
import { DIST, HAVE_DIST } from './support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const PACKAGE = join(ROOT, 'npm');
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct'); // a folder: never in the file cache
const execute = promisify(execFile);
const SKIP = HAVE_DIST
  ? false
  : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`;

test('an entry reads back as written, and a changed byte or a cut end is a damaged entry', async () => {
  const blob = await encodeEntry({ format: 1, files: [['/a', 0, 3, 0]] }, [
    new Uint8Array([1, 2, 3]),
    new Uint8Array(5),
  ]);
  const entry = decodeEntry(blob);
  await entry.intact;
  assert.deepEqual(entry.header, { format: 1, files: [['/a', 0, 3, 0]] });
  assert.deepEqual([...entry.payload], [1, 2, 3, 0, 0, 0, 0, 0]);

  const changed = blob.slice();
  changed[changed.length - 2] ^= 1;
  await assert.rejects(decodeEntry(changed).intact, (e) => e instanceof DamagedEntry && /checksum/.test(e.message));
  assert.throws(
    () => decodeEntry(blob.subarray(0, 50)),
    (e) => e instanceof DamagedEntry && e.message === 'its header runs past its end',
  );
  assert.throws(
    () => decodeEntry(new TextEncoder().encode('PK\u0003\u0004 something else entirely, and long enough')),
    (e) => e instanceof DamagedEntry && e.message === 'not a boot snapshot',
  );
});

test('bootCache must be true or false', async () => {
  await assert.rejects(
    RuvLLM.load({ model: 'm/', bootCache: 'no' }),
    (e) => e instanceof RuvLLMError && e.message === 'options.bootCache must be true or false, got "no"',
  );
});

test("the NumPy wheel's shared libraries are found and inflated, in path order", { skip: SKIP }, async () => {
  const lock = JSON.parse(await readFile(join(DIST, 'pyodide-lock.json'), 'utf8'));
  const wheel = new Uint8Array(await readFile(join(DIST, lock.packages.numpy.file_name)));
  const libraries = await sharedLibraries(wheel);
  const names = libraries.map((l) => l.name);
  assert.ok(names.includes('numpy/_core/_multiarray_umath.cpython-314-wasm32-emscripten.so'), names.join());
  assert.deepEqual(names, [...names].sort());
  for (const { name, bytes } of libraries) {
    assert.deepEqual([...bytes.subarray(0, 4)], [0, 0x61, 0x73, 0x6d], `${name} is not WebAssembly`);
    assert.ok(WebAssembly.validate(bytes), `${name} does not validate`);
  }
});

describe('the boot snapshot with SmolLM2 in Pyodide under Node', { skip: SKIP }, () => {
  let cache; // RUVLLM_CACHE_DIR of these tests: the snapshot goes to cache/boot
  const saved = process.env.RUVLLM_CACHE_DIR;
  before(async () => {
    cache = await mkdtemp(join(tmpdir(), 'ruvllm-boot-'));
    process.env.RUVLLM_CACHE_DIR = cache;
  });
  after(async () => {
    if (saved === undefined) delete process.env.RUVLLM_CACHE_DIR;
    else process.env.RUVLLM_CACHE_DIR = saved;
    await rm(cache, { recursive: true, force: true });
  });

  const boot = () => join(cache, 'boot');
  const snapshots = async () =>
    existsSync(boot()) ? (await readdir(boot())).filter((n) => n.endsWith('.snapshot')) : [];

  /** Load, generate greedily and with a seeded sampler (NumPy's random module, imported after the boot). */
  async function run(options = {}) {
    const progress = [];
    const llm = await RuvLLM.load({
      model: MODEL,
      pyodide: { indexURL: DIST },
      onProgress: (p) => progress.push(p),
      ...options,
    });
    try {
      const tokens = async (generation) => {
        const ids = [];
        for await (const c of llm.generate('Once upon a time', { maxTokens: 8, ignoreEos: true, ...generation }))
          ids.push(c.tokenId);
        return ids;
      };
      const greedy = await tokens({ temperature: 0 });
      const sampled = await tokens({ temperature: 0.9, seed: 7 });
      return { boot: llm.info.boot, greedy, sampled, reported: progress.find((p) => p.boot)?.boot };
    } finally {
      await llm.dispose();
    }
  }

  let fresh; // a start without the snapshot: what every other start must answer
  test('the first load saves a snapshot, the next starts from it, and both answer as a start without one', async () => {
    const first = await run();
    assert.equal(first.boot.from, 'fresh');
    assert.equal(first.boot.cache, 'saved', first.boot.note);
    assert.equal(first.boot.note, null);
    assert.deepEqual(first.reported, first.boot); // also said through onProgress, as soon as Python is up
    const [name] = await snapshots();
    assert.equal((await stat(join(boot(), name))).size, first.boot.snapshotBytes);

    const second = await run();
    assert.equal(second.boot.from, 'snapshot');
    assert.equal(second.boot.cache, 'restored');
    assert.equal(second.boot.note, null);

    fresh = await run({ bootCache: false });
    assert.equal(fresh.boot.from, 'fresh');
    assert.equal(fresh.boot.cache, 'off');
    assert.equal(fresh.greedy.length, 8);
    for (const other of [first, second]) {
      assert.deepEqual(other.greedy, fresh.greedy);
      assert.deepEqual(other.sampled, fresh.sampled);
    }
  });

  test('a copy of the package installed elsewhere restores the snapshot (Node names the program by its path)', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'ruvllm-boot-elsewhere-'));
    try {
      const copy = join(folder, 'another', 'project', 'node_modules', 'ruvllm-copy');
      for (const part of ['src', 'wheel', 'wasm', 'package.json'])
        await cp(join(PACKAGE, part), join(copy, part), { recursive: true });
      await symlink(join(PACKAGE, 'node_modules'), join(copy, 'node_modules'));
      const script = join(folder, 'a-program-of-its-own.mjs');
      const index = JSON.stringify(pathToFileURL(join(copy, 'src', 'index.js')).href);
      const options = JSON.stringify({ model: MODEL, pyodide: { indexURL: DIST } });
      await writeFile(
        script,
        `import { RuvLLM } from ${index};
const llm = await RuvLLM.load(${options});
const ids = [];
for await (const c of llm.generate('Once upon a time', { temperature: 0, maxTokens: 8, ignoreEos: true })) ids.push(c.tokenId);
process.stdout.write(JSON.stringify({ boot: llm.info.boot, ids }));
await llm.dispose();
`,
      );
      const { stdout } = await execute(process.execPath, [script], {
        env: { ...process.env, RUVLLM_CACHE_DIR: cache },
      });
      const other = JSON.parse(stdout);
      assert.deepEqual([other.boot.from, other.boot.cache], ['snapshot', 'restored'], other.boot.note);
      assert.deepEqual(other.ids, fresh.greedy);
    } finally {
      await rm(folder, { recursive: true, force: true });
    }
  });

  test('cache: false neither reads nor writes the snapshot (bootCache defaults to cache)', async () => {
    const [name] = await snapshots();
    const kept = await readFile(join(boot(), name));
    await rm(cache, { recursive: true });
    const off = await run({ cache: false });
    assert.deepEqual([off.boot.from, off.boot.cache], ['fresh', 'off']);
    assert.equal(existsSync(cache), false, 'cache: false wrote into the cache folder');
    await mkdir(boot(), { recursive: true }); // the snapshot back, for the next tests
    await writeFile(join(boot(), name), kept);
  });

  test('a damaged snapshot is removed, Python starts afresh and saves a new one', async () => {
    const [name] = await snapshots();
    const file = join(boot(), name);
    const bytes = await readFile(file);
    bytes[bytes.length >> 1] ^= 0xff;
    await writeFile(file, bytes);
    const damaged = await run();
    assert.deepEqual([damaged.boot.from, damaged.boot.cache], ['fresh', 'saved']);
    assert.equal(
      damaged.boot.note,
      'the boot snapshot was damaged (its checksum does not match): removed, and made again',
    );
    assert.deepEqual(damaged.greedy, fresh.greedy);
    await decodeEntry(new Uint8Array(await readFile(file))).intact; // whole again
  });

  test('a whole snapshot that does not restore turns snapshots off for its version; loads still work', async () => {
    const [name] = await snapshots();
    const file = join(boot(), name);
    const { header, payload } = decodeEntry(new Uint8Array(await readFile(file)));
    header.states[0][2] += 16; // the allocator's top before the libraries: as if the runtime had changed
    await writeFile(file, await encodeEntry(header, [payload]));

    const refused = await run();
    assert.deepEqual([refused.boot.from, refused.boot.cache], ['fresh', 'unavailable']);
    assert.match(
      refused.boot.note,
      /^the boot snapshot did not restore \(the runtime is not in the state the snapshot was made in \(\d+,\d+,\d+, expected \d+,\d+,\d+ before the libraries\)\): removed; boot snapshots are off for this version$/,
    );
    assert.deepEqual(refused.greedy, fresh.greedy);
    assert.deepEqual(await snapshots(), []);

    const next = await run(); // not tried again, not made again
    assert.deepEqual([next.boot.from, next.boot.cache], ['fresh', 'unavailable']);
    assert.match(next.boot.note, /^the boot snapshot did not restore \(.*\): boot snapshots are off for this version$/);
    assert.deepEqual(await snapshots(), []);
    assert.deepEqual(next.greedy, fresh.greedy);
  });
});
