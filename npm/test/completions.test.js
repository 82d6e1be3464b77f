// OpenAI's shapes in the JS API: llm.chat.completions.create and llm.completions.create. First the facade
// over a stand-in worker; then the real SmolLM2 in Pyodide under Node against CPython's
// Model.create_chat_completion / create_completion, which needs a local Pyodide distribution
// (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1) and is skipped, saying how to get one, without it.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { AbortError, RuvLLM, RuvLLMError } from '../src/index.js';
import { DIST, HAVE_DIST } from './support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct');
const QWEN_TEMPLATE = join(ROOT, 'tests', 'data', 'tool_templates', 'qwen2_5.jinja');
const PYTHON = process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python');
const SKIP = HAVE_DIST
  ? false
  : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`;
const PYODIDE = { indexURL: DIST };

const user = (content) => [{ role: 'user', content }];

async function collect(stream) {
  const items = [];
  for await (const item of stream) items.push(item);
  return items;
}

// --- the facade, over a stand-in worker -------------------------------------------------------------

/** A worker that answers each request with `answer(request)`: the events to send back, in order. */
function standIn(answer) {
  const listeners = [];
  const posted = [];
  return {
    posted,
    post(message) {
      posted.push(message);
      if (message.type === 'abort') return;
      for (const event of answer(message))
        setImmediate(() => listeners.forEach((fn) => fn({ ...event, id: message.id })));
    },
    onEvent: (fn) => listeners.push(fn),
    onFailure: () => {},
    setActive: () => {},
    terminate: async () => {},
  };
}

const ANSWER = { object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'Hi' } }] };
const STREAM = [
  { type: 'chunk', chunk: { object: 'chat.completion.chunk', choices: [{ delta: { role: 'assistant' } }] } },
  { type: 'chunk', chunk: { object: 'chat.completion.chunk', choices: [{ delta: { content: 'Hi' } }] } },
  { type: 'result', result: ANSWER },
  { type: 'done' },
];

describe('the facade of OpenAI completions', () => {
  test('chat stays a function for ruvllm chunks and gains completions.create', async () => {
    const worker = standIn((m) =>
      m.type === 'chat'
        ? [{ type: 'chunk', chunk: { text: 'Hi', tokenId: 1, finishReason: 'stop' } }, { type: 'done' }]
        : [{ type: 'result', result: ANSWER }, { type: 'done' }],
    );
    const llm = new RuvLLM(worker);
    const chunks = await collect(llm.chat(user('hi'), { maxTokens: 4 }));
    assert.deepEqual(
      chunks.map((c) => c.text),
      ['Hi'],
    );
    assert.deepEqual(await llm.chat.completions.create({ messages: user('hi') }), ANSWER);
    assert.deepEqual(await llm.completions.create({ prompt: 'hi' }), ANSWER);
    assert.deepEqual(
      worker.posted.map((m) => [m.type, m.kind]),
      [
        ['chat', undefined],
        ['completion', 'chat'],
        ['completion', 'text'],
      ],
    );
  });

  test('a body is sent with its names as they are, as JSON has it', async () => {
    const worker = standIn(() => [{ type: 'result', result: ANSWER }, { type: 'done' }]);
    const llm = new RuvLLM(worker);
    const schema = { type: 'object', properties: { maxTokens: { type: 'integer' } } };
    const json = {
      messages: user('hi'),
      max_tokens: 8,
      top_p: 0.5,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
    };
    // Members that are undefined are left out, as JSON.stringify (and the OpenAI SDK) leave them out.
    await llm.chat.completions.create({ ...json, user: undefined });
    const { id, ...sent } = worker.posted[0];
    assert.ok(Number.isInteger(id));
    assert.deepEqual(sent, { type: 'completion', kind: 'chat', body: json });
  });

  test('a body without its prompt is refused before anything is sent', async () => {
    const worker = standIn(() => [{ type: 'done' }]);
    const llm = new RuvLLM(worker);
    const refused = async (call, message) =>
      assert.rejects(call, (e) => e instanceof RuvLLMError && e.type === 'invalid_argument' && message.test(e.message));
    await refused(
      llm.chat.completions.create({ prompt: 'hi' }),
      /^chat\.completions\.create needs a request body: an object with messages, got \{"prompt":"hi"\}$/,
    );
    await refused(llm.chat.completions.create(user('hi')), /needs a request body/);
    await refused(
      llm.completions.create(null),
      /^completions\.create needs a request body: an object with prompt, got null$/,
    );
    // What JSON would change or drop is refused, naming the field: never sent as a silent default
    await refused(llm.completions.create({ prompt: 'x', seed: 1n }), /^body\.seed must be a JSON value .*got 1n/);
    await refused(
      llm.chat.completions.create({ messages: user('hi'), onToken: () => {} }),
      /^body\.onToken must be a JSON value \(a string, finite number, boolean, null, array or plain object\), got a function$/,
    );
    await refused(
      llm.chat.completions.create({ messages: user('hi'), top_p: NaN }),
      /^body\.top_p must be a finite number, got NaN$/,
    );
    await assert.rejects(
      llm.chat.completions.create({ messages: user('hi') }, { signal: AbortSignal.abort() }),
      AbortError,
    );
    assert.deepEqual(worker.posted, []);
  });

  test('with stream, the promise gives an AsyncIterable of the chunks; an error before the first rejects it', async () => {
    const llm = new RuvLLM(standIn(() => STREAM));
    const stream = await llm.chat.completions.create({ messages: user('hi'), stream: true });
    assert.deepEqual(
      await collect(stream),
      STREAM.slice(0, 2).map((e) => e.chunk),
    );
    const refusing = new RuvLLM(
      standIn(() => [{ type: 'error', error: { type: 'invalid_argument', message: "unsupported field 'x'" } }]),
    );
    await assert.rejects(
      refusing.chat.completions.create({ messages: user('hi'), stream: true, x: 1 }),
      (e) => e.type === 'invalid_argument' && e.message === "unsupported field 'x'",
    );
  });
});

// --- SmolLM2 in Pyodide, against CPython ------------------------------------------------------------

const CPYTHON = `
import json, sys
import ruvllm

spec = json.loads(sys.argv[1])
extra = {"chat_template": open(spec["template"]).read()} if spec.get("template") else {}
model = ruvllm.load(spec["model"], **extra)
answers = []
for kind, body in spec["requests"]:
    body = dict(body)
    if kind == "chat":
        answer = model.create_chat_completion(body.pop("messages"), **body)
    else:
        answer = model.create_completion(body.pop("prompt"), **body)
    answers.append(list(answer) if body.get("stream") else answer)
print(json.dumps(answers))
`;

/** CPython's answers to `requests` ([kind, body] pairs), in order, from one model load. */
async function cpython(requests, template = null) {
  const spec = JSON.stringify({ model: MODEL, template, requests });
  const { stdout } = await promisify(execFile)(PYTHON, ['-c', CPYTHON, spec], { maxBuffer: 1 << 24 });
  return JSON.parse(stdout);
}

/** Usage without prompt_tokens_details.cached_tokens, which depends on the requests before. */
const counts = ({ prompt_tokens, completion_tokens, total_tokens }) => ({
  prompt_tokens,
  completion_tokens,
  total_tokens,
});

const GREEDY_CHAT = { messages: user('What is the capital of France?'), max_tokens: 24, temperature: 0 };
const STREAMED_CHAT = { ...GREEDY_CHAT, stream: true, stream_options: { include_usage: true } };
const GREEDY_TEXT = { prompt: 'Once upon a time', max_tokens: 16, temperature: 0 };

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 20 }, unit: { enum: ['celsius', 'fahrenheit'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const TIME = {
  type: 'function',
  function: {
    name: 'get_time',
    parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 12 } } },
  },
};
const TOOL_CALL = {
  messages: user('What is the weather in Paris?'),
  tools: [WEATHER, TIME],
  tool_choice: 'required',
  temperature: 0,
  max_tokens: 120,
};
// The conversation after the call: the assistant's call (content null) and the tool's answer.
const AFTER_TOOL = {
  messages: [
    ...user('What is the weather in Paris?'),
    {
      role: 'assistant',
      content: null,
      tool_calls: [
        {
          id: 'call_1',
          type: 'function',
          function: { name: 'get_weather', arguments: '{"city": "Paris", "unit": "celsius"}' },
        },
      ],
    },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21, "sky": "clear"}' },
  ],
  tools: [WEATHER, TIME],
  tool_choice: 'none',
  temperature: 0,
  max_tokens: 24,
};

describe('OpenAI completions of SmolLM2 in Pyodide under Node', { skip: SKIP }, () => {
  let llm; // the model's own chat template
  let tooled; // Qwen2.5's tool-calling chat template
  let expected; // CPython's answers, by name
  before(async () => {
    const template = await readFile(QWEN_TEMPLATE, 'utf8');
    const [plain, tools] = await Promise.all([
      cpython([
        ['chat', GREEDY_CHAT],
        ['chat', STREAMED_CHAT],
        ['text', GREEDY_TEXT],
        ['chat', AFTER_TOOL],
      ]),
      cpython(
        [
          ['chat', TOOL_CALL],
          ['chat', AFTER_TOOL],
        ],
        QWEN_TEMPLATE,
      ),
      (async () => {
        llm = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE });
        tooled = await RuvLLM.load({ model: MODEL, pyodide: PYODIDE, chatTemplate: template });
      })(),
    ]);
    const [chat, streamed, text, afterToolOwn] = plain;
    const [toolCall, afterTool] = tools;
    expected = { chat, streamed, text, toolCall, afterTool, afterToolOwn };
  });
  after(async () => Promise.all([llm?.dispose(), tooled?.dispose()]));

  test('a greedy chat completion equals CPython: content, finish_reason, usage', async () => {
    const answer = await llm.chat.completions.create(GREEDY_CHAT);
    const [choice] = answer.choices;
    const [want] = expected.chat.choices;
    assert.match(answer.id, /^chatcmpl-[0-9a-f]{24}$/);
    assert.equal(answer.object, 'chat.completion');
    assert.equal(answer.model, 'smollm2-135m-instruct');
    assert.equal(answer.model, expected.chat.model);
    assert.ok(Number.isInteger(answer.created));
    assert.deepEqual(choice.message, want.message);
    assert.equal(choice.message.content, 'The capital of France is Paris.');
    assert.equal(choice.finish_reason, want.finish_reason);
    assert.equal(choice.logprobs, null);
    assert.deepEqual(counts(answer.usage), counts(expected.chat.usage));
  });

  test('a streamed chat completion gives the same deltas as CPython, role first and usage last', async () => {
    const chunks = await collect(await llm.chat.completions.create(STREAMED_CHAT));
    const deltas = (list) => list.flatMap((c) => c.choices.map((choice) => choice.delta));
    assert.deepEqual(deltas(chunks), deltas(expected.streamed));
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    const text = deltas(chunks)
      .map((d) => d.content ?? '')
      .join('');
    assert.equal(text, expected.chat.choices[0].message.content);
    assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === chunks[0].id));
    const [finishing, last] = chunks.slice(-2);
    assert.equal(finishing.choices[0].finish_reason, 'stop');
    assert.deepEqual(last.choices, []);
    assert.deepEqual(counts(last.usage), counts(expected.chat.usage));
  });

  test('a text completion equals CPython, streamed or not', async () => {
    const answer = await llm.completions.create(GREEDY_TEXT);
    assert.equal(answer.object, 'text_completion');
    assert.match(answer.id, /^cmpl-[0-9a-f]{24}$/);
    assert.deepEqual(answer.choices, expected.text.choices);
    assert.deepEqual(counts(answer.usage), counts(expected.text.usage));
    const chunks = await collect(await llm.completions.create({ ...GREEDY_TEXT, stream: true }));
    assert.equal(chunks.map((c) => c.choices[0].text).join(''), expected.text.choices[0].text);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
  });

  test('json_schema output at temperature 1 parses and keeps the schema (keys no table renames)', async () => {
    // Property names that are also keys of protocol.js's renaming table: they must arrive as written.
    const schema = {
      type: 'object',
      properties: {
        name: { type: 'string', minLength: 1, maxLength: 12 },
        maxTokens: { type: 'integer', minimum: 1, maximum: 64 },
        finishReason: { enum: ['stop', 'length'] },
        prompt_tokens: { type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 10 },
      },
      required: ['name', 'maxTokens', 'finishReason', 'prompt_tokens'],
      additionalProperties: false,
    };
    const response_format = { type: 'json_schema', json_schema: { name: 'settings', schema } };
    for (const seed of [0, 1, 2]) {
      const answer = await llm.chat.completions.create({
        messages: user('Describe the settings of a request as JSON.'),
        response_format,
        temperature: 1,
        seed,
        max_tokens: 200,
      });
      const { message, finish_reason } = answer.choices[0];
      assert.equal(finish_reason, 'stop', message.content);
      const value = JSON.parse(message.content);
      assert.deepEqual(Object.keys(value).sort(), ['finishReason', 'maxTokens', 'name', 'prompt_tokens']);
      assert.ok(typeof value.name === 'string' && value.name.length >= 1 && value.name.length <= 12, value.name);
      assert.ok(Number.isInteger(value.maxTokens) && value.maxTokens >= 1 && value.maxTokens <= 64, message.content);
      assert.ok(['stop', 'length'].includes(value.finishReason), message.content);
      assert.ok(Number.isInteger(value.prompt_tokens) && value.prompt_tokens > 0 && value.prompt_tokens < 10);
    }
  });

  test('a required tool call is parsed into tool_calls, equal to CPython with the same template', async () => {
    const answer = await tooled.chat.completions.create(TOOL_CALL);
    const [choice] = answer.choices;
    const [want] = expected.toolCall.choices;
    assert.equal(choice.finish_reason, 'tool_calls');
    const [call] = choice.message.tool_calls;
    assert.match(call.id, /^call_/);
    assert.equal(call.type, 'function');
    assert.ok(['get_weather', 'get_time'].includes(call.function.name), call.function.name);
    assert.equal(typeof JSON.parse(call.function.arguments), 'object');
    assert.deepEqual(
      choice.message.tool_calls.map((c) => c.function),
      want.message.tool_calls.map((c) => c.function),
    );
    assert.equal(choice.message.content, want.message.content);
    assert.deepEqual(counts(answer.usage), counts(expected.toolCall.usage));
  });

  test('a conversation with a tool call (content null) and a tool message renders as in CPython', async () => {
    const answer = await tooled.chat.completions.create(AFTER_TOOL);
    assert.deepEqual(answer.choices, expected.afterTool.choices);
    assert.deepEqual(counts(answer.usage), counts(expected.afterTool.usage)); // the same prompt tokens
  });

  test("a tool's result reaches a template that does not write tools itself (SmolLM2's) as in CPython", async () => {
    // (SmolLM2's template failed on the call's content null: a 400 about tokenizer_config.json, issue 35)
    const answer = await llm.chat.completions.create(AFTER_TOOL);
    assert.deepEqual(answer.choices, expected.afterToolOwn.choices);
    assert.deepEqual(counts(answer.usage), counts(expected.afterToolOwn.usage));
    assert.equal(answer.choices[0].message.role, 'assistant');
    assert.equal(typeof answer.choices[0].message.content, 'string');
  });

  test('an unknown field is an invalid_argument error naming it, streamed or not', async () => {
    for (const stream of [false, true]) {
      await assert.rejects(
        llm.chat.completions.create({ ...GREEDY_CHAT, stream, max_tokenz: 5 }),
        (e) => e instanceof RuvLLMError && e.type === 'invalid_argument' && /'max_tokenz'/.test(e.message),
      );
    }
    await assert.rejects(
      llm.completions.create({ ...GREEDY_TEXT, best_of: 2 }),
      (e) => e.type === 'invalid_argument' && /unsupported field 'best_of'/.test(e.message),
    );
  });

  test('an abort in the middle of a stream is an AbortError, and the model answers the next request', async () => {
    const controller = new AbortController();
    const body = { ...GREEDY_CHAT, max_tokens: 200, ignore_eos: true, stream: true };
    const stream = await llm.chat.completions.create(body, { signal: controller.signal });
    let seen = 0;
    await assert.rejects(
      async () => {
        for await (const _ of stream) if (++seen === 3) controller.abort();
      },
      (e) => e instanceof AbortError,
    );
    assert.equal(seen, 3);
    const answer = await llm.chat.completions.create(GREEDY_CHAT);
    assert.deepEqual(answer.choices, expected.chat.choices);
  });
});
