/**
 * Downloading weight files straight into Python-owned memory: the Python side allocates one buffer of
 * the file's size, and every network chunk is copied into it once, as it arrives. The weights never
 * sit in JavaScript memory as a whole.
 */

import { RuvLLMError } from './errors.js';
import { openFile, readJson } from './files.js';

const PROGRESS_INTERVAL_MS = 100;

/** The weight files of a model: the shards of model.safetensors.index.json, or model.safetensors. */
export async function weightFiles(base, options) {
  const index = await readJson(base, 'model.safetensors.index.json', { ...options, optional: true });
  if (index === null) return ['model.safetensors'];
  const shards = [...new Set(Object.values(index.weight_map ?? {}))];
  if (shards.length === 0) throw new RuvLLMError('load', 'model.safetensors.index.json lists no weight files');
  return shards;
}

function unwrap(json) {
  const result = JSON.parse(json);
  if (result.error) throw new RuvLLMError(result.error.type, result.error.message);
  return result.ok;
}

/**
 * Stream every weight file into `loader` (a ruvllm.bridge.ModelLoader proxy).
 * sha256: optional { fileName: hexDigest }. onProgress receives
 * { phase: 'download', file, fileLoaded, fileTotal, loaded, total, fromCache }.
 */
export async function loadWeights(loader, base, { cache, signal, sha256 = {}, onProgress = () => {} } = {}) {
  const names = await weightFiles(base, { cache, signal });
  const files = [];
  for (const name of names) files.push({ name, ...(await openFile(base, name, { cache, signal })) });
  for (const f of files) {
    if (f.size === null) throw new RuvLLMError('download', `${f.name}: the server did not say how large it is (no Content-Length, or a compressed response)`);
  }
  const total = files.reduce((n, f) => n + f.size, 0);
  let loaded = 0;
  let lastReport = 0;
  for (const file of files) {
    const expected = sha256[file.name]; // undefined reaches Python as None (null would be jsnull)
    unwrap(loader.begin_file(file.name, file.size, expected !== undefined));
    let fileLoaded = 0;
    const report = (force) => {
      const now = Date.now();
      if (!force && now - lastReport < PROGRESS_INTERVAL_MS) return;
      lastReport = now;
      onProgress({ phase: 'download', file: file.name, fileLoaded, fileTotal: file.size, loaded, total, fromCache: file.fromCache });
    };
    report(true);
    for await (const chunk of file.chunks) {
      if (signal?.aborted) throw signal.reason;
      fileLoaded = unwrap(loader.write(file.name, chunk));
      loaded += chunk.length;
      report(false);
    }
    report(true);
    unwrap(loader.finish_file(file.name, expected));
  }
  // Ready means cached: a reload right after loading must not download again.
  await Promise.all(files.map((f) => f.stored));
  return { total, fromCache: files.every((f) => f.fromCache) };
}
