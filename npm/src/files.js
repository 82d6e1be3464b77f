/**
 * Reading a model's files from a URL (fetch, with the Cache API in browsers) or, in Node, from a folder.
 * Bodies are streamed: callers get the size first, then chunks, so weights can be copied straight into
 * memory that the Python side owns.
 */

import { RuvLLMError } from './errors.js';
import { IS_NODE } from './env.js';

export const CACHE_NAME = 'ruvllm-models-v1';

/** True when `model` names a local folder rather than a URL (Node only). */
export function isLocalPath(model) {
  return IS_NODE && !/^[a-z][a-z0-9+.-]*:\/\//i.test(model);
}

/** The URL or path of `name` inside the model location `base`. */
export function fileLocation(base, name) {
  if (isLocalPath(base)) return base.endsWith('/') ? base + name : `${base}/${name}`;
  return new URL(name, base.endsWith('/') ? base : `${base}/`).href;
}

/**
 * Open one file: resolves to { size (bytes, or null if unknown), chunks (async iterable of Uint8Array),
 * fromCache, stored (a promise that settles when a browser cache copy is written) } or to null for a
 * missing optional file. Throws a `download` RuvLLMError naming the file.
 */
export async function openFile(base, name, { cache = true, optional = false } = {}) {
  const where = fileLocation(base, name);
  if (isLocalPath(base)) return openLocal(where, name, optional);
  let response = null;
  let fromCache = false;
  let stored = Promise.resolve(false); // settles once the Cache API holds the file (never rejects)
  const store = cache && typeof caches !== 'undefined' ? await caches.open(CACHE_NAME).catch(() => null) : null;
  if (store) {
    response = (await store.match(where)) ?? null;
    fromCache = response !== null;
  }
  if (!response) {
    try {
      response = await fetch(where);
    } catch (error) {
      throw new RuvLLMError('download', `${name}: cannot fetch ${where}: ${error.message}`);
    }
    if (response.status === 404 && optional) return null;
    if (!response.ok) {
      throw new RuvLLMError('download', `${name}: ${where} answered HTTP ${response.status} ${response.statusText}`.trim());
    }
    // The cache gets its own copy of the stream (written to disk); a failed write only costs the caching.
    if (store) stored = store.put(where, response.clone()).then(() => true, () => false);
  }
  const encoding = response.headers.get('content-encoding');
  const length = response.headers.get('content-length');
  const size = length !== null && (!encoding || encoding === 'identity') ? Number(length) : null;
  return { size, chunks: streamChunks(response.body, name), fromCache, stored };
}

async function* streamChunks(body, name) {
  const reader = body.getReader();
  try {
    for (;;) {
      let result;
      try {
        result = await reader.read();
      } catch (error) {
        throw new RuvLLMError('download', `${name}: the download failed midway: ${error.message}`);
      }
      if (result.done) return;
      yield result.value;
    }
  } finally {
    reader.releaseLock();
  }
}

async function openLocal(path, name, optional) {
  const fs = await import('node:fs');
  let stat;
  try {
    stat = await fs.promises.stat(path);
  } catch (error) {
    if (error.code === 'ENOENT' && optional) return null;
    const reason = error.code === 'ENOENT' ? 'no such file' : error.message;
    throw new RuvLLMError('download', `${name}: cannot read ${path}: ${reason}`);
  }
  const chunks = plainBytes(fs.createReadStream(path, { highWaterMark: 1 << 20 }));
  return { size: stat.size, chunks, fromCache: false, stored: Promise.resolve(false) };
}

/** Node Buffers as plain Uint8Array views (Pyodide copies only plain typed arrays into Python). */
async function* plainBytes(stream) {
  for await (const chunk of stream) yield new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength);
}

/** A whole small file as bytes (adapters, JSON), or null for a missing optional file. */
export async function readBytes(base, name, options) {
  const file = await openFile(base, name, options);
  if (file === null) return null;
  const parts = [];
  for await (const chunk of file.chunks) parts.push(chunk);
  return concat(parts, parts.reduce((n, p) => n + p.length, 0));
}

/** The first `length` bytes of `chunks` (Uint8Arrays) in one array. */
export function concat(chunks, length) {
  const out = new Uint8Array(length);
  let offset = 0;
  for (const chunk of chunks) {
    if (offset >= length) break;
    const part = chunk.subarray(0, length - offset);
    out.set(part, offset);
    offset += part.length;
  }
  return out;
}

/** A whole small file as text (config and tokenizer JSON). */
export async function readText(base, name, options) {
  const bytes = await readBytes(base, name, options);
  return bytes === null ? null : new TextDecoder().decode(bytes);
}

/** A small JSON file, parsed; a `load` error names it if it does not parse. */
export async function readJson(base, name, options) {
  const text = await readText(base, name, options);
  if (text === null) return null;
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new RuvLLMError('load', `${name}: not valid JSON (${error.message})`);
  }
}
