/**
 * The options of the public API, each described once: what it must be (type, finiteness, integer-ness,
 * range). The facade checks every call against these tables on the caller's thread, before anything is
 * posted to the worker: a bad value is an 'invalid_argument' RuvLLMError naming the option, what it
 * expects and what it got,
 *
 *   options.temperature must be a finite number >= 0, got NaN
 *
 * and a name a table does not have is refused with the names it does have (a typo'd option silently
 * ignored would make every later run wrong without a word). `undefined` means "not given", as in most
 * JavaScript APIs; null is a value, allowed only where it means something (`adapter: null`).
 *
 * OpenAI request bodies are not described here: Python checks their fields, by the rule the server
 * follows. `checkJson` only makes sure a body is what JSON carries (NaN would silently become null).
 */

import { RuvLLMError } from './errors.js';
import { ARITHMETIC, DEVICE_CHOICES, KERNEL_CHOICES, MAX_THREADS } from './protocol.js';

const invalid = (message) => new RuvLLMError('invalid_argument', message);

/** A value as a message shows it: short, and exact about what it is (NaN, a function, a Map ...). */
export function describe(value) {
  if (typeof value === 'string') {
    const length = value.length > 40 ? ` (${value.length.toLocaleString('en')} characters)` : '';
    return `${JSON.stringify(value.slice(0, 40))}${length ? '...' : ''}${length}`;
  }
  if (typeof value === 'bigint') return `${value}n (a BigInt)`;
  if (typeof value === 'function') return 'a function';
  if (typeof value !== 'object' || value === null) return String(value);
  const name = Object.getPrototypeOf(value)?.constructor?.name;
  if (!Array.isArray(value) && name && name !== 'Object') return `a ${name}`;
  let json;
  try {
    json = JSON.stringify(value);
  } catch {
    json = undefined; // a cycle or a BigInt inside
  }
  if (json !== undefined && json.length <= 60) return json;
  return Array.isArray(value) ? `an array of ${value.length} items` : 'an object';
}

// --- rules: what one value may be ------------------------------------------------------------------

/**
 * A rule: `expects` is what a message says the value must be; `test(value)` says whether it is;
 * `inside(value, path)` checks its members (objects and arrays), throwing for the first bad one.
 * (The values are whatever a caller passed: `test` is what narrows them.)
 * @param {string} expects
 * @param {(value: any) => boolean} test
 * @param {((value: any, path: string) => unknown) | null} [inside]
 */
const rule = (expects, test, inside = null) => ({ expects, test, inside });

/** Marks a rule whose option must be given. */
export const required = (r) => ({ ...r, required: true });

const MAX_INT = Number.MAX_SAFE_INTEGER;
const shown = (n) => (n === MAX_INT ? '2^53 - 1' : n === -MAX_INT ? '-(2^53 - 1)' : String(n));

/** An integer JavaScript holds exactly (a safe integer) in [min, max]. */
export const integer = (min, max = MAX_INT) =>
  rule(`an integer in [${shown(min)}, ${shown(max)}]`, (v) => Number.isSafeInteger(v) && v >= min && v <= max);

/** A finite number for which `test` holds, `range` saying which ('>= 0', 'in (0, 1]' ...). */
const finite = (range, test) =>
  rule(`a finite number ${range}`, (v) => typeof v === 'number' && Number.isFinite(v) && test(v));

const text = rule('a non-empty string', (v) => typeof v === 'string' && v.length > 0);
const flag = rule('true or false', (v) => typeof v === 'boolean');
const fn = rule('a function', (v) => typeof v === 'function');
const oneOf = (choices) => rule(`one of ${choices.join(', ')}`, (v) => choices.includes(v));
const nullable = (r) =>
  rule(
    `null or ${r.expects}`,
    (v) => v === null || r.test(v),
    (v, path) => v === null || r.inside?.(v, path),
  );

/** An AbortSignal, by its shape (a signal from another realm or a polyfill is one too). */
const signal = rule(
  'an AbortSignal',
  (v) =>
    typeof v === 'object' && v !== null && typeof v.aborted === 'boolean' && typeof v.addEventListener === 'function',
);

const isObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);

/** An array of values that each pass `item` (named `items` in the message), non-empty if asked. */
const arrayOf = (item, items, { nonEmpty = false } = {}) =>
  rule(
    `${nonEmpty ? 'a non-empty' : 'an'} array of ${items}`,
    (v) => Array.isArray(v) && (!nonEmpty || v.length > 0),
    (v, path) => v.forEach((each, i) => check(item, each, `${path}[${i}]`)),
  );

/** An object of options described by `table` (its unknown keys refused), inside `what` (for messages). */
const options = (table, what) => rule('an object', isObject, (v, path) => checkTable(table, v, path, what));

/** An object whose every value passes `value` (the keys are names: sha256's file names). */
const recordOf = (value, entries) =>
  rule(`an object of ${entries}`, isObject, (v, path) => {
    for (const [key, each] of Object.entries(v)) check(value, each, `${path}[${JSON.stringify(key)}]`);
  });

/** Throws the message for `value` at `path` if it is given (or required) and breaks `r`. */
export function check(r, value, path) {
  if (value === undefined && !r.required) return;
  if (!r.test(value)) throw invalid(`${path} must be ${r.expects}, got ${describe(value)}`);
  r.inside?.(value, path);
}

/**
 * Check an object of options against `table`: every key known, every value passing its rule. `what`
 * names the call in the message for an unknown key, with the known names and the likeliest one meant.
 */
export function checkTable(table, value, path, what) {
  if (!isObject(value)) throw invalid(`${path} must be an object, got ${describe(value)}`);
  const known = Object.keys(table);
  for (const key of Object.keys(value)) {
    if (Object.hasOwn(table, key)) continue;
    const meant = likeliest(key, known);
    throw invalid(
      `${path}.${key} is not an option of ${what}${meant ? ` (did you mean ${meant}?)` : ''}; ` +
        `its options are: ${known.join(', ')}`,
    );
  }
  for (const [name, r] of Object.entries(table)) check(r, value[name], `${path}.${name}`);
  return value;
}

/** The known name a typo most likely meant: the same in camelCase (max_tokens) or case, or 1-2 edits away. */
function likeliest(key, known) {
  const fold = (s) => s.replace(/[_-]/g, '').toLowerCase();
  const same = known.find((name) => fold(name) === fold(key));
  if (same) return same;
  let best = null;
  let bestDistance = 3;
  for (const name of known) {
    const d = distance(key.toLowerCase(), name.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [name, d];
  }
  return best;
}

/** Levenshtein distance (short strings only: option names). */
function distance(a, b) {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++)
      next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    row = next;
  }
  return row[b.length];
}

// --- the tables ----------------------------------------------------------------------------------

/** How long a download may get no byte from the server before it fails (ms): see worker/files.js. */
export const STALL_TIMEOUT_MS = 30_000;

export const COMPUTE_FORMS = Object.freeze(['auto', 'f32', 'q8', 'q4']);
export const COLD_FORMATS = Object.freeze(['int8', 'int4']);
export const LORA_TARGETS = Object.freeze([
  'q_proj',
  'k_proj',
  'v_proj',
  'o_proj',
  'gate_proj',
  'up_proj',
  'down_proj',
  'lm_head',
]);

const MODEL = rule(
  'the URL (in Node also the path) of a GGUF file or of a model folder, or a hub name (hf:OWNER/REPO/FILE.gguf)',
  text.test,
);

const httpUrl = rule('an http:// or https:// URL', (v) => {
  if (typeof v !== 'string') return false;
  try {
    return ['http:', 'https:'].includes(new URL(v).protocol);
  } catch {
    return false;
  }
});

export const KV_OPTIONS = {
  hotTokens: integer(1),
  cold: oneOf(COLD_FORMATS),
  budgetBytes: integer(1),
  keep: integer(0),
};

/** RuvLLM.load(options). */
export const LOAD_OPTIONS = {
  model: required(MODEL),
  hfEndpoint: httpUrl,
  hfToken: text,
  chatTemplate: text,
  pyodide: options({ indexURL: text }, 'pyodide'),
  onProgress: fn,
  signal,
  cache: flag,
  bootCache: flag,
  sha256: recordOf(
    rule('a sha256 digest (64 hex digits)', (v) => typeof v === 'string' && /^[0-9a-fA-F]{64}$/.test(v)),
    'file name: sha256 digest (64 hex digits)',
  ),
  contextLength: integer(1),
  compute: oneOf(COMPUTE_FORMS),
  kernels: oneOf(KERNEL_CHOICES),
  arithmetic: oneOf(ARITHMETIC),
  plan: flag,
  device: oneOf(DEVICE_CHOICES),
  threads: rule(`'auto' or an integer in [1, ${MAX_THREADS}]`, (v) => v === 'auto' || integer(1, MAX_THREADS).test(v)),
  memoryBudget: integer(1),
  kv: options(KV_OPTIONS, 'kv'),
  stallTimeoutMs: integer(1, 2 ** 31 - 1), // setTimeout fires at once past 2^31 - 1 ms
};

const stopString = rule('a non-empty string', text.test);

/**
 * generate(prompt, options) and chat(messages, options); `maxTokens` at most `positions` (the context
 * length: more could never be generated), or any safe integer when the cache has no bound (a KV budget).
 */
export function generationOptions(positions = Infinity) {
  const maxTokens = integer(1, Math.min(positions, MAX_INT));
  if (positions < MAX_INT) maxTokens.expects += ' (the context length)';
  return {
    maxTokens,
    temperature: finite('>= 0', (v) => v >= 0),
    topK: integer(0),
    topP: finite('in (0, 1]', (v) => v > 0 && v <= 1),
    minP: finite('in [0, 1]', (v) => v >= 0 && v <= 1),
    repetitionPenalty: finite('> 0', (v) => v > 0),
    seed: integer(0),
    ignoreEos: flag,
    stop: rule(
      'a non-empty string or an array of them',
      (v) => stopString.test(v) || Array.isArray(v),
      (v, path) => Array.isArray(v) && v.forEach((each, i) => check(stopString, each, `${path}[${i}]`)),
    ),
    adapter: nullable(text),
    signal,
  };
}

/** What a conversation is: `{ role, content }` messages, both strings. */
export const MESSAGES = rule(
  'a non-empty array of { role, content } strings',
  (v) => Array.isArray(v) && v.length > 0,
  (v, path) =>
    v.forEach((message, i) => {
      if (!isObject(message))
        throw invalid(`${path}[${i}] must be a { role, content } object, got ${describe(message)}`);
      for (const field of ['role', 'content']) {
        if (typeof message[field] !== 'string')
          throw invalid(`${path}[${i}].${field} must be a string, got ${describe(message[field])}`);
      }
    }),
);

const tokenId = integer(0);

/** A prompt: raw text, or token ids. */
export const PROMPT = rule(
  'a string or a non-empty array of token ids (integers >= 0)',
  (v) => typeof v === 'string' || (Array.isArray(v) && v.length > 0),
  (v, path) => Array.isArray(v) && v.forEach((id, i) => check(tokenId, id, `${path}[${i}]`)),
);

/** adapt(feedback, ...): the lesson. One of prompt and messages is required (checked by the caller). */
export const FEEDBACK = {
  prompt: rule('a string', (v) => typeof v === 'string'),
  messages: MESSAGES,
  completion: required(text),
  reward: finite('other than 0', (v) => v !== 0),
  adapter: text,
  steps: integer(1),
  lr: finite('in (0, 10)', (v) => v > 0 && v < 10),
  optimizer: oneOf(['sgd', 'adam']),
  ewc: finite('>= 0', (v) => v >= 0),
  untilGreedy: flag,
  rehearse: integer(0),
  keep: finite('>= 0', (v) => v >= 0),
  project: finite('in [0, 1)', (v) => v >= 0 && v < 1),
  keyed: flag,
};

/** adapt(feedback, options). */
export const ADAPT_OPTIONS = { signal, onProgress: fn };

/** newAdapter(config). */
export const ADAPTER_CONFIG = {
  name: text,
  rank: integer(1),
  alpha: finite('> 0', (v) => v > 0),
  targets: arrayOf(oneOf(LORA_TARGETS), `names among ${LORA_TARGETS.join(', ')}`, { nonEmpty: true }),
  layers: nullable(arrayOf(integer(-MAX_INT), 'layer indexes (integers)', { nonEmpty: true })),
};

/** mixAdapters(name, experts, options). */
export const MIX_OPTIONS = {
  topK: integer(1),
  depth: integer(1),
  size: integer(1),
  layerwise: flag,
  temperature: finite('> 0', (v) => v > 0),
};

export const EXPERTS = arrayOf(text, 'adapter names', { nonEmpty: true });

/** loadAdapter(url, options). */
export const LOAD_ADAPTER_OPTIONS = { name: text };

/** chat.completions.create(body, options) and completions.create(body, options). */
export const REQUEST_OPTIONS = { signal };

export const ADAPTER_NAME = text;
export const ADAPTER_URL = rule('a non-empty string (a URL, in Node also a path)', text.test);
export const NULLABLE_ADAPTER_NAME = nullable(text);

// --- JSON bodies ---------------------------------------------------------------------------------

/**
 * Throws unless `value` crosses JSON unchanged (members that are undefined are left out, as
 * JSON.stringify and the OpenAI SDK do): no NaN or Infinity (JSON would make them null, a silent
 * default), no functions, symbols or BigInts, no class instances (Map, Date ...), no cycles.
 */
export function checkJson(value, path, ancestors = new Set()) {
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw invalid(`${path} must be a finite number, got ${describe(value)}`);
    return;
  }
  if (typeof value === 'string' || typeof value === 'boolean' || value === null) return;
  const plain =
    typeof value === 'object' &&
    (Array.isArray(value) || [Object.prototype, null].includes(Object.getPrototypeOf(value)));
  if (!plain)
    throw invalid(
      `${path} must be a JSON value (a string, finite number, boolean, null, array or plain object), got ${describe(value)}`,
    );
  if (ancestors.has(value)) throw invalid(`${path} contains itself (a cycle), which JSON cannot carry`);
  ancestors.add(value);
  if (Array.isArray(value)) value.forEach((each, i) => checkJson(each, `${path}[${i}]`, ancestors));
  else {
    for (const [key, each] of Object.entries(value)) {
      const where = /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
      if (each !== undefined) checkJson(each, where, ancestors);
    }
  }
  ancestors.delete(value);
}
