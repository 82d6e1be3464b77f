"""Typed values out of the JSON files of a model folder, checked where they are read.

A JSON file may hold anything: `"3"` or `3.0` where an integer belongs, a list where an object does,
`NaN` (Python's json reads it). Each reader returns the value with the type the caller relies on, or
raises a LoadError naming the file, the field, what it must be and what was found.
"""

from __future__ import annotations

import json
import math
from typing import TypeGuard

from ..errors import LoadError

MISSING = object()  # no default: the field is required


def read_json(path: str) -> object:
    """A JSON file's contents; a LoadError naming the file if it is missing, unreadable or not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise LoadError(f"{path}: not found") from None
    except OSError as e:
        raise LoadError(f"cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoadError(f"{path}: not valid JSON ({e})") from None


def _found(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def fail(source: str, key: str, expected: str, value: object) -> LoadError:
    return LoadError(f"{source}: {key!r} must be {expected}, found {_found(value)}")


def _get(raw: dict, key: str, default: object, source: str, expected: str) -> object:
    if key in raw and raw[key] is not None:
        return raw[key]
    if default is MISSING:
        raise fail(source, key, expected, raw.get(key))
    return default


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def obj(value: object, source: str, what: str = "the file") -> dict:
    """A whole document (or a nested one) that must be a JSON object."""
    if not isinstance(value, dict):
        raise LoadError(f"{source}: {what} must be a JSON object, found {type(value).__name__}")
    return value


def integer(
    raw: dict, key: str, source: str, default: object = MISSING, minimum: int = 1, maximum: int = 2**31 - 1
) -> int:
    """An integer in [minimum, maximum] (by default a size that fits an int32)."""
    expected = f"an integer in [{minimum}, {maximum}]"
    value = _get(raw, key, default, source, expected)
    if not is_int(value) or not minimum <= value <= maximum:
        raise fail(source, key, expected, value)
    return value


def number(raw: dict, key: str, source: str, default: object = MISSING, below: float = math.inf) -> float:
    """A finite number > 0 (and < `below`)."""
    expected = "a finite number > 0" if below == math.inf else f"a number in (0, {below:g})"
    value = _get(raw, key, default, source, expected)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < below:
        raise fail(source, key, expected, value)
    return float(value)


def real(raw: dict, key: str, source: str, default: object = MISSING) -> float:
    """Any finite number."""
    value = _get(raw, key, default, source, "a finite number")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise fail(source, key, "a finite number", value)
    return float(value)


def boolean(raw: dict, key: str, source: str, default: bool = False) -> bool:
    value = _get(raw, key, default, source, "true or false")
    if not isinstance(value, bool):
        raise fail(source, key, "true or false", value)
    return value


def string(raw: dict, key: str, source: str, default: object = MISSING) -> str:
    value = _get(raw, key, default, source, "a string")
    if not isinstance(value, str):
        raise fail(source, key, "a string", value)
    return value


def token_ids(raw: dict, key: str, source: str) -> tuple[int, ...]:
    """A token id, a list of them, or nothing (null or absent)."""
    value = raw.get(key)
    if value is None:
        return ()
    ids = [value] if not isinstance(value, list) else value
    if not all(is_int(i) and i >= 0 for i in ids):
        raise fail(source, key, "a token id (an integer >= 0) or a list of them", value)
    return tuple(ids)


def strings(raw: dict, key: str, source: str) -> list[str]:
    """A list of strings, or nothing (null or absent)."""
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(source, key, "a list of strings", value)
    return value
