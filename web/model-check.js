// Checking a model location before loading it: is it a URL or a hub name at all, and does it answer like
// a model (a folder's config.json, a GGUF file's first bytes)? A few small requests, so a wrong location
// is told in a second, in words that say what was wrong, while the model already loaded stays in use.
//
//   const { url, kind, downloadBytes, cached } = await checkModel('/models/smollm2-135m-instruct/');
//   // a ModelCheckError otherwise: its message says what was wrong ("404 at https://…")
//
// Files already in the browser cache (where RuvLLM.load keeps what it downloads) answer from there, so a
// page reloaded offline still passes.

// The package's own rule for hub names and for telling a GGUF file from a folder, a model folder's files
// (the one layout, py_src/ruvllm/files/layout.py) and the Cache API store RuvLLM.load keeps model files
// in (npm/README.md, "Caching"), not written again here.
import { FOLDER_FILES, MODELS_CACHE } from '/npm/src/bridge-schema.js';
import { isHubName, resolveModel } from '/npm/src/hub.js';
/** How long a probe waits for the server: a location that never answers is said to, not waited on. */
const PROBE_TIMEOUT_MS = 20_000;
const GGUF_MAGIC = 'GGUF';

/** What is wrong with a model location; `retryable`: trying again may help (the server did not answer). */
export class ModelCheckError extends Error {
  constructor(message, { retryable = false } = {}) {
    super(message);
    this.name = 'ModelCheckError';
    this.retryable = retryable;
  }
}

/**
 * Check the model at `input` (a URL, relative to the page or absolute, or an `hf:` name).
 * @param {string} input
 * @param {{ signal?: AbortSignal }} [options]
 * @returns {Promise<{ url: string, kind: 'gguf' | 'folder', downloadBytes: number | null, cached: boolean }>}
 *   downloadBytes: the weights' size (null when the folder's weights are sharded); cached: they are in
 *   the browser cache already.
 */
export async function checkModel(input, { signal } = {}) {
  const { url, kind } = locate(input);
  const store = typeof caches === 'undefined' ? null : await caches.open(MODELS_CACHE).catch(() => null);
  const probe = (fileUrl, how) => probeFile(fileUrl, { ...how, store, signal });
  if (kind === 'gguf') {
    const file = await probe(url, { head: 4 });
    if (file.status === 404) throw new ModelCheckError(`404 at ${url}: there is no file there.`);
    requireOk(file, url);
    const magic = String.fromCharCode(...file.head);
    if (magic !== GGUF_MAGIC) {
      throw new ModelCheckError(
        `Not a GGUF file: ${url} starts with ${JSON.stringify(magic)}, a GGUF file with "${GGUF_MAGIC}".`,
      );
    }
    return { url, kind, downloadBytes: file.size, cached: file.cached };
  }
  const configUrl = new URL(FOLDER_FILES.config, url).href;
  const config = await probe(configUrl, { head: 1 << 20 });
  if (config.status === 404) {
    throw new ModelCheckError(
      `Not a model folder: no config.json at ${configUrl} (404). ` +
        'A model is a .gguf file, or a folder with config.json, tokenizer.json and model.safetensors.',
    );
  }
  requireOk(config, configUrl);
  requireModelConfig(config, configUrl);
  const weightsUrl = new URL(FOLDER_FILES.weights, url).href;
  const weights = await probe(weightsUrl, { head: 0 });
  if (weights.status === 404) {
    const indexUrl = new URL(FOLDER_FILES.index, url).href;
    const index = await probe(indexUrl, { head: 0 });
    if (index.status === 404) {
      throw new ModelCheckError(
        `Not a model folder: ${url} has config.json but no weights ` +
          '(model.safetensors and model.safetensors.index.json: 404).',
      );
    }
    requireOk(index, indexUrl);
    return { url, kind, downloadBytes: null, cached: false }; // the shards' sizes are the loader's business
  }
  requireOk(weights, weightsUrl);
  return { url, kind, downloadBytes: weights.size, cached: weights.cached };
}

/** The URL and kind of `input`, or a ModelCheckError when it is neither a URL nor a hub name. */
function locate(input) {
  const text = input.trim();
  if (isHubName(text)) {
    try {
      return resolveModel(text);
    } catch (error) {
      throw new ModelCheckError(error.message); // says which part of the name is wrong, and the forms
    }
  }
  const absolute = /^[a-z][a-z0-9+.-]*:/i.test(text);
  // A relative URL is a path: it has a '/' (or names a .gguf file). Words without one are not a location.
  const looksLikeOne = absolute || text.includes('/') || /\.gguf$/i.test(text);
  /** @type {URL | null} */
  let url = null;
  if (text && !/\s/.test(text) && looksLikeOne) {
    try {
      url = new URL(text, location.href);
    } catch {
      url = null;
    }
  }
  if (url === null) {
    throw new ModelCheckError(
      `${JSON.stringify(text)} is not a URL or an hf: name. Give the address of a .gguf file or of a model ` +
        'folder (https://… or /…), or a hub name: hf:OWNER/REPO/FILE.gguf or hf:OWNER/REPO.',
    );
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new ModelCheckError(`${JSON.stringify(text)} is not a web address: the page loads http(s) URLs.`);
  }
  const { kind } = resolveModel(url.href);
  return { url: kind === 'folder' && !url.pathname.endsWith('/') ? `${url.href}/` : url.href, kind };
}

/**
 * The status, size and first `head` bytes of the file at `url`, from the browser cache when it holds the
 * file, else from the server (a ranged GET: only those bytes are wanted; a server that ignores the range
 * is cut off after them; a HEAD for none).
 */
async function probeFile(url, { head, store, signal }) {
  const hit = (await store?.match(url)) ?? null;
  if (hit) return { status: hit.status, size: declaredSize(hit), head: await firstBytes(hit, head), cached: true };
  const controller = new AbortController();
  const onAbort = () => controller.abort();
  signal?.addEventListener('abort', onAbort, { once: true });
  const timer = setTimeout(() => controller.abort(), PROBE_TIMEOUT_MS);
  try {
    // HEAD when no bytes are wanted (the weights: their size only), else a GET of the first `head` bytes
    const request = head > 0 ? { headers: { Range: `bytes=0-${head - 1}` } } : { method: 'HEAD' };
    const response = await fetch(url, { ...request, signal: controller.signal });
    return {
      status: response.status,
      size: declaredSize(response),
      head: await firstBytes(response, head),
      cached: false,
    };
  } catch (error) {
    if (signal?.aborted) throw error;
    const why = controller.signal.aborted ? `no answer in ${PROBE_TIMEOUT_MS / 1000} s` : error.message;
    throw new ModelCheckError(`Cannot reach ${url} (${why}).`, { retryable: true });
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener('abort', onAbort);
  }
}

/** The first `n` bytes of a response's body (fewer if it is shorter); the rest is not downloaded. */
async function firstBytes(response, n) {
  if (!response.body) return new Uint8Array(0);
  const reader = response.body.getReader();
  const parts = [];
  let have = 0;
  try {
    while (have < n) {
      const { value, done } = await reader.read();
      if (done) break;
      parts.push(value);
      have += value.length;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  const bytes = new Uint8Array(Math.min(have, n));
  let at = 0;
  for (const part of parts) {
    const take = part.subarray(0, bytes.length - at);
    bytes.set(take, at);
    at += take.length;
    if (at === bytes.length) break;
  }
  return bytes;
}

/** The file's whole size: from Content-Range on a ranged answer, else Content-Length; null if not said. */
function declaredSize(response) {
  const range = /\/(\d+)\s*$/.exec(response.headers.get('Content-Range') ?? '');
  if (response.status === 206 && range) return Number(range[1]);
  const length = response.headers.get('Content-Length');
  return response.status === 200 && length !== null ? Number(length) : null;
}

function requireOk(file, url) {
  if (file.status >= 200 && file.status <= 299) return;
  const retryable = file.status >= 500 || file.status === 429; // the server's trouble, maybe for a moment
  throw new ModelCheckError(`HTTP ${file.status} at ${url}.`, { retryable });
}

/** config.json must be a model's: JSON naming its architecture (model_type or architectures). */
function requireModelConfig(file, url) {
  let config;
  try {
    config = JSON.parse(new TextDecoder().decode(file.head));
  } catch {
    config = null;
  }
  if (config === null || typeof config !== 'object' || !(config.model_type || config.architectures)) {
    throw new ModelCheckError(`Not a model folder: ${url} is not a model's config (JSON with model_type).`);
  }
}
