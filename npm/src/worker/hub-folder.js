/**
 * The files of `hf:` names in Node, kept where and as CPython's ruvllm keeps them (ruvllm/files/hub.py and
 * transfer.py), so a model downloaded by either runtime is read by the other without a request:
 *
 *   <root>/hub/<owner>/<repo>/<revision>/<path>                 a file, whole and checked
 *   <root>/hub/<owner>/<repo>/<revision>/.<name>.<tag>.part     a download of it under way, beside it
 *   <root>/hub/<owner>/<repo>/<revision>/.complete              a model folder's record { name, files: { name: size } }
 *
 * A file is renamed to its path only once it arrived whole and checked as transfer.py checks it: the size the
 * hub announced (X-Linked-Size, else Content-Length), the hash it gave (in its answer that carries
 * X-Repo-Commit, X-Linked-Etag or ETag: the sha256 of a large file, or the git blob id of a small one), then
 * its format (a GGUF's magic, a safetensors header, JSON that parses). A file at its path is therefore used as
 * it is, as hub.py does. A model folder's `.complete` record, written last, names the files the folder has: an
 * optional file it does not name is not on the hub, and is not asked for.
 *
 * Partial files are named `.<name>.<12 hex digits>.part`, the form of transfer.py's fresh ones, so that
 * `ruvllm list` shows Node's and each runtime removes those the other left behind: Python removes the ones
 * no process holds locked, Node the ones unchanged for an hour. Node takes no lock (Node has no flock): a
 * Python download of the same file may remove the partial file Node writes, which then costs only that
 * caching. Node never resumes a partial file.
 *
 * Node modules are imported on first use (cache-folder.js), so this module also loads, unused, in browsers.
 */

import { CACHE_FOLDERS, DiskWriter, cacheFolder, isStale, node, rethrowBug } from './cache-folder.js';
import { FOLDER_FILES } from '../bridge-schema.js';
import { hubName } from '../hub.js';

const COMPLETE = '.complete'; // hub.py's COMPLETE
const GGUF_MAGIC = 'GGUF';

/**
 * @typedef {object} HubFile  one file of a repo at a revision
 * @property {string} owner
 * @property {string} repo
 * @property {string} revision
 * @property {string} path  its path inside the repo ('/'-separated)
 */

/**
 * @typedef {object} HubExpected  what the hub said of a file (transfer.py's Expected)
 * @property {number | null} size
 * @property {string | null} sha256  hex, of a large file
 * @property {string | null} gitBlob  hex, the git blob id of a small file
 */

export class HubFolder {
  /** @param {string} folder  the cache root's hub folder */
  constructor(folder) {
    this.folder = folder;
  }

  /** The hub folder of the cache root (cacheRoot: throws for a retired variable). */
  static async open(env = process.env) {
    return new HubFolder(await cacheFolder(CACHE_FOLDERS.hub, env));
  }

  /** The folder of a repo at a revision. */
  async repoFolder({ owner, repo, revision }) {
    const { path } = await node();
    return path.join(this.folder, owner, repo, revision);
  }

  /** @param {HubFile} file */
  async target(file) {
    const { path } = await node();
    return path.join(await this.repoFolder(file), ...file.path.split('/'));
  }

  /**
   * { size, stream } of the file, or null when it is not here. A file at its path was renamed there whole
   * and checked, by either runtime: it is used as it is.
   * @param {HubFile} file
   */
  async read(file) {
    const { fs } = await node();
    /** @type {import('node:fs/promises').FileHandle | null} */
    let handle = null;
    try {
      handle = await fs.open(await this.target(file));
      const stat = await handle.stat();
      if (stat.isFile()) return { size: stat.size, stream: handle.createReadStream({ highWaterMark: 1 << 20 }) };
    } catch (error) {
      rethrowBug(error); // not here (or unreadable: the same to us)
    }
    await handle?.close();
    return null;
  }

  /**
   * True when the file's model folder is complete (its `.complete` record, by either runtime) and the
   * record does not name the file: an optional file the hub does not have.
   * @param {HubFile} file
   */
  async absent(file) {
    const { fs, path } = await node();
    try {
      const record = JSON.parse(await fs.readFile(path.join(await this.repoFolder(file), COMPLETE), 'utf8'));
      return typeof record?.files === 'object' && record.files !== null && !Object.hasOwn(record.files, file.path);
    } catch (error) {
      rethrowBug(error); // no record, or one that does not parse: nothing is known
      return false;
    }
  }

  /**
   * A DiskWriter for the download of `file`, or null when the folder cannot be written. `expected` is what
   * the hub said of it; the copy becomes the file only if it matches (see the top of this module).
   * @param {HubFile} file
   * @param {HubExpected} expected
   */
  async writer(file, expected) {
    const { fs, path, crypto } = await node();
    const target = await this.target(file);
    const partial = partialPath(path, target, crypto.randomBytes(6).toString('hex'));
    /** @type {import('node:fs/promises').FileHandle | null} */
    let handle = null;
    try {
      await fs.mkdir(path.dirname(target), { recursive: true });
      await removeStalePartials(target);
      handle = await fs.open(partial, 'wx');
      const hash = crypto.createHash(expected.gitBlob && !expected.sha256 ? 'sha1' : 'sha256');
      if (expected.gitBlob && !expected.sha256) hash.update(`blob ${expected.size}\0`); // git's blob id
      const commit = async ({ size, digest }) => {
        if (expected.size === null || size !== expected.size) return false; // transfer.py: no size, no file
        if ((expected.sha256 ?? expected.gitBlob ?? digest) !== digest) return false;
        if (await wrongFormat(partial, path.extname(target).toLowerCase())) return false;
        await fs.rename(partial, target);
        return true;
      };
      return new DiskWriter({ handle, hash, commit, drop: () => fs.rm(partial, { force: true }) });
    } catch (error) {
      rethrowBug(error); // read-only disk, no permission, a file where the folder should be
      await handle?.close().catch(rethrowBug);
      await fs.rm(partial, { force: true }).catch(rethrowBug);
      return null;
    }
  }

  /**
   * Write the `.complete` record of a model folder (hub.py's) once all its files are here: `files`, name ->
   * size, the files its load read. Nothing happens if a record exists, if a file is missing or of another
   * size, or without a config and a tokenizer (hub.py fetches both). Resolves to true when it wrote one; a
   * failure of the disk costs only the record.
   * @param {{ owner: string, repo: string, revision: string }} model
   * @param {Record<string, number>} files
   */
  async record(model, files) {
    const { fs, path, crypto } = await node();
    const folder = await this.repoFolder(model);
    const target = path.join(folder, COMPLETE);
    const partial = partialPath(path, target, crypto.randomBytes(6).toString('hex'));
    if (!Object.hasOwn(files, FOLDER_FILES.config) || !Object.hasOwn(files, FOLDER_FILES.tokenizer)) return false;
    try {
      if (
        await fs.stat(target).then(
          () => true,
          () => false,
        )
      )
        return false;
      for (const [name, size] of Object.entries(files)) {
        if ((await fs.stat(path.join(folder, name))).size !== size) return false;
      }
      const name = hubName({ ...model, file: null });
      await fs.writeFile(partial, JSON.stringify({ name, files }, null, 1), { flag: 'wx' });
      await fs.rename(partial, target);
      return true;
    } catch (error) {
      rethrowBug(error); // a file missing (ENOENT), a read-only disk
      await fs.rm(partial, { force: true }).catch(rethrowBug);
      return false;
    }
  }
}

/** `.{name}.{tag}.part` beside `target`: transfer.py's name for a partial file. */
function partialPath(path, target, tag) {
  return path.join(path.dirname(target), `.${path.basename(target)}.${tag}.part`);
}

/** Remove the partial files of `target` unchanged for an hour (transfer.py's pattern: tags of 6 to 16 characters). */
async function removeStalePartials(target) {
  const { fs, path } = await node();
  const escaped = path.basename(target).replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const own = new RegExp(`^\\.${escaped}\\.[A-Za-z0-9_]{6,16}\\.part$`);
  const now = Date.now();
  for (const name of await fs.readdir(path.dirname(target))) {
    const where = path.join(path.dirname(target), name);
    if (own.test(name) && (await isStale(where, now))) await fs.rm(where, { force: true }).catch(rethrowBug);
  }
}

/**
 * True when a finished file is not of the kind its suffix says (hub.py's _problem): a GGUF's magic, a
 * safetensors file's header size and '{', JSON that parses as UTF-8.
 */
async function wrongFormat(file, suffix) {
  const { fs } = await node();
  if (suffix === '.json') {
    try {
      JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(await fs.readFile(file)));
      return false;
    } catch {
      return true; // not UTF-8 (a TypeError), not JSON (a SyntaxError), or gone
    }
  }
  const handle = await fs.open(file);
  try {
    const head = Buffer.alloc(9);
    const { bytesRead } = await handle.read(head, 0, head.length, 0);
    if (suffix === '.gguf') return bytesRead < 4 || head.toString('latin1', 0, 4) !== GGUF_MAGIC;
    if (suffix === '.safetensors') {
      const size = (await handle.stat()).size;
      return bytesRead < 9 || head[8] !== 0x7b || head.readBigUInt64LE(0) > BigInt(size - 8);
    }
    return false;
  } finally {
    await handle.close();
  }
}

/**
 * Write the `.complete` record of the hub model folder `model` after a load read `files` (name -> size)
 * from it (see HubFolder.record); any failure costs only the record.
 */
export async function recordHubFolder(model, files) {
  return (await HubFolder.open()).record(model, files);
}
