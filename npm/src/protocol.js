/**
 * The message protocol between the facade (caller's thread) and the worker. Every request carries an
 * `id`; every event the worker sends back names the request it belongs to.
 *
 * Requests (caller -> worker):
 *   { type: 'load',     id, options }                     options: see LoadOptions (serializable part)
 *   { type: 'generate', id, prompt, options }             prompt: raw text, or token ids
 *   { type: 'chat',     id, messages, options }           messages: [{ role, content }]
 *   { type: 'tokenize', id, prompt | messages }           token ids of raw text, or of a rendered chat
 *   { type: 'cache_stats', id }                           positions and bytes of the KV cache per tier
 *   { type: 'adapt', id, feedback }                       feedback: { prompt | messages, completion, reward, adapter, steps, lr }
 *   { type: 'new_adapter', id, config }                   config: { name, rank, alpha, targets }
 *   { type: 'load_adapter', id, url, name }               an adapter folder (ours or Hugging Face PEFT)
 *   { type: 'set_adapter', id, name }                     name, or null for the base model
 *   { type: 'save_adapter', id, name }                    the adapter's files
 *   { type: 'abort',    id }                              id of the generate/chat request to stop
 *   { type: 'dispose',  id }
 *
 * Events (worker -> caller):
 *   { type: 'progress', id, progress }                    download/load progress of a 'load' request
 *   { type: 'loaded',   id, info }                        the model is ready
 *   { type: 'chunk',    id, chunk }                       one generated token: { text, tokenId, finishReason, stats }
 *   { type: 'result',   id, result }                      the answer to 'tokenize', 'cache_stats' or an adapter request
 *   { type: 'done',     id }                              a request finished (after its last chunk)
 *   { type: 'error',    id, error: { type, message } }    a request failed; type 'abort' for aborts
 */

export const REQUESTS = Object.freeze([
  'load', 'generate', 'chat', 'tokenize', 'cache_stats', 'abort', 'dispose',
  'adapt', 'new_adapter', 'load_adapter', 'set_adapter', 'save_adapter',
]);

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
