"""The keywords of each JSON type read from a schema and checked: the typed stage between a raw schema
and its nodes (as llguidance's json/schema.rs comes before its compiler.rs). schema.py walks the schema,
merges and emits; this module only reads.

A string's or a number's keywords read straight into their node (nodes.String, nodes.Number: nothing
beneath them to compile); an array's and an object's into ArraySchema and ObjectSchema, whose
sub-schemas are still raw, for schema.py to compile where they live. A malformed keyword is refused with
an InvalidArgumentError naming it and where it is; keywords that together allow no value of their type
raise NoValueError, and the node becomes a dead one, with the reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from ...errors import InvalidArgumentError
from .combine import json_equal
from .nodes import Number, String
from .parser import MAX_INT_DIGITS
from .regex import Regex, RegexError

MAX_OBJECT_PROPERTIES = 2_000  # declared properties of one object
MAX_LITERAL_BYTES = 4096  # a property name, or one enum/const value, as JSON text

# Annotations and identifiers: no effect on what is valid. `format` is an annotation, as in jsonschema's
# default validator (its values are not checked).
IGNORED = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "id", "$comment", "deprecated"}
    | {"readOnly", "writeOnly", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "$defs"}
    | {"definitions", "contentMediaType", "contentEncoding", "contentSchema"}
)
HANDLED = frozenset(
    {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required", "additionalProperties"}
    | {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "uniqueItems"}
    | {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "if", "then", "else", "minContains"}
    | {"maxContains", "pattern", "format", "patternProperties", "propertyNames", "dependentRequired", "dependencies"}
    | {"minProperties", "maxProperties", "multipleOf"}
)
REFUSED = frozenset(  # constraints JSON Schema defines that are not supported (yet)
    {"dependentSchemas", "not", "contains", "unevaluatedProperties"}
    | {"unevaluatedItems", "$dynamicRef", "$recursiveRef"}
)
SUPPORTED = (
    "type, properties, required, additionalProperties, items, prefixItems, minItems, maxItems, enum, const, "
    "anyOf, oneOf, allOf, $ref (with $id, $anchor), dependentRequired (and draft-04 dependencies lists), "
    "minProperties, maxProperties, multipleOf (integers), "
    "minLength, maxLength, pattern, format (date, time, "
    "date-time, uuid, email, ipv4, ipv6, uri), minimum, maximum, exclusiveMinimum, exclusiveMaximum, and annotations"
)
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_NAME_KEYWORDS = ("type", "pattern", "minLength", "maxLength", "format")  # what propertyNames may say

# `format` values written by these patterns (other formats are annotations, not checked).
_DATE = (  # days by month (29 February in every year)
    r"\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2\d))"
)
_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_HEX4 = "[0-9a-fA-F]{1,4}"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
FORMATS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}[tT]{_TIME}$",
    "uuid": "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "email": rf"^{_ATOM}(\.{_ATOM})*@{_LABEL}(\.{_LABEL})*$",
    "ipv4": rf"^({_OCTET}\.){{3}}{_OCTET}$",
    "ipv6": "^("
    + "|".join(
        [f"({_HEX4}:){{7}}{_HEX4}", f"({_HEX4}:){{1,7}}:", f"::({_HEX4}:){{0,6}}{_HEX4}"]
        + [f"({_HEX4}:){{1,{k}}}(:{_HEX4}){{1,{7 - k}}}" for k in range(1, 7)]
        + ["::"]
    )
    + ")$",
    "uri": r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s\"<>\\^`{|}]*$",
}


class DocumentTooLongError(InvalidArgumentError):
    """A schema whose shortest document is longer than the grammar may write (json_grammar's max_bytes)."""


class NoValueError(Exception):
    """No value of a type meets that type's keywords together (the message says why)."""


def where(path: tuple[str, ...]) -> str:
    return "at " + ".".join(path) if path else "at the root"


def fail(message: str, path: tuple[str, ...]) -> InvalidArgumentError:
    return InvalidArgumentError(f"json_schema: {message} {where(path)}")


def check_keywords(schema: dict, path: tuple[str, ...], strict: bool) -> None:
    """Refuse the keywords that are not supported, and with strict=True those no draft defines."""
    for key in schema:
        if key in REFUSED or (key == "if" and ("then" in schema or "else" in schema)):
            raise InvalidArgumentError(f"json_schema: {key!r} {where(path)} is not supported (supported: {SUPPORTED})")
        if strict and key not in HANDLED and key not in IGNORED:
            raise InvalidArgumentError(
                f"json_schema: {key!r} {where(path)} is not a keyword of JSON Schema (refused with strict=True)"
            )


def types_of(schema: dict, path: tuple[str, ...]) -> list[str]:
    """The types a schema allows: those of `type`, or all (each keyword constrains its own type)."""
    if "type" not in schema:
        return list(TYPES)
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if not types:
        raise fail("'type' is an empty list", path)
    for t in types:
        if t not in TYPES:
            raise fail(f"'type' {t!r} is not a JSON Schema type (one of {', '.join(TYPES)})", path)
    if "number" in types and "integer" in types:
        types = [t for t in types if t != "integer"]
    return list(dict.fromkeys(types))


@dataclass(frozen=True)
class ArraySchema:
    prefix_keyword: str  # "prefixItems", or draft-04 "items" as a list ("" without either)
    prefix: tuple[object, ...]  # the first items' schemas, at most max_items of them
    rest_keyword: str  # "items", or draft-04 "additionalItems" after an `items` list
    rest: object  # the schema of the items after the prefix (True: any)
    min_items: int
    max_items: int  # -1: none; with `rest` false, at most len(prefix)


@dataclass(frozen=True)
class KeyNames:
    """What undeclared keys may be: `propertyNames` (lengths, pattern, format) and the patterns of
    `patternProperties`. none: no name at all (propertyNames false, or no string meets it)."""

    none: bool = False
    min_length: int = 0
    max_length: int = -1  # -1: none
    pattern: Regex | None = None  # propertyNames' pattern and format
    patterns: Regex | None = None  # any pattern of patternProperties

    def allows(self, name: str) -> bool:
        """Whether a name meets propertyNames."""
        fits = self.min_length <= len(name) and (self.max_length < 0 or len(name) <= self.max_length)
        return not self.none and fits and (self.pattern is None or self.pattern.matches(name))

    def matches_patterns(self, name: str) -> bool:
        return self.patterns is not None and self.patterns.matches(name)


@dataclass(frozen=True)
class ObjectSchema:
    properties: Mapping[str, object]  # declared names -> their schemas, in schema order
    required: tuple[str, ...]  # each once, in schema order
    additional: object  # additionalProperties (True when absent)
    patterns: Mapping[str, object]  # patternProperties (every pattern with the same schema)
    explicit: bool  # additionalProperties or patternProperties is written
    closed_if_empty: bool  # `properties` written without either: "properties": {} is the empty object
    names: KeyNames
    dependencies: Mapping[str, tuple[str, ...]]  # dependentRequired: name -> the names it requires
    min_properties: int
    max_properties: int  # -1: none


class KeywordReader:
    """Reads each type's keywords, for one schema: lengths past max_bytes (the longest document) are
    lowered to it, minimums that cannot fit refused, and the regexes of `pattern`/`format` compiled
    once (a schema repeats them)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.regexes: dict[tuple[str, ...], Regex] = {}

    def count(self, schema: dict, keyword: str, path: tuple[str, ...], least: int = 1) -> int:
        """`_count`, with a minimum refused when that many characters (least 1), items (2: a comma
        each) or properties (5) cannot fit in max_bytes, and a maximum past max_bytes lowered to it
        (nothing longer is written anyway)."""
        value = _count(schema, keyword, path)
        if keyword.startswith("min") and value * least + 3 - least > self.max_bytes:
            raise DocumentTooLongError(
                f"json_schema: {keyword!r} {value:,} {where(path)} needs more than the {self.max_bytes:,} bytes "
                "a document may have"
            )
        return min(value, self.max_bytes) if value >= 0 else value

    def string(self, schema: dict, path: tuple[str, ...]) -> String:
        low, high = self.count(schema, "minLength", path), self.count(schema, "maxLength", path)
        if high >= 0 and low > high:
            raise NoValueError(f"'minLength' {low} is more than 'maxLength' {high}")
        return String(low, high, high if high >= 0 else low, self.pattern(schema, path))

    def number(self, schema: dict, kind: str, path: tuple[str, ...]) -> Number:
        """An "integer" or a "number": its bounds (integers: inclusive ints; numbers: Fractions, open or
        closed) and multipleOf."""
        if kind == "number" and "multipleOf" in schema and _multiple(schema, path).denominator == 1:
            kind = "integer"  # multiples of an integer are integers: written as integers (not 2.0)
        if kind == "integer":
            return _integer(schema, path)
        if "multipleOf" in schema:
            raise fail(
                f"'multipleOf' {schema['multipleOf']} for numbers is supported only when it is a whole "
                "number (then integers are written)",
                path,
            )
        return _decimal(schema, path)

    def array(self, schema: dict, path: tuple[str, ...]) -> ArraySchema:
        if schema.get("uniqueItems") is True:
            raise InvalidArgumentError(
                f"json_schema: 'uniqueItems' {where(path)} is not supported (supported: {SUPPORTED})"
            )
        items, rest_keyword = schema.get("items", True), "items"
        prefix_keyword = "prefixItems" if "prefixItems" in schema else "items" if isinstance(items, list) else ""
        prefix = schema.get(prefix_keyword, []) if prefix_keyword else []
        if prefix_keyword == "items":  # draft-04 tuples: items is the list, additionalItems the rest
            items, rest_keyword = schema.get("additionalItems", True), "additionalItems"
        if not isinstance(prefix, list):
            raise fail(f"{prefix_keyword!r} must be a list of schemas", path)
        low, high = self.count(schema, "minItems", path, 2), self.count(schema, "maxItems", path)
        if items is False:
            high = len(prefix) if high < 0 else min(high, len(prefix))
        if high >= 0 and low > high:
            raise NoValueError(f"'minItems' {low} is more than 'maxItems' {high} (or the items allowed)")
        return ArraySchema(prefix_keyword, tuple(prefix[: high if high >= 0 else None]), rest_keyword, items, low, high)

    def object(self, schema: dict, path: tuple[str, ...]) -> ObjectSchema:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        patterns = schema.get("patternProperties", {})
        if not isinstance(properties, dict):
            raise fail("'properties' must be an object", path)
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise fail("'required' must be a list of strings", path)
        if not isinstance(patterns, dict):
            raise fail("'patternProperties' must be an object", path)
        if len(properties) > MAX_OBJECT_PROPERTIES:
            raise fail(f"'properties' declares {len(properties):,} (at most {MAX_OBJECT_PROPERTIES:,})", path)
        for name in (*properties, *required):
            if len(name.encode("utf-8", "surrogatepass")) > MAX_LITERAL_BYTES:
                raise fail(f"a property name of {len(name):,} characters (at most {MAX_LITERAL_BYTES:,} bytes)", path)
        names = self.key_names(schema, patterns, path)
        dependencies = _dependencies(schema, path)
        explicit = "additionalProperties" in schema or bool(patterns)
        return ObjectSchema(
            properties=properties,
            required=tuple(dict.fromkeys(required)),
            additional=schema.get("additionalProperties", True),
            patterns=patterns,
            explicit=explicit,
            closed_if_empty="properties" in schema and not explicit,
            names=names,
            dependencies=dependencies,
            min_properties=self.count(schema, "minProperties", path, 5),
            max_properties=_count(schema, "maxProperties", path),
        )

    def key_names(self, schema: dict, patterns: dict, path: tuple[str, ...]) -> KeyNames:
        names = schema.get("propertyNames", True)
        if names is False:
            return KeyNames(none=True)
        if names is True:
            names = {}
        if not isinstance(names, dict) or any(k not in _NAME_KEYWORDS and k not in IGNORED for k in names):
            raise InvalidArgumentError(
                f"json_schema: 'propertyNames' {where(path)} is supported only with pattern, minLength, "
                "maxLength and format"
            )
        low, high = self.count(names, "minLength", path), self.count(names, "maxLength", path)
        try:
            pattern = self.pattern(names, (*path, "propertyNames"))
        except NoValueError:  # no name meets it: as propertyNames false
            return KeyNames(none=True)
        if not patterns:
            return KeyNames(False, low, high, pattern)
        schemas = list(patterns.values())
        if any(not json_equal(s, schemas[0]) for s in schemas[1:]):
            raise InvalidArgumentError(
                f"json_schema: 'patternProperties' {where(path)} with different schemas for different "
                "patterns is not supported"
            )
        if pattern is not None:
            raise InvalidArgumentError(
                f"json_schema: 'patternProperties' {where(path)} beside a 'propertyNames' pattern is not supported"
            )
        return KeyNames(False, low, high, None, self.regex(tuple(patterns), "pattern", (*path, "patternProperties")))

    def pattern(self, schema: dict, path: tuple[str, ...]) -> Regex | None:
        """The regex of `pattern` and of a `format` that has one (with both, the strings both match:
        NoValueError if none does)."""
        source = schema.get("pattern")
        shape = FORMATS.get(schema["format"]) if isinstance(schema.get("format"), str) else None
        if source is not None and shape is not None:
            key = (source if isinstance(source, str) else json.dumps(source), "format", shape)
            regex = self.regexes.get(key)
            if regex is None:
                first, second = self.pattern({"pattern": source}, path), self.regex((shape,), "format", path)
                assert first is not None
                try:
                    regex = Regex.both(first, second)
                except RegexError as e:
                    raise fail(
                        f"'pattern' {str(source)[:60]!r} with 'format' {schema['format']!r}: {e}", path
                    ) from None
                if regex is None:
                    raise NoValueError(
                        f"no string matches both 'pattern' {str(source)[:60]!r} and 'format' {schema['format']!r}"
                    )
                self.regexes[key] = regex
            return regex
        if source is None:
            return None if shape is None else self.regex((shape,), "format", path)
        sources = tuple(source) if isinstance(source, list) else (source,)
        if not all(isinstance(s, str) for s in sources):
            raise fail(f"'pattern' must be a string, got {json.dumps(source)[:60]}", path)
        return self.regex(sources, "pattern", path)

    def regex(self, sources: tuple[str, ...], keyword: str, path: tuple[str, ...]) -> Regex:
        """The regex of strings matching any of `sources`."""
        regex = self.regexes.get(sources)
        if regex is None:
            try:
                regex = self.regexes[sources] = Regex(*sources)
            except RegexError as e:
                raise fail(f"{keyword!r} {' | '.join(sources)[:80]!r}: {e}", path) from None
        return regex


def _dependencies(schema: dict, path: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """`dependentRequired`, and draft-04 `dependencies` in its list form: name -> the names it requires."""
    out: dict[str, tuple[str, ...]] = {}
    for keyword in ("dependentRequired", "dependencies"):
        value = schema.get(keyword, {})
        if not isinstance(value, dict):
            raise fail(f"{keyword!r} must be an object", path)
        for name, needs in value.items():
            if keyword == "dependencies" and (needs is True or needs == {}):
                continue  # a schema every object meets
            if keyword == "dependencies" and not isinstance(needs, list):
                raise InvalidArgumentError(
                    f"json_schema: 'dependencies' with a schema (not a list of names) {where(path)} is not "
                    f"supported (supported: {SUPPORTED})"
                )
            if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
                raise fail(f"{keyword!r} must map names to lists of names, got {json.dumps(needs)[:60]}", path)
            needs = tuple(n for n in dict.fromkeys(needs) if n != name)
            if needs:
                out[name] = tuple(dict.fromkeys((*out.get(name, ()), *needs)))
    return out


def _integer(schema: dict, path: tuple[str, ...]) -> Number:
    minimum, maximum = _integer_bounds(schema, path)
    largest = 10**MAX_INT_DIGITS - 1
    low = minimum if minimum is not None else -largest
    high = maximum if maximum is not None else largest
    step = _multiple(schema, path).numerator if "multipleOf" in schema else 1  # n * q / p whole: p | n
    if low > min(high, largest) or high < max(low, -largest) or -(-low // step) * step > high:
        why = f"no integer of at most {MAX_INT_DIGITS} digits is within the bounds [{minimum}, {maximum}]"
        raise NoValueError(why + (f" and a multiple of {schema['multipleOf']}" if step > 1 else ""))
    return Number(True, minimum, maximum, multiple_of=step)


def _decimal(schema: dict, path: tuple[str, ...]) -> Number:
    low, open_low, high, open_high = _decimal_bounds(schema, path)
    if low is None and high is None:
        return Number(False, None, None)
    largest = 10**MAX_INT_DIGITS
    empty = low is not None and high is not None and (low > high or (low == high and (open_low or open_high)))
    if empty or (low is not None and low >= largest) or (high is not None and high <= -largest):
        raise NoValueError(f"no number of at most {MAX_INT_DIGITS} integer digits is within the bounds")
    return Number(False, low, high, open_low, open_high)


def _multiple(schema: dict, path: tuple[str, ...]) -> Fraction:
    """`multipleOf`, a positive number, exactly (0.1 is 1/10, not the double nearest it)."""
    value = schema["multipleOf"]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise fail(f"'multipleOf' must be a number above 0, got {json.dumps(value)[:60]}", path)
    return Fraction(str(value)) if isinstance(value, float) else Fraction(value)


def _count(schema: dict, keyword: str, path: tuple[str, ...]) -> int:
    """A non-negative integer keyword; when absent, 0 for a minimum and -1 (none) for a maximum."""
    if keyword not in schema:
        return 0 if keyword.startswith("min") else -1
    value = schema[keyword]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise fail(f"{keyword!r} must be a non-negative integer, got {value!r}", path)
    return value


def _bound_keywords(schema: dict, path: tuple[str, ...]) -> list[tuple[str, float | int, bool]]:
    """The bounds present, as (keyword, value, exclusive), with draft-04's boolean exclusive* read."""
    out = []
    for keyword in _BOUNDS:
        if keyword not in schema:
            continue
        value = schema[keyword]
        if isinstance(value, bool) and keyword.startswith("exclusive"):
            continue  # draft-04: a flag on minimum/maximum, read below
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise fail(f"{keyword!r} must be a finite number, got {value!r}", path)
        if keyword in ("minimum", "maximum"):
            flag = schema.get("exclusive" + keyword[0].upper() + keyword[1:])
            out.append((keyword, value, flag is True))
        else:
            out.append(("minimum" if keyword == "exclusiveMinimum" else "maximum", value, True))
    return out


def _integer_bounds(schema: dict, path: tuple[str, ...]) -> tuple[int | None, int | None]:
    low = high = None
    for keyword, value, exclusive in _bound_keywords(schema, path):
        if keyword == "minimum":
            bound = math.floor(value) + 1 if exclusive else math.ceil(value)
            low = bound if low is None else max(low, bound)
        else:
            bound = math.ceil(value) - 1 if exclusive else math.floor(value)
            high = bound if high is None else min(high, bound)
    return low, high


def _decimal_bounds(schema: dict, path: tuple[str, ...]) -> tuple[Fraction | None, bool, Fraction | None, bool]:
    low: Fraction | None = None
    high: Fraction | None = None
    open_low = open_high = False
    for keyword, value, exclusive in _bound_keywords(schema, path):
        bound = Fraction(value)
        if keyword == "minimum" and (low is None or bound > low or (bound == low and exclusive)):
            low, open_low = bound, exclusive
        elif keyword == "maximum" and (high is None or bound < high or (bound == high and exclusive)):
            high, open_high = bound, exclusive
    return low, open_low, high, open_high
