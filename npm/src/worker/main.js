/**
 * The worker: owns Pyodide, the loaded model and the text tools, and answers the requests of
 * protocol.js, one handler per request type. It runs as a module Web Worker in browsers and as a
 * worker_threads Worker in Node.
 *
 * Generation advances the Python generator one token (or one prompt chunk, of 32 positions in Pyodide)
 * per call and yields to the event loop between calls, so an abort request is honoured before the next
 * token, also while a long prompt is read.
 */

import { IS_NODE } from '../env.js';
import { AbortError, RuvLLMError, serializeError, unwrap } from '../errors.js';
import { FOLDER_FILES } from '../bridge-schema.js';
import { checkRequest } from '../protocol.js';
import { createText } from '../text/index.js';
import { MAX_CHARS } from '../text/chat-template.js';
import { parseJson, readBytes, readText } from './files.js';
import { startThreads } from './threads.js';
import { startGpu } from './gpu/client.js';
import { callBridge, heapBytes, startPython } from './python.js';
import { feedLoader } from './weights.js';
import { cacheRoot } from './cache-folder.js';
import { recordHubFolder } from './hub-folder.js';
import { hubLocation, modelName, resolveModel } from '../hub.js';

/**
 * The worker's end of its channel: Node's parentPort, or in browsers the worker's global scope (which
 * the DOM library types as a Window: hence `any`).
 * @type {{ postMessage(message: unknown, transfer?: Transferable[]): void,
 *   on?: (type: 'message', listener: (data: unknown) => void) => void,
 *   addEventListener?: (type: 'message', listener: (event: MessageEvent) => void) => void }}
 */
const port = IS_NODE ? (await import('node:worker_threads')).parentPort : /** @type {any} */ (globalThis);
/** @type {(message: object, transfer?: Transferable[]) => void} */
const send = (message, transfer = []) => port.postMessage(message, transfer);

/**
 * @type {{ py: import('pyodide').PyodideInterface | null, engine: import('pyodide/ffi').PyProxy | null,
 *   text: ReturnType<typeof createText> | null, model: string | null, aborted: Set<unknown>,
 *   loading: { id: unknown, controller: AbortController } | null,
 *   pool: import('./pool.js').KernelPool | null, positions: number | null, contextLength: number | null,
 *   gpu: { api: any, dispose: () => Promise<unknown> } | null, device: string }}
 */
const state = {
  py: null,
  engine: null, // ruvllm.bridge.EngineHandle (PyProxy)
  text: null,
  model: null, // the model's name in OpenAI answers
  aborted: new Set(), // ids of generate/chat/completion requests asked to stop
  loading: null, // the load under way: { id, controller } (an abort of `id` aborts `controller`)
  pool: null, // the kernel thread pool (threads.js), when more than one thread computes
  positions: null, // positions a generated sequence may have (the context length); null: no bound (KV budget)
  contextLength: null, // positions a lesson (prompt and completion) may have
  gpu: null, // the GPU's thread (gpu/client.js), when the load started one
  device: 'cpu', // where the plan runs (info.device.path)
};

/** The loaded model's engine and text side: every request but load and dispose needs them (see handle). */
function loaded() {
  const { engine, text } = state;
  if (engine === null || text === null) throw new RuvLLMError('inference', 'the model is not loaded');
  return { engine, text };
}

/**
 * Let pending messages (an abort) run before the next token. Browsers: a message to ourselves, a task
 * queued behind them (no 4 ms timer clamping). Node processes up to 1000 messages of one port in a row,
 * so a self-message loop there would starve the parent port until the generation ends: setImmediate
 * runs after the event loop has polled it.
 */
let yieldToEventLoop;
if (IS_NODE) {
  yieldToEventLoop = () => new Promise((resolve) => setImmediate(resolve));
} else {
  // Several may wait at once (a generation and the learning loop): each message wakes the first waiter.
  const tick = new MessageChannel();
  const waiting = [];
  tick.port1.onmessage = () => waiting.shift()();
  yieldToEventLoop = () =>
    new Promise((resolve) => {
      waiting.push(resolve);
      tick.port2.postMessage(null);
    });
}

/**
 * Load a model. Its downloads stop when the caller aborts (an 'abort' request with this id) or when the
 * server sends nothing for options.stallTimeoutMs; either way their partial copies are removed before
 * the error is answered.
 */
async function load({ id, options }) {
  const controller = new AbortController();
  state.loading = { id, controller };
  try {
    await loadModel(id, options, controller.signal);
  } finally {
    state.loading = null;
  }
}

async function loadModel(id, options, signal) {
  const progress = (p) => send({ type: 'progress', id, progress: p });
  // an hf: name's files are kept in the cache root's hub folder, where CPython's `ruvllm download` keeps them
  const location = hubLocation(options.model);
  const hub = { hfEndpoint: options.hfEndpoint, hfToken: options.hfToken, location };
  const files = { cache: options.cache !== false, stallTimeoutMs: options.stallTimeoutMs, signal, hub };
  const { url, kind } = resolveModel(options.model, { hfEndpoint: options.hfEndpoint });
  // the environment's cache root read before anything else: a retired $RUVLLM_MODELS_DIR fails at once
  if (IS_NODE && (files.cache || options.bootCache)) await cacheRoot();
  const chatTemplate = options.chatTemplate ?? null;
  state.model = modelName(options.model);
  // A folder's first file, its config, read before Pyodide boots: a wrong model location fails in
  // milliseconds. A GGUF's header holds its config: Python reads it, after the boot.
  const { config, tokenizer, tokenizerConfig, generationConfig } = FOLDER_FILES;
  /** @type {Record<string, Uint8Array | null>} */
  const prefetched = kind === 'folder' ? { [config]: await readBytes(url, config, files) } : {};
  const { base, name } = kind === 'folder' ? { base: url, name: null } : splitLocation(url);
  await withLoader(id, options, progress, signal, name, async (loader, onPlan) => {
    const onDocuments = (documents) => {
      // the text layer's own copy of each document (Python parses the bytes it was given for itself)
      const json = (file) => (documents[file] ? parseJson(documents[file], file) : {});
      const header = name === null ? null : callBridge(loader, 'gguf_documents');
      state.text = createText({
        tokenizerJson: header?.tokenizer ?? json(tokenizer),
        tokenizerConfig: header?.tokenizer_config ?? json(tokenizerConfig),
        generationConfig: header?.generation_config ?? json(generationConfig),
        config: header?.config ?? json(config),
        chatTemplate,
      });
    };
    const feed = { ...files, prefetched, onDocuments, onPlan, onProgress: progress };
    const read = await feedLoader(loader, base, feed);
    // a hub folder read whole gets hub.py's record of it, so neither runtime asks the hub for it again
    if (IS_NODE && files.cache && location && name === null) await recordHubFolder(location, read.files);
    return read;
  });
}

/**
 * The calibration chat's turns as ids in the model's template (Python's Model._calibration_turns): none
 * without a template, or with one that refuses them (learning then whitens with the raw text alone).
 */
function calibrationTurns(text, pairs) {
  if (!text.chatTemplateText) return [];
  try {
    return pairs.map(([user, answer]) =>
      text.encodeChat(
        [
          { role: 'user', content: user },
          { role: 'assistant', content: answer },
        ],
        { addGenerationPrompt: false },
      ),
    );
  } catch (error) {
    if (error instanceof RuvLLMError) return [];
    throw error;
  }
}

/** Throws an AbortError once the load was aborted (between steps that cannot be interrupted). */
function stopIfAborted(signal) {
  if (signal.aborted) throw new AbortError('loading aborted');
}

/**
 * Boot Pyodide, start the kernels and the threads, run `fill(loader, onPlan)` (it gives the loader the
 * model's files: the GGUF file `gguf`, or a folder's when null), then build.
 */
async function withLoader(id, options, progress, signal, gguf, fill) {
  progress({ phase: 'runtime', loaded: 0, total: 0 });
  stopIfAborted(signal);
  const bootCache = options.bootCache ?? options.cache !== false; // `cache: false` writes nothing at all
  const python = await startPython({ ...options.pyodide, bootCache });
  const py = (state.py = python.py);
  progress({ phase: 'runtime', loaded: 0, total: 0, boot: python.boot });
  stopIfAborted(signal);
  const bridge = py.pyimport('ruvllm.bridge');
  const loader = bridge.new_loader();
  bridge.destroy();
  let done = false;
  try {
    // Python starts the kernels (ruvllm/host.py compiles the wheel's own); the pool loads their shared twin
    const kernels = callBridge(loader, 'start_kernels', options.kernels ?? 'auto');
    const threads = await startThreads(py, kernels, options.threads);
    state.pool = threads.pool;
    if (threads.api) unwrap(loader.offer_kernel_threads(threads.api));
    const gpu = await startGpu(py, options.device ?? 'auto', gpuTesting());
    state.gpu = gpu;
    if (gpu.api) unwrap(loader.offer_gpu(gpu.api));
    callBridge(loader, 'set_options', loadOptions(options), gguf);
    const onPlan = (plan) => progress({ phase: 'plan', plan, loaded: 0, total: 0 });
    const download = await fill(loader, onPlan);
    progress({ phase: 'load', loaded: download.total, total: download.total });
    stopIfAborted(signal);
    const built = callBridge(loader, 'build');
    state.engine = loader.take_engine();
    state.contextLength = built.contextLength;
    state.positions = options.kv?.budgetBytes === undefined ? built.contextLength : null;
    // learning keeps adapters away from what ordinary text and chat use: the calibration text and chat
    // turns (in the model's template), in ids made here
    const calibration = loaded().text.encode(callBridge(state.engine, 'calibration_text'));
    const turns = calibrationTurns(loaded().text, callBridge(state.engine, 'calibration_chat'));
    callBridge(state.engine, 'set_calibration', { ids: calibration, turns });
    // tool calls and results reach a template that does not write them itself as Hermes text (Python)
    callBridge(state.engine, 'set_chat_template', { source: loaded().text.chatTemplateText });
    // the default adapter's projection is made in idle time from now on (learnWhileIdle)
    learning.preparing = callBridge(state.engine, 'prepare_learning').preparing;
    const info = {
      ...built,
      downloadedBytes: download.total,
      fromCache: download.fromCache,
      heapBytes: heapBytes(state.py),
      poolBytes: threads.pool?.bytes ?? 0, // the kernel threads' memory: the home of the weights
      boot: python.boot, // how Python started: from the boot snapshot or afresh, and why
      kernelsNote: kernels.reason, // why 'auto' runs NumPy's kernels, if it does
      relaxedSimd: kernels.relaxed, // host.py took the relaxed SIMD build
      threads: { count: threads.count, reason: threads.reason, adaptive: threads.adaptive }, // why one; 'auto'
      // where the plan runs: Python's report once a GPU was offered (checked against the CPU), else why none was
      device: { path: 'cpu', reason: gpu.reason, check: null, ...built.device, adapter: gpu.adapter },
      chatTemplate: loaded().text.chatTemplateSource, // 'model', 'built-in gemma', 'option' or null (none)
    };
    state.device = info.device.path;
    if (info.device.path !== 'webgpu' && state.gpu?.api) {
      // the check failed ('auto'): the GPU's thread and memory go
      await state.gpu.dispose();
      state.gpu = null;
    }
    send({ type: 'loaded', id, info });
    done = true;
  } finally {
    loader.destroy();
    if (!done) await stopThreads(); // a failed load leaves no thread running
  }
}

/** End the kernel thread pool's threads and the GPU's, if any. */
async function stopThreads() {
  const { pool, gpu } = state;
  state.pool = state.gpu = null;
  await pool?.dispose();
  await gpu?.dispose();
}

/**
 * The tests' hooks of the GPU, in Node only: RUVLLM_GPU_BREAK names a shader whose output is scaled by
 * 1.5 (the check at load must refuse it), RUVLLM_GPU_SOFTWARE=1 lets 'auto' take a software adapter
 * (SwiftShader, the GPU of the machines without one).
 * @returns {{ broken?: string, software?: boolean }}
 */
function gpuTesting() {
  if (!IS_NODE) return {};
  const { RUVLLM_GPU_BREAK: broken, RUVLLM_GPU_SOFTWARE: software } = globalThis.process.env;
  return { broken, software: software === '1' };
}

/** A file URL or path as (the folder it is in, its name): files.js opens files by folder and name. */
function splitLocation(location) {
  const cut = location.lastIndexOf('/');
  if (cut < 0) return { base: '.', name: location };
  return { base: location.slice(0, cut + 1), name: location.slice(cut + 1) };
}

/**
 * Load options as Python takes them. Without a memoryBudget, browsers that report their memory
 * (navigator.deviceMemory, in GiB, at most 8) get a quarter of it: compute 'auto' then picks a form
 * that fits; elsewhere there is no budget and 'auto' means float32.
 */
function loadOptions(options) {
  const kv = options.kv ?? {};
  const deviceMemory = /** @type {Navigator & { deviceMemory?: number }} */ (globalThis.navigator)?.deviceMemory;
  const budget =
    options.memoryBudget ?? (IS_NODE || !deviceMemory ? undefined : Math.floor((deviceMemory * 2 ** 30) / 4));
  return {
    contextLength: options.contextLength,
    compute: options.compute ?? 'auto',
    memoryBudget: budget,
    kernels: options.kernels ?? 'auto',
    arithmetic: options.arithmetic,
    plan: options.plan,
    device: options.device ?? 'auto',
    kv,
    sha256: options.sha256 ?? null, // checked by Python as each weight file arrives
  };
}

/**
 * Token ids of a request: a chat (messages), raw text, or ids given as they are.
 * @param {{ messages?: object[], prompt?: string | number[] }} request
 */
function promptIds({ messages, prompt }) {
  if (messages !== undefined) return loaded().text.encodeChat(messages);
  if (Array.isArray(prompt)) return prompt;
  return loaded().text.encode(prompt);
}

/**
 * Token ids of a prompt that is to be computed: one too long for `positions` is refused before it is
 * tokenized, whenever its length alone shows it (tokenizing megabytes takes a minute here).
 */
function fittingIds({ messages, prompt, tools }, positions = state.positions) {
  if (messages === undefined) {
    if (typeof prompt === 'string') requireFit(prompt, 'the prompt', positions);
    return promptIds({ prompt });
  }
  // A message the chat template cannot render (past its size bound) and that could not fit anyway
  for (const [i, message] of messages.entries()) {
    if (typeof message?.content === 'string' && message.content.length > MAX_CHARS)
      requireFit(message.content, `messages[${i}].content`, positions);
  }
  const rendered = loaded().text.applyChatTemplate(messages, { tools });
  requireFit(rendered, 'the prompt', positions);
  return loaded().text.encodeRendered(rendered);
}

/**
 * An error (context_full by default) if `text` has more tokens than `positions` (null: no bound), by its length.
 * @param {string} text
 * @param {string} what
 * @param {number | null} positions
 * @param {import('../errors.js').RuvLLMErrorType} [type]
 */
function requireFit(text, what, positions, type = 'context_full') {
  if (positions === null) return;
  const least = loaded().text.moreTokensThan(text, positions);
  if (least === null) return;
  const n = (x) => x.toLocaleString('en');
  throw new RuvLLMError(
    type,
    `${what} has ${n(text.length)} characters, at least ${n(least)} tokens with this tokenizer: ` +
      `more than the context window of ${n(positions)}`,
  );
}

async function generate(message) {
  const { id } = message;
  const { adapter, ...options } = message.options ?? {};
  const ids = fittingIds(message);
  if (adapter !== undefined) callBridge(state.engine, 'set_adapter', { name: adapter }); // null: the base model
  callBridge(state.engine, 'start', { promptIds: ids, eosIds: loaded().text.eosIds, options });
  for await (const step of steps(id)) send({ type: 'chunk', id, chunk: step });
}

/**
 * An OpenAI completion. Python checks the body and says what to tokenize, JavaScript tokenizes it (the
 * chat template runs here), Python generates and shapes the answer. The request JSON is made here and
 * the answers parsed here, not by callBridge, which would rename keys: OpenAI's objects keep their names.
 */
async function completion({ id, kind, body }) {
  const request = (more) => JSON.stringify({ kind, body, ...more });
  const source = JSON.parse(callBridge(state.engine, 'check_completion', request()).source);
  const ids = fittingIds(kind === 'chat' ? source : { prompt: source.prompt });
  const start = { prompt_ids: ids, eos_ids: loaded().text.eosIds, model: state.model };
  callBridge(state.engine, 'start_completion', request(start));
  for await (const step of steps(id)) {
    for (const chunk of JSON.parse(step.events)) send({ type: 'chunk', id, chunk });
    if (step.result !== undefined) send({ type: 'result', id, result: JSON.parse(step.result) });
  }
}

/**
 * The chunks of the generation just started, one per token, until the one with a finish reason. Between
 * two, the event loop runs: an abort of request `id` stops the generation there (an AbortError).
 */
async function* steps(id) {
  for (;;) {
    await yieldToEventLoop();
    if (state.aborted.delete(id)) {
      callBridge(state.engine, 'stop');
      throw new AbortError('generation aborted');
    }
    const step = callBridge(state.engine, 'step');
    if (step === null) return;
    if (step.prefilling) continue; // a long prompt between two forward calls: an abort can come in
    yield step;
    if (step.finishReason !== null) return;
  }
}

/**
 * Learning from feedback. The lesson's first step is taken at once (the instant loop: the next answer
 * already differs), a slice at a time with the event loop turned in between, so its progress goes out
 * and a cancel gets in; requests made meanwhile wait for it, as they would for any request before
 * them. Its other steps run in the worker's idle time, a slice at a time (learnWhileIdle), so a request
 * that comes in then waits at most one slice. The request stays open until the lesson is done
 * ('learning' events on the way, then its report), cancelled (an abort) or dropped (its adapter was
 * replaced: an error that says so).
 */
async function adapt({ id, feedback }) {
  const { prompt, messages, completion, reward = 1, adapter = 'default', ...options } = feedback;
  // each alone must fit the context window (Python bounds the lesson by it), told before tokenizing
  if (prompt !== undefined) requireFit(prompt, 'the prompt', state.contextLength, 'invalid_argument');
  requireFit(completion, 'the completion', state.contextLength, 'invalid_argument');
  const [promptIds, completionIds] = loaded().text.feedbackIds({ prompt, messages, completion });
  const request = { key: id, adapter, promptIds, completionIds, reward, ...options, budgetMs: LEARNING_SLICE_MS };
  let progress = callBridge(state.engine, 'feedback', request);
  learning.lessons.add(id);
  try {
    while (!progress.applied && !progress.done) {
      reportLesson(progress, false);
      await yieldToEventLoop();
      if (!learning.lessons.has(id)) return KEEP_OPEN; // cancelled meanwhile: its request has ended
      progress = callBridge(state.engine, 'first_step', { key: id, budgetMs: LEARNING_SLICE_MS });
    }
  } catch (error) {
    // this request fails with the error; the lesson must not go on in the background
    endLessons(id, null);
    throw error;
  }
  reportLesson(progress, false);
  if (!progress.done) return KEEP_OPEN;
  endLesson(id, null);
  return undefined;
}

/** How long one slice of learning may run before pending requests are looked at (ms). */
const LEARNING_SLICE_MS = 100;
const KEEP_OPEN = Symbol('the request stays open: its answer comes later');
const learning = { lessons: new Set(), running: false, preparing: false };

/**
 * A lesson's progress as a 'learning' event, its report as the 'result' once done. For a lesson that
 * went on in the background (`background`), also the end of its request: 'done'; an abort error when
 * it was cancelled; an error saying why when it was dropped (its adapter was replaced meanwhile).
 */
function reportLesson(progress, background) {
  const id = progress.key;
  send({ type: 'learning', id, progress });
  if (progress.done) send({ type: 'result', id, result: progress.report });
  const ended = progress.done || progress.phase === 'cancelled' || progress.phase === 'dropped';
  if (!background || !ended) return;
  if (progress.done) endLesson(id, 'done');
  else if (progress.phase === 'cancelled') endLesson(id, serializeError(new AbortError('learning cancelled')));
  else endLesson(id, { type: 'inference', message: `learning stopped: ${progress.note}` });
}

/**
 * Lesson `id` leaves the worker (the one way it does): its request ends with `ending`, 'done' or an
 * error to send, or null where the caller answers the request itself.
 */
function endLesson(id, ending) {
  learning.lessons.delete(id);
  if (ending === 'done') send({ type: 'done', id });
  else if (ending) send({ type: 'error', id, error: ending });
}

/** Stop lesson `id` (an abort of its adapt request) now: the worker may be between two tokens. */
function cancelLesson(id) {
  for (const progress of callBridge(state.engine, 'cancel_learning', { key: id }).lessons) reportLesson(progress, true);
}

/** End every lesson under way, each request with `error`. */
function stopLessons(error) {
  if (state.engine) endLessons(null, error);
  for (const id of [...learning.lessons]) endLesson(id, serializeError(error));
}

/**
 * End lesson `id` (null: all) in Python without reporting it as cancelled: its request ends otherwise
 * (`error`, sent to each lesson ended here, or none when the caller answers it). Others are reported.
 */
function endLessons(id, error) {
  let others = [];
  try {
    others = callBridge(state.engine, 'cancel_learning', { key: id }).lessons;
  } catch {
    // the lessons end below either way
  }
  for (const progress of others) {
    if (id === null || progress.key === id) endLesson(progress.key, error ? serializeError(error) : null);
    else reportLesson(progress, true);
  }
}

/**
 * The background loop: while no request is waiting, slices of learning (units of work, each bounded,
 * for about LEARNING_SLICE_MS), with the event loop turned between two so a new request is seen at once. A slice
 * that fails ends the lessons under way with its error (their requests reject); the worker stays.
 */
async function learnWhileIdle() {
  if (learning.running) return;
  learning.running = true;
  try {
    while ((learning.lessons.size || learning.preparing) && pending === 0 && state.engine) {
      const answer = callBridge(state.engine, 'learn', { budgetMs: LEARNING_SLICE_MS });
      learning.preparing = answer.preparing;
      for (const progress of answer.lessons) reportLesson(progress, true);
      await yieldToEventLoop();
    }
  } catch (error) {
    learning.preparing = false;
    stopLessons(error);
  } finally {
    learning.running = false;
  }
}

/**
 * An adapter folder: a LoRA adapter, or an X-LoRA mixture (PEFT's layout) whose experts are the
 * subfolders named in its config (the Hugging Face Hub layout).
 */
async function loadAdapter({ id, url, name }) {
  const files = { cache: false };
  const config = await readText(url, 'adapter_config.json', files);
  const weights = await readBytes(url, 'adapter_model.safetensors', files);
  const experts = xloraExperts(config);
  if (experts) {
    const parts = [];
    for (const expert of experts) {
      parts.push(await readText(url, `${expert}/adapter_config.json`, files));
      parts.push(await readBytes(url, `${expert}/adapter_model.safetensors`, files));
    }
    send({ type: 'result', id, result: callBridge(state.engine, 'load_mixture', { name }, config, weights, ...parts) });
    return;
  }
  const learned = await readBytes(url, 'learning_state.safetensors', { ...files, optional: true });
  send({ type: 'result', id, result: callBridge(state.engine, 'load_adapter', { name }, config, weights, learned) });
}

/** The expert names of an X-LoRA adapter_config.json, or null for any other (Python judges those). */
function xloraExperts(config) {
  let parsed;
  try {
    parsed = JSON.parse(config);
  } catch {
    return null;
  }
  if (parsed?.peft_type !== 'XLORA' || typeof parsed.adapters !== 'object' || parsed.adapters === null) return null;
  const names = Object.keys(parsed.adapters);
  // Each names the subfolder its files are fetched from: one plain name (files/outputs.py's rule), so a
  // crafted config cannot send the requests elsewhere.
  const plain = (name) =>
    name && name !== '.' && name !== '..' && !/[/\\\0]/.test(name) && !/^[A-Za-z]:/.test(name) && name.length <= 255;
  const bad = names.find((name) => !plain(name));
  if (bad !== undefined)
    throw new RuvLLMError(
      'load',
      `adapter_config.json: expert ${JSON.stringify(bad)} is not a plain folder name (no '/', '\\', '..', drive or absolute path): it would be fetched from outside its folder`,
    );
  return names;
}

/** An adapter's files, moved to the caller as ArrayBuffers (transferred, not copied). */
async function saveAdapter({ id, name }) {
  if (state.engine === null) throw new RuvLLMError('inference', 'the model is not loaded'); // (handle checks first)
  callBridge(state.engine, 'adapter_files', { name: name ?? null });
  const proxy = state.engine.take_files();
  const files = proxy.toJs({ dict_converter: Object.fromEntries });
  proxy.destroy();
  send(
    { type: 'result', id, result: files },
    Object.values(files).map((bytes) => bytes.buffer),
  );
}

/**
 * A handler that answers with one bridge call: `args(message)` are its arguments.
 * @param {string} method
 * @param {(message: any) => unknown[]} [args]
 */
const answer =
  (method, args = () => []) =>
  async (message) =>
    send({ type: 'result', id: message.id, result: callBridge(state.engine, method, ...args(message)) });

/** The handler of each request type (protocol.js REQUESTS); all but load and dispose need a model. */
const HANDLERS = {
  load,
  dispose: async () => {
    if (state.engine) stopLessons(new RuvLLMError('inference', 'learning stopped: the model was disposed'));
    state.engine?.destroy();
    state.engine = state.text = state.model = null;
    await stopThreads();
  },
  generate,
  chat: generate,
  completion,
  tokenize: async (message) => send({ type: 'result', id: message.id, result: promptIds(message) }),
  cache_stats: answer('cache_stats'),
  device_stats: async ({ id }) => {
    const gpu = state.gpu?.api ? state.gpu.api.stats() : null;
    const none = { calls: 0, submits: 0, dispatches: 0, readBytes: 0, writtenBytes: 0, weightBytes: 0, gpuBytes: 0 };
    send({ type: 'result', id, result: { path: state.device, ...(gpu ?? none) } });
  },
  adapt,
  adapters: answer('adapter_names'),
  new_adapter: answer('new_adapter', (m) => [m.config ?? {}]),
  mix_adapters: answer('mix_adapters', (m) => [m.config ?? {}]),
  set_adapter: answer('set_adapter', (m) => [{ name: m.name ?? null }]),
  load_adapter: loadAdapter,
  save_adapter: saveAdapter,
};

async function handle(message) {
  const { type, id } = message;
  try {
    if (type !== 'load' && type !== 'dispose' && !state.engine)
      throw new RuvLLMError('inference', 'the model is not loaded');
    if ((await HANDLERS[type](message)) !== KEEP_OPEN) send({ type: 'done', id });
  } catch (error) {
    send({ type: 'error', id, error: serializeError(error) });
  } finally {
    state.aborted.delete(id);
  }
}

// Requests are handled in order, except aborts, which must get through while a generation runs.
// Background learning runs when none is waiting (`pending`: requests received and not yet handled).
let queue = Promise.resolve();
let pending = 0;
const onMessage = (data) => {
  let message;
  try {
    message = checkRequest(data);
  } catch (error) {
    send({ type: 'error', id: data?.id ?? 0, error: { type: 'invalid_argument', message: error.message } });
    return;
  }
  if (message.type === 'abort' && state.loading !== null && state.loading.id === message.id)
    state.loading.controller.abort();
  else if (message.type === 'abort' && learning.lessons.has(message.id)) cancelLesson(message.id);
  else if (message.type === 'abort') state.aborted.add(message.id);
  else {
    pending += 1;
    queue = queue
      .then(() => handle(message))
      .finally(() => {
        pending -= 1;
        if (pending === 0) learnWhileIdle();
      });
  }
};
if (port.on) port.on('message', onMessage);
else port.addEventListener?.('message', (event) => onMessage(event.data));
