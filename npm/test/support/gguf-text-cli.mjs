// Reads {tokenizerPath, tokenizerConfig, generationConfig, texts, conversations} as JSON on stdin, where
// tokenizerPath is a tokenizer.json written from GGUF metadata (py_src/ruvllm/text/gguf_vocab.py); prints what
// the JS text path makes of it (used by tests/test_gguf_tokenizer.py):
//   ids, decoded, chats, eosIds: through createText, as the npm package runs it;
//   libraryIds, plainIds: @huggingface/tokenizers itself (with the same pre-tokenizer rewrite), with and
//   without special tokens added, so an empty text shows what the library does rather than createText.
import { readFileSync } from 'node:fs';

import { Tokenizer } from '@huggingface/tokenizers';

import { createText, equivalentPreTokenizer } from '../../src/text/index.js';

const input = JSON.parse(readFileSync(0, 'utf8'));
const tokenizerJson = JSON.parse(readFileSync(input.tokenizerPath, 'utf8'));
const text = createText({
  tokenizerJson,
  tokenizerConfig: input.tokenizerConfig,
  generationConfig: input.generationConfig,
});
const library = new Tokenizer(
  { ...tokenizerJson, pre_tokenizer: equivalentPreTokenizer(tokenizerJson.pre_tokenizer) },
  input.tokenizerConfig,
);

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
