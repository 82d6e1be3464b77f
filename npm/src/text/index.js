/**
 * Text in JavaScript: the model's tokenizer.json run by @huggingface/tokenizers and its chat template
 * (chat-template.js, on @huggingface/jinja). Token ids are what cross into Python; the text of generated
 * tokens comes back from Python (text/stream.py), made there as on CPython.
 *
 * Two pre-tokenizer steps of @huggingface/tokenizers 0.2 differ from the Rust library that defines the
 * format (and that ruvllm uses on CPython): its `Digits` splits only ASCII 0-9 where Rust splits every
 * Unicode number (\p{N}: ½ ① Ⅻ ٣), and its `ByteLevel` regex uses JavaScript's \s (which includes
 * U+FEFF and misses U+0085). `equivalentPreTokenizer` rewrites both into `Split` steps that mean the same
 * in Rust and that the JS library implements faithfully, so both runtimes produce the same ids.
 */

import { Tokenizer } from '@huggingface/tokenizers';

import { ChatTemplate } from './chat-template.js';
import { RuvLLMError } from '../errors.js';

// The GPT-2 split used by ByteLevel(use_regex=true), as in the Rust tokenizers library.
const GPT2_SPLIT = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

function isolate(regex) {
  return { type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false };
}

/** The same pre-tokenizer, written with steps the JS library implements exactly like Rust. */
export function equivalentPreTokenizer(step) {
  if (!step || typeof step !== 'object') return step;
  if (step.type === 'Sequence') {
    return { ...step, pretokenizers: step.pretokenizers.flatMap((s) => flatten(equivalentPreTokenizer(s))) };
  }
  if (step.type === 'Digits') return isolate(step.individual_digits ? '\\p{N}' : '\\p{N}+');
  if (step.type === 'ByteLevel' && step.use_regex !== false && !step.add_prefix_space) {
    return { type: 'Sequence', pretokenizers: [isolate(GPT2_SPLIT), { ...step, use_regex: false }] };
  }
  return step;
}

function flatten(step) {
  return step?.type === 'Sequence' ? step.pretokenizers : [step];
}

/** A special token's text: a string, { content: string }, or absent (as tokenizer.py reads it). */
function tokenText(config, name) {
  const value = config[name] !== null && typeof config[name] === 'object' ? config[name].content : config[name];
  if (value !== undefined && value !== null && typeof value !== 'string') {
    throw new RuvLLMError(
      'load',
      `tokenizer_config.json: '${name}' must be a string or {"content": string}, found ${JSON.stringify(config[name])}`,
    );
  }
  return value ?? null;
}

/** Token ids: one, a list, or absent; anything else is a load error naming the file and field. */
function idList(value, where) {
  if (value === undefined || value === null) return [];
  const ids = Array.isArray(value) ? value : [value];
  if (!ids.every((id) => Number.isInteger(id) && id >= 0)) {
    throw new RuvLLMError(
      'load',
      `${where}: 'eos_token_id' must be a token id (an integer >= 0) or a list of them, found ${JSON.stringify(value)}`,
    );
  }
  return ids;
}

/**
 * @param {{tokenizerJson: object, tokenizerConfig: object, generationConfig: object, config: object,
 *   chatTemplate?: string | null}} files chatTemplate: the user's template, used instead of the model's
 */
export function createText({
  tokenizerJson,
  tokenizerConfig = {},
  generationConfig = {},
  config = {},
  chatTemplate = null,
}) {
  if (!tokenizerJson) throw new RuvLLMError('load', 'tokenizer.json: not found');
  for (const [name, value] of Object.entries({
    'tokenizer_config.json': tokenizerConfig,
    'generation_config.json': generationConfig,
  })) {
    if (value === null || typeof value !== 'object' || Array.isArray(value))
      throw new RuvLLMError('load', `${name}: the file must be a JSON object`);
  }
  let tokenizer;
  try {
    const json = { ...tokenizerJson, pre_tokenizer: equivalentPreTokenizer(tokenizerJson.pre_tokenizer) };
    tokenizer = new Tokenizer(json, tokenizerConfig);
  } catch (error) {
    throw new RuvLLMError('load', `tokenizer.json cannot be used: ${error.message}`);
  }

  const special = {};
  for (const name of ['bos_token', 'eos_token', 'unk_token', 'pad_token']) {
    const text = tokenText(tokenizerConfig, name);
    if (text !== null) special[name] = text;
  }
  let source = chatTemplate ?? tokenizerConfig.chat_template;
  if (Array.isArray(source)) source = source.find((t) => t?.name === 'default')?.template;
  if (source !== undefined && source !== null && typeof source !== 'string') {
    throw new RuvLLMError(
      'load',
      `tokenizer_config.json: 'chat_template' must be a string or a list of {"name", "template"} objects, found ${JSON.stringify(tokenizerConfig.chat_template).slice(0, 60)}`,
    );
  }
  let template;
  try {
    template = source ? new ChatTemplate(source, special) : null;
  } catch (error) {
    if (chatTemplate === null) throw error;
    throw new RuvLLMError('invalid_argument', `options.chatTemplate cannot be used: ${error.message}`);
  }
  let templateSource = null; // where the template came from, for info.chatTemplate
  if (template) templateSource = chatTemplate !== null ? 'option' : (tokenizerConfig.chat_template_source ?? 'model');

  // End-of-sequence ids: config.json, generation_config.json and the tokenizer's eos_token (as on CPython).
  const eos = new Set([
    ...idList(config.eos_token_id, 'config.json'),
    ...idList(generationConfig.eos_token_id, 'generation_config.json'),
  ]);
  const eosToken = special.eos_token !== undefined ? tokenizer.token_to_id(special.eos_token) : undefined;
  if (eosToken !== undefined && eosToken !== null) eos.add(eosToken);

  return {
    eosIds: [...eos].sort((a, b) => a - b),
    chatTemplateSource: templateSource,
    encode(text) {
      if (typeof text !== 'string') throw new RuvLLMError('invalid_argument', 'prompt must be a string');
      return tokenizer.encode(text).ids; // '' is [] or [bos], as on CPython
    },
    /** The prompt for `messages`; options: { tools: OpenAI tool objects or null, addGenerationPrompt: true }. */
    applyChatTemplate(messages, options = {}) {
      if (!template)
        throw new RuvLLMError(
          'invalid_argument',
          'this model has no chat template (its tokenizer_config.json or GGUF metadata has none): give one with the chatTemplate load option',
        );
      return template.render(messages, options);
    },
    encodeChat(messages, options = {}) {
      // The template writes any BOS itself; adding special tokens again would double it.
      return tokenizer.encode(this.applyChatTemplate(messages, options), { add_special_tokens: false }).ids;
    },
    /** Prompt and completion ids for feedback, tokenized as generation would (mirrors Model.feedback_ids). */
    feedbackIds({ prompt, messages, completion }) {
      if (typeof completion !== 'string' || !completion)
        throw new RuvLLMError('invalid_argument', 'completion must be a non-empty string');
      if (messages !== undefined) {
        const promptIds = this.encodeChat(messages);
        const end = this.eosIds.length ? [this.eosIds[0]] : [];
        return [promptIds, [...tokenizer.encode(completion, { add_special_tokens: false }).ids, ...end]];
      }
      const promptIds = this.encode(prompt);
      const whole = this.encode(prompt + completion);
      if (whole.length > promptIds.length && promptIds.every((id, i) => whole[i] === id))
        return [promptIds, whole.slice(promptIds.length)];
      return [promptIds, tokenizer.encode(completion, { add_special_tokens: false }).ids];
    },
    decode(ids) {
      return ids.length ? tokenizer.decode(ids) : '';
    },
  };
}
