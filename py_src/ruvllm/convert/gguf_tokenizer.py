"""A Hugging Face `tokenizer.json` from a GGUF file's vocabulary, merges and special tokens.

Only byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`) are handled. How text is split before
BPE depends on `tokenizer.ggml.pre`, which names the model's own pre-tokenizer in llama.cpp
(llama-vocab.cpp); each supported name maps to the same split in `tokenizers` terms. For example
`smollm` isolates every `\\p{N}` character, then applies the GPT-2 split, exactly as SmolLM's own
tokenizer.json does (Digits(individual_digits) + ByteLevel).
"""

from __future__ import annotations

import json

from ..errors import LoadError

# GGUF token types (llama.cpp: LLAMA_TOKEN_TYPE_*)
_CONTROL, _USER_DEFINED = 3, 4

# Split patterns, as published with each model family's tokenizer.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)

    def split_then_bytes(pattern: str):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
            ]
        )

    table = {
        "default": lambda: gpt2,
        "gpt-2": lambda: gpt2,
        "gpt2": lambda: gpt2,
        "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2]),
        "llama-bpe": lambda: split_then_bytes(_LLAMA3),
        "llama3": lambda: split_then_bytes(_LLAMA3),
        "llama-v3": lambda: split_then_bytes(_LLAMA3),
        "qwen2": lambda: split_then_bytes(_QWEN2),
    }
    if pre not in table:
        raise LoadError(f"tokenizer.ggml.pre {pre!r} is not supported; supported: {', '.join(table)}")
    return table[pre]()


def build_tokenizer(reader, meta: dict, src: str) -> tuple[dict, dict, dict]:
    """(tokenizer.json, tokenizer_config.json, generation_config.json) contents."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    def field(name: str, default: object = None) -> object:
        f = reader.fields.get(f"tokenizer.ggml.{name}")
        return f.contents() if f is not None else default

    kind = field("model")
    if kind != "gpt2":
        raise LoadError(f"{src}: tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens: list[str] = field("tokens")
    types: list[int] = field("token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in field("merges") or []]
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(field("pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types, strict=True) if k == _CONTROL]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == _USER_DEFINED
        ]
    )

    def token(name: str) -> str | None:
        index = field(f"{name}_token_id")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    add_bos, add_eos = bool(field("add_bos_token", False)), bool(field("add_eos_token", False))
    bos, eos = token("bos"), token("eos")
    if add_bos or add_eos:
        template = " ".join(([bos] if add_bos else []) + ["$A"] + ([eos] if add_eos else []))
        used = {t for t in (bos if add_bos else None, eos if add_eos else None) if t}
        tokenizer.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(t, vocab[t]) for t in used]
        )

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "clean_up_tokenization_spaces": False,
    }
    template = meta.get("tokenizer.chat_template")
    if template:
        tokenizer_config["chat_template"] = template

    eos_ids = [i for i in (field("eos_token_id"), field("eot_token_id"), field("eom_token_id")) if i is not None]
    generation_config = {"bos_token_id": field("bos_token_id"), "eos_token_id": sorted(set(eos_ids))}
    if field("padding_token_id") is not None:
        generation_config["pad_token_id"] = field("padding_token_id")
    if len(generation_config["eos_token_id"]) == 1:
        generation_config["eos_token_id"] = generation_config["eos_token_id"][0]
    return json.loads(tokenizer.to_str()), tokenizer_config, generation_config
