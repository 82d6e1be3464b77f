"""A model's tokenizer.json run in plain Python, for runtimes without Hugging Face `tokenizers` (Pyodide).

It gives the ids `tokenizers` gives, for the tokenizers our families use: byte-level BPE (GPT-2, SmolLM2,
Llama 3, Qwen2) and SentencePiece-style BPE with byte fallback (Gemma, Llama 2, Mistral, Phi-3). The
steps are those of `tokenizers` (tokenizer/mod.rs, added_vocabulary.rs), each in its own module:

1. added tokens are cut out of the raw text (the longest at the leftmost place; `normalized: false` ones);
2. the rest is normalized (normalizers, `pretokenize.py`), and `normalized: true` added tokens cut out;
3. the pre-tokenizer cuts it into pieces (`pretokenize.py`);
4. BPE turns each piece into ids (`bpe.py`);
5. the post-processor adds BOS/EOS when special tokens are asked for (after the file's truncation, before
   its padding, when it sets them).

Decoding uses the byte table of the streaming detokenizer (`detokenizer.py`). Other models (WordPiece,
Unigram) and components our families do not use are refused with a LoadError naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..errors import LoadError
from .bpe import BPE
from .pretokenize import Normalizer, chain, normalizer, pre_tokenizer


class PureTokenizer:
    """`tokenizers.Tokenizer` for encoding, from the parsed tokenizer.json `document`."""

    def __init__(self, document: object, source: str = "tokenizer.json") -> None:
        if not isinstance(document, dict):
            raise LoadError(f"{source}: the file must be a JSON object")
        model = document.get("model")
        kind = model.get("type", "BPE") if isinstance(model, dict) else None
        if kind != "BPE" or not isinstance(model, dict):
            raise LoadError(f"{source}: model type {kind!r} needs the `tokenizers` package (only BPE runs without it)")
        self.model = BPE(model, source)
        self.normalize = normalizer(document.get("normalizer"), f"{source}: normalizer")
        self.pre_tokenize = pre_tokenizer(document.get("pre_tokenizer"), f"{source}: pre_tokenizer")
        self.post_process = _post_processor(document.get("post_processor"), f"{source}: post_processor")
        self.truncate = _truncation(document.get("truncation"), len(self.post_process([])), f"{source}: truncation")
        self.pad = _padding(document.get("padding"), f"{source}: padding")
        added = document.get("added_tokens") or []
        if not isinstance(added, list) or not all(_is_added_token(t) for t in added):
            raise LoadError(f"{source}: added_tokens must be a list of {{id, content, ...}} objects")
        self.added_ids = {t["content"]: t["id"] for t in added}
        self._raw = _AddedTokens([t for t in added if not t.get("normalized", not t.get("special"))], None)
        self._normalized = _AddedTokens([t for t in added if t.get("normalized", not t.get("special"))], self.normalize)

    def token_to_id(self, text: str) -> int | None:
        found = self.added_ids.get(text)
        return found if found is not None else self.model.vocab.get(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        tokenize = self.model.tokenize
        for start, part, added in self._raw.split(text):
            if added is not None:
                ids.append(added)
                continue
            if not part:
                continue  # `tokenizers` drops an empty part before normalizing
            normalized = self.normalize(part) if self.normalize else part
            for inner, piece, added in self._normalized.split(normalized):
                if added is not None:
                    ids.append(added)
                    continue
                if not piece:
                    continue
                for word, _ in self.pre_tokenize([(piece, start == 0 and inner == 0)]):
                    ids += tokenize(word)
        # As `tokenizers` (Tokenizer::post_process): truncated leaving room for the special tokens, then
        # those added, then padded.
        if self.truncate:
            ids = self.truncate(ids, add_special_tokens)
        ids = self.post_process(ids) if add_special_tokens else ids
        return self.pad(ids) if self.pad else ids


def decode(token_bytes: list[bytes], strip_leading_space: bool, ids: list[int]) -> str:
    """The text of `ids` (special tokens included), as the streaming detokenizer gives it."""
    data = b"".join(token_bytes[i] for i in ids if 0 <= i < len(token_bytes))
    if strip_leading_space and data.startswith(b" "):
        data = data[1:]
    return data.decode("utf-8", errors="replace")


def _is_added_token(token: object) -> bool:
    return isinstance(token, dict) and isinstance(token.get("id"), int) and isinstance(token.get("content"), str)


class _AddedTokens:
    """Finds added tokens in text as `tokenizers` does: at each place the longest one, leftmost first."""

    def __init__(self, tokens: list[dict], normalize: Normalizer | None) -> None:
        self.ids: dict[str, int] = {}
        self.flags: dict[str, dict] = {}
        for token in tokens:
            content = normalize(token["content"]) if normalize else token["content"]
            if content:
                self.ids[content] = token["id"]
                if token.get("single_word") or token.get("lstrip") or token.get("rstrip"):
                    self.flags[content] = token
        lengths: dict[str, set[int]] = {}
        for content in self.ids:
            lengths.setdefault(content[0], set()).add(len(content))
        self.lengths = {first: sorted(found, reverse=True) for first, found in lengths.items()}
        self.starts = re.compile("[" + "".join(map(re.escape, sorted(self.lengths))) + "]") if self.ids else None

    def split(self, text: str) -> list[tuple[int, str, int | None]]:
        """(start, text, added token id or None) for each part, in order; "" as one empty part."""
        if self.starts is None or not text:
            return [(0, text, None)]
        parts: list[tuple[int, str, int | None]] = []
        done = at = 0  # text[:done] is in parts; the search goes on from `at`
        while (found := self.starts.search(text, at)) is not None:
            start = found.start()
            candidates = (text[start : start + n] for n in self.lengths[text[start]])
            content = next((c for c in candidates if c in self.ids), None)
            if content is None:
                at = start + 1
                continue
            stop = at = start + len(content)
            token = self.flags.get(content)
            if token is not None:
                if token.get("single_word") and (_WORD_END.search(text, 0, start) or _WORD_START.match(text, stop)):
                    continue
                if token.get("lstrip"):
                    start = max(done, len(text[:start].rstrip()))
                if token.get("rstrip"):
                    stop = at = len(text) - len(text[stop:].lstrip())
            if start > done:
                parts.append((done, text[done:start], None))
            parts.append((start, text[start:stop], self.ids[content]))
            done = stop
        if done < len(text):
            parts.append((done, text[done:], None))
        return parts


_WORD_END, _WORD_START = re.compile(r"\w$"), re.compile(r"\w")


# --- truncation and padding, when the file sets them ----------------------------------------------------


def _truncation(spec: object, added: int, where: str) -> Callable[[list[int], bool], list[int]] | None:
    if spec is None:
        return None
    length = spec.get("max_length") if isinstance(spec, dict) else None
    direction = spec.get("direction", "Right") if isinstance(spec, dict) else None
    if not isinstance(length, int) or length < 0 or direction not in ("Right", "Left"):
        raise LoadError(f'{where} must be null or {{"max_length": a count, "direction": "Right" or "Left"}}')

    def truncate(ids: list[int], add_special_tokens: bool) -> list[int]:
        keep = max(0, length - added) if add_special_tokens else length
        if len(ids) <= keep:
            return ids
        return ids[:keep] if direction == "Right" else ids[len(ids) - keep :]

    return truncate


def _padding(spec: object, where: str) -> Callable[[list[int]], list[int]] | None:
    if spec is None:
        return None
    strategy = spec.get("strategy") if isinstance(spec, dict) else None
    fixed = strategy.get("Fixed") if isinstance(strategy, dict) else None
    pad_id, multiple = (spec.get("pad_id", 0), spec.get("pad_to_multiple_of")) if isinstance(spec, dict) else (0, 0)
    direction = spec.get("direction", "Right") if isinstance(spec, dict) else None
    if (
        not (strategy == "BatchLongest" or isinstance(fixed, int))
        or not isinstance(pad_id, int)
        or not (multiple is None or isinstance(multiple, int))
        or direction not in ("Right", "Left")
    ):
        raise LoadError(f'{where} must be null or {{"strategy": "BatchLongest" or {{"Fixed": n}}, "pad_id", ...}}')

    def pad(ids: list[int]) -> list[int]:
        length = fixed if isinstance(fixed, int) else len(ids)  # one text is its own longest
        if multiple and length % multiple:
            length += multiple - length % multiple
        padding = [pad_id] * max(0, length - len(ids))
        return ids + padding if direction == "Right" else padding + ids

    return pad


# --- post-processors: what `add_special_tokens` adds around the ids ----------------------------------


def _post_processor(spec: object, where: str) -> Callable[[list[int]], list[int]]:
    if spec is None:
        return lambda ids: ids
    if not isinstance(spec, dict):
        raise LoadError(f"{where} must be an object with a type, found {spec!r}")
    kind = spec.get("type")
    if kind == "ByteLevel":  # offsets only
        return lambda ids: ids
    if kind == "Sequence":
        return chain(
            [_post_processor(s, f"{where}.processors[{k}]") for k, s in enumerate(spec.get("processors") or [])]
        )
    if kind in ("BertProcessing", "RobertaProcessing"):
        try:
            cls, sep = spec["cls"][1], spec["sep"][1]
        except (KeyError, IndexError, TypeError):
            raise LoadError(f"{where}: cls and sep must be [text, id]") from None
        return lambda ids: [cls, *ids, sep]
    if kind == "TemplateProcessing":
        special = spec.get("special_tokens") or {}
        before: list[int] = []
        after: list[int] = []
        seen_sequence = False
        for item in spec.get("single") or []:
            if isinstance(item, dict) and "Sequence" in item:
                seen_sequence = True
                continue
            name = item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None
            ids = special.get(name, {}).get("ids") if isinstance(special, dict) else None
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                raise LoadError(f"{where}: the template names {name!r}, which special_tokens does not give ids for")
            (after if seen_sequence else before).extend(ids)
        return lambda ids: [*before, *ids, *after]
    raise LoadError(
        f"{where}: type {kind!r} is not supported without `tokenizers` "
        "(TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence)"
    )
