/**
 * The message protocol between the facade (caller's thread) and the worker. Every request carries an
 * `id`; every event the worker sends back names the request it belongs to.
 *
 * Requests (caller -> worker):
 *   { type: 'load',     id, options }                     options: see LoadOptions (serializable part), checked
 *                                                         by the facade (options.js) before it is posted
 *   { type: 'generate', id, prompt, options }             prompt: raw text, or token ids
 *   { type: 'chat',     id, messages, options }           messages: [{ role, content }]
 *   { type: 'completion', id, kind, body }                an OpenAI completion. kind 'chat': body is a chat
 *                                                         completion request ({ messages, ... }); 'text': a
 *                                                         completion request ({ prompt, ... }). body keeps
 *                                                         OpenAI's names and crosses to Python unrenamed
 *                                                         (JSON schemas in it may hold any key)
 *   { type: 'tokenize', id, prompt | messages }           token ids of raw text, or of a rendered chat
 *   { type: 'cache_stats', id }                           positions and bytes of the KV cache per tier
 *   { type: 'device_stats', id }                          where the plan runs, and on a GPU its work so far
 *   { type: 'adapt', id, feedback }                       feedback: { prompt | messages, completion, reward,
 *                                                         adapter, steps, lr, untilGreedy }; the first step at
 *                                                         once, the others in idle time ('learning' events)
 *   { type: 'adapters', id }                              the adapters held, their versions, lessons waiting
 *   { type: 'new_adapter', id, config }                   config: { name, rank, alpha, targets, layers }
 *   { type: 'mix_adapters', id, config }                  config: { name, experts, topK, depth, size, layerwise,
 *                                                         temperature }: an X-LoRA mixture of held adapters
 *   { type: 'load_adapter', id, url, name }               an adapter folder (ours or Hugging Face PEFT), or an
 *                                                         X-LoRA mixture (its experts in subfolders)
 *   { type: 'set_adapter', id, name }                     name, or null for the base model
 *   { type: 'save_adapter', id, name }                    the adapter's files
 *   { type: 'abort',    id }                              id of the generate/chat/completion request to stop,
 *                                                         of the adapt request whose lesson to cancel, or of
 *                                                         the load to stop (its downloads end, their partial
 *                                                         copies are removed, then it answers an abort error)
 *   { type: 'dispose',  id }
 * (bridge-schema.js WORKER_REQUESTS lists them and their fields: the worker refuses any other type.)
 *
 * Events (worker -> caller):
 *   { type: 'progress', id, progress }                    download/load progress of a 'load' request
 *   { type: 'loaded',   id, info }                        the model is ready
 *   { type: 'chunk',    id, chunk }                       generate/chat: one generated token: { text, tokenId,
 *                                                         finishReason, stats }; completion with body.stream:
 *                                                         one OpenAI stream chunk (chat.completion.chunk or
 *                                                         text_completion), as Python made it
 *   { type: 'result',   id, result }                      the answer to 'tokenize', the stats or an adapter
 *                                                         request; for 'completion' the whole OpenAI answer
 *                                                         (chat.completion or text_completion), streamed or not
 *   { type: 'learning', id, progress }                    adapt: { key, phase, step, steps, rehearsed, version,
 *                                                         done, applied, cancelled, outcome, elapsedMs,
 *                                                         prepared, ahead, note, report } after each slice
 *                                                         (py_src/ruvllm/bridge.py says what each means)
 *   { type: 'done',     id }                              a request finished (after its last chunk)
 *   { type: 'error',    id, error: { type, message } }    a request failed; type 'abort' for aborts
 */

import { WORKER_REQUESTS, pythonNames } from './bridge-schema.js';

/** The request types the worker answers (bridge-schema.js lists them with their fields). */
export const REQUESTS = Object.freeze(Object.keys(WORKER_REQUESTS));

/**
 * The worker speaks to Python (py_src/ruvllm/bridge.py) in JSON with Python's names; callers use
 * JavaScript's. Every name that differs is in this table, made from the shapes of bridge-schema.js (each
 * field with an underscore, as camelCase): toPython / fromPython rename an object's keys (nested objects
 * too) on each crossing. JSON is also what turns JS null into Python None.
 * OpenAI's bodies and answers ('completion') never go through this table: they have the same (OpenAI's)
 * names on both sides, and a user's JSON schema may name a property anything, `maxTokens` included.
 */
export const PYTHON_NAMES = Object.freeze(pythonNames());

const JS_NAMES = Object.freeze(Object.fromEntries(Object.entries(PYTHON_NAMES).map(([js, py]) => [py, js])));

/** What computes the matrix products (`kernels` in RuvLLM.load; src/worker/kernels.js). */
export const KERNEL_CHOICES = Object.freeze(['auto', 'wasm', 'numpy']);
/** Where the decode plan may run (LoadOptions.device; py_src/ruvllm/runtime/device.py DEVICE_CHOICES). */
export const DEVICE_CHOICES = Object.freeze(['auto', 'webgpu', 'cpu']);
/** The most threads that compute the matrix products (`threads` in RuvLLM.load; src/worker/pool.js). */
export const MAX_THREADS = 64;
/** How the WebAssembly kernels multiply quantized weights (`arithmetic` in RuvLLM.load). */
export const ARITHMETIC = Object.freeze(['exact', 'fast']);

function renamed(value, names) {
  if (Array.isArray(value)) return value.map((v) => renamed(v, names));
  if (value === null || typeof value !== 'object' || ArrayBuffer.isView(value)) return value;
  return Object.fromEntries(
    Object.entries(value)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => [names[k] ?? k, renamed(v, names)]),
  );
}

/** `value` with Python's names (undefined members left out: Python takes its defaults). */
export const toPython = (value) => renamed(value, PYTHON_NAMES);

/** `value` with JavaScript's names. */
export const fromPython = (value) => renamed(value, JS_NAMES);

let nextId = 1;

/** A new request id, unique within this thread. */
export function newId() {
  return nextId++;
}

/** Throws if `message` is not a well-formed request (the worker refuses anything else). */
export function checkRequest(message) {
  if (!message || typeof message !== 'object' || !REQUESTS.includes(message.type)) {
    throw new TypeError(`unknown request type ${JSON.stringify(message?.type)}`);
  }
  if (!Number.isInteger(message.id)) throw new TypeError(`request ${message.type} has no integer id`);
  return message;
}
