/**
 * @ruvector/ruvllm: a small language model engine in NumPy, running in Pyodide inside a worker.
 *
 *   import { RuvLLM } from '@ruvector/ruvllm';
 *   const llm = await RuvLLM.load({ model: 'https://host/models/smollm2/', onProgress: (p) => {} });
 *   for await (const c of llm.generate('Once upon a time', { maxTokens: 64, temperature: 0 })) {
 *     process.stdout.write(c.text);
 *   }
 *   await llm.dispose();
 *
 * OpenAI's shapes, with OpenAI's names (the Python bridge checks and answers them):
 *
 *   const answer = await llm.chat.completions.create({ messages, max_tokens: 64, temperature: 0 });
 *   for await (const c of await llm.chat.completions.create({ messages, stream: true })) ...
 *   const text = await llm.completions.create({ prompt: 'Once upon a time', max_tokens: 16 });
 */

import { AbortError, RuvLLMError, deserializeError } from './errors.js';
import { newId } from './protocol.js';
import { IS_NODE } from './env.js';
import { resolveModel } from './hub.js';
import {
  ADAPT_OPTIONS,
  ADAPTER_CONFIG,
  ADAPTER_NAME,
  ADAPTER_URL,
  EXPERTS,
  FEEDBACK,
  LOAD_ADAPTER_OPTIONS,
  LOAD_OPTIONS,
  MESSAGES,
  MIX_OPTIONS,
  NULLABLE_ADAPTER_NAME,
  PROMPT,
  REQUEST_OPTIONS,
  check,
  checkJson,
  checkTable,
  describe as describeValue,
  generationOptions,
  required,
} from './options.js';

export { AbortError, RuvLLMError } from './errors.js';

/** A worker with one interface in Node and browsers: post(message), onEvent(fn), onFailure(fn), terminate(). */
async function spawnWorker() {
  const url = new URL('./worker/main.js', import.meta.url);
  if (IS_NODE) {
    const { Worker } = await import('node:worker_threads');
    const worker = new Worker(url);
    return {
      post: (m) => worker.postMessage(m),
      onEvent: (fn) => worker.on('message', fn),
      onFailure: (fn) => {
        worker.on('error', (/** @type {Error} */ e) => fn(e.message));
        worker.on('exit', (code) => fn(`exited with code ${code}`));
      },
      setActive: (active) => (active ? worker.ref() : worker.unref()),
      terminate: () => worker.terminate(),
    };
  }
  const worker = new Worker(url, { type: 'module' });
  return {
    post: (m) => worker.postMessage(m),
    onEvent: (fn) => worker.addEventListener('message', (e) => fn(e.data)),
    onFailure: (fn) => worker.addEventListener('error', (e) => fn(e.message || 'worker error')),
    setActive: () => {},
    terminate: () => worker.terminate(),
  };
}

/** Events for one request, consumed in order. */
class EventQueue {
  #items = [];
  /** @type {((event: any) => void) | null} */
  #waiting = null;

  push(event) {
    if (this.#waiting) {
      const resolve = this.#waiting;
      this.#waiting = null;
      resolve(event);
    } else {
      this.#items.push(event);
    }
  }

  next() {
    if (this.#items.length) return Promise.resolve(this.#items.shift());
    return new Promise((resolve) => {
      this.#waiting = resolve;
    });
  }
}

/**
 * How long an aborted load waits for the worker to stop its downloads and remove their partial copies
 * before the worker is terminated anyway (it may be inside a long synchronous step: Pyodide's boot).
 */
const ABORT_GRACE_MS = 1000;
// How long dispose() waits for the worker to free the model (after aborting what ran) before it ends it.
const DISPOSE_GRACE_MS = 5000;

/** Every load option checked (options.js), and what the table cannot say: a malformed hub name, kv. */
function checkLoadOptions(options) {
  checkTable(LOAD_OPTIONS, options, 'options', 'RuvLLM.load');
  resolveModel(options.model, { hfEndpoint: options.hfEndpoint }); // a malformed hub name fails here
  if (options.kv?.budgetBytes !== undefined && options.kv.hotTokens === undefined) {
    throw new RuvLLMError(
      'invalid_argument',
      'options.kv.budgetBytes needs options.kv.hotTokens: only positions older than the hot ones can be dropped',
    );
  }
}

export class RuvLLM {
  #worker;
  #queues = new Map();
  /** @type {Error | null} */
  #failed = null;
  #unbounded = false; // a KV budget drops old positions: a sequence may then outgrow the context length

  /**
   * What the worker reported once the model was ready (architecture, contextLength, heapBytes, ...):
   * set by load before the model is handed out.
   * @type {import('../types/index.d.ts').ModelInfo}
   */
  info;

  /**
   * Stream the assistant's reply to a conversation, rendered with the model's chat template:
   * `llm.chat(messages, options)`. Also `llm.chat.completions.create(body, { signal })`: an OpenAI chat
   * completion (see #complete).
   * @type {import('../types/index.d.ts').Chat}
   */
  chat = Object.assign((messages, options = {}) => this.#chat(messages, options), {
    completions: { create: (body, options) => this.#complete('chat', body, options) },
  });

  /**
   * OpenAI (text) completions of raw text: `llm.completions.create({ prompt, ... }, { signal })`.
   * @type {import('../types/index.d.ts').Completions}
   */
  completions = { create: (body, options) => this.#complete('text', body, options) };

  constructor(worker) {
    this.#worker = worker;
    worker.onEvent((event) => this.#queues.get(event.id)?.push(event));
    worker.onFailure((reason) => {
      this.#failed ??= new RuvLLMError('inference', `the ruvllm worker stopped: ${reason}`);
      for (const queue of this.#queues.values())
        queue.push({ type: 'error', error: { type: 'inference', message: this.#failed.message } });
    });
  }

  /**
   * Start a worker, boot Pyodide and load a model.
   * @param {import('../types/index.d.ts').LoadOptions} options
   * @returns {Promise<RuvLLM>}
   */
  static async load(options) {
    checkLoadOptions(options);
    const { signal, onProgress, ...rest } = resolveLocations(options);
    if (signal?.aborted) throw new AbortError('loading aborted');
    const llm = new RuvLLM(await spawnWorker());
    const id = newId();
    try {
      for await (const event of llm.#request({ type: 'load', options: rest }, signal, 'loading aborted', id)) {
        if (event.type === 'progress') onProgress?.(event.progress);
        else if (event.type === 'loaded') llm.info = event.info;
      }
    } catch (error) {
      // An abort: the worker stops its downloads and removes their partial copies, then answers; a
      // worker busy in a long synchronous step is terminated after a grace time.
      if (error instanceof AbortError) await llm.#settled(id, ABORT_GRACE_MS);
      llm.#failed ??= error;
      await llm.#worker.terminate();
      throw error;
    }
    llm.#unbounded = options.kv?.budgetBytes !== undefined;
    return llm;
  }

  /**
   * Resolves once the worker has answered request `id` (its error or done), or after `ms`.
   * @returns {Promise<void>}
   */
  #settled(id, ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.#queues.set(id, {
        push: (event) => {
          if (event.type !== 'error' && event.type !== 'done') return;
          clearTimeout(timer);
          this.#queues.delete(id);
          resolve();
        },
      });
    });
  }

  /**
   * Stream the continuation of raw text (or of token ids), one chunk per generated token.
   * @param {string | number[]} prompt
   * @param {import('../types/index.d.ts').GenerateOptions} [options]
   * @returns {AsyncIterable<import('../types/index.d.ts').Chunk>}
   */
  generate(prompt, options = {}) {
    check(required(PROMPT), prompt, 'prompt');
    const positions = this.#positions();
    if (Array.isArray(prompt) && prompt.length > positions) {
      throw new RuvLLMError(
        'context_full',
        `the prompt has ${prompt.length} tokens but the context window is ${positions}`,
      );
    }
    return this.#stream({ type: 'generate', prompt }, this.#generationOptions(options, 'generate'));
  }

  /** `llm.chat(messages, options)`: see the `chat` field above. */
  #chat(messages, options) {
    checkMessages(messages);
    return this.#stream({ type: 'chat', messages }, this.#generationOptions(options, 'chat'));
  }

  /** The options of generate/chat, checked: maxTokens at most the context length (when it bounds). */
  #generationOptions(options, what) {
    return checkTable(generationOptions(this.#positions()), options, 'options', what);
  }

  /** Positions one sequence may have: the context length, unless a KV budget lifts the bound. */
  #positions() {
    return this.#unbounded ? Infinity : (this.info?.contextLength ?? Infinity);
  }

  /**
   * Token ids of raw text, or of a conversation rendered with the chat template (what generate/chat feed the model).
   * @param {string | {role: string, content: string}[]} input
   * @returns {Promise<number[]>}
   */
  async tokenize(input) {
    if (Array.isArray(input)) return this.#answer({ type: 'tokenize', messages: checkMessages(input, 'input') });
    if (typeof input !== 'string') {
      throw new RuvLLMError(
        'invalid_argument',
        `input must be a string (raw text) or an array of { role, content } messages, got ${describeValue(input)}`,
      );
    }
    return this.#answer({ type: 'tokenize', prompt: input });
  }

  /**
   * Positions and bytes of the KV cache per tier (hot float32, cold int8/int4), and how many were dropped.
   * @returns {Promise<import('../types/index.d.ts').CacheStats>}
   */
  cacheStats() {
    return this.#answer({ type: 'cache_stats' });
  }

  /**
   * Where the decode plan runs, and on a GPU the work so far: plan calls (a forward each), submits,
   * dispatches, bytes read back and written, and the GPU memory held (weights, cache, buffers).
   * @returns {Promise<import('../types/index.d.ts').DeviceStats>}
   */
  deviceStats() {
    return this.#answer({ type: 'device_stats' });
  }

  // --- MicroLoRA ---------------------------------------------------------------------------

  /**
   * Learn from feedback: make `completion` likelier (reward > 0) or less likely (< 0) after a prompt
   * (raw text) or a conversation (messages, rendered with the chat template). Makes the adapter (the
   * default config) if none has that name yet, and leaves it active.
   *
   * The first step is taken at once (the next answer already differs); the others run in the worker's
   * idle time, a slice at a time, so generation requests made meanwhile start within one slice and
   * learning resumes after them. `onProgress({ phase, step, steps, elapsedMs, prepared, outcome, ... })`
   * follows every slice (LearningProgress says what each means); the promise resolves with the report
   * when the lesson is done. Aborting `signal` cancels the rest of the lesson (the steps taken stay)
   * and rejects with an AbortError; a lesson whose adapter is replaced meanwhile rejects with a
   * RuvLLMError saying so.
   * @param {import('../types/index.d.ts').Feedback} feedback
   * @param {import('../types/index.d.ts').AdaptOptions} [options]
   * @returns {Promise<import('../types/index.d.ts').AdaptReport>}
   */
  async adapt(feedback, options = {}) {
    checkTable(FEEDBACK, feedback, 'feedback', 'adapt');
    if ((feedback.prompt === undefined) === (feedback.messages === undefined)) {
      throw new RuvLLMError(
        'invalid_argument',
        'feedback needs either prompt (raw text) or messages (a conversation) before its completion, ' +
          `got ${feedback.prompt === undefined ? 'neither' : 'both'}`,
      );
    }
    const { signal, onProgress } = checkTable(ADAPT_OPTIONS, options, 'options', 'adapt');
    if (signal?.aborted) throw new AbortError('learning cancelled');
    /** @type {{ result: import('../types/index.d.ts').AdaptReport } | null} */
    let answer = null;
    for await (const event of this.#request({ type: 'adapt', feedback }, signal, 'learning cancelled')) {
      if (event.type === 'learning') {
        const { key: _, report: __, cancelled: ___, note: ____, ...progress } = event.progress;
        onProgress?.(progress);
      } else if (event.type === 'result') answer = event;
    }
    return resultOf(answer, 'adapt');
  }

  /**
   * The adapters held, the active one, each one's version (bumped by every learning step) and how many
   * lessons are waiting to be learned.
   * @returns {Promise<import('../types/index.d.ts').AdapterList>}
   */
  adapters() {
    return this.#answer({ type: 'adapters' });
  }

  /**
   * A fresh adapter ({ name, rank, alpha, targets, layers }), made active.
   * @param {import('../types/index.d.ts').AdapterConfig} [config]
   * @returns {Promise<{ name: string, rank: number, targets: string[], layers: number[] | null }>}
   */
  newAdapter(config = {}) {
    return this.#answer({ type: 'new_adapter', config: checkTable(ADAPTER_CONFIG, config, 'config', 'newAdapter') });
  }

  /**
   * An X-LoRA mixture of held adapters (copies of them as they are now), routed per token by a new
   * router that weighs them evenly at first; made active. `adapt` with `adapter: name` teaches its
   * router which expert each text needs.
   * @param {string} name
   * @param {string[]} experts the names of held adapters
   * @param {import('../types/index.d.ts').MixOptions} [options]
   * @returns {Promise<{ name: string, experts: string[], topK: number | null }>}
   */
  mixAdapters(name, experts, options = {}) {
    check(required(ADAPTER_NAME), name, 'name');
    check(required(EXPERTS), experts, 'experts');
    checkTable(MIX_OPTIONS, options, 'options', 'mixAdapters');
    return this.#answer({ type: 'mix_adapters', config: { ...options, name, experts } });
  }

  /**
   * Load an adapter folder by URL (in Node also a path): adapter_config.json + adapter_model.safetensors;
   * an X-LoRA mixture (PEFT's layout) with its experts in subfolders named after them.
   * @param {string} url
   * @param {{ name?: string }} [options]
   * @returns {Promise<string>} the name it is held under
   */
  loadAdapter(url, options = {}) {
    check(required(ADAPTER_URL), url, 'url');
    const { name } = checkTable(LOAD_ADAPTER_OPTIONS, options, 'options', 'loadAdapter');
    const resolved = IS_NODE || typeof location === 'undefined' ? url : new URL(url, location.href).href;
    return this.#answer({
      type: 'load_adapter',
      url: resolved,
      name: name ?? resolved.replace(/\/+$/, '').split('/').pop(),
    });
  }

  /**
   * Compute with adapter `name` from now on; null for the base model.
   * @param {string | null} name
   * @returns {Promise<string | null>}
   */
  setAdapter(name) {
    check(NULLABLE_ADAPTER_NAME, name, 'name');
    return this.#answer({ type: 'set_adapter', name: name ?? null });
  }

  /**
   * The files of an adapter (default: the active one), to download or store.
   * @param {string} [name]
   * @returns {Promise<Record<string, Uint8Array>>}
   */
  saveAdapter(name) {
    check(ADAPTER_NAME, name, 'name');
    return this.#answer({ type: 'save_adapter', name });
  }

  /**
   * The one answer of a request that streams nothing (tokenize, cacheStats, the adapter requests): the
   * shape its caller declares (types/index.d.ts), which the worker answers.
   * @template T
   * @returns {Promise<T>}
   */
  async #answer(request) {
    /** @type {{ result: T } | null} */
    let answer = null;
    for await (const event of this.#request(request)) if (event.type === 'result') answer = event;
    return resultOf(answer, request.type);
  }

  /**
   * Free the model and stop the worker. What is under way stops first, as an abort stops it: a
   * generation at its next token (its stream rejects with an AbortError), a lesson at its next slice.
   */
  async dispose() {
    if (!this.#failed) {
      for (const [id, queue] of this.#queues) {
        this.#worker.post({ type: 'abort', id });
        queue.push({ type: 'error', error: { type: 'abort', message: 'aborted: the model was disposed' } });
      }
      const id = newId();
      const settled = this.#settled(id, DISPOSE_GRACE_MS); // a worker stuck in a long step is terminated
      try {
        this.#send({ type: 'dispose', id });
        await settled;
      } catch {
        // The worker is going away either way.
      }
    }
    this.#failed ??= new RuvLLMError('inference', 'this model was disposed');
    await this.#worker.terminate();
  }

  /**
   * An OpenAI completion (kind 'chat': a chat completion; 'text': a completion of raw text). Resolves to
   * the answer object, or with `body.stream` to an AsyncIterable of OpenAI stream chunks; that promise
   * settles with the first chunk, so a refused body or an abort before it rejects it. (Its shape depends
   * on kind and body.stream: the create overloads of types/index.d.ts say which.)
   * @returns {Promise<any>}
   */
  async #complete(kind, body, options = {}) {
    const request = { type: 'completion', kind, body: checkBody(kind, body) };
    const { signal } = checkTable(REQUEST_OPTIONS, options, 'options', methodOf(kind));
    if (signal?.aborted) throw new AbortError('generation aborted');
    const events = this.#request(request, signal);
    if (request.body.stream !== true) {
      let answer = null;
      for await (const event of events) if (event.type === 'result') answer = event;
      return resultOf(answer, 'completion');
    }
    const chunks = (async function* () {
      for await (const event of events) if (event.type === 'chunk') yield event.chunk;
    })();
    const first = await chunks.next();
    return (async function* () {
      if (first.done) return;
      yield first.value;
      yield* chunks;
    })();
  }

  async *#stream(request, { signal, ...options }) {
    if (signal?.aborted) throw new AbortError('generation aborted');
    for await (const event of this.#request({ ...request, options }, signal)) {
      if (event.type === 'chunk') yield event.chunk;
    }
  }

  /**
   * Post `message` to the worker. The options were checked, so every value can be cloned; should one
   * still not be (a bug), the caller gets a typed error, not a DataCloneError.
   */
  #send(message) {
    try {
      this.#worker.post(message);
    } catch (error) {
      throw new RuvLLMError(
        'invalid_argument',
        `the ${message.type} request cannot be sent to the worker: ${error.message}`,
      );
    }
  }

  /** Send one request and yield its events until 'done' (returns) or 'error' (throws). */
  async *#request(request, signal, aborted = 'generation aborted', id = newId()) {
    if (this.#failed) throw this.#failed;
    const queue = new EventQueue();
    this.#queues.set(id, queue);
    this.#worker.setActive(true);
    let finished = false;
    const onAbort = () => {
      this.#worker.post({ type: 'abort', id });
      queue.push({ type: 'error', error: { type: 'abort', message: aborted } });
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    let sent = false; // a request that could not be posted has nothing to abort in the worker
    try {
      this.#send({ ...request, id });
      sent = true;
      for (;;) {
        const event = await queue.next();
        if (event.type === 'done') {
          finished = true;
          return;
        }
        if (event.type === 'error') {
          finished = true;
          throw deserializeError(event.error);
        }
        yield event;
      }
    } finally {
      signal?.removeEventListener('abort', onAbort);
      if (sent && !finished && !this.#failed) this.#worker.post({ type: 'abort', id }); // the caller stopped iterating
      this.#queues.delete(id);
      if (this.#queues.size === 0) this.#worker.setActive(false);
    }
  }
}

/**
 * The result of a request the worker finished: one it finished without answering is a bug in the
 * worker, said as such rather than handed on as null.
 * @template T
 * @param {{ result: T } | null} answer
 * @param {string} type the request's type
 * @returns {T}
 */
function resultOf(answer, type) {
  if (answer === null) throw new RuvLLMError('inference', `the worker finished a ${type} request without its result`);
  return answer.result;
}

/** In browsers, relative URLs mean relative to the page; the worker lives elsewhere, so resolve them here. */
function resolveLocations(options) {
  if (IS_NODE || typeof location === 'undefined' || options.model.startsWith('hf:')) return options;
  const resolved = { ...options, model: new URL(options.model, location.href).href };
  if (options.pyodide?.indexURL)
    resolved.pyodide = { ...options.pyodide, indexURL: new URL(options.pyodide.indexURL, location.href).href };
  return resolved;
}

const methodOf = (kind) => (kind === 'chat' ? 'chat.completions.create' : 'completions.create');

/**
 * An OpenAI request body as the worker gets it: a copy with JSON's values only (JSON is what reaches
 * Python), refused if JSON would change it (NaN becoming null). Only its prompt is required here, so the
 * call says what it needs; Python checks every field, by the server's rule.
 */
function checkBody(kind, body) {
  const method = methodOf(kind);
  const field = kind === 'chat' ? 'messages' : 'prompt';
  if (body === null || typeof body !== 'object' || Array.isArray(body) || body[field] === undefined)
    throw new RuvLLMError(
      'invalid_argument',
      `${method} needs a request body: an object with ${field}, got ${describeValue(body)}`,
    );
  checkJson(body, 'body');
  return JSON.parse(JSON.stringify(body));
}

function checkMessages(messages, path = 'messages') {
  check(required(MESSAGES), messages, path);
  return messages;
}
