import assert from 'node:assert/strict';
import { test } from 'node:test';

import { StreamingDetokenizer, byteLevelAlphabet, splitAtStop, tokenByteTable } from '../src/detokenize.js';
import { equivalentPreTokenizer } from '../src/text.js';

const enc = new TextEncoder();
const TABLE = { bytes: ['Hel', 'lo', ' wor', 'ld', '!'].map((s) => enc.encode(s)).concat([Uint8Array.of(0xf0, 0x9f), Uint8Array.of(0xa4, 0x96)]), stripLeadingSpace: false };

test('the byte-level alphabet covers every byte once', () => {
  const alphabet = byteLevelAlphabet();
  assert.equal(alphabet.size, 256);
  assert.deepEqual(new Set(alphabet.values()).size, 256);
  assert.equal(alphabet.get('Ġ'), 0x20);
  assert.equal(alphabet.get('Ċ'), 0x0a);
  assert.equal(alphabet.get('A'), 0x41);
});

test('token byte tables: byte-level and sentencepiece', () => {
  const byteLevel = tokenByteTable({
    model: { vocab: { 'Ġhi': 0, 'Ã©': 1 } },
    added_tokens: [{ id: 2, content: '<|end|>' }],
    decoder: { type: 'ByteLevel' },
  });
  assert.deepEqual(byteLevel.bytes.map((b) => new TextDecoder().decode(b)), [' hi', 'é', '<|end|>']);
  const spm = tokenByteTable({
    model: { vocab: { '▁hello': 0, '<0x0A>': 1, 'x': 2 } },
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace' }, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
  });
  assert.equal(spm.stripLeadingSpace, true);
  const detok = new StreamingDetokenizer(spm);
  assert.equal([0, 1, 0].map((id) => detok.add(id)).join(''), 'hello\n hello');
  assert.throws(() => tokenByteTable({ model: { vocab: {} }, decoder: { type: 'WordPiece' } }), /decoder "WordPiece" is not supported/);
});

test('a character split over tokens arrives whole', () => {
  const detok = new StreamingDetokenizer(TABLE);
  assert.deepEqual([0, 5, 6, 1].map((id) => detok.add(id)), ['Hel', '', '🤖', 'lo']);
  const cut = new StreamingDetokenizer(TABLE);
  assert.equal(cut.add(5), '');
  assert.equal(cut.finish(), '\ufffd');
});

test('stop strings: cut right before, hold back possible starts, earliest wins', () => {
  assert.deepEqual(splitAtStop('Hello world', ['lo w'], false), ['Hel', '', true]);
  assert.deepEqual(splitAtStop('Hel', ['lox'], false), ['He', 'l', false]);
  assert.deepEqual(splitAtStop('Hello', ['lox'], false), ['Hel', 'lo', false]);
  assert.deepEqual(splitAtStop('Hello', ['lox'], true), ['Hello', '', false]);
  assert.deepEqual(splitAtStop('Hello world!', ['ld!', 'o w'], false), ['Hell', '', true]);
  assert.deepEqual(splitAtStop('abc', [], false), ['abc', '', false]);
});

test('pre-tokenizers are rewritten into equivalent Split steps', () => {
  const smollm = {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Digits', individual_digits: true },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    ],
  };
  const out = equivalentPreTokenizer(smollm);
  assert.deepEqual(out.pretokenizers.map((p) => p.type), ['Split', 'Split', 'ByteLevel']);
  assert.deepEqual(out.pretokenizers[0], { type: 'Split', pattern: { Regex: '\\p{N}' }, behavior: 'Isolated', invert: false });
  assert.equal(out.pretokenizers[2].use_regex, false);
  const untouched = { type: 'Split', pattern: { Regex: 'x' }, behavior: 'Isolated', invert: false };
  assert.deepEqual(equivalentPreTokenizer(untouched), untouched);
  assert.deepEqual(equivalentPreTokenizer({ type: 'Digits', individual_digits: false }).pattern, { Regex: '\\p{N}+' });
});
