/**
 * Starting Python: Pyodide, NumPy, and our own wheel (shipped inside this package, installed with
 * micropip from the package's files, never from PyPI).
 */

import { RuvLLMError } from './errors.js';
import { IS_NODE } from './env.js';

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
  try {
    // Node: always the npm package's loader (it resolves its own Node dependencies); the runtime files
    // come from indexURL. Browsers: the loader that sits with the runtime files.
    ({ loadPyodide } = IS_NODE ? await import('pyodide') : await import(/* @vite-ignore */ `${index}pyodide.mjs`));
  } catch (error) {
    throw new RuvLLMError('load', `cannot load Pyodide from ${index ?? 'the pyodide package'}: ${error.message}`);
  }
  let py;
  try {
    py = await loadPyodide({ indexURL: index, stdout: () => {}, stderr: () => {} });
    await py.loadPackage(['numpy', 'micropip'], { messageCallback: () => {}, errorCallback: () => {} });
    py.pyimport('numpy');
  } catch (error) {
    throw new RuvLLMError('load', `cannot start Pyodide with NumPy from ${index ?? 'the pyodide package'}: ${error.message}`);
  }
  await installWheel(py);
  return py;
}

async function readPackageFile(relative) {
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
    const manifest = JSON.parse(new TextDecoder().decode(await readPackageFile('../wheel/manifest.json')));
    const bytes = await readPackageFile(`../wheel/${manifest.file}`);
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
