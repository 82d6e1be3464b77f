"""Constrained JSON decoding (runtime/constrain/): every document sampled under a mask is valid JSON
that matches its schema, every valid document is accepted, and nothing else is.

Two vocabularies: SmolLM2's real one (49152 byte-level BPE tokens), and a tiny synthetic one whose
tokens 2..257 are the 256 single bytes, so a test can write any byte sequence exactly.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from ruvllm.errors import InferenceError, InvalidArgumentError
from ruvllm.runtime.constrain import Matcher, Vocabulary
from ruvllm.runtime.constrain import json_grammar as compact_grammar

# --- the tiny vocabulary -------------------------------------------------------------------------------

EOS, SPECIAL, BYTE0 = 0, 1, 2  # token BYTE0 + b is the single byte b
WORDS = [b'{"', b'":', b'",', b'"}', b"true", b"null", b"12", b' "', b"\n  ", b"\xc3\xa9", b'abc"', b"\xe6\x97", b""]
TINY_TOKENS = [b"</s>", b"{", *(bytes([b]) for b in range(256)), *WORDS]
TINY = Vocabulary(TINY_TOKENS, len(TINY_TOKENS) + 3, special_ids=[SPECIAL], eos_ids=[EOS])


def json_grammar(schema, *args, **options):
    """These tests read JSON written with whitespace: the flexible form (the compact one is tested apart)."""
    return compact_grammar(schema, *args, **{"whitespace": "flexible", **options})


def word(data: bytes) -> int:
    return TINY_TOKENS.index(data, BYTE0 + 256)


def write(matcher: Matcher, text: str | bytes) -> None:
    """Feed text byte by byte, checking that each byte is allowed before it is read."""
    for b in text.encode("utf-8") if isinstance(text, str) else text:
        assert matcher.allowed()[BYTE0 + b], f"byte {bytes([b])!r} refused"
        matcher.advance(BYTE0 + b)


def reads(schema: dict | None, text: str | bytes, **literals: str) -> bool:
    """Whether the grammar takes `text` byte by byte and is complete at its end."""
    matcher = Matcher(json_grammar(schema, **literals), TINY)
    data = text.encode("utf-8") if isinstance(text, str) else text
    for b in data:
        if not matcher.allowed()[BYTE0 + b]:
            with pytest.raises(InvalidArgumentError):
                matcher.advance(BYTE0 + b)
            return False
        matcher.advance(BYTE0 + b)
    return matcher.complete


def assert_refused(schema: dict | None, prefix: str | bytes, following: str | bytes) -> None:
    matcher = Matcher(json_grammar(schema), TINY)
    write(matcher, prefix)
    token = BYTE0 + (following.encode("utf-8") if isinstance(following, str) else following)[0]
    assert not matcher.allowed()[token]
    with pytest.raises(InvalidArgumentError, match="not allowed"):
        matcher.advance(token)


# --- the real vocabulary: random walks -----------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir):
    from ruvllm.text.tokenizer import Tokenizer

    return Tokenizer.from_folder(str(smollm2_dir))


@pytest.fixture(scope="module")
def vocabulary(smollm2_tokenizer) -> Vocabulary:
    eos = [smollm2_tokenizer.token_id("<|im_end|>")]
    return Vocabulary(
        smollm2_tokenizer.token_bytes, len(smollm2_tokenizer.token_bytes), smollm2_tokenizer.special_ids, eos
    )


@pytest.fixture(scope="module")
def validate():
    jsonschema = pytest.importorskip("jsonschema")
    return lambda document, schema: jsonschema.validate(document, schema or {"type": "object"})


class RandomLogits:
    """Temperature-1 sampling from random logits under the mask, until EOS.

    Logits are standard-normal noise; sampling is Gumbel-max in the form argmin(E * exp(-logit)), E
    exponential. Drawing 49k fresh numbers twice a step would make these tests slow, so each step takes
    a window at a random offset of a pool of precomputed E * exp(-noise). Random logits favour plain
    text (48k of 49k tokens), so strings would run ~1600 tokens: tokens that are not plain string text
    get +4, and tokens with "}" or "]" a bias growing with the length, so that free-form documents end.
    """

    def __init__(self, vocabulary: Vocabulary, seed: int) -> None:
        self.vocabulary = vocabulary
        self.rng = np.random.default_rng(seed)
        pool = self.rng.standard_exponential(1 << 20, dtype=np.float32)
        self.pool = pool * np.exp(-self.rng.standard_normal(1 << 20, dtype=np.float32))  # (P,)
        self.weight = np.exp(-4.0 * ~vocabulary.plain_mask).astype(np.float32)  # (V,) exp(-bias)
        self.closing = np.array([b"}" in t or b"]" in t for t in vocabulary.token_bytes])  # (V,)

    def document(self, matcher: Matcher, max_tokens: int = 400) -> bytes:
        """The bytes of one document. Every few steps, a few random tokens are checked: advance() refuses
        them exactly when the mask does."""
        vocabulary, rng = self.vocabulary, self.rng
        out = bytearray()
        for step in range(max_tokens):
            allowed = matcher.allowed()  # (V,)
            assert allowed.shape == (vocabulary.size,)
            if step % 8 == 0:
                for token in rng.integers(0, vocabulary.size, 4):
                    probe = copy.copy(matcher)
                    if allowed[token]:
                        probe.advance(int(token))
                    else:
                        with pytest.raises(InvalidArgumentError):
                            probe.advance(int(token))
            ids = np.flatnonzero(allowed)  # (A,)
            assert len(ids), f"no token allowed after {bytes(out)!r}"
            offset = rng.integers(0, len(self.pool) - len(ids))
            keys = self.pool[offset : offset + len(ids)] * self.weight[ids]  # (A,)
            keys[self.closing[ids]] *= np.float32(np.exp(-0.05 * step))
            token = int(ids[np.argmin(keys)])
            if matcher.complete:
                assert token in vocabulary.eos_ids
                return bytes(out)
            matcher.advance(token)
            out += vocabulary.token_bytes[token]
        raise AssertionError(f"no complete document in {max_tokens} tokens: {bytes(out)[:200]!r}...")


# the flat and nested schemas are shared with benchmarks/constrain_bench.py
SHARED = json.loads((Path(__file__).parent / "data" / "schemas.json").read_text(encoding="utf-8"))["schemas"]
FLAT, NESTED = SHARED["flat"], SHARED["nested"]
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}]},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
            },
            "required": ["value"],
        }
    },
    "$ref": "#/$defs/node",
}
ENUMS = {
    "type": "object",
    "properties": {
        "quote": {"enum": ['say "hi"', "back\\slash", "tab\there", "café", "日本語", "😀", None, 1.5]},
        "fixed": {"const": {"k": [1, "é", True], "n": None}},
    },
    "required": ["quote", "fixed"],
}
FREE = {"type": "object", "additionalProperties": {"type": "integer"}}
FORMATS = {
    "type": "object",
    "properties": {
        "when": {"type": "string", "format": "date-time"},
        "id": {"type": "string", "format": "uuid"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{1,4}$"},
        "host": {"type": "string", "format": "ipv6"},
    },
    "required": ["when", "id", "code", "host"],
}
COMBINED = {  # allOf, $ref beside keywords, oneOf, prefixItems, number bounds, an unknown keyword
    "$defs": {"point": {"prefixItems": [{"type": "number", "minimum": -1, "maximum": 1}] * 2, "items": False}},
    "allOf": [
        {"type": "object", "properties": {"at": {"$ref": "#/$defs/point", "minItems": 2}}, "required": ["at"]},
        {"properties": {"shape": {"oneOf": [{"const": "dot"}, {"type": "number", "exclusiveMinimum": 0.5}]}}},
    ],
    "x-origin": "a vendor keyword",
}
WALKS = {
    "flat": FLAT,
    "nested": NESTED,
    "tree": TREE,
    "enums": ENUMS,
    "free keys": FREE,
    "combined": COMBINED,
    "patterns": FORMATS,
    "json_object": None,
}


@pytest.mark.parametrize("name", WALKS)
def test_documents_sampled_from_random_logits_are_valid_and_match_the_schema(name, vocabulary, validate):
    schema = WALKS[name]
    sampler = RandomLogits(vocabulary, seed=sum(name.encode()))
    for _ in range(200):
        # random text in undeclared keys would rarely end: the walks keep to the declared properties
        data = sampler.document(Matcher(json_grammar(schema, extra_properties=False), vocabulary))
        document = json.loads(data.decode("utf-8"))
        validate(document, schema)
        if schema is None:
            assert isinstance(document, dict)


def test_tool_calls_are_written_between_their_prefix_and_suffix(vocabulary, validate):
    sampler = RandomLogits(vocabulary, seed=7)
    grammar = json_grammar(FLAT, prefix="<tool_call>\n", suffix="\n</tool_call>")
    for _ in range(50):
        text = sampler.document(Matcher(grammar, vocabulary)).decode("utf-8")
        assert text.startswith("<tool_call>\n{") and text.endswith("}\n</tool_call>")
        validate(json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")]), FLAT)


def test_masks_equal_trying_every_token(vocabulary):
    """The trie walk and the plain-text shortcut give the same mask as advancing each token in turn."""
    plain = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}, "n": {"type": "integer"}}}
    patterned = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[a-z]{2}-\\d+$"}},
        "additionalProperties": {"type": "integer"},
    }
    cases = [
        (plain, text) for text in ["", '{"name": "', '{"name": "a', '{"name": "\xe9', '{"name": "ab', '{"n": 1', "{\n "]
    ]
    cases += [(patterned, text) for text in ['{"code": "a', '{"code": "ab-1', '{"co', '{"x']]
    cases += [(plain, text) for text in ['{"na', '{"n": 1, "', '{"nam\xe9']]  # undeclared keys may start here
    counted = {**plain, "required": ["n"], "maxProperties": 2}  # an undeclared key only while one more fits
    cases += [(counted, text) for text in ['{"', '{"x": 1, "', '{"name": "a", "', '{"n": 1, "x']]
    for schema, text in cases:
        matcher = Matcher(json_grammar(schema), vocabulary)
        data = text.encode("utf-8")[:-1] if text.endswith("\xe9") else text.encode("utf-8")  # half of é
        for b in data:
            matcher.advance(vocabulary.token_bytes.index(bytes([b])))
        expected = np.zeros(vocabulary.size, bool)
        for token in range(vocabulary.size):
            probe = copy.copy(matcher)
            try:
                probe.advance(token)
            except InvalidArgumentError:
                continue
            expected[token] = True
        assert (matcher.allowed() == expected).all(), text


# --- the real tokenizer: valid documents are accepted --------------------------------------------------

VALID = [
    (FLAT, '{"name": "Ada", "age": 36, "role": "admin"}'),
    (FLAT, '{\n  "name": "Zoë Ω",\n  "age": 0,\n  "role": "viewer",\n  "active": false\n}'),
    (FLAT, '{"name":"x","age":120,"role":"editor","email":"a@b.c","score":-1.5e+10,"active":true}'),
    (NESTED, '{"orders": [{"id": 1, "tags": []}, {"id": 22, "tags": ["a", "b\\n"], "note": null}]}'),
    (TREE, '{"value": 1, "children": [{"value": "leaf"}, {"value": -3, "children": []}]}'),
    (ENUMS, '{"quote": "say \\"hi\\"", "fixed": {"k":[1,"é",true],"n":null}}'),
    (ENUMS, '{"quote": "caf\\u00e9", "fixed": {"k":[1,"\\u00e9",true],"n":null}}'),
    (ENUMS, '{"quote": 1.5, "fixed": {"k":[1,"é",true],"n":null}}'),
    (FREE, '{"a": 1, "b c": -20, "日本": 3}'),
    (None, '{"list": [1, 2.5, "x", null, true, {"deep": [[]]}], "s": "\\u00e9 \\t 😀"}'),
    ({"type": ["string", "null"]}, "null"),
    ({"type": "array", "items": {"type": "number"}, "minItems": 2}, "[0.5, 1e-7]"),
]


@pytest.mark.parametrize("schema, text", VALID)
def test_documents_written_by_the_tokenizer_are_accepted_token_by_token(schema, text, smollm2_tokenizer, vocabulary):
    matcher = Matcher(json_grammar(schema), vocabulary)
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(vocabulary.token_bytes[i] for i in ids) == text.encode("utf-8")
    for token in ids:
        assert not matcher.complete
        assert matcher.allowed()[token], f"{vocabulary.token_bytes[token]!r} refused in {text!r}"
        assert not matcher.allowed()[list(vocabulary.eos_ids)].any()
        matcher.advance(token)
    assert matcher.complete
    assert (matcher.allowed() == vocabulary.eos_mask).all()
    matcher.advance(vocabulary.eos_ids[0])


# --- the tiny vocabulary: exact behaviour --------------------------------------------------------------

OBJECT = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string", "minLength": 2, "maxLength": 3}},
    "required": ["b"],
    "additionalProperties": False,
}
REFUSED = [
    (OBJECT, "{", "}"),  # the required "b" is missing
    (OBJECT, '{"', "c"),  # no property "c"
    (OBJECT, '{"b": "xy", "', "b"),  # "b" is written: only "a" may follow
    (OBJECT, '{"b": "xyz', "w"),  # maxLength 3
    (OBJECT, '{"b": "x', '"'),  # minLength 2
    (OBJECT, '{"a": 1,', "}"),  # trailing comma
    (OBJECT, '{"a": 0', "1"),  # leading zero
    (OBJECT, '{"a": 1', "."),  # an integer has no fraction
    (OBJECT, '{"b": "x', "\n"),  # a raw control character in a string
    (OBJECT, '{"b": "x\\', "x"),  # no such escape
    (OBJECT, '{"b": "x\\uD', "8"),  # a UTF-16 surrogate
    (OBJECT, '{"b": "x', b"\xc0"),  # an overlong UTF-8 form
    (OBJECT, '{"b": "x', b"\x80"),  # a continuation byte with no lead byte
    (OBJECT, b'{"b": "x\xed', b"\xa0"),  # a UTF-8 encoded surrogate
    (OBJECT, '{"b": "x', b"\xf5"),  # beyond U+10FFFF
    (OBJECT, b'{"b": "x\xc3', "a"),  # an unfinished character
    (OBJECT, "", " "),  # no whitespace before the document
    (OBJECT, '{"b": "xy"}', " "),  # ... nor after it
    (OBJECT, "{ ", " "),  # one space, or newlines and indentation
    (OBJECT, "{\n\n", "\n"),  # at most two newlines
    (OBJECT, "{\n" + " " * 20, " "),  # at most 20 spaces or tabs
    ({"type": "array", "items": {"type": "integer"}}, "[" + "1" * 16, "1"),  # at most 16 digits
    ({"type": "array"}, "[0." + "1" * 16, "1"),  # at most 16 fraction digits
    ({"type": "array"}, "[1e+999", "9"),  # at most 3 exponent digits
    ({"type": "array", "maxItems": 2}, "[1, 2", ","),
    ({"type": "array", "minItems": 2}, "[1", "]"),
    ({"type": "array", "items": {"type": "boolean"}}, "[true, ", "n"),
    ({"enum": ["red", "green"]}, '"gr', "a"),
    ({"const": "é"}, '"', "e"),
    ({"type": "string"}, '"done"', '"'),  # complete: only EOS
    (None, "", "["),  # json_object: an object
]


@pytest.mark.parametrize("schema, prefix, following", REFUSED)
def test_invalid_continuations_are_refused(schema, prefix, following):
    assert_refused(schema, prefix, following)


@pytest.mark.parametrize(
    "schema, text",
    [
        (OBJECT, '{"b": "xy"}'),
        (OBJECT, '{"a": -7, "b": "xyz"}'),
        (OBJECT, '{"b":"\\u00e9\\n"}'),  # escapes count as one character each
        (OBJECT, '{"b": "éé"}'),  # characters, not bytes
        (OBJECT, '{"b": "日本語"}'),
        (OBJECT, "{\n\n\t\t" + " " * 18 + '"b"\n:\n "xy" }'),
        ({"type": "object", "properties": {"x": {"type": "object"}}}, '{"x": {"any": [1, {}]}}'),
        ({"type": "array", "items": False}, "[]"),
        ({"type": ["integer", "boolean"]}, "true"),
        ({"enum": ["a", 1, [1, 2]]}, "[1,2]"),
        ({"const": "日"}, '"\\u65e5"'),  # both the raw and the \u form of non-ASCII
        ({"const": 'a"\\'}, '"a\\"\\\\"'),
    ],
)
def test_valid_documents_are_read_byte_by_byte(schema, text):
    assert reads(schema, text)


def test_characters_may_be_split_across_tokens():
    matcher = Matcher(json_grammar({"type": "string"}), TINY)
    write(matcher, '"')
    matcher.advance(word(b"\xe6\x97"))  # the first two bytes of 日
    allowed = np.flatnonzero(matcher.allowed())
    assert set(allowed) == {BYTE0 + b for b in range(0x80, 0xC0)}
    matcher.advance(BYTE0 + 0xA5)
    write(matcher, '"')
    assert matcher.complete


@pytest.mark.parametrize(
    "bounds",
    [
        {"minimum": 0, "maximum": 150},
        {"minimum": -15, "maximum": 7},
        {"minimum": 100, "maximum": 105},
        {"exclusiveMinimum": 3.5, "exclusiveMaximum": 9},
        {"minimum": -120, "maximum": -100},
        {"minimum": 0.5, "maximum": 1},
    ],
)
def test_integer_bounds_allow_exactly_the_integers_in_range(bounds):
    """Every byte path through the grammar (with a suffix, so that a number can grow) ends in range, and
    every integer in range is reached; no path is a dead end."""
    grammar = json_grammar({"type": "integer", **bounds}, suffix=";")
    found, todo = set(), [(Matcher(grammar, TINY), "")]
    while todo:
        matcher, text = todo.pop()
        allowed = np.flatnonzero(matcher.allowed()[BYTE0 : BYTE0 + 256])
        assert len(allowed) or matcher.complete, f"dead end after {text!r}"
        if matcher.complete:
            found.add(text[:-1])
        for b in allowed:
            following = copy.copy(matcher)
            following.advance(BYTE0 + int(b))
            todo.append((following, text + chr(b)))
    low = max(bounds.get("minimum", -1000), bounds.get("exclusiveMinimum", -1000) + 1e-9)
    high = min(bounds.get("maximum", 1000), bounds.get("exclusiveMaximum", 1000) - 1e-9)
    expected = {str(i) for i in range(int(np.ceil(low)), int(np.floor(high)) + 1)}
    assert {str(int(t)) for t in found} == expected
    assert found - expected <= {"-0"}  # JSON allows -0, which is 0


def test_complete_output_allows_only_eos():
    matcher = Matcher(json_grammar(None), TINY)
    write(matcher, "{}")
    assert matcher.complete
    assert np.flatnonzero(matcher.allowed()).tolist() == [EOS]
    with pytest.raises(InvalidArgumentError, match="only EOS"):
        matcher.advance(BYTE0 + ord(" "))
    matcher.advance(EOS)

    without_eos = Vocabulary(TINY_TOKENS, len(TINY_TOKENS), special_ids=[SPECIAL], eos_ids=[])
    matcher = Matcher(json_grammar(None), without_eos)
    write(matcher, "{}")
    assert matcher.complete and not matcher.allowed().any()


def test_a_vocabulary_that_cannot_spell_the_document_raises_rather_than_masking_everything():
    vocabulary = Vocabulary([b"</s>", b"{", b'"', b"a"], 4, special_ids=[0], eos_ids=[0])
    matcher = Matcher(json_grammar(None), vocabulary)
    for token in (1, 2, 3, 2):
        matcher.advance(token)
    with pytest.raises(InferenceError, match="no token of the vocabulary can follow"):
        matcher.allowed()  # a ":" is needed, and there is none


def test_eos_before_the_document_is_complete_is_refused():
    matcher = Matcher(json_grammar(None), TINY)
    write(matcher, "{")
    assert not matcher.allowed()[EOS]
    with pytest.raises(InvalidArgumentError, match="EOS before"):
        matcher.advance(EOS)


def test_special_empty_and_out_of_range_tokens_are_never_allowed():
    matcher = Matcher(json_grammar(None), TINY)
    allowed = matcher.allowed()
    assert allowed.shape == (len(TINY_TOKENS) + 3,)
    assert allowed[BYTE0 + ord("{")] and allowed[word(b'{"')]
    assert not allowed[SPECIAL]  # its bytes are "{", but it is special
    assert not allowed[word(b"")] and not allowed[len(TINY_TOKENS) :].any()
    for token in (SPECIAL, word(b"")):
        with pytest.raises(InvalidArgumentError, match="special or empty"):
            matcher.advance(token)
    with pytest.raises(InvalidArgumentError, match="not in"):
        matcher.advance(len(TINY_TOKENS) + 3)


def test_multi_byte_tokens_are_allowed_only_where_all_their_bytes_fit():
    matcher = Matcher(json_grammar(OBJECT), TINY)
    assert allowed_words(matcher) == {b'{"'}
    matcher.advance(word(b'{"'))
    assert allowed_words(matcher) == set()  # a key: only the byte "a" or "b"
    write(matcher, 'b": "')
    assert allowed_words(matcher) == {b"12", b"\xc3\xa9", b'abc"', b"\xe6\x97"}  # 2 or 3 characters, then "
    matcher.advance(word(b'abc"'))
    assert allowed_words(matcher) == {b"\n  "}  # "a" comes first: only whitespace and "}" remain
    write(matcher, "}")
    assert matcher.complete


def allowed_words(matcher: Matcher) -> set[bytes]:
    allowed = matcher.allowed()
    return {w for w in WORDS if w and allowed[word(w)]}


def test_prefix_and_suffix_are_literal_text():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    assert reads(schema, '<tool_call>\n{"x": 12}\n</tool_call>', prefix="<tool_call>\n", suffix="\n</tool_call>")
    assert not reads(schema, '{"x": 12}', prefix="<tool_call>\n")
    matcher = Matcher(json_grammar(schema, prefix="<a>", suffix="</a>"), TINY)
    assert np.flatnonzero(matcher.allowed()).tolist() == [BYTE0 + ord("<")]
    write(matcher, '<a>{"x": 1')
    assert not matcher.complete
    write(matcher, "}</a")
    assert not matcher.complete
    write(matcher, ">")
    assert matcher.complete


def test_optional_properties_may_be_skipped_in_schema_order():
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abc"}, "required": ["c"]}
    order = {"property_order": "schema"}
    assert reads(schema, '{"c": 1}', **order) and reads(schema, '{"a": 1, "c": 3}', **order)
    assert reads(schema, '{"a":1,"b":2,"c":3}', **order)
    assert not reads(schema, '{"b": 1, "a": 2, "c": 3}', **order) and not reads(schema, '{"a": 1}', **order)


def test_properties_come_in_any_order_each_once_the_required_ones_all():
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abc"}, "required": ["a", "c"]}
    valid = ('{"c": 1, "a": 2}', '{"b": 1, "c": 2, "a": 3}', '{"a": 1, "c": 2, "b": 3}', '{"x": "u", "c": 1, "a": 0}')
    for text in valid:
        assert reads(schema, text), text
    for text in ('{"c": 1}', '{"a": 1, "a": 2, "c": 3}', '{"c": 1, "a": 2, "c": 3}', '{"b": 1, "b": 1}'):
        assert not reads(schema, text), text
    closed = {**schema, "additionalProperties": False}
    assert reads(closed, '{"c": 1, "a": 2}') and not reads(closed, '{"x": 1, "c": 1, "a": 2}')
    assert reads(schema, '{"x": 1, "c": 1, "a": 2}', extra_properties=False) is False
    # a declared key's prefix may still be an undeclared key: "a" is declared, "ab" is not
    assert reads(schema, '{"ab": [], "c": 1, "a": 2}') and not reads(closed, '{"ab": 1, "c": 1, "a": 2}')
    with pytest.raises(InvalidArgumentError, match='property_order must be "any" or "schema", got \'random\''):
        json_grammar(schema, property_order="random")


def test_dependent_required_properties_must_come_with_the_property_that_needs_them():
    schema = {
        "type": "object",
        "properties": {"card": {"type": "integer"}, "address": {"type": "string"}, "name": {"type": "string"}},
        "required": ["name"],
        "dependentRequired": {"card": ["address"]},
    }
    assert reads(schema, '{"name": "x"}') and reads(schema, '{"card": 1, "name": "x", "address": ""}')
    assert reads(schema, '{"address": "", "name": "x"}')
    assert not reads(schema, '{"name": "x", "card": 1}') and not reads(schema, '{"card": 1, "name": "x"}')
    chained = {"type": "object", "properties": {k: {} for k in "abc"}, "dependencies": {"a": ["b"], "b": ["c"]}}
    assert reads(chained, '{"a": 1, "b": 2, "c": 3}') and not reads(chained, '{"a": 1, "b": 2}')
    # draft-04 `dependencies` naming a property the schema does not list: an undeclared one it allows
    assert reads({"properties": {"a": {}}, "dependencies": {"a": ["z"]}}, '{"a": 1, "z": 2}')
    assert not reads({"properties": {"a": {}}, "dependencies": {"a": ["z"]}}, '{"a": 1}')


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"properties": {"a": {}}, "dependencies": {"a": {"required": ["b"]}}}, "'dependencies' with a schema"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "'dependentRequired' between undeclared properties"),
        ({"properties": {"a": {}}, "dependentRequired": {"a": "b"}}, 'must map names to lists of names, got "b"'),
        (
            {"properties": {"a": {}}, "additionalProperties": False, "dependentRequired": {"a": ["b"]}},
            "'dependentRequired' is supported between declared properties",
        ),
    ],
)
def test_dependencies_the_constraint_cannot_follow_are_refused(schema, message):
    with pytest.raises(InvalidArgumentError, match=message):
        json_grammar(schema)
    with pytest.raises(InvalidArgumentError, match="needs property_order 'any'"):
        json_grammar({"properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}}, property_order="schema")


def test_min_and_max_properties_count_the_properties_written():
    free = {"type": "object", "minProperties": 1, "additionalProperties": {"type": "integer"}}
    assert reads(free, '{"a": 1}') and reads(free, '{"a": 1, "b": 2}') and not reads(free, "{}")
    most = {"type": "object", "maxProperties": 2}
    assert reads(most, "{}") and reads(most, '{"a": 1, "b": [2]}') and not reads(most, '{"a": 1, "b": 2, "c": 3}')
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer"} for k in "abc"},
        "required": ["c"],
        "minProperties": 2,
        "maxProperties": 2,
        "additionalProperties": False,
    }
    assert reads(schema, '{"a": 1, "c": 2}') and reads(schema, '{"c": 1, "b": 2}')
    assert not reads(schema, '{"c": 1}') and not reads(schema, '{"a": 1, "b": 2}')  # "c" would make three
    one = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"], "maxProperties": 1}
    assert reads(one, '{"a": 1}') and not reads(one, '{"b": 1}') and not reads(one, '{"x": 1, "a": 1}')
    declared_and_one = {"type": "object", "properties": {"a": {}}, "required": ["a"], "minProperties": 2}
    assert reads(declared_and_one, '{"x": 0, "a": 1}') and not reads(declared_and_one, '{"a": 1}')


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "object", "minProperties": 2}, "'minProperties' 2 on an object without declared properties"),
        ({"properties": {"a": {}}, "minProperties": 3}, "'minProperties' 3 beyond the declared properties and one"),
        ({"type": "object", "minProperties": 3, "maxProperties": 2}, "'minProperties' 3 is more than 'maxProp"),
        ({"type": "object", "maxProperties": -1}, "'maxProperties' must be a non-negative integer, got -1"),
    ],
)
def test_property_counts_the_constraint_cannot_follow_are_refused(schema, message):
    with pytest.raises(InvalidArgumentError, match=message):
        json_grammar(schema)
    with pytest.raises(InvalidArgumentError, match="'maxProperties' needs property_order 'any'"):
        json_grammar({"properties": {"a": {}, "b": {}}, "maxProperties": 1}, property_order="schema")


def test_integers_are_multiples_of_multiple_of_within_their_bounds():
    assert [reads({"type": "integer", "multipleOf": 5}, t) for t in ("0", "15", "-10", "7", "-3")] == [1, 1, 1, 0, 0]
    bounded = {"type": "integer", "multipleOf": 7, "minimum": 10, "maximum": 20}
    assert reads(bounded, "14") and not reads(bounded, "7") and not reads(bounded, "21")
    assert_refused(bounded, "", "2")  # 2 and 20-29: no multiple of 7 within [10, 20] starts with 2
    number = {"type": "number", "multipleOf": 2}  # whole multiples: written as integers
    assert reads(number, "4") and not reads(number, "4.0") and not reads(number, "3")
    assert reads({"type": "integer", "multipleOf": 0.5}, "3")  # every integer is a multiple of 1/2
    with pytest.raises(InvalidArgumentError, match="and a multiple of 10"):
        json_grammar({"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9})


def test_objects_with_many_properties_keep_schema_order():
    from ruvllm.runtime.constrain import MAX_ANY_ORDER

    many = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(MAX_ANY_ORDER + 1)}}
    assert reads(many, '{"p0": 1, "p3": 2}') and not reads(many, '{"p3": 1, "p0": 2}')
    few = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(MAX_ANY_ORDER)}}
    assert reads(few, '{"p3": 1, "p0": 2}') and not reads(few, '{"p3": 1, "p3": 2}')


def test_free_keys_follow_additional_properties():
    assert reads(FREE, '{"x": 1, "y": -2}') and reads(FREE, "{}")
    assert not reads(FREE, '{"x": "1"}')
    assert reads({"type": "object"}, '{"x": [1, "a"]}')  # no properties, nothing said: any object
    assert reads({"type": "object", "additionalProperties": True}, '{"x": 1}')
    assert reads({"type": "object", "properties": {}}, "{}")  # an empty list of properties: the empty object
    assert not reads({"type": "object", "properties": {}}, '{"x": 1}')


def test_enum_values_are_those_the_other_keywords_allow():
    schema = {"type": "string", "maxLength": 2, "enum": ["ab", "abc", 1]}
    assert reads(schema, '"ab"') and not reads(schema, '"abc"') and not reads(schema, "1")
    with pytest.raises(InvalidArgumentError, match="no value of 'enum'"):
        json_grammar({"type": "integer", "enum": ["a"]})


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    "schema, message",
    [
        (
            {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(?=a)"}}},
            "'pattern' '^(?=a)': lookaround in '^(?=a)' is not supported at properties.name",
        ),
        ({"oneOf": [{"type": "string"}, {"maxLength": 3}]}, "'oneOf' options 0 and 1 may both match one document"),
        (
            {"allOf": [{"prefixItems": [{}]}, {"prefixItems": [{}]}]},
            "'allOf' with 'prefixItems' in more than one schema is not supported at the root",
        ),
        ({"type": "array", "items": {"not": {"type": "string"}}}, "'not' at items"),
        ({"type": "number", "multipleOf": 0.01}, "'multipleOf' 0.01 for numbers is supported only when it is a whole"),
        ({"type": "integer", "multipleOf": 0}, "'multipleOf' must be a number above 0, got 0 at the root"),
        (
            {"type": "object", "patternProperties": {"^a": {}, "^b": {"type": "integer"}}},
            "'patternProperties' at the root with different schemas for different patterns is not supported",
        ),
        ({"type": "array", "uniqueItems": True}, "'uniqueItems' at the root"),
        ({"if": {"type": "string"}, "then": {}}, "'if' at the root"),
        (
            {"$defs": {"a": {"type": "number", "format": "date", "multipleOf": 2.5}}, "$ref": "#/$defs/a"},
            "'multipleOf' 2.5 for numbers is supported only when it is a whole number (then integers are written) "
            "at $defs.a",
        ),
        ({"anyOf": [{"type": "string"}, {"type": "integer", "maximum": "9"}]}, "'maximum' must be a finite number"),
        ({"$ref": "http://example.com/schema"}, "'$ref' 'http://example.com/schema' points to another document"),
        ({"$ref": "#/$defs/missing"}, "points to nothing"),
        ({"type": "strin"}, "'type' 'strin' is not a JSON Schema type"),
        ({"type": []}, "'type' is an empty list"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "no JSON value is valid under the schema"),
        ({"type": "string", "minLength": 3, "maxLength": 2}, "'minLength' 3 is more than 'maxLength' 2"),
        (
            {
                "type": "object",
                "properties": {"id": {"type": "string", "format": "uuid", "pattern": "^x"}},
                "required": ["id"],
            },
            "no JSON value is valid under the schema (no string matches both 'pattern' '^x' and 'format' 'uuid' "
            "at properties.id)",
        ),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "within the bounds [5, 4]"),
        ({"type": "integer", "minimum": 10**17}, "within the bounds [100000000000000000, None]"),
        ({"type": "object", "properties": {"a": [1]}}, "at properties.a"),
        ({"type": "object", "required": ["a"], "additionalProperties": False}, "'a' is not in 'properties'"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "object", "properties": {"b": False}, "required": ["b"]}},
                "required": ["a"],
            },
            "no JSON value is valid under the schema (the schema is false at properties.a.properties.b)",
        ),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "the types of 'allOf' have nothing in common"),
        (
            {
                "allOf": [
                    {"properties": {"a": {}}, "required": ["a"]},
                    {"oneOf": [{"required": ["b"]}, {"required": ["c"]}]},
                ]
            },
            "'oneOf' options 0 and 1 may both match one document",
        ),
        ({"type": "array", "items": {"x-vendor": 1, "readonly": True, "not": {}}}, "'not' at items is not supported"),
        (_nested(150), "the schema nests deeper than 100 levels (sub-schemas and references) at items.items.items"),
    ],
)
def test_unsupported_or_broken_schemas_are_refused_naming_keyword_and_path(schema, message):
    with pytest.raises(InvalidArgumentError, match="json_schema: ") as caught:
        json_grammar(schema)
    assert message in str(caught.value)


def test_the_refusal_lists_what_is_supported():
    with pytest.raises(InvalidArgumentError) as caught:
        json_grammar({"type": "object", "properties": {"name": {"not": {}}}})
    assert str(caught.value).startswith("json_schema: 'not' at properties.name is not supported (supported: type,")


@pytest.mark.parametrize("schema", [[{"type": "string"}], "object", 3, False])
def test_schemas_that_are_not_objects_are_refused(schema):
    with pytest.raises(InvalidArgumentError, match="json_schema: the schema"):
        json_grammar(schema)


def test_tokenizer_special_ids_are_its_special_added_tokens(smollm2_tokenizer):
    assert smollm2_tokenizer.special_ids == frozenset(range(17))  # <|endoftext|>, <|im_start|>, ...


def test_a_top_level_number_may_have_as_many_digits_as_its_schema_allows():
    matcher = Matcher(json_grammar({"type": "integer", "maximum": 500}), TINY)
    write(matcher, "1")
    assert matcher.complete and not matcher.finished
    allowed = matcher.allowed()
    assert allowed[EOS] and allowed[BYTE0 + ord("2")] and allowed[word(b"12")]
    write(matcher, "23")
    assert matcher.complete
    assert not matcher.allowed()[BYTE0 + ord("4")]  # 1234 > 500
    with pytest.raises(InvalidArgumentError, match="only EOS may follow"):
        matcher.advance(BYTE0 + ord("4"))
    assert reads({"type": "number"}, "-12.5e+3") and reads({}, "1234")


# --- keywords beyond the basics: each schema with documents valid and invalid under it ---------------

DRAFT4 = "http://json-schema.org/draft-04/schema#"
CASES = {
    "enum compares JSON values": ({"enum": [1, "a", None]}, ["1", "1.0", '"a"', "null"], ["true", "1.5", '"b"']),
    "const true is not 1": ({"const": True}, ["true"], ["1", "1.0"]),
    "const 1.0 is the number 1": ({"const": 1.0}, ["1", "1.0"], ["true", "2"]),
    "const beside enum": ({"enum": [1, True, "x"], "const": 1}, ["1"], ["true", '"x"']),
    "unknown keywords are ignored": ({"type": "integer", "x-kind": "id", "readonly": True}, ["7"], ['"7"']),
    "allOf merges": (
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"a": {"minimum": 2}, "b": {"type": "string"}}},
            ]
        },
        ['{"a": 2}', '{"a": 3, "b": "x"}'],
        ['{"a": 1}', '{"b": "x"}', '{"a": 2, "b": 1}'],
    ),
    "allOf respects another part's additionalProperties": (
        {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {}}}]},
        ['{"a": 1}', "{}"],
        ['{"b": 1}'],
    ),
    "$ref beside other keywords": (
        {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "maximum": 5},
        ["5", "-3"],
        ["6", '"a"'],
    ),
    "anyOf beside other keywords": (
        {"type": "integer", "anyOf": [{"maximum": 1}, {"minimum": 10}]},
        ["1", "10"],
        ["5", "1.5"],
    ),
    "oneOf inside allOf stays oneOf": (
        {
            "allOf": [
                {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                {
                    "oneOf": [
                        {"properties": {"a": {"const": 1}}, "required": ["a"]},
                        {"properties": {"a": {"const": 2}}},
                    ]
                },
            ]
        },
        ['{"name": "x", "a": 1}', '{"name": "x", "a": 2}'],
        ['{"name": "x", "a": 3}'],
    ),
    "oneOf of exclusive types": ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, ['"a"', "3"], ["null", "1.5"]),
    "oneOf discriminated by a property": (
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                    "required": ["kind"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
                    "required": ["kind"],
                },
            ]
        },
        ['{"kind": "a", "x": 1}', '{"kind": "b", "y": "s"}'],
        ['{"kind": "a", "x": "s"}', '{"kind": "c"}'],
    ),
    "prefixItems": (
        {"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
        ['["a", 1]', '["a"]', "[]"],
        ['[1, "a"]', '["a", 1, 2]'],
    ),
    "draft-04 items as a list": (
        {"$schema": DRAFT4, "items": [{"type": "string"}], "additionalItems": {"type": "integer"}},
        ['["a", 1, 2]'],
        ['["a", "b"]', "[1]"],
    ),
    "a negative maximum alone": ({"type": "integer", "maximum": -1}, ["-1", "-20"], ["0", "1"]),
    "number bounds": (
        {"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.25},
        ["-1.5", "0", "2.2", "2.249", "-1", "1"],
        ["-1.51", "2.25", "2.3", "3", "-2"],
    ),
    "draft-04 exclusive flags": (
        {"$schema": DRAFT4, "type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
        ["0.5", "1"],
        ["0", "-0", "1.01"],
    ),
    "$id and $anchor": (
        {
            "$id": "http://example.com/root.json",
            "$defs": {
                "a": {"$id": "other.json", "$defs": {"b": {"$anchor": "num", "type": "integer"}}, "$ref": "#num"},
            },
            "properties": {"x": {"$ref": "other.json"}, "y": {"$ref": "other.json#num"}},
        },
        ['{"x": 1, "y": 2}'],
        ['{"x": "1"}', '{"y": "2"}'],
    ),
    "pointer escapes": (
        {
            "$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "string"}, "e%f": {"type": "null"}},
            "properties": {
                "x": {"$ref": "#/$defs/a~1b"},
                "y": {"$ref": "#/$defs/c~0d"},
                "z": {"$ref": "#/$defs/e%25f"},
            },
        },
        ['{"x": 1, "y": "s", "z": null}'],
        ['{"x": "s"}', '{"y": 1}', '{"z": 1}'],
    ),
    "no type: each keyword constrains its own type": (
        {"properties": {"a": {"type": "integer"}}, "maxLength": 2},
        ['{"a": 1}', '"ab"', "3", "[1]"],
        ['{"a": "x"}', '"abc"'],
    ),
    "pattern is a search": ({"type": "string", "pattern": "b+c"}, ['"abbcd"', '"bc"'], ['"ac"', '"cb"']),
    "pattern anchored, with lengths": (
        {"type": "string", "pattern": "^[a-z]{2,}(-[0-9]+)?$", "maxLength": 5},
        ['"ab"', '"ab-12"', '"abcde"'],
        ['"a"', '"ab-"', '"abcdef"', '"Ab"', '"ab-123"'],
    ),
    "pattern with escapes and non-ASCII": (
        {"type": "string", "pattern": "^[^0-9]*$"},
        ['"a\\"b/"', '"é"', '""'],
        ['"a1"'],
    ),
    "format date, uuid, ipv4": (
        {
            "type": "array",
            "prefixItems": [{"format": "date"}, {"format": "uuid"}, {"format": "ipv4"}],
            "items": False,
        },
        ['["2024-02-29", "123e4567-e89b-12d3-a456-426614174000", "10.0.255.1"]'],
        [
            '["2024-13-01"]',
            '["2024-01-01", "123e4567"]',
            '["2024-01-01", "", "1.2.3.256"]',
        ],
    ),
    "pattern beside format: strings that match both": (  # MaskBench's o1053 wrote "2020-02-30" before
        {
            "type": "array",
            "prefixItems": [
                {"format": "date", "pattern": "^([0-9]{4})(-([0-9]{2}))?(-([0-9]{2}))?$"},
                {"format": "email", "pattern": "@example\\.com$"},
            ],
        },
        ['["2020-02-28"]', '["2024-12-31", "a.b@example.com"]'],
        [
            '["2020-02-30"]',
            '["2020"]',
            '["2020-01"]',
            '["2020-01-01", "a@other.com"]',
            '["2020-01-01", "a@example.org"]',
        ],
    ),
    "undeclared properties between the declared ones": (
        {
            "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
            "additionalProperties": {"type": "null"},
        },
        ['{"x": null, "name": "a", "names": null, "na": null, "n": 1, "nn": null}', '{"\\"": null}', "{}"],
        ['{"x": 1}', '{"na": 1}', '{"name": 1}'],
    ),
    "patternProperties": (
        {
            "properties": {"id": {"type": "integer"}, "x-a": {"maxLength": 2}},
            "patternProperties": {"^x-": {"type": "string"}, "^y-": {"type": "string"}},
            "additionalProperties": False,
        },
        ['{"id": 1, "x-b": "long", "y-": "", "x-a": "ab"}', "{}"],
        ['{"z": "a"}', '{"x-b": 1}', '{"x-a": "abc"}', '{"x-a": 1}'],
    ),
    "patternProperties alone": (
        {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}, "additionalProperties": False},
        ['{"ab": 1, "c": 2}', "{}"],
        ['{"A": 1}', '{"ab": "1"}'],
    ),
    "propertyNames": (
        {
            "type": "object",
            "properties": {"ok": {}, "toolong": {}},
            "propertyNames": {"maxLength": 3, "pattern": "^[a-z]"},
        },
        ['{"ok": 1, "abc": 2}'],
        ['{"toolong": 1}', '{"abcd": 1}', '{"1a": 1}'],
    ),
    "propertyNames false": ({"type": "object", "propertyNames": False}, ["{}"], ['{"a": 1}']),
    "propertyNames no name can meet (pattern against format)": (
        {"type": "object", "propertyNames": {"format": "date", "pattern": "^x"}},
        ["{}"],
        ['{"x": 1}', '{"2020-01-01": 1}'],
    ),
    "an optional property no value can meet is left out": (
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 2, "maxLength": 1}, "b": {}}},
        ['{"b": 1}', "{}"],
        ['{"a": ""}', '{"a": "x", "c": 1}'],
    ),
    "an optional string no value can meet (pattern against format) is left out": (  # as JSONSchemaBench's o91126
        {"type": "object", "properties": {"day": {"format": "date", "pattern": "^x"}, "b": {}}},
        ['{"b": 1}', "{}"],
        ['{"day": "x"}', '{"day": "2020-01-01"}'],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_schemas_accept_their_valid_documents_and_refuse_the_others(name, validate):
    jsonschema = pytest.importorskip("jsonschema")
    schema, valid, invalid = CASES[name]
    for text in valid:
        validate(json.loads(text), schema)  # the case itself is right
        assert reads(schema, text), text
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for text in invalid:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(text), schema, format_checker=checker)
        assert not reads(schema, text), text


def test_declared_properties_come_in_schema_order_once():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    order = {"property_order": "schema"}
    assert reads(schema, '{"c": [1], "a": 1, "d": {}, "b": 2}', **order)
    assert not reads(schema, '{"b": 1, "a": 2}', **order) and not reads(schema, '{"a": 1, "a": 2}', **order)
    assert reads(schema, '{"c": [1], "b": 1, "d": {}, "a": 2}') and not reads(schema, '{"a": 1, "a": 2}')


def test_only_declared_properties_are_written_without_extra_properties():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    matcher = Matcher(json_grammar(schema, extra_properties=False), TINY)
    write(matcher, '{"')
    assert np.flatnonzero(matcher.allowed()).tolist() == [BYTE0 + ord("a")]


def test_explicit_extra_properties_writes_undeclared_keys_only_where_the_schema_says_so():
    """response_format's mode (issue 35): a schema that lists properties and says nothing more gets only
    those (the README's example let SmolLM2 add keys until the context was full); additionalProperties
    true or a schema, or patternProperties, opens the object again; an object that lists nothing is free."""
    explicit = {"extra_properties": "explicit", "whitespace": "flexible"}
    listed = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert reads(listed, '{"a": 1}', **explicit) and not reads(listed, '{"a": 1, "b": 2}', **explicit)
    assert reads(listed, '{"a": 1, "b": 2}', whitespace="flexible")  # JSON Schema's reading, by default
    opened = {**listed, "additionalProperties": True}
    assert reads(opened, '{"a": 1, "b": 2}', **explicit)
    typed = {**listed, "additionalProperties": {"type": "string"}}
    assert reads(typed, '{"a": 1, "b": "x"}', **explicit) and not reads(typed, '{"a": 1, "b": 2}', **explicit)
    patterned = {**listed, "patternProperties": {"^x": {"type": "integer"}}}
    assert reads(patterned, '{"a": 1, "x1": 2}', **explicit) and not reads(patterned, '{"a": 1, "y": 2}', **explicit)
    assert reads({"type": "object"}, '{"any": [1, {"b": null}]}', **explicit)
    nested = {"type": "object", "properties": {"p": listed}, "required": ["p"]}
    assert not reads(nested, '{"p": {"a": 1, "c": 3}}', **explicit)
    with pytest.raises(InvalidArgumentError, match='extra_properties must be True, False or "explicit", got 1'):
        json_grammar(listed, extra_properties=1)  # type: ignore[arg-type]


def test_unknown_keywords_are_refused_when_strict():
    schema = {"type": "object", "properties": {"a": {"type": "integer", "x-unit": "cm"}}}
    json_grammar(schema)
    with pytest.raises(InvalidArgumentError) as caught:
        json_grammar(schema, strict=True)
    assert str(caught.value) == (
        "json_schema: 'x-unit' at properties.a is not a keyword of JSON Schema (refused with strict=True)"
    )


@pytest.mark.parametrize(
    "pattern",
    [
        *("^[a-z]+$", "b+c", r"^\d{4}-\d{2}$", "^(a|bc)*$", r"^[^\s]+$", "x$", r"^(?:\+|-)?\d+(\.\d{1,2})?$"),
        *(
            "^.{2,5}$",
            "^a|b$",
            "[ab]?c{2,}",
            "(^[a-c]+$)",
            "^$|(^(?:a+ )?b$)",
            r"^[\w.-]+@[\w-]+\.[a-z]{2,3}$",
            "^[^a-c]{0,3}x?$",
        ),
    ],
)
def test_patterns_match_as_python_re_does_on_ascii(pattern):
    import random
    import re

    from ruvllm.runtime.constrain.regex import Regex

    regex, rng = Regex(pattern), random.Random(pattern)
    for _ in range(2000):
        text = "".join(rng.choice("abcx0123-+.@ _A") for _ in range(rng.randint(0, 8)))
        assert regex.matches(text) == (re.search(pattern, text) is not None), text


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("(?=a)", "lookaround"),
        (r"(a)\1", "'\\1'"),
        (r"\bword", "'\\b'"),
        ("a^b", "'^' or '$' inside"),
        (r"\p{L}", "'\\p'"),
        ("(ab", "ends early"),
        ("a{3,2}", "bounds reversed"),
        ("[z-a]", "reversed"),
        ("^(a{1000}){1000}$", "more than"),
        ("^a{1000}{1000}$", "nothing to repeat (a quantifier on a quantifier)"),  # as ECMA-262
        ("a" + "*" * 5000, "nothing to repeat"),
        ("(" * 5000 + "a" + ")" * 5000, "groups nest deeper than 32 levels"),  # was a RecursionError
        ("a" * 20_000, "the pattern has 20,000 characters (at most 16,384)"),
    ],
)
def test_patterns_beyond_the_supported_subset_are_refused(pattern, why):
    with pytest.raises(InvalidArgumentError, match="json_schema: 'pattern'") as caught:
        json_grammar({"type": "string", "pattern": pattern})
    assert why in str(caught.value) and str(caught.value).endswith("at the root")


def test_the_compact_form_is_the_default_and_takes_no_whitespace():
    schema = {"type": "object", "properties": {"a": {"type": "array"}}}
    matcher = Matcher(compact_grammar(schema), TINY)
    write(matcher, '{"a":[1,')
    assert not matcher.allowed()[BYTE0 + ord(" ")] and not matcher.allowed()[BYTE0 + ord("\n")]
    write(matcher, '"x"]}')
    assert matcher.complete
    assert reads(schema, '{ "a" : [ 1 ,\n  2 ] }')  # the flexible form
    with pytest.raises(InvalidArgumentError, match='whitespace must be "compact" or "flexible", got \'pretty\''):
        compact_grammar(schema, whitespace="pretty")
