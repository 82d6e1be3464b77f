/**
 * Boot snapshots: Python with NumPy and ruvllm.bridge imported, saved once and restored on later boots
 * (about 1-3 s instead of 5-20 s: no interpreter start-up, no unpacking and importing of NumPy).
 *
 * Pyodide 314 can snapshot its memory (the private `_makeSnapshot` / `_loadSnapshot` options of
 * loadPyodide) but not the libraries it loaded: NumPy's compiled extensions are WebAssembly modules of
 * their own, whose code and function-table slots live outside the memory, at addresses chosen when they
 * were loaded. So both the boot that makes a snapshot and the one that restores it load NumPy's shared
 * libraries themselves, in the same order, at the same moment (the runtime just initialized, before
 * Python starts): from the same state the allocator and the function table hand them the same addresses,
 * and the restored memory finds its libraries where it left them (which is why every boot gives Python
 * the same environment: python.js, pyodideOptions). What that relies on is checked, not assumed: where
 * each library's memory and table slots went, and the allocator's and the table's state before it, are
 * recorded and must match on restore; the libraries Python opened, and every table slot added after
 * them, must be ones the restore can put back, or no snapshot is made. The files of site-packages (which live in
 * Pyodide's in-memory file system, not in the snapshot) are kept in the entry and written back.
 *
 * Everything here may fail (a private Pyodide API that changed, a full disk): the caller then boots
 * Python the ordinary way and reports why.
 */

import { IS_NODE } from '../env.js';
import { DamagedEntry, decodeEntry, encodeEntry, openBootCache, sha256Hex } from './boot-cache.js';

/** Bumped whenever the layout of an entry or the way it is made changes. */
const FORMAT = 2;
const PAGE = 65536;

/** The key of the snapshot for this Pyodide, this NumPy wheel (its sha256) and this ruvllm wheel (its bytes). */
export async function snapshotKey({ version, numpySha256, wheel }) {
  const parts = { format: FORMAT, runtime: IS_NODE ? 'node' : 'browser', pyodide: version, numpy: numpySha256 };
  return sha256Hex(new TextEncoder().encode(JSON.stringify({ ...parts, ruvllm: await sha256Hex(wheel) })));
}

/**
 * Python from a snapshot, or a fresh boot that saves one. `dist` is python.js's distribution ({ loader,
 * index, version, read(name), lock(), createModule() }), `wheel` our wheel's bytes, `pyodideOptions()`
 * loadPyodide's options (the same for every boot). Resolves to
 * { py, boot } or, when neither could be done, to { py: null, note } (the caller boots the ordinary
 * way and reports the note); never rejects. A snapshot that is damaged where it is kept is made again;
 * one that is whole but does not restore, or a boot that cannot make one, turns boot snapshots off for
 * this key (a marker entry), so later boots do not pay for a failing attempt each time.
 */
export async function bootFromSnapshot(dist, wheel, pyodideOptions) {
  let lock, key, cache;
  try {
    lock = await dist.lock();
    key = await snapshotKey({ version: dist.version, numpySha256: lock.numpy.sha256, wheel });
    cache = await openBootCache();
  } catch (error) {
    return { py: null, note: `no boot snapshot: ${error.message}` };
  }
  if (!cache) return { py: null, note: 'no boot snapshot: this runtime has no storage for one (no Cache API)' };
  /** @type {string | null} */
  let note = null;
  const blob = await cache.read(key);
  if (blob) {
    /** @type {ReturnType<typeof decodeEntry> | null} */
    let entry = null;
    try {
      entry = decodeEntry(blob);
      const py = await restore(dist, entry, pyodideOptions);
      return { py, boot: { from: 'snapshot', cache: 'restored', note: null, snapshotBytes: blob.length } };
    } catch (error) {
      await cache.remove(key);
      // A failure of a damaged entry is the damage's; of a whole one, this runtime's, and would repeat.
      const damage =
        error instanceof DamagedEntry
          ? error
          : await entry?.intact.then(
              () => null,
              (e) => e,
            );
      if (!damage) {
        const reason = `the boot snapshot did not restore (${error.message})`;
        await cache.markFailed(key, reason);
        return { py: null, note: `${reason}: removed; boot snapshots are off for this version` };
      }
      note = `the boot snapshot was damaged (${damage.message}): removed, and made again`;
    }
  }
  const failed = await cache.failed(key);
  if (failed !== null) return { py: null, note: `${failed}: boot snapshots are off for this version` };
  let numpy;
  try {
    numpy = await numpyWheel(dist, lock);
  } catch (error) {
    return { py: null, note: `no boot snapshot: ${error.message}` };
  }
  let made;
  try {
    made = await bootAndSnapshot(dist, lock, numpy, wheel, key, pyodideOptions);
  } catch (error) {
    // This boot failed where the ordinary one may not (a private Pyodide API that changed): not again.
    const reason = `the boot that makes a snapshot failed (${error.message})`;
    await cache.markFailed(key, reason);
    return { py: null, note: `${reason}: boot snapshots are off for this version` };
  }
  if (made.blob === null) {
    await cache.markFailed(key, made.note);
    return { py: made.py, boot: { from: 'fresh', cache: 'unavailable', note: made.note, snapshotBytes: null } };
  }
  const unsaved = await cache.write(key, made.blob);
  if (unsaved !== null) {
    const boot = { from: 'fresh', cache: 'unavailable', note: `the boot snapshot was not saved: ${unsaved}` };
    return { py: made.py, boot: { ...boot, snapshotBytes: null } };
  }
  return { py: made.py, boot: { from: 'fresh', cache: 'saved', note, snapshotBytes: made.blob.length } };
}

/** The NumPy wheel the lock file names, checked against its sha256 there. */
async function numpyWheel(dist, lock) {
  const { fileName, sha256 } = lock.numpy;
  const numpy = await dist.read(fileName);
  const found = await sha256Hex(numpy);
  if (found !== sha256) throw new Error(`${fileName} has sha256 ${found}, not the lock file's ${sha256}`);
  return numpy;
}

/**
 * A fresh boot that loads NumPy's libraries before Python starts, then a snapshot of it (the entry's
 * blob). Rejects when the boot itself fails (the caller boots again the ordinary way); resolves to
 * { py, blob: null, note } when only the snapshot could not be made (py works all the same).
 */
async function bootAndSnapshot(dist, lock, numpy, wheel, key, pyodideOptions) {
  const site = `/lib/python${lock.python}/site-packages`;
  const libraries = (await sharedLibraries(numpy)).map(({ name, bytes }) => ({ path: `${site}/${name}`, bytes }));
  const preloading = withPreload(dist, libraries);
  const py = await dist.loader.loadPyodide({
    ...pyodideOptions(),
    indexURL: dist.index,
    createPyodideModule: preloading.create,
    _makeSnapshot: true,
  });
  if (sitePackages(py) !== site) throw new Error(`site-packages is ${sitePackages(py)}, not ${site}`);
  py.unpackArchive(numpy, 'wheel', { extractDir: site });
  py.unpackArchive(wheel, 'wheel', { extractDir: site });
  py.runPython('import numpy, ruvllm.bridge');
  try {
    return { py, blob: await snapshotEntry(py, key, site, libraries, preloading.result) };
  } catch (error) {
    return { py, blob: null, note: `no boot snapshot: ${error.message}` };
  }
}

/** Python's site-packages folder (sysconfig may spell it with two leading slashes). */
export function sitePackages(py) {
  return py.runPython('import sysconfig; sysconfig.get_paths()["purelib"]').replace(/^\/+/, '/');
}

/**
 * loadPyodide's createPyodideModule: Pyodide's own, with NumPy's libraries loaded once the runtime is
 * initialized and before Python starts. For a restore: `states`, the allocator and table states the
 * libraries must be loaded in; `memoryBytes`, the memory to have before the snapshot is copied in
 * (Pyodide sizes it by the build's default, smaller than a snapshot with NumPy); `intact`, the
 * entry's checksum check, awaited before any of it runs.
 */
function withPreload(dist, libraries, { states = null, memoryBytes = 0, intact = null } = {}) {
  /** @type {{ states: number[][] | null, table: unknown[] | null, error: unknown }} */
  const result = { states: null, table: null, error: null };
  // Pyodide keeps `create` (in its config) as long as it runs: it holds the paths, not the bytes (which,
  // on a restore, are views of the whole entry).
  const paths = libraries.map(({ path }) => path);
  const modules = Promise.all(libraries.map(({ bytes }) => WebAssembly.compile(bytes))); // compiling runs no code
  modules.catch(() => {}); // awaited below; a failure there rejects the load
  const create = async (settings) => {
    await intact; // nothing of a restored entry runs before its checksum is known to match
    const [createModule, compiled] = await Promise.all([dist.createModule(), modules]);
    // Emscripten calls this after its runtime started, before main() (Python's start); it cannot wait.
    settings.onRuntimeInitialized = () => {
      try {
        Object.assign(result, preload(settings, paths, compiled, states));
      } catch (error) {
        result.error = error;
      }
    };
    const module = await createModule(settings);
    delete module.onRuntimeInitialized;
    if (result.error) throw result.error;
    if (memoryBytes > module.HEAP8.length && !module.growMemory(memoryBytes)) {
      throw new Error(`cannot grow the memory to ${memoryBytes} bytes for the snapshot`);
    }
    return module;
  };
  return { create, result };
}

/** [table length, allocator top] of a module: where the next library's slots and memory go. */
function loaderState(module) {
  return [module.wasmTable.length, module.HEAPU32[module._emscripten_get_sbrk_ptr() >>> 2]];
}

/**
 * Load the libraries as Pyodide's loadDynlib does (local symbols, never unloaded), registered under
 * their site-packages paths, so Python's dlopen of that path finds them loaded. Returns the states it
 * went through, and throws as soon as one differs from `expect` (the states of the boot that made the
 * snapshot): first [address of a 32-byte record, table length, allocator top], then for each library
 * [memory base, table base, table length, allocator top]. The record (malloc'd and freed here, alike in
 * both boots) is where the loader writes a library's bases: where it placed the library is compared,
 * not only how far the memory reaches (which moves in large steps).
 */
function preload(module, paths, compiled, expect) {
  const record = module._malloc(32);
  const states = [[record, ...loaderState(module)]];
  const check = (i) => {
    if (expect && String(states[i]) !== String(expect[i])) {
      throw new Error(
        `the runtime is not in the state the snapshot was made in (${states[i]}, expected ${expect[i]}` +
          `${i > 0 ? ` for ${paths[i - 1]}` : ' before the libraries'})`,
      );
    }
  };
  try {
    check(0);
    const settled = !Object.values(module.GOT).some((entry) => entry.value === -1);
    paths.forEach((path, i) => {
      const dso = module.newDSO(path, undefined, 'loading');
      dso.refcount = Infinity;
      dso.global = false;
      // The same decisions in the boot that makes the snapshot and in the one that restores it: both
      // start from the same table, so the slots come out the same either way.
      const resolve = !settled || importsUnresolved(module, compiled[i]);
      const flags = { global: false, nodelete: true, loadAsync: false, allowUndefined: !resolve };
      dso.exports = module.loadWebAssemblyModule(compiled[i], flags, path, {}, record);
      const bases = [module.HEAPU32[(record + 12) >>> 2], module.HEAPU32[(record + 20) >>> 2]];
      states.push([...bases, ...loaderState(module)]);
      check(i + 1);
    });
  } finally {
    module._free(record);
  }
  const table = Array.from({ length: module.wasmTable.length }, (_, i) => module.wasmTable.get(i));
  return { states, table };
}

/**
 * True when instantiating `compiled` leaves a symbol of Emscripten's global offset table unresolved:
 * one it imports that no library loaded so far, nor itself, defines (such as a JavaScript function of
 * the runtime whose address it takes). Only then must the loader look for it: a pass over the whole
 * table (thousands of Python's symbols), which is most of a library's load time.
 */
function importsUnresolved(module, compiled) {
  const own = new Set(WebAssembly.Module.exports(compiled).map((e) => e.name));
  return WebAssembly.Module.imports(compiled).some(
    (i) => i.module.startsWith('GOT.') && !own.has(i.name) && !(module.GOT[i.name]?.value >= 0),
  );
}

/**
 * The entry of a snapshot of `py` (made with the preload). Throws when it could not be one that restores:
 * a library loaded outside the preload, a table slot that changed or that cannot be put back, JavaScript
 * objects held by Python that Pyodide cannot record.
 */
async function snapshotEntry(py, key, site, libraries, preloaded) {
  const module = py._module;
  const paths = libraries.map((l) => l.path);
  for (const name of Object.keys(module.LDSO.loadedLibsByName)) {
    if (name !== '__main__' && !paths.includes(name)) throw new Error(`${name} was loaded after the preload`);
  }
  const preloadEnd = preloaded.table.length;
  for (let i = 0; i < preloadEnd; i++) {
    if (module.wasmTable.get(i) !== preloaded.table[i]) throw new Error(`function table slot ${i} changed`);
  }
  const owner = new Map(); // function -> [library path, export name]
  for (const path of paths) {
    for (const [name, value] of Object.entries(module.LDSO.loadedLibsByName[path].exports)) {
      if (typeof value === 'function' && !owner.has(value)) owner.set(value, [path, name]);
    }
  }
  const extra = [];
  for (let i = preloadEnd; i < module.wasmTable.length; i++) {
    const f = module.wasmTable.get(i);
    if (f !== null && !owner.has(f)) throw new Error(`function table slot ${i} holds a function it cannot restore`);
    extra.push(f === null ? null : owner.get(f));
  }
  const handles = Object.entries(module.LDSO.loadedLibsByHandle)
    .filter(([, dso]) => dso.name !== '__main__')
    .map(([handle, dso]) => [Number(handle), dso.name]);

  const memory = py.makeMemorySnapshot(); // throws if JavaScript objects Python holds cannot be restored
  const parts = [];
  let offset = 0;
  const add = (bytes) => {
    parts.push(bytes);
    offset += bytes.length;
    return offset - bytes.length;
  };
  const files = siteFiles(module.FS, site).map(([path, bytes, mtime]) => [path, add(bytes), bytes.length, mtime]);
  const runs = []; // [first page, pages, offset]: the memory without its all-zero pages
  for (let page = 0; page * PAGE < memory.length; page++) {
    const bytes = memory.subarray(page * PAGE, (page + 1) * PAGE);
    if (allZero(bytes)) continue;
    const last = runs.at(-1);
    if (last && last[0] + last[1] === page) {
      last[1] += 1;
      add(bytes);
    } else runs.push([page, 1, add(bytes)]);
  }
  const header = {
    format: FORMAT,
    key,
    site,
    libraries: paths,
    states: preloaded.states,
    handles,
    table: { end: module.wasmTable.length, extra },
    files,
    memory: { bytes: memory.length, runs },
  };
  return encodeEntry(header, parts);
}

/** True when every byte is 0 (read as 32-bit words where aligned: a snapshot has some 600 pages of 64 KiB). */
function allZero(bytes) {
  const aligned = bytes.byteOffset % 4 === 0 ? bytes.length >> 2 : 0;
  const words = new Uint32Array(bytes.buffer, bytes.byteOffset, aligned);
  for (let i = 0; i < words.length; i++) if (words[i] !== 0) return false;
  for (let i = aligned * 4; i < bytes.length; i++) if (bytes[i] !== 0) return false;
  return true;
}

/** [path, bytes, mtime in ms] of every file under `dir` of Emscripten's file system. */
function siteFiles(FS, dir) {
  const files = [];
  const walk = (folder) => {
    for (const name of FS.readdir(folder)) {
      if (name === '.' || name === '..') continue;
      const path = `${folder}/${name}`;
      const stat = FS.stat(path);
      if (FS.isDir(stat.mode)) walk(path);
      else if (FS.isFile(stat.mode)) files.push([path, FS.readFile(path), new Date(stat.mtime).getTime()]);
    }
  };
  walk(dir);
  return files;
}

/** Python restored from a decoded entry; throws if anything does not match (the caller boots afresh). */
async function restore(dist, { header, payload, intact }, pyodideOptions) {
  if (header.format !== FORMAT) throw new DamagedEntry(`it has format ${header.format}, not ${FORMAT}`);
  const file = new Map(header.files.map(([path, offset, size]) => [path, payload.subarray(offset, offset + size)]));
  const libraries = header.libraries.map((path) => {
    if (!file.has(path)) throw new DamagedEntry(`it lacks ${path}`);
    return { path, bytes: file.get(path) };
  });
  const memory = new Uint8Array(header.memory.bytes);
  for (const [page, pages, offset] of header.memory.runs) {
    memory.set(payload.subarray(offset, offset + Math.min(pages * PAGE, memory.length - page * PAGE)), page * PAGE);
  }
  const expect = { states: header.states, memoryBytes: memory.length, intact };
  const preloading = withPreload(dist, libraries, expect);
  const py = await dist.loader.loadPyodide({
    ...pyodideOptions(),
    indexURL: dist.index,
    createPyodideModule: preloading.create,
    _loadSnapshot: handOver(memory),
  });
  const module = py._module;
  for (const [handle, path] of header.handles)
    module.LDSO.loadedLibsByHandle[handle] = module.LDSO.loadedLibsByName[path];
  if (preloading.result.table === null) throw new Error('the libraries were not preloaded'); // (Emscripten skipped the hook)
  const preloadEnd = preloading.result.table.length;
  const { end, extra } = header.table;
  if (module.wasmTable.length > preloadEnd) throw new Error('the function table grew while Python was restored');
  module.wasmTable.grow(end - preloadEnd);
  extra.forEach((slot, i) => {
    if (slot === null) return;
    const [path, name] = slot;
    module.setWasmTableEntry(preloadEnd + i, module.LDSO.loadedLibsByName[path].exports[name]);
  });
  writeFiles(module.FS, header.files, payload);
  // Every restore would otherwise draw the same "random" numbers: the generators' states are in the snapshot.
  const check = py.runPython(
    [
      'import random, sys',
      'random.seed()',
      "if 'numpy.random' in sys.modules: sys.modules['numpy.random'].seed()",
      'import numpy, ruvllm.bridge',
      'int(numpy.arange(4).sum())',
    ].join('\n'),
  );
  if (check !== 6) throw new Error(`NumPy answered ${check} for sum([0, 1, 2, 3]) after the restore`);
  if (sitePackages(py) !== header.site) throw new Error(`site-packages is ${sitePackages(py)}, not ${header.site}`);
  return py;
}

/**
 * `bytes` as a thenable that lets go of them once taken: Pyodide keeps its options (this one is
 * `_loadSnapshot`) for the session. A function of its own, so that the closure holds nothing else of
 * the caller (V8 shares one context among a function's closures: the entry itself would stay).
 */
function handOver(bytes) {
  let held = bytes;
  return {
    then(resolve) {
      resolve(held);
      held = null;
    },
  };
}

/**
 * Write the files of site-packages back. They are copied out of the entry once, together, and handed
 * to the file system as they are (canOwn), so the entry's memory pages are not kept alive by them.
 */
function writeFiles(FS, files, payload) {
  const start = Math.min(...files.map(([, offset]) => offset));
  const end = Math.max(...files.map(([, offset, size]) => offset + size));
  const block = payload.slice(start, end);
  const folders = new Set();
  for (const [path, offset, size, mtime] of files) {
    const folder = path.slice(0, path.lastIndexOf('/'));
    if (!folders.has(folder)) FS.mkdirTree(folder);
    folders.add(folder);
    FS.writeFile(path, block.subarray(offset - start, offset - start + size), { canOwn: true });
    FS.utime(path, mtime, mtime);
  }
}

/** The shared libraries (.so) of a wheel, by path inside it, in path order: [{ name, bytes }]. */
export async function sharedLibraries(wheel) {
  const view = new DataView(wheel.buffer, wheel.byteOffset, wheel.byteLength);
  let end = wheel.length - 22; // the end-of-central-directory record, after which only a comment may follow
  while (end >= 0 && view.getUint32(end, true) !== 0x06054b50) end -= 1;
  if (end < 0) throw new Error('the NumPy wheel is not a zip file');
  const count = view.getUint16(end + 10, true);
  let at = view.getUint32(end + 16, true);
  const found = [];
  for (let i = 0; i < count; i++) {
    if (view.getUint32(at, true) !== 0x02014b50) throw new Error('the NumPy wheel has a damaged central directory');
    const method = view.getUint16(at + 10, true);
    const packed = view.getUint32(at + 20, true);
    const [nameLength, extraLength, commentLength] = [28, 30, 32].map((o) => view.getUint16(at + o, true));
    const local = view.getUint32(at + 42, true);
    const name = new TextDecoder().decode(wheel.subarray(at + 46, at + 46 + nameLength));
    at += 46 + nameLength + extraLength + commentLength;
    if (!name.endsWith('.so')) continue;
    const start = local + 30 + view.getUint16(local + 26, true) + view.getUint16(local + 28, true);
    const data = wheel.subarray(start, start + packed);
    if (method !== 0 && method !== 8) throw new Error(`${name} is compressed with method ${method}`);
    found.push({ name, bytes: method === 0 ? data : await inflateRaw(data) });
  }
  return found.sort((a, b) => (a.name < b.name ? -1 : 1));
}

async function inflateRaw(bytes) {
  if (IS_NODE) {
    const { inflateRawSync } = await import('node:zlib'); // several times faster than Node's DecompressionStream
    return new Uint8Array(inflateRawSync(bytes));
  }
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('deflate-raw'));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}
