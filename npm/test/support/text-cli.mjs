// Reads {model, texts, conversations} as JSON on stdin; prints what the JS text path makes of them:
// {ids: [[...]], decoded: [...], chats: [{prompt, ids}], eosIds} (used by tests/test_js_text.py).
import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';

import { createText } from '../../src/text/index.js';

const input = JSON.parse(readFileSync(0, 'utf8'));
const read = async (name) => JSON.parse(await readFile(`${input.model}/${name}`, 'utf8'));
const text = createText({
  tokenizerJson: await read('tokenizer.json'),
  tokenizerConfig: await read('tokenizer_config.json'),
});
const ids = input.texts.map((t) => text.encode(t));
const chats = [];
for (const messages of input.conversations) {
  for (const addGenerationPrompt of [true, false]) {
    chats.push({
      prompt: text.applyChatTemplate(messages, addGenerationPrompt),
      ids: text.encodeChat(messages, addGenerationPrompt),
    });
  }
}
process.stdout.write(JSON.stringify({ ids, decoded: ids.map((l) => text.decode(l)), chats, eosIds: text.eosIds }));
