// The JS text layer reads the JSON of a model folder with the checks the Python side has: a value of the
// wrong type is a load error naming the file and the field, not a silent mis-reading.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { createText, tokenSpan } from '../src/text/index.js';

const MODEL = new URL('../../models/smollm2-135m-instruct/', import.meta.url);
const tokenizerJson = JSON.parse(readFileSync(new URL('tokenizer.json', MODEL)));
const tokenizerConfig = JSON.parse(readFileSync(new URL('tokenizer_config.json', MODEL)));

const cases = [
  [
    { generationConfig: { eos_token_id: ['2'] } },
    `generation_config.json: 'eos_token_id' must be a token id (an integer >= 0) or a list of them, found ["2"]`,
  ],
  [
    { config: { eos_token_id: -1 } },
    `config.json: 'eos_token_id' must be a token id (an integer >= 0) or a list of them, found -1`,
  ],
  [{ generationConfig: [] }, 'generation_config.json: the file must be a JSON object'],
  [{ tokenizerConfig: [] }, 'tokenizer_config.json: the file must be a JSON object'],
  [
    { tokenizerConfig: { ...tokenizerConfig, chat_template: 5 } },
    `tokenizer_config.json: 'chat_template' must be a string or a list of {"name", "template"} objects, found 5`,
  ],
  [
    { tokenizerConfig: { ...tokenizerConfig, eos_token: { content: 0 } } },
    `tokenizer_config.json: 'eos_token' must be a string or {"content": string}, found {"content":0}`,
  ],
];

for (const [files, message] of cases) {
  test(`a damaged file is a load error naming it: ${message.split(':')[0]} ${JSON.stringify(Object.values(files)[0]).slice(0, 40)}`, () => {
    assert.throws(
      () => createText({ tokenizerJson, tokenizerConfig, ...files }),
      (e) => e.type === 'load' && e.message === message,
    );
  });
}

test('the intact files give the end-of-sequence ids and a chat prompt', () => {
  const text = createText({ tokenizerJson, tokenizerConfig, generationConfig: { eos_token_id: 2 }, config: {} });
  assert.deepEqual(text.eosIds, [2]);
  assert.ok(text.applyChatTemplate([{ role: 'user', content: 'Hi' }]).endsWith('<|im_start|>assistant\n'));
});

// --- a prompt too long for the context window, known by its length -----------------------------------

test('a text longer than its tokens can hold is known to be too long without tokenizing it, and never wrongly', () => {
  const text = createText({ tokenizerJson, tokenizerConfig });
  // SmolLM2: byte-level BPE, no normalizer; its longest token is 81 bytes; 21 bytes have no token
  // (control characters such as \x04, lead bytes of planes 4-11), so the characters holding them may vanish
  const span = tokenSpan(tokenizerJson);
  assert.equal(span.perToken, 81);
  assert.equal(text.moreTokensThan('a'.repeat(5e6), 4096), 61728);
  assert.equal(text.moreTokensThan('a'.repeat(81 * 4096), 4096), null); // could still fit: tokenized
  assert.equal(text.moreTokensThan('\x04'.repeat(5e6), 4096), null); // dropped characters count for nothing
  assert.equal(text.encode('\x04'.repeat(100)).length, 0);
  // sound on every kind of text: whenever a bound is given, the text has at least that many tokens
  const samples = [
    'a'.repeat(9000),
    ' '.repeat(9000),
    'é'.repeat(9000),
    '\u{1F600}'.repeat(5000),
    'the '.repeat(3000),
    '<|im_start|>'.repeat(900),
    Array.from({ length: 9000 }, (_, i) => String.fromCodePoint(32 + ((i * 7919) % 0x2ff0))).join(''),
  ];
  for (const sample of samples) {
    const least = text.moreTokensThan(sample, 100);
    assert.ok(least !== null && least > 100, JSON.stringify(sample.slice(0, 8)));
    assert.ok(text.encode(sample).length >= least, `${JSON.stringify(sample.slice(0, 8))}: fewer tokens than ${least}`);
  }
});

test('a tokenizer that can lose text gives no length bound', () => {
  const lossy = [
    ['a normalizer that deletes', { normalizer: { type: 'Strip', strip_left: true, strip_right: true } }],
    ['a Replace with nothing', { normalizer: { type: 'Replace', pattern: { String: ' ' }, content: '' } }],
    ['a pre-tokenizer that drops whitespace', { pre_tokenizer: { type: 'WhitespaceSplit' } }],
    [
      'an added token that absorbs whitespace',
      { added_tokens: [{ id: 0, content: '<|end|>', rstrip: true, lstrip: false, special: true }] },
    ],
    ['a WordPiece model', { model: { ...tokenizerJson.model, type: 'WordPiece' } }],
    [
      'an unknown token without bytes',
      { pre_tokenizer: null, model: { ...tokenizerJson.model, byte_fallback: false } },
    ],
  ];
  for (const [what, change] of lossy) assert.equal(tokenSpan({ ...tokenizerJson, ...change }), null, what);
  // Unicode normalization shortens by a bounded factor: the bound stays, looser
  assert.equal(tokenSpan({ ...tokenizerJson, normalizer: { type: 'NFC' } }).perToken, 81 * 4);
});
