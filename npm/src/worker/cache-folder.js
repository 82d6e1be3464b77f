/**
 * The cache root of Node: model files downloaded by URL, kept on disk and checked (the Cache API plays
 * this part in browsers; files.js picks one or the other), and boot snapshots. The root is shared with
 * CPython's ruvllm (ruvllm/files/hub.py):
 *
 *   <root>/hub/<owner>/<repo>/<revision>/<path>    files of hf: names, as both runtimes write them (hub-folder.js)
 *   <root>/urls/<sha256 of the URL>/               files given by URL, one entry each (FolderCache below)
 *   <root>/boot/                                   boot snapshots (boot-cache.js)
 *
 * Node modules are imported on first use, so this module also loads, unused, in browsers.
 */

import { RuvLLMError } from '../errors.js';

const STALE_PARTIAL_MS = 60 * 60 * 1000;

/** The root's folders: hub downloads (the layout CPython writes), entries by URL, boot snapshots. */
export const CACHE_FOLDERS = Object.freeze({ hub: 'hub', urls: 'urls', boot: 'boot' });
const CACHE_DIR_ENV = 'RUVLLM_CACHE_DIR';
const RETIRED_ENV = 'RUVLLM_MODELS_DIR'; // the hub folder itself, until the two runtimes shared one root

/**
 * @typedef {{ fs: typeof import('node:fs').promises, path: typeof import('node:path'), os: typeof import('node:os'),
 *   crypto: typeof import('node:crypto') }} NodeModules
 */

/** @type {Promise<NodeModules> | null} */
let nodeModules = null;
/** node:fs/promises, node:path, node:os and node:crypto, imported on first use: this file runs in browsers too. */
export function node() {
  nodeModules ??= Promise.all([import('node:fs'), import('node:path'), import('node:os'), import('node:crypto')]).then(
    ([fs, path, os, crypto]) => ({ fs: fs.promises, path, os, crypto }),
  );
  return nodeModules;
}

/** Errors of the file system (they have a code) mean "no caching"; anything else is a bug and goes on. */
export function rethrowBug(error) {
  if (error?.code === undefined && !(error instanceof SyntaxError)) throw error;
}

/**
 * The root of everything ruvllm keeps on disk: $RUVLLM_CACHE_DIR, else $XDG_CACHE_HOME/ruvllm (only an
 * absolute XDG_CACHE_HOME counts, as the XDG spec says), else ~/.cache/ruvllm; absolute and normalised,
 * symlinks left as they are, a leading `~` meaning $HOME. The same rule as cache_root in
 * ruvllm/files/hub.py (test/shared-cache.test.js holds the two to the same answers). An `invalid_argument`
 * RuvLLMError when the retired $RUVLLM_MODELS_DIR is set to another folder than the hub folder this gives:
 * it is never ignored in silence.
 *
 *   await cacheRoot({ XDG_CACHE_HOME: '/xdg' }); // '/xdg/ruvllm'
 */
export async function cacheRoot(env = process.env) {
  const { path, os } = await node();
  const home = env.HOME || os.homedir();
  const absolute = (where) => path.resolve(where === '~' || where.startsWith('~/') ? home + where.slice(1) : where);
  const xdg = env.XDG_CACHE_HOME ?? '';
  let root;
  if (env[CACHE_DIR_ENV]) root = absolute(env[CACHE_DIR_ENV]);
  else if (path.isAbsolute(xdg)) root = absolute(path.join(xdg, 'ruvllm'));
  else root = absolute(path.join(home, '.cache', 'ruvllm'));
  const hub = path.join(root, CACHE_FOLDERS.hub);
  const retired = env[RETIRED_ENV];
  if (retired && absolute(retired) !== hub) {
    throw new RuvLLMError('invalid_argument', retiredMessage(path, absolute(retired), hub));
  }
  return root;
}

/** The folder `name` (one of CACHE_FOLDERS) of the cache root. */
export async function cacheFolder(name, env = process.env) {
  const { path } = await node();
  return path.join(await cacheRoot(env), name);
}

/** What a $RUVLLM_MODELS_DIR of `modelsDir` is told, the hub folder being `hub` (hub.py says the same). */
function retiredMessage(path, modelsDir, hub) {
  const advice =
    path.basename(modelsDir) === CACHE_FOLDERS.hub
      ? `Set ${CACHE_DIR_ENV}=${path.dirname(modelsDir)} to keep using it`
      : `Set ${CACHE_DIR_ENV} instead and move the models of ${modelsDir} into its ${CACHE_FOLDERS.hub}/ folder`;
  return (
    `$${RETIRED_ENV} is no longer read (it is ${modelsDir}): $${CACHE_DIR_ENV} replaced it, the root of ` +
    `everything ruvllm caches, hub downloads being kept in its ${CACHE_FOLDERS.hub}/ folder (now ${hub}). ${advice}, ` +
    `and unset ${RETIRED_ENV}`
  );
}

/**
 * Files given by URL, one entry per URL in the root's urls/ folder:
 *
 *   urls/<sha256 of the URL>/data          the file's bytes
 *   urls/<sha256 of the URL>/entry.json    { url, size, sha256, etag?, lastModified? }
 *   urls/partial/<unique>/                 a download under way (data, then entry.json)
 *
 * An entry appears whole or not at all: a download is written under partial/, and its folder is renamed
 * into place (atomic within one file system) once the body ended with the size the server announced.
 * Entries are never changed in place, so concurrent runs only race to create one, and the loser drops its
 * copy. An entry is used only after its data's size and sha256 match entry.json: a file cut short or
 * altered on disk (or half-written when the machine went down) is removed and downloaded again.
 * Any failure of the disk costs the caching, never the load.
 */
export class FolderCache {
  constructor(folder) {
    this.folder = folder;
  }

  /** The cache of files given by URL under the cache root (cacheRoot: throws for a retired variable). */
  static async open(env = process.env) {
    return new FolderCache(await cacheFolder(CACHE_FOLDERS.urls, env));
  }

  async entryPath(url) {
    const { path, crypto } = await node();
    return path.join(this.folder, crypto.createHash('sha256').update(url).digest('hex'));
  }

  /** { size, stream } of the checked entry for `url`, or null (none, or a bad one, which is removed). */
  async read(url) {
    const { fs, path } = await node();
    const dir = await this.entryPath(url);
    if (
      !(await fs.access(dir).then(
        () => true,
        () => false,
      ))
    )
      return null; // not cached (or no folder)
    /** @type {import('node:fs/promises').FileHandle | null} */
    let handle = null;
    try {
      const entry = JSON.parse(await fs.readFile(path.join(dir, 'entry.json'), 'utf8'));
      handle = await fs.open(path.join(dir, 'data'));
      // Checked through the handle that then serves the bytes: what is streamed is what was checked,
      // even if another run removes the entry meanwhile.
      if (entry.url === url && (await handle.stat()).size === entry.size && (await sha256Of(handle)) === entry.sha256) {
        return { size: entry.size, stream: handle.createReadStream({ start: 0, highWaterMark: 1 << 20 }) };
      }
    } catch (error) {
      rethrowBug(error); // a missing file or a record that does not parse: a bad entry
    }
    await handle?.close();
    await fs.rm(dir, { recursive: true, force: true }).catch(rethrowBug);
    return null;
  }

  /** A DiskWriter for the download of `url`, or null when the folder cannot be written. */
  async writer(url, response) {
    const { fs, path, crypto } = await node();
    const partial = path.join(this.folder, 'partial');
    /** @type {string | null} */
    let dir = null;
    try {
      await fs.mkdir(partial, { recursive: true });
      await removeStale(partial);
      dir = await fs.mkdtemp(path.join(partial, 'download-')); // a unique name, across processes too
      const handle = await fs.open(path.join(dir, 'data'), 'wx');
      const version = { etag: response.headers.get('etag'), lastModified: response.headers.get('last-modified') };
      for (const key of Object.keys(version)) if (version[key] === null) delete version[key];
      const target = await this.entryPath(url);
      const where = /** @type {string} */ (dir);
      /** The entry, renamed into place whole; false (dropped) when another run stored this URL first. */
      const commit = async ({ size, digest }) => {
        const entry = { url, size, sha256: digest, ...version };
        await fs.writeFile(path.join(where, 'entry.json'), JSON.stringify(entry));
        await fs.rename(where, target); // ENOTEMPTY: another run stored this URL first
        return true;
      };
      const drop = () => fs.rm(where, { recursive: true, force: true });
      return new DiskWriter({ handle, hash: crypto.createHash('sha256'), commit, drop });
    } catch (error) {
      rethrowBug(error); // read-only disk, no permission, a file where the folder should be
      if (dir !== null) await fs.rm(dir, { recursive: true, force: true }).catch(rethrowBug);
      return null;
    }
  }
}

/**
 * One download copied to disk as it streams by, made a cached file by `commit` only if it completes.
 * commit({ size, digest }) (the bytes written and the hash's hex digest) puts the copy in place and
 * resolves to true, or to false when the copy is not to be kept; drop() removes the copy. Both may fail
 * with an error of the file system: that costs the caching, never the load.
 */
export class DiskWriter {
  #handle;
  #hash;
  #commit;
  #drop;
  #bytes = 0;
  #failed = false;
  #finished = false;
  #settle;
  /** Settles once the download ended: true if it became a cached file. */
  stored = new Promise((resolve) => {
    this.#settle = resolve;
  });

  /**
   * @param {{ handle: import('node:fs/promises').FileHandle, hash: import('node:crypto').Hash,
   *   commit: (copy: { size: number, digest: string }) => Promise<boolean>, drop: () => Promise<unknown> }} parts
   */
  constructor({ handle, hash, commit, drop }) {
    this.#handle = handle;
    this.#hash = hash;
    this.#commit = commit;
    this.#drop = drop;
  }

  /**
   * Pass `chunks` through, writing each to disk (never more than one chunk held here). After the last
   * one, with `size` bytes (null: the server did not say), the copy is committed; a download that
   * failed, or that the reader stopped, is dropped.
   */
  async *copy(chunks, size) {
    let complete = false;
    try {
      for await (const chunk of chunks) {
        yield chunk;
        await this.#write(chunk);
      }
      complete = size === null || this.#bytes === size;
    } finally {
      this.#settle(await this.#finish(complete));
    }
  }

  async #write(chunk) {
    if (this.#failed) return;
    this.#hash.update(chunk);
    this.#bytes += chunk.length;
    try {
      for (let done = 0; done < chunk.length;) done += (await this.#handle.write(chunk, done)).bytesWritten;
    } catch (error) {
      rethrowBug(error);
      this.#failed = true; // a full disk: the load goes on without caching
    }
  }

  /** Drop a download whose chunks were never read (copy() never started, so its cleanup never runs). */
  async discard() {
    if (!this.#finished) this.#settle(await this.#finish(false));
  }

  async #finish(complete) {
    if (this.#finished) return false;
    this.#finished = true;
    try {
      await this.#handle.close();
      if (complete && !this.#failed && (await this.#commit({ size: this.#bytes, digest: this.#hash.digest('hex') })))
        return true;
    } catch (error) {
      rethrowBug(error); // the copy could not be put in place: no caching
    }
    await this.#drop().catch(rethrowBug);
    return false;
  }
}

/** The sha256 (hex) of an open file, read through its handle. */
async function sha256Of(handle) {
  const { crypto } = await node();
  const hash = crypto.createHash('sha256');
  const buffer = new Uint8Array(1 << 20);
  for (let position = 0; ;) {
    const { bytesRead } = await handle.read(buffer, 0, buffer.length, position);
    if (bytesRead === 0) return hash.digest('hex');
    hash.update(buffer.subarray(0, bytesRead));
    position += bytesRead;
  }
}

/** True when the file or folder at `where` has not changed for an hour: left by a run that stopped. */
export async function isStale(where, now = Date.now()) {
  const { fs } = await node();
  const changed = await fs.stat(where).then(
    (s) => s.mtimeMs,
    () => now,
  );
  return now - changed > STALE_PARTIAL_MS;
}

/**
 * Remove downloads under partial/ whose data has not grown for an hour: an aborted load removes its own,
 * but a worker terminated in the middle of a write (or a process that exits) runs no cleanup, so its
 * partial copy stays behind until a later download clears it.
 */
async function removeStale(partial) {
  const { fs, path } = await node();
  const now = Date.now();
  for (const name of await fs.readdir(partial)) {
    const dir = path.join(partial, name);
    const changed = await fs
      .stat(path.join(dir, 'data'))
      .catch(() => fs.stat(dir))
      .then(
        (s) => s.mtimeMs,
        () => now,
      );
    if (now - changed > STALE_PARTIAL_MS) await fs.rm(dir, { recursive: true, force: true }).catch(rethrowBug);
  }
}
