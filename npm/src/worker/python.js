/**
 * Python in the worker: starting Pyodide, NumPy and our own wheel (shipped inside this package,
 * installed with micropip from the package's files, never from PyPI), and calling the bridge
 * (py_src/ruvllm/bridge.py, whose docstring lists the calls).
 */

import { IS_NODE } from '../env.js';
import { RuvLLMError, unwrap } from '../errors.js';
import { fromPython, toPython } from '../protocol.js';

export const PYODIDE_VERSION = '314.0.1';
export const DEFAULT_INDEX_URL = `https://cdn.jsdelivr.net/pyodide/v${PYODIDE_VERSION}/full/`;

function withSlash(url) {
  return url.endsWith('/') ? url : `${url}/`;
}

/**
 * Boot Pyodide and import `ruvllm.bridge`.
 * indexURL: a Pyodide distribution (URL, or a folder in Node). Default: in browsers the official CDN;
 * in Node the `pyodide` npm package, which fetches NumPy from the CDN on first use and caches it.
 */
export async function startPython({ indexURL } = {}) {
  let loadPyodide;
  const index = indexURL ? withSlash(indexURL) : IS_NODE ? undefined : DEFAULT_INDEX_URL;
  const from = index ?? 'the pyodide package';
  try {
    // Node: always the npm package's loader (it resolves its own Node dependencies); the runtime files
    // come from indexURL. Browsers: the loader that sits with the runtime files.
    ({ loadPyodide } = IS_NODE ? await import('pyodide') : await import(/* @vite-ignore */ `${index}pyodide.mjs`));
  } catch (error) {
    throw new RuvLLMError('load', `cannot load Pyodide from ${from}: ${error.message}`);
  }
  let py;
  try {
    py = await loadPyodide({ indexURL: index, stdout: () => {}, stderr: () => {} });
  } catch (error) {
    throw new RuvLLMError('load', `cannot start Pyodide from ${from}: ${error.message}`);
  }
  await loadPackages(py, from);
  await installWheel(py);
  return py;
}

const PACKAGES = ['numpy', 'micropip'];

/**
 * Load NumPy and micropip from the distribution's lock file. Pyodide does not throw when a wheel cannot
 * be fetched: it says so through the callbacks and leaves the package out, and all that shows next is
 * "No module named 'numpy'". Its messages name the file or URL that failed, so they become the error.
 */
async function loadPackages(py, from) {
  const said = [];
  const note = (message) => {
    if (!message.startsWith('Loading ')) said.push(message); // not the "Loading numpy, micropip" preamble
  };
  try {
    await py.loadPackage(PACKAGES, { messageCallback: note, errorCallback: note });
  } catch (error) {
    said.push(error.message);
  }
  const missing = PACKAGES.filter((name) => !(name in py.loadedPackages));
  if (missing.length > 0) {
    throw new RuvLLMError(
      'load',
      `cannot load ${missing.join(' and ')} into Pyodide from ${from}. Pyodide said:\n  ${said.join('\n  ')}\n` +
        `To fix it, pass pyodide: { indexURL } pointing at a Pyodide ${PYODIDE_VERSION} distribution (a folder or URL) ` +
        'that holds NumPy and micropip; docs/pyodide.md in the ruvllm repository says how to make one.',
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
  const url = new URL(relative, import.meta.url);
  if (IS_NODE && url.protocol === 'file:') {
    const [{ readFile }, { fileURLToPath }] = await Promise.all([import('node:fs/promises'), import('node:url')]);
    return new Uint8Array(await readFile(fileURLToPath(url)));
  }
  const response = await fetch(url);
  if (!response.ok) throw new Error(`HTTP ${response.status} for ${url}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function installWheel(py) {
  try {
    const manifest = JSON.parse(new TextDecoder().decode(await readPackageFile('../../wheel/manifest.json')));
    const bytes = await readPackageFile(`../../wheel/${manifest.file}`);
    const path = `/tmp/${manifest.file}`;
    py.FS.writeFile(path, bytes);
    const micropip = py.pyimport('micropip');
    try {
      await micropip.install(`emfs:${path}`);
    } finally {
      micropip.destroy();
    }
    py.FS.unlink(path);
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
