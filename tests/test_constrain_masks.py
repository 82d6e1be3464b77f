"""The shortcuts of the constraint's masks (runtime/constrain/automaton.py, pattern_tokens.py) give exactly
the masks of the plain walk over the whole vocabulary trie, state by state, along random generations
under schemas with patterns, formats, lengths, escapes and non-ASCII text.

Among the shortcuts: masks shared by the character counts of a string far from its length bounds.

Two vocabularies: a synthetic one made of the token shapes the shortcuts tell apart (plain text, text
then a quote, escapes, broken and whole UTF-8 characters, ...), and SmolLM2's real one.
"""

from __future__ import annotations

import numpy as np
import pytest

from ruvllm.runtime.constrain import Matcher, Vocabulary, json_grammar
from ruvllm.runtime.constrain.automaton import Automaton

WORDS = [
    *"abcxyzAZ_-09.:@/?#=&%+T",
    "ab", "name", "Name_1", "a-b", "hello world", "x y", "2024", "12", "-0", "1.5", "T12:", "00Z", "+01:00",
    "user", "@example", ".com", "http", "https", "://", "www.", "/path", "?q=1", "#top", "192.", "168.0.1",
    "::1", "fe80::", "0123456789abcdef", "ABCDEF", "deadbeef", "-4a2b-", "é", "日本", "ñandú", "😀",
    '"', '",', '"}', '"]', '":', '": "', '"a', 'ab"', 'ab",', '12"', 'é"', 'x"}', "a\\", "\\", '\\"', "\\\\",
    "\\/", "\\n", "\\u00e9", "\\u", "ab\\", "\\\\a", '\\"a', " ", "  ", '  "', "\n", "\n  ", "{", "}", "[", "]",
    ",", ', "', "{\"", "null", "true", "a\tb", "\x7f",
]  # fmt: skip
BROKEN = [b"\xc3", b"\xa9", b"\xe6\x97", b"\xa5", b"a\xc3", b"\xe6", b"\xed\xa0\x80", b"\xf0\x9f", b"\x98\x80"]
TOKENS = [b"</s>", *(bytes([b]) for b in range(256)), *(w.encode() for w in WORDS), *BROKEN]
SYNTHETIC = Vocabulary(TOKENS, len(TOKENS) + 2, special_ids=[], eos_ids=[0])

SCHEMAS = [
    {"type": "string", "pattern": "^[0-9a-zA-Z_-]{1,255}$"},
    {"type": "string", "pattern": "^[A-Fa-f\\d]{24}$"},
    {"type": "string", "pattern": "ab"},  # a search: anything around it
    {"type": "string", "pattern": "^[a-z ]*$", "minLength": 3, "maxLength": 8},
    {"type": "string", "pattern": "^(a|ab|abc)+x?$", "minLength": 4},
    {"type": "string", "pattern": '^[^"]*\\\\?[\\\\/"]?.+$', "maxLength": 6},  # escapes of " \\ and /
    {"type": "string", "pattern": "^.+$"},  # non-ASCII allowed
    {"type": "string", "pattern": "^[a-zé]+$"},  # é alone: non-ASCII never written
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "uri"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "ipv6"},
    {"type": "array", "items": {"type": "string", "pattern": "^[0-9]{2,3}$"}, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "ipv4"},
            "tag": {"anyOf": [{"pattern": "^x+$"}, {"type": "null"}]},
        },
        "additionalProperties": False,
    },
    {"type": "object", "propertyNames": {"pattern": "^[a-c]{1,3}$"}, "additionalProperties": {"type": "integer"}},
    # counts far from the maximum length share one mask (the synthetic tokens have at most 16 bytes)
    {"type": "string", "minLength": 2, "maxLength": 40},
    {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    {"type": "string", "pattern": "^[a-z]*[0-9]{3}$", "minLength": 5, "maxLength": 45},
    {"type": "string", "pattern": "^.*$", "minLength": 18, "maxLength": 36},
    {"type": "object", "patternProperties": {"^x_": {"pattern": "^y"}}, "additionalProperties": False},
]


def compare_along_generations(vocabulary: Vocabulary, schema: dict, seeds: int, steps: int) -> int:
    """Random generations under `schema`; at each step the mask must equal the plain walk's. Returns how
    many states were compared."""
    grammar = json_grammar(schema)
    compared = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        matcher = Matcher(grammar, vocabulary)
        automaton = grammar.automaton(vocabulary)
        for _ in range(steps):
            allowed = matcher.allowed()  # (V,)
            state = matcher._state
            walked = automaton.walked_mask(state) | (vocabulary.eos_mask if matcher.complete else False)  # (V,)
            if not matcher.finished:
                different = np.flatnonzero(allowed != walked)
                assert not len(different), (
                    f"{schema}: state {automaton.states[state].configs}: "
                    f"{[(vocabulary.token_bytes[t], bool(walked[t])) for t in different[:8]]}"
                )
                compared += 1
            ids = np.flatnonzero(allowed & ~vocabulary.eos_mask)  # (A,)
            if not len(ids):
                break
            # favour tokens that are not plain text, so that strings close and escapes get written
            weights = np.where(vocabulary.plain_mask[ids], 1.0, 3.0)  # (A,)
            matcher.advance(int(rng.choice(ids, p=weights / weights.sum())))
    return compared


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(i) for i in range(len(SCHEMAS))])
def test_masks_equal_the_plain_walk_on_a_synthetic_vocabulary(schema):
    assert compare_along_generations(SYNTHETIC, schema, seeds=6, steps=30) >= 12


@pytest.fixture(scope="module")
def smollm2_vocabulary(smollm2_dir):
    from ruvllm.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(str(smollm2_dir))
    eos = [tokenizer.token_id("<|im_end|>")]
    return Vocabulary(tokenizer.token_bytes, len(tokenizer.token_bytes), tokenizer.special_ids, eos)


@pytest.mark.parametrize("schema", [SCHEMAS[0], SCHEMAS[4], SCHEMAS[6], SCHEMAS[9], SCHEMAS[14]], ids=str)
def test_masks_equal_the_plain_walk_on_smollm2(schema, smollm2_vocabulary):
    assert compare_along_generations(smollm2_vocabulary, schema, seeds=2, steps=8) >= 8


def test_the_character_trie_spells_every_plain_head():
    trie = SYNTHETIC.char_trie
    parent = np.zeros(trie.nodes, np.int64)  # (nodes,)
    symbol = np.zeros(trie.nodes, np.int64)  # (nodes,)
    for k, (parents, symbols) in enumerate(zip(trie.parents, trie.symbols, strict=True)):
        start = trie.offsets[k + 1]
        parent[start : start + len(parents)] = trie.offsets[k] + parents
        symbol[start : start + len(parents)] = symbols

    def spelled(node: int) -> list[int]:
        out = []
        while node:
            out.append(int(symbol[node]))
            node = int(parent[node])
        return out[::-1]

    for token in np.flatnonzero(SYNTHETIC.plain_mask):
        assert spelled(SYNTHETIC.plain_node[token]) == [min(ord(c), 128) for c in TOKENS[token].decode()]
    for token, chars, node, rest in SYNTHETIC.headed_others:
        head = TOKENS[token][: len(TOKENS[token]) - len(rest)]
        assert spelled(node) == [min(ord(c), 128) for c in head.decode()] and chars == len(head.decode())
    assert SYNTHETIC.plain_node[TOKENS.index(b'ab"')] == SYNTHETIC.char_trie.nodes  # not plain: never all at once


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 40},
        {"type": "string", "minLength": 7, "maxLength": 30},
        {"type": "string", "pattern": "^[a-z]*[0-9]{20}$", "maxLength": 45},  # 20 characters still to come
    ],
    ids=str,
)
def test_masks_equal_the_plain_walk_at_every_count_of_a_bounded_string(schema):
    automaton = json_grammar(schema).automaton(SYNTHETIC)
    state, compared = automaton.transition(automaton.initial, ord('"')), 0
    while state >= 0:  # "a", "aa", ... as long as the string can go on
        assert (automaton.mask(state) == automaton.walked_mask(state)).all(), automaton.states[state].configs
        state, compared = automaton.transition(state, ord("a")), compared + 1
    assert compared >= 26


class _PlainWalk(Automaton):
    """The automaton without the shortcut of key prefixes (bytes out of the key trie read from the
    undeclared key's state): its walked masks step the parser at every byte."""

    def _via(self, state):
        return ()


# Objects whose undeclared keys may start as declared ones: "nam", "names", "name2" next to "name"; keys
# with escapes and non-ASCII characters; a declared key written twice (refused); an excluded key.
KEY_SCHEMAS = [
    {"properties": {"name": {"type": "string"}, "nap": {"type": "integer"}, 'q"t': {}, "né": {}, "id": {}}},
    {
        "properties": {"name": {"type": "integer"}, "nam": {"type": "null"}, "x": False},
        "required": ["name"],
        "additionalProperties": {"type": "boolean"},
    },
    {"properties": {"name": {}, "nap": {}}, "propertyNames": {"maxLength": 5}, "maxProperties": 3},
    {"properties": {"name": {}, "nap": {}}, "additionalProperties": False},
    {"properties": {"ab": {}, "abc": {}}, "patternProperties": {"^a": {"type": "integer"}}},
]
KEY_TEXTS = [
    '{"name": "x", "nam": 1, "names": true, "name2": null, "nap": 3}',
    '{"nam": null, "name": 1, "nape": false, "n": true, "na\\u00e9": 2, "n\\"x": 1, "né": 1, "nék": 2}',
    '{"q\\"t": 1, "q\\"": 2, "q": 3, "i": 1, "id": 2, "idx": 3, "name": 4, "name": 5}',
    '{"ab": 1, "abd": 2, "abc": 3, "a": 4, "x": 5}',
]


def compare_along_texts(vocabulary: Vocabulary, schema: dict, order: str, texts: list[str]) -> int:
    """The masks at every byte of each text, as far as the grammar reads it, against the walk that steps
    the parser at every byte. Returns how many states were compared."""
    grammar = json_grammar(schema, whitespace="flexible", property_order=order)
    automaton = grammar.automaton(vocabulary)
    plain = _PlainWalk(grammar.rules, grammar.initial_config(), vocabulary)
    compared = 0
    for text in texts:
        state = automaton.initial
        for b in text.encode():
            configs = automaton.states[state].configs
            walked = plain.walked_mask(plain.intern(configs))  # (V,)
            different = np.flatnonzero(automaton.mask(state) != walked)
            assert not len(different), (
                f"{schema} ({order}): after {configs}: "
                f"{[(vocabulary.token_bytes[t], bool(walked[t])) for t in different[:8]]}"
            )
            compared += 1
            state = automaton.transition(state, b)
            if state < 0:
                break
    return compared


@pytest.mark.parametrize(
    ("schema", "order"),
    [
        (schema, order)
        for schema in KEY_SCHEMAS
        for order in ("any", "schema")
        if "maxProperties" not in schema or order == "any"
    ],
    ids=[
        f"{i}-{order}"
        for i, schema in enumerate(KEY_SCHEMAS)
        for order in ("any", "schema")
        if "maxProperties" not in schema or order == "any"
    ],
)
def test_masks_of_keys_equal_the_plain_walk_on_a_synthetic_vocabulary(schema, order):
    assert compare_along_texts(SYNTHETIC, {"type": "object", **schema}, order, KEY_TEXTS) >= 20


@pytest.mark.parametrize("order", ["any", "schema"])
def test_masks_of_keys_equal_the_plain_walk_on_smollm2(order, smollm2_vocabulary):
    text = '{"name": 1, "nam": null, "names": true, "n'
    assert compare_along_texts(smollm2_vocabulary, {"type": "object", **KEY_SCHEMAS[1]}, order, [text]) == len(text)


@pytest.mark.parametrize("order", ["any", "schema"])
def test_undeclared_keys_may_start_as_declared_ones(order):
    grammar = json_grammar({"type": "object", **KEY_SCHEMAS[0]}, property_order=order)
    automaton = grammar.automaton(SYNTHETIC)

    def reads(text: str) -> bool:
        state = automaton.initial
        for b in text.encode():
            state = automaton.transition(state, b)
            if state < 0:
                return False
        return automaton.states[state].complete

    assert reads('{"name":"x","nam":1,"names":2,"na":3,"q\\"":4,"q\\"t":5,"n\\u00e9":6,"né":7,"nék":8}')
    assert not reads('{"name":"x","name":"y"}')  # a declared key twice
    assert not reads('{"nap":"x"}')  # a declared key's value
    assert reads('{"nap":1,"x":{"name":1}}')
