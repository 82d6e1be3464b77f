import assert from 'node:assert/strict';
import { test } from 'node:test';

import { AbortError, RuvLLMError, deserializeError, serializeError, unwrap } from '../src/errors.js';
import { REQUESTS, checkRequest, newId } from '../src/protocol.js';

test('request ids are unique integers', () => {
  const ids = new Set(Array.from({ length: 100 }, newId));
  assert.equal(ids.size, 100);
  for (const id of ids) assert.ok(Number.isInteger(id));
});

test('well-formed requests pass, others are refused by name', () => {
  for (const type of REQUESTS) assert.deepEqual(checkRequest({ type, id: 3 }), { type, id: 3 });
  assert.throws(() => checkRequest({ type: 'explode', id: 1 }), { message: 'unknown request type "explode"' });
  assert.throws(() => checkRequest(null), { message: 'unknown request type undefined' });
  assert.throws(() => checkRequest({ type: 'generate' }), { message: 'request generate has no integer id' });
});

test('errors keep their type and message across the worker boundary', () => {
  for (const type of ['download', 'load', 'inference', 'context_full', 'invalid_argument']) {
    const back = deserializeError(structuredClone(serializeError(new RuvLLMError(type, `a ${type} problem`))));
    assert.ok(back instanceof RuvLLMError);
    assert.equal(back.type, type);
    assert.equal(back.message, `a ${type} problem`);
    assert.equal(back.name, 'RuvLLMError');
  }
  const abort = deserializeError(serializeError(new AbortError('stopped')));
  assert.ok(abort instanceof AbortError);
  assert.equal(abort.name, 'AbortError');
  const other = deserializeError(serializeError(new TypeError('boom')));
  assert.equal(other.type, 'inference');
  assert.equal(other.message, 'internal error: boom');
  assert.equal(new RuvLLMError('nonsense', 'x').type, 'inference');
});

test('a bridge result gives its value, or throws the error it carries', () => {
  assert.deepEqual(unwrap('{"ok": {"a": [1, 2]}}'), { a: [1, 2] });
  assert.equal(unwrap('{"ok": null}'), null);
  assert.throws(
    () => unwrap('{"error": {"type": "context_full", "message": "too long"}}'),
    (e) => e instanceof RuvLLMError && e.type === 'context_full' && e.message === 'too long',
  );
});
