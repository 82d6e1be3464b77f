/**
 * Downloading weight files straight into Python-owned memory: the Python side allocates one buffer of
 * the file's size, and every network chunk is copied into it once, as it arrives. The weights never
 * sit in JavaScript memory as a whole.
 */

import { RuvLLMError } from '../errors.js';
import { concat, openFile, readJson } from './files.js';
import { callBridge } from './python.js';

const PROGRESS_INTERVAL_MS = 100;

/** The weight files of a model: the shards of model.safetensors.index.json, or model.safetensors. */
export async function weightFiles(base, options) {
  const index = await readJson(base, 'model.safetensors.index.json', { ...options, optional: true });
  if (index === null) return ['model.safetensors'];
  const shards = [...new Set(Object.values(index.weight_map ?? {}))];
  if (shards.length === 0) throw new RuvLLMError('load', 'model.safetensors.index.json lists no weight files');
  return shards;
}

/**
 * Stream every weight file into `loader` (a ruvllm.bridge.ModelLoader proxy).
 * sha256: optional { fileName: hexDigest }. onProgress receives
 * { phase: 'download', file, fileLoaded, fileTotal, loaded, total, fromCache }. The other options
 * (cache, stallTimeoutMs, signal) are openFile's. Whatever fails, every file opened is closed: no
 * download goes on and no partial copy stays.
 * @param {import('pyodide/ffi').PyProxy} loader
 * @param {string} base
 * @param {{ sha256?: Record<string, string>, onProgress?: (progress: object) => void,
 *   onPlan?: (plan: object) => void } & Parameters<typeof openFile>[2]} [options]
 */
export async function loadWeights(
  loader,
  base,
  { sha256 = {}, onProgress = () => {}, onPlan = () => {}, ...open } = {},
) {
  const names = await weightFiles(base, open);
  checkDigestNames(sha256, names);
  const files = [];
  try {
    for (const name of names) files.push({ name, ...(await openFile(base, name, open)) });
    files.forEach(requireSize);
    // Each file's header arrives first: plan (and refuse a plan that cannot fit) before the bulk.
    for (const f of files) {
      const { header, buffered, rest } = await readHeader(f);
      Object.assign(f, { buffered, chunks: rest });
      callBridge(loader, 'add_header', f.name, f.size, header);
    }
    const plan = callBridge(loader, 'plan');
    onPlan(plan);
    return await streamFiles(loader, files, { sha256, onProgress, plan });
  } finally {
    await Promise.all(files.map((f) => f.close()));
  }
}

/** A sha256 for a file the model does not have would never be checked: refused, naming the files it has. */
function checkDigestNames(sha256, names) {
  const unknown = Object.keys(sha256).filter((name) => !names.includes(name));
  if (unknown.length > 0) {
    throw new RuvLLMError(
      'invalid_argument',
      `options.sha256 names ${unknown.map((n) => JSON.stringify(n)).join(', ')}, which this model does not have; ` +
        `its weight files are: ${names.join(', ')}`,
    );
  }
}

/**
 * A GGUF file: its header (metadata and tensor list) is read first and stands for the JSON files of a
 * model folder; `onHeader` gets { config, tokenizer, tokenizer_config, generation_config } before the
 * plan is made, so a plan that cannot fit is refused before the tensor data is fetched.
 */
export async function loadGguf(loader, base, name, { sha256 = {}, onProgress, onPlan, onHeader, ...open }) {
  checkDigestNames(sha256, [name]);
  const opened = await openFile(base, name, open);
  if (opened === null) throw new Error(`${name} was opened as optional`); // (the model file is not: a bug)
  const file = { name, ...opened };
  try {
    requireSize(file);
    const iterator = file.chunks[Symbol.asyncIterator]();
    return await headerThenData(loader, file, iterator, { sha256, onProgress, onPlan, onHeader });
  } finally {
    await file.close(); // a refused header or plan: the tensor data is not fetched
  }
}

async function headerThenData(loader, file, iterator, { sha256, onProgress, onPlan, onHeader }) {
  const { name } = file;
  const buffered = [];
  let have = 0;
  let ask = 1 << 20; // ask Python whether the header is complete at 1 MiB, 2 MiB, 4 MiB ...
  let headerSize = null;
  while (headerSize === null) {
    const { value, done } = await iterator.next();
    if (!done) {
      buffered.push(value);
      have += value.length;
    }
    if (done || have >= ask || have >= file.size) {
      headerSize = callBridge(loader, 'gguf_header_size', file.size, concat(buffered, have));
      ask *= 2;
      if (headerSize === null && (done || have >= file.size))
        throw new RuvLLMError('load', `${name}: the file ended inside its GGUF header (${have} bytes)`);
    }
  }
  onHeader(callBridge(loader, 'add_gguf_header', name, file.size, concat(buffered, headerSize)));
  const plan = callBridge(loader, 'plan');
  onPlan(plan);
  Object.assign(file, { buffered, chunks: { [Symbol.asyncIterator]: () => iterator } });
  return streamFiles(loader, [file], { sha256, onProgress, plan });
}

function requireSize(f) {
  if (f.size === null)
    throw new RuvLLMError(
      'download',
      `${f.name}: the server did not say how large it is (no Content-Length, or a compressed response)`,
    );
}

/**
 * Copy each file, chunk by chunk, into Python-owned memory, with progress and optional sha256 checks.
 * @param {import('pyodide/ffi').PyProxy} loader
 * @param {{ name: string, size: number, fromCache: boolean, stored: Promise<boolean>, buffered: Uint8Array[],
 *   chunks: AsyncIterable<Uint8Array> }[]} files (openFile's, with what readHeader read)
 * @param {{ sha256?: Record<string, string>, onProgress?: (progress: object) => void, plan: object }} options
 */
async function streamFiles(loader, files, { sha256 = {}, onProgress = () => {}, plan }) {
  const total = files.reduce((n, f) => n + f.size, 0);
  let loaded = 0;
  let lastReport = 0;
  for (const file of files) {
    const expected = sha256[file.name]; // a hex digest, or undefined: not checked
    callBridge(loader, 'begin_file', { name: file.name, size: file.size, wantSha256: expected !== undefined });
    let fileLoaded = 0;
    const report = (force) => {
      const now = Date.now();
      if (!force && now - lastReport < PROGRESS_INTERVAL_MS) return;
      lastReport = now;
      onProgress({
        phase: 'download',
        file: file.name,
        fileLoaded,
        fileTotal: file.size,
        loaded,
        total,
        fromCache: file.fromCache,
      });
    };
    report(true);
    for await (const chunk of prepend(file.buffered, file.chunks)) {
      fileLoaded = callBridge(loader, 'write', file.name, chunk);
      loaded += chunk.length;
      report(false);
    }
    report(true);
    callBridge(loader, 'finish_file', { name: file.name, sha256: expected });
  }
  // Ready means cached: a reload right after loading must not download again.
  await Promise.all(files.map((f) => f.stored));
  return { total, fromCache: files.every((f) => f.fromCache), plan };
}

/** Pull chunks until the safetensors header (8-byte length + JSON) is in; keep what was read. */
async function readHeader(file) {
  const iterator = file.chunks[Symbol.asyncIterator]();
  const buffered = [];
  let have = 0;
  let needed = 8;
  while (have < needed) {
    const { value, done } = await iterator.next();
    if (done) break;
    buffered.push(value);
    have += value.length;
    if (needed === 8 && have >= 8) {
      const first = concat(buffered, 8);
      needed = 8 + Number(new DataView(first.buffer, first.byteOffset, 8).getBigUint64(0, true));
      if (needed > file.size) break; // a bad length: the Python side says what is wrong
    }
  }
  const header = concat(buffered, Math.min(have, needed));
  return { header, buffered, rest: { [Symbol.asyncIterator]: () => iterator } };
}

async function* prepend(first, rest) {
  yield* first;
  yield* rest;
}
