"""The tokenizer the converter writes from SmolLM2's GGUF, against the model's own tokenizer.

Reference: transformers' tokenizer built from the same GGUF. transformers ignores
`tokenizer.ggml.pre = smollm`, which (like SmolLM2's original tokenizer.json and llama.cpp) first
isolates every `\\p{N}` character; so the reference encodes the text cut at each such character. For
text without non-ASCII numerals that is exactly transformers' plain output (checked too).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from transformers import AutoTokenizer

from ruvllm.text.tokenizer import Tokenizer

pytestmark = pytest.mark.parity

# Shared with the JavaScript parity test (test_js_text.py): accents, CJK, Arabic, emoji with ZWJ, code,
# runs of spaces/tabs/newlines, digits and other numerals, special tokens written in text.
_DATA = json.loads((Path(__file__).parent / "data" / "text_corpus.json").read_text(encoding="utf-8"))
CORPUS: list[str] = _DATA["texts"]
CONVERSATIONS: list[list[dict]] = _DATA["conversations"]


@pytest.fixture(scope="module")
def ours(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_folder(str(smollm2_dir))


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    return AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


def split_numerals(text: str) -> list[str]:
    """Cut text around every Unicode number character (category N*), keeping all pieces."""
    pieces, current = [], ""
    for ch in text:
        if unicodedata.category(ch).startswith("N"):
            pieces += [current, ch] if current else [ch]
            current = ""
        else:
            current += ch
    return [*pieces, current] if current else pieces


def reference_ids(reference, text: str) -> list[int]:
    return [i for piece in split_numerals(text) for i in reference.encode(piece, add_special_tokens=False)]


@pytest.mark.parametrize("text", CORPUS)
def test_encode_matches_the_models_tokenizer(ours, reference, text):
    expected = reference_ids(reference, text)
    assert ours.encode(text) == expected
    if all(ch.isascii() or not unicodedata.category(ch).startswith("N") for ch in text):
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False)


def test_numerals_are_split_one_by_one(ours):
    # "½" alone and after a space: the space must not merge into the numeral's bytes.
    assert ours.encode("a ½") == ours.encode("a ") + ours.encode("½")
    assert ours.encode("123") == [ours.token_id("1"), ours.token_id("2"), ours.token_id("3")]


def test_special_tokens_are_recognised_in_text(ours):
    assert ours.encode("<|im_start|>user<|im_end|>") == [1, ours.token_id("user"), 2]


@pytest.mark.parametrize("text", CORPUS)
def test_streaming_detokenizer_reproduces_the_text(ours, text):
    ids = ours.encode(text)
    detok = ours.detokenizer()
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.finish())
    assert "".join(pieces) == ours.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_detokenizer_holds_back_a_split_character(ours):
    ids = ours.encode("🤖")
    assert len(ids) > 1  # the emoji's four bytes span several tokens
    detok = ours.detokenizer()
    pieces = [detok.add(i) for i in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🤖"


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours, reference, messages, add_generation_prompt):
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(messages, add_generation_prompt) == expected
    expected_ids = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if isinstance(expected_ids, dict) or hasattr(expected_ids, "input_ids"):
        expected_ids = expected_ids["input_ids"]
    assert ours.encode_chat(messages, add_generation_prompt) == list(expected_ids)


def test_chat_messages_are_checked(ours):
    from ruvllm.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="messages must be a non-empty list"):
        ours.apply_chat_template([])
    with pytest.raises(InvalidArgumentError, match="message 0 must have a string 'role' and a string 'content'"):
        ours.apply_chat_template([{"role": "user"}])
