"""JSON Schema to grammar: `json_grammar` compiles a schema (or None: any JSON object) to nodes, and
refuses what is not supported with an `InvalidArgumentError` naming the keyword and where it is.

This module walks the schema: references (resolve.py), allOf merged (combine.py), anyOf/oneOf, enum and
const; each type's own keywords are read and checked by keywords.py, and the nodes emitted from what it
reads.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import combinations, product

from ...errors import InvalidArgumentError
from .combine import MAX_COMBINATIONS, MergeError, UnsatisfiableError, json_equal, merge, reference
from .grammar import Grammar
from .keywords import (
    HANDLED,
    MAX_LITERAL_BYTES,
    REFUSED,
    ArraySchema,
    DocumentTooLongError,
    KeyNames,
    KeywordReader,
    NoValueError,
    ObjectSchema,
    check_keywords,
    fail,
    types_of,
    where,
)
from .nodes import Array, Literal, Number, Object, Property, String, Union
from .parser import MAX_INT_DIGITS, feasible
from .resolve import ROOT_URI, Location, Resources

MAX_SCHEMA_DEPTH = 100  # sub-schemas (and references, allOf parts) followed within each other
MAX_ANY_ORDER = 16  # objects with more declared properties are written in schema order
_PROPERTY_ORDERS = ("any", "schema")
MAX_KEY_CHARS = 1_000_000  # undeclared keys of objects with maxProperties (see _Compiler.extra_key)

# What one schema may cost, so that no request can make the compiler or the constraint take gigabytes or
# minutes. Each is far above what real schemas use: JSONSchemaBench's 10,000 schemas have at most 915 KB
# of JSON, 9,106 sub-schemas, 587 properties in one object, names of 110 bytes, 5,383 values in one enum
# and enum/const values of 528 bytes (benchmarks/RESULTS.md, "What a schema may cost"). keywords.py holds
# the two it checks as it reads: MAX_OBJECT_PROPERTIES and MAX_LITERAL_BYTES.
MAX_SCHEMA_BYTES = 2 << 20  # the schema as compact JSON text
MAX_NODES = 20_000  # nodes compiled (sub-schemas, with references and merges unrolled; JSONSchemaBench: 4,078)
MAX_ENUM_VALUES = 20_000  # values of one enum
# The longest document a grammar is compiled for when the caller does not say (a request says: its
# max_tokens, or its context, times the longest token): a schema whose shortest document is longer, or
# with a minLength/minItems past it, is refused, as no generation could finish it.
MAX_DOCUMENT_BYTES = 1 << 20


def json_grammar(
    schema: dict | bool | None,
    prefix: str = "",
    suffix: str = "",
    strict: bool = False,
    extra_properties: bool | str = True,
    whitespace: str = "compact",
    property_order: str = "any",
    max_bytes: int = MAX_DOCUMENT_BYTES,
) -> Grammar:
    """The grammar of one JSON value, with literal text before and after it.

    schema None: any JSON object (`response_format: {"type": "json_object"}`); otherwise a JSON Schema
    (see the package docstring, `ruvllm.runtime.constrain`, for the keywords supported). prefix/suffix,
    e.g. "<tool_call>\\n" and "\\n</tool_call>", are written exactly, with no whitespace added around
    the value. strict: refuse keywords no JSON Schema draft defines (by default they are ignored, as
    the specification says). extra_properties: True, undeclared properties may be written between the
    declared ones where `additionalProperties` allows them (absent, true or a schema), as LLGuidance
    does and as JSON Schema reads (its valid documents); "explicit", only where the schema says so
    (`additionalProperties` true or a schema, or `patternProperties`: absent means none, as XGrammar's
    strict mode and OpenAI's structured outputs write objects; `response_format` uses it); False,
    only the declared ones whatever the schema says. (An object that declares no property at all
    takes any key in each mode: `{"type": "object"}` is a free-form object.) property_order: "any"
    (declared properties in any order, each at most once, the required ones all before the object
    closes; objects with more than MAX_ANY_ORDER declared properties keep schema order) or "schema"
    (in schema order, as XGrammar and LLGuidance write them: fewer states, and the model is led
    through the properties in the order the schema's author chose). whitespace: "compact" (no whitespace between the
    tokens of the document, as XGrammar and LLGuidance write it: fewer tokens) or "flexible" (what
    the package docstring describes: indented, pretty output is possible, and JSON written by
    `json.dumps` with its default separators is read). max_bytes: the longest document the grammar
    is for (prefix and suffix aside; see MAX_DOCUMENT_BYTES): a schema whose shortest valid document
    is longer is refused with DocumentTooLongError, naming the keyword where one does (`minLength`,
    `minItems`), and lengths beyond it are bounded by it. Schemas past the MAX_* bounds of this module
    are refused too, before they cost more than those bounds allow.
    """
    if property_order not in _PROPERTY_ORDERS:
        raise InvalidArgumentError(f'json_grammar: property_order must be "any" or "schema", got {property_order!r}')
    if whitespace not in ("compact", "flexible"):
        raise InvalidArgumentError(f'json_grammar: whitespace must be "compact" or "flexible", got {whitespace!r}')
    for name, text in (("prefix", prefix), ("suffix", suffix)):
        if not isinstance(text, str):
            raise InvalidArgumentError(f"json_grammar: {name} must be a string, got {type(text).__name__}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 2:
        raise InvalidArgumentError(f"json_grammar: max_bytes must be an integer of at least 2, got {max_bytes!r}")
    _check_size(schema)
    compiler = _Compiler(schema, strict, extra_properties, property_order == "any", max_bytes)
    if schema is None:
        root, description = compiler.free_object(compiler.any_value()), "json_object"
    else:
        if not isinstance(schema, (dict, bool)):
            raise InvalidArgumentError(f"json_schema: the schema must be an object or a boolean, got {schema!r}")
        if schema is False:
            raise InvalidArgumentError("json_schema: the schema is false: no document is valid")
        root, description = compiler.compile(schema, (), (compiler.resources.root_uri, ()), 0), "json_schema"
    return compiler.finish(root, prefix.encode("utf-8"), suffix.encode("utf-8"), description, whitespace == "flexible")


def _check_size(schema: object) -> None:
    """Refuse a schema longer than MAX_SCHEMA_BYTES as compact JSON, measured without recursion (and
    without finishing a schema far past the bound, or one that holds itself)."""
    size, todo = 0, [schema]
    while todo and size <= MAX_SCHEMA_BYTES:
        value = todo.pop()
        if isinstance(value, dict):
            size += 1 + len(value)  # braces, colons and commas
            for key, item in value.items():
                size += 2 + (len(key) if isinstance(key, str) else 8)
                todo.append(item)
        elif isinstance(value, list):
            size += 1 + len(value)
            todo.extend(value)
        elif isinstance(value, str):
            size += 2 + len(value)
        else:
            size += 4
    if size > MAX_SCHEMA_BYTES:
        raise InvalidArgumentError(
            f"json_schema: the schema is larger than {MAX_SCHEMA_BYTES:,} bytes of JSON (the most one request "
            "may compile)"
        )


def _json_texts(value: object, path: tuple[str, ...]) -> set[bytes]:
    """The ways a value of `enum`/`const` may be written: compact, non-ASCII raw or \\u-escaped, and a
    number equal to an integer with or without `.0` (JSON Schema compares numbers by value)."""
    values = [value]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 10**MAX_INT_DIGITS:
        if float(value).is_integer():
            values = [int(value), float(value)]
    texts = set()
    for v in values:
        for ascii_only in (False, True):
            try:
                text = json.dumps(v, ensure_ascii=ascii_only, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as e:
                raise fail(f"a value of 'enum'/'const' is not JSON ({e})", path) from None
            data = text.encode("utf-8")
            if len(data) > MAX_LITERAL_BYTES:
                raise fail(
                    f"a value of 'enum'/'const' is {len(data):,} bytes of JSON (at most {MAX_LITERAL_BYTES:,})", path
                )
            texts.add(data)
    return texts


def _child(location: Location | None, *keys: str) -> Location | None:
    return None if location is None else (location[0], (*location[1], *keys))


class _Compiler:
    """Turns a schema into nodes (a list; ids are indexes). `$ref` targets are compiled once, into a
    slot reserved before their body, so recursion refers back to the slot. A sub-schema that no
    document can meet compiles to an empty union, with the reason kept for the error if the root is one."""

    def __init__(
        self,
        root_schema: object,
        strict: bool,
        extra_properties: bool | str,
        any_order: bool = True,
        max_bytes: int = MAX_DOCUMENT_BYTES,
    ) -> None:
        self.max_bytes = max_bytes
        self.resources = Resources(root_schema)
        self.strict = strict
        if not (isinstance(extra_properties, bool) or extra_properties == "explicit"):
            raise InvalidArgumentError(
                f'json_grammar: extra_properties must be True, False or "explicit", got {extra_properties!r}'
            )
        self.extra_properties = extra_properties
        self.any_order = any_order
        self.nodes: list = []
        self.refs: dict[str, int] = {}
        self.enums: list[tuple[int, int, list, tuple[str, ...]]] = []  # (slot, other keywords, values, path)
        self.dead: dict[int, str] = {}  # node -> why no value meets it
        self.exclusive: list[tuple[int, tuple[str, ...]]] = []  # oneOf unions, checked in `finish`
        self._any: int | None = None
        self.read = KeywordReader(max_bytes)  # each type's keywords, read and checked

    def add(self, node: object) -> int:
        if len(self.nodes) >= MAX_NODES:
            raise InvalidArgumentError(
                f"json_schema: the schema compiles to more than {MAX_NODES:,} nodes (sub-schemas, with its "
                "references and merges unrolled): too large to constrain one request"
            )
        self.nodes.append(node)
        return len(self.nodes) - 1

    def dead_node(self, why: str, path: tuple[str, ...]) -> int:
        node = self.add(Union(()))
        self.dead[node] = f"{why} {where(path)}"
        return node

    def any_value(self) -> int:
        if self._any is None:
            self._any = self.add(None)
            options = (
                self.free_object(self._any),
                self.add(Array(self._any, 0, -1, 0)),
                self.add(String(0, -1, 0)),
                self.add(Number(False, None, None)),
                self.add(Literal((b"false", b"null", b"true"))),
            )
            self.nodes[self._any] = Union(options)
        return self._any

    def free_object(self, value: int, key: int | None = None) -> int:
        return self.add(Object((), value, self.add(String(0, -1, 0)) if key is None else key, (), (True,)))

    def finish(self, root: int, prefix: bytes, suffix: bytes, description: str, whitespace: bool) -> Grammar:
        for slot, others, values, path in self.enums:  # inner ones first: keep what the other keywords allow
            texts = {t for v in values for t in _json_texts(v, path)}
            if others >= 0:
                partial = Grammar(self.nodes, others, b"", b"", "enum filter")
                texts = {t for t in texts if partial.accepts(others, t)}
            self.nodes[slot] = Literal(tuple(sorted(texts)))
            if not texts:
                self.dead[slot] = f"no value of 'enum'/'const' is valid under the other keywords {where(path)}"
        for node, path in self.exclusive:
            options = self.nodes[node].options
            for i, j in combinations(range(len(options)), 2):
                if not _disjoint(self.nodes, options[i], options[j]):
                    raise fail(
                        f"'oneOf' options {i} and {j} may both match one document (only options that exclude "
                        "each other by type, value or a required property's value are supported; 'anyOf' if "
                        "overlaps do not matter)",
                        path,
                    )
        productive = _prune(self.nodes)
        if root not in productive:
            reasons = [why for node, why in self.dead.items()]
            why = f" ({reasons[0]})" if reasons else " (every alternative needs an endless document)"
            raise InvalidArgumentError(f"json_schema: no JSON value is valid under the schema{why}")
        least = _least_bytes(self.nodes, self.max_bytes)[root]
        if least > self.max_bytes:
            raise DocumentTooLongError(
                f"json_schema: the shortest document valid under the schema needs more than the {self.max_bytes:,} "
                "bytes a document may have"
            )
        return Grammar(self.nodes, root, prefix, suffix, description, whitespace)

    def compile(self, schema: object, path: tuple[str, ...], location: Location | None, depth: int) -> int:
        if depth > MAX_SCHEMA_DEPTH:
            raise fail(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (sub-schemas and references)", path)
        if schema is True:
            return self.any_value()
        if schema is False:
            return self.dead_node("the schema is false", path)
        if not isinstance(schema, dict):
            raise fail(f"a schema must be an object or a boolean, got {json.dumps(schema)[:60]}", path)
        if location is not None:
            location = self.resources.enter(schema, location)
        check_keywords(schema, path, self.strict)
        constraining = [k for k in schema if k in HANDLED or k in REFUSED]
        if constraining == ["$ref"]:
            return self.ref(schema["$ref"], path, location, depth)
        if "$ref" in schema or "allOf" in schema:
            try:
                parts = self.flatten(schema, path, location, depth)
                merged = merge(parts)
            except UnsatisfiableError as e:
                return self.dead_node(str(e), path)
            except MergeError as e:
                raise fail(str(e), path) from None
            return self.plain(merged, path, None, depth + 1)
        return self.plain(schema, path, location, depth)

    def flatten(
        self, schema: dict, path: tuple[str, ...], location: Location | None, depth: int
    ) -> list[tuple[dict, Location | None]]:
        """The parts whose meeting is `schema`: its own keywords, its `$ref` target's, its `allOf`'s."""
        if depth > MAX_SCHEMA_DEPTH:
            raise fail(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (sub-schemas and references)", path)
        check_keywords(schema, path, self.strict)
        own = {k: v for k, v in schema.items() if (k in HANDLED or k in REFUSED) and k not in ("$ref", "allOf")}
        parts: list[tuple[dict, Location | None]] = [(own, location)]
        if "$ref" in schema:
            _, target, target_location = self.lookup(schema["$ref"], path, location)
            parts.extend(self.parts_of(target, (*path, "$ref"), target_location, depth + 1))
        if "allOf" in schema:
            options = schema["allOf"]
            if not isinstance(options, list) or not options:
                raise fail("'allOf' must be a non-empty list of schemas", path)
            for i, sub in enumerate(options):
                sub_path, sub_location = (*path, "allOf", str(i)), _child(location, "allOf", str(i))
                parts.extend(self.parts_of(sub, sub_path, sub_location, depth + 1))
        return parts

    def parts_of(
        self, schema: object, path: tuple[str, ...], location: Location | None, depth: int
    ) -> list[tuple[dict, Location | None]]:
        if schema is False:
            raise UnsatisfiableError(f"the schema {where(path)} is false")
        if schema is True:
            return []
        if not isinstance(schema, dict):
            raise fail(f"a schema must be an object or a boolean, got {json.dumps(schema)[:60]}", path)
        if location is not None:
            location = self.resources.enter(schema, location)
        return self.flatten(schema, path, location, depth)

    def lookup(
        self, reference: object, path: tuple[str, ...], location: Location | None
    ) -> tuple[str, object, Location]:
        if not isinstance(reference, str):
            raise fail(f"'$ref' must be a string, got {json.dumps(reference)[:60]}", path)
        base = location[0] if location is not None else ROOT_URI
        found = self.resources.resolve(reference, base)
        if found is None and self.resources.outside(reference, base):
            raise fail(f"'$ref' {reference!r} points to another document (references are not fetched)", path)
        if found is None:
            raise fail(f"'$ref' {reference!r} points to nothing", path)
        return found

    def ref(self, reference: object, path: tuple[str, ...], location: Location | None, depth: int) -> int:
        target, schema, target_location = self.lookup(reference, path, location)
        if target in self.refs:
            return self.refs[target]
        slot = self.refs[target] = self.add(None)
        where = target_location[1] if target_location[0] == self.resources.root_uri else (target,)
        self.nodes[slot] = Union((self.compile(schema, where, target_location, depth + 1),))
        return slot

    def plain(self, schema: dict, path: tuple[str, ...], location: Location | None, depth: int) -> int:
        """A schema without `$ref`/`allOf` of its own."""
        schema = {k: v for k, v in schema.items() if k in HANDLED or k in REFUSED}
        choices = [k for k in ("anyOf", "oneOf") if k in schema]
        for keyword in choices:
            if not isinstance(schema[keyword], list) or not schema[keyword]:
                raise fail(f"{keyword!r} must be a non-empty list of schemas", path)
        if choices:
            return self.choice(schema, choices, path, location, depth)
        if "enum" in schema or "const" in schema:
            return self.enum(schema, path, location, depth)
        types = types_of(schema, path)
        nodes = [self.typed(t, schema, path, location, depth) for t in types]
        return nodes[0] if len(nodes) == 1 else self.add(Union(tuple(nodes)))

    def choice(
        self, schema: dict, choices: list[str], path: tuple[str, ...], location: Location | None, depth: int
    ) -> int:
        """anyOf / oneOf: one alternative per option (per combination when both are present), each met
        with the sibling keywords. oneOf is compiled as anyOf, and `finish` refuses it unless its options
        exclude each other (so that no document valid under two of them is written)."""
        others = {k: v for k, v in schema.items() if k not in choices}
        lists = [
            [(o, (*path, k, str(i)), _child(location, k, str(i))) for i, o in enumerate(schema[k])] for k in choices
        ]
        combinations = math.prod(len(options) for options in lists)
        if combinations > MAX_COMBINATIONS:
            raise fail(f"'anyOf' beside 'oneOf' makes {combinations} options (at most {MAX_COMBINATIONS})", path)
        options = []
        for combination in product(*lists):
            if not others and len(combination) == 1:
                option, option_path, option_location = combination[0]
                options.append(self.compile(option, option_path, option_location, depth + 1))
                continue
            try:
                parts = [(others, location)]
                for option, option_path, option_location in combination:
                    parts.extend(self.parts_of(option, option_path, option_location, depth + 1))
                merged = merge(parts)
            except UnsatisfiableError as e:
                options.append(self.dead_node(str(e), combination[0][1]))
                continue
            except MergeError as e:
                raise fail(str(e), path) from None
            options.append(self.plain(merged, combination[0][1], None, depth + 1))
        node = self.add(Union(tuple(options)))
        if "oneOf" in choices:
            self.exclusive.append((node, path))
        return node

    def enum(self, schema: dict, path: tuple[str, ...], location: Location | None, depth: int) -> int:
        values = schema.get("enum", [])
        if "enum" in schema and (not isinstance(values, list) or not values):
            raise fail("'enum' must be a non-empty list", path)
        if len(values) > MAX_ENUM_VALUES:
            raise fail(f"'enum' has {len(values):,} values (at most {MAX_ENUM_VALUES:,})", path)
        if "const" in schema:
            const = schema["const"]
            values = [v for v in values if json_equal(v, const)] if "enum" in schema else [const]
        others = {k: v for k, v in schema.items() if k not in ("enum", "const")}
        slot = self.add(None)  # filled by `finish`, once every node exists
        self.enums.append((slot, self.plain(others, path, location, depth) if others else -1, values, path))
        return slot

    def typed(self, kind: str, schema: dict, path: tuple[str, ...], location: Location | None, depth: int) -> int:
        """The node of one type's keywords, read and checked (keywords.py), then emitted."""
        if kind in ("boolean", "null"):
            return self.add(Literal((b"false", b"true") if kind == "boolean" else (b"null",)))
        try:
            if kind == "object":
                read: ObjectSchema | ArraySchema | String | Number = self.read.object(schema, path)
            elif kind == "array":
                read = self.read.array(schema, path)
            elif kind == "string":
                read = self.read.string(schema, path)
            else:
                read = self.read.number(schema, kind, path)
        except NoValueError as e:
            return self.dead_node(str(e), path)
        if isinstance(read, ObjectSchema):
            return self.object(read, path, location, depth)
        if isinstance(read, ArraySchema):
            return self.array(read, path, location, depth)
        return self.add(read)

    def object(self, schema: ObjectSchema, path: tuple[str, ...], location: Location | None, depth: int) -> int:
        properties, required, names, patterns = schema.properties, schema.required, schema.names, schema.patterns
        extra, extra_path = schema.additional, (*path, "additionalProperties")
        extra_location = _child(location, "additionalProperties")
        key = self.key_node(names)  # undeclared keys (None: any key)
        if patterns:  # undeclared keys are written only where they match: additionalProperties is not needed
            pattern, sub = next(iter(patterns.items()))
            extra = reference(sub, _child(location, "patternProperties", pattern))
            extra_path, extra_location = (*path, "patternProperties", pattern), None
        writes_extra = self.extra_properties is True or (self.extra_properties == "explicit" and schema.explicit)
        undeclared = extra is not False and writes_extra  # undeclared keys may be written
        dependencies = dict(schema.dependencies)
        if dependencies and not (properties or required) and undeclared:
            raise fail("'dependentRequired' between undeclared properties is not supported", path)
        low, high = schema.min_properties, schema.max_properties
        counts = {"min_properties": low, "max_properties": high}
        if high >= 0 and low > high:
            return self.dead_node(f"'minProperties' {low} is more than 'maxProperties' {high}", path)
        # Free keys only when nothing is listed: no properties and additionalProperties allowing more
        # (explicitly, or by saying nothing at all). "properties": {} alone means the empty object.
        if not properties and not required and extra is not False and not schema.closed_if_empty:
            value = self.compile(extra, extra_path, extra_location, depth + 1)
            if low == 0 and high < 0:
                return self.free_object(value, key)
            if low > 1:
                raise fail(
                    f"'minProperties' {low} on an object without declared properties is not supported (at most "
                    "1: undeclared keys are not compared with each other)",
                    path,
                )
            return self.add(
                _object_node((), value, self.extra_key(key, high), True, min_properties=low, max_properties=high)
            )
        listed = []
        for name, sub in properties.items():
            sub_path, sub_location = (*path, "properties", name), _child(location, "properties", name)
            if not names.allows(name):
                node = self.dead_node(f"the property {name!r} is not allowed by 'propertyNames'", path)
            elif names.matches_patterns(name):
                both = {"allOf": [reference(sub, sub_location), extra]}  # a listed name matching the pattern
                node = self.compile(both, sub_path, None, depth + 1)
            else:
                node = self.compile(sub, sub_path, sub_location, depth + 1)
            listed.append((name, node, name in required))
        for name in required:
            if name not in properties:
                if extra is False or not names.allows(name):
                    return self.dead_node(f"the required property {name!r} is not in 'properties'", path)
                if patterns and not names.matches_patterns(name):
                    return self.dead_node(f"the required property {name!r} matches no 'patternProperties'", path)
                listed.append((name, self.compile(extra, extra_path, extra_location, depth + 1), True))
        names_listed = {name for name, _, _ in listed}
        for trigger, needs in list(dependencies.items()):
            if trigger not in names_listed and not undeclared:
                del dependencies[trigger]  # never written: nothing it requires matters
                continue
            for name in needs:
                fits = names.allows(name) and (not patterns or names.matches_patterns(name))
                if name not in names_listed and undeclared and fits and trigger in names_listed:
                    listed.append((name, self.compile(extra, extra_path, extra_location, depth + 1), False))
                    names_listed.add(name)
            if trigger not in names_listed or any(name not in names_listed for name in needs):
                raise fail(
                    "'dependentRequired' is supported between declared properties (or undeclared ones the "
                    f"schema allows), not for {trigger!r}",
                    path,
                )
        uses = (("dependentRequired", dependencies), ("minProperties", low), ("maxProperties", high >= 0))
        for keyword, used in uses:
            if used and not (self.any_order and len(listed) <= MAX_ANY_ORDER):
                raise fail(
                    f"'{keyword}' needs property_order 'any' and no more than {MAX_ANY_ORDER} declared properties", path
                )
        props = tuple(Property(_key(n), v, r) for n, v, r in listed)
        deps = {_key(k): tuple(_key(n) for n in v) for k, v in dependencies.items()}
        if not writes_extra or extra is False or not (properties or patterns):
            spec = _object_node(props, any_order=self.any_order, dependencies=deps, **counts)
        else:
            value = self.compile(extra, extra_path, extra_location, depth + 1)
            spec = _object_node(props, value, self.extra_key(key, high), self.any_order, deps, **counts)
        if not feasible(spec, 0):
            if spec.extra_value is not None and feasible(replace(spec, min_properties=0), 0):
                raise fail(
                    f"'minProperties' {low} beyond the declared properties and one undeclared key is not supported "
                    "(undeclared keys are not compared with each other)",
                    path,
                )
            return self.dead_node(f"'minProperties' {low} or 'maxProperties' {high} cannot be met", path)
        return self.add(spec)

    def extra_key(self, key: int | None, most: int) -> int:
        """The string node of undeclared keys (key None: any key). With maxProperties (most >= 0), an
        undeclared key may not fit where the count is reached, so its node is not a plain unbounded string:
        the masks of key prefixes then walk the tokens rather than allow all plain text at once."""
        if most < 0:
            return self.add(String(0, -1, 0)) if key is None else key
        spec = String(0, -1, 0) if key is None else self.nodes[key]
        if isinstance(spec, String) and spec.pattern is None and spec.max_length < 0:
            return self.add(replace(spec, max_length=MAX_KEY_CHARS))
        assert key is not None  # key None: spec is the plain unbounded string, returned above
        return key

    def key_node(self, names: KeyNames) -> int | None:
        """The string node of undeclared keys (None: any key), from `propertyNames` and `patternProperties`."""
        if names.none or (names.max_length >= 0 and names.min_length > names.max_length):
            return self.add(Union(()))  # no name at all: only an empty object
        regex = names.patterns if names.patterns is not None else names.pattern
        if regex is None and names.min_length == 0 and names.max_length < 0:
            return None
        low, high = names.min_length, names.max_length
        return self.add(String(low, high, high if high >= 0 else low, regex))

    def array(self, schema: ArraySchema, path: tuple[str, ...], location: Location | None, depth: int) -> int:
        keyword, rest, low, high = schema.prefix_keyword, schema.rest_keyword, schema.min_items, schema.max_items
        prefix = tuple(
            self.compile(s, (*path, keyword, str(i)), _child(location, keyword, str(i)), depth + 1)
            for i, s in enumerate(schema.prefix)
        )
        more = high < 0 or high > len(prefix)
        item = self.compile(schema.rest, (*path, rest), _child(location, rest), depth + 1) if more else None
        return self.add(Array(item, low, high, max(low, high, len(prefix)), prefix))


def _key(name: str) -> bytes:
    """A property name as the JSON text of its key."""
    return json.dumps(name, ensure_ascii=False).encode("utf-8")


def _object_node(
    props: tuple[Property, ...],
    extra_value: int | None = None,
    extra_key: int | None = None,
    any_order: bool = False,
    dependencies: dict[bytes, tuple[bytes, ...]] | None = None,
    min_properties: int = 0,
    max_properties: int = -1,
) -> Object:
    """dependencies: key -> the keys it requires (JSON texts), all of them among `props` (the object is
    then written in any order)."""
    needed = [i for i, p in enumerate(props) if p.required]
    last = tuple(next((j for j in needed if j >= i), len(props) - 1) for i in range(len(props) + 1))
    closable = tuple(not any(j >= i for j in needed) for i in range(len(props) + 1))
    counted = min_properties > 0 or max_properties >= 0
    any_order = (any_order and 1 < len(props) <= MAX_ANY_ORDER) or bool(dependencies) or counted
    bits = sum(1 << j for j in needed) if any_order else 0
    index = {p.key: 1 << j for j, p in enumerate(props)}
    pairs = tuple(
        (index[key], sum(index[k] for k in keys)) for key, keys in (dependencies or {}).items() if key in index
    )
    return Object(
        props, None, None, last, closable, extra_value, extra_key, any_order=any_order, required_bits=bits,
        dependencies=pairs, min_properties=min_properties, max_properties=max_properties,
    )  # fmt: skip


def _leaves(nodes: list, node: int) -> list[int]:
    """The nodes that are not unions under `node` (unions flattened)."""
    out, seen, todo = [], set(), [node]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            if isinstance(nodes[n], Union):
                todo.extend(nodes[n].options)
            else:
                out.append(n)
    return out


def _kind(spec: object, text: bytes = b"") -> str:
    if isinstance(spec, Literal):
        first = text[:1]
        return {b"{": "object", b"[": "array", b'"': "string", b"t": "true", b"f": "false", b"n": "null"}.get(
            first, "number"
        )
    return {Object: "object", Array: "array", String: "string", Number: "number"}[type(spec)]


def _literal_texts(nodes: list, node: int) -> set[bytes] | None:
    """The JSON texts of a node that is only literals, else None."""
    texts: set[bytes] = set()
    for leaf in _leaves(nodes, node):
        if not isinstance(nodes[leaf], Literal):
            return None
        texts.update(nodes[leaf].values)
    return texts


def _same_value(a: bytes, b: bytes) -> bool:
    return json_equal(json.loads(a), json.loads(b))


def _disjoint(nodes: list, a: int, b: int) -> bool:
    """Whether no document can be valid under both nodes (a sufficient test: different types, literal
    values, integer ranges, or a property required by one whose literal values the other excludes)."""
    for x in _leaves(nodes, a):
        for y in _leaves(nodes, b):
            if not _leaves_disjoint(nodes, nodes[x], nodes[y]):
                return False
    return True


def _leaves_disjoint(nodes: list, x: object, y: object) -> bool:
    if isinstance(x, Literal) or isinstance(y, Literal):
        if isinstance(x, Literal) and isinstance(y, Literal):
            return not any(_same_value(t, u) for t in x.values for u in y.values)
        literal, other = (x, y) if isinstance(x, Literal) else (y, x)
        return all(_kind(literal, t) != _kind(other) for t in literal.values)  # type: ignore[attr-defined]
    if _kind(x) != _kind(y):
        return True
    if isinstance(x, Number) and isinstance(y, Number):
        return (x.maximum is not None and y.minimum is not None and x.maximum < y.minimum) or (
            y.maximum is not None and x.minimum is not None and y.maximum < x.minimum
        )
    if isinstance(x, Object) and isinstance(y, Object) and x.free_value is None and y.free_value is None:
        y_keys = {p.key: p for p in y.properties}
        for p in x.properties:
            q = y_keys.get(p.key)
            if q is None or not (p.required or q.required):
                continue
            texts_x, texts_y = _literal_texts(nodes, p.value), _literal_texts(nodes, q.value)
            if (
                texts_x is not None
                and texts_y is not None
                and not any(_same_value(t, u) for t in texts_x for u in texts_y)
            ):
                return True
    return False


def _prune(nodes: list) -> set[int]:
    """The nodes some finite document meets; the others become empty unions, and what refers to them
    is narrowed (optional properties and array items that could never be completed are dropped), so
    that generation never enters a branch it cannot finish."""
    productive: set[int] = set()
    changed = True
    while changed:
        changed = False
        for n, spec in enumerate(nodes):
            if n in productive:
                continue
            if isinstance(spec, Union):
                ok = any(o in productive for o in spec.options)
            elif isinstance(spec, Object):
                needed = spec.required_bits | sum(bits for _, bits in spec.dependencies)
                ok = spec.free_value is not None or all(
                    p.value in productive for j, p in enumerate(spec.properties) if p.required or needed >> j & 1
                )
                if ok and spec.min_properties:  # enough properties that can be written, for minProperties
                    writable = sum(p.value in productive for p in spec.properties)
                    ok = spec.min_properties <= writable + (spec.extra_value in productive)
            elif isinstance(spec, Array):
                items = [*spec.prefix[: spec.min_items], *([spec.item] if spec.min_items > len(spec.prefix) else [])]
                ok = all(node is not None and node in productive for node in items)
            elif isinstance(spec, Literal):
                ok = bool(spec.values)
            else:
                ok = True
            if ok:
                productive.add(n)
                changed = True
    for n, spec in enumerate(nodes):
        if n not in productive:
            nodes[n] = Union(())
        elif isinstance(spec, Object) and spec.free_value is not None and spec.free_value not in productive:
            nodes[n] = _object_node(())
        elif isinstance(spec, Object) and (
            any(p.value not in productive for p in spec.properties)
            or (spec.extra_value is not None and spec.extra_value not in productive)
        ):
            kept = tuple(p for p in spec.properties if p.value in productive)
            extra = spec.extra_value if spec.extra_value in productive else None
            excluded = tuple(p.key for p in spec.properties if p.value not in productive)
            keys = [p.key for p in spec.properties]
            deps = {
                keys[t.bit_length() - 1]: tuple(k for j, k in enumerate(keys) if bits >> j & 1)
                for t, bits in spec.dependencies
            }
            deps = {k: v for k, v in deps.items() if any(p.key == k for p in kept)}
            counts = {"min_properties": spec.min_properties, "max_properties": spec.max_properties}
            key = spec.extra_key if extra is not None else None
            node = _object_node(kept, extra, key, spec.any_order, deps, **counts)
            nodes[n] = replace(node, excluded=excluded)
        elif isinstance(spec, Array):
            dead = [i for i, node in enumerate(spec.prefix) if node not in productive]
            item = spec.item if spec.item is None or spec.item in productive else None
            if dead or item != spec.item:
                high = dead[0] if dead else len(spec.prefix) if item is None else spec.max_items
                if spec.max_items >= 0:
                    high = min(high, spec.max_items)
                nodes[n] = Array(item if not dead else None, spec.min_items, high, spec.cap, spec.prefix[:high])
    return productive


def _least_bytes(nodes: list, cap: int) -> list[int]:
    """[n]: a lower bound on the bytes of node n's shortest value (cap + 1 for anything longer than
    `cap`, or for no value at all), by rounds until nothing shortens, as `_prune`. Counted, never
    written out: a schema asking for a billion items costs no more than one asking for ten."""
    far = cap + 1
    least = [far] * len(nodes)
    changed = True
    while changed:
        changed = False
        for n, spec in enumerate(nodes):
            if isinstance(spec, Literal):
                value = min((len(text) for text in spec.values), default=far)
            elif isinstance(spec, String):
                pattern = spec.pattern.shortest[0] if spec.pattern is not None else 0
                value = 2 + max(spec.min_length, pattern)
            elif isinstance(spec, Number):
                value = 1
            elif isinstance(spec, Union):
                value = min((least[o] for o in spec.options), default=far)
            elif isinstance(spec, Object):
                due = [p for j, p in enumerate(spec.properties) if p.required or spec.required_bits >> j & 1]
                value = 1 + sum(len(p.key) + 2 + least[p.value] for p in due) + (not due)
            elif isinstance(spec, Array):
                prefix = spec.prefix[: spec.min_items]
                value = 1 + sum(1 + least[k] for k in prefix) + (not spec.min_items)
                if spec.min_items > len(prefix):
                    value += (spec.min_items - len(prefix)) * (1 + (far if spec.item is None else least[spec.item]))
            else:
                value = 1
            value = min(value, far)
            if value < least[n]:
                least[n] = value
                changed = True
    return least
