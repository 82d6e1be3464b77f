/**
 * @ruvector/ruvllm — a small language model engine in pure NumPy, running in Pyodide inside a worker.
 *
 * @example
 * import { RuvLLM } from '@ruvector/ruvllm';
 * const llm = await RuvLLM.load({ model: 'https://example.com/models/smollm2/' });
 * for await (const c of llm.chat([{ role: 'user', content: 'Hi!' }], { temperature: 0 })) {
 *   console.log(c.text);
 * }
 * await llm.dispose();
 */

/**
 * What went wrong, in a form a program can branch on. 'invalid_argument': a bad argument or option,
 * refused before anything is sent to the worker, its message naming the option, what it must be and
 * what it was (`options.temperature must be a finite number >= 0, got NaN`); an unknown option name
 * is refused too, with the known ones. 'context_full': a prompt longer than the context window (a very
 * long text is refused by its length, before it is tokenized).
 */
export type RuvLLMErrorType = 'download' | 'load' | 'inference' | 'context_full' | 'invalid_argument';

/**
 * Every failure a caller can act on.
 * @example
 * try { await RuvLLM.load({ model: url }); }
 * catch (e) { if (e instanceof RuvLLMError && e.type === 'download') showRetryButton(e.message); }
 */
export class RuvLLMError extends Error {
  constructor(type: RuvLLMErrorType, message: string);
  readonly name: 'RuvLLMError';
  readonly type: RuvLLMErrorType;
}

/**
 * Thrown when an `AbortSignal` stops loading or generation.
 * @example
 * catch (e) { if (e.name === 'AbortError') return; }
 */
export class AbortError extends Error {
  readonly name: 'AbortError';
}

/** Load progress, reported through `LoadOptions.onProgress`. */
export interface Progress {
  /**
   * 'runtime': starting Pyodide; 'plan': the memory plan, made from the weight files' headers before
   * their data is downloaded; 'download': weight bytes arriving; 'load': preparing weights for compute.
   */
  phase: 'runtime' | 'plan' | 'download' | 'load';
  /** The memory plan ('plan' only). */
  plan?: MemoryPlan;
  /** Bytes done and expected over all weight files. */
  loaded: number;
  total: number;
  /** The weight file being downloaded, with its own bytes done and size ('download' only). */
  file?: string;
  fileLoaded?: number;
  fileTotal?: number;
  /** True when the bytes come from the cache (the browser's Cache API, Node's cache root) rather than the network. */
  fromCache?: boolean;
/** How Python started ('runtime', once it has: the same as `info.boot`). */
  boot?: BootReport;
}

/** `info.device`: where the decode plan runs, and why. */
export interface DeviceInfo {
  /** 'webgpu': every forward the plan takes runs on the GPU; 'cpu': on the kernels (and threads). */
  path: 'webgpu' | 'cpu';
  /** Why not the GPU (no adapter, no shared memory, the check failed, 'cpu' asked for), or null. */
  reason: string | null;
  /** The GPU adapter, when one was found (also when the check failed). */
  adapter: GpuAdapterInfo | null;
  /** The check of the GPU's logits against the CPU's at load, when it ran. */
  check: DeviceCheck | null;
}

/** `llm.deviceStats()`: the GPU's work so far (all 0 on the CPU). */
export interface DeviceStats {
  path: 'webgpu' | 'cpu';
  /** Plan calls (a forward each: a decoded token, or a prompt chunk). */
  calls: number;
  submits: number;
  dispatches: number;
  /** Bytes copied back from the GPU (the logits, or a prompt's normed rows), and written to it. */
  readBytes: number;
  writtenBytes: number;
  /** Bytes of weights the products read (a decoded token reads each matrix once, in its quantized form). */
  weightBytes: number;
  /** GPU memory held: the weights, the KV cache and the plan's buffers. */
  gpuBytes: number;
}

/** A WebGPU adapter as it describes itself, with what the plan uses of it. */
export interface GpuAdapterInfo {
  vendor: string;
  architecture: string;
  device: string;
  description: string;
  /** The adapter's optional features (the plan computes in float32 and needs none of them). */
  features: string[];
  /** The largest buffer one binding may hold, and the largest buffer. */
  maxBindingBytes: number;
  maxBufferBytes: number;
}

/** The GPU's logits against the CPU's over a fixed prompt and a few decoding steps. */
export interface DeviceCheck {
  rows: number;
  /** The share of rows whose top token is the same. */
  top1: number;
  /** The largest difference of a logit, the largest logit, and their ratio. */
  maxDiff: number;
  scale: number;
  relative: number;
  /** The largest `relative` the check lets through. */
  bound: number;
  /** Whether every row whose top token differs is a near-tie of the CPU's two candidates. */
  nearTies: boolean;
  passed: boolean;
}

/**
 * How Python started in the worker (`info.boot`), and what the boot cache did.
 * @example
 * const llm = await RuvLLM.load({ model });
 * if (llm.info.boot.note) console.warn(llm.info.boot.note); // why no snapshot was used or saved
 */
export interface BootReport {
  /** 'snapshot': restored from the boot snapshot; 'fresh': a full start of Pyodide, NumPy and ruvllm. */
  from: 'snapshot' | 'fresh';
  /**
   * 'restored': the snapshot was used; 'saved': this boot made one for the next; 'off': `bootCache: false`;
   * 'unavailable': none was used or saved (`note` says why).
   */
  cache: 'restored' | 'saved' | 'off' | 'unavailable';
  /** Why the snapshot was not used or not saved, or was made again (a damaged one); null when all went as planned. */
  note: string | null;
  /** Milliseconds from the start of the boot to Python ready (with ruvllm imported). */
  ms: number;
  /** Bytes of the snapshot entry read or written, or null. */
  snapshotBytes: number | null;
}

/**
 * @example
 * await RuvLLM.load({
 *   model: '/models/smollm2-135m-instruct/',
 *   pyodide: { indexURL: '/pyodide/' },
 *   onProgress: (p) => bar.value = p.total ? p.loaded / p.total : 0,
 * });
 */
export interface LoadOptions {
  /**
   * The model: the URL of a GGUF file (`…/model.gguf`, loaded as it is: config, tokenizer and chat
   * template from its metadata), the base URL of a model folder (config.json, tokenizer.json,
   * model.safetensors ...), in Node also a file or folder path, or a hub name: `hf:OWNER/REPO/FILE.gguf`
   * or `hf:OWNER/REPO` (`@REVISION` after REPO), fetched from `hfEndpoint`.
   * @example
   * await RuvLLM.load({ model: 'hf:unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf' });
   */
  model: string;
  /** Where `hf:` names are fetched from (default 'https://huggingface.co'): `${hfEndpoint}/OWNER/REPO/resolve/REV/FILE`. */
  hfEndpoint?: string;
  /**
   * A Hugging Face token for gated or private repos, sent as `Authorization: Bearer` to `hfEndpoint`
   * only (never to the CDN it redirects to). Default in Node: $HF_TOKEN.
   */
  hfToken?: string;
  /**
   * A Jinja chat template used instead of the model's own, or for a model without one (chat() then works;
   * without it, chat() on such a model is an 'invalid_argument' error). Gemma files without a template
   * get the built-in Gemma turn format.
   */
  chatTemplate?: string;
  /** Where Pyodide comes from. Default: the official CDN (browsers) or the `pyodide` npm package (Node, NumPy from the CDN). */
  pyodide?: { indexURL?: string };
  /** Called as the runtime starts and the weights arrive. */
  onProgress?: (progress: Progress) => void;
  /**
   * Aborting stops the downloads and the worker; `load` rejects with an AbortError once the worker has
   * removed its partial downloads (at most about a second later, if it is busy starting Pyodide).
   */
  signal?: AbortSignal;
  /**
   * Keep files downloaded by URL so the next load does not download them again. Browsers: the Cache API.
   * Node: the cache root shared with the Python package, `$RUVLLM_CACHE_DIR`, else `$XDG_CACHE_HOME/ruvllm`,
   * else `~/.cache/ruvllm`: `hf:` names in its `hub/` folder, where `ruvllm download` keeps them (each file
   * checked before it is put there), other URLs in `urls/` (checked, size and sha256, before every use);
   * delete it to clear the cache. `$RUVLLM_MODELS_DIR` (retired) is refused. Folder paths are never
   * cached. Default true; false neither reads nor writes the cache.
   * @example
   * await RuvLLM.load({ model: 'https://host/models/smollm2/', cache: false }); // always from the network
   */
  cache?: boolean;
  /**
   * Start Python from a boot snapshot: memory of Pyodide with NumPy and ruvllm imported, saved by the first
   * load and restored by later ones (about 2-3 s instead of 10-20 s on a busy machine; `info.boot` says
   * which happened). Browsers keep it in the Cache API (cache `ruvllm-boot-v1`), Node in the cache
   * root's `boot/` (see `cache`); about 37 MB, one per version of this package. A snapshot that is damaged
   * is made again; one that does not restore is never tried again for this version: those loads start
   * Python afresh and say why in `info.boot.note`. Default: `cache` (true); false neither reads nor writes one.
   * @example
   * await RuvLLM.load({ model, bootCache: false }); // always a full start of Python
   */
  bootCache?: boolean;
  /**
   * Expected sha256 (64 hex digits) of weight files, by file name; a mismatch is a 'download' error, a
   * name that is not one of the model's weight files an 'invalid_argument' error.
   */
  sha256?: Record<string, string>;
  /** KV cache positions, a positive integer (default: the model's context, at most 4096). */
  contextLength?: number;
  /**
   * How weights live in memory: 'f32' (4 bytes/weight), 'q8' (~1.1), 'q4' (~0.6), or 'auto' (default):
   * with the WebAssembly kernels, the smallest form that keeps a quantized model's values exactly (q4 for
   * a q4 model: also the fastest there); with NumPy's kernels, the fastest form (f32) that fits
   * memoryBudget.
   */
  compute?: 'auto' | 'f32' | 'q8' | 'q4';
  /**
   * What computes the matrix products. 'auto' (default): this package's WebAssembly SIMD kernels where
   * the runtime validates SIMD128 (every current browser and Node >= 20), NumPy otherwise
   * (`info.kernelsNote` says why); 'wasm': the kernels, or a 'load' error saying why they cannot run;
   * 'numpy': NumPy only (no BLAS and no SIMD inside Pyodide: several times slower on quantized weights).
   * @example
   * await RuvLLM.load({ model: url, kernels: 'numpy' }); // the reference path, e.g. to compare
   */
  kernels?: 'auto' | 'wasm' | 'numpy';
  /**
   * How the WebAssembly kernels multiply quantized weights while decoding. 'fast' (default): activations
   * rounded to 15 bits per group of 32 and multiplied in 16-bit integers, ~1.6x exact's decode speed at
   * no measurable perplexity cost (docs/kernels.md). 'exact': weights expanded to float32 in registers;
   * the same tokens as CPython, guaranteed. Prompt processing is exact either way.
   */
  arithmetic?: 'exact' | 'fast';
  /**
   * Run each forward as one call of the kernels' decode plan (default true; on one thread: the thread
   * pool's products are still driven one by one); false: Python drives each product. Ignored without the
   * WebAssembly kernels.
   */
  plan?: boolean;
  /**
   * Where the decode plan runs. 'auto' (default): on the GPU through WebGPU where the runtime offers an
   * adapter and its logits pass a check against the CPU at load (a short fixed prompt through both:
   * `info.device.check`), else on the CPU's kernels and threads; 'webgpu': the GPU, or a 'load' error
   * saying why not; 'cpu': never the GPU. The GPU needs memory shared with a worker, as threads do (in
   * browsers a cross-origin isolated page); in Node, the `webgpu` package (Dawn) installed beside this one.
   * Learning's lessons run on the CPU either way, and the GPU reads the adapter's weights after each.
   * @example
   * const llm = await RuvLLM.load({ model: url, device: 'webgpu' });
   * console.log(llm.info.device.adapter?.description, llm.info.device.check?.relative);
   */
  device?: 'auto' | 'webgpu' | 'cpu';
  /**
   * How many threads compute the matrix products with the WebAssembly kernels: an integer from 1 to 64,
   * or 'auto' (the default: the logical cores, at most 8; each kind of product then runs on one thread
   * or all of them, whichever measures faster, since a busy machine can make more threads slower). More
   * than one needs SharedArrayBuffer: in browsers a cross-origin isolated page (COOP/COEP headers, see
   * docs/kernels.md); elsewhere one thread runs and `info.threads.reason` says why. The products, and so the tokens, are
   * the same at every count. With more than one thread the weights live in the threads' own memory
   * (`info.poolBytes`), not in Pyodide's, so a model may take up to 4 GiB beside it.
   * @example
   * await RuvLLM.load({ model: url, threads: 2 }); // two threads for every product
   */
  threads?: 'auto' | number;
  /** Bytes for weights + KV cache + workspace, a positive integer. Default in browsers: a quarter of navigator.deviceMemory. */
  memoryBudget?: number;
  /** The two-tier KV cache. */
  kv?: KVOptions;
  /**
   * How long a download may wait for the server's next byte (its answer, then each piece of the body),
   * in milliseconds, before the load fails with a 'download' error naming the URL (default 30000; at
   * most 2^31 - 1). Only waits on the server count, not the time spent on what has arrived.
   * @example
   * await RuvLLM.load({ model: url, stallTimeoutMs: 120_000 }); // a slow mobile link
   */
  stallTimeoutMs?: number;
}

/**
 * @example
 * // the newest 256 positions in float32, older ones in int8; at most 64 MiB, the first 4 always kept
 * { hotTokens: 256, cold: 'int8', budgetBytes: 64 * 2 ** 20, keep: 4 }
 */
export interface KVOptions {
  /** Newest positions kept in float32 (default: all, a plain cache). */
  hotTokens?: number;
  /** Storage of older positions (default 'int8'). */
  cold?: 'int8' | 'int4';
  /** Cap for the cache; past it the oldest cold positions are dropped, so a long chat never fills up. */
  budgetBytes?: number;
  /** First positions never dropped (attention sinks; default 4). */
  keep?: number;
}

/** Bytes a load will take, stated before anything is allocated. */
export interface MemoryPlan {
  compute: 'f32' | 'q8' | 'q4';
  weightBytes: number;
  kvBytes: number;
  workspaceBytes: number;
  totalBytes: number;
  /** Weight bytes by the compute form each matrix gets ('f32', 'q8', 'q4'). */
  weightBytesByForm: Record<string, number>;
}

/** Positions and bytes per tier of the KV cache. */
export interface CacheStats {
  hotPositions: number;
  hotBytes: number;
  coldPositions: number;
  coldBytes: number;
  coldFormat: 'int8' | 'int4';
  evictedPositions: number;
  seenPositions: number;
}

/**
 * Generation options; the same meaning as the Python CLI's flags. Each is checked before the request is
 * sent: a wrong type, a non-finite number, a non-integer where an integer is due, a value out of range,
 * or a name not listed here is an 'invalid_argument' error naming the option (`undefined` means not given).
 * @example
 * llm.generate('Once upon a time', { maxTokens: 64, temperature: 0.7, topP: 0.9, seed: 1, stop: ['\n\n'] })
 */
export interface GenerateOptions {
  /** At most this many new tokens, an integer from 1 to the context length (default 256). */
  maxTokens?: number;
  /** A finite number >= 0; 0 is greedy (default 0.8). */
  temperature?: number;
  /** Keep the k most likely tokens, an integer >= 0; 0 disables (default 40). */
  topK?: number;
  /** Nucleus sampling mass in (0, 1] (default 0.95). */
  topP?: number;
  /** Drop tokens below minP × the top probability (default 0.05). */
  minP?: number;
  /** > 1 discourages tokens already in the context (default 1, off). */
  repetitionPenalty?: number;
  /** Same seed (an integer >= 0), same tokens. */
  seed?: number;
  /** Stop before the first of these (non-empty) strings; it is not part of the output. */
  stop?: string | string[];
  /** Keep going past the end-of-sequence token. */
  ignoreEos?: boolean;
  /** Compute this request (and the ones after) with a held adapter; null for the base model. */
  adapter?: string | null;
  /** Aborting ends the stream with an AbortError before the next token. */
  signal?: AbortSignal;
}

/** Timings and counts, updated on every chunk. */
export interface Stats {
  promptTokens: number;
  completionTokens: number;
  prefillMs: number;
  /** Time from the request to the first token. */
  ttftMs: number;
  decodeTokS: number;
  /** Prompt tokens whose keys/values were reused from the previous request (not computed again). */
  cachedTokens: number;
}

/**
 * One generated token.
 * @example
 * for await (const c of llm.generate('Hi')) { out.textContent += c.text; if (c.finishReason) console.log(c.stats); }
 */
export interface Chunk {
  /** New text (may be '' while a character or a possible stop string is incomplete). */
  text: string;
  tokenId: number;
  /** 'stop' (end of sequence or a stop string), 'length' (maxTokens or a full context), null while streaming. */
  finishReason: 'stop' | 'length' | null;
  stats: Stats;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | string;
  content: string;
}

// --- OpenAI shapes ------------------------------------------------------------------------------

/**
 * A message of an OpenAI chat request. Besides plain `{ role, content }` messages: an assistant message
 * that called tools (`tool_calls`, `content` may be null) and the answer of a tool (`role: 'tool'` with
 * `tool_call_id`). The chat template decides how they read (tool arguments given as a JSON string reach
 * it as an object, as in vLLM).
 * @example
 * [
 *   { role: 'user', content: 'Weather in Paris?' },
 *   { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
 *     function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
 *   { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21}' },
 * ]
 */
export interface ChatCompletionMessage {
  role: 'system' | 'user' | 'assistant' | 'tool' | string;
  content: string | null;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  name?: string;
}

/**
 * A function the model may call.
 * @example
 * { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
 *   parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }
 */
export interface Tool {
  type: 'function';
  function: {
    /** 1 to 64 letters, digits, '_' or '-'; unique among the tools. */
    name: string;
    description?: string;
    /** A JSON schema of the arguments (default: an object without properties); calls are constrained to it. */
    parameters?: JsonSchema;
    strict?: boolean;
  };
}

/**
 * A call the model made: `arguments` is JSON text (parse it yourself, as with OpenAI).
 * @example
 * { id: 'call_4f0c…', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }
 */
export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/**
 * 'none': no calls; 'auto' (the default with tools): the model may open a call, which is then constrained
 * to the tools' schemas; 'required' or one named function: the reply is a call from its first token.
 * @example
 * { type: 'function', function: { name: 'get_weather' } }
 */
export type ToolChoice = 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } };

/** A JSON schema (the subset response_format and tool parameters are constrained to; others are refused by name). */
export type JsonSchema = Record<string, unknown> | boolean;

/**
 * Constrained output. 'json_object': some JSON object; 'json_schema': JSON valid for the schema, enforced
 * token by token: type, properties, required, additionalProperties, items, minItems/maxItems, enum,
 * const, anyOf, $ref, minLength/maxLength, and minimum/maximum (exclusive too) on integers. Another
 * keyword (pattern, oneOf, allOf, bounds on non-integer numbers ...) is an 'invalid_argument' error
 * naming it and where it is.
 * @example
 * { type: 'json_schema', json_schema: { name: 'city', schema: { type: 'object',
 *   properties: { name: { type: 'string' }, population: { type: 'integer', minimum: 0 } },
 *   required: ['name', 'population'] } } }
 */
export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; json_schema: { name?: string; description?: string; schema: JsonSchema; strict?: boolean } };

/**
 * Fields both requests share, with OpenAI's names and defaults (temperature 1, top_p 1, no top_k or min_p;
 * no max_tokens bound but the context window), not generate()'s.
 *
 * Accepted and ignored, since they change nothing for one local model: `user`, `metadata`, `store`,
 * `parallel_tool_calls`, `service_tier`, and `n` (1 only), `frequency_penalty` and `presence_penalty`
 * (0 only), `logit_bias` (empty only). `model` is accepted; answers carry the loaded model's name. Any
 * other field (best_of, echo, suffix, audio, functions, ...) is an 'invalid_argument' error naming it.
 */
export interface CompletionRequestBase {
  model?: string;
  /** At most this many new tokens (default: until the context window is full). */
  max_tokens?: number | null;
  /** Stop before the first of these strings; it is not part of the output. */
  stop?: string | string[] | null;
  /** 0 is greedy (default 1). */
  temperature?: number | null;
  /** Nucleus sampling mass in (0, 1] (default 1). */
  top_p?: number | null;
  /** Same seed, same tokens. */
  seed?: number | null;
  /** Answer with an AsyncIterable of chunks instead of one object. */
  stream?: boolean | null;
  /** With `include_usage`, a last chunk (with empty `choices`) carries `usage`. */
  stream_options?: { include_usage?: boolean } | null;
  response_format?: ResponseFormat | null;
  /** ruvllm's own: keep the k most likely tokens (default 0, off). */
  top_k?: number | null;
  /** ruvllm's own: drop tokens below min_p × the top probability (default 0, off). */
  min_p?: number | null;
  /** ruvllm's own: > 1 discourages tokens already in the context (default 1, off). */
  repetition_penalty?: number | null;
  /** ruvllm's own: keep going past the end-of-sequence token. */
  ignore_eos?: boolean | null;
  user?: string;
  metadata?: Record<string, string>;
  store?: boolean;
  service_tier?: string;
  n?: 1;
  frequency_penalty?: 0;
  presence_penalty?: 0;
  logit_bias?: Record<string, never>;
}

/**
 * The body of `llm.chat.completions.create`: OpenAI's chat completion request (the subset above).
 * @example
 * await llm.chat.completions.create({
 *   messages: [{ role: 'user', content: 'What is the capital of France?' }],
 *   max_tokens: 64, temperature: 0,
 * });
 */
export interface ChatCompletionRequest extends CompletionRequestBase {
  messages: ChatCompletionMessage[];
  /** The same as max_tokens (OpenAI's newer name); it wins when both are given. */
  max_completion_tokens?: number | null;
  /** Log-probabilities of the chosen tokens (after temperature), with `top_logprobs` alternatives (0 to 20). */
  logprobs?: boolean | null;
  top_logprobs?: number | null;
  /** Functions the model may call; they reach the chat template as its `tools` variable. */
  tools?: Tool[] | null;
  tool_choice?: ToolChoice | null;
  parallel_tool_calls?: boolean;
}

/**
 * The body of `llm.completions.create`: OpenAI's (legacy) completion request, for raw text.
 * @example
 * await llm.completions.create({ prompt: 'Once upon a time', max_tokens: 32, temperature: 0.7, seed: 1 });
 */
export interface CompletionRequest extends CompletionRequestBase {
  /** Raw text (or `[text]`), or token ids: one prompt. */
  prompt: string | [string] | number[];
  /** Log-probabilities of the chosen tokens with this many alternatives (0 to 5). */
  logprobs?: number | null;
}

/** Token counts of one request. */
export interface CompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** Prompt tokens whose keys/values were reused from the previous request. */
  prompt_tokens_details: { cached_tokens: number };
}

/** One token's log-probability (chat's layout), its bytes, and the most likely alternatives. */
export interface TokenLogprob {
  token: string;
  bytes: number[];
  logprob: number;
  top_logprobs: { token: string; bytes: number[]; logprob: number }[];
}

/** 'stop': end of sequence, a stop string or a complete constrained output; 'length': max_tokens or a full context. */
export type FinishReason = 'stop' | 'length' | 'tool_calls';

/**
 * The answer of `llm.chat.completions.create`.
 * @example
 * const answer = await llm.chat.completions.create({ messages, temperature: 0 });
 * console.log(answer.choices[0].message.content, answer.usage.completion_tokens);
 */
export interface ChatCompletion {
  /** 'chatcmpl-' and 24 hex digits. */
  id: string;
  object: 'chat.completion';
  /** Unix time, in seconds. */
  created: number;
  /** The loaded model's name: the last segment of its path or URL, without '.gguf'. */
  model: string;
  choices: {
    index: 0;
    message: { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] };
    logprobs: { content: TokenLogprob[] } | null;
    /** 'tool_calls' when the reply is (or holds) calls. */
    finish_reason: FinishReason;
  }[];
  usage: CompletionUsage;
}

/**
 * One streamed piece of a chat completion: the first has `delta.role`, each later one a piece of
 * `delta.content`, the last a `finish_reason`; with `stream_options.include_usage`, one more with empty
 * `choices` and the `usage`. Tool calls arrive whole, in the finishing chunk's `delta.tool_calls`.
 * @example
 * let reply = '';
 * for await (const chunk of await llm.chat.completions.create({ messages, stream: true }))
 *   reply += chunk.choices[0]?.delta.content ?? '';
 */
export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: {
    index: 0;
    delta: { role?: 'assistant'; content?: string | null; tool_calls?: (ToolCall & { index: number })[] };
    logprobs: { content: TokenLogprob[] } | null;
    finish_reason: FinishReason | null;
  }[];
  usage?: CompletionUsage;
}

/** Log-probabilities in the completions layout: parallel lists, one entry per token. */
export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Record<string, number>[];
  text_offset: number[];
}

/**
 * The answer of `llm.completions.create`, and (with `stream`) each of its chunks, whose `text` is the
 * new piece; with `stream_options.include_usage` a last chunk has empty `choices` and the `usage`.
 * @example
 * const { choices } = await llm.completions.create({ prompt: 'The sky is', max_tokens: 8, temperature: 0 });
 * console.log(choices[0].text);
 */
export interface Completion {
  /** 'cmpl-' and 24 hex digits. */
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: {
    index: 0;
    text: string;
    logprobs: CompletionLogprobs | null;
    finish_reason: 'stop' | 'length' | null;
  }[];
  /** Always in the whole answer; in a stream, only on the include_usage chunk. */
  usage?: CompletionUsage;
}

/** Options of a `create` call (besides the body). */
export interface RequestOptions {
  /** Aborting rejects the promise, or ends the stream, with an AbortError before the next token. */
  signal?: AbortSignal;
}

/**
 * `llm.chat.completions`: OpenAI's chat completions (as the OpenAI SDK and WebLLM take them).
 * @example
 * const answer = await llm.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }] });
 * const stream = await llm.chat.completions.create({ messages, stream: true }, { signal: controller.signal });
 * for await (const chunk of stream)
 *   out.textContent += chunk.choices[0]?.delta.content ?? '';
 */
export interface ChatCompletions {
  /**
   * Resolves to the answer, or with `stream: true` to an AsyncIterable of chunks (resolved with the
   * first chunk: a refused body rejects the promise). Errors: 'invalid_argument' naming the field,
   * 'context_full', an AbortError.
   */
  create(
    body: ChatCompletionRequest & { stream: true },
    options?: RequestOptions,
  ): Promise<AsyncIterable<ChatCompletionChunk>>;
  create(body: ChatCompletionRequest & { stream?: false | null }, options?: RequestOptions): Promise<ChatCompletion>;
  create(
    body: ChatCompletionRequest,
    options?: RequestOptions,
  ): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>>;
}

/**
 * `llm.completions`: OpenAI's completions of raw text.
 * @example
 * const { choices } = await llm.completions.create({ prompt: 'Once upon a time', max_tokens: 16 });
 */
export interface Completions {
  create(body: CompletionRequest & { stream: true }, options?: RequestOptions): Promise<AsyncIterable<Completion>>;
  create(body: CompletionRequest & { stream?: false | null }, options?: RequestOptions): Promise<Completion>;
  create(body: CompletionRequest, options?: RequestOptions): Promise<Completion | AsyncIterable<Completion>>;
}

/**
 * `llm.chat`: a function (stream a reply with ruvllm's options and chunks) that also holds OpenAI's
 * `completions`.
 * @example
 * for await (const c of llm.chat([{ role: 'user', content: 'Hi' }])) reply += c.text;
 * const answer = await llm.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }] });
 */
export interface Chat {
  (messages: ChatMessage[], options?: GenerateOptions): AsyncIterable<Chunk>;
  readonly completions: ChatCompletions;
}

/** What the worker reported once the model was ready. */
export interface ModelInfo {
  architecture: string;
  vocabSize: number;
  contextLength: number;
  parameters: number;
  /** Bytes the weights take in memory, in their compute forms. */
  weightBytes: number;
  /** The memory plan the load followed. */
  plan: MemoryPlan;
  downloadedBytes: number;
  fromCache: boolean;
  /** Pyodide's WebAssembly memory after loading: the peak, since it never shrinks. */
  heapBytes: number;
  /**
   * The kernel threads' own WebAssembly memory (0 with one thread): with more than one thread, the
   * weights' compute forms live there, not in Pyodide's memory.
   */
  poolBytes: number;
  /** What computes the matrix products. */
  kernels: 'wasm' | 'numpy';
  /** The kernels' arithmetic ('exact' for NumPy). */
  arithmetic: 'exact' | 'fast';
  /** Whether each forward runs as one call of the kernels' decode plan (`LoadOptions.plan`). */
  decodePlan: boolean;
  /** Why the decode plan does not run (e.g. "off (plan=False)", or no kernel memory to run it in), or null. */
  planNote: string | null;
  /** With kernels 'auto': why the WebAssembly kernels are not used, or null. */
  kernelsNote: string | null;
  /**
   * Whether the kernels use relaxed SIMD (the fast arithmetic's 4-bit products): where the runtime
   * validates it and the kernels' known-answer test passes (Chromium; Node 21 and newer, or Node 20
   * with --experimental-wasm-relaxed-simd). The results are the same integers per group either way.
   */
  relaxedSimd: boolean;
  /**
   * Threads computing the matrix products, why only one runs (null when more do), and whether each
   * product picks one thread or all by measurement (threads: 'auto').
   */
  threads: { count: number; reason: string | null; adaptive: boolean };
  /** Where the decode plan runs (`LoadOptions.device`): the path taken, why not the GPU, the check. */
  device: DeviceInfo;
  /** Where chat()'s template comes from: the model's files, the built-in Gemma turn format, the chatTemplate option, or none. */
  chatTemplate: 'model' | 'built-in gemma' | 'option' | null;
  /** How Python started: from the boot snapshot or afresh (see `LoadOptions.bootCache`). */
  boot: BootReport;
}

/**
 * Feedback on one answer.
 * @example
 * { messages: [{ role: 'user', content: 'Hi' }], completion: 'Hello! How can I help?', reward: 1 }
 */
export interface Feedback {
  /** Raw text before the completion... */
  prompt?: string;
  /** ...or the conversation before it (rendered with the chat template). */
  messages?: ChatMessage[];
  completion: string;
  /** +1: good, make it likelier; -1: bad, less likely; any non-zero number weighs the lesson. */
  reward?: number;
  /** The adapter that learns (default 'default'; made with the default config if missing). */
  adapter?: string;
  /** Most optimizer steps (an integer >= 1) and the learning rate, in (0, 10) (defaults: the measured ones, see docs). */
  steps?: number;
  lr?: number;
  /** 'sgd' (default) or 'adam'. */
  optimizer?: 'sgd' | 'adam';
  /** Strength of elastic weight consolidation, >= 0 (default 0, off). */
  ewc?: number;
  /** Stop once greedy decoding reproduces the completion (default true); false takes every step. */
  untilGreedy?: boolean;
  /** Rounds of rehearsal of earlier lessons (an integer, default 3), weight of the kept prompt predictions
   * (default 10), energy of the input subspace the adapter stays out of (in [0, 1), default 0.99): 0 turns each off. */
  rehearse?: number;
  keep?: number;
  project?: number;
  /** A fresh adapter's lessons write their own inputs (whitened) into rows of A and train only B's columns
   * of them (default true); false: A and B train, A kept out of the input subspace (`project`). */
  keyed?: boolean;
}

export interface AdaptOptions {
  /** Aborting it cancels the rest of the lesson (the steps taken stay); adapt() rejects with an AbortError. */
  signal?: AbortSignal;
  /** After the first step (applied at once) and after each slice of background learning. */
  onProgress?: (progress: LearningProgress) => void;
}

/**
 * What a lesson is doing:
 * - 'waiting': behind `ahead` other lessons;
 * - 'preparing': its next step waits for a fresh adapter's projection bases (made once per model from a
 *   calibration text), `prepared.done` of `prepared.total` units of work made;
 * - 'learning': optimizer steps on it, `step` of at most `steps`;
 * - 'rehearsing': its steps are over (`outcome` says why); earlier lessons are checked, and stepped
 *   (`rehearsed`) where they no longer hold;
 * - 'done': its report follows.
 */
export type LearningPhase = 'waiting' | 'preparing' | 'learning' | 'rehearsing' | 'done';

/**
 * Why a lesson's steps ended: 'already' (a good answer greedy decoding already gives: nothing to learn),
 * 'learned' (greedy decoding gives a good answer now), 'unlearned' (no longer gives a bad one),
 * 'most_steps' (it took the most steps it may).
 */
export type LearningOutcome = 'already' | 'learned' | 'unlearned' | 'most_steps';

/**
 * @example onProgress: (p) => (label.textContent = p.phase === 'preparing'
 *   ? `preparing ${p.prepared.done}/${p.prepared.total}` : `${p.phase} step ${p.step}/${p.steps}`)
 */
export interface LearningProgress {
  phase: LearningPhase;
  /** Steps taken so far, and the most the lesson takes. */
  step: number;
  steps: number;
  /** Steps taken on earlier lessons while rehearsing them. */
  rehearsed: number;
  /** The adapter's version (bumped by every step): answers from now on use it. */
  version: number;
  done: boolean;
  /** Whether the first step is taken (or was found not to be needed): the next answer uses it. */
  applied: boolean;
  /** Why its steps ended, once known (from the first check on, for 'already'). */
  outcome: LearningOutcome | null;
  /** Wall time since the lesson was given (waiting and preparing included), in ms. */
  elapsedMs: number;
  /** While 'preparing': the projection bases' units of work made, and in all. */
  prepared: { done: number; total: number } | null;
  /** While 'waiting': lessons before it. */
  ahead: number;
}

export interface AdaptReport {
  /** Mean log-probability of the completion's tokens before and after learning. */
  logProbBefore: number;
  logProbAfter: number;
  steps: number;
  /** Mean compute time of one pass (forward and backward through the adapted layers, update). */
  stepMs: number;
  /** Steps on earlier lessons, rehearsed after this one so that they stay learned. */
  rehearsalSteps: number;
  /** Wall time from the lesson's start to its end (waiting and preparing included), in ms. */
  wallMs: number;
  outcome: LearningOutcome;
  /** The completion's tokens: the log-probabilities above are means over them. */
  tokens: number;
  /** The lesson's reward (+ good, - bad). */
  reward: number;
  /** Whether greedy decoding gives the completion at the end (after rehearsal). */
  greedy: boolean | null;
  /**
   * What changed, in words: "Learned: this answer is now 45x more likely (…), and greedy decoding gives it;
   * 19 steps, 22.2 s.", "No effect: …" when the whole answer's likelihood moved by less than 1.5x, "Nothing to
   * learn: …" when greedy decoding already gave it.
   */
  summary: string;
}

export interface AdapterList {
  names: string[];
  active: string | null;
  /** Each adapter's version: how many learning steps it has taken. */
  versions: Record<string, number>;
  /** Lessons waiting to be learned in the background. */
  learning: number;
  /**
   * Whether learning's preparation (once per model, begun in idle time after load: what a fresh adapter's
   * first lesson needs before its first step) is under way.
   */
  preparing: boolean;
  /** Each adapter and mixture described. */
  adapters: AdapterInfo[];
  /**
   * Whether a forward with the active adapter runs through the decode plan now (info.decodePlan says
   * so at load): an X-LoRA mixture routes its tokens in passes of its own, which the NumPy forward runs.
   */
  decodePlan: boolean;
  /** Why not (null when it does): the mixture, or info.planNote. */
  planNote: string | null;
}

/** A held LoRA adapter, or an X-LoRA mixture of adapters routed per token. */
export type AdapterInfo =
  | {
      name: string;
      kind: 'lora';
      version: number;
      active: boolean;
      rank: number;
      alpha: number;
      targets: string[];
      layers: number[] | null;
    }
  | {
      name: string;
      kind: 'xlora';
      version: number;
      active: boolean;
      experts: string[];
      /** Experts each token uses (null: all of them, weighted). */
      topK: number | null;
      depth: number;
      layerwise: boolean;
    };

export interface MixOptions {
  /** Experts each token uses; default all of them, weighted by the router. */
  topK?: number;
  /** Router layers (default 1) and width when deeper (default 2048). */
  depth?: number;
  size?: number;
  /** Scalings per adapted projection rather than one set for all. */
  layerwise?: boolean;
  /** Softmax temperature of the router (default 1). */
  temperature?: number;
}

export interface AdapterConfig {
  name?: string;
  /** Default 32 (as on CPython: LoRAConfig). */
  rank?: number;
  /** Default 2 x rank. */
  alpha?: number;
  /** Projections adapted (and 'lm_head'); default: the measured default (see docs). */
  targets?: Array<'q_proj' | 'k_proj' | 'v_proj' | 'o_proj' | 'gate_proj' | 'up_proj' | 'down_proj' | 'lm_head'>;
  /** Decoder layers adapted, negative from the top (-1: the last); null: all. Default: the measured default. */
  layers?: number[] | null;
}

export class RuvLLM {
  /**
   * Start a worker, boot Pyodide and load a model.
   * @example const llm = await RuvLLM.load({ model: 'https://host/models/smollm2/' });
   */
  static load(options: LoadOptions): Promise<RuvLLM>;

  readonly info: ModelInfo;

  /**
   * Stream the continuation of raw text (or of token ids).
   * @example for await (const c of llm.generate('The sky is', { maxTokens: 16 })) process.stdout.write(c.text);
   */
  generate(prompt: string | number[], options?: GenerateOptions): AsyncIterable<Chunk>;

  /**
   * Stream the assistant's reply, with the conversation rendered by the model's chat template; and
   * `chat.completions.create(body)`, OpenAI's chat completions.
   * @example
   * for await (const c of llm.chat([{ role: 'user', content: 'Hi' }])) reply += c.text;
   * const answer = await llm.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 32 });
   */
  readonly chat: Chat;

  /**
   * OpenAI's completions of raw text.
   * @example const { choices } = await llm.completions.create({ prompt: 'The sky is', max_tokens: 8 });
   */
  readonly completions: Completions;

  /**
   * Token ids of raw text, or of a conversation rendered with the chat template.
   * @example const ids = await llm.tokenize([{ role: 'user', content: 'Hi' }]);
   */
  tokenize(input: string | ChatMessage[]): Promise<number[]>;

  /**
   * Learn from feedback (true gradient steps on a LoRA adapter, in the worker): the whole lesson, its
   * report when it ends, as `model.adapt` in Python. The first step lands at once (Python's `feedback`),
   * the others in the worker's idle time (a generation requested meanwhile starts within one slice).
   * @example await llm.adapt({ messages, completion: answer, reward: thumbsUp ? 1 : -1 }, { onProgress, signal });
   */
  adapt(feedback: Feedback, options?: AdaptOptions): Promise<AdaptReport>;

  /**
   * The adapters held, the active one, their versions and the lessons waiting.
   * @example const { versions } = await llm.adapters();
   */
  adapters(): Promise<AdapterList>;

  /**
   * A fresh adapter, made active.
   * @example await llm.newAdapter({ name: 'facts', rank: 2, targets: ['down_proj'] });
   */
  newAdapter(
    config?: AdapterConfig,
  ): Promise<{ name: string; rank: number; targets: string[]; layers: number[] | null }>;

  /**
   * An X-LoRA mixture of held adapters, routed per token by a router that weighs them evenly at first
   * (`adapt` with `adapter: name` teaches it); made active.
   * @example await llm.mixAdapters('both', ['facts', 'style'], { topK: 1 });
   */
  mixAdapters(
    name: string,
    experts: string[],
    options?: MixOptions,
  ): Promise<{ name: string; experts: string[]; topK: number | null }>;

  /**
   * Load an adapter folder by URL: ours, a Hugging Face PEFT LoRA, or a PEFT X-LoRA mixture whose
   * experts are subfolders named after them (the Hub layout); returns its name.
   * @example const name = await llm.loadAdapter('/adapters/polite/'); await llm.setAdapter(name);
   */
  loadAdapter(url: string, options?: { name?: string }): Promise<string>;

  /**
   * Compute with a held adapter from now on; null for the base model.
   * @example await llm.setAdapter(null);
   */
  setAdapter(name: string | null): Promise<string | null>;

  /**
   * The files of an adapter (default: the active one): adapter_config.json, adapter_model.safetensors,
   * learning_state.safetensors.
   * @example const files = await llm.saveAdapter();
   */
  saveAdapter(name?: string): Promise<Record<string, Uint8Array>>;

  /**
   * Positions and bytes of the KV cache per tier.
   * @example const { hotBytes, coldBytes } = await llm.cacheStats();
   */
  cacheStats(): Promise<CacheStats>;

  /**
   * Where the decode plan runs, and on a GPU the work so far (per decoded token: one plan call, one
   * submit, one readback of the logits).
   * @example
   * const before = await llm.deviceStats();
   * for await (const chunk of llm.generate('Hello', { maxTokens: 16 })) void chunk;
   * const after = await llm.deviceStats();
   * console.log((after.dispatches - before.dispatches) / (after.calls - before.calls), 'dispatches a forward');
   */
  deviceStats(): Promise<DeviceStats>;

  /**
   * Free the model and stop the worker. What is under way stops first, as an abort stops it: a
   * generation at its next token (its stream rejects with an AbortError), a lesson at its next slice.
   * @example await llm.dispose();
   */
  dispose(): Promise<void>;
}
