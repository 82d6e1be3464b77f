// Reads {model, texts, conversations} as JSON on stdin, where model is a model folder, or
// {tokenizerPath, tokenizerConfig, generationConfig, texts, conversations} for a tokenizer.json built from
// GGUF metadata (py_src/ruvllm/files/gguf_vocab.py); prints what the JS text path makes of them (used by
// tests/test_js_text.py and tests/test_gguf_tokenizer.py):
//   ids, decoded, chats: [{prompt, ids}], eosIds: through createText, as the npm package runs it;
//   libraryIds, plainIds: @huggingface/tokenizers itself (with the same pre-tokenizer rewrite), with and
//   without special tokens added, so an empty text shows what the library does rather than createText.
import { readFileSync } from 'node:fs';

import { Tokenizer } from '@huggingface/tokenizers';

import { createText, equivalentPreTokenizer } from '../../src/text/index.js';

const input = JSON.parse(readFileSync(0, 'utf8'));
const read = (name) => JSON.parse(readFileSync(`${input.model}/${name}`, 'utf8'));
const tokenizerJson = JSON.parse(readFileSync(input.tokenizerPath ?? `${input.model}/tokenizer.json`, 'utf8'));
const tokenizerConfig = input.tokenizerConfig ?? read('tokenizer_config.json');
const text = createText({ tokenizerJson, tokenizerConfig, generationConfig: input.generationConfig ?? {} });
const library = new Tokenizer(
  { ...tokenizerJson, pre_tokenizer: equivalentPreTokenizer(tokenizerJson.pre_tokenizer) },
  tokenizerConfig,
);

const ids = input.texts.map((t) => text.encode(t));
const chats = [];
for (const messages of input.conversations) {
  for (const addGenerationPrompt of [true, false]) {
    chats.push({
      prompt: text.applyChatTemplate(messages, { addGenerationPrompt }),
      ids: text.encodeChat(messages, { addGenerationPrompt }),
    });
  }
}
process.stdout.write(
  JSON.stringify({
    ids,
    decoded: ids.map((l) => text.decode(l)),
    libraryIds: input.texts.map((t) => library.encode(t).ids),
    plainIds: input.texts.map((t) => library.encode(t, { add_special_tokens: false }).ids),
    chats,
    eosIds: text.eosIds,
  }),
);
