/**
 * Python in the worker: starting Pyodide, NumPy and our own wheel (shipped inside this package and
 * unpacked from the package's files, never fetched from PyPI), from a boot snapshot when there is one
 * (snapshot.js), and calling the bridge (py_src/ruvllm/bridge.py; ../bridge-schema.js lists the calls).
 */

import { IS_NODE } from '../env.js';
import { RuvLLMError, unwrap } from '../errors.js';
import { fromPython, toPython } from '../protocol.js';
import { bootFromSnapshot, sitePackages } from './snapshot.js';

export const PYODIDE_VERSION = '314.0.1';
export const DEFAULT_INDEX_URL = `https://cdn.jsdelivr.net/pyodide/v${PYODIDE_VERSION}/full/`;

function withSlash(url) {
  return url.endsWith('/') ? url : `${url}/`;
}

/**
 * Boot Pyodide with NumPy and our wheel, and import `ruvllm.bridge`. Resolves to { py, boot }: boot says
 * how Python started ({ from: 'snapshot' | 'fresh', cache: 'restored' | 'saved' | 'off' | 'unavailable',
 * note, ms, snapshotBytes }).
 * indexURL: a Pyodide distribution (URL, or a folder in Node). Default: in browsers the official CDN;
 * in Node $RUVLLM_PYODIDE_DIST when it is set, else the `pyodide` npm package, which fetches NumPy
 * from the CDN on first use and caches it.
 * bootCache: restore Python from a boot snapshot (snapshot.js), saving one on a boot without.
 * @param {{ indexURL?: string, bootCache?: boolean }} [options]
 */
export async function startPython({ indexURL, bootCache = true } = {}) {
  const started = performance.now();
  const dist = await findPyodide(indexURL);
  const wheel = await ourWheel();
  /** @type {string | null | undefined} */
  let note = null;
  if (bootCache) {
    const attempt = await bootFromSnapshot(dist, wheel, pyodideOptions);
    if (attempt.py) return { py: attempt.py, boot: { ...attempt.boot, ms: performance.now() - started } };
    note = attempt.note;
  }
  let py;
  try {
    py = await dist.loader.loadPyodide({ ...pyodideOptions(), indexURL: dist.index });
  } catch (error) {
    throw new RuvLLMError(dist.fetched, `cannot start Pyodide from ${dist.from}: ${error.message}`);
  }
  await loadNumpy(py, dist.from, dist.fetched);
  installWheel(py, wheel);
  const boot = { from: 'fresh', cache: bootCache ? 'unavailable' : 'off', note, snapshotBytes: null };
  return { py, boot: { ...boot, ms: performance.now() - started } };
}

/**
 * loadPyodide's options for every boot. Python's environment is the same wherever it runs: the
 * C runtime copies it into memory before Python starts, so a program name or language that differs
 * between two boots (Node's is the script's path, a browser's its language) would move everything
 * allocated after it, and a boot snapshot made by one would not fit the other.
 */
function pyodideOptions() {
  return { stdout: () => {}, stderr: () => {}, _sysExecutable: 'python', env: { LANG: 'C.UTF-8' } };
}

/**
 * The Pyodide distribution: { loader (pyodide.mjs), index (loadPyodide's indexURL), from (for
 * messages), version, read(name) (bytes of a file of it), lock() (what the snapshot needs of its lock
 * file), createModule() (the Emscripten module factory, pyodide.asm.mjs) }.
 */
async function findPyodide(indexURL) {
  // Node: $RUVLLM_PYODIDE_DIST (a local distribution, as ruvllm-js and the tests take it) when no indexURL
  const given = indexURL || (IS_NODE ? globalThis.process?.env?.RUVLLM_PYODIDE_DIST : undefined);
  const index = given ? withSlash(given) : IS_NODE ? undefined : DEFAULT_INDEX_URL;
  const from = index ?? 'the pyodide package';
  let loader;
  try {
    // Node: always the npm package's loader (it resolves its own Node dependencies); the runtime files
    // come from indexURL. Browsers: the loader that sits with the runtime files.
    loader = IS_NODE ? await import('pyodide') : await import(/* @vite-ignore */ `${index}pyodide.mjs`);
  } catch (error) {
    throw new RuvLLMError(fetchedKind(index), `cannot load Pyodide from ${from}: ${error.message}`);
  }
  // The folder or URL the runtime files are read from (Node's default: the pyodide package's folder);
  // only the boot snapshot needs it, so a failure to find it fails only that.
  const base = distributionBase(index);
  base.catch(() => {});
  if (IS_NODE && index !== undefined) await checkFolder(await base, from);
  if (/^https?:\/\//i.test(await base)) await checkServed(await base, from);
  const read = async (name) => {
    try {
      return await readFrom(new URL(name, await base));
    } catch (error) {
      // Node's pyodide package has no NumPy until Pyodide downloads it: take it where Pyodide would.
      if (index !== undefined || !IS_NODE) throw error;
      return readFrom(new URL(name, DEFAULT_INDEX_URL));
    }
  };
  const lock = async () => {
    const json = JSON.parse(new TextDecoder().decode(await read('pyodide-lock.json')));
    const numpy = json.packages?.numpy;
    if (!numpy?.file_name || !numpy?.sha256) throw new Error('the lock file names no NumPy wheel');
    const python = /^(\d+\.\d+)/.exec(json.info?.python ?? '')?.[1];
    if (!python) throw new Error('the lock file names no Python version');
    return { numpy: { fileName: numpy.file_name, sha256: numpy.sha256 }, python };
  };
  const createModule = async () =>
    (await import(/* @vite-ignore */ new URL('pyodide.asm.mjs', await base).href)).default;
  return { loader, index, from, version: loader.version, read, lock, createModule, fetched: fetchedKind(index) };
}

/**
 * The kind of error a distribution's file that did not arrive is: fetched over the network (a browser's,
 * a URL, the CDN behind Node's pyodide package) it is a 'download' error, which trying again may mend
 * (the page offers Retry); read from a folder, a 'load' error.
 * @returns {'download' | 'load'}
 */
function fetchedKind(index) {
  return !IS_NODE || index === undefined || /^https?:\/\//i.test(index) ? 'download' : 'load';
}

// The files Pyodide reads from its distribution as it starts. In Node, a folder without one of them made
// Pyodide's loader fail where no caller catches it (ENOENT, and the worker gone), so they are looked for
// first.
const RUNTIME_FILES = ['pyodide.asm.mjs', 'pyodide.asm.wasm', 'python_stdlib.zip', 'pyodide-lock.json'];

/** In Node, a distribution folder (a file: URL) must hold RUNTIME_FILES: a load error names what is missing. */
async function checkFolder(base, from) {
  if (!base.startsWith('file:')) return;
  const [{ access }, { fileURLToPath }] = await Promise.all([import('node:fs/promises'), import('node:url')]);
  const missing = [];
  for (const name of RUNTIME_FILES) await access(fileURLToPath(new URL(name, base))).catch(() => missing.push(name));
  if (missing.length === 0) return;
  const what = missing.length === RUNTIME_FILES.length ? 'none of' : `no ${missing.join(', ')} among`;
  throw new RuvLLMError(
    'load',
    `pyodide.indexURL ${from} is not a Pyodide distribution: it has ${what} ${RUNTIME_FILES.join(', ')}. ` +
      `Pass a Pyodide ${PYODIDE_VERSION} distribution with NumPy (a folder or URL); docs/pyodide.md in the ` +
      'ruvllm repository says how to make one.',
  );
}

/**
 * That a distribution served over HTTP answers for RUNTIME_FILES (a HEAD request each): when the runtime's
 * own .wasm answered an error status (a CDN or server that is down), Pyodide's loader caught the failure,
 * warned on the console and never settled, and the page waited for ever. A 'download' error names the
 * file (the page offers Retry). A server that refuses HEAD (405, 501) is given the benefit of the doubt.
 * (One that fails between this check and the download itself still leaves Pyodide waiting.)
 */
async function checkServed(base, from) {
  for (const name of RUNTIME_FILES) {
    const url = new URL(name, base).href;
    let response;
    try {
      response = await fetch(url, { method: 'HEAD', cache: 'no-store' });
    } catch (error) {
      throw new RuvLLMError('download', `cannot start Pyodide from ${from}: ${url}: ${error.message}`);
    }
    if (!response.ok && response.status !== 405 && response.status !== 501) {
      const reason = `${url}: HTTP ${response.status} ${response.statusText}`.trim();
      throw new RuvLLMError('download', `cannot start Pyodide from ${from}: ${reason}`);
    }
  }
}

async function distributionBase(index) {
  if (!IS_NODE) return new URL(index, globalThis.location?.href).href;
  const { pathToFileURL } = await import('node:url');
  if (index === undefined) return new URL('./', import.meta.resolve('pyodide')).href;
  return /^[a-z][a-z0-9+.-]*:\/\//i.test(index) ? index : pathToFileURL(index).href + (index.endsWith('/') ? '' : '/');
}

/** The bytes at `url`: a file (Node) or fetched. */
async function readFrom(url) {
  if (IS_NODE && url.protocol === 'file:') {
    const [{ readFile }, { fileURLToPath }] = await Promise.all([import('node:fs/promises'), import('node:url')]);
    return new Uint8Array(await readFile(fileURLToPath(url)));
  }
  const response = await fetch(url);
  if (!response.ok) throw new Error(`HTTP ${response.status} for ${url}`);
  return new Uint8Array(await response.arrayBuffer());
}

/**
 * Load NumPy from the distribution's lock file. Pyodide does not throw when a wheel cannot be fetched:
 * it says so through the callbacks and leaves the package out, and all that shows next is "No module
 * named 'numpy'". Its messages name the file or URL that failed, so they become the error (of `kind`:
 * a 'download' one for a distribution fetched over the network, fetchedKind).
 * @param {'download' | 'load'} [kind]
 */
async function loadNumpy(py, from, kind = 'load') {
  const said = [];
  const note = (message) => {
    if (!message.startsWith('Loading ')) said.push(message); // not the "Loading numpy" preamble
  };
  try {
    await py.loadPackage(['numpy'], { messageCallback: note, errorCallback: note });
  } catch (error) {
    said.push(error.message);
  }
  if (!('numpy' in py.loadedPackages)) {
    throw new RuvLLMError(
      kind,
      `cannot load numpy into Pyodide from ${from}. Pyodide said:\n  ${said.join('\n  ')}\n` +
        `To fix it, pass pyodide: { indexURL } pointing at a Pyodide ${PYODIDE_VERSION} distribution (a folder or URL) ` +
        'that holds NumPy; docs/pyodide.md in the ruvllm repository says how to make one.',
    );
  }
  try {
    py.pyimport('numpy').destroy();
  } catch (error) {
    throw new RuvLLMError('load', `NumPy from ${from} was loaded but does not import: ${error.message}`);
  }
}

/** A file of this package, by its path relative to this module (src/worker/ and browser/worker/ alike). */
export async function readPackageFile(relative) {
  return readFrom(new URL(relative, import.meta.url));
}

/** Our wheel's bytes (shipped in this package: wheel/manifest.json names it). */
async function ourWheel() {
  try {
    const manifest = JSON.parse(new TextDecoder().decode(await readPackageFile('../../wheel/manifest.json')));
    return await readPackageFile(`../../wheel/${manifest.file}`);
  } catch (error) {
    throw new RuvLLMError('load', `cannot read the ruvllm wheel of this package: ${error.message}`);
  }
}

/** Unpack our wheel into site-packages (it is pure Python and needs only NumPy: no installer needed). */
function installWheel(py, wheel) {
  try {
    py.unpackArchive(wheel, 'wheel', { extractDir: sitePackages(py) });
    py.pyimport('ruvllm.bridge').destroy();
  } catch (error) {
    throw new RuvLLMError('load', `cannot install the ruvllm wheel into Pyodide: ${error.message}`);
  }
}

/**
 * Call `method` of a bridge object. Plain objects cross as JSON with Python's names; strings, numbers
 * and typed arrays as they are; null, here as inside the JSON, as None. The answer comes back with
 * JavaScript's names, or its error is thrown as a RuvLLMError of the same type.
 */
export function callBridge(target, method, ...args) {
  const crossing = args.map((a) => {
    if (a === null) return undefined; // Pyodide passes undefined as None (and null as a JsNull)
    return typeof a === 'object' && !ArrayBuffer.isView(a) ? JSON.stringify(toPython(a)) : a;
  });
  return fromPython(unwrap(target[method](...crossing)));
}

/** Bytes of WebAssembly memory Pyodide has now (read through a buffer view, the public way). */
export function heapBytes(py) {
  const probe = py.runPython('memoryview(bytearray(1))');
  const view = probe.getBuffer();
  try {
    return view.data.buffer.byteLength;
  } finally {
    view.release();
    probe.destroy();
  }
}
