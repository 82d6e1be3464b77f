"""JSON request bodies read safely: parsed with a bound on nesting, numbers a double can hold, and fields
read by type, each error naming the field.

Python's `json` parser recurses once per level of nesting, so a body of 100,000 `[` exhausts the
interpreter's recursion limit inside `json.loads`; it also accepts `NaN`, `Infinity` and `1e400` (which
becomes inf) and integers of any size, none of which a strict JSON peer (JavaScript, OpenAI) can hold.
`parse` measures the nesting of the raw text first, with a linear scan (far too deep: refused unparsed),
and keeps each unrepresentable number as the text it was written with; `check_values` then refuses such
numbers, and any nesting deeper than MAX_DEPTH, naming where they are
(`tools[0].function.parameters.properties.n.minimum`). It walks without recursion, so Python objects
given to the library API (which never went through `parse`) are checked the same way, a list that
holds itself included.

The field readers (`integer`, `number`, `boolean`, `string`, `obj`) take a value as the body holds it:
None (null, or absent) gives the default, as in OpenAI's API; a boolean is never a number.
"""

from __future__ import annotations

import json
import math
import re
import sys

from ..errors import InvalidArgumentError
from .jsonfields import is_int, nesting_depth

MAX_DEPTH = 64  # levels of objects and arrays, the body itself being the first; OpenAI bodies need ~10
# Deeper than this, text is refused before it is parsed, without naming a field; up to it, json.loads
# stays far from the recursion limit (1000 frames) and check_values names where MAX_DEPTH is passed.
PARSE_DEPTH = 4 * MAX_DEPTH
_LARGEST = sys.float_info.max


class FieldError(InvalidArgumentError):
    """A request field with a wrong type or value. `param` is the top-level field, for OpenAI's error
    object ({"error": {"message", "type", "param", "code"}})."""

    def __init__(self, message: str, where: str | None) -> None:
        super().__init__(message)
        self.param = re.split(r"[.\[]", where, maxsplit=1)[0] or None if where else None


class Unrepresentable:
    """A number that parsed but no double holds (NaN, Infinity, 1e400, a 400-digit integer), kept as
    written so that the error can show it."""

    def __init__(self, text: str) -> None:
        self.text = text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"

    def __repr__(self) -> str:
        return self.text


def parse(raw: bytes | str, where: str | None = None) -> object:
    """JSON text, parsed once its nesting is known to be within PARSE_DEPTH; `where` is the field that
    holds it ("messages[1].tool_calls[0].function.arguments"; None: the request body). Numbers no double
    holds come back as `Unrepresentable`: check_values refuses them, and nesting past MAX_DEPTH, naming
    where they are."""
    what = where or "the request body"
    try:  # bytes as json.loads takes them: UTF-8, -16 or -32
        text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise FieldError(f"{what} is not JSON: {e}", where) from None
    depth = nesting_depth(text.encode("utf-8", "surrogatepass"))
    if depth > PARSE_DEPTH:
        raise FieldError(f"{what} is nested {depth} levels deep (the limit is {MAX_DEPTH})", where)
    try:
        return json.loads(text, parse_float=_float, parse_int=_int, parse_constant=Unrepresentable)
    except ValueError as e:
        raise FieldError(f"{what} is not JSON: {e}", where) from None


def _float(text: str) -> float | Unrepresentable:
    value = float(text)
    return value if math.isfinite(value) else Unrepresentable(text)


def _int(text: str) -> int | Unrepresentable:
    # A double holds at most 309 integer digits; longer text would also hit int()'s 4300-digit limit.
    return int(text) if len(text) <= 310 else Unrepresentable(text)


def check_values(value: object, where: str = "") -> None:
    """Refuse nesting deeper than MAX_DEPTH (counting `value` itself as the first level) and numbers no
    double holds, anywhere inside `value`; `where` is its path in the body ("" for the body itself)."""
    todo: list[tuple[dict | list | tuple, str, int]] = []  # containers still to look into
    if isinstance(value, (dict, list, tuple)):
        todo.append((value, where, 1))
    _check_value(value, where, None)
    while todo:
        item, path, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise FieldError(f"{_path(path)} is nested deeper than {MAX_DEPTH} levels (the limit)", path or None)
        for key, child in item.items() if isinstance(item, dict) else enumerate(item):
            if isinstance(child, (dict, list, tuple)):
                todo.append((child, _child(path, key), depth + 1))
            elif child.__class__ is int and -_LARGEST <= child <= _LARGEST:  # the many token ids, quickly
                continue
            elif child.__class__ is not str:
                _check_value(child, path, key)


def _check_value(value: object, parent: str, key: object) -> None:
    if isinstance(value, Unrepresentable) or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and not _representable(value)
    ):
        path = _child(parent, key)
        raise FieldError(f"{_path(path)} must be a finite number (at most ±1.8e308), got {shown(value)}", path or None)


def _child(parent: str, key: object) -> str:
    """The path of parent[key]: `tools[0].function`."""
    if key is None:
        return parent
    if isinstance(key, int):
        return f"{parent}[{key}]"
    text = str(key) if len(str(key)) <= 40 else str(key)[:37] + "..."
    return f"{parent}.{text}" if parent else text


def _path(path: str) -> str:
    if not path:
        return "the request body"
    return path if len(path) <= 100 else path[:97] + "..."


def _representable(number: int | float) -> bool:
    if isinstance(number, float):
        return math.isfinite(number)
    return -_LARGEST <= number <= _LARGEST  # exact for ints: no conversion to float


def shown(value: object) -> str:
    """A value as a short piece of JSON for an error message: `true`, `"abc"`, `3.5`, `a list of 2 items`."""
    if isinstance(value, Unrepresentable):
        return value.text
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 10**24 else f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else {"inf": "Infinity", "-inf": "-Infinity"}.get(repr(value), "NaN")
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 40 else value[:37] + "...", ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' * (len(value) != 1)}"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _range(low: float | None, high: float | None, open_low: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if open_low else '['}{low:g}, {high:g}]"
    if low is not None:
        return f" {'>' if open_low else '>='} {low:g}"
    return ""


def integer(value: object, where: str, default: int | None, low: int | None = None, high: int | None = None):
    """An integer (not a boolean, not 2.0) within [low, high]; None gives `default`."""
    if value is None:
        return default
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        raise FieldError(f"{where} must be an integer{_range(low, high, False)}, got {shown(value)}", where)
    return value


def number(
    value: object,
    where: str,
    default: float,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
) -> float:
    """A finite number (not a boolean) within [low, high] ((low, high] with open_low); None gives `default`."""
    if value is None:
        return default
    x = math.nan  # (anything but a number a double holds)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and _representable(value):
        x = float(value)
    ok = not math.isnan(x)
    if not (ok and (low is None or x > low or (x == low and not open_low)) and (high is None or x <= high)):
        raise FieldError(f"{where} must be a number{_range(low, high, open_low)}, got {shown(value)}", where)
    return x


def boolean(value: object, where: str, default: bool = False) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FieldError(f"{where} must be true or false, got {shown(value)}", where)
    return value


def string(value: object, where: str, default: str | None = None) -> str | None:
    if value is None:
        return default
    if not isinstance(value, str):
        raise FieldError(f"{where} must be a string, got {shown(value)}", where)
    return value


def obj(value: object, where: str) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FieldError(f"{where} must be an object, got {shown(value)}", where)
    return value
