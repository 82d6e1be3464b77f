/**
 * Hub names: `hf:OWNER/REPO` (a model folder) or `hf:OWNER/REPO/FILE.gguf` (one GGUF file), each with an
 * optional `@REVISION` after REPO (default `main`), turned into the URLs of the Hugging Face hub's layout,
 * `{endpoint}/{owner}/{repo}/resolve/{revision}/{path}`. The same names and rules as ruvllm/files/hub.py.
 *
 *   resolveModel('hf:HuggingFaceTB/SmolLM2-135M-Instruct');
 *   // { url: 'https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/resolve/main/', kind: 'folder' }
 */

import { IS_NODE } from './env.js';
import { RuvLLMError } from './errors.js';

export const HF_PREFIX = 'hf:';
export const DEFAULT_HF_ENDPOINT = 'https://huggingface.co';
export const DEFAULT_REVISION = 'main';
export const HF_FORMS =
  'hf:OWNER/REPO (a model folder) or hf:OWNER/REPO/FILE.gguf (one GGUF file), with @REVISION after REPO optional';

/** Owner, repo and revision: letters, digits, '.', '_', '-' (the hub's own rule, less its length limits). */
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/**
 * @typedef {object} HubModel
 * @property {string} owner
 * @property {string} repo
 * @property {string} revision  a branch, tag or commit ('main' unless the name says otherwise)
 * @property {string | null} file  the GGUF file's path inside the repo, or null for a model folder
 */

/**
 * @typedef {object} ResolvedModel
 * @property {string} url  the GGUF file's URL, or the model folder's base URL (ending in '/')
 * @property {'gguf' | 'folder'} kind
 */

/** True for names that parseHubName takes (or refuses with a message): everything starting with `hf:`. */
export function isHubName(model) {
  return typeof model === 'string' && model.startsWith(HF_PREFIX);
}

/**
 * Split a hub name into its parts; an `invalid_argument` RuvLLMError saying the accepted forms otherwise.
 *
 *   parseHubName('hf:owner/repo@v1/sub/x.gguf');
 *   // { owner: 'owner', repo: 'repo', revision: 'v1', file: 'sub/x.gguf' }
 *
 * @param {string} name
 * @returns {HubModel}
 */
export function parseHubName(name) {
  const bad = (why) =>
    new RuvLLMError('invalid_argument', `${JSON.stringify(name)} is not a hub name: ${why}; use ${HF_FORMS}`);
  if (!isHubName(name)) throw bad(`it does not start with '${HF_PREFIX}'`);
  const [owner, rest] = splitOnce(name.slice(HF_PREFIX.length), '/');
  const [repoAndRevision, file] = splitOnce(rest ?? '', '/');
  const [repo, revision] = splitOnce(repoAndRevision, '@');
  if (!isName(owner)) throw bad(`owner '${owner}' must be letters, digits, '.', '_' or '-'`);
  if (!isName(repo)) throw bad(`repo '${repo}' must be letters, digits, '.', '_' or '-'`);
  if (revision !== undefined && !isName(revision))
    throw bad(`revision '${revision}' must be letters, digits, '.', '_' or '-'`);
  if (file === '') throw bad("it ends with '/'");
  if (file !== undefined) {
    if (!file.split('/').every(isPathSegment)) throw bad(`file path '${file}' has an empty, '.' or '..' segment`);
    if (!file.toLowerCase().endsWith('.gguf')) throw bad(`file '${file}' is not a .gguf file`);
  }
  return { owner, repo, revision: revision ?? DEFAULT_REVISION, file: file ?? null };
}

/**
 * The canonical `hf:` form of a hub model (the revision shown only when it is not `main`), as hub.py's
 * HubModel.name.
 *
 *   hubName({ owner: 'owner', repo: 'repo', revision: 'v1', file: null }); // 'hf:owner/repo@v1'
 *
 * @param {HubModel} model
 * @returns {string}
 */
export function hubName({ owner, repo, revision, file }) {
  const at = revision === DEFAULT_REVISION ? '' : `@${revision}`;
  return `${HF_PREFIX}${owner}/${repo}${at}${file === null ? '' : `/${file}`}`;
}

/**
 * @typedef {object} HubLocation  where the files of a model location are in the hub: its file NAME is the
 *   file `dir + NAME` of the repo at the revision
 * @property {string} owner
 * @property {string} repo
 * @property {string} revision
 * @property {string} dir  '' (a model folder: the repo's top), or the folder of a GGUF file, ending in '/'
 */

/**
 * Where the files of `model` are in the hub, for an `hf:` name; null for any other model. Node keeps them
 * in the cache root's hub folder, where CPython's `ruvllm download` does (worker/hub-folder.js).
 *
 *   hubLocation('hf:owner/repo@v1/sub/x.gguf'); // { owner: 'owner', repo: 'repo', revision: 'v1', dir: 'sub/' }
 *
 * @param {string} model
 * @returns {HubLocation | null}
 */
export function hubLocation(model) {
  if (!isHubName(model)) return null;
  const { owner, repo, revision, file } = parseHubName(model);
  return { owner, repo, revision, dir: file === null ? '' : file.slice(0, file.lastIndexOf('/') + 1) };
}

/**
 * Where a model is: an `hf:` name becomes its hub URL; any other URL or path is returned as it is, a GGUF
 * file if it ends in `.gguf`, a model folder otherwise.
 *
 *   resolveModel('hf:owner/repo/model.Q4_0.gguf', { hfEndpoint: 'http://127.0.0.1:8080' });
 *   // { url: 'http://127.0.0.1:8080/owner/repo/resolve/main/model.Q4_0.gguf', kind: 'gguf' }
 *   resolveModel('https://host/models/smollm2/'); // { url: 'https://host/models/smollm2/', kind: 'folder' }
 *
 * @param {string} model  an `hf:` name, a URL, or (in Node) a path
 * @param {{ hfEndpoint?: string }} [options]  hfEndpoint: the hub's address (default https://huggingface.co)
 * @returns {ResolvedModel}
 */
export function resolveModel(model, { hfEndpoint = DEFAULT_HF_ENDPOINT } = {}) {
  if (!isHubName(model)) {
    const path = /^[a-z][a-z0-9+.-]*:\/\//i.test(model) ? model.split(/[?#]/)[0] : model;
    return { url: model, kind: path.toLowerCase().endsWith('.gguf') ? 'gguf' : 'folder' };
  }
  const { owner, repo, revision, file } = parseHubName(model);
  const base = [hfEndpoint.replace(/\/+$/, ''), ...[owner, repo, 'resolve', revision].map(quote)].join('/') + '/';
  if (file === null) return { url: base, kind: 'folder' };
  return { url: base + file.split('/').map(quote).join('/'), kind: 'gguf' };
}

/**
 * The access token for private and gated repos: `hfToken` if given, else (in Node) the HF_TOKEN environment
 * variable, else null.
 *
 * @param {string | null} [hfToken]
 * @returns {string | null}
 */
export function hubToken(hfToken) {
  const token = hfToken ?? (IS_NODE ? process.env.HF_TOKEN : undefined);
  return typeof token === 'string' && token.trim() ? token.trim() : null;
}

/**
 * The headers a request for `url` needs: `Authorization: Bearer TOKEN` when there is a token (see hubToken)
 * and `url` is on the hub endpoint's origin, none otherwise. Give them to fetch() as they are: it drops
 * Authorization when a redirect leads to another origin (the Fetch standard, done by Node's fetch and by
 * browsers), so the CDN the hub sends large files to never gets the token; ruvllm/files/transfer.py does
 * the same on CPython.
 *
 *   fetch(url, { headers: hubHeaders(url, { hfEndpoint }) });
 *
 * @param {string} url
 * @param {{ hfEndpoint?: string, hfToken?: string | null }} [options]
 * @returns {Record<string, string>}
 */
export function hubHeaders(url, { hfEndpoint = DEFAULT_HF_ENDPOINT, hfToken } = {}) {
  const token = hubToken(hfToken);
  if (token === null || originOf(url) === null || originOf(url) !== originOf(hfEndpoint)) return {};
  return { Authorization: `Bearer ${token}` };
}

/** The origin (scheme, host, port) of an http(s) URL, or null for anything else. */
function originOf(url) {
  try {
    const parsed = new URL(url);
    return parsed.protocol === 'http:' || parsed.protocol === 'https:' ? parsed.origin : null;
  } catch {
    return null;
  }
}

/**
 * The model's name in OpenAI answers (`model`): the last segment of its path, without `.gguf`; for a
 * hub name, the GGUF file's name or else the repo's.
 *
 *   modelName('https://host/models/smollm2-135m-instruct/'); // 'smollm2-135m-instruct'
 *   modelName('hf:unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf'); // 'gemma-3-270m-it-Q4_K_M'
 *
 * @param {string} model  what RuvLLM.load was given: an `hf:` name, a URL, or (in Node) a path
 * @returns {string}
 */
export function modelName(model) {
  let path = model;
  if (isHubName(model)) {
    const { repo, file } = parseHubName(model);
    path = file ?? repo;
  } else if (/^[a-z][a-z0-9+.-]*:\/\//i.test(model)) {
    path = model.split(/[?#]/)[0];
  }
  const last =
    path
      .split(/[\\/]+/)
      .filter(Boolean)
      .pop() ?? path;
  return last.replace(/\.gguf$/i, '') || 'ruvllm';
}

/** [before, after] the first `separator`, or [text, undefined] when there is none. */
function splitOnce(text, separator) {
  const at = text.indexOf(separator);
  return at < 0 ? [text, undefined] : [text.slice(0, at), text.slice(at + 1)];
}

function isName(text) {
  return NAME.test(text) && !text.includes('..');
}

function isPathSegment(text) {
  return text !== '' && text !== '.' && text !== '..' && !text.includes('\\') && !text.includes('\0');
}

/** One path segment percent-encoded as Python's urllib.parse.quote(segment, safe='') does. */
function quote(segment) {
  return encodeURIComponent(segment).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}
