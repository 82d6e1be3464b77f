"""JSON Schema to grammar: `json_grammar` compiles a schema (or None: any JSON object) to nodes, and
refuses what is not supported with an `InvalidArgumentError` naming the keyword and where it is.
"""

from __future__ import annotations

import json
import math

from ...errors import InvalidArgumentError
from .grammar import Grammar
from .nodes import _Array, _Literal, _Number, _Object, _Property, _String, _Union
from .parser import MAX_INT_DIGITS

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


def json_grammar(schema: dict | bool | None, prefix: str = "", suffix: str = "") -> Grammar:
    """The grammar of one JSON value, with literal text before and after it.

    schema None: any JSON object (`response_format: {"type": "json_object"}`); otherwise a JSON Schema
    (see the package docstring, `ruvllm.runtime.constrain`, for the keywords supported). prefix/suffix,
    e.g. "<tool_call>\\n" and "\\n</tool_call>", are written exactly, with no whitespace added around
    the value.
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
