// Every public option is checked on the caller's thread before anything reaches the worker: a bad value
// is an 'invalid_argument' RuvLLMError naming the option, what it must be and what it was; an unknown
// name is refused with the known ones. Table-driven, over a stand-in worker that records what it gets.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { RuvLLM, RuvLLMError } from '../src/index.js';
import { describe as shown } from '../src/options.js';

/** A worker that answers every request at once: a chunk and done for generations, else a result. */
function standIn() {
  const listeners = [];
  const posted = [];
  const emit = (event) => setImmediate(() => listeners.forEach((fn) => fn(event)));
  return {
    posted,
    post(message) {
      structuredClone(message); // what postMessage does: a value that cannot be cloned throws here
      posted.push(message);
      const { id, type } = message;
      if (type === 'abort') return;
      if (['generate', 'chat'].includes(type)) {
        emit({ type: 'chunk', id, chunk: { text: 'ok', tokenId: 1, finishReason: 'length', stats: {} } });
      } else emit({ type: 'result', id, result: type });
      emit({ type: 'done', id });
    },
    onEvent: (fn) => listeners.push(fn),
    onFailure: () => {},
    setActive: () => {},
    terminate: async () => {},
  };
}

const USER = [{ role: 'user', content: 'hi' }];
const ALL_GENERATE =
  '; its options are: maxTokens, temperature, topK, topP, minP, repetitionPenalty, seed, ignoreEos, stop, adapter, signal';

async function refusal(call) {
  try {
    await call();
  } catch (error) {
    assert.ok(error instanceof RuvLLMError, `expected a RuvLLMError, got ${error?.name}: ${error?.message}`);
    assert.equal(error.type, 'invalid_argument', error.message);
    return error.message;
  }
  assert.fail('no error');
}

const generateCases = [
  [{ temperature: NaN }, 'options.temperature must be a finite number >= 0, got NaN'],
  [{ temperature: -0.5 }, 'options.temperature must be a finite number >= 0, got -0.5'],
  [{ temperature: '0.7' }, 'options.temperature must be a finite number >= 0, got "0.7"'],
  [{ temperature: Infinity }, 'options.temperature must be a finite number >= 0, got Infinity'],
  [{ maxTokens: 2 ** 64 }, 'options.maxTokens must be an integer in [1, 2^53 - 1], got 18446744073709552000'],
  [{ maxTokens: 0 }, 'options.maxTokens must be an integer in [1, 2^53 - 1], got 0'],
  [{ maxTokens: 1.5 }, 'options.maxTokens must be an integer in [1, 2^53 - 1], got 1.5'],
  [{ maxTokens: 10n }, 'options.maxTokens must be an integer in [1, 2^53 - 1], got 10n (a BigInt)'],
  [{ topK: -1 }, 'options.topK must be an integer in [0, 2^53 - 1], got -1'],
  [{ topP: 0 }, 'options.topP must be a finite number in (0, 1], got 0'],
  [{ topP: 1.5 }, 'options.topP must be a finite number in (0, 1], got 1.5'],
  [{ minP: 2 }, 'options.minP must be a finite number in [0, 1], got 2'],
  [{ repetitionPenalty: 0 }, 'options.repetitionPenalty must be a finite number > 0, got 0'],
  [{ seed: -1 }, 'options.seed must be an integer in [0, 2^53 - 1], got -1'],
  [{ seed: 2 ** 60 }, 'options.seed must be an integer in [0, 2^53 - 1], got 1152921504606847000'],
  [{ ignoreEos: 'yes' }, 'options.ignoreEos must be true or false, got "yes"'],
  [{ stop: ['\n', ''] }, 'options.stop[1] must be a non-empty string, got ""'],
  [{ stop: 5 }, 'options.stop must be a non-empty string or an array of them, got 5'],
  [{ adapter: '' }, 'options.adapter must be null or a non-empty string, got ""'],
  [{ signal: 'stop' }, 'options.signal must be an AbortSignal, got "stop"'],
  [{ onToken: () => {} }, `options.onToken is not an option of generate${ALL_GENERATE}`],
  [{ temprature: 0 }, `options.temprature is not an option of generate (did you mean temperature?)${ALL_GENERATE}`],
  [{ max_tokens: 8 }, `options.max_tokens is not an option of generate (did you mean maxTokens?)${ALL_GENERATE}`],
  ['fast', 'options must be an object, got "fast"'],
];

test('generate and chat refuse each bad option by name, before posting anything', async () => {
  const worker = standIn();
  const llm = new RuvLLM(worker);
  for (const [options, message] of generateCases) {
    assert.equal(await refusal(() => llm.generate('hi', options)), message);
    const chat = message.replace('of generate', 'of chat');
    assert.equal(await refusal(() => llm.chat(USER, options)), chat);
  }
  assert.deepEqual(worker.posted, []);
  // the same instance answers the next good request
  const chunks = [];
  for await (const c of llm.generate('hi', { maxTokens: 4, temperature: 0, stop: '\n', adapter: null })) chunks.push(c);
  assert.deepEqual(
    chunks.map((c) => c.text),
    ['ok'],
  );
  assert.deepEqual(worker.posted[0].options, { maxTokens: 4, temperature: 0, stop: '\n', adapter: null });
});

test('prompts and messages are checked element by element', async () => {
  const worker = standIn();
  const llm = new RuvLLM(worker);
  const cases = [
    [() => llm.generate(42), 'prompt must be a string or a non-empty array of token ids (integers >= 0), got 42'],
    [() => llm.generate(), 'prompt must be a string or a non-empty array of token ids (integers >= 0), got undefined'],
    [() => llm.generate([]), 'prompt must be a string or a non-empty array of token ids (integers >= 0), got []'],
    [() => llm.generate([1, -2]), 'prompt[1] must be an integer in [0, 2^53 - 1], got -2'],
    [() => llm.generate([1, NaN]), 'prompt[1] must be an integer in [0, 2^53 - 1], got NaN'],
    [() => llm.chat([]), 'messages must be a non-empty array of { role, content } strings, got []'],
    [() => llm.chat([{ role: 'user' }]), 'messages[0].content must be a string, got undefined'],
    [() => llm.chat([USER[0], 'hi']), 'messages[1] must be a { role, content } object, got "hi"'],
    [() => llm.tokenize(7), 'input must be a string (raw text) or an array of { role, content } messages, got 7'],
    [() => llm.tokenize([{ role: 1, content: 'x' }]), 'input[0].role must be a string, got 1'],
  ];
  for (const [call, message] of cases) assert.equal(await refusal(call), message);
  assert.deepEqual(worker.posted, []);
});

test('maxTokens is bounded by the context length, and a token prompt longer than it is refused', async () => {
  const worker = standIn();
  const llm = new RuvLLM(worker);
  llm.info = { contextLength: 64 }; // what RuvLLM.load sets from the worker's 'loaded' event
  assert.equal(
    await refusal(() => llm.generate('hi', { maxTokens: 65 })),
    'options.maxTokens must be an integer in [1, 64] (the context length), got 65',
  );
  assert.throws(
    () => llm.generate(Array(65).fill(1)),
    (e) => e.type === 'context_full' && e.message === 'the prompt has 65 tokens but the context window is 64',
  );
  assert.deepEqual(worker.posted, []);
  for await (const _ of llm.generate('hi', { maxTokens: 64 }));
  assert.equal(worker.posted.length, 1);
});

const loadCases = [
  [undefined, 'options must be an object, got undefined'],
  [
    {},
    /^options\.model must be the URL \(in Node also the path\) of a GGUF file or of a model folder.*, got undefined$/,
  ],
  [{ model: '' }, /^options\.model must be .*, got ""$/],
  [{ model: 'm/', memoryBudget: NaN }, 'options.memoryBudget must be an integer in [1, 2^53 - 1], got NaN'],
  [{ model: 'm/', memoryBudget: 1e300 }, 'options.memoryBudget must be an integer in [1, 2^53 - 1], got 1e+300'],
  [{ model: 'm/', memoryBudget: -1 }, 'options.memoryBudget must be an integer in [1, 2^53 - 1], got -1'],
  [{ model: 'm/', contextLength: 0 }, 'options.contextLength must be an integer in [1, 2^53 - 1], got 0'],
  [{ model: 'm/', contextLength: '512' }, 'options.contextLength must be an integer in [1, 2^53 - 1], got "512"'],
  [
    { model: 'm/', sha256: { 'model.safetensors': 'x' } },
    'options.sha256["model.safetensors"] must be a sha256 digest (64 hex digits), got "x"',
  ],
  [
    { model: 'm/', sha256: 'ab'.repeat(32) },
    'options.sha256 must be an object of file name: sha256 digest (64 hex digits), got "abababababababababababababababababababab"... (64 characters)',
  ],
  [{ model: 'm/', cache: 'no' }, 'options.cache must be true or false, got "no"'],
  [{ model: 'm/', compute: 'int4' }, 'options.compute must be one of auto, f32, q8, q4, got "int4"'],
  [{ model: 'm/', kernels: 'simd' }, 'options.kernels must be one of auto, wasm, numpy, got "simd"'],
  [{ model: 'm/', arithmetic: 'int8' }, 'options.arithmetic must be one of exact, fast, got "int8"'],
  [{ model: 'm/', plan: 'no' }, 'options.plan must be true or false, got "no"'],
  [{ model: 'm/', device: 'gpu' }, 'options.device must be one of auto, webgpu, cpu, got "gpu"'],
  [{ model: 'm/', threads: 0 }, "options.threads must be 'auto' or an integer in [1, 64], got 0"],
  [{ model: 'm/', threads: 65 }, "options.threads must be 'auto' or an integer in [1, 64], got 65"],
  [{ model: 'm/', threads: 2.5 }, "options.threads must be 'auto' or an integer in [1, 64], got 2.5"],
  [{ model: 'm/', threads: 'all' }, 'options.threads must be \'auto\' or an integer in [1, 64], got "all"'],
  [{ model: 'm/', chatTemplate: 42 }, 'options.chatTemplate must be a non-empty string, got 42'],
  [
    { model: 'm/', hfEndpoint: 'huggingface.co' },
    'options.hfEndpoint must be an http:// or https:// URL, got "huggingface.co"',
  ],
  [{ model: 'm/', onProgress: true }, 'options.onProgress must be a function, got true'],
  [{ model: 'm/', signal: {} }, 'options.signal must be an AbortSignal, got {}'],
  [{ model: 'm/', pyodide: '/p' }, 'options.pyodide must be an object, got "/p"'],
  [
    { model: 'm/', pyodide: { indexUrl: '/p' } },
    'options.pyodide.indexUrl is not an option of pyodide (did you mean indexURL?); its options are: indexURL',
  ],
  [{ model: 'm/', kv: { hotTokens: 1.5 } }, 'options.kv.hotTokens must be an integer in [1, 2^53 - 1], got 1.5'],
  [{ model: 'm/', kv: { cold: 'int2' } }, 'options.kv.cold must be one of int8, int4, got "int2"'],
  [{ model: 'm/', kv: { keep: -1 } }, 'options.kv.keep must be an integer in [0, 2^53 - 1], got -1'],
  [
    { model: 'm/', kv: { budgetBytes: 1 << 20 } },
    'options.kv.budgetBytes needs options.kv.hotTokens: only positions older than the hot ones can be dropped',
  ],
  [
    { model: 'm/', kv: { hot: 4 } },
    'options.kv.hot is not an option of kv; its options are: hotTokens, cold, budgetBytes, keep',
  ],
  [{ model: 'm/', stallTimeoutMs: 0 }, 'options.stallTimeoutMs must be an integer in [1, 2147483647], got 0'],
  [
    { model: 'm/', stallTimeoutMs: 2 ** 31 },
    'options.stallTimeoutMs must be an integer in [1, 2147483647], got 2147483648',
  ],
  [
    { model: 'm/', context_length: 512 },
    /^options\.context_length is not an option of RuvLLM\.load \(did you mean contextLength\?\); its options are: model, hfEndpoint, .*, stallTimeoutMs$/,
  ],
  [{ model: 'hf:just-a-name' }, /is not a hub name: .*hf:OWNER\/REPO/],
];

test('RuvLLM.load refuses each bad option by name before a worker is started', async () => {
  // each case would otherwise start a worker whose load fails on the missing model 'm/'
  for (const [options, expected] of loadCases) {
    const message = await refusal(() => RuvLLM.load(options));
    if (typeof expected === 'string') assert.equal(message, expected);
    else assert.match(message, expected);
  }
});

test('adapt, the adapter calls and the OpenAI calls refuse bad arguments by name', async () => {
  const worker = standIn();
  const llm = new RuvLLM(worker);
  const lesson = { prompt: 'Q', completion: 'A' };
  const cases = [
    [() => llm.adapt(), 'feedback must be an object, got undefined'],
    [
      () => llm.adapt({ completion: 'A' }),
      'feedback needs either prompt (raw text) or messages (a conversation) before its completion, got neither',
    ],
    [
      () => llm.adapt({ ...lesson, messages: USER }),
      'feedback needs either prompt (raw text) or messages (a conversation) before its completion, got both',
    ],
    [() => llm.adapt({ prompt: 'Q' }), 'feedback.completion must be a non-empty string, got undefined'],
    [() => llm.adapt({ ...lesson, reward: 0 }), 'feedback.reward must be a finite number other than 0, got 0'],
    [() => llm.adapt({ ...lesson, reward: NaN }), 'feedback.reward must be a finite number other than 0, got NaN'],
    [() => llm.adapt({ ...lesson, steps: 0 }), 'feedback.steps must be an integer in [1, 2^53 - 1], got 0'],
    [() => llm.adapt({ ...lesson, lr: 10 }), 'feedback.lr must be a finite number in (0, 10), got 10'],
    [() => llm.adapt({ ...lesson, project: 1 }), 'feedback.project must be a finite number in [0, 1), got 1'],
    [() => llm.adapt({ ...lesson, optimizer: 'sgdm' }), 'feedback.optimizer must be one of sgd, adam, got "sgdm"'],
    [
      () => llm.adapt({ ...lesson, stpes: 3 }),
      'feedback.stpes is not an option of adapt (did you mean steps?); its options are: prompt, messages, completion, reward, adapter, steps, lr, optimizer, ewc, untilGreedy, rehearse, keep, project, keyed',
    ],
    [() => llm.adapt(lesson, { onProgress: 1 }), 'options.onProgress must be a function, got 1'],
    [() => llm.newAdapter({ rank: 0 }), 'config.rank must be an integer in [1, 2^53 - 1], got 0'],
    [
      () => llm.newAdapter({ targets: ['q_proj', 'x_proj'] }),
      'config.targets[1] must be one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head, got "x_proj"',
    ],
    [
      () => llm.newAdapter({ layers: [] }),
      'config.layers must be null or a non-empty array of layer indexes (integers), got []',
    ],
    [() => llm.newAdapter({ alpha: -1 }), 'config.alpha must be a finite number > 0, got -1'],
    [() => llm.mixAdapters('', ['a']), 'name must be a non-empty string, got ""'],
    [() => llm.mixAdapters('m', []), 'experts must be a non-empty array of adapter names, got []'],
    [() => llm.mixAdapters('m', ['a', 2]), 'experts[1] must be a non-empty string, got 2'],
    [() => llm.mixAdapters('m', ['a'], { topK: 0 }), 'options.topK must be an integer in [1, 2^53 - 1], got 0'],
    [() => llm.mixAdapters('m', ['a'], { temperature: 0 }), 'options.temperature must be a finite number > 0, got 0'],
    [() => llm.loadAdapter(''), 'url must be a non-empty string (a URL, in Node also a path), got ""'],
    [() => llm.loadAdapter('/a/', { name: 3 }), 'options.name must be a non-empty string, got 3'],
    [() => llm.setAdapter(5), 'name must be null or a non-empty string, got 5'],
    [() => llm.saveAdapter(''), 'name must be a non-empty string, got ""'],
    [
      () => llm.chat.completions.create({ messages: USER, temperature: NaN }),
      'body.temperature must be a finite number, got NaN',
    ],
    [
      () => llm.chat.completions.create({ messages: USER, max_tokens: Infinity }),
      'body.max_tokens must be a finite number, got Infinity',
    ],
    [
      () => llm.completions.create({ prompt: 'x', stop: [undefined] }),
      'body.stop[0] must be a JSON value (a string, finite number, boolean, null, array or plain object), got undefined',
    ],
    [
      () => llm.chat.completions.create({ messages: USER, seed: 3n }),
      'body.seed must be a JSON value (a string, finite number, boolean, null, array or plain object), got 3n (a BigInt)',
    ],
    [
      () => llm.chat.completions.create({ messages: USER, metadata: new Map() }),
      'body.metadata must be a JSON value (a string, finite number, boolean, null, array or plain object), got a Map',
    ],
    [
      () => llm.completions.create({ prompt: 'x' }, { signl: AbortSignal.timeout(1000) }),
      'options.signl is not an option of completions.create (did you mean signal?); its options are: signal',
    ],
    [() => llm.completions.create('x'), 'completions.create needs a request body: an object with prompt, got "x"'],
  ];
  for (const [call, message] of cases) assert.equal(await refusal(call), message);
  const cyclic = { messages: USER };
  cyclic.self = cyclic;
  assert.equal(
    await refusal(() => llm.chat.completions.create(cyclic)),
    'body.self contains itself (a cycle), which JSON cannot carry',
  );
  assert.deepEqual(worker.posted, []);
  // undefined members are left out (as JSON and the OpenAI SDK do); the instance still answers
  assert.equal(await llm.completions.create({ prompt: 'x', user: undefined }), 'completion');
  assert.deepEqual(worker.posted[0].body, { prompt: 'x' });
  assert.equal(await llm.newAdapter({ name: 'a', rank: 2, layers: [-1] }), 'new_adapter');
  // null, "every layer", as documented (its check used to read null's elements: a TypeError)
  assert.equal(await llm.newAdapter({ name: 'b', layers: null }), 'new_adapter');
  assert.equal(worker.posted.at(-1).config.layers, null);
});

test('a value that cannot be posted is a typed error, not a DataCloneError', async () => {
  const worker = standIn();
  worker.post = () => {
    throw new DOMException('function could not be cloned', 'DataCloneError');
  };
  const llm = new RuvLLM(worker);
  await assert.rejects(
    () => llm.cacheStats(),
    (e) =>
      e instanceof RuvLLMError &&
      e.type === 'invalid_argument' &&
      e.message === 'the cache_stats request cannot be sent to the worker: function could not be cloned',
  );
});

test('values are shown as they are: short, and exact about what they are', () => {
  assert.equal(shown(NaN), 'NaN');
  assert.equal(shown(-Infinity), '-Infinity');
  assert.equal(shown(null), 'null');
  assert.equal(
    shown(() => 1),
    'a function',
  );
  assert.equal(shown(new Date(0)), 'a Date');
  assert.equal(shown([1, 2]), '[1,2]');
  assert.equal(shown(Array(100).fill(1)), 'an array of 100 items');
  assert.equal(shown('x'.repeat(5e6)), `"${'x'.repeat(40)}"... (5,000,000 characters)`);
});
