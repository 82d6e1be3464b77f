"""Constrained decoding: only tokens that keep the output a prefix of a valid JSON document (OpenAI's
`response_format`: `json_object`, or `json_schema` with a JSON Schema).

    vocabulary = Vocabulary(tokenizer.token_bytes, config.vocab_size, tokenizer.special_ids, eos_ids)  # once
    matcher = Matcher(json_grammar(schema), vocabulary)                                                # per request
    logits[~matcher.allowed()] = -np.inf; token = sample(logits); matcher.advance(token)

Pure Python and NumPy, so it runs in Pyodide too. The parser reads bytes, not characters: a token may
end inside a UTF-8 character, and string content accepts any bytes that can still complete to valid
UTF-8 (no surrogates, no overlong forms); the whole output always decodes as UTF-8.

Supported JSON Schema: `type` (object, array, string, integer, number, boolean, null, or a list of
them), `properties` (written in schema order; required ones always, optional ones may be skipped),
`required`, `additionalProperties` (with `properties`: only listed properties are written; with no
properties listed: free keys whose values follow `additionalProperties`, any value if it is true or if
the schema says nothing about properties at all, but `"properties": {}` alone is the empty object), `items`,
`minItems`, `maxItems`, `enum`, `const` (any JSON values, written compactly, non-ASCII either raw or
\\u-escaped), `anyOf`, `$ref` to `#`, `#/$defs/...` or `#/definitions/...` (recursion allowed),
`minLength`/`maxLength` (characters), and for integers `minimum`, `maximum`, `exclusiveMinimum`,
`exclusiveMaximum` (enforced exactly: a digit is allowed only if some completion is in range).
Annotations are ignored: title, description, default, examples, $schema, $id, $comment, deprecated,
readOnly, writeOnly, and `format`, which is an annotation as in jsonschema's default validator. Any
other keyword (pattern, oneOf, allOf, not, bounds on non-integer numbers, ...) is refused with an
`InvalidArgumentError` naming the keyword and where it is. Without `type`, the types are those the
keywords present describe (`properties` -> object, ...), or any JSON value.

What is written, so that generation always ends:
- whitespace between structural tokens as in llama.cpp's json-schema grammar: nothing, one space, or
  one or two newlines followed by at most 20 spaces or tabs; none before or after the whole value;
- integers of at most 16 digits, fractions of at most 16 digits, exponents of at most 3 digits;
- \\u escapes of UTF-16 surrogates (D800-DFFF) are refused (write the character in UTF-8 instead).
Once the output is a complete document (and suffix) only EOS is allowed; a top-level number without a
suffix is therefore complete as soon as it is a valid number.

How masks stay cheap (SmolLM2, 49152 tokens: median 0.005-0.03 ms a token, p95 under 0.5 ms, see
benchmarks/constrain_bench.py; the model's own step is ~25-45 ms):
- The parser state is a set of configurations; a configuration is a tuple of frames (a stack), and a
  frame is a small tuple, so states are hashable. States are interned and each keeps its byte
  transitions and its mask: a lazy DFA, memoized per grammar and vocabulary. Inside a free string the
  state repeats, so its mask is computed once.
- The mask of a state walks a byte trie of the vocabulary depth-first together with the DFA, pruning a
  branch at its first impossible byte; each state carries a cheap superset of the bytes it can read,
  so impossible bytes are skipped without stepping the parser.
- Inside a string most tokens are plain text (no `"`, `\\`, control byte; whole UTF-8 characters):
  they are all allowed at once from a precomputed array of their character counts; only the few other
  tokens (SmolLM2: 671) are walked, in tries of what follows their plain-text head.
- The trie is flat lists, not 100k dicts, and the automaton has no reference cycles (it is freed with
  its grammar by reference counting), so they add little to garbage collection. (A full collection in
  a process holding a tokenizer still costs 10-20 ms now and then; `gc.freeze()` after loading
  removes that from generation.)

Dimension letters: V vocabulary size (the width of the logits).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InferenceError, InvalidArgumentError

MAX_INT_DIGITS = 16
MAX_FRACTION_DIGITS = 16
MAX_EXPONENT_DIGITS = 3
MAX_INDENT = 20  # spaces or tabs after a newline
MAX_NEWLINES = 2
MAX_DFA_STATES = 200_000  # a grammar's cached automaton is started afresh past this many states

# --- Vocabulary ---------------------------------------------------------------------------------------

_SPECIAL_IN_STRING = re.compile(rb'[\x00-\x1f"\\]')  # bytes that end plain string text
_NOT_PLAIN = np.iinfo(np.int32).max


class Vocabulary:
    """The model's tokens as bytes, prepared once per tokenizer (tries / token classes).

    token_bytes: the bytes each id decodes to (`Tokenizer.token_bytes`). size: the model's vocabulary
    size, the width of the logits (ids >= len(token_bytes) are never allowed). special_ids: never
    allowed inside constrained output. eos_ids: allowed only when the document is complete.
    `build_seconds`: the time this took (SmolLM2: ~0.3 s).
    """

    def __init__(
        self, token_bytes: Sequence[bytes], size: int, special_ids: Iterable[int], eos_ids: Iterable[int]
    ) -> None:
        started = time.perf_counter()
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise InvalidArgumentError(f"Vocabulary: size must be a positive integer, got {size!r}")
        self.size = size
        self.eos_ids = tuple(sorted({i for i in (_token_id(i, "eos_ids") for i in eos_ids) if 0 <= i < size}))
        special = {_token_id(i, "special_ids") for i in special_ids}
        self.token_bytes = [bytes(b) for b in token_bytes[:size]]
        self.eos_mask = np.zeros(size, bool)  # (V,)
        self.eos_mask[list(self.eos_ids)] = True
        self.eligible = np.zeros(size, bool)  # (V,) tokens that may appear inside the output
        self.plain_chars = np.full(size, _NOT_PLAIN, np.int32)  # (V,) characters of plain-text tokens
        tokens, rests = [], []  # rests[k]: (what follows, id) of tokens with k plain characters first
        for i, data in enumerate(self.token_bytes):
            if not data or i in special or self.eos_mask[i]:
                continue
            self.eligible[i] = True
            tokens.append((data, i))
            head, chars = _plain_head(data)
            if head == len(data):
                self.plain_chars[i] = chars
            else:
                rests.extend([] for _ in range(chars + 1 - len(rests)))
                rests[chars].append((data[head:], i))
        self.trie = _Trie(tokens)
        self.rest_tries = [_Trie(pairs) for pairs in rests]
        self.plain_mask = self.plain_chars != _NOT_PLAIN  # (V,)
        self.max_plain_chars = int(self.plain_chars[self.plain_mask].max(initial=0))
        self.build_seconds = time.perf_counter() - started

    def __repr__(self) -> str:
        return (
            f"Vocabulary(size={self.size}, tokens={int(self.eligible.sum())}, "
            f"plain={int(self.plain_mask.sum())}, eos_ids={self.eos_ids})"
        )


def _token_id(value: object, where: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise InvalidArgumentError(f"Vocabulary: {where} must hold integer token ids, got {value!r}")
    return int(value)


class _Trie:
    """A byte trie of tokens in flat lists: the children of node n are first[n], first[n] + 1, ... with
    the bytes labels[n]; ends[n] holds the ids of the tokens spelled by the path to n. Node 0 is the root.

    Flat lists rather than a dict per node: 100k dicts would make each full garbage collection of the
    process walk them all (tens of milliseconds, in the middle of a generation).
    """

    def __init__(self, tokens: Sequence[tuple[bytes, int]]) -> None:
        nested: dict = {}  # while building: byte -> child dict, and None -> ids
        for data, token_id in tokens:
            node = nested
            for b in data:
                child = node.get(b)
                if child is None:
                    child = node[b] = {}
                node = child
            node[None] = (*node.get(None, ()), token_id)
        self.first: list[int] = []
        self.labels: list[bytes] = []
        self.ends: list[tuple[int, ...] | None] = []
        order = [nested]  # breadth first, so that the children of a node are numbered in a row
        for node in order:
            labels = bytes(sorted(b for b in node if b is not None))
            self.first.append(len(order))
            self.labels.append(labels)
            self.ends.append(node.get(None))
            order.extend(node[b] for b in labels)


def _plain_head(data: bytes) -> tuple[int, int]:
    """(bytes, characters) of the longest head of `data` made of whole plain string characters."""
    special = _SPECIAL_IN_STRING.search(data)
    head = data if special is None else data[: special.start()]
    try:
        return len(head), len(head.decode("utf-8"))
    except UnicodeDecodeError as e:  # a broken or unfinished character: the head stops before it
        return e.start, len(head[: e.start].decode("utf-8"))


# --- Grammar: a JSON Schema compiled to nodes ---------------------------------------------------------


@dataclass(frozen=True)
class _Property:
    key: bytes  # the key as JSON text, quotes included
    value: int  # node id
    required: bool


@dataclass(frozen=True)
class _Object:
    properties: tuple[_Property, ...]
    free_value: int | None  # free keys with values of this node (then `properties` is empty)
    free_key: int | None  # the string node of free keys
    last_candidate: tuple[int, ...]  # [i]: the last property that may come next after i (a required one)
    closable: tuple[bool, ...]  # [i]: no required property at i or later


@dataclass(frozen=True)
class _Array:
    item: int | None  # None: no item is allowed
    min_items: int
    max_items: int  # -1: unbounded
    cap: int  # counts stop here: nothing beyond it is checked


@dataclass(frozen=True)
class _String:
    min_length: int
    max_length: int  # -1: unbounded
    cap: int


@dataclass(frozen=True)
class _Number:
    integer: bool
    minimum: int | None  # inclusive, integers only
    maximum: int | None


@dataclass(frozen=True)
class _Literal:
    values: tuple[bytes, ...]  # sorted JSON texts


@dataclass(frozen=True)
class _Union:
    options: tuple[int, ...]


_ANNOTATIONS = frozenset(  # and $defs, definitions: where $ref targets live
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "format", "deprecated"}
    | {"readOnly", "writeOnly", "$defs", "definitions"}
)
_SUPPORTED = (
    "type, properties, required, additionalProperties, items, minItems, maxItems, enum, const, anyOf, "
    "$ref, $defs, definitions, minLength, maxLength, minimum/maximum/exclusiveMinimum/exclusiveMaximum "
    "(integers), and annotations"
)
_KEYWORDS_OF = {
    "object": ("properties", "required", "additionalProperties"),
    "array": ("items", "minItems", "maxItems"),
    "string": ("minLength", "maxLength"),
    "integer": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
}
_KNOWN = _ANNOTATIONS | {"type", "enum", "const", "anyOf", "$ref"} | {k for ks in _KEYWORDS_OF.values() for k in ks}
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class _Rules:
    """What the parser reads: the nodes, and the first frames of each node's alternatives."""

    def __init__(self, nodes: Sequence) -> None:
        self.nodes = tuple(nodes)
        self.starts = tuple(_start_frames(self.nodes, n) for n in range(len(self.nodes)))


class Grammar:
    """A compiled JSON grammar (from `json_grammar`): immutable; the automata built from it for each
    vocabulary are cached inside it, so a grammar kept for reuse keeps its masks."""

    def __init__(self, nodes: list, root: int, prefix: bytes, suffix: bytes, description: str) -> None:
        self.rules = _Rules(nodes)
        self.root = root
        self.prefix = prefix
        self.suffix = suffix
        self.description = description
        self._automata: dict[Vocabulary, _Automaton] = {}

    def __repr__(self) -> str:
        return f"Grammar({self.description}, prefix={self.prefix!r}, suffix={self.suffix!r})"

    def initial_config(self) -> tuple:
        suffix = ((_TEXT, self.suffix, 0),) if self.suffix else ()
        prefix = ((_TEXT, self.prefix, 0),) if self.prefix else ()
        return (*suffix, (_VALUE, self.root), *prefix)

    def accepts(self, node: int, text: bytes) -> bool:
        """Whether `text` is exactly a value of `node` (used to keep the enum values a schema allows)."""
        configs = {((_VALUE, node),)}
        for b in text:
            configs = {c for config in configs for c in _step(self.rules, config, b)}
        return any(_complete(self.rules, c) for c in configs)

    def automaton(self, vocabulary: Vocabulary) -> _Automaton:
        automaton = self._automata.get(vocabulary)
        if automaton is None or len(automaton.states) > MAX_DFA_STATES:
            automaton = _Automaton(self.rules, self.initial_config(), vocabulary)
            self._automata[vocabulary] = automaton
        return automaton


def json_grammar(schema: dict | bool | None, prefix: str = "", suffix: str = "") -> Grammar:
    """The grammar of one JSON value, with literal text before and after it.

    schema None: any JSON object (`response_format: {"type": "json_object"}`); otherwise a JSON Schema
    (see the module docstring for the keywords supported). prefix/suffix, e.g. "<tool_call>\\n" and
    "\\n</tool_call>", are written exactly, with no whitespace added around the value.
    """
    for name, text in (("prefix", prefix), ("suffix", suffix)):
        if not isinstance(text, str):
            raise InvalidArgumentError(f"json_grammar: {name} must be a string, got {type(text).__name__}")
    compiler = _Compiler(schema)
    if schema is None:
        root, description = compiler.free_object(compiler.any_value()), "json_object"
    else:
        if not isinstance(schema, (dict, bool)):
            raise InvalidArgumentError(f"json_schema: the schema must be an object or a boolean, got {schema!r}")
        if schema is False:
            raise InvalidArgumentError("json_schema: the schema is false: no document is valid")
        root, description = compiler.compile(schema, ()), "json_schema"
    return compiler.finish(root, prefix.encode("utf-8"), suffix.encode("utf-8"), description)


def _where(path: tuple[str, ...]) -> str:
    return "at " + ".".join(path) if path else "at the root"


def _fail(message: str, path: tuple[str, ...]) -> InvalidArgumentError:
    return InvalidArgumentError(f"json_schema: {message} {_where(path)}")


def _json_text(value: object, ascii_only: bool, path: tuple[str, ...]) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise _fail(f"a value of 'enum'/'const' is not JSON ({e})", path) from None
    return text.encode("utf-8")


class _Compiler:
    """Turns a schema into nodes (a list; ids are indexes). `$ref` targets are compiled once, into a
    slot reserved before their body, so recursion refers back to the slot."""

    def __init__(self, root_schema: object) -> None:
        self.root_schema = root_schema
        self.nodes: list = []
        self.refs: dict[str, int] = {}
        self.enums: list[tuple[int, int, list, tuple[str, ...]]] = []  # (slot, other keywords, values, path)
        self._any: int | None = None

    def add(self, node: object) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def any_value(self) -> int:
        if self._any is None:
            self._any = self.add(None)
            options = (
                self.free_object(self._any),
                self.add(_Array(self._any, 0, -1, 0)),
                self.add(_String(0, -1, 0)),
                self.add(_Number(False, None, None)),
                self.add(_Literal((b"false", b"null", b"true"))),
            )
            self.nodes[self._any] = _Union(options)
        return self._any

    def free_object(self, value: int) -> int:
        return self.add(_Object((), value, self.add(_String(0, -1, 0)), (), (True,)))

    def finish(self, root: int, prefix: bytes, suffix: bytes, description: str) -> Grammar:
        for slot, others, values, path in self.enums:  # inner ones first: keep what the other keywords allow
            texts = {_json_text(v, ascii_only, path) for v in values for ascii_only in (False, True)}
            if others >= 0:
                partial = Grammar(self.nodes, others, b"", b"", "enum filter")
                texts = {t for t in texts if partial.accepts(others, t)}
            kept = tuple(sorted(texts))
            if not kept:
                raise _fail("no value of 'enum'/'const' is valid under the other keywords", path)
            self.nodes[slot] = _Literal(kept)
        grammar = Grammar(self.nodes, root, prefix, suffix, description)
        if not grammar.rules.starts[root]:  # e.g. a $ref to itself and nothing else
            raise _fail("no JSON value is valid under the schema", ())
        return grammar

    def compile(self, schema: object, path: tuple[str, ...]) -> int:
        if schema is True:
            return self.any_value()
        if schema is False:
            return self.add(_Union(()))
        if not isinstance(schema, dict):
            raise _fail(f"a schema must be an object or a boolean, got {json.dumps(schema)}", path)
        for key in schema:
            if key not in _KNOWN:
                raise InvalidArgumentError(
                    f"json_schema: {key!r} {_where(path)} is not supported (supported: {_SUPPORTED})"
                )
        constraining = [k for k in schema if k not in _ANNOTATIONS]
        for keyword in ("$ref", "anyOf"):
            if keyword in schema and len(constraining) > 1:
                other = next(k for k in constraining if k != keyword)
                raise _fail(f"{keyword!r} with the sibling keyword {other!r} is not supported", path)
        if "$ref" in schema:
            return self.ref(schema["$ref"], path)
        if "anyOf" in schema:
            options = schema["anyOf"]
            if not isinstance(options, list) or not options:
                raise _fail("'anyOf' must be a non-empty list of schemas", path)
            return self.add(_Union(tuple(self.compile(s, (*path, "anyOf", str(i))) for i, s in enumerate(options))))
        if "enum" in schema or "const" in schema:
            return self.enum(schema, path)
        types = self.types(schema, path)
        nodes = [self.typed(t, schema, path) for t in types]
        return nodes[0] if len(nodes) == 1 else self.add(_Union(tuple(nodes)))

    def ref(self, target: object, path: tuple[str, ...]) -> int:
        if target in self.refs:
            return self.refs[target]
        if not isinstance(target, str) or not (
            target == "#" or target.startswith("#/$defs/") or target.startswith("#/definitions/")
        ):
            raise _fail(f"'$ref' {target!r} is not supported (only '#', '#/$defs/...', '#/definitions/...')", path)
        parts = tuple(p.replace("~1", "/").replace("~0", "~") for p in target[2:].split("/")) if target != "#" else ()
        schema = self.root_schema
        for part in parts:
            if not isinstance(schema, dict) or part not in schema:
                raise _fail(f"'$ref' {target!r} points to nothing", path)
            schema = schema[part]
        slot = self.refs[target] = self.add(None)
        self.nodes[slot] = _Union((self.compile(schema, parts),))
        return slot

    def enum(self, schema: dict, path: tuple[str, ...]) -> int:
        values = schema.get("enum", [])
        if "enum" in schema and (not isinstance(values, list) or not values):
            raise _fail("'enum' must be a non-empty list", path)
        if "const" in schema:
            values = [v for v in values if v == schema["const"]] if "enum" in schema else [schema["const"]]
        others = {k: v for k, v in schema.items() if k not in ("enum", "const") and k not in _ANNOTATIONS}
        slot = self.add(None)  # filled by `finish`, once every node exists
        self.enums.append((slot, self.compile(others, path) if others else -1, values, path))
        return slot

    def types(self, schema: dict, path: tuple[str, ...]) -> list[str]:
        bounds = [k for k in _KEYWORDS_OF["integer"] if k in schema]
        if "type" not in schema:
            if bounds:
                raise _fail(f'{bounds[0]!r} without "type": "integer" is not supported (integers only)', path)
            types = [t for t, keywords in _KEYWORDS_OF.items() if any(k in schema for k in keywords)]
            return types or list(_TYPES)
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not types:
            raise _fail("'type' is an empty list", path)
        for t in types:
            if t not in _TYPES:
                raise _fail(f"'type' {t!r} is not a JSON Schema type (one of {', '.join(_TYPES)})", path)
        if "number" in types and bounds:
            raise _fail(f'{bounds[0]!r} is supported only for integers ("type": "integer"), not numbers', path)
        return list(dict.fromkeys(types))

    def typed(self, kind: str, schema: dict, path: tuple[str, ...]) -> int:
        if kind == "object":
            return self.object(schema, path)
        if kind == "array":
            return self.array(schema, path)
        if kind == "string":
            low, high = _count(schema, "minLength", path), _count(schema, "maxLength", path)
            if high >= 0 and low > high:
                raise _fail(f"'minLength' {low} is more than 'maxLength' {high}", path)
            return self.add(_String(low, high, high if high >= 0 else low))
        if kind == "integer":
            return self.add(_Number(True, *_integer_bounds(schema, path)))
        if kind == "number":
            return self.add(_Number(False, None, None))
        return self.add(_Literal((b"false", b"true") if kind == "boolean" else (b"null",)))

    def object(self, schema: dict, path: tuple[str, ...]) -> int:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if not isinstance(properties, dict):
            raise _fail("'properties' must be an object", path)
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _fail("'required' must be a list of strings", path)
        # Free keys only when nothing is listed: no properties and additionalProperties allowing more
        # (explicitly, or by saying nothing at all). "properties": {} alone means the empty object.
        listed_none = "properties" not in schema or "additionalProperties" in schema
        if not properties and not required and extra is not False and listed_none:
            return self.free_object(self.compile(extra, (*path, "additionalProperties")))
        listed = []
        for name, sub in properties.items():
            if sub is False:
                if name in required:
                    raise _fail(f"the required property {name!r} has the schema false", path)
                continue
            listed.append((name, self.compile(sub, (*path, "properties", name)), name in required))
        for name in dict.fromkeys(required):
            if name not in properties:
                if extra is False:
                    raise _fail(f"the required property {name!r} is not in 'properties'", path)
                listed.append((name, self.compile(extra, (*path, "additionalProperties")), True))
        props = tuple(_Property(json.dumps(n, ensure_ascii=False).encode("utf-8"), v, r) for n, v, r in listed)
        needed = [i for i, p in enumerate(props) if p.required]
        last = tuple(next((j for j in needed if j >= i), len(props) - 1) for i in range(len(props) + 1))
        closable = tuple(not any(j >= i for j in needed) for i in range(len(props) + 1))
        return self.add(_Object(props, None, None, last, closable))

    def array(self, schema: dict, path: tuple[str, ...]) -> int:
        items = schema.get("items", True)
        if isinstance(items, list):
            raise _fail("'items' as a list (tuple validation) is not supported", path)
        low, high = _count(schema, "minItems", path), _count(schema, "maxItems", path)
        if items is False:
            high = 0
        if high >= 0 and low > high:
            raise _fail(f"'minItems' {low} is more than 'maxItems' {high} (or 'items' is false)", path)
        item = None if high == 0 else self.compile(items, (*path, "items"))
        return self.add(_Array(item, low, high, max(low, high)))


def _count(schema: dict, keyword: str, path: tuple[str, ...]) -> int:
    """A non-negative integer keyword; when absent, 0 for a minimum and -1 (none) for a maximum."""
    if keyword not in schema:
        return 0 if keyword.startswith("min") else -1
    value = schema[keyword]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _fail(f"{keyword!r} must be a non-negative integer, got {value!r}", path)
    return value


def _integer_bounds(schema: dict, path: tuple[str, ...]) -> tuple[int | None, int | None]:
    low = high = None
    for keyword in _KEYWORDS_OF["integer"]:
        if keyword not in schema:
            continue
        value = schema[keyword]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise _fail(f"{keyword!r} must be a finite number, got {value!r}", path)
        if keyword == "minimum":
            bound, is_low = math.ceil(value), True
        elif keyword == "exclusiveMinimum":
            bound, is_low = math.floor(value) + 1, True
        elif keyword == "maximum":
            bound, is_low = math.floor(value), False
        else:
            bound, is_low = math.ceil(value) - 1, False
        if is_low:
            low = bound if low is None else max(low, bound)
        else:
            high = bound if high is None else min(high, bound)
    largest = 10**MAX_INT_DIGITS - 1
    if (low is not None and high is not None and low > high) or (low or 0) > largest or (high or 0) < -largest:
        raise _fail(f"no integer of at most {MAX_INT_DIGITS} digits is within the bounds [{low}, {high}]", path)
    return low, high


# --- The parser: frames on a stack, one byte at a time -----------------------------------------------
#
# A configuration is a tuple of frames, the innermost last. Frames:
#   (_TEXT, text, offset)            literal prefix/suffix text, popped after its last byte
#   (_VALUE, node)                   a value not started yet (only at the root)
#   (_OBJECT, node, phase, i, x)     i: next property index; x: whitespace state, or the key so far
#   (_ARRAY, node, phase, count, w)  w: whitespace state
#   (_STRING, node, phase, count, u) count: characters (capped); u: \u digits, or UTF-8 bytes still due
#   (_NUMBER, node, phase, digits, value)  value: tracked only for bounded integers
#   (_LITERAL, node, text so far)
# A frame that has read its closing byte is popped. Numbers and literals end without a byte of their
# own: when they can end, the next byte is also offered to the frame below.
# Whitespace state: 0 nothing, 1 one space, 100 * newlines + spaces/tabs after them.

_TEXT, _VALUE, _OBJECT, _ARRAY, _STRING, _NUMBER, _LITERAL = range(7)
_OPEN, _FIRST, _KEY, _COLON, _VALUE_NEXT, _AFTER_VALUE, _AFTER_COMMA = range(7)  # objects and arrays
_S_OPEN, _S_CONTENT, _S_ESCAPE, _S_HEX, _S_UTF8 = range(5)
_N_START, _N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRACTION, _N_E, _N_E_SIGN, _N_EXPONENT = range(9)

_WHITESPACE = frozenset(b" \n\t")
_ESCAPES = frozenset(b'"\\/bfnrt')
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DIGITS = frozenset(b"0123456789")
# UTF-8 lead byte -> (continuation bytes due, range of the next one): no overlong forms, no surrogates,
# nothing above U+10FFFF (as Python's strict decoder).
_UTF8_LEAD = {b: (1, 0x80, 0xBF) for b in range(0xC2, 0xE0)}
_UTF8_LEAD.update({b: (2, 0x80, 0xBF) for b in range(0xE1, 0xF0)})
_UTF8_LEAD.update({0xE0: (2, 0xA0, 0xBF), 0xED: (2, 0x80, 0x9F)})
_UTF8_LEAD.update({0xF0: (3, 0x90, 0xBF), 0xF1: (3, 0x80, 0xBF), 0xF2: (3, 0x80, 0xBF), 0xF3: (3, 0x80, 0xBF)})
_UTF8_LEAD[0xF4] = (3, 0x80, 0x8F)
_UTF8_MORE = {1: None, 2: (1, 0x80, 0xBF), 3: (2, 0x80, 0xBF)}


def _bits(data: bytes) -> int:
    return sum(1 << b for b in set(data))


# Bytes a frame may read, as a 256-bit set: a superset, cheap to look up, so that the mask walk can skip
# impossible bytes without stepping the parser. Every JSON value starts with one of _VALUE_FIRST.
_ANY_BYTE = (1 << 256) - 1
_WS_BITS = _bits(b" \n\t")
_VALUE_FIRST = _bits(b'{["-0123456789tfn')
_READABLE = {
    (_OBJECT, _OPEN): _bits(b"{"),
    (_OBJECT, _FIRST): _WS_BITS | _bits(b'"}'),
    (_OBJECT, _COLON): _WS_BITS | _bits(b":"),
    (_OBJECT, _VALUE_NEXT): _WS_BITS | _VALUE_FIRST,
    (_OBJECT, _AFTER_VALUE): _WS_BITS | _bits(b",}"),
    (_OBJECT, _AFTER_COMMA): _WS_BITS | _bits(b'"'),
    (_ARRAY, _OPEN): _bits(b"["),
    (_ARRAY, _FIRST): _WS_BITS | _VALUE_FIRST | _bits(b"]"),
    (_ARRAY, _AFTER_VALUE): _WS_BITS | _bits(b",]"),
    (_ARRAY, _AFTER_COMMA): _WS_BITS | _VALUE_FIRST,
    (_STRING, _S_OPEN): _bits(b'"'),
    (_STRING, _S_CONTENT): _ANY_BYTE,
    (_STRING, _S_ESCAPE): _bits(b'"\\/bfnrtu'),
    (_STRING, _S_HEX): _bits(b"0123456789abcdefABCDEF"),
    (_STRING, _S_UTF8): _bits(bytes(range(0x80, 0xC0))),
    **{(_NUMBER, phase): _bits(b"-+.eE0123456789") for phase in range(9)},
}


def _readable(g: _Rules, config: tuple) -> int:
    """A superset of the bytes `config` can read, as a 256-bit set."""
    bits = 0
    for frame in reversed(config):
        kind = frame[0]
        if kind == _TEXT:
            bits |= 1 << frame[1][frame[2]]
        elif kind == _VALUE:
            bits |= _VALUE_FIRST
        elif kind == _LITERAL:
            values, text = g.nodes[frame[1]].values, frame[2]
            i = bisect_left(values, text)  # the values that start with `text` follow in a row
            while i < len(values) and values[i].startswith(text):
                if len(values[i]) > len(text):
                    bits |= 1 << values[i][len(text)]
                i += 1
        elif kind == _OBJECT and frame[2] == _KEY:
            _, n, _, i, text = frame
            spec = g.nodes[n]
            for p in spec.properties[i : spec.last_candidate[i] + 1]:
                if p.key.startswith(text):  # keys are quoted: none is the whole of another
                    bits |= 1 << p.key[len(text)]
        else:
            bits |= _READABLE[kind, frame[2]]
        if not _can_end(g, frame):
            break
    return bits


def _start_frames(nodes: Sequence, node: int) -> tuple[tuple, ...]:
    """The first frame of each alternative of a node (unions flattened, cycles ignored)."""
    frames, seen, todo = [], set(), [node]
    while todo:
        n = todo.pop(0)
        if n in seen:
            continue
        seen.add(n)
        spec = nodes[n]
        if isinstance(spec, _Union):
            todo.extend(spec.options)
        elif isinstance(spec, _Object):
            frames.append((_OBJECT, n, _OPEN, 0, 0))
        elif isinstance(spec, _Array):
            frames.append((_ARRAY, n, _OPEN, 0, 0))
        elif isinstance(spec, _String):
            frames.append((_STRING, n, _S_OPEN, 0, 0))
        elif isinstance(spec, _Number):
            frames.append((_NUMBER, n, _N_START, 0, 0))
        elif isinstance(spec, _Literal):
            frames.append((_LITERAL, n, b""))
    return tuple(frames)


def _step(g: _Rules, config: tuple, b: int) -> list[tuple]:
    """The configurations after reading byte b (none: b is not allowed)."""
    if not config:  # the document and its suffix are complete
        return []
    top = config[-1]
    below = config[:-1]
    out = [below + frames for frames in _STEPS[top[0]](g, top, b)]
    if below and _can_end(g, top):
        out.extend(_step(g, below, b))
    return out


def _complete(g: _Rules, config: tuple) -> bool:
    return all(_can_end(g, frame) for frame in config)


def _can_end(g: _Rules, frame: tuple) -> bool:
    kind = frame[0]
    if kind == _NUMBER:
        _, n, phase, _, value = frame
        spec = g.nodes[n]
        if spec.integer:
            return phase in (_N_ZERO, _N_INT) and _within(spec, value)
        return phase in (_N_ZERO, _N_INT, _N_FRACTION, _N_EXPONENT)
    if kind == _LITERAL:
        values = g.nodes[frame[1]].values
        i = bisect_left(values, frame[2])
        return i < len(values) and values[i] == frame[2]
    return False


def _start_value(g: _Rules, node: int, b: int) -> list[tuple]:
    out = []
    for frame in g.starts[node]:
        out.extend(_STEPS[frame[0]](g, frame, b))
    return out


def _whitespace(w: int, b: int) -> int | None:
    if b == 0x0A:  # newlines come first
        return w + 100 if w == 0 or (w % 100 == 0 and w // 100 < MAX_NEWLINES) else None
    if w == 0:
        return 1 if b == 0x20 else None
    return w + 1 if w >= 100 and w % 100 < MAX_INDENT else None


def _step_text(g: _Rules, frame: tuple, b: int) -> list[tuple]:
    _, text, offset = frame
    if text[offset] != b:
        return []
    return [()] if offset + 1 == len(text) else [((_TEXT, text, offset + 1),)]


def _step_value(g: _Rules, frame: tuple, b: int) -> list[tuple]:
    return _start_value(g, frame[1], b)


def _step_object(g: _Rules, frame: tuple, b: int) -> list[tuple]:
    _, n, phase, i, x = frame
    spec = g.nodes[n]
    if phase == _KEY:  # x: the key so far, from its opening quote
        key = x + bytes((b,))
        for j in range(i, spec.last_candidate[i] + 1):
            candidate = spec.properties[j].key
            if candidate == key:
                return [((_OBJECT, n, _COLON, j, 0),)]
            if candidate.startswith(key):
                return [((_OBJECT, n, _KEY, i, key),)]
        return []
    if phase == _OPEN:
        return [((_OBJECT, n, _FIRST, 0, 0),)] if b == 0x7B else []
    if b in _WHITESPACE:
        w = _whitespace(x, b)
        return [] if w is None else [((_OBJECT, n, phase, i, w),)]
    free = spec.free_value is not None
    if phase == _FIRST or phase == _AFTER_COMMA:
        if b == 0x22 and free:
            return [((_OBJECT, n, _COLON, 0, 0), (_STRING, spec.free_key, _S_CONTENT, 0, 0))]
        if b == 0x22 and i < len(spec.properties):
            return [((_OBJECT, n, _KEY, i, b'"'),)]
        return [()] if b == 0x7D and phase == _FIRST and spec.closable[i] else []
    if phase == _COLON:
        return [((_OBJECT, n, _VALUE_NEXT, i, 0),)] if b == 0x3A else []
    if phase == _VALUE_NEXT:
        after = (_OBJECT, n, _AFTER_VALUE, 0 if free else i + 1, 0)
        value = spec.free_value if free else spec.properties[i].value
        return [(after, *frames) for frames in _start_value(g, value, b)]
    # _AFTER_VALUE
    if b == 0x2C and (free or i < len(spec.properties)):
        return [((_OBJECT, n, _AFTER_COMMA, i, 0),)]
    return [()] if b == 0x7D and spec.closable[i] else []


def _step_array(g: _Rules, frame: tuple, b: int) -> list[tuple]:
    _, n, phase, count, w = frame
    spec = g.nodes[n]
    if phase == _OPEN:
        return [((_ARRAY, n, _FIRST, 0, 0),)] if b == 0x5B else []
    if b in _WHITESPACE:
        w = _whitespace(w, b)
        return [] if w is None else [((_ARRAY, n, phase, count, w),)]
    if phase == _AFTER_VALUE:
        if b == 0x2C and (spec.max_items < 0 or count < spec.max_items):
            return [((_ARRAY, n, _AFTER_COMMA, count, 0),)]
        return [()] if b == 0x5D and count >= spec.min_items else []
    if phase == _FIRST and b == 0x5D:
        return [()] if spec.min_items == 0 else []
    if spec.item is None:
        return []
    after = (_ARRAY, n, _AFTER_VALUE, min(count + 1, spec.cap), 0)
    return [(after, *frames) for frames in _start_value(g, spec.item, b)]


def _step_string(g: _Rules, frame: tuple, b: int) -> list[tuple]:
    _, n, phase, count, u = frame
    if phase == _S_CONTENT:
        spec = g.nodes[n]
        if b == 0x22:
            return [()] if count >= spec.min_length else []
        if b < 0x20 or (spec.max_length >= 0 and count >= spec.max_length):
            return []
        count = min(count + 1, spec.cap)  # a character starts here
        if b == 0x5C:
            return [((_STRING, n, _S_ESCAPE, count, 0),)]
        if b < 0x80:
            return [((_STRING, n, _S_CONTENT, count, 0),)]
        lead = _UTF8_LEAD.get(b)
        return [] if lead is None else [((_STRING, n, _S_UTF8, count, lead),)]
    if phase == _S_UTF8:
        due, low, high = u
        if not low <= b <= high:
            return []
        more = _UTF8_MORE[due]
        return [((_STRING, n, _S_CONTENT, count, 0) if more is None else (_STRING, n, _S_UTF8, count, more),)]
    if phase == _S_OPEN:
        return [((_STRING, n, _S_CONTENT, 0, 0),)] if b == 0x22 else []
    if phase == _S_ESCAPE:
        if b in _ESCAPES:
            return [((_STRING, n, _S_CONTENT, count, 0),)]
        return [((_STRING, n, _S_HEX, count, 0),)] if b == 0x75 else []
    # _S_HEX: u = hex digits read; -1 after a leading D, which must be followed by 0-7 (no surrogates)
    if b not in _HEX or (u == -1 and b not in b"01234567"):
        return []
    if u == 0 and b in b"dD":
        return [((_STRING, n, _S_HEX, count, -1),)]
    digits = 2 if u == -1 else u + 1
    return [((_STRING, n, _S_CONTENT, count, 0) if digits == 4 else (_STRING, n, _S_HEX, count, digits),)]


def _step_number(g: _Rules, frame: tuple, b: int) -> list[tuple]:
    _, n, phase, digits, value = frame
    spec = g.nodes[n]
    bounded = spec.minimum is not None or spec.maximum is not None
    digit = b - 0x30 if b in _DIGITS else -1
    if phase == _N_START and b == 0x2D:  # '-'
        return [((_NUMBER, n, _N_MINUS, 0, 0),)] if spec.minimum is None or spec.minimum <= 0 else []
    if phase in (_N_START, _N_MINUS, _N_INT) and digit >= 0:
        if phase == _N_INT and digits == MAX_INT_DIGITS:
            return []
        negative = phase == _N_MINUS or value < 0
        magnitude = abs(value) * 10 + digit if bounded else 0
        if bounded and not _reachable(spec, negative, magnitude, digits + 1):
            return []
        next_phase = _N_ZERO if phase != _N_INT and digit == 0 else _N_INT
        return [((_NUMBER, n, next_phase, digits + 1, -magnitude if negative else magnitude),)]
    if spec.integer:
        return []
    if b == 0x2E and phase in (_N_ZERO, _N_INT):  # '.'
        return [((_NUMBER, n, _N_DOT, 0, 0),)]
    if b in b"eE" and phase in (_N_ZERO, _N_INT, _N_FRACTION):
        return [((_NUMBER, n, _N_E, 0, 0),)]
    if phase == _N_E and b in b"+-":
        return [((_NUMBER, n, _N_E_SIGN, 0, 0),)]
    if digit < 0:
        return []
    if phase == _N_DOT or (phase == _N_FRACTION and digits < MAX_FRACTION_DIGITS):
        return [((_NUMBER, n, _N_FRACTION, digits + 1, 0),)]
    if phase in (_N_E, _N_E_SIGN) or (phase == _N_EXPONENT and digits < MAX_EXPONENT_DIGITS):
        return [((_NUMBER, n, _N_EXPONENT, digits + 1, 0),)]
    return []


def _reachable(spec: _Number, negative: bool, magnitude: int, digits: int) -> bool:
    """Whether some integer written with these leading digits (and sign) lies within the bounds."""
    longest = 0 if magnitude == 0 else MAX_INT_DIGITS - digits  # a leading 0 takes no more digits
    for more in range(longest + 1):
        low, high = magnitude * 10**more, magnitude * 10**more + 10**more - 1
        if negative:
            low, high = -high, -low
        if (spec.minimum is None or high >= spec.minimum) and (spec.maximum is None or low <= spec.maximum):
            return True
    return False


def _within(spec: _Number, value: int) -> bool:
    return (spec.minimum is None or value >= spec.minimum) and (spec.maximum is None or value <= spec.maximum)


def _step_literal(g: _Rules, frame: tuple, b: int) -> list[tuple]:
    values = g.nodes[frame[1]].values
    text = frame[2] + bytes((b,))
    i = bisect_left(values, text)  # the first value starting with `text`, if any does
    if i == len(values) or not values[i].startswith(text):
        return []
    if values[i] == text and (i + 1 == len(values) or not values[i + 1].startswith(text)):
        return [()]  # nothing longer can follow: done
    return [((_LITERAL, frame[1], text),)]


_STEPS = (_step_text, _step_value, _step_object, _step_array, _step_string, _step_number, _step_literal)


# --- The automaton: interned states, their transitions and masks -------------------------------------


class _State:
    __slots__ = ("complete", "configs", "mask", "next", "readable")

    def __init__(self, configs: frozenset, complete: bool, readable: bytes) -> None:
        self.configs = configs
        self.complete = complete
        self.readable = readable  # [b]: 1 if byte b may be readable (0: surely not)
        self.next: dict[int, int] = {}  # byte -> index of the next state (-1: the byte is not allowed)
        self.mask: np.ndarray | None = None  # packed bits of allowed() once computed


class _Automaton:
    """The grammar as a DFA over bytes, built lazily as generation visits it, with each state's mask.

    Transitions hold state indexes, not states: no reference cycles, so an automaton is freed as soon as
    its grammar is, without waiting for the garbage collector.
    """

    def __init__(self, rules: _Rules, initial: tuple, vocabulary: Vocabulary) -> None:
        self.rules = rules
        self.vocabulary = vocabulary
        self.states: list[_State] = []
        self.index: dict[frozenset, int] = {}
        self.tables: dict[int, bytes] = {}  # 256-bit set -> its table of 256 bytes 0/1
        self.lock = threading.Lock()  # matchers of one grammar may run in several threads
        self.initial = self.intern(frozenset([initial]))

    def intern(self, configs: frozenset) -> int:
        i = self.index.get(configs)
        if i is not None:
            return i
        with self.lock:
            i = self.index.get(configs)
            if i is not None:
                return i
            rules = self.rules
            complete = any(_complete(rules, c) for c in configs)
            bits = 0
            for config in configs:
                bits |= _readable(rules, config)
            table = self.tables.get(bits)
            if table is None:
                packed = np.frombuffer(bits.to_bytes(32, "little"), np.uint8)  # (32,)
                table = self.tables[bits] = np.unpackbits(packed, bitorder="little").tobytes()
            self.states.append(_State(configs, complete, table))
            i = self.index[configs] = len(self.states) - 1
            return i

    def transition(self, i: int, b: int) -> int:
        """The state after byte b in state i (-1: b is not allowed)."""
        state = self.states[i]
        following = state.next.get(b)
        if following is None:
            configs = frozenset(c for config in state.configs for c in _step(self.rules, config, b))
            following = state.next[b] = self.intern(configs) if configs else -1
        return following

    def mask(self, i: int) -> np.ndarray:
        """(V,) bool: the tokens allowed in state i (EOS excluded; see Matcher.allowed)."""
        size = self.vocabulary.size
        state = self.states[i]
        if state.mask is None:
            if len(state.configs) == 1:
                (config,) = state.configs
                allowed = self._config_mask(i, config)  # (V,)
            else:  # a token is allowed if one of the configurations allows it
                allowed = np.zeros(size, bool)  # (V,)
                for config in state.configs:
                    allowed |= self.mask(self.intern(frozenset([config])))
            state.mask = np.packbits(allowed)  # (ceil(V / 8),) uint8
        return np.unpackbits(state.mask, count=size).view(bool)  # (V,)

    def _config_mask(self, i: int, config: tuple) -> np.ndarray:
        vocabulary = self.vocabulary
        found: list[tuple[int, ...]] = []
        if not config:  # complete: no token continues it (Matcher.allowed gives EOS)
            return np.zeros(vocabulary.size, bool)  # (V,)
        top = config[-1]
        if top[0] == _STRING and top[2] == _S_CONTENT:  # plain text tokens all at once, then the others
            spec = self.rules.nodes[top[1]]
            count = top[3]
            room = spec.max_length - count if spec.max_length >= 0 else vocabulary.max_plain_chars
            allowed = vocabulary.plain_chars <= room  # (V,)
            for chars, trie in enumerate(vocabulary.rest_tries[: room + 1]):
                head = (_STRING, top[1], _S_CONTENT, min(count + chars, spec.cap), 0)
                self._walk(trie, self.intern(frozenset([(*config[:-1], head)])), found)
        else:
            allowed = np.zeros(vocabulary.size, bool)  # (V,)
            self._walk(vocabulary.trie, i, found)
        if found:
            allowed[[token for ids in found for token in ids]] = True
        return allowed

    def _walk(self, trie: _Trie, i: int, found: list) -> None:
        """Depth-first over the trie and the DFA together; collects the ids of tokens that can be read."""
        first, labels, ends, states = trie.first, trie.labels, trie.ends, self.states
        todo = [(0, i)]
        while todo:
            node, i = todo.pop()
            state = states[i]
            following, readable = state.next, state.readable
            child = first[node]
            for b in labels[node]:
                if readable[b]:
                    s = following.get(b)
                    if s is None:
                        s = self.transition(i, b)
                    if s >= 0:
                        if ends[child] is not None:
                            found.append(ends[child])
                        if labels[child]:
                            todo.append((child, s))
                child += 1


# --- Matcher ------------------------------------------------------------------------------------------


class Matcher:
    """Follows one generation: `allowed()` before sampling, `advance(token)` after.

    complete: the output so far is a whole valid document (and suffix); then only EOS is allowed (all
    tokens are disallowed if the vocabulary has no EOS: the caller stops on `complete`).
    """

    def __init__(self, grammar: Grammar, vocabulary: Vocabulary) -> None:
        if not isinstance(grammar, Grammar):
            raise InvalidArgumentError(f"Matcher: grammar must be a Grammar (json_grammar), got {grammar!r}")
        if not isinstance(vocabulary, Vocabulary):
            raise InvalidArgumentError(f"Matcher: vocabulary must be a Vocabulary, got {vocabulary!r}")
        self.vocabulary = vocabulary
        self._automaton = grammar.automaton(vocabulary)
        self._state = self._automaton.initial
        self._tail = b""  # the last bytes written, for error messages
        self._ended = False  # EOS was read

    @property
    def complete(self) -> bool:
        return self._automaton.states[self._state].complete

    def allowed(self) -> np.ndarray:
        """(V,) bool: the tokens that keep the output a prefix of a valid document; when complete, EOS only."""
        if self.complete:
            return self.vocabulary.eos_mask.copy()  # (V,)
        allowed = self._automaton.mask(self._state)  # (V,)
        if not allowed.any():  # only with a vocabulary that cannot spell some byte (no byte fallback)
            raise InferenceError(f"constrained output: no token of the vocabulary can follow {self._tail!r}")
        return allowed

    def advance(self, token_id: int) -> None:
        """Read one token; InvalidArgumentError if it is not allowed here."""
        vocabulary = self.vocabulary
        if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < vocabulary.size:
            raise InvalidArgumentError(f"Matcher.advance: token id {token_id!r} is not in [0, {vocabulary.size})")
        token_id = int(token_id)
        if self._ended:
            raise InvalidArgumentError(f"Matcher.advance: token {token_id} after EOS")
        if vocabulary.eos_mask[token_id]:
            if not self.complete:
                raise self._refused(token_id, "EOS before the JSON document is complete")
            self._ended = True
            return
        if self.complete:
            raise self._refused(token_id, "the document is complete: only EOS may follow")
        if not vocabulary.eligible[token_id]:
            raise self._refused(token_id, "a special or empty token cannot be part of the JSON output")
        state = self._state
        for b in vocabulary.token_bytes[token_id]:
            state = self._automaton.transition(state, b)
            if state < 0:
                raise self._refused(token_id, "it cannot continue a valid document here")
        self._state = state
        self._tail = (self._tail + vocabulary.token_bytes[token_id])[-40:]

    def _refused(self, token_id: int, why: str) -> InvalidArgumentError:
        data = self.vocabulary.token_bytes[token_id] if token_id < len(self.vocabulary.token_bytes) else b""
        return InvalidArgumentError(
            f"constrained output: token {token_id} ({data!r}) is not allowed after {self._tail!r}: {why}"
        )
