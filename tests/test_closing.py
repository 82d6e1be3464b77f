"""Closings and budgets (runtime/constrain/closing.py): a constrained document ends within max_tokens
whenever its shortest closing fits, with the real SmolLM2 vocabulary and random logits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ruvllm.runtime.constrain import Budgeted, Matcher, Vocabulary, json_grammar
from ruvllm.runtime.constrain.closing import closer_of, closing_tokens
from ruvllm.runtime.constrain.parser import is_complete, read_byte
from ruvllm.text.tokenizer import Tokenizer
from test_constrain import FLAT, WALKS


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_folder(str(smollm2_dir))


@pytest.fixture(scope="module")
def vocabulary(smollm2_tokenizer) -> Vocabulary:
    eos = [smollm2_tokenizer.token_id("<|im_end|>")]
    tokens = smollm2_tokenizer.token_bytes
    return Vocabulary(tokens, len(tokens), smollm2_tokenizer.special_ids, eos)


@pytest.fixture(scope="module")
def validate():
    jsonschema = pytest.importorskip("jsonschema")
    return lambda document, schema: jsonschema.validate(document, schema or {"type": "object"})


def walk(constraint: Budgeted, vocabulary, rng: np.random.Generator, steps: int) -> tuple[bytes, bool]:
    """Random tokens under the mask (plain text and EOS made rare, so that documents run long): the bytes
    written and whether EOS came within `steps` tokens."""
    out = bytearray()
    weight = np.where(vocabulary.plain_mask, 1.0, 0.05)  # (V,)
    weight[list(vocabulary.eos_ids)] = 1e-4
    for _ in range(steps):
        allowed = constraint.allowed()  # (V,)
        ids = np.flatnonzero(allowed)
        assert len(ids), f"no token allowed after {bytes(out)!r}"
        token = int(rng.choice(ids, p=weight[ids] / weight[ids].sum()))
        if token in vocabulary.eos_ids:
            return bytes(out), True
        constraint.advance(token)
        out += vocabulary.token_bytes[token]
    return bytes(out), False


COUNTED = {  # any order, minProperties, dependentRequired: closings that pick properties to write
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 4}, "c": {"type": "boolean"}},
    "dependentRequired": {"a": ["c"]},
    "minProperties": 2,
    "maxProperties": 3,
    "additionalProperties": False,
}
BUDGETED = {**WALKS, "counted": COUNTED}


@pytest.mark.parametrize("name", BUDGETED)
def test_documents_end_within_the_budget_whenever_their_shortest_closing_fits(name, vocabulary, validate):
    schema = BUDGETED[name]
    grammar = json_grammar(schema, extra_properties=False, whitespace="flexible")
    rng = np.random.default_rng(sum(name.encode()))
    shortest = Budgeted(grammar, vocabulary, 1).reserve(Budgeted(grammar, vocabulary, 1).state)
    for budget in (shortest, shortest + 1, shortest + 4, shortest + 15, shortest + 40):
        for _ in range(6):
            data, ended = walk(Budgeted(grammar, vocabulary, budget), vocabulary, rng, budget)
            assert ended, f"budget {budget}: no EOS within it after {data!r}"
            document = json.loads(data.decode("utf-8"))
            validate(document, schema)


def test_a_budget_below_the_shortest_document_leaves_the_mask_as_it_is(vocabulary):
    grammar = json_grammar(FLAT)
    budgeted, matcher = Budgeted(grammar, vocabulary, 3), Matcher(grammar, vocabulary)
    assert not budgeted.fits
    assert np.array_equal(budgeted.allowed(), matcher.allowed())


def whole(grammar, text: bytes) -> bool:
    """Whether `text` is a whole document of the grammar (prefix and suffix included)."""
    configs = {grammar.initial_config()}
    for b in text:
        configs = {x for config in configs for x in read_byte(grammar.rules, config, b)}
    return any(is_complete(grammar.rules, config) for config in configs)


def test_closings_are_accepted_by_the_parser_from_every_state_of_a_document():
    grammar = json_grammar(WALKS["combined"], prefix="<call>", suffix="</call>", whitespace="flexible")
    closer = closer_of(grammar)
    text = b'<call>{ "at": [0.5, -1], "shape": 0.75 }</call>'
    configs = {grammar.initial_config()}
    for i, b in enumerate(text):
        closing = closer.closing(frozenset(configs))
        assert closing is not None, text[:i]
        assert whole(grammar, text[:i] + closing), (text[:i], closing)
        configs = {x for config in configs for x in read_byte(grammar.rules, config, b)}
    assert closer.closing(frozenset(configs)) == b""


def test_closing_tokens_are_the_fewest_that_spell_the_text(vocabulary, smollm2_tokenizer):
    text = b'"}]}\n</tool_call>'
    fewest = closing_tokens(vocabulary, text)[0]
    assert fewest <= len(smollm2_tokenizer.encode(text.decode()))
    assert fewest < len(text) and closing_tokens(vocabulary, b"")[0] == 0
