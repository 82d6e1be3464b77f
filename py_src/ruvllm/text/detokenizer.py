"""Turning generated token ids into text as they arrive, without splitting a UTF-8 character.

Each token id maps to a fixed byte string, read once from `tokenizer.json`; the bytes go through an
incremental UTF-8 decoder that holds back an incomplete character until its last byte arrives. Work per
token is constant, so streaming n tokens costs O(n) (re-decoding the whole output each step would be
quadratic).

Supported decoders: byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM) and SentencePiece-style
(`▁` for spaces, `<0xAB>` byte fallback, one leading space stripped), as used by Llama 2 and Mistral.
"""

from __future__ import annotations

import codecs
import re

from ..errors import LoadError

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes: char -> byte value.

    Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, 0x7F-0xA0, 0xAD) are
    given the code points 256, 257, ... in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def special_token_ids(tokenizer_json: dict) -> frozenset[int]:
    """Ids of tokenizer.json's `added_tokens` marked `"special": true` (control tokens, never text)."""
    added = tokenizer_json.get("added_tokens") if isinstance(tokenizer_json, dict) else None
    return frozenset(
        t["id"] for t in added or [] if isinstance(t, dict) and t.get("special") and isinstance(t.get("id"), int)
    )


def token_byte_table(tokenizer_json: dict) -> tuple[list[bytes], bool]:
    """(bytes of each token id, whether one leading space of the output is dropped)."""
    if not isinstance(tokenizer_json, dict):
        raise LoadError("tokenizer.json: the file must be a JSON object")
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        pieces = {i: t for t, i in vocab.items()}
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        pieces = {i: entry[0] for i, entry in enumerate(vocab)}
    else:
        raise LoadError("tokenizer.json: model.vocab is missing")
    for added in tokenizer_json.get("added_tokens") or []:
        pieces[added["id"]] = added["content"]
    size = max(pieces) + 1 if pieces else 0

    kind, strip_space = _decoder_kind(tokenizer_json.get("decoder"))
    if kind == "byte_level":
        alphabet = byte_level_alphabet()

        def to_bytes(piece: str) -> bytes:
            if all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
            return piece.encode("utf-8")  # as tokenizers does for a token outside the byte alphabet
    else:

        def to_bytes(piece: str) -> bytes:
            match = _BYTE_TOKEN.match(piece)
            if match:
                return bytes([int(match.group(1), 16)])
            return piece.replace("\u2581", " ").encode("utf-8")

    return [to_bytes(pieces[i]) if i in pieces else b"" for i in range(size)], strip_space


def _decoder_kind(decoder: dict | None) -> tuple[str, bool]:
    if decoder is None:
        raise LoadError("tokenizer.json has no decoder; cannot turn tokens into text")
    kind = decoder.get("type")
    if kind == "ByteLevel":
        return "byte_level", False
    if kind == "Metaspace":
        return "sentencepiece", decoder.get("prepend_scheme", "always") != "never" and decoder.get(
            "add_prefix_space", True
        )
    if kind == "Sequence":
        types = [d.get("type") for d in decoder.get("decoders", [])]
        if "ByteLevel" in types:
            return "byte_level", False
        if "Replace" in types or "ByteFallback" in types:
            strip = any(d.get("type") == "Strip" and d.get("start", 0) >= 1 for d in decoder["decoders"])
            return "sentencepiece", strip
    raise LoadError(f"tokenizer.json decoder {kind!r} is not supported for streaming text")


class StreamingDetokenizer:
    """Feed token ids with `add`, get back the text they complete; `finish` flushes the rest."""

    def __init__(self, token_bytes: list[bytes], strip_leading_space: bool = False) -> None:
        self.token_bytes = token_bytes
        self.strip_leading_space = strip_leading_space
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._started = False

    def add(self, token_id: int) -> str:
        data = self.token_bytes[token_id] if 0 <= token_id < len(self.token_bytes) else b""
        if self.strip_leading_space and not self._started and data:
            data = data[1:] if data.startswith(b" ") else data
        self._started = self._started or bool(data)
        return self._utf8.decode(data)

    def finish(self) -> str:
        """Whatever is held back (an incomplete character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)
