/**
 * A local server laid out as the Hugging Face hub (tests/test_hub.py's LocalHub, for the Node tests):
 * `/<owner>/<repo>/resolve/<revision>/<path>` answers with X-Repo-Commit; a small file comes back itself with
 * its git blob id as ETag, a large one (.gguf, .safetensors) is a 302 to `/lfs/...` with X-Linked-Size and
 * X-Linked-Etag (its sha256), as the hub does. Every request is recorded in `requests` (paths, unquoted).
 *
 *   const hub = await hubServer({ 'acme/tiny': { 'x.gguf': bytes } }); // or a folder: { 'acme/m': '/path' }
 *   hub.corrupt.add('/acme/tiny/resolve/main/x.gguf'); // its body then ends in a flipped byte
 */
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { join } from 'node:path';

export const COMMIT = 'c0ffee'.repeat(6) + 'c0ff';

/** The hub's ETag of a small file: git's blob id. */
export const gitBlobId = (bytes) =>
  createHash('sha1')
    .update(Buffer.concat([Buffer.from(`blob ${bytes.length}\0`), bytes]))
    .digest('hex');

/**
 * @param {Record<string, string | Record<string, Uint8Array>>} repos  'owner/repo' -> a folder, or path -> bytes
 *   (every revision of a repo has the same files)
 */
export async function hubServer(repos) {
  const requests = [];
  const corrupt = new Set();
  const file = async (resolvePath) => {
    const match = /^\/([^/]+\/[^/]+)\/resolve\/[^/]+\/(.+)$/.exec(resolvePath);
    const repo = match && repos[match[1]];
    if (!repo) return null;
    if (typeof repo === 'object') return repo[match[2]] ?? null;
    return readFile(join(repo, match[2])).catch(() => null);
  };
  const server = createServer(async (request, response) => {
    const path = decodeURIComponent(new URL(request.url, 'http://hub').pathname);
    requests.push(path);
    const lfs = path.startsWith('/lfs/');
    const resolvePath = lfs ? path.slice('/lfs'.length) : path;
    const bytes = await file(resolvePath);
    if (bytes === null) {
      response.writeHead(404, { 'X-Repo-Commit': COMMIT, 'X-Error-Code': 'EntryNotFound', 'Content-Length': 0 });
      return response.end();
    }
    const large = /\.(gguf|safetensors)$/.test(path);
    if (large && !lfs) {
      const sha256 = createHash('sha256').update(bytes).digest('hex');
      response.writeHead(302, {
        Location: `/lfs${request.url}`,
        'X-Repo-Commit': COMMIT,
        'X-Linked-Size': bytes.length,
        'X-Linked-Etag': `"${sha256}"`,
        'Content-Length': 0,
      });
      return response.end();
    }
    const headers = { 'Content-Length': bytes.length };
    if (!lfs) Object.assign(headers, { 'X-Repo-Commit': COMMIT, ETag: `"${gitBlobId(bytes)}"` });
    response.writeHead(200, headers);
    if (!corrupt.has(resolvePath)) return response.end(bytes);
    const spoilt = Buffer.from(bytes);
    spoilt[spoilt.length - 1] ^= 1;
    response.end(spoilt);
  });
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  return {
    endpoint: `http://127.0.0.1:${/** @type {import('node:net').AddressInfo} */ (server.address()).port}`,
    requests,
    corrupt,
    close: () => new Promise((done) => server.close(done)),
  };
}
