/**
 * The cache folder of Node: model files downloaded by URL, kept on disk and checked before every use
 * (the Cache API plays this part in browsers; files.js picks one or the other). Node modules are
 * imported on first use, so this module also loads, unused, in browsers.
 */

const STALE_PARTIAL_MS = 60 * 60 * 1000;

/**
 * @typedef {{ fs: typeof import('node:fs').promises, path: typeof import('node:path'), os: typeof import('node:os'),
 *   crypto: typeof import('node:crypto') }} NodeModules
 */

/** @type {Promise<NodeModules> | null} */
let nodeModules = null;
/** node:fs/promises, node:path, node:os and node:crypto, imported on first use: this file runs in browsers too. */
function node() {
  nodeModules ??= Promise.all([import('node:fs'), import('node:path'), import('node:os'), import('node:crypto')]).then(
    ([fs, path, os, crypto]) => ({ fs: fs.promises, path, os, crypto }),
  );
  return nodeModules;
}

/** Errors of the file system (they have a code) mean "no caching"; anything else is a bug and goes on. */
function rethrowBug(error) {
  if (error?.code === undefined && !(error instanceof SyntaxError)) throw error;
}

/**
 * Where Node keeps downloaded model files: $RUVLLM_CACHE_DIR, else $XDG_CACHE_HOME/ruvllm/models (only
 * an absolute XDG_CACHE_HOME counts, as the XDG spec says), else ~/.cache/ruvllm/models.
 */
export async function cacheFolder(env = process.env) {
  const { path, os } = await node();
  if (env.RUVLLM_CACHE_DIR) return path.resolve(env.RUVLLM_CACHE_DIR);
  const xdg = env.XDG_CACHE_HOME && path.isAbsolute(env.XDG_CACHE_HOME) ? env.XDG_CACHE_HOME : null;
  return path.join(xdg ?? path.join(os.homedir(), '.cache'), 'ruvllm', 'models');
}

/**
 * The cache folder, one entry per file URL:
 *
 *   <folder>/<sha256 of the URL>/data          the file's bytes
 *   <folder>/<sha256 of the URL>/entry.json    { url, size, sha256, etag?, lastModified? }
 *   <folder>/partial/<unique>/                 a download under way (data, then entry.json)
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

  /** A CacheWriter for the download of `url`, or null when the folder cannot be written. */
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
      const hash = crypto.createHash('sha256');
      return new CacheWriter({ handle, dir, target: await this.entryPath(url), url, version, hash });
    } catch (error) {
      rethrowBug(error); // read-only disk, no permission, a file where the folder should be
      if (dir !== null) await fs.rm(dir, { recursive: true, force: true }).catch(rethrowBug);
      return null;
    }
  }
}

/** One download copied into the cache folder as it streams by; an entry only if it completes. */
class CacheWriter {
  #handle;
  #dir;
  #target;
  #url;
  #version; // what the server said of the file's version (etag, lastModified), kept for reference
  #hash;
  #bytes = 0;
  #failed = false;
  #finished = false;
  #settle;
  /** Settles once the download ended: true if it became an entry. */
  stored = new Promise((resolve) => {
    this.#settle = resolve;
  });

  constructor({ handle, dir, target, url, version, hash }) {
    this.#hash = hash;
    this.#handle = handle;
    this.#dir = dir;
    this.#target = target;
    this.#url = url;
    this.#version = version;
  }

  /**
   * Pass `chunks` through, writing each to disk (never more than one chunk held here). After the last
   * one, with `size` bytes (null: the server did not say), the copy becomes an entry; a download that
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
    const { fs, path } = await node();
    try {
      await this.#handle.close();
      if (complete && !this.#failed) {
        const entry = { url: this.#url, size: this.#bytes, sha256: this.#hash.digest('hex'), ...this.#version };
        await fs.writeFile(path.join(this.#dir, 'entry.json'), JSON.stringify(entry));
        await fs.rename(this.#dir, this.#target);
        return true;
      }
    } catch (error) {
      rethrowBug(error); // ENOTEMPTY: another run stored this URL first; any other: no caching
    }
    await fs.rm(this.#dir, { recursive: true, force: true }).catch(rethrowBug);
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
