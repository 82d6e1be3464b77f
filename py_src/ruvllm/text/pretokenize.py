"""The normalizers and pre-tokenizers of a tokenizer.json, in plain Python (for `pure_tokenizer.py`).

Each one behaves as its namesake in Hugging Face `tokenizers` (tokenizers/src/pre_tokenizers, normalizers):
a pre-tokenizer maps a list of pieces to a finer list of pieces, and BPE then runs on each piece alone.

The split patterns of our families (GPT-2's, Llama 3's, Qwen2's) use Unicode classes (`\\p{L}`, `\\p{N}`)
that the standard library's `re` lacks. They run on a *stand-in* of the text instead: each character is
replaced by one that `re` classifies as Oniguruma (the engine `tokenizers` uses) classifies the original,
so the matches have the same spans:

- a letter (category L*) stands for itself: `re` counts every letter in `[^\\W\\d_]`, and case-insensitive
  groups such as `(?i:'s)` still see the real letter;
- a number (category N*: `½`, `²`, `٣`, `Ⅻ`) becomes `0`, so `\\p{N}` is `0` and `[\\p{L}\\p{N}]` is `\\w`;
- whitespace (the Unicode White_Space set, Oniguruma's `\\s`) becomes one of ` `, `\\t`, `\\r`, `\\n`;
- anything else stands for itself, except the few that `re` would count as `\\w` or `\\s` although
  Oniguruma does not (`_`, `\\x1c`-`\\x1f`), which become `\\x00`.

A pattern that needs more than that (another `\\p{..}` class, `\\d`, `\\w`) runs on the real text with the
`regex` module if it is installed (Pyodide offers it), and is refused with a LoadError otherwise.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import LoadError, install_advice
from .detokenizer import byte_level_alphabet

_T = TypeVar("_T")

# GPT-2's split, which the ByteLevel pre-tokenizer applies when `use_regex` is set (byte_level.rs).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_SPACES = "\t\n\v\f\r\x85"  # White_Space controls; the rest of White_Space is categories Zs, Zl, Zp
_RE_WORD_OR_SPACE = re.compile(r"[\w\s]")
_QUANTIFIER = re.compile(r"\{[0-9]*(,[0-9]*)?\}")
_BYTE_CHARS = "".join(sorted(byte_level_alphabet(), key=byte_level_alphabet().__getitem__))  # byte -> char

Piece = tuple[str, bool]  # (text, whether it starts the original text: Metaspace's "first" scheme asks)


def _stand_in(code: int) -> str:
    char = chr(code)
    category = unicodedata.category(char)
    if category[0] == "L":
        return char
    if category[0] == "N":
        return "0"
    if char in "\t\n\r ":
        return char
    if char in _SPACES or category in ("Zs", "Zl", "Zp"):
        return "\t"
    return "\x00" if _RE_WORD_OR_SPACE.match(char) else char


class _StandIns(dict[int, str]):
    """code point -> its stand-in, filled as characters are first seen (`str.translate` asks per character)."""

    def __missing__(self, code: int) -> str:
        if len(self) >= 1 << 16:  # (a text of every character cannot make it grow without bound)
            self.clear()
        self[code] = value = _stand_in(code)
        return value


_STAND_INS = _StandIns()


def stand_in(text: str) -> str:
    """The text with each character replaced by its stand-in (same length, same spans)."""
    return text.translate(_STAND_INS)


def translate_pattern(pattern: str) -> str | None:
    """The `re` pattern that matches on the stand-in what `pattern` (Oniguruma syntax) matches on the text,
    or None when the stand-in cannot express it."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class, class_props = False, set()
    while i < n:
        char = pattern[i]
        if char == "\\":
            if pattern.startswith("\\p{", i):
                end = pattern.find("}", i)
                name = pattern[i + 3 : end] if end > 0 else ""
                if name not in ("L", "N"):
                    return None
                if in_class:
                    class_props.add(name)
                else:
                    out.append("[^\\W\\d_]" if name == "L" else "0")
                i = end + 1
                continue
            escape = pattern[i : i + 2]
            if len(escape) < 2 or (escape[1].isalnum() and escape[1] not in "sSrnt"):
                return None  # \d, \w, \x.., \u.., \b, backreferences: their meaning differs or needs care
            out.append(escape)
            i += 2
            continue
        if in_class and char == "]":
            if class_props == {"L", "N"}:
                out.append("\\w")
            elif class_props == {"N"}:
                out.append("0")
            elif class_props:
                return None  # letters alone inside a class
            out.append("]")
            in_class = False
        elif not in_class and (quantifier := _QUANTIFIER.match(pattern, i)):
            out.append(quantifier.group())  # {m,n}: its digits are not text
            i = quantifier.end()
            continue
        elif not in_class and char == "[":
            start = i + 2 if pattern.startswith("[^", i) else i + 1
            if start >= n or pattern[start] in "][":
                return None  # a leading `]` or a nested class
            out.append(pattern[i:start])
            in_class, class_props = True, set()
            i = start
            continue
        else:
            if in_class and char == "[":
                return None
            if _stand_in(ord(char)) != char:
                return None  # a literal digit or space other than those kept
            out.append(char)
        i += 1
    return None if in_class else "".join(out)


class Matcher:
    """A split pattern of tokenizer.json, compiled: `spans(text)` gives the (start, end) of each match."""

    def __init__(self, pattern: str, regex: bool, where: str) -> None:
        self.on_stand_in = False
        if not regex:
            self.compiled: Any = re.compile(re.escape(pattern))
            return
        translated = translate_pattern(pattern)
        if translated is not None:
            self.compiled, self.on_stand_in = re.compile(translated), True
            return
        try:
            import regex as regex_module  # type: ignore[import-untyped]
        except ImportError:
            raise LoadError(
                f"{where}: the split pattern {pattern!r} needs the `regex` package "
                f"({install_advice('regex', 'regex')}) or the `tokenizers` package"
            ) from None
        try:
            self.compiled = regex_module.compile(pattern)
        except regex_module.error as e:
            raise LoadError(f"{where}: the split pattern {pattern!r} is not a valid regular expression ({e})") from None

    def spans(self, text: str) -> list[tuple[int, int]]:
        subject = stand_in(text) if self.on_stand_in else text
        return [m.span() for m in self.compiled.finditer(subject) if m.end() > m.start()]


def split(text: str, spans: list[tuple[int, int]], behavior: str, invert: bool = False) -> list[str]:
    """Cut `text` around the matches, as `NormalizedString::split` does for each SplitDelimiterBehavior."""
    segments: list[tuple[int, int, bool]] = []  # every part of the text: (start, end, is_match)
    at = 0
    for start, end in spans:
        if start > at:
            segments.append((at, start, invert))
        segments.append((start, end, not invert))
        at = end
    if at < len(text):
        segments.append((at, len(text), invert))

    if behavior == "Isolated":
        kept = [(s, e) for s, e, _ in segments]
    elif behavior == "Removed":
        kept = [(s, e) for s, e, is_match in segments if not is_match]
    elif behavior in ("Contiguous", "MergedWithPrevious"):
        kept, previous = [], False
        for s, e, is_match in segments:
            joins = is_match == previous if behavior == "Contiguous" else is_match and not previous
            if joins and kept:
                kept[-1] = (kept[-1][0], e)
            else:
                kept.append((s, e))
            previous = is_match
    elif behavior == "MergedWithNext":
        kept, previous = [], False
        for s, e, is_match in reversed(segments):
            if is_match and not previous and kept:
                kept[-1] = (s, kept[-1][1])
            else:
                kept.append((s, e))
            previous = is_match
        kept.reverse()
    else:
        raise AssertionError(behavior)  # (checked when the pre-tokenizer is built)
    return [text[s:e] for s, e in kept if e > s]


# --- pre-tokenizers: each maps a list of pieces to a finer one -----------------------------------------

PreTokenizer = Callable[[list[Piece]], list[Piece]]
_BEHAVIORS = ("Isolated", "Removed", "Contiguous", "MergedWithPrevious", "MergedWithNext")


def _per_piece(cut: Callable[[str, bool], list[str]]) -> PreTokenizer:
    """A pre-tokenizer from a function cutting one piece; only the first part of a first piece stays first."""

    def run(pieces: list[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for text, first in pieces:
            parts = cut(text, first)
            out += [(part, first and k == 0) for k, part in enumerate(parts)]
        return out

    return run


def _byte_level(spec: dict, where: str) -> PreTokenizer:
    prefix = bool(spec.get("add_prefix_space", True))
    matcher = Matcher(GPT2_PATTERN, True, where) if spec.get("use_regex", True) else None
    to_chars = str.maketrans(dict(zip(map(chr, range(256)), _BYTE_CHARS, strict=True)))

    def cut(text: str, first: bool) -> list[str]:
        if prefix and not text.startswith(" "):
            text = " " + text
        parts = split(text, matcher.spans(text), "Isolated") if matcher else [text] if text else []
        # Each byte of UTF-8 becomes its printable stand-in (GPT-2's alphabet).
        return [part.encode("utf-8").decode("latin-1").translate(to_chars) for part in parts]

    return _per_piece(cut)


def _split(spec: dict, where: str) -> PreTokenizer:
    pattern, behavior = spec.get("pattern"), spec.get("behavior")
    if behavior not in _BEHAVIORS:
        raise LoadError(f"{where}.behavior must be one of {', '.join(_BEHAVIORS)}, found {behavior!r}")
    if isinstance(pattern, dict) and isinstance(pattern.get("String"), str):
        matcher = Matcher(pattern["String"], False, where)
    elif isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
        matcher = Matcher(pattern["Regex"], True, where)
    else:
        raise LoadError(f'{where}.pattern must be {{"String": ...}} or {{"Regex": ...}}, found {pattern!r}')
    invert = bool(spec.get("invert", False))
    return _per_piece(lambda text, first: split(text, matcher.spans(text), behavior, invert))


def _digits(spec: dict, where: str) -> PreTokenizer:
    # char::is_numeric: the N* categories, one by one or in runs.
    matcher = Matcher(r"\p{N}" if spec.get("individual_digits", False) else r"\p{N}+", True, where)
    return _per_piece(lambda text, first: split(text, matcher.spans(text), "Isolated"))


def _metaspace(spec: dict, where: str) -> PreTokenizer:
    replacement = spec.get("replacement", "\u2581")
    scheme = spec.get("prepend_scheme")
    if scheme is None:  # files older than prepend_scheme
        scheme = "always" if spec.get("add_prefix_space", True) else "never"
    if scheme not in ("always", "first", "never") or not isinstance(replacement, str) or len(replacement) != 1:
        raise LoadError(f"{where}: expected a one-character replacement and prepend_scheme always/first/never")
    splits = bool(spec.get("split", True))
    matcher = Matcher(replacement, False, where)

    def cut(text: str, first: bool) -> list[str]:
        text = text.replace(" ", replacement)
        if (scheme == "always" or (scheme == "first" and first)) and not text.startswith(replacement):
            text = replacement + text
        return split(text, matcher.spans(text), "MergedWithNext") if splits else [text] if text else []

    return _per_piece(cut)


def chain(steps: list[Callable[[_T], _T]]) -> Callable[[_T], _T]:
    """The steps applied one after another (a Sequence of pre-tokenizers or post-processors)."""

    def run(value: _T) -> _T:
        for step in steps:
            value = step(value)
        return value

    return run


def _sequence(spec: dict, where: str) -> PreTokenizer:
    return chain(
        [pre_tokenizer(s, f"{where}.pretokenizers[{k}]") for k, s in enumerate(spec.get("pretokenizers") or [])]
    )


_PRE_TOKENIZERS: dict[str, Callable[[dict, str], PreTokenizer]] = {
    "ByteLevel": _byte_level,
    "Split": _split,
    "Digits": _digits,
    "Metaspace": _metaspace,
    "Sequence": _sequence,
}


def pre_tokenizer(spec: object, where: str = "tokenizer.json: pre_tokenizer") -> PreTokenizer:
    """The pre-tokenizer a tokenizer.json `pre_tokenizer` entry describes (None: the pieces as they are)."""
    if spec is None:
        return lambda pieces: [p for p in pieces if p[0]]
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in _PRE_TOKENIZERS:
        raise LoadError(f"{where}: type {kind!r} is not supported without `tokenizers` ({', '.join(_PRE_TOKENIZERS)})")
    assert isinstance(spec, dict)
    return _PRE_TOKENIZERS[kind](spec, where)


# --- normalizers: text -> text --------------------------------------------------------------------------

Normalizer = Callable[[str], str]


def normalizer(spec: object, where: str = "tokenizer.json: normalizer") -> Normalizer | None:
    """The normalizer a tokenizer.json `normalizer` entry describes (None for none)."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise LoadError(f"{where} must be an object with a type, found {spec!r}")
    kind = spec.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        form = kind
        return lambda text: unicodedata.normalize(form, text)
    if kind == "Lowercase":
        return str.lower
    if kind == "Prepend" and isinstance(spec.get("prepend"), str):
        prepend = spec["prepend"]
        return lambda text: prepend + text if text else text
    if kind == "Strip":
        left, right = spec.get("strip_left", True), spec.get("strip_right", True)

        def strip(text: str) -> str:
            text = text.lstrip() if left else text
            return text.rstrip() if right else text

        return strip
    if kind == "Replace" and isinstance(spec.get("content"), str):
        pattern, content = spec.get("pattern"), spec["content"]
        if isinstance(pattern, dict) and isinstance(pattern.get("String"), str):
            old = pattern["String"]
            return lambda text: text.replace(old, content)
        if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
            matcher = Matcher(pattern["Regex"], True, where)

            def replace(text: str) -> str:
                spans = matcher.spans(text)
                return "".join(content if is_match else part for part, is_match in _parts(text, spans))

            return replace
    if kind == "Sequence":
        steps = [normalizer(s, f"{where}.normalizers[{k}]") for k, s in enumerate(spec.get("normalizers") or [])]

        def run(text: str) -> str:
            for step in steps:
                if step is not None:
                    text = step(text)
            return text

        return run
    raise LoadError(
        f"{where}: {kind!r} is not supported without `tokenizers` "
        "(NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Strip, Replace, Sequence)"
    )


def _parts(text: str, spans: list[tuple[int, int]]) -> list[tuple[str, bool]]:
    parts, at = [], 0
    for start, end in spans:
        parts += [(text[at:start], False), (text[start:end], True)]
        at = end
    return [*parts, (text[at:], False)]
