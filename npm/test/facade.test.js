// The facade over a scripted stand-in worker: streaming, aborts, errors, and worker failures.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { AbortError, RuvLLM, RuvLLMError } from '../src/index.js';

/** Answers like the real worker: one chunk per `tick` ms, an abort honoured before the next chunk. */
function scriptedWorker({ tokens = 50, tick = 5, failWith = null } = {}) {
  const listeners = { event: [], failure: [] };
  const posted = [];
  const aborted = new Set();
  const emit = (event) => setImmediate(() => listeners.event.forEach((fn) => fn(event)));
  return {
    posted,
    failNow: (reason) => listeners.failure.forEach((fn) => fn(reason)),
    post(message) {
      posted.push(message);
      const { id, type } = message;
      if (type === 'abort') return aborted.add(id);
      if (type === 'dispose') return emit({ type: 'done', id });
      if (failWith) return emit({ type: 'error', id, error: failWith });
      let n = 0;
      const timer = setInterval(() => {
        if (aborted.has(id)) {
          clearInterval(timer);
          return emit({ type: 'error', id, error: { type: 'abort', message: 'generation aborted' } });
        }
        n += 1;
        const finishReason = n === tokens ? 'length' : null;
        emit({ type: 'chunk', id, chunk: { text: `t${n} `, tokenId: n, finishReason, stats: {} } });
        if (finishReason) {
          clearInterval(timer);
          emit({ type: 'done', id });
        }
      }, tick);
    },
    onEvent: (fn) => listeners.event.push(fn),
    onFailure: (fn) => listeners.failure.push(fn),
    setActive: () => {},
    terminate: async () => {},
  };
}

test('chunks stream in order until the finish reason', async () => {
  const llm = new RuvLLM(scriptedWorker({ tokens: 5 }));
  const chunks = [];
  for await (const c of llm.generate('hi', { maxTokens: 5 })) chunks.push(c);
  assert.deepEqual(
    chunks.map((c) => c.tokenId),
    [1, 2, 3, 4, 5],
  );
  assert.equal(chunks.at(-1).finishReason, 'length');
});

test('an AbortSignal ends the stream with an AbortError and tells the worker', async () => {
  const worker = scriptedWorker({ tokens: 1000 });
  const llm = new RuvLLM(worker);
  const controller = new AbortController();
  const got = [];
  await assert.rejects(
    (async () => {
      for await (const c of llm.generate('hi', { signal: controller.signal })) {
        got.push(c);
        if (got.length === 3) controller.abort();
      }
    })(),
    (e) => e instanceof AbortError && e.name === 'AbortError',
  );
  assert.equal(got.length, 3);
  const generate = worker.posted.find((m) => m.type === 'generate');
  assert.ok(worker.posted.some((m) => m.type === 'abort' && m.id === generate.id));
});

test('an already aborted signal refuses to start', async () => {
  const llm = new RuvLLM(scriptedWorker());
  const iterator = llm.generate('hi', { signal: AbortSignal.abort() })[Symbol.asyncIterator]();
  await assert.rejects(iterator.next(), AbortError);
});

test('breaking out of the loop aborts the request in the worker', async () => {
  const worker = scriptedWorker({ tokens: 1000 });
  const llm = new RuvLLM(worker);
  for await (const c of llm.chat([{ role: 'user', content: 'hi' }])) if (c.tokenId === 2) break;
  const request = worker.posted.find((m) => m.type === 'chat');
  assert.deepEqual(request.messages, [{ role: 'user', content: 'hi' }]);
  assert.ok(worker.posted.some((m) => m.type === 'abort' && m.id === request.id));
});

test('worker errors arrive as RuvLLMError with their type', async () => {
  const llm = new RuvLLM(
    scriptedWorker({
      failWith: { type: 'context_full', message: 'the prompt has 9000 tokens but the context window is 4096' },
    }),
  );
  await assert.rejects(
    async () => {
      for await (const _ of llm.generate('long')) assert.fail('no chunk expected');
    },
    (e) =>
      e instanceof RuvLLMError &&
      e.type === 'context_full' &&
      e.message === 'the prompt has 9000 tokens but the context window is 4096',
  );
});

test('bad arguments are refused before anything is sent', async () => {
  const worker = scriptedWorker();
  const llm = new RuvLLM(worker);
  assert.throws(
    () => llm.generate(42),
    (e) => e.type === 'invalid_argument' && /prompt must be a string or a non-empty array of token ids/.test(e.message),
  );
  assert.throws(
    () => llm.chat([{ role: 'user' }]),
    (e) => e.type === 'invalid_argument' && e.message === 'messages[0].content must be a string, got undefined',
  );
  await assert.rejects(
    RuvLLM.load({}),
    (e) =>
      e.type === 'invalid_argument' &&
      /options.model must be the URL .* of a GGUF file or of a model folder/.test(e.message),
  );
  await assert.rejects(RuvLLM.load({ model: 'x', contextLength: -1 }), (e) => e.type === 'invalid_argument');
  await assert.rejects(
    RuvLLM.load({ model: 'x', kernels: 'simd' }),
    (e) =>
      e.type === 'invalid_argument' && e.message === 'options.kernels must be one of auto, wasm, numpy, got "simd"',
  );
  await assert.rejects(
    RuvLLM.load({ model: 'x', arithmetic: 'int8' }),
    (e) => e.type === 'invalid_argument' && e.message === 'options.arithmetic must be one of exact, fast, got "int8"',
  );
  await assert.rejects(
    RuvLLM.load({ model: 'hf:just-a-name' }),
    (e) => e.type === 'invalid_argument' && /hf:OWNER\/REPO/.test(e.message),
  );
  await assert.rejects(
    RuvLLM.load({ model: 'x', chatTemplate: 42 }),
    (e) => e.type === 'invalid_argument' && e.message === 'options.chatTemplate must be a non-empty string, got 42',
  );
  await assert.rejects(RuvLLM.load({ model: 'x', signal: AbortSignal.abort() }), AbortError);
  assert.equal(worker.posted.length, 0);
});

test('a crashed worker fails the stream, and every later call, with an inference error', async () => {
  const worker = scriptedWorker({ tokens: 1000, tick: 20 });
  const llm = new RuvLLM(worker);
  await assert.rejects(
    async () => {
      for await (const c of llm.generate('hi')) if (c.tokenId === 1) worker.failNow('exited with code 7');
    },
    (e) =>
      e instanceof RuvLLMError &&
      e.type === 'inference' &&
      e.message === 'the ruvllm worker stopped: exited with code 7',
  );
  await assert.rejects(llm.tokenize('x'), /the ruvllm worker stopped/);
});

test('dispose ends the worker; the model cannot be used after', async () => {
  const worker = scriptedWorker();
  const llm = new RuvLLM(worker);
  await llm.dispose();
  assert.ok(worker.posted.some((m) => m.type === 'dispose'));
  await assert.rejects(llm.tokenize('x'), (e) => e.message === 'this model was disposed');
});
