"""A GGUF model's tokenizer files, written from its metadata with the standard library only.

A GGUF carries no `tokenizer.json`: the vocabulary, the merges or scores, each token's type and the special
token ids are metadata under llama.cpp's key names (`tokenizer.ggml.*`). `tokenizer_files` turns them into
the three documents a model folder would hold, as plain dicts, so the rest of the text layer (HF
`tokenizers` on CPython, @huggingface/tokenizers in the browser, the streaming detokenizer) reads a GGUF
model exactly as it reads a folder. Nothing here imports `tokenizers`, which does not exist in Pyodide.

The tokenizer is the one transformers 5.23 builds from the same file (`AutoTokenizer.from_pretrained(folder,
gguf_file=name)`; integrations/gguf/gguf_tokenizer_mapping.py), by `tokenizer.ggml.model`:

- `gpt2`, byte-level BPE (SmolLM2, Llama 3, Qwen2/3): the file's merges; the text is split before BPE as
  `tokenizer.ggml.pre` names it in llama.cpp (llama-vocab.cpp). That is where we differ from transformers,
  which ignores `smollm`: SmolLM's own tokenizer.json and llama.cpp isolate every `\\p{N}` character first.
- `llama`, SentencePiece BPE with byte fallback. For Gemma (`gemma`, `gemma2`, `gemma3`) as GemmaTokenizer:
  a token of blanks with a space in it is respelled with `▁`, spaces become `▁` before BPE, and the merges
  (the file has none) are recovered from the vocabulary, ranked by token position. For every other
  architecture as LlamaTokenizer (Metaspace, merges ranked by score), Phi-3 with its own normalizer.

Control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added tokens, so
text naming them is not cut up. Where transformers would append a token past the vocabulary (a default
special token such as `<mask>` that the file lacks), we leave it out: the model has no row for it.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter
from typing import TypeVar

from ..errors import LoadError

_T = TypeVar("_T")  # the type of one metadata value, as checked

SUPPORTED_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece BPE"}  # tokenizer.ggml.model
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

# GGUF token types (llama.cpp: LLAMA_TOKEN_TYPE_*)
CONTROL, USER_DEFINED = 3, 4

# Gemma's turn format, for a Gemma GGUF that carries no template: the same text as Gemma 3's published
# template gives for text messages (the system message opens the first user turn; "assistant" is written
# "model"; contents are trimmed; roles must alternate user, assistant, ...). Contents are strings: ruvllm
# accepts no other kind. Written with `-` everywhere, so only the quoted strings make output.
GEMMA_CHAT_TEMPLATE = """\
{{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
  {%- set prefix = messages[0]['content'] + '\n\n' -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set prefix = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('Gemma conversations alternate user and assistant turns, starting with user') -}}
  {%- endif -%}
  {{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' -}}
  {{- prefix if loop.first else '' -}}
  {{- message['content'] | trim -}}
  {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""

# Split patterns before byte-level BPE, as published with each model family's tokenizer.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _split_then_bytes(pattern: str) -> dict:
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [split, {**_BYTE_LEVEL, "use_regex": False}]}


# tokenizer.ggml.pre -> the pre-tokenizer of a byte-level vocabulary.
_BYTE_LEVEL_PRE = {
    "default": _BYTE_LEVEL,
    "gpt-2": _BYTE_LEVEL,
    "gpt2": _BYTE_LEVEL,
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL],
    },
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
    "llama3": _split_then_bytes(_LLAMA3_SPLIT),
    "llama-v3": _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),
}


class GGUFWarning(UserWarning):
    """Metadata that is wrong but changes nothing the model computes, ignored as llama.cpp ignores it."""


# Special token ids the tokenizer and generation use (the prompt's first token, the ids that end a reply,
# the piece unknown text becomes): an id outside the vocabulary is refused. The others are ignored when
# they are out of range, with a GGUFWarning: llama.cpp (llama-vocab.cpp) warns about any bad special id
# and falls back to its default, and these ones change nothing ruvllm computes.
USED_SPECIAL_IDS = ("bos", "eos", "unknown", "eot", "eom")
UNUSED_SPECIAL_IDS = ("padding", "seperator", "cls", "mask")  # "seperator": llama.cpp's spelling of the key


@dataclass(frozen=True)
class GGUFVocabulary:
    """The `tokenizer.ggml.*` metadata, checked: one entry per token id in `tokens`, `types`, `scores`;
    special ids inside the vocabulary; a tokenizer kind, pre-tokenizer and merges `tokenizer_files` can
    build a tokenizer from. Reading it is cheap (no merges recovered, no tokenizer.json built), so a file
    is checked this far from its header alone."""

    model: str
    pre: str | None
    tokens: list[str]
    types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    pairs: list[list[str]] | None  # the merges, each split into its two sides
    special_ids: dict[str, int | None]  # USED_SPECIAL_IDS and UNUSED_SPECIAL_IDS: None when absent (or ignored)
    add_bos: bool | None
    add_eos: bool | None
    chat_template: str | None

    @classmethod
    def read(cls, metadata: dict[str, object], source: str) -> GGUFVocabulary:
        def get(name: str) -> object:
            return metadata.get(f"tokenizer.ggml.{name}")

        def fail(name: str, expected: str) -> LoadError:
            found = _found(get(name))
            return LoadError(f"{source}: GGUF metadata tokenizer.ggml.{name} must be {expected}, found {found}")

        def listed(name: str, kind: type | tuple[type, ...], expected: str) -> list | None:
            value = get(name)
            if value is None:
                return None
            exact = set(kind) if isinstance(kind, tuple) else {kind}  # the common case, checked at C speed
            if not isinstance(value, list) or not (
                set(map(type, value)) <= exact or all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
            ):
                raise fail(name, expected)
            return value

        def one(name: str, kind: type[_T], expected: str) -> _T | None:
            value = get(name)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)):
                raise fail(name, expected)
            return value

        tokens = listed("tokens", str, "a non-empty list of strings")
        if not tokens:
            raise fail("tokens", "a non-empty list of strings")
        types = listed("token_type", int, "a list of token types (integers)")
        scores = listed("scores", (int, float), "a list of numbers")
        for name, values in (("token_type", types), ("scores", scores)):
            if values is not None and len(values) != len(tokens):
                raise LoadError(
                    f"{source}: GGUF metadata tokenizer.ggml.{name} has {len(values)} entries, "
                    f"tokenizer.ggml.tokens has {len(tokens)}"
                )
        special_ids: dict[str, int | None] = {}
        expected = f"a token id (an integer from 0 to {len(tokens) - 1})"
        for name in (*USED_SPECIAL_IDS, *UNUSED_SPECIAL_IDS):
            key = f"{name}_token_id"
            index = one(key, int, expected)
            if index is not None and not 0 <= index < len(tokens):
                outside = f"the vocabulary (tokenizer.ggml.tokens) has {len(tokens)} tokens"
                if name in USED_SPECIAL_IDS:
                    raise LoadError(
                        f"{source}: GGUF metadata tokenizer.ggml.{key} must be {expected}, found {index}: {outside}"
                    )
                warnings.warn(
                    GGUFWarning(f"{source}: GGUF metadata tokenizer.ggml.{key} {index} is ignored: {outside}"),
                    stacklevel=2,
                )
                index = None
            special_ids[name] = index
        model = one("model", str, "a string naming the tokenizer")
        if model is None:
            raise fail("model", "a string naming the tokenizer")
        pre = one("pre", str, "a string")
        merges = listed("merges", str, "a list of strings 'left right'")
        template = metadata.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise LoadError(
                f"{source}: GGUF metadata tokenizer.chat_template must be a string, found {_found(template)}"
            )
        vocabulary = cls(
            model=model,
            pre=pre,
            tokens=tokens,
            types=types or [1] * len(tokens),
            scores=scores,
            merges=merges,
            pairs=None,
            special_ids=special_ids,
            add_bos=one("add_bos_token", bool, "true or false"),
            add_eos=one("add_eos_token", bool, "true or false"),
            chat_template=template,
        )
        pairs = vocabulary._check_kind(metadata.get("general.architecture"), source)
        return dataclasses.replace(vocabulary, pairs=pairs)

    def _check_kind(self, architecture: object, source: str) -> list[list[str]] | None:
        """Refuse a tokenizer kind, pre-tokenizer or merge list the builders below cannot use; the merges
        split into pairs."""
        if self.model not in SUPPORTED_MODELS:
            supported = ", ".join(f"{name} ({kind})" for name, kind in SUPPORTED_MODELS.items())
            raise LoadError(
                f"{source}: GGUF metadata tokenizer.ggml.model {self.model!r} is not supported; supported: {supported}"
            )
        if self.model == "gpt2":
            if (self.pre or "default") not in _BYTE_LEVEL_PRE:
                raise LoadError(
                    f"{source}: GGUF metadata tokenizer.ggml.pre {self.pre!r} is not supported; "
                    f"supported: {', '.join(_BYTE_LEVEL_PRE)}"
                )
            if self.merges is None:
                raise LoadError(f"{source}: GGUF metadata has no tokenizer.ggml.merges (byte-level BPE needs them)")
        elif self.pre in _BYTE_LEVEL_PRE and self.pre not in ("default", None):
            raise LoadError(
                f"{source}: GGUF metadata tokenizer.ggml.pre {self.pre!r} (a byte-level split) does not go "
                "with tokenizer.ggml.model 'llama' (SentencePiece)"
            )
        elif self.merges is None and self.scores is None and architecture not in GEMMA_ARCHITECTURES:
            raise LoadError(
                f"{source}: GGUF metadata has neither tokenizer.ggml.merges nor tokenizer.ggml.scores "
                f"(tokenizer.ggml.model 'llama', architecture {architecture!r})"
            )
        if self.merges is None:
            return None
        pairs = []
        for index, merge in enumerate(self.merges):
            pair = merge.split(" ", 1) if self.model == "gpt2" else merge.split(" ")
            if len(pair) != 2:
                raise LoadError(f"{source}: GGUF metadata tokenizer.ggml.merges[{index}] {merge!r} is not 'left right'")
            pairs.append(pair)
        _check_merges(pairs, set(self.spelled(architecture)), source)
        return pairs

    def spelled(self, architecture: object) -> list[str]:
        """The tokens as the tokenizer spells them: Gemma files store a token of blanks with real spaces
        ("  "); its SentencePiece tokenizer spells them "▁▁"."""
        if self.model == "llama" and architecture in GEMMA_ARCHITECTURES:
            return ["\u2581" * len(t) if " " in t and not t.strip() else t for t in self.tokens]
        return self.tokens

    def text(self, name: str) -> str | None:
        """The text of a special token (`bos`, `eos`, `unknown`, `padding`) as the file spells it."""
        index = self.special_ids[name]
        return None if index is None else self.tokens[index]


def tokenizer_files(
    metadata: dict[str, object], source: str, vocabulary: GGUFVocabulary | None = None, merges: bool = True
) -> tuple[dict, dict, dict]:
    """(tokenizer.json, tokenizer_config.json, generation_config.json) contents for a GGUF's tokenizer.

    `metadata` maps each GGUF key to its value (arrays as lists), as `GGUFReader` fields' `contents()`
    give them; `source` names the file in errors; `vocabulary`, if the caller has read it already, is
    `GGUFVocabulary.read(metadata, source)`. Raises LoadError naming the file and the key for a tokenizer
    kind that is not supported or metadata that cannot describe one.

    With `merges=False`, Gemma's merges are not listed (half a million, seconds to derive in Pyodide): the
    document says `"merges_by_position": true` instead, which only ruvllm's plain-Python tokenizer
    (text/bpe.py) reads, ranking each merge as `merges_by_position` would.

    >>> tokenizer_json, tokenizer_config, generation_config = tokenizer_files(metadata, "gemma-3-270m.gguf")
    >>> Tokenizer(json.dumps(tokenizer_json), tokenizer_config).encode("Hello")
    [2, 9259]
    """
    architecture = metadata.get("general.architecture")
    vocabulary = vocabulary or GGUFVocabulary.read(metadata, source)
    if vocabulary.model == "gpt2":
        tokenizer, add_bos, add_eos = _byte_level(vocabulary)
    else:
        tokenizer, add_bos, add_eos = _sentencepiece(vocabulary, architecture, merges)

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as written, not rebuilt by a class
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": vocabulary.text("bos"),
        "eos_token": vocabulary.text("eos"),
        "unk_token": vocabulary.text("unknown"),
        "pad_token": vocabulary.text("padding"),
        "clean_up_tokenization_spaces": False,
    }
    if vocabulary.chat_template:
        tokenizer_config["chat_template"] = vocabulary.chat_template
    elif architecture in GEMMA_ARCHITECTURES:
        tokenizer_config["chat_template"] = GEMMA_CHAT_TEMPLATE
        tokenizer_config["chat_template_source"] = "built-in gemma"

    ids = vocabulary.special_ids
    end_ids = {i for name in ("eos", "eot", "eom") if (i := ids[name]) is not None}
    if architecture in GEMMA_ARCHITECTURES and "<end_of_turn>" in vocabulary.tokens:
        end_ids.add(vocabulary.tokens.index("<end_of_turn>"))  # Gemma 3's generation_config: [1, 106]
    eos = sorted(end_ids)
    generation_config = {"bos_token_id": ids["bos"], "eos_token_id": eos[0] if len(eos) == 1 else eos}
    if ids["padding"] is not None:
        generation_config["pad_token_id"] = ids["padding"]
    return tokenizer, tokenizer_config, generation_config


# --- byte-level BPE ("gpt2") ---------------------------------------------------------------------------


def _byte_level(vocabulary: GGUFVocabulary) -> tuple[dict, bool, bool]:
    pre = vocabulary.pre or "default"
    vocab: dict[str, int] = {}
    for index, token in enumerate(vocabulary.tokens):
        vocab.setdefault(token, index)  # a repeated spelling keeps its first id
    merges = vocabulary.pairs
    assert merges is not None  # (read refuses byte-level BPE without merges)

    added = _AddedTokens(vocab)
    added.add(_typed(vocabulary, CONTROL), special=True)
    added.add(_typed(vocabulary, USER_DEFINED), special=False)

    add_bos, add_eos = bool(vocabulary.add_bos), bool(vocabulary.add_eos)
    bos, eos = vocabulary.text("bos") if add_bos else None, vocabulary.text("eos") if add_eos else None
    post_processor = None
    if add_bos or add_eos:  # the pair template keeps the `tokenizers` library's default
        single = [_special_piece(bos, 0)] if bos else []
        single += [_sequence_piece("A", 0)] + ([_special_piece(eos, 0)] if eos else [])
        post_processor = {
            "type": "TemplateProcessing",
            "single": single,
            "pair": [_sequence_piece("A", 0), _sequence_piece("B", 1)],
            "special_tokens": {t: _special_entry(t, vocab[t]) for t in (bos, eos) if t},
        }
    tokenizer = _document(
        added=added.document(),
        normalizer=None,
        pre_tokenizer=copy.deepcopy(_BYTE_LEVEL_PRE[pre]),  # the caller owns the document
        post_processor=post_processor,
        decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        model=_bpe(vocab, merges, unk_token=None, fuse_unk=False, byte_fallback=False),
    )
    return tokenizer, add_bos, add_eos


# --- SentencePiece BPE ("llama") ------------------------------------------------------------------------


def _sentencepiece(vocabulary: GGUFVocabulary, architecture: object, list_merges: bool) -> tuple[dict, bool, bool]:
    gemma = architecture in GEMMA_ARCHITECTURES
    tokens = vocabulary.spelled(architecture)
    vocab = dict(zip(tokens, range(len(tokens)), strict=True))  # a repeated spelling keeps its last id
    by_position = False
    if vocabulary.pairs is not None:
        merges = vocabulary.pairs
    elif gemma:
        by_position = not list_merges
        merges = [] if by_position else merges_by_position(tokens, vocab)
    else:  # GGUFVocabulary.read made sure there are scores
        assert vocabulary.scores is not None
        merges = merges_by_score(tokens, vocabulary.scores, vocab)

    # The special tokens transformers adds, in its order (a later addition of the same text sets its flag):
    # the class defaults, the file's control and user-defined tokens, then the file's named tokens.
    defaults = ("<unk>", "<bos>", "<eos>", "<pad>", "<mask>") if gemma else ("<unk>", "<s>", "</s>")
    added = _AddedTokens(vocab)
    added.add(defaults, special=True)
    added.add(_typed(vocabulary, CONTROL), special=True)
    added.add(_typed(vocabulary, USER_DEFINED), special=False)
    named = [vocabulary.text(name) for name in ("bos", "eos", "unknown", "padding")] + (["<mask>"] if gemma else [])
    added.add([t for t in named if t is not None and t not in added.ids], special=True)

    add_bos = True if vocabulary.add_bos is None else vocabulary.add_bos  # llama.cpp's default for SentencePiece
    add_eos = bool(vocabulary.add_eos)
    bos, eos = vocabulary.text("bos"), vocabulary.text("eos")
    add_bos, add_eos = add_bos and added.id_of(bos) is not None, add_eos and added.id_of(eos) is not None
    post_processor = _bos_eos_template(bos if add_bos else None, eos if add_eos else None, added)

    spaces: dict[str, object] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    decoders: list[dict[str, object]] = [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    normalizer: dict[str, object] | None
    if gemma:
        normalizer = spaces
        pre_tokenizer = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        unk_token = "<unk>"  # GemmaTokenizer's, whatever the file names
    else:
        # LlamaTokenizer: a `▁` before the first word; the decoder drops it again. Phi-3 puts it there with a
        # normalizer instead, so a text that starts with spaces keeps one more (transformers' phi3_tokenizer).
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        if architecture == "phi3":
            normalizer = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, spaces]}
            pre_tokenizer = None
        else:
            normalizer = None
            pre_tokenizer = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
        unk_token = None
    tokenizer = _document(
        added=added.document(),
        normalizer=normalizer,
        pre_tokenizer=pre_tokenizer,
        post_processor=post_processor,
        decoder={"type": "Sequence", "decoders": decoders},
        model=_bpe(vocab, merges, unk_token=unk_token, fuse_unk=True, byte_fallback=True),
    )
    if by_position:
        tokenizer["model"]["merges_by_position"] = True
    return tokenizer, add_bos, add_eos


def merges_by_position(tokens: list[str], vocab: dict[str, int]) -> list[list[str]]:
    """Gemma's merges: every way to cut a token into two tokens, earlier tokens first, and within a token
    the longer left part first (transformers' `generate_merges` with the negated position as the score).

    Runs once per load, in Pyodide too: about 1.2 million cuts for Gemma 3's 262,144 tokens.
    """
    known = vocab.__contains__
    cuts = [range(n - 1, 0, -1) for n in range(max(map(len, tokens)) + 1)]  # n -> left lengths, longest first
    merges: list[list[str]] = []
    append = merges.append
    for index, token in enumerate(tokens):
        if vocab[token] != index:
            continue  # a repeated spelling ranks at its last position
        for k in cuts[len(token)]:
            left = token[:k]
            if known(left):
                right = token[k:]
                if known(right):
                    append([left, right])
    return merges


def merges_by_score(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[list[str]]:
    """A SentencePiece vocabulary's merges: every way to cut a token into two tokens, ranked by the token's
    score, then by the longer left part, then the longer right part (transformers' `generate_merges`)."""
    score_of = dict(zip(tokens, scores, strict=True))  # a repeated spelling: first place, last score
    ranked = []
    for token, score in score_of.items():
        cuts = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
        cuts.sort(key=lambda cut: (vocab[cut[0]], vocab[cut[1]]))
        ranked += [(score, len(left), len(right), left, right) for left, right in cuts]
    ranked.sort(key=lambda entry: entry[:3], reverse=True)  # stable: equal keys keep the order above
    return [[left, right] for _, _, _, left, right in ranked]


# --- pieces of the tokenizer.json document ---------------------------------------------------------------


class _AddedTokens:
    """Added tokens by id, as `tokenizers` keeps them: a text takes its vocabulary id, and adding a text
    again replaces its flags."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab
        self.ids: dict[str, int] = {}
        self.by_id: dict[int, tuple[str, bool]] = {}  # id -> (text, special)

    def add(self, texts: Sequence[str], special: bool) -> None:
        for text in texts:
            index = self.id_of(text)
            if not text or index is None:
                continue  # never past the vocabulary (see the module docstring); `tokenizers` skips ""
            self.ids[text] = index
            self.by_id[index] = (text, special)

    def id_of(self, text: str | None) -> int | None:
        if text is None:
            return None
        return self.ids.get(text, self.vocab.get(text))

    def document(self) -> list[dict]:
        return [
            {
                "id": index,
                "content": text,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": special,
            }
            for index, (text, special) in sorted(self.by_id.items())
        ]


def _typed(vocabulary: GGUFVocabulary, kind: int) -> list[str]:
    return list(compress(vocabulary.tokens, map(kind.__eq__, vocabulary.types)))  # (read checked the lengths)


def _check_merges(merges: list[list[str]], vocab: set[str], source: str) -> None:
    """Both sides and the merged token must be tokens (`tokenizers` refuses the file otherwise)."""
    for index, (left, right) in enumerate(merges):
        for part in (left, right, left + right):
            if part not in vocab:
                raise LoadError(
                    f"{source}: GGUF metadata tokenizer.ggml.merges[{index}] {left + ' ' + right!r} names "
                    f"{part!r}, which is not in tokenizer.ggml.tokens"
                )


def _special_piece(text: str, type_id: int) -> dict:
    return {"SpecialToken": {"id": text, "type_id": type_id}}


def _sequence_piece(name: str, type_id: int) -> dict:
    return {"Sequence": {"id": name, "type_id": type_id}}


def _special_entry(text: str, index: int | None) -> dict:
    return {"id": text, "ids": [index], "tokens": [text]}


def _bos_eos_template(bos: str | None, eos: str | None, added: _AddedTokens) -> dict:
    """transformers' `update_post_processor`: `bos $A eos` and `bos $A eos bos $B eos`, each where enabled."""

    def around(name: str, type_id: int) -> list[dict]:
        return [
            *([_special_piece(bos, type_id)] if bos else []),
            _sequence_piece(name, type_id),
            *([_special_piece(eos, type_id)] if eos else []),
        ]

    return {
        "type": "TemplateProcessing",
        "single": around("A", 0),
        "pair": around("A", 0) + around("B", 1),
        "special_tokens": {t: _special_entry(t, added.id_of(t)) for t in (bos, eos) if t},
    }


def _bpe(vocab: dict[str, int], merges: list, unk_token: str | None, fuse_unk: bool, byte_fallback: bool) -> dict:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": unk_token,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": fuse_unk,
        "byte_fallback": byte_fallback,
        "ignore_merges": False,
        "vocab": dict(sorted(vocab.items(), key=itemgetter(1))),  # by id, as `tokenizers` writes it
        "merges": merges,
    }


def _document(**parts: object) -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": parts["added"],
        "normalizer": parts["normalizer"],
        "pre_tokenizer": parts["pre_tokenizer"],
        "post_processor": parts["post_processor"],
        "decoder": parts["decoder"],
        "model": parts["model"],
    }


def _found(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
