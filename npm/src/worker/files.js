/**
 * Reading a model's files from a URL (fetch, kept in the Cache API in browsers and in a cache folder in
 * Node) or, in Node, from a folder. Bodies are streamed: callers get the size first, then chunks, so
 * weights can be copied straight into memory that the Python side owns.
 */

import { FolderCache, cacheFolder } from './cache-folder.js';
import { IS_NODE } from '../env.js';
import { RuvLLMError } from '../errors.js';

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
 * fromCache, stored (a promise, settled once a cached copy is written: true if this call wrote one;
 * never rejects) } or to null for a missing optional file. Throws a `download` RuvLLMError naming the file.
 */
export async function openFile(base, name, { cache = true, optional = false } = {}) {
  const where = fileLocation(base, name);
  if (isLocalPath(base)) return openLocal(where, name, optional);
  if (IS_NODE) return openThroughFolder(where, name, { cache, optional });
  return openThroughCacheApi(where, name, { cache, optional });
}

async function openThroughCacheApi(url, name, { cache, optional }) {
  const store = cache && typeof caches !== 'undefined' ? await caches.open(CACHE_NAME).catch(() => null) : null;
  const cached = (await store?.match(url)) ?? null;
  if (cached) {
    return {
      size: declaredSize(cached),
      chunks: streamChunks(cached.body, name),
      fromCache: true,
      stored: Promise.resolve(false),
    };
  }
  const response = await download(url, name, optional);
  if (response === null) return null;
  const chunks = streamChunks(response.body, name);
  if (!store) return { size: declaredSize(response), chunks, fromCache: false, stored: Promise.resolve(false) };
  return { size: declaredSize(response), fromCache: false, ...copyIntoCache(store, url, response, chunks) };
}

/**
 * The cache gets each chunk as the caller reads it (not a clone of the response, which would download
 * the whole file even when the caller stops early: a GGUF whose plan is refused). A file read to its
 * end is stored; one left early is not. `stored` settles once the entry is written (false if it is
 * not: a failed write only costs the caching).
 */
function copyIntoCache(store, url, response, chunks) {
  let controller;
  const body = new ReadableStream({ start: (c) => (controller = c) });
  const stored = store.put(url, new Response(body, { headers: response.headers })).then(
    () => true,
    () => false,
  );
  async function* copy() {
    let complete = false;
    try {
      for await (const chunk of chunks) {
        controller.enqueue(chunk);
        yield chunk;
      }
      complete = true;
      controller.close();
    } finally {
      if (!complete) controller.error(new Error('the download stopped before the end of the file'));
    }
  }
  return { chunks: copy(), stored };
}

async function openThroughFolder(url, name, { cache, optional }) {
  const folder = cache ? new FolderCache(await cacheFolder()) : null;
  const hit = await folder?.read(url);
  if (hit) return { size: hit.size, chunks: plainBytes(hit.stream), fromCache: true, stored: Promise.resolve(false) };
  const response = await download(url, name, optional);
  if (response === null) return null;
  const size = declaredSize(response);
  const chunks = streamChunks(response.body, name);
  const writer = await folder?.writer(url, response); // null when the folder cannot be written
  if (!writer) return { size, chunks, fromCache: false, stored: Promise.resolve(false) };
  return { size, chunks: writer.copy(chunks, size), fromCache: false, stored: writer.stored };
}

/** The response for `url`, or null for a missing optional file; a `download` error otherwise. */
async function download(url, name, optional) {
  let response;
  try {
    response = await fetch(url);
  } catch (error) {
    throw new RuvLLMError('download', `${name}: cannot fetch ${url}: ${error.message}`);
  }
  if (response.status === 404 && optional) return null;
  if (!response.ok) {
    throw new RuvLLMError('download', `${name}: ${url} answered HTTP ${response.status} ${response.statusText}`.trim());
  }
  return response;
}

/** The body's size in bytes, or null if the response does not say (or is compressed). */
function declaredSize(response) {
  const encoding = response.headers.get('content-encoding');
  const length = response.headers.get('content-length');
  return length !== null && (!encoding || encoding === 'identity') ? Number(length) : null;
}

async function* streamChunks(body, name) {
  const reader = body.getReader();
  let done = false;
  try {
    for (;;) {
      let result;
      try {
        result = await reader.read();
      } catch (error) {
        throw new RuvLLMError('download', `${name}: the download failed midway: ${error.message}`);
      }
      if (result.done) {
        done = true;
        return;
      }
      yield result.value;
    }
  } finally {
    if (!done) await reader.cancel().catch(() => {}); // the reader stopped early (a refused plan): stop the download
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
  return concat(
    parts,
    parts.reduce((n, p) => n + p.length, 0),
  );
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
