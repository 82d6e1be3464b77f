/**
 * Where boot snapshots are kept (snapshot.js makes and restores them): the Cache API in browsers (cache
 * `ruvllm-boot-v1`), the cache root's `boot/` folder in Node (cache-folder.js). One entry per key (the Pyodide
 * version, our wheel's and NumPy's sha256); storing one removes the entries of other keys, so an
 * updated package leaves no old snapshot behind.
 *
 * An entry is one blob, checked whole before use:
 *
 *   bytes 0..7     "RUVBOOT1"
 *   bytes 8..39    sha256 of everything after byte 39
 *   bytes 40..43   the header's length (uint32, little-endian)
 *   header         JSON (snapshot.js says what it holds)
 *   payload        the bytes the header points into
 *
 * Any failure of the storage costs the caching, never the boot: reads answer null, writes say why not.
 */

import { IS_NODE } from '../env.js';
import { CACHE_FOLDERS, cacheFolder } from './cache-folder.js';

export const BOOT_CACHE_NAME = 'ruvllm-boot-v1';
const MAGIC = new TextEncoder().encode('RUVBOOT1');
const PREAMBLE = MAGIC.length + 32 + 4;

/** The sha256 of `bytes`, as hex. */
export async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** One blob of `header` (JSON-able) and `parts` (Uint8Arrays, laid end to end as the payload). */
export async function encodeEntry(header, parts) {
  const json = new TextEncoder().encode(JSON.stringify(header));
  const size = PREAMBLE + json.length + parts.reduce((n, p) => n + p.length, 0);
  const blob = new Uint8Array(size);
  blob.set(MAGIC, 0);
  new DataView(blob.buffer).setUint32(MAGIC.length + 32, json.length, true);
  let at = PREAMBLE;
  for (const part of [json, ...parts]) {
    blob.set(part, at);
    at += part.length;
  }
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', blob.subarray(MAGIC.length + 32)));
  blob.set(digest, MAGIC.length);
  return blob;
}

/** A boot snapshot that was cut or altered where it is kept: it is removed and made again. */
export class DamagedEntry extends Error {}

/**
 * { header, payload, intact } of a blob; throws a DamagedEntry if it is not an entry. `intact` resolves
 * once the checksum is computed (in the background: the caller starts other work meanwhile) and
 * rejects with a DamagedEntry if it does not match; nothing of the payload may run before it resolves.
 */
export function decodeEntry(blob) {
  if (blob.length < PREAMBLE || MAGIC.some((b, i) => blob[i] !== b)) throw new DamagedEntry('not a boot snapshot');
  const length = new DataView(blob.buffer, blob.byteOffset).getUint32(MAGIC.length + 32, true);
  if (PREAMBLE + length > blob.length) throw new DamagedEntry('its header runs past its end');
  let header;
  try {
    header = JSON.parse(new TextDecoder().decode(blob.subarray(PREAMBLE, PREAMBLE + length)));
  } catch (error) {
    throw new DamagedEntry(`its header does not parse: ${error.message}`);
  }
  const intact = crypto.subtle.digest('SHA-256', blob.subarray(MAGIC.length + 32)).then((digest) => {
    if (new Uint8Array(digest).some((b, i) => blob[MAGIC.length + i] !== b))
      throw new DamagedEntry('its checksum does not match');
  });
  intact.catch(() => {}); // awaited by the restore; a restore that fails earlier never looks
  return { header, payload: blob.subarray(PREAMBLE + length), intact };
}

/** The boot cache of this runtime, or null where there is none (no Cache API, no usable folder). */
export async function openBootCache() {
  if (IS_NODE) return new FolderBootCache(await bootFolder());
  if (typeof caches === 'undefined') return null;
  try {
    return new CacheApiBootCache(await caches.open(BOOT_CACHE_NAME));
  } catch {
    return null; // an opaque origin, or storage turned off
  }
}

/** Node: the cache root's boot folder, <root>/boot (cache-folder.js). */
export async function bootFolder(env = process.env) {
  return cacheFolder(CACHE_FOLDERS.boot, env);
}

/** Entries as files `<key>.snapshot`, written under a unique name and renamed into place (atomic). */
class FolderBootCache {
  constructor(folder) {
    this.folder = folder;
  }

  async #node() {
    const [fs, path] = await Promise.all([import('node:fs/promises'), import('node:path')]);
    return { fs, file: (name) => path.join(this.folder, name) };
  }

  async read(key) {
    const { fs, file } = await this.#node();
    try {
      return new Uint8Array(await fs.readFile(file(`${key}.snapshot`)));
    } catch {
      return null; // none (or unreadable: the same to us)
    }
  }

  /** Store `blob` under `key`; resolves to null, or to why it could not be stored. */
  async write(key, blob) {
    const { fs, file } = await this.#node();
    const partial = file(`${key}.snapshot.${process.pid}.${Date.now()}.partial`);
    try {
      await fs.mkdir(this.folder, { recursive: true });
      await fs.writeFile(partial, blob, { flag: 'wx' });
      await fs.rename(partial, file(`${key}.snapshot`));
    } catch (error) {
      await fs.rm(partial, { force: true }).catch(() => {});
      return error.message;
    }
    await this.#removeOthers(key);
    return null;
  }

  async remove(key) {
    const { fs, file } = await this.#node();
    await fs.rm(file(`${key}.snapshot`), { force: true }).catch(() => {});
  }

  /** Entries of other keys, and partial writes an hour old (a process that died while writing). */
  async #removeOthers(key) {
    const { fs, file } = await this.#node();
    const names = await fs.readdir(this.folder).catch(() => []);
    for (const name of names) {
      if (name.startsWith(`${key}.`)) continue;
      if (name.endsWith('.partial')) {
        const { mtimeMs } = await fs.stat(file(name)).catch(() => ({ mtimeMs: Date.now() }));
        if (Date.now() - mtimeMs < 60 * 60 * 1000) continue; // another run may be writing it now
      }
      if (name.endsWith('.snapshot') || name.endsWith('.partial') || name.endsWith('.failed'))
        await fs.rm(file(name), { force: true }).catch(() => {});
    }
  }

  async markFailed(key, reason) {
    const { fs, file } = await this.#node();
    await fs.mkdir(this.folder, { recursive: true }).catch(() => {});
    await fs.writeFile(file(`${key}.failed`), reason).catch(() => {});
  }

  async failed(key) {
    const { fs, file } = await this.#node();
    return fs.readFile(file(`${key}.failed`), 'utf8').catch(() => null);
  }
}

/** Entries as Cache API responses under a URL of their own (never fetched). */
class CacheApiBootCache {
  constructor(cache) {
    this.cache = cache;
  }

  #url(name) {
    return new URL(`ruvllm-boot/${name}`, globalThis.location?.href ?? 'https://ruvllm.invalid/').href;
  }

  async read(key) {
    try {
      const response = await this.cache.match(this.#url(`${key}.snapshot`));
      return response ? new Uint8Array(await response.arrayBuffer()) : null;
    } catch {
      return null;
    }
  }

  async write(key, blob) {
    try {
      await this.cache.put(this.#url(`${key}.snapshot`), new Response(blob));
    } catch (error) {
      return error.message; // a full quota
    }
    for (const request of await this.cache.keys().catch(() => [])) {
      if (!request.url.includes(`/ruvllm-boot/${key}.`)) await this.cache.delete(request).catch(() => {});
    }
    return null;
  }

  async remove(key) {
    await this.cache.delete(this.#url(`${key}.snapshot`)).catch(() => {});
  }

  async markFailed(key, reason) {
    await this.cache.put(this.#url(`${key}.failed`), new Response(reason)).catch(() => {});
  }

  async failed(key) {
    const response = await this.cache.match(this.#url(`${key}.failed`)).catch(() => null);
    return response ? response.text() : null;
  }
}
