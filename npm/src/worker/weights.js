/**
 * Handing a model's files to the Python loader (ruvllm.bridge.ModelLoader). The loader decides which file
 * it needs next and in what part (py_src/ruvllm/runtime/assembly.py: a folder's JSON documents whole, then
 * every weight file's header, then their data); this module only moves the bytes. Weight files are copied
 * chunk by chunk straight into Python-owned memory: they never sit in JavaScript memory as a whole.
 */

import { RuvLLMError } from '../errors.js';
import { concat, openFile, readBytes } from './files.js';
import { callBridge } from './python.js';

const PROGRESS_INTERVAL_MS = 100;

/**
 * Give `loader` every file it asks for, read from the model location `base` (a GGUF file's folder when the
 * loader was set up for one; the loader checks the digests its options name). prefetched: { fileName: bytes }
 * already read (the config, read before Pyodide booted so a wrong location fails at once). onDocuments
 * gets the documents' bytes ({ name: Uint8Array | null }) once they are in, before the weights (none for
 * a GGUF, whose header holds them: then after that header); onPlan the memory plan, made once every
 * weight file's header is in, before their data; onProgress
 * { phase: 'download', file, fileLoaded, fileTotal, loaded, total, fromCache }. The other options (cache,
 * stallTimeoutMs, signal, hub) are openFile's. Whatever fails, every file opened is closed: no download
 * goes on and no partial copy stays. Resolves to the bytes of the weights (`total`), whether they all came
 * from the cache, the memory plan, and `files`: every file read (documents and weights), name -> size.
 * @param {import('pyodide/ffi').PyProxy} loader
 * @param {string} base
 * @param {{ prefetched?: Record<string, Uint8Array | null>,
 *   onDocuments?: (documents: Record<string, Uint8Array | null>) => void, onPlan?: (plan: object) => void,
 *   onProgress?: (progress: object) => void } & Parameters<typeof openFile>[2]} [options]
 * @returns {Promise<{ total: number, fromCache: boolean, plan: object | null, files: Record<string, number> }>}
 */
export async function feedLoader(
  loader,
  base,
  { prefetched = {}, onDocuments = () => {}, onPlan = () => {}, onProgress = () => {}, ...open } = {},
) {
  /** @type {Record<string, Uint8Array | null>} */
  const documents = {};
  let told = false;
  const tell = () => {
    told = true;
    onDocuments(documents);
  };
  const weights = new Map(); // weight files, opened for their header and read on for their data
  /** @type {Record<string, number>} */
  const read = {}; // every file read: name -> size
  let plan = null;
  /** @type {{ total: number, loaded: number, lastReport: number } | null} */
  let download = null; // once the data begins
  try {
    for (let want = callBridge(loader, 'next'); want !== null; want = callBridge(loader, 'next')) {
      if (want.part === 'document') {
        const bytes =
          want.name in prefetched
            ? prefetched[want.name]
            : await readBytes(base, want.name, { ...open, optional: want.optional });
        callBridge(loader, 'give_document', want.name, bytes);
        documents[want.name] = bytes;
        if (bytes !== null) read[want.name] = bytes.length;
      } else if (want.part === 'header') {
        if (!told && Object.keys(documents).length > 0) tell();
        const file = await openWeights(base, want.name, open);
        weights.set(want.name, file);
        const head = await readHeader(loader, file);
        const made = callBridge(loader, 'give_header', file.name, file.size, head); // the plan, after the last
        if (!told && Object.keys(documents).length === 0) tell(); // a GGUF: its header held them
        if (made !== null) onPlan((plan = made));
      } else {
        download ??= { total: [...weights.values()].reduce((n, f) => n + f.size, 0), loaded: 0, lastReport: 0 };
        await streamFile(loader, weights.get(want.name), download, onProgress);
      }
    }
  } finally {
    await Promise.all([...weights.values()].map((f) => f.close()));
  }
  // Ready means cached: a reload right after loading must not download again.
  const files = [...weights.values()];
  await Promise.all(files.map((f) => f.stored));
  for (const file of files) read[file.name] = file.size;
  return { total: download?.total ?? 0, fromCache: files.every((f) => f.fromCache), plan, files: read };
}

/** A weight file opened (its size known, its body not read yet). */
async function openWeights(base, name, open) {
  const opened = await openFile(base, name, open);
  if (opened === null) throw new Error(`${name} was opened as optional`); // (weight files are not: a bug)
  const file = { name, ...opened, buffered: [], chunks: opened.chunks };
  if (file.size === null) {
    await file.close();
    throw new RuvLLMError(
      'download',
      `${name}: the server did not say how large it is (no Content-Length, or a compressed response)`,
    );
  }
  return file;
}

/**
 * The file's first bytes, read until they hold its header (the loader says how many that is: it is asked
 * again each time twice as many bytes are in, or as many as it said); what was read is kept in
 * `file.buffered` and streamed again with the data.
 */
async function readHeader(loader, file) {
  const iterator = file.chunks[Symbol.asyncIterator]();
  let have = 0;
  let ask = 8;
  let at = null;
  for (;;) {
    const { value, done } = await iterator.next();
    if (done) break; // a file that ends inside its header: the loader says what is wrong
    file.buffered.push(value);
    have += value.length;
    if (have < ask) continue;
    at = callBridge(loader, 'header_size', file.name, file.size, concat(file.buffered, have));
    if (at !== null && have >= at) break;
    ask = Math.max(at ?? 0, 2 * ask);
  }
  file.chunks = { [Symbol.asyncIterator]: () => iterator };
  return concat(file.buffered, Math.min(have, at ?? have));
}

/**
 * Copy one file, chunk by chunk, into Python-owned memory, with progress.
 * @param {import('pyodide/ffi').PyProxy} loader
 * @param {{ name: string, size: number, fromCache: boolean, buffered: Uint8Array[],
 *   chunks: AsyncIterable<Uint8Array> }} file
 * @param {{ total: number, loaded: number, lastReport: number }} download the progress of all the files
 * @param {(progress: object) => void} onProgress
 */
async function streamFile(loader, file, download, onProgress) {
  callBridge(loader, 'begin_file', { name: file.name, size: file.size });
  let fileLoaded = 0;
  const report = (force) => {
    const now = Date.now();
    if (!force && now - download.lastReport < PROGRESS_INTERVAL_MS) return;
    download.lastReport = now;
    const { loaded, total } = download;
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
  const buffered = file.buffered;
  file.buffered = [];
  for await (const chunk of prepend(buffered, file.chunks)) {
    fileLoaded = callBridge(loader, 'write', file.name, chunk);
    download.loaded += chunk.length;
    report(false);
  }
  report(true);
  callBridge(loader, 'finish_file', { name: file.name });
}

async function* prepend(first, rest) {
  yield* first;
  yield* rest;
}
