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

/** What went wrong, in a form a program can branch on. */
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
  /** True when the bytes come from the cache (the browser's Cache API, Node's cache folder) rather than the network. */
  fromCache?: boolean;
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
   * A Jinja chat template used instead of the model's own, or for a model without one (chat() then works;
   * without it, chat() on such a model is an 'invalid_argument' error). Gemma files without a template
   * get the built-in Gemma turn format.
   */
  chatTemplate?: string;
  /** Where Pyodide comes from. Default: the official CDN (browsers) or the `pyodide` npm package (Node, NumPy from the CDN). */
  pyodide?: { indexURL?: string };
  /** Called as the runtime starts and the weights arrive. */
  onProgress?: (progress: Progress) => void;
  /** Aborting stops the download and the worker; `load` rejects with an AbortError. */
  signal?: AbortSignal;
  /**
   * Keep files downloaded by URL so the next load does not download them again. Browsers: the Cache API.
   * Node: a folder, `$RUVLLM_CACHE_DIR`, else `$XDG_CACHE_HOME/ruvllm/models`, else `~/.cache/ruvllm/models`,
   * whose files are checked (size and sha256) before every use; delete it to clear the cache. Folder paths
   * are never cached. Default true; false neither reads nor writes the cache.
   * @example
   * await RuvLLM.load({ model: 'https://host/models/smollm2/', cache: false }); // always from the network
   */
  cache?: boolean;
  /** Expected sha256 (hex) of weight files, by file name; a mismatch is a 'download' error. */
  sha256?: Record<string, string>;
  /** KV cache positions (default: the model's context, at most 4096). */
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
   * How the WebAssembly kernels multiply quantized weights while decoding. 'exact' (default): weights
   * expanded to float32 in registers; the same tokens as CPython. 'fast': activations rounded to int8
   * per group of 32 (as llama.cpp does); faster decoding, slightly different numbers (its perplexity
   * cost is in docs/performance.md). Prompt processing is exact either way.
   */
  arithmetic?: 'exact' | 'fast';
  /** Bytes for weights + KV cache + workspace. Default in browsers: a quarter of navigator.deviceMemory. */
  memoryBudget?: number;
  /** The two-tier KV cache. */
  kv?: KVOptions;
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
 * Generation options; the same meaning as the Python CLI's flags.
 * @example
 * llm.generate('Once upon a time', { maxTokens: 64, temperature: 0.7, topP: 0.9, seed: 1, stop: ['\n\n'] })
 */
export interface GenerateOptions {
  /** At most this many new tokens (default 256). */
  maxTokens?: number;
  /** 0 is greedy (default 0.8). */
  temperature?: number;
  /** Keep the k most likely tokens; 0 disables (default 40). */
  topK?: number;
  /** Nucleus sampling mass in (0, 1] (default 0.95). */
  topP?: number;
  /** Drop tokens below minP × the top probability (default 0.05). */
  minP?: number;
  /** > 1 discourages tokens already in the context (default 1, off). */
  repetitionPenalty?: number;
  /** Same seed, same tokens. */
  seed?: number;
  /** Stop before the first of these strings; it is not part of the output. */
  stop?: string[];
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
  /** WebAssembly memory after loading: the peak, since it never shrinks. */
  heapBytes: number;
  /** What computes the matrix products. */
  kernels: 'wasm' | 'numpy';
  /** The kernels' arithmetic ('exact' for NumPy). */
  arithmetic: 'exact' | 'fast';
  /** With kernels 'auto': why the WebAssembly kernels are not used, or null. */
  kernelsNote: string | null;
  /** Where chat()'s template comes from: the model's files, the built-in Gemma turn format, the chatTemplate option, or none. */
  chatTemplate: 'model' | 'built-in gemma' | 'option' | null;
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
  /** The adapter that learns (default 'default'; made, rank 2 on q_proj and v_proj, if missing). */
  adapter?: string;
  /** Optimizer steps (default 6) and learning rate (default 0.004). */
  steps?: number;
  lr?: number;
}

export interface AdaptReport {
  /** Mean log-probability of the completion's tokens before and after learning. */
  logProbBefore: number;
  logProbAfter: number;
  steps: number;
  /** Time of one step (forward, backward through the whole network, update). */
  stepMs: number;
}

export interface AdapterConfig {
  name?: string;
  /** Default 2. */
  rank?: number;
  /** Default 2 x rank. */
  alpha?: number;
  /** Projections of every layer (and 'lm_head'); default ['q_proj', 'v_proj']. */
  targets?: Array<'q_proj' | 'k_proj' | 'v_proj' | 'o_proj' | 'gate_proj' | 'up_proj' | 'down_proj' | 'lm_head'>;
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
   * Stream the assistant's reply, with the conversation rendered by the model's chat template.
   * @example for await (const c of llm.chat([{ role: 'user', content: 'Hi' }])) reply += c.text;
   */
  chat(messages: ChatMessage[], options?: GenerateOptions): AsyncIterable<Chunk>;

  /**
   * Token ids of raw text, or of a conversation rendered with the chat template.
   * @example const ids = await llm.tokenize([{ role: 'user', content: 'Hi' }]);
   */
  tokenize(input: string | ChatMessage[]): Promise<number[]>;

  /**
   * Learn from feedback (a true gradient step on a LoRA adapter, in the worker).
   * @example await llm.adapt({ messages, completion: answer, reward: thumbsUp ? 1 : -1 });
   */
  adapt(feedback: Feedback): Promise<AdaptReport>;

  /**
   * A fresh adapter, made active.
   * @example await llm.newAdapter({ name: 'facts', rank: 2, targets: ['down_proj'] });
   */
  newAdapter(config?: AdapterConfig): Promise<{ name: string; rank: number; targets: string[] }>;

  /**
   * Load an adapter folder (ours, or a Hugging Face PEFT LoRA) by URL; returns its name.
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
   * Free the model and stop the worker.
   * @example await llm.dispose();
   */
  dispose(): Promise<void>;
}
