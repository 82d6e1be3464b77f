// The JS text layer reads the JSON of a model folder with the checks the Python side has: a value of the
// wrong type is a load error naming the file and the field, not a silent mis-reading.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { createText } from '../src/text/index.js';

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
