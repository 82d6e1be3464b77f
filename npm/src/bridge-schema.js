/**
 * The one description of what crosses between the worker and Python (py_src/ruvllm/bridge.py), and
 * between the caller's thread and the worker: every bridge call with its arguments (Python's parameter
 * names) and what it answers, every object shape with its fields (Python's names), and every worker
 * request with its fields. What is made from it:
 *   - protocol.js's name table (PYTHON_NAMES): every field with an underscore, in every shape that is
 *     renamed, becomes its camelCase twin, so a new field has its JavaScript name the moment it is here;
 *   - protocol.js's REQUESTS (the worker requests the worker accepts);
 *   - test/bridge-schema.test.js: every bridge call the worker makes names a call here, every call here
 *     is made, the calls are exactly the public methods of ModelLoader and EngineHandle with these
 *     parameters, and the dataclass-shaped answers have exactly these fields.
 * A JavaScript module rather than JSON: the worker imports it as it is, in Node and in the browser
 * bundle, without JSON modules, and it carries the comments and JSDoc types tsc checks.
 *
 * A request's shape names the dataclass py_src/ruvllm/bridge.py reads it into (`dataclass`: each field
 * checked against its type there), so the two cannot drift apart.
 *
 * Argument types: 'json' (a JSON text the caller makes: crosses without renaming), 'text', 'int',
 * 'bytes' (a typed array), 'proxy' (a JS object Python keeps), '*bytes' (any number of them), or a shape
 * name (a plain object: callBridge renames it to Python's names and sends it as JSON). A call answers
 * JSON ({ok} or {error}, unwrapped by callBridge) unless `hands` says it hands over a Python object.
 */

/**
 * @typedef {{ fields: Record<string, string>, verbatim?: boolean, dataclass?: string, note?: string }} Shape
 *   fields: name -> type (a shape name, or a description); verbatim: its fields keep Python's names in
 *   JavaScript (not in the name table); dataclass: the Python dataclass it is `asdict` of (checked)
 * @typedef {{ args: Record<string, string>, returns: string, hands?: boolean }} BridgeCall
 *   args: Python parameter name -> argument type, in order; hands: answers a Python object (a PyProxy)
 */

/** @type {Readonly<Record<string, Shape>>} */
export const SHAPES = Object.freeze({
  // --- loading -------------------------------------------------------------------------------
  LoadOptions: {
    dataclass: 'ruvllm.bridge.LoadRequest',
    fields: {
      context_length: 'int | null',
      compute: 'string',
      memory_budget: 'int | null',
      kernels: 'string',
      arithmetic: 'string | null',
      plan: 'boolean',
      kv: 'KVOptions',
      sha256: 'Record<string, string> | null (file name -> hex digest: checked as each file arrives)',
      device: "'auto' | 'webgpu' | 'cpu' (where the decode plan may run)",
    },
  },
  KVOptions: {
    fields: { hot_tokens: 'int | null', cold: 'string', budget_bytes: 'int | null', keep: 'int' },
  },
  KernelsStarted: { fields: { running: 'boolean', reason: 'string | null', relaxed: 'boolean' } },
  Want: {
    dataclass: 'ruvllm.runtime.assembly.Want',
    note: 'the file the loader needs next (runtime/assembly.py Want): a JSON document whole, a header, data',
    fields: { name: 'string', part: "'document' | 'header' | 'data'", optional: 'boolean' },
  },
  GgufHeader: {
    verbatim: true,
    note: "the model folder's JSON files as a GGUF's metadata gives them: read by JavaScript as they are",
    fields: { config: 'object', tokenizer: 'object', tokenizer_config: 'object', generation_config: 'object' },
  },
  FileStart: { dataclass: 'ruvllm.bridge.FileStart', fields: { name: 'string', size: 'int' } },
  FileEnd: { dataclass: 'ruvllm.bridge.FileEnd', fields: { name: 'string' } },
  FileDone: { fields: { bytes: 'int' } },
  MemoryPlan: {
    fields: {
      compute: 'string',
      weight_bytes: 'int',
      kv_bytes: 'int',
      workspace_bytes: 'int',
      total_bytes: 'int',
      weight_bytes_by_form: 'Record<string, int>',
    },
  },
  Built: {
    fields: {
      architecture: 'string',
      vocab_size: 'int',
      context_length: 'int',
      parameters: 'int',
      weight_bytes: 'int',
      plan: 'MemoryPlan',
      kernels: 'string',
      arithmetic: 'string',
      decode_plan: 'boolean (each forward is one call of the kernels decode plan)',
      plan_note: 'string | null (why it does not: null when it does)',
      device: 'DeviceReport | null (a GPU was offered: where the plan runs; null: none was)',
    },
  },
  DeviceReport: {
    note: 'runtime/device.py use_gpu: the path taken, why not the GPU, the check against the CPU',
    fields: { path: "'webgpu' | 'cpu'", reason: 'string | null', check: 'DeviceCheck | null' },
  },
  DeviceCheck: {
    note: "runtime/device.py compare: the GPU's logits against the CPU's over the check's rows",
    fields: {
      rows: 'int',
      top1: 'number (the share of rows whose top token agrees)',
      max_diff: 'number',
      scale: 'number (the largest logit)',
      relative: 'number (max_diff / scale)',
      bound: 'number (the largest relative allowed)',
      near_ties: 'boolean (every row that disagrees is a near-tie)',
      passed: 'boolean',
      refusal: 'string (the plan could not run the weights)',
    },
  },
  // --- generation ----------------------------------------------------------------------------
  GenerationOptions: {
    fields: {
      max_tokens: 'int',
      stop: 'string | string[]',
      ignore_eos: 'boolean',
      logprobs: 'int | null',
      temperature: 'number',
      top_k: 'int',
      top_p: 'number',
      min_p: 'number',
      repetition_penalty: 'number',
      seed: 'int | null',
    },
  },
  Start: {
    dataclass: 'ruvllm.bridge.StartRequest',
    fields: { prompt_ids: 'int[]', eos_ids: 'int[]', options: 'GenerationOptions' },
  },
  Started: { fields: { prompt_tokens: 'int' } },
  Step: {
    note: 'a chunk, or {prefilling} between the forward calls of a long prompt, or null when done',
    fields: {
      text: 'string',
      token_id: 'int',
      finish_reason: 'string | null',
      stats: 'Stats',
      prefilling: 'Prefilling',
      events: 'json (start_completion: the OpenAI stream chunks)',
      result: 'json (start_completion, the last step: the whole OpenAI answer)',
    },
  },
  Prefilling: { fields: { done: 'int', total: 'int' } },
  Stats: {
    dataclass: 'ruvllm.text.stream.Stats',
    fields: {
      prompt_tokens: 'int',
      completion_tokens: 'int',
      prefill_ms: 'number',
      ttft_ms: 'number',
      decode_tok_s: 'number',
      cached_tokens: 'int',
    },
  },
  CompletionCheck: {
    dataclass: 'ruvllm.bridge.CompletionCheck',
    verbatim: true,
    note: 'made as JSON by the worker: an OpenAI body keeps its names (its schemas may hold any key)',
    fields: { kind: "'chat' | 'text'", body: 'object (an OpenAI request body)' },
  },
  CompletionSource: { fields: { source: 'json: {messages, tools} or {prompt}' } },
  CompletionStart: {
    dataclass: 'ruvllm.bridge.CompletionStart',
    verbatim: true,
    note: 'made as JSON by the worker, like CompletionCheck',
    fields: {
      kind: "'chat' | 'text'",
      body: 'object (an OpenAI request body)',
      prompt_ids: 'int[]',
      eos_ids: 'int[]',
      model: 'string',
    },
  },
  CacheStats: {
    fields: {
      hot_positions: 'int',
      hot_bytes: 'int',
      cold_positions: 'int',
      cold_bytes: 'int',
      cold_format: 'string',
      evicted_positions: 'int',
      seen_positions: 'int',
    },
  },
  // --- adapters and learning -----------------------------------------------------------------
  AdapterConfig: {
    dataclass: 'ruvllm.bridge.AdapterConfig',
    fields: { name: 'string', rank: 'int', alpha: 'number | null', targets: 'string[]', layers: 'int[] | null' },
  },
  AdapterMade: { fields: { name: 'string', rank: 'int', targets: 'string[]', layers: 'int[]' } },
  MixConfig: {
    dataclass: 'ruvllm.bridge.MixConfig',
    fields: {
      name: 'string',
      experts: 'string[]',
      top_k: 'int | null',
      depth: 'int',
      size: 'int',
      layerwise: 'boolean',
      temperature: 'number',
    },
  },
  Mixed: { fields: { name: 'string', experts: 'string[]', top_k: 'int | null' } },
  AdapterName: { dataclass: 'ruvllm.bridge.AdapterName', fields: { name: 'string | null' } },
  AdapterFiles: { fields: { files: 'string[]' } },
  AdapterList: {
    fields: {
      names: 'string[]',
      active: 'string | null',
      versions: 'Record<string, int>',
      learning: 'int',
      preparing: 'boolean',
      adapters: 'object[] (AdapterSet.describe)',
      decode_plan: 'boolean (whether a forward with the active one runs through the decode plan)',
      plan_note: 'string | null (why not: an X-LoRA mixture, or info.plan_note)',
    },
  },
  Lesson: {
    dataclass: 'ruvllm.bridge.LessonRequest',
    fields: {
      key: 'int (the adapt request id)',
      adapter: 'string',
      prompt_ids: 'int[]',
      completion_ids: 'int[]',
      reward: 'number',
      steps: 'int',
      lr: 'number',
      optimizer: 'string',
      ewc: 'number',
      until_greedy: 'boolean',
      rehearse: 'int',
      keep: 'number',
      project: 'number',
      keyed: 'boolean',
      budget_ms: 'number | null',
    },
  },
  LessonKey: { dataclass: 'ruvllm.bridge.LessonKey', fields: { key: 'int | null', budget_ms: 'number | null' } },
  Budget: { dataclass: 'ruvllm.bridge.Budget', fields: { budget_ms: 'number | null' } },
  LessonProgress: {
    note:
      "phase: 'waiting' (behind `ahead` other lessons), 'preparing' (its next step waits for the projection " +
      "job: `prepared` units), 'learning', 'rehearsing', 'done', 'cancelled' (cancel_learning) or 'dropped' " +
      '(its adapter was replaced: `note` says so); applied: its first step is taken (or was found not to be ' +
      "needed); outcome: why its steps ended (AdaptReport.outcome: 'already' is an answer greedy decoding " +
      'already gives), once known',
    fields: {
      key: 'int',
      phase: 'string',
      step: 'int',
      steps: 'int',
      rehearsed: 'int',
      version: 'int',
      done: 'boolean',
      applied: 'boolean',
      cancelled: 'boolean',
      outcome: 'string | null',
      elapsed_ms: 'number',
      prepared: 'Prefilling | null',
      ahead: 'int',
      note: 'string | null',
      report: 'AdaptReport | null',
    },
  },
  AdaptReport: {
    dataclass: 'ruvllm.learning.learn.AdaptReport',
    fields: {
      log_prob_before: 'number',
      log_prob_after: 'number',
      steps: 'int',
      step_ms: 'number',
      rehearsal_steps: 'int',
      wall_ms: 'number',
      outcome: 'string',
      tokens: 'int',
      reward: 'number',
      greedy: 'boolean | null',
      summary: 'string',
    },
  },
  Learned: {
    fields: { lessons: 'LessonProgress[]', waiting: 'int', preparing: 'boolean', prepared: 'Prefilling | null' },
  },
  Preparing: { fields: { preparing: 'boolean' } },
  Calibration: {
    dataclass: 'ruvllm.bridge.Calibration',
    fields: { ids: 'int[]', turns: 'int[][] (each a chat turn in the model template)' },
  },
  ChatTemplateSource: {
    dataclass: 'ruvllm.bridge.ChatTemplateSource',
    fields: { source: 'string | null (the template JavaScript renders with)' },
  },
  // --- not a bridge call: the JSON `ruvllm-js generate --json` prints, as `ruvllm generate --json` ----
  GenerateJson: {
    fields: {
      text: 'string',
      token_ids: 'int[]',
      prompt_token_ids: 'int[]',
      finish_reason: 'string | null',
      stats: 'Stats',
    },
  },
});

/** @type {Readonly<Record<string, Readonly<Record<string, BridgeCall>>>>} */
export const BRIDGE = Object.freeze({
  'ruvllm.bridge': {
    new_loader: { args: {}, returns: 'ModelLoader', hands: true },
  },
  ModelLoader: {
    start_kernels: { args: { choice: 'text' }, returns: 'KernelsStarted' },
    offer_kernel_threads: { args: { api: 'proxy' }, returns: 'true' },
    offer_gpu: { args: { api: 'proxy' }, returns: 'true' },
    set_options: { args: { options_json: 'LoadOptions', gguf: 'text | null (null: a folder)' }, returns: 'true' },
    next: { args: {}, returns: 'Want | null (null: every file is in)' },
    give_document: { args: { name: 'text', data: 'bytes | null (null: missing)' }, returns: 'true' },
    header_size: { args: { name: 'text', size: 'int', head: 'bytes' }, returns: 'int | null (null: read on)' },
    give_header: { args: { name: 'text', size: 'int', head: 'bytes' }, returns: 'MemoryPlan | null (after the last)' },
    gguf_documents: { args: {}, returns: 'GgufHeader' },
    begin_file: { args: { request_json: 'FileStart' }, returns: 'int (the size)' },
    write: { args: { name: 'text', chunk: 'bytes' }, returns: 'int (bytes received so far)' },
    finish_file: { args: { request_json: 'FileEnd' }, returns: 'FileDone' },
    build: { args: {}, returns: 'Built' },
    take_engine: { args: {}, returns: 'EngineHandle', hands: true },
  },
  EngineHandle: {
    start: { args: { request_json: 'Start' }, returns: 'Started' },
    check_completion: { args: { request_json: 'CompletionCheck' }, returns: 'CompletionSource' },
    start_completion: { args: { request_json: 'CompletionStart' }, returns: 'Started' },
    step: { args: {}, returns: 'Step' },
    stop: { args: {}, returns: 'true' },
    cache_stats: { args: {}, returns: 'CacheStats' },
    new_adapter: { args: { request_json: 'AdapterConfig' }, returns: 'AdapterMade' },
    feedback: { args: { request_json: 'Lesson' }, returns: 'LessonProgress' },
    first_step: { args: { request_json: 'LessonKey' }, returns: 'LessonProgress' },
    learn: { args: { request_json: 'Budget' }, returns: 'Learned' },
    prepare_learning: { args: {}, returns: 'Preparing' },
    cancel_learning: { args: { request_json: 'LessonKey' }, returns: 'Learned' },
    calibration_text: { args: {}, returns: 'string' },
    calibration_chat: { args: {}, returns: 'string[][] ([user message, answer] pairs)' },
    set_calibration: { args: { request_json: 'Calibration' }, returns: 'int (the ids kept)' },
    set_chat_template: { args: { request_json: 'ChatTemplateSource' }, returns: 'true' },
    load_adapter: {
      args: { request_json: 'AdapterName', config_json: 'json', weights: 'bytes', state: 'bytes | null' },
      returns: 'string (its name)',
    },
    load_mixture: {
      args: { request_json: 'AdapterName', config_json: 'json', router: 'bytes', experts: '*bytes' },
      returns: "string (its name); experts: each expert's adapter_config.json and weights, in the config's order",
    },
    mix_adapters: { args: { request_json: 'MixConfig' }, returns: 'Mixed' },
    set_adapter: { args: { request_json: 'AdapterName' }, returns: 'string | null' },
    adapter_files: { args: { request_json: 'AdapterName' }, returns: 'AdapterFiles' },
    take_files: { args: {}, returns: 'Record<string, bytes> (a PyProxy of a dict)', hands: true },
    adapter_names: { args: {}, returns: 'AdapterList' },
  },
});

/**
 * The requests the worker answers (caller -> worker; protocol.js says what each does), each with its
 * fields besides `type` and `id`. Their events: progress, loaded, chunk, result, learning, done, error.
 * @type {Readonly<Record<string, readonly string[]>>}
 */
export const WORKER_REQUESTS = Object.freeze({
  load: ['options'],
  generate: ['prompt', 'options'],
  chat: ['messages', 'options'],
  completion: ['kind', 'body'],
  tokenize: ['prompt', 'messages'],
  cache_stats: [],
  device_stats: [],
  abort: [],
  dispose: [],
  adapt: ['feedback'],
  adapters: [],
  new_adapter: ['config'],
  mix_adapters: ['config'],
  load_adapter: ['url', 'name'],
  set_adapter: ['name'],
  save_adapter: ['name'],
});

/**
 * The interfaces of types/index.d.ts that are these shapes as the JavaScript API hands them over (each
 * field by its JavaScript name), with the fields the worker keeps to itself (`omits`):
 * test/bridge-schema.test.js holds each interface to its shape, so a field added on one side is added on
 * the other.
 * @type {Readonly<Record<string, { shape: string, omits?: string[] }>>}
 */
export const PUBLIC_TYPES = Object.freeze({
  KVOptions: { shape: 'KVOptions' },
  MemoryPlan: { shape: 'MemoryPlan' },
  CacheStats: { shape: 'CacheStats' },
  Stats: { shape: 'Stats' },
  LearningProgress: { shape: 'LessonProgress', omits: ['key', 'cancelled', 'note', 'report'] },
  AdaptReport: { shape: 'AdaptReport' },
  AdapterList: { shape: 'AdapterList' },
  AdapterConfig: { shape: 'AdapterConfig' },
  MixOptions: { shape: 'MixConfig', omits: ['name', 'experts'] }, // (mixAdapters' own arguments)
});

/**
 * The Cache API store that model files are kept in, shared by the worker (files.js), the demo page's model
 * check (web/model-check.js) and Python's own fetch in any Pyodide (py_src/ruvllm/host.py MODELS_CACHE,
 * held to this by test/bridge-schema.test.js): a model downloaded by one is read from it by the others.
 */
export const MODELS_CACHE = 'ruvllm-models-v1';

/**
 * A model folder's files as py_src/ruvllm/files/layout.py names them (the one folder layout, which the
 * Python loader follows; test/bridge-schema.test.js holds these to it): the config the worker reads before
 * Pyodide boots, so a wrong location fails at once, the documents its text layer reads, and the files the
 * demo page's model check probes.
 */
export const FOLDER_FILES = Object.freeze({
  config: 'config.json',
  tokenizer: 'tokenizer.json',
  tokenizerConfig: 'tokenizer_config.json',
  generationConfig: 'generation_config.json',
  weights: 'model.safetensors',
  index: 'model.safetensors.index.json',
});

/** A Python name's JavaScript twin: snake_case -> camelCase. */
export const camelCase = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

/**
 * JavaScript name -> Python name, for every field with an underscore in a renamed shape (protocol.js's
 * table). A field of two shapes is one entry; a name used in a verbatim shape and a renamed one would
 * be renamed everywhere (renaming is by name, not by place), so the test refuses that.
 * @returns {Record<string, string>}
 */
export function pythonNames() {
  const names = {};
  for (const shape of Object.values(SHAPES)) {
    if (shape.verbatim) continue;
    for (const field of Object.keys(shape.fields)) if (field.includes('_')) names[camelCase(field)] = field;
  }
  return names;
}
