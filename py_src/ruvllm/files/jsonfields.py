"""Typed values out of the JSON files of a model folder, checked where they are read.

A JSON file may hold anything: `"3"` or `3.0` where an integer belongs, a list where an object does,
`NaN` (Python's json reads it). Each reader returns the value with the type the caller relies on, or
raises a LoadError naming the file, the field, what it must be and what was found.

Every JSON document ruvllm reads from a file or a download (configs, tokenizers, adapter configs,
safetensors headers, the hub's records) goes through `parse_json`: Python's parser recurses once per
level of nesting, so 100,000 `[` are a RecursionError on CPython and a fatal stack overflow in Pyodide.
`parse_json` measures the nesting first, without recursion, and refuses text nested deeper than
MAX_FILE_DEPTH, or not UTF-8, or not JSON, with one line naming the file.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import TypeGuard

import numpy as np

from ..errors import LoadError

MISSING = object()  # no default: the field is required
# Levels of objects and arrays a file may nest: tokenizer.json and configs need under 10; far below the
# depth at which the parser's recursion fails (CPython: ~1,000; Pyodide's stack: less).
MAX_FILE_DEPTH = 100
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes included
_OTHER_BYTES = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(raw: bytes) -> int:
    """The deepest level of objects and arrays in JSON text (0 for a bare number or string), found
    without parsing: strings are cut out first, so brackets inside them do not count. Text that is not
    JSON gets a depth at least as deep as any a parser would reach before finding the fault."""
    brackets = _STRING.sub(b"", raw).translate(None, _OTHER_BYTES)  # only [ ] { } are left
    codes = np.frombuffer(brackets, dtype=np.uint8)  # (n,)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)  # (n,)
    return int(np.cumsum(steps).max(initial=0))


def parse_json(data: bytes | str, source: str, object_pairs_hook: Callable | None = None) -> object:
    """JSON text read from `source` (a file, a download, "X: the header"), parsed once its nesting is
    known to be within MAX_FILE_DEPTH; a one-line LoadError, "SOURCE is not valid JSON (why)", if it is
    not UTF-8, too deep or not JSON.
    (`object_pairs_hook`: json.loads's, e.g. to refuse duplicate keys; its ValueErrors are reported too.)"""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    depth = nesting_depth(raw)
    if depth > MAX_FILE_DEPTH:
        raise LoadError(f"{source} is not valid JSON (nested {depth:,} levels deep; at most {MAX_FILE_DEPTH})")
    text = data if isinstance(data, str) else utf8_text(raw, source)
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except ValueError as e:  # json.JSONDecodeError, or the hook's refusal
        raise LoadError(f"{source} is not valid JSON ({e})") from None


def utf8_text(data: bytes, source: str) -> str:
    """`data` decoded as UTF-8; a LoadError naming `source` and the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LoadError(f"{source} is not valid JSON (not UTF-8: byte {e.object[e.start]:#04x} at {e.start})") from None


def read_json(path: str) -> object:
    """A JSON file's contents; a LoadError naming the file if it is missing, unreadable or not JSON."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise LoadError(f"{path}: not found") from None
    except OSError as e:
        raise LoadError(f"cannot read {path}: {e.strerror or e}") from None
    return parse_json(data, path)


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


def token_ids(raw: dict, key: str, source: str, vocab_size: int | None = None) -> tuple[int, ...]:
    """A token id, a list of them, or nothing (null or absent); each in [0, vocab_size) when given."""
    value = raw.get(key)
    if value is None:
        return ()
    ids = [value] if not isinstance(value, list) else value
    if not all(is_int(i) and i >= 0 for i in ids):
        raise fail(source, key, "a token id (an integer >= 0) or a list of them", value)
    if vocab_size is not None and any(i >= vocab_size for i in ids):
        raise fail(source, key, f"a token id of the vocabulary, in [0, {vocab_size})", value)
    return tuple(ids)


def strings(raw: dict, key: str, source: str) -> list[str]:
    """A list of strings, or nothing (null or absent)."""
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(source, key, "a list of strings", value)
    return value
