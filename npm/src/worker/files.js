/**
 * Reading a model's files from a URL (fetch, kept in the Cache API in browsers and in the cache root in
 * Node: the files of `hf:` names in its hub folder, where CPython's ruvllm keeps them too, any other URL's
 * in its urls folder) or, in Node, from a folder. Bodies are streamed: callers get the size first, then
 * chunks, so weights can be copied straight into memory that the Python side owns.
 */

import { MODELS_CACHE } from '../bridge-schema.js';
import { FolderCache } from './cache-folder.js';
import { HubFolder } from './hub-folder.js';
import { IS_NODE } from '../env.js';
import { AbortError, RuvLLMError } from '../errors.js';
import { STALL_TIMEOUT_MS } from '../options.js';
import { hubHeaders } from '../hub.js';

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
 * never rejects), close() } or to null for a missing optional file. Throws a `download` RuvLLMError
 * naming the file. close() ends the download and drops a partial copy, whether or not reading began
 * (a no-op after the last chunk): whoever opens a file closes it when a load fails.
 *
 * Network reads wait at most `stallTimeoutMs` for the server's next byte (the headers, then each piece
 * of the body), then fail with a `download` error naming the URL; aborting `signal` stops them with an
 * AbortError.
 *
 * hub.location: where the files of `base` are in the hub (an `hf:` name's, hub.js's hubLocation). In Node
 * they are then read from and written to the cache root's hub folder, as CPython's `ruvllm download` does.
 * @param {string} base
 * @param {string} name
 * @param {{ cache?: boolean, optional?: boolean, stallTimeoutMs?: number, signal?: AbortSignal,
 *   hub?: { hfEndpoint?: string, hfToken?: string, location?: import('../hub.js').HubLocation | null } }} [options]
 */
export async function openFile(base, name, { cache = true, optional = false, ...network } = {}) {
  const where = fileLocation(base, name);
  if (isLocalPath(base)) return openLocal(where, name, optional);
  const hub = network.hub ?? {};
  const watch = {
    stallTimeoutMs: network.stallTimeoutMs ?? STALL_TIMEOUT_MS,
    signal: network.signal,
    headers: (/** @type {string} */ url) => hubHeaders(url, hub), // HF_TOKEN for the hub only (hub.js)
  };
  if (!IS_NODE) return openThroughCacheApi(where, name, { cache, optional, watch });
  const { location } = hub;
  const hubFile = location ? { ...location, path: location.dir + name } : null;
  return openThroughFolder(where, name, { cache, optional, watch, hubFile });
}

/**
 * An opened file: `chunks` with a close() that works whether or not reading began. A generator that
 * never started runs no `finally` when it is returned, so `dropUnread` does its cleanup then.
 * @param {{ size: number | null, chunks: AsyncGenerator<Uint8Array>, fromCache: boolean, stored?: Promise<boolean>,
 *   dropUnread?: () => Promise<unknown> }} file
 */
function opened({ size, chunks, fromCache, stored = Promise.resolve(false), dropUnread = async () => {} }) {
  const iterator = chunks[Symbol.asyncIterator]();
  let started = false;
  /** @type {Promise<void> | null} */
  let closed = null;
  const reader = {
    [Symbol.asyncIterator]: () => reader,
    next: () => {
      started = true;
      return iterator.next();
    },
    return: (value) => iterator.return(value),
  };
  const close = () => {
    closed ??= (started ? iterator.return(undefined) : dropUnread()).then(
      () => {},
      () => {},
    );
    return closed;
  };
  return { size, chunks: reader, fromCache, stored, close };
}

async function openThroughCacheApi(url, name, { cache, optional, watch }) {
  const store = cache && typeof caches !== 'undefined' ? await caches.open(MODELS_CACHE).catch(() => null) : null;
  const cached = (await store?.match(url)) ?? null;
  if (cached) {
    return opened({
      size: declaredSize(cached),
      chunks: streamChunks(cached.body, name),
      fromCache: true,
      dropUnread: async () => cached.body?.cancel(),
    });
  }
  const fetched = await download(url, name, optional, watch);
  if (fetched === null) return null;
  const { response } = fetched;
  const chunks = streamChunks(response.body, name, fetched);
  const dropUnread = () => fetched.stop();
  if (!store) return opened({ size: declaredSize(response), chunks, fromCache: false, dropUnread });
  const copy = copyIntoCache(store, url, response, chunks);
  return opened({ size: declaredSize(response), fromCache: false, ...copy, dropUnread: () => copy.drop(dropUnread) });
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
  const drop = async (stop) => {
    controller.error(new Error('the download was dropped before it was read'));
    await stop();
  };
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
  return { chunks: copy(), stored, drop };
}

/**
 * Node: the file from the cache root, else downloaded and stored there. A file of the hub (`hubFile`:
 * owner, repo, revision, path) is kept in its hub folder (hub-folder.js), any other URL in its urls folder.
 */
async function openThroughFolder(url, name, { cache, optional, watch, hubFile }) {
  const hub = cache && hubFile ? await HubFolder.open() : null;
  const urls = cache && !hubFile ? await FolderCache.open() : null;
  if (optional && hub && hubFile && (await hub.absent(hubFile))) return null; // its folder's record says so
  const hit = hub && hubFile ? await hub.read(hubFile) : await urls?.read(url);
  if (hit) {
    return opened({
      size: hit.size,
      chunks: plainBytes(hit.stream),
      fromCache: true,
      dropUnread: async () => void hit.stream.destroy(), // (not destroy's answer: the stream, no promise)
    });
  }
  const fetched = await download(url, name, optional, { ...watch, hub: hubFile !== null });
  if (fetched === null) return null;
  const { response, said } = fetched;
  const size = declaredSize(response);
  const chunks = streamChunks(response.body, name, fetched);
  const writer = // null when the folder cannot be written
    hub && hubFile
      ? await hub.writer(hubFile, { ...said, size: said.size ?? size })
      : await urls?.writer(url, response);
  if (!writer) return opened({ size, chunks, fromCache: false, dropUnread: () => fetched.stop() });
  return opened({
    size,
    chunks: writer.copy(chunks, size),
    fromCache: false,
    stored: writer.stored,
    dropUnread: () => Promise.all([fetched.stop(), writer.discard()]),
  });
}

/**
 * Fetch `url`: resolves to { response, said, read(promise), stop() }, or to null for a missing optional
 * file; a `download` error otherwise. Every wait on the server (`read` wraps the body's reads) fails
 * after `stallTimeoutMs` without a byte; `signal` aborts them all. `headers(url)`: a request's headers.
 * With `hub` (a file of the hub, in Node), redirects are followed here, so that `said` holds what the hub
 * said of the file (hubSays); otherwise fetch follows them and nothing is said.
 */
async function download(url, name, optional, { stallTimeoutMs, signal, headers, hub = false }) {
  if (signal?.aborted) throw new AbortError('loading aborted');
  const controller = new AbortController();
  const onAbort = () => controller.abort();
  signal?.addEventListener('abort', onAbort, { once: true });
  const stalled = () =>
    new RuvLLMError(
      'download',
      `${name}: ${url} sent nothing for ${stallTimeoutMs / 1000} s; giving up (the stallTimeoutMs load option)`,
    );
  /** `promise`, or the stall error once `stallTimeoutMs` pass first (the request is aborted then). */
  const read = async (promise) => {
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => {
        reject(stalled());
        controller.abort();
      }, stallTimeoutMs);
    });
    try {
      return await Promise.race([promise, timeout]);
    } catch (error) {
      if (signal?.aborted) throw new AbortError('loading aborted');
      throw error;
    } finally {
      clearTimeout(timer);
    }
  };
  const stop = async () => {
    signal?.removeEventListener('abort', onAbort);
    controller.abort();
  };
  let response;
  let said = NOTHING_SAID;
  try {
    if (!hub) response = await read(fetch(url, { signal: controller.signal, headers: headers(url) }));
    else {
      // (identity: a size the hub announces is the body's, as transfer.py asks)
      const ask = (here) =>
        fetch(here, {
          signal: controller.signal,
          headers: { ...headers(here), 'Accept-Encoding': 'identity' },
          redirect: 'manual',
        });
      ({ response, said } = await followHub(url, name, (here) => read(ask(here))));
    }
  } catch (error) {
    await stop();
    if (error instanceof RuvLLMError || error instanceof AbortError) throw error;
    throw new RuvLLMError('download', `${name}: cannot fetch ${url}: ${error.message}`);
  }
  if ((response.status === 404 && optional) || !response.ok) {
    await response.body?.cancel().catch(() => {});
    await stop();
  }
  if (response.status === 404 && optional) return null;
  if (!response.ok) {
    throw new RuvLLMError('download', `${name}: ${url} answered HTTP ${response.status} ${response.statusText}`.trim());
  }
  return { response, said, read, stop };
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const MAX_REDIRECTS = 10; // transfer.py's
/** @type {import('./hub-folder.js').HubExpected} */
const NOTHING_SAID = Object.freeze({ size: null, sha256: null, gitBlob: null });

/**
 * The answer with the file's bytes, redirects followed (`ask(url)` fetches one without following), and what
 * the hub said of the file in its first answer that carries X-Repo-Commit (hubSays).
 * @param {string} url
 * @param {string} name
 * @param {(url: string) => Promise<Response>} ask
 */
async function followHub(url, name, ask) {
  /** @type {import('./hub-folder.js').HubExpected | null} */
  let said = null;
  for (let here = url, hops = 0; ; hops++) {
    const response = await ask(here);
    said ??= hubSays(response);
    const location = response.headers.get('location');
    if (!REDIRECTS.has(response.status) || location === null) return { response, said: said ?? NOTHING_SAID };
    await response.body?.cancel().catch(() => {});
    if (hops === MAX_REDIRECTS) {
      throw new RuvLLMError(
        'download',
        `${name}: ${url}: more than ${MAX_REDIRECTS} redirects (a loop?), the last to ${here}`,
      );
    }
    here = new URL(location, here).href;
    if (!/^https?:$/.test(new URL(here).protocol)) {
      throw new RuvLLMError('download', `${name}: ${url} redirected to ${here}, not an http(s) URL`);
    }
  }
}

/**
 * What the hub says of a file in an answer that carries X-Repo-Commit (transfer.py's _note_hub), or null for
 * another answer: its size (X-Linked-Size, else the Content-Length of an answer that is not a redirect), and
 * X-Linked-Etag or ETag as the sha256 of a large file (64 hex digits) or the git blob id of a small one (40).
 * @param {Response} response
 * @returns {import('./hub-folder.js').HubExpected | null}
 */
function hubSays(response) {
  const { headers } = response;
  if (!headers.get('x-repo-commit')) return null;
  const etag = (headers.get('x-linked-etag') || headers.get('etag') || '').trim().replace(/^W\//, '');
  const tag = etag.replace(/^"|"$/g, '').toLowerCase();
  const hex = /^[0-9a-f]+$/.test(tag) ? tag : '';
  const linked = (headers.get('x-linked-size') ?? '').trim();
  let size = /^[0-9]+$/.test(linked) ? Number(linked) : null;
  if (size === null && !REDIRECTS.has(response.status)) size = declaredSize(response);
  return {
    size,
    sha256: hex.length === 64 ? hex : null,
    gitBlob: hex.length === 40 && size !== null ? hex : null,
  };
}

/** The body's size in bytes, or null if the response does not say (or is compressed). */
function declaredSize(response) {
  const encoding = response.headers.get('content-encoding');
  const length = response.headers.get('content-length');
  return length !== null && (!encoding || encoding === 'identity') ? Number(length) : null;
}

/**
 * The chunks of a body. With `network` ({ read, stop } of download()), every read waits at most the
 * stall timeout, and the request is let go at the end, read to its end or not.
 */
/**
 * @param {ReadableStream<Uint8Array> | null} body null: none (a 204 answer), read as no bytes
 * @param {string} name
 * @param {{ read: (promise: Promise<any>) => Promise<any>, stop: () => Promise<void> } | null} [network]
 */
async function* streamChunks(body, name, network = null) {
  if (body === null) {
    await network?.stop();
    return;
  }
  const reader = body.getReader();
  let done = false;
  try {
    for (;;) {
      let result;
      try {
        result = await (network ? network.read(reader.read()) : reader.read());
      } catch (error) {
        if (error instanceof RuvLLMError || error instanceof AbortError) throw error;
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
    await network?.stop();
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
  const stream = fs.createReadStream(path, { highWaterMark: 1 << 20 });
  return opened({
    size: stat.size,
    chunks: plainBytes(stream),
    fromCache: false,
    dropUnread: async () => stream.destroy(),
  });
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
  try {
    for await (const chunk of file.chunks) parts.push(chunk);
  } finally {
    await file.close();
  }
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
  const bytes = await readBytes(base, name, options);
  return bytes === null ? null : parseJson(bytes, name);
}

/** The JSON document in `bytes` (file `name`); a `load` error naming the file if it is not JSON. */
export function parseJson(bytes, name) {
  try {
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch (error) {
    throw new RuvLLMError('load', `${name}: not valid JSON (${error.message})`);
  }
}
