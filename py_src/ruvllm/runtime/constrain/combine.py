"""`allOf` (and `$ref` or `anyOf` beside other keywords) as one schema: the parts are merged keyword by
keyword into a synthetic schema whose every sub-schema is a `$ref` to where it lives (so that references
inside it keep their base), or an `allOf` of such references. What cannot be merged exactly is refused.

JSON values are compared as JSON (`json_equal`): 1 and 1.0 are the same number, true is not 1.
"""

from __future__ import annotations

from itertools import product

from .resolve import Location, pointer_uri

MAX_COMBINATIONS = 64  # options of a merged anyOf/oneOf (the product of several lists)

_LOWER = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")  # the largest wins
_UPPER = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")  # the smallest wins
_SCHEMA_VALUED = ("items", "additionalProperties", "propertyNames", "contains", "not", "unevaluatedProperties")


class MergeError(ValueError):
    """A keyword found in several parts whose values cannot be merged (the message names it)."""


class UnsatisfiableError(MergeError):
    """The parts allow no value in common (the message says why)."""


def json_equal(a: object, b: object) -> bool:
    """Equality of JSON values: numbers by value (1 == 1.0), booleans apart from numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def reference(schema: object, location: Location | None) -> object:
    """A sub-schema as it may sit in a synthetic schema: a boolean, or a `$ref` to its location."""
    if isinstance(schema, bool) or location is None:
        return schema
    return {"$ref": pointer_uri(location)}


def _child(location: Location | None, *keys: str) -> Location | None:
    return None if location is None else (location[0], (*location[1], *keys))


def _all_of(schemas: list) -> object:
    schemas = [s for s in schemas if s is not True]
    if not schemas:
        return True
    return schemas[0] if len(schemas) == 1 else {"allOf": schemas}


def merge(parts: list[tuple[dict, Location | None]]) -> dict:
    """One schema valid exactly where all the parts are (each a dict without `$ref`/`allOf`)."""
    out: dict = {}
    types: set[str] | None = None
    enum: list | None = None
    names: dict[str, list] = {}  # property -> the schemas it must meet
    required: list[str] = []
    choices: list[tuple[str, list]] = []  # ("anyOf" or "oneOf", its options)
    collected: dict[str, list] = {}  # schema-valued keywords -> the schemas to meet
    for schema, location in parts:
        for key, value in schema.items():
            if key == "type":
                given = set(value) if isinstance(value, list) else {value}
                if "number" in given:
                    given.add("integer")
                types = given if types is None else types & given
                if not types:
                    raise UnsatisfiableError("the types of 'allOf' have nothing in common")
            elif key in ("enum", "const"):
                values = [value] if key == "const" else value
                if not isinstance(values, list):
                    raise MergeError(f"'{key}' must be a list")
                enum = values if enum is None else [v for v in enum if any(json_equal(v, w) for w in values)]
                if not enum:
                    raise UnsatisfiableError("the values of 'enum'/'const' in 'allOf' have none in common")
            elif key in _LOWER or key in _UPPER:
                if key in out and not isinstance(value, bool) and not isinstance(out[key], bool):
                    out[key] = max(out[key], value) if key in _LOWER else min(out[key], value)
                elif key in out and not json_equal(out[key], value):
                    raise MergeError(f"'allOf' combining different {key!r} values is not supported")
                else:
                    out[key] = value
            elif key == "required":
                required.extend(r for r in value if r not in required)
            elif key == "properties":
                for name in value:
                    names.setdefault(name, [])
            elif key in ("anyOf", "oneOf"):
                options = [reference(s, _child(location, key, str(i))) for i, s in enumerate(value)]
                choices.append((key, options))
            elif key in _SCHEMA_VALUED and not (key == "items" and isinstance(value, list)):
                collected.setdefault(key, []).append(reference(value, _child(location, key)))
            elif key in ("patternProperties", "dependentSchemas", "prefixItems", "items"):
                if key in out:
                    raise MergeError(f"'allOf' with {key!r} in more than one schema is not supported")
                if isinstance(value, dict):
                    out[key] = {n: reference(s, _child(location, key, n)) for n, s in value.items()}
                else:
                    out[key] = [reference(s, _child(location, key, str(i))) for i, s in enumerate(value)]
            elif key in out and not json_equal(out[key], value):
                raise MergeError(f"'allOf' combining different {key!r} values is not supported")
            else:
                out[key] = value
    arrays = sum(any(k in schema for k in ("items", "prefixItems")) for schema, _ in parts)
    if arrays > 1 and ("prefixItems" in out or isinstance(out.get("items"), list)):
        raise MergeError("'allOf' with 'prefixItems' (or 'items' as a list) beside other 'items' is not supported")
    for name in names:  # each property meets every part: its schema there, or that part's other properties
        for schema, location in parts:
            listed = schema.get("properties", {})
            if name in listed:
                names[name].append(reference(listed[name], _child(location, "properties", name)))
            elif "additionalProperties" in schema:
                names[name].append(reference(schema["additionalProperties"], _child(location, "additionalProperties")))
            if "patternProperties" in schema:
                raise MergeError("'allOf' with 'patternProperties' beside 'properties' is not supported")
    if types is not None:
        out["type"] = sorted(types - {"integer"} if "number" in types else types)
    if enum is not None:
        out["enum"] = enum
    if names:
        out["properties"] = {name: _all_of(schemas) for name, schemas in names.items()}
    if required:
        out["required"] = required
    for key, schemas in collected.items():
        out[key] = _all_of(schemas)
    if len(choices) == 1:  # oneOf stays oneOf: exactly one option must match
        out[choices[0][0]] = choices[0][1]
    elif choices:
        if any(kind == "oneOf" for kind, _ in choices):
            raise MergeError("'allOf' of several 'anyOf'/'oneOf' with a 'oneOf' among them is not supported")
        combinations = 1
        for _, options in choices:
            combinations *= len(options)
        if combinations > MAX_COMBINATIONS:
            raise MergeError(
                f"'allOf' of several 'anyOf'/'oneOf' makes {combinations} options (at most {MAX_COMBINATIONS})"
            )
        out["anyOf"] = [_all_of(list(options)) for options in product(*(options for _, options in choices))]
    return out
