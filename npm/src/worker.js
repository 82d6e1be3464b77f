/**
 * The worker: owns Pyodide, the loaded model and the text tools, and answers the requests of
 * protocol.js. It runs as a module Web Worker in browsers and as a worker_threads Worker in Node.
 *
 * Generation advances the Python generator one token (or one prompt chunk, of 32 positions in Pyodide)
 * per call and yields to the event loop between calls, so an abort request is honoured before the next
 * token, also while a long prompt is read.
 */

import { AbortError, RuvLLMError, serializeError, unwrap } from './errors.js';
import { readBytes, readJson, readText } from './files.js';
import { checkRequest } from './protocol.js';
import { startPython } from './runtime.js';
import { createText } from './text.js';
import { loadWeights } from './weights.js';
import { IS_NODE } from './env.js';


const port = IS_NODE ? (await import('node:worker_threads')).parentPort : globalThis;
const send = (message) => port.postMessage(message);

const state = {
  py: null,
  loader: null, // ruvllm.bridge.ModelLoader (PyProxy)
  engine: null, // ruvllm.bridge.EngineHandle (PyProxy)
  text: null,
  aborted: new Set(), // ids of generate/chat requests asked to stop
};

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
  const tick = new MessageChannel();
  let afterTick = null;
  tick.port1.onmessage = () => afterTick();
  yieldToEventLoop = () =>
    new Promise((resolve) => {
      afterTick = resolve;
      tick.port2.postMessage(null);
    });
}

async function load(id, options) {
  const progress = (p) => send({ type: 'progress', id, progress: p });
  // The small files first: a wrong model location fails in milliseconds, before Pyodide boots.
  const files = { cache: options.cache !== false };
  const config = await readJson(options.model, 'config.json', files);
  const tokenizerJson = await readJson(options.model, 'tokenizer.json', files);
  const tokenizerConfig = (await readJson(options.model, 'tokenizer_config.json', { ...files, optional: true })) ?? {};
  const generationConfig = (await readJson(options.model, 'generation_config.json', { ...files, optional: true })) ?? {};
  state.text = createText({ tokenizerJson, tokenizerConfig, generationConfig, config });

  progress({ phase: 'runtime', loaded: 0, total: 0 });
  state.py = await startPython(options.pyodide ?? {});
  const bridge = state.py.pyimport('ruvllm.bridge');
  try {
    state.loader = bridge.new_loader();
  } finally {
    bridge.destroy();
  }
  unwrap(state.loader.set_config(JSON.stringify(config)));
  unwrap(state.loader.set_tokenizer(JSON.stringify(tokenizerJson))); // the text of each chunk is made in Python
  unwrap(state.loader.set_options(JSON.stringify(loadOptions(options))));

  const onPlan = (plan) => progress({ phase: 'plan', plan: renamePlan(plan), loaded: 0, total: 0 });
  const download = await loadWeights(state.loader, options.model, { ...files, sha256: options.sha256, onProgress: progress, onPlan });
  progress({ phase: 'load', loaded: download.total, total: download.total });
  const built = unwrap(state.loader.build());
  state.engine = state.loader.handle.copy(); // the attribute proxy itself dies with the loader
  state.loader.destroy();
  state.loader = null;
  const heapBytes = state.py._module.HEAP8.buffer.byteLength;
  const info = { ...built, plan: renamePlan(built.plan), downloadedBytes: download.total, fromCache: download.fromCache, heapBytes };
  send({ type: 'loaded', id, info });
}

async function generate(id, ids, options) {
  const { stop = [], adapter, ...rest } = options;
  if (adapter !== undefined) unwrap(state.engine.set_adapter(adapter ?? undefined)); // null: the base model
  const request = { prompt_ids: ids, eos_ids: state.text.eosIds, options: { ...pythonOptions(rest), stop } };
  unwrap(state.engine.start(JSON.stringify(request)));
  for (;;) {
    await yieldToEventLoop();
    if (state.aborted.delete(id)) {
      unwrap(state.engine.stop());
      throw new AbortError('generation aborted');
    }
    const step = unwrap(state.engine.step());
    if (step === null) return;
    if (step.prefilling) continue; // a long prompt between two forward calls: an abort can come in
    const stats = {
      promptTokens: step.stats.prompt_tokens,
      completionTokens: step.stats.completion_tokens,
      prefillMs: step.stats.prefill_ms,
      ttftMs: step.stats.ttft_ms,
      decodeTokS: step.stats.decode_tok_s,
      cachedTokens: step.stats.cached_tokens,
    };
    send({ type: 'chunk', id, chunk: { text: step.text, tokenId: step.token_id, finishReason: step.finish_reason, stats } });
    if (step.finish_reason !== null) return;
  }
}

/**
 * Load options for Python (snake_case). Without a memoryBudget, browsers that report their memory
 * (navigator.deviceMemory, in GiB, at most 8) get a quarter of it: compute 'auto' then picks a form
 * that fits; elsewhere there is no budget and 'auto' means float32.
 */
function loadOptions(options) {
  const kv = options.kv ?? {};
  const known = ['hotTokens', 'cold', 'budgetBytes', 'keep'];
  for (const key of Object.keys(kv)) {
    if (!known.includes(key)) throw new RuvLLMError('invalid_argument', `unknown kv option ${JSON.stringify(key)}; kv options are: ${known.join(', ')}`);
  }
  const deviceMemory = globalThis.navigator?.deviceMemory;
  const budget = options.memoryBudget ?? (IS_NODE || !deviceMemory ? undefined : Math.floor((deviceMemory * 2 ** 30) / 4));
  return {
    context_length: options.contextLength,
    compute: options.compute ?? 'auto',
    memory_budget: budget,
    kv: { hot_tokens: kv.hotTokens, cold: kv.cold, budget_bytes: kv.budgetBytes, keep: kv.keep },
  };
}

function renamePlan(plan) {
  return {
    compute: plan.compute,
    weightBytes: plan.weight_bytes,
    kvBytes: plan.kv_bytes,
    workspaceBytes: plan.workspace_bytes,
    totalBytes: plan.total_bytes,
  };
}

const ADAPTER_REQUESTS = new Set(['adapt', 'new_adapter', 'load_adapter', 'set_adapter', 'save_adapter']);

function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

async function adapterRequest(id, message) {
  const engine = state.engine;
  const { type } = message;
  if (type === 'adapt') {
    const { prompt, messages, completion, reward = 1, adapter = 'default', steps, lr } = message.feedback;
    const [promptIds, completionIds] = state.text.feedbackIds({ prompt, messages, completion });
    const request = { adapter, prompt_ids: promptIds, completion_ids: completionIds, reward, steps, lr };
    const r = unwrap(engine.adapt(JSON.stringify(request)));
    send({ type: 'result', id, result: { logProbBefore: r.log_prob_before, logProbAfter: r.log_prob_after, steps: r.steps, stepMs: r.step_ms } });
  } else if (type === 'new_adapter') {
    send({ type: 'result', id, result: unwrap(engine.new_adapter(JSON.stringify(message.config ?? {}))) });
  } else if (type === 'set_adapter') {
    send({ type: 'result', id, result: unwrap(engine.set_adapter(message.name ?? undefined)) });
  } else if (type === 'load_adapter') {
    const base = message.url;
    const files = { cache: false };
    const config = await readText(base, 'adapter_config.json', files);
    const weights = await readBytes(base, 'adapter_model.safetensors', files);
    const learned = await readBytes(base, 'learning_state.safetensors', { ...files, optional: true });
    send({ type: 'result', id, result: unwrap(engine.load_adapter(message.name, config, weights, learned ?? undefined)) });
  } else if (type === 'save_adapter') {
    const encoded = unwrap(engine.adapter_files(message.name ?? undefined));
    const files = Object.fromEntries(Object.entries(encoded).map(([name, b64]) => [name, fromBase64(b64)]));
    send({ type: 'result', id, result: files });
  }
}

/** Token ids of a request: a chat (messages), raw text, or ids given as they are. */
function promptIds({ messages, prompt }) {
  if (messages !== undefined) return state.text.encodeChat(messages);
  if (Array.isArray(prompt)) return prompt;
  return state.text.encode(prompt);
}

/** JS option names (camelCase) to the Python ones; unknown names are refused by Python. */
function pythonOptions(options) {
  const names = {
    maxTokens: 'max_tokens',
    temperature: 'temperature',
    topK: 'top_k',
    topP: 'top_p',
    minP: 'min_p',
    repetitionPenalty: 'repetition_penalty',
    seed: 'seed',
    ignoreEos: 'ignore_eos',
  };
  const out = {};
  for (const [key, value] of Object.entries(options)) {
    if (value === undefined) continue;
    if (!(key in names)) throw new RuvLLMError('invalid_argument', `unknown option ${JSON.stringify(key)}; options are: ${Object.keys(names).join(', ')}, stop`);
    out[names[key]] = value;
  }
  return out;
}

async function handle(message) {
  const { type, id } = message;
  if (type === 'abort') {
    state.aborted.add(id);
    return;
  }
  try {
    if (type === 'load') {
      await load(id, message.options);
    } else if (type === 'dispose') {
      dispose();
    } else {
      if (!state.engine) throw new RuvLLMError('inference', 'the model is not loaded');
      try {
        if (ADAPTER_REQUESTS.has(type)) {
          await adapterRequest(id, message);
        } else if (type === 'cache_stats') {
          const s = unwrap(state.engine.cache_stats());
          send({ type: 'result', id, result: { hotPositions: s.hot_positions, hotBytes: s.hot_bytes, coldPositions: s.cold_positions, coldBytes: s.cold_bytes, coldFormat: s.cold_format, evictedPositions: s.evicted_positions, seenPositions: s.seen_positions } });
        } else {
          const ids = promptIds(message);
          if (type === 'tokenize') send({ type: 'result', id, result: ids });
          else await generate(id, ids, message.options ?? {});
        }
      } finally {
        state.aborted.delete(id);
      }
    }
    send({ type: 'done', id });
  } catch (error) {
    send({ type: 'error', id, error: serializeError(error) });
  }
}

function dispose() {
  state.engine?.destroy();
  state.loader?.destroy();
  state.engine = state.loader = state.text = null;
}

// Requests are handled in order, except aborts, which must get through while a generation runs.
let queue = Promise.resolve();
const onMessage = (data) => {
  let message;
  try {
    message = checkRequest(data);
  } catch (error) {
    send({ type: 'error', id: data?.id ?? 0, error: { type: 'invalid_argument', message: error.message } });
    return;
  }
  if (message.type === 'abort') handle(message);
  else queue = queue.then(() => handle(message));
};
if (IS_NODE) port.on('message', onMessage);
else port.addEventListener('message', (event) => onMessage(event.data));
