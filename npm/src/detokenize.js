/**
 * Streaming detokenization and stop strings, the JavaScript twin of ruvllm/detokenizer.py and the stop
 * handling of ruvllm/generate.py: each token id maps to fixed bytes (read once from tokenizer.json), and
 * a streaming TextDecoder holds back an incomplete UTF-8 character until its last byte arrives. Constant
 * work per token.
 */

const BYTE_TOKEN = /^<0x([0-9A-Fa-f]{2})>$/;

/** GPT-2's printable stand-ins for bytes: Map(char -> byte). */
export function byteLevelAlphabet() {
  const printable = [];
  for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
  for (let b = 0xae; b <= 0xff; b++) printable.push(b);
  const chars = new Map(printable.map((b) => [b, String.fromCodePoint(b)]));
  let extra = 0;
  for (let b = 0; b < 256; b++) if (!chars.has(b)) chars.set(b, String.fromCodePoint(256 + extra++));
  return new Map([...chars].map(([b, c]) => [c, b]));
}

function decoderKind(decoder) {
  if (!decoder) throw new Error('tokenizer.json has no decoder; cannot turn tokens into text');
  if (decoder.type === 'ByteLevel') return ['byte_level', false];
  if (decoder.type === 'Metaspace') {
    return ['sentencepiece', decoder.prepend_scheme !== 'never' && decoder.add_prefix_space !== false];
  }
  if (decoder.type === 'Sequence') {
    const types = decoder.decoders.map((d) => d.type);
    if (types.includes('ByteLevel')) return ['byte_level', false];
    if (types.includes('Replace') || types.includes('ByteFallback')) {
      return ['sentencepiece', decoder.decoders.some((d) => d.type === 'Strip' && (d.start ?? 0) >= 1)];
    }
  }
  throw new Error(`tokenizer.json decoder ${JSON.stringify(decoder.type)} is not supported for streaming text`);
}

/** { bytes: Uint8Array[] indexed by token id, stripLeadingSpace } from a parsed tokenizer.json. */
export function tokenByteTable(tokenizerJson) {
  const vocab = tokenizerJson.model?.vocab;
  const pieces = new Map();
  if (Array.isArray(vocab)) vocab.forEach((entry, id) => pieces.set(id, entry[0]));
  else if (vocab && typeof vocab === 'object') for (const [piece, id] of Object.entries(vocab)) pieces.set(id, piece);
  else throw new Error('tokenizer.json: model.vocab is missing');
  for (const added of tokenizerJson.added_tokens ?? []) pieces.set(added.id, added.content);

  const [kind, stripLeadingSpace] = decoderKind(tokenizerJson.decoder);
  const utf8 = new TextEncoder();
  let toBytes;
  if (kind === 'byte_level') {
    const alphabet = byteLevelAlphabet();
    toBytes = (piece) => {
      const chars = [...piece];
      if (chars.every((c) => alphabet.has(c))) return Uint8Array.from(chars, (c) => alphabet.get(c));
      return utf8.encode(piece); // as HF tokenizers does for a token outside the byte alphabet
    };
  } else {
    toBytes = (piece) => {
      const match = BYTE_TOKEN.exec(piece);
      return match ? Uint8Array.of(parseInt(match[1], 16)) : utf8.encode(piece.replaceAll('\u2581', ' '));
    };
  }
  const size = Math.max(-1, ...pieces.keys()) + 1;
  const bytes = Array.from({ length: size }, (_, id) => (pieces.has(id) ? toBytes(pieces.get(id)) : new Uint8Array()));
  return { bytes, stripLeadingSpace };
}

export class StreamingDetokenizer {
  constructor({ bytes, stripLeadingSpace }) {
    this.bytes = bytes;
    this.stripLeadingSpace = stripLeadingSpace;
    this.decoder = new TextDecoder('utf-8');
    this.started = false;
  }

  /** The text completed by this token (possibly ''). */
  add(tokenId) {
    let data = this.bytes[tokenId] ?? new Uint8Array();
    if (this.stripLeadingSpace && !this.started && data.length && data[0] === 0x20) data = data.subarray(1);
    this.started ||= data.length > 0;
    return this.decoder.decode(data, { stream: true });
  }

  /** Whatever is held back (an incomplete character becomes U+FFFD). */
  finish() {
    return this.decoder.decode();
  }
}

/**
 * Split pending text at stop strings: [emit now, hold back, stop string found].
 * Holds back the longest tail that could still grow into a stop string.
 */
export function splitAtStop(text, stop, final) {
  let cut = -1;
  for (const s of stop) {
    const i = text.indexOf(s);
    if (i >= 0 && (cut < 0 || i < cut)) cut = i;
  }
  if (cut >= 0) return [text.slice(0, cut), '', true];
  if (final || stop.length === 0) return [text, '', false];
  let hold = 0;
  for (const s of stop) {
    for (let k = Math.min(s.length - 1, text.length); k > hold; k--) {
      if (text.endsWith(s.slice(0, k))) {
        hold = k;
        break;
      }
    }
  }
  return [text.slice(0, text.length - hold), text.slice(text.length - hold), false];
}
