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

/**
 * Token ids: one, a list, or absent; anything else (an id outside the vocabulary too, when its size is
 * known) is a load error naming the file and field.
 */
function idList(value, where, vocabSize) {
  if (value === undefined || value === null) return [];
  const ids = Array.isArray(value) ? value : [value];
  if (!ids.every((id) => Number.isInteger(id) && id >= 0)) {
    throw new RuvLLMError(
      'load',
      `${where}: 'eos_token_id' must be a token id (an integer >= 0) or a list of them, found ${JSON.stringify(value)}`,
    );
  }
  if (Number.isInteger(vocabSize) && ids.some((id) => id >= vocabSize)) {
    throw new RuvLLMError(
      'load',
      `${where}: 'eos_token_id' must be a token id of the vocabulary, in [0, ${vocabSize}), found ${JSON.stringify(value)}`,
    );
  }
  return ids;
}

/** GPT-2's byte-level alphabet: the character that stands for each byte (as ByteLevel writes them). */
function byteLevelAlphabet() {
  const kept = (b) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  let next = 256;
  return Array.from({ length: 256 }, (_, b) => String.fromCharCode(kept(b) ? b : next++));
}

const PRE_TOKENIZERS_KEEPING_TEXT = new Set(['ByteLevel', 'Metaspace', 'Digits', 'Split', 'Punctuation']);

/** True when the pre-tokenizer passes on every character (none of its steps drops text). */
function keepsText(step) {
  if (step === null || step === undefined) return true;
  if (step.type === 'Sequence') return step.pretokenizers.every(keepsText);
  return PRE_TOKENIZERS_KEEPING_TEXT.has(step.type) && step.behavior !== 'Removed';
}

const hasStep = (step, type) =>
  step?.type === type || (step?.type === 'Sequence' && step.pretokenizers.some((s) => hasStep(s, type)));

/**
 * By how much the normalizer may shorten a text: UTF-16 length of its input over UTF-8 bytes of its
 * output, at most; null when unbounded (a step that deletes: Strip, StripAccents, a Replace with '' ...).
 * Unicode normalization merges at most a few code points into one of 2+ bytes (measured max about 2):
 * 4 is a safe margin; a lowercase character has at least 1 byte for the at most 2 units it came from.
 */
function shrinkFactor(step) {
  if (step === null || step === undefined) return 1;
  switch (step.type) {
    case 'Sequence':
      return step.normalizers.reduce(
        (f, s) => (f === null || shrinkFactor(s) === null ? null : f * shrinkFactor(s)),
        1,
      );
    case 'Prepend':
      return 1;
    case 'Replace': {
      const from = step.pattern?.String;
      const to = new TextEncoder().encode(step.content ?? '').length;
      return typeof from === 'string' && to > 0 ? Math.max(1, from.length / to) : null;
    }
    case 'NFC':
    case 'NFD':
    case 'NFKC':
    case 'NFKD':
      return 4;
    case 'Lowercase':
      return 2;
    default:
      return null;
  }
}

/**
 * Code points whose UTF-8 holds one of `bytes` (bytes without a token: such characters may be dropped),
 * as a RegExp; null when none can be (only bytes UTF-8 never uses are missing); undefined when a missing
 * byte is a continuation byte, which any multi-byte character may hold.
 */
function droppable(bytes) {
  const ranges = [];
  for (const b of bytes) {
    if (b === 0xc0 || b === 0xc1 || b >= 0xf5) continue; // never in UTF-8
    if (b >= 0x80 && b <= 0xbf) return undefined;
    if (b < 0x80) ranges.push([b, b]);
    else if (b < 0xe0) ranges.push([(b - 0xc0) << 6, ((b - 0xc0) << 6) + 0x3f]);
    else if (b < 0xf0) ranges.push([(b - 0xe0) << 12, ((b - 0xe0) << 12) + 0xfff]);
    else ranges.push([(b - 0xf0) << 18, ((b - 0xf0) << 18) + 0x3ffff]);
  }
  if (ranges.length === 0) return null;
  const hex = (c) => `\\u{${c.toString(16)}}`;
  return new RegExp(`[${ranges.map(([lo, hi]) => `${hex(lo)}-${hex(hi)}`).join('')}]`, 'gu');
}

/**
 * How many UTF-16 characters (a JS string's length) one token can stand for at most, and which
 * characters the tokenizer may drop, as { perToken, dropped: RegExp | null }; null when this tokenizer
 * gives no such bound. It holds for a BPE that loses nothing but the characters in `dropped`: byte-level
 * (or byte_fallback with <0xXX> tokens; a byte without a token drops the characters that hold it), a
 * pre-tokenizer that drops nothing, a normalizer that shortens by a bounded factor, no unknown token
 * swallowing a run of text, and no added token that absorbs the whitespace beside it (lstrip/rstrip).
 * Then the tokens spell out the normalized text, each at most L bytes of it (L: the longest token), and
 * a text of n characters, none dropped, needs at least n / (shrink x L) tokens.
 */
export function tokenSpan(tokenizerJson) {
  const model = tokenizerJson.model ?? {};
  const vocab = model.vocab ?? {};
  if ((model.type ?? (model.merges ? 'BPE' : null)) !== 'BPE' || Array.isArray(vocab)) return null;
  const added = tokenizerJson.added_tokens ?? [];
  if (added.some((t) => t.lstrip || t.rstrip)) return null;
  if (!keepsText(tokenizerJson.pre_tokenizer)) return null;
  const shrink = shrinkFactor(tokenizerJson.normalizer);
  if (shrink === null) return null;
  const byteLevel = hasStep(tokenizerJson.pre_tokenizer, 'ByteLevel');
  if (!byteLevel && !model.byte_fallback) return null;
  const alphabet = byteLevelAlphabet();
  const byteToken = (b) => (byteLevel ? alphabet[b] : `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
  const missing = Array.from({ length: 256 }, (_, b) => b).filter((b) => !Object.hasOwn(vocab, byteToken(b)));
  const dropped = droppable(missing);
  if (dropped === undefined) return null;
  // a byte-level token's characters are one byte each; other tokens' (and added tokens') text is as written
  const alphabetSet = new Set(alphabet);
  const utf8 = (t) => new TextEncoder().encode(t).length;
  const bytesOf = byteLevel ? (t) => [...t].reduce((n, c) => n + (alphabetSet.has(c) ? 1 : utf8(c)), 0) : utf8;
  let longest = 1;
  for (const token of Object.keys(vocab)) longest = Math.max(longest, bytesOf(token));
  for (const token of added) longest = Math.max(longest, utf8(token.content ?? ''));
  return { perToken: longest * shrink, dropped };
}

/**
 * @param {{tokenizerJson: Record<string, any>, tokenizerConfig: Record<string, any>,
 *   generationConfig: Record<string, any>, config: Record<string, any>,
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
    ...idList(config.eos_token_id, 'config.json', config.vocab_size),
    ...idList(generationConfig.eos_token_id, 'generation_config.json', config.vocab_size),
  ]);
  const eosToken = special.eos_token !== undefined ? tokenizer.token_to_id(special.eos_token) : undefined;
  if (eosToken !== undefined && eosToken !== null) eos.add(eosToken);

  const span = tokenSpan(tokenizerJson);

  return {
    eosIds: [...eos].sort((a, b) => a - b),
    chatTemplateSource: templateSource,
    /** The chat template's own text (null: none), for Python to know what it writes itself. */
    chatTemplateText: template ? source : null,
    /**
     * At least how many tokens `text` has, when that is more than `tokens`, known without tokenizing it
     * (which takes a minute for megabytes); null otherwise, or when this tokenizer gives no bound.
     */
    moreTokensThan(text, tokens) {
      if (span === null || text.length / span.perToken <= tokens) return null;
      const kept = span.dropped === null ? text.length : text.replace(span.dropped, '').length;
      const least = Math.floor(kept / span.perToken);
      return least > tokens ? least : null;
    },
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
      return this.encodeRendered(this.applyChatTemplate(messages, options));
    },
    /** The ids of a prompt the chat template rendered. */
    encodeRendered(rendered) {
      // The template writes any BOS itself; adding special tokens again would double it.
      return tokenizer.encode(rendered, { add_special_tokens: false }).ids;
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
