"""Closings: a short text that completes the document from a parser state, its length in tokens of a
vocabulary, and `Budgeted`, a constraint that keeps such a closing within the tokens left (max_tokens),
so that constrained output ends as a whole document whenever the budget allows one at all.

A closing is made frame by frame, innermost first: the rest of a key, string, number or literal, then
the required properties or items still due (each written as its node's shortest value), then the
closing brackets and the grammar's suffix. It is short, not always the shortest (a pattern's string is
the shortest; a bounded number's digits are found greedily), and it is checked by the parser itself
before it is used: a closing the parser does not accept is never offered.
"""

from __future__ import annotations

import weakref
from collections import deque

import numpy as np

from .grammar import Grammar
from .matcher import Matcher
from .nodes import Array, Literal, Number, Object, String, Union
from .parser import (
    AFTER_COMMA,
    AFTER_VALUE,
    ARRAY,
    ARRAY_ITEMS,
    COLON,
    DECLARED,
    FIRST,
    KEY,
    KIND,
    LITERAL,
    LITERAL_TEXT,
    NODE,
    NUMBER,
    OBJECT_PROGRESS,
    OPEN,
    PATTERN,
    PHASE,
    S_CONTENT,
    S_ESCAPE,
    S_HEX,
    S_OPEN,
    S_UTF8,
    STRING,
    STRING_CHARS,
    STRING_PARTIAL,
    TEXT,
    TEXT_BYTES,
    TEXT_OFFSET,
    VALUE,
    VALUE_NEXT,
    Rules,
    can_end,
    closable_any,
    due_properties,
    feasible,
    is_complete,
    key_text,
    plus_extra,
    read_byte,
    step_number,
    step_pattern,
)
from .vocabulary import Vocabulary

MAX_SEARCH = 2000  # frames a pattern's or a number's closing search visits (then: no closing known)
_PATTERN_BYTES = bytes(range(0x20, 0x7F)) + b"\xc3\xa9"  # ASCII, and one non-ASCII character (e-acute)
_NUMBER_BYTES = b"0123456789-."


class _Closer:
    """The closings of one grammar's configurations (cached: configurations repeat across requests)."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.shortest = _shortest_values(rules)
        self.cache: dict[frozenset, bytes | None] = {}
        keys = [len(p.key) for spec in rules.nodes if isinstance(spec, Object) for p in spec.properties]
        values = [len(text) for text in self.shortest if text is not None]
        # bytes one byte read may add to a closing (it may start a value, or pick a longer property): only
        # closer to the end than (longest allowed token) x growth are tokens checked one by one
        self.growth = max(values, default=0) + max(keys, default=0) + 2

    def closing(self, configs: frozenset) -> bytes | None:
        """A short text after which one of `configs` is a whole document (None: none found)."""
        if configs in self.cache:
            return self.cache[configs]
        best = None
        for config in configs:
            text = self._config(config)
            if text is not None and (best is None or len(text) < len(best)) and self._accepts(config, text):
                best = text
        self.cache[configs] = best
        return best

    def _accepts(self, config: tuple, text: bytes) -> bool:
        configs = {config}
        for b in text:
            configs = {c for config in configs for c in read_byte(self.rules, config, b)}
            if not configs:
                return False
        return any(is_complete(self.rules, c) for c in configs)

    def _config(self, config: tuple) -> bytes | None:
        parts = []
        for frame in reversed(config):
            part = self._frame(frame)
            if part is None:
                return None
            parts.append(part)
        return b"".join(parts)

    def _frame(self, frame: tuple) -> bytes | None:
        kind, nodes, shortest = frame[KIND], self.rules.nodes, self.shortest
        if kind == TEXT:
            return frame[TEXT_BYTES][frame[TEXT_OFFSET] :]
        if kind == VALUE:
            return shortest[frame[NODE]]
        if kind == LITERAL:
            text = frame[LITERAL_TEXT]
            rest = [v[len(text) :] for v in nodes[frame[NODE]].values if v.startswith(text)]
            return min(rest, key=len) if rest else None
        if kind == NUMBER:
            return b"" if can_end(self.rules, frame) else _number_closing(self.rules, frame)
        if kind == PATTERN:
            return _pattern_closing(self.rules, frame)
        if kind == STRING:
            return _string_closing(nodes[frame[NODE]], frame)
        if kind == ARRAY:
            return self._array(frame)
        return self._object(frame)

    def _items(self, spec: Array, start: int, stop: int) -> bytes | None:
        texts = []
        for k in range(start, stop):
            node = spec.prefix[k] if k < len(spec.prefix) else spec.item
            # item None: no item past the prefix is allowed (max_items is len(prefix)), so none is due here
            assert node is not None
            text = self.shortest[node]
            if text is None:
                return None
            texts.append(text)
        return b",".join(texts)

    def _array(self, frame: tuple) -> bytes | None:
        n, phase, count = frame[NODE], frame[PHASE], frame[ARRAY_ITEMS]
        spec = self.rules.nodes[n]
        if phase == OPEN:
            return self.shortest[n]
        if phase == AFTER_COMMA:
            items = self._items(spec, count, max(count + 1, spec.min_items))
            return None if items is None else items + b"]"
        items = self._items(spec, count, spec.min_items)
        if items is None:
            return None
        return (b"," if items and phase == AFTER_VALUE else b"") + items + b"]"

    def _properties(self, spec: Object, start: int) -> bytes | None:
        """The required properties from `start` on, then `}` (any order: see _rest)."""
        if spec.any_order:
            return self._rest(spec, start, True)
        texts = []
        for p in spec.properties[start:]:
            if p.required:
                value = self.shortest[p.value]
                if value is None:
                    return None
                texts.append(p.key + b":" + value)
        return b",".join(texts) + b"}"

    def _rest(self, spec: Object, i: int, first: bool) -> bytes | None:
        return _rest(spec, self.shortest, i, first)

    def _closable(self, spec: Object, i: int) -> bool:
        if spec.any_order:
            return closable_any(spec, i)
        return spec.free_value is not None or spec.closable[i]

    def _after(self, spec: Object, i: int) -> bytes | None:
        """After a property's value: `}` or the required ones still due."""
        if spec.any_order:
            return self._rest(spec, i, False)
        if self._closable(spec, i):
            return b"}"
        rest = self._properties(spec, i)
        return None if rest is None else b"," + rest

    def _candidates(self, spec: Object, i: int) -> list[tuple[int, int]]:
        """(index, the object frame's i after it) of the declared properties that may come next."""
        if spec.any_order:
            unwritten = [j for j in range(len(spec.properties)) if not i >> j & 1]
            return [(j, i | 1 << j) for j in unwritten if feasible(spec, i | 1 << j)]
        if i >= len(spec.properties):
            return []
        return [(j, j + 1) for j in range(i, spec.last_candidate[i] + 1)]

    def _object(self, frame: tuple) -> bytes | None:
        n, phase, i = frame[NODE], frame[PHASE], frame[OBJECT_PROGRESS]
        spec, shortest = self.rules.nodes[n], self.shortest
        free = spec.free_value is not None
        after: bytes | None  # what follows a property's value (None: no closing known)
        if phase == OPEN:
            return shortest[n]
        if phase == FIRST:
            return b"}" if free else self._properties(spec, i)
        if phase == AFTER_VALUE:
            return self._after(spec, i)
        if phase in (COLON, VALUE_NEXT):
            colon = b":" if phase == COLON else b""
            if free:
                value, after = shortest[spec.free_value], b"}"
            elif spec.any_order:
                written, j = i
                value = shortest[spec.extra_value if j < 0 else spec.properties[j].value]
                after = self._after(spec, plus_extra(spec, written) if j < 0 else written | 1 << j)
            elif i < 0:
                value, after = shortest[spec.extra_value], self._after(spec, -1 - i)
            else:
                value, after = shortest[spec.properties[i].value], self._after(spec, i + 1)
            return None if value is None or after is None else colon + value + after
        options = []
        if phase == KEY:
            key = key_text(self.rules, frame)
            for j, following in self._candidates(spec, i):
                p = spec.properties[j]
                value, after = shortest[p.value], self._after(spec, following)
                if p.key.startswith(key) and value is not None and after is not None:
                    options.append(p.key[len(key) :] + b":" + value + after)
        elif phase == AFTER_COMMA:
            if free:
                key, value = shortest[spec.free_key], shortest[spec.free_value]
                if key is not None and value is not None:
                    options.append(key + b":" + value + b"}")
            else:
                for j, following in self._candidates(spec, i):
                    p = spec.properties[j]
                    value, after = shortest[p.value], self._after(spec, following)
                    if value is not None and after is not None:
                        options.append(p.key + b":" + value + after)
                extra = _entry(spec, shortest, i, -1) if spec.any_order and spec.extra_value is not None else None
                if extra is not None and feasible(spec, extra[1]):
                    after = self._after(spec, extra[1])
                    if after is not None:
                        options.append(extra[0] + after)
        return min(options, key=len) if options else None


def _string_closing(spec: String, frame: tuple) -> bytes:
    phase, count, partial = frame[PHASE], frame[STRING_CHARS], frame[STRING_PARTIAL]
    if phase == S_OPEN:
        return b'"' + b"a" * spec.min_length + b'"'
    head = b""
    if phase == S_ESCAPE:
        head = b"n"
    elif phase == S_HEX:
        head = b"000" if partial == -1 else b"0" * (4 - partial)
    elif phase == S_UTF8:
        due, low, _ = partial
        head = bytes([low] + [0x80] * (due - 1))
    return head + b"a" * max(0, spec.min_length - count) + b'"'


def _pattern_closing(rules: Rules, frame: tuple) -> bytes | None:
    """The shortest text that ends a patterned string (breadth first over its frames)."""
    seen, todo = {frame}, deque([(frame, b"")])
    while todo and len(seen) < MAX_SEARCH:
        current, text = todo.popleft()
        for b in _PATTERN_BYTES:
            for following in step_pattern(rules, current, b):
                if following == ():
                    return text + bytes((b,))
                (after,) = following  # the string goes on: its one frame
                if after not in seen:
                    seen.add(after)
                    todo.append((after, text + bytes((b,))))
    return None


def _number_closing(rules: Rules, frame: tuple) -> bytes | None:
    """Digits that end a number: at each step a byte after which it can end if there is one, else the
    first byte that keeps it going (depth first, within MAX_SEARCH frames)."""
    visited = 0

    def search(current: tuple, depth: int) -> bytes | None:
        nonlocal visited
        # (byte, the number's one frame after it): a number never ends on a byte of its own
        followings = [(b, after) for b in _NUMBER_BYTES for (after,) in step_number(rules, current, b)]
        for b, following in followings:
            if can_end(rules, following):
                return bytes((b,))
        for b, following in followings:
            visited += 1
            if visited > MAX_SEARCH or depth > 40:
                return None
            rest = search(following, depth + 1)
            if rest is not None:
                return bytes((b,)) + rest
        return None

    return search(frame, 0)


def _shortest_values(rules: Rules) -> list[bytes | None]:
    """Each node's shortest value as JSON text (None: none is known), by rounds until nothing shortens."""
    nodes = rules.nodes
    shortest: list[bytes | None] = [None] * len(nodes)
    for n, spec in enumerate(nodes):  # the leaves first: they need no other node
        if isinstance(spec, Literal) and spec.values:
            shortest[n] = min(spec.values, key=len)
        elif isinstance(spec, String) and spec.pattern is None:
            shortest[n] = b'"' + b"a" * spec.min_length + b'"'
        elif isinstance(spec, String):
            shortest[n] = _pattern_closing(rules, (PATTERN, n, S_OPEN, 0, 0, 0))
        elif isinstance(spec, Number):
            (start,) = rules.starts[n]  # a number node's one frame
            shortest[n] = _number_closing(rules, start)
    changed = True
    while changed:
        changed = False
        for n, spec in enumerate(nodes):
            text, known = _composite(spec, shortest), shortest[n]
            if text is not None and (known is None or len(text) < len(known)):
                shortest[n] = text
                changed = True
    return shortest


def _entry(spec: Object, shortest: list[bytes | None], i: int, j: int) -> tuple[bytes, int] | None:
    """Property j (-1: an undeclared key) written in full, and the object frame's i after it."""
    if j < 0:
        assert spec.extra_value is not None  # the callers ask for an undeclared key only when one may come
        key = shortest[spec.extra_key] if spec.extra_key is not None else b'""'
        value = shortest[spec.extra_value]
        following = plus_extra(spec, i)
    else:
        p = spec.properties[j]
        key, value, following = p.key, shortest[p.value], i | 1 << j
    return None if key is None or value is None else (key + b":" + value, following)


def _rest(spec: Object, shortest: list[bytes | None], i: int, first: bool) -> bytes | None:
    """Objects in any order, after `{` (first) or a value: the properties still due (or needed to reach
    minProperties: the shortest optional ones, else one undeclared key), then `}`."""
    texts: list[bytes] = []
    for _ in range(len(spec.properties) + 2):
        if closable_any(spec, i):
            return ((b"" if first else b",") + b",".join(texts) + b"}") if texts else b"}"
        written = i & DECLARED
        due = due_properties(spec, written) & ~written
        options = []
        for j in [*range(len(spec.properties)), -1]:
            if j < 0:
                following = plus_extra(spec, i)  # only when it counts towards minProperties
                fits = spec.extra_value is not None and not due and following != i and feasible(spec, following)
            else:
                fits = not written >> j & 1 and feasible(spec, i | 1 << j) and (not due or due >> j & 1)
            entry = _entry(spec, shortest, i, j) if fits else None
            if entry is not None:
                options.append(entry)
        if not options:
            return None
        text, i = min(options, key=lambda entry: len(entry[0]))
        texts.append(text)
    return None


def _composite(spec: object, shortest: list[bytes | None]) -> bytes | None:
    if isinstance(spec, Union):
        options = [text for text in (shortest[o] for o in spec.options) if text is not None]
        return min(options, key=len) if options else None
    if isinstance(spec, Object) and spec.any_order:
        rest = _rest(spec, shortest, 0, True)
        return None if rest is None else b"{" + rest
    if isinstance(spec, Object):
        if spec.free_value is not None:
            return b"{}"
        required = [(p.key, shortest[p.value]) for p in spec.properties if p.required]
        texts = [key + b":" + value for key, value in required if value]
        if len(texts) < len(required):
            return None
        return b"{" + b",".join(texts) + b"}"
    if isinstance(spec, Array):
        items = [spec.prefix[k] if k < len(spec.prefix) else spec.item for k in range(spec.min_items)]
        values = [shortest[i] for i in items if i is not None]
        texts = [text for text in values if text is not None]
        return b"[" + b",".join(texts) + b"]" if len(texts) == spec.min_items else None
    return None


_LENGTHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CLOSERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def closer_of(grammar: Grammar) -> _Closer:
    """The closings of this grammar's states, made on first use and kept while the grammar lives."""
    closer = _CLOSERS.get(grammar)
    if closer is None:
        closer = _CLOSERS[grammar] = _Closer(grammar.rules)
    return closer


def _token_lengths(vocabulary: Vocabulary) -> np.ndarray:
    """(V,) each token's length in bytes (kept per vocabulary)."""
    lengths = _LENGTHS.get(vocabulary)
    if lengths is None:
        lengths = np.zeros(vocabulary.size, np.int64)  # (V,)
        lengths[: len(vocabulary.token_bytes)] = [len(t) for t in vocabulary.token_bytes]
        _LENGTHS[vocabulary] = lengths
    return lengths


def closing_tokens(vocabulary: Vocabulary, text: bytes) -> list[int]:
    """[p]: the fewest tokens that spell text[p:] exactly (a large number where none do)."""
    trie, never = vocabulary.trie, 1 << 30
    best = [never] * len(text) + [0]
    for p in range(len(text) - 1, -1, -1):
        node = 0
        for q in range(p, len(text)):
            at = trie.labels[node].find(text[q])
            if at < 0:
                break
            node = trie.first[node] + at
            if trie.ends[node] is not None:
                best[p] = min(best[p], 1 + best[q + 1])
    return best


class Budgeted:
    """A Matcher that ends within a budget of tokens: a token is allowed only if a closing (see the
    module docstring) still fits in the tokens left after it, with one for EOS when the vocabulary has
    one; when no other token fits, the closing itself is written. If even the first state's closing does
    not fit, generation is not constrained by the budget (the output is cut: finish_reason "length")."""

    def __init__(self, grammar: Grammar, vocabulary: Vocabulary, budget: int) -> None:
        self.matcher = Matcher(grammar, vocabulary)
        self.vocabulary = vocabulary
        self.automaton = grammar.automaton(vocabulary)
        self.closer = closer_of(grammar)
        self.state = self.automaton.initial
        self.left = budget  # tokens that may still come, EOS included
        self.eos = 1 if vocabulary.eos_ids else 0
        self.forced: bytes | None = None  # the closing being written
        self.reserves: dict[int, int] = {}  # state -> tokens its closing takes (+ EOS)
        self.fits = self.reserve(self.state) <= self.left

    @property
    def complete(self) -> bool:
        return self.matcher.complete

    @property
    def finished(self) -> bool:
        return self.matcher.finished

    def reserve(self, state: int) -> int:
        """The tokens the closing from `state` takes, EOS included (a large number: none is known)."""
        found = self.reserves.get(state)
        if found is None:
            text = self.closer.closing(self.automaton.states[state].configs)
            found = 1 << 30 if text is None else closing_tokens(self.vocabulary, text)[0] + self.eos
            if text == b"" and self.automaton.states[state].complete:
                found = self.eos
            self.reserves[state] = found
        return found

    def allowed(self) -> np.ndarray:
        allowed = self.matcher.allowed()  # (V,)
        if not self.fits:
            return allowed
        if self.forced is None:
            fitting = self._fitting(allowed)  # (V,)
            if fitting.any() or self.matcher.complete:
                return fitting | (allowed & self.vocabulary.eos_mask)
            self.forced = self.closer.closing(self.automaton.states[self.state].configs) or b""
        return self._forced(allowed)

    def _fitting(self, allowed: np.ndarray) -> np.ndarray:
        """(V,) the allowed tokens after which a closing fits in the tokens left."""
        room, vocabulary = self.left - 1, self.vocabulary
        candidates = allowed & ~vocabulary.eos_mask  # (V,)
        out = allowed.copy()
        if self._in_string():  # plain text only lengthens the string: its closing stays the same or shorter
            candidates &= ~vocabulary.plain_mask
            if self.reserve(self.state) > room:
                out &= ~vocabulary.plain_mask
        ids = np.flatnonzero(candidates)
        if not len(ids):
            return out
        longest = int(_token_lengths(vocabulary)[ids].max())
        if self.reserve(self.state) + longest * self.closer.growth + _SLACK <= room:
            return out  # no token can take the closing out of reach
        token_bytes, transition = vocabulary.token_bytes, self.automaton.transition
        for token in ids:
            state = self.state
            for b in token_bytes[token]:
                state = transition(state, b)
                if state < 0:
                    break
            if state < 0 or self.reserve(state) > room:
                out[token] = False
        return out

    def _in_string(self) -> bool:
        """Whether every configuration is inside a string's text (not in an escape, not a pattern's)."""
        return all(
            config and config[-1][KIND] == STRING and config[-1][PHASE] == S_CONTENT
            for config in self.automaton.states[self.state].configs
        )

    def _forced(self, allowed: np.ndarray) -> np.ndarray:
        """(V,) the tokens that write the head of the closing and leave the rest within the tokens left."""
        out = np.zeros_like(allowed)
        text = self.forced
        if not text:
            return allowed & self.vocabulary.eos_mask if self.matcher.complete else allowed
        best, trie, node = closing_tokens(self.vocabulary, text), self.vocabulary.trie, 0
        for q in range(len(text)):
            at = trie.labels[node].find(text[q])
            if at < 0:
                break
            node = trie.first[node] + at
            ends = trie.ends[node]  # the tokens spelled text[: q + 1]
            if ends is not None and 1 + best[q + 1] + self.eos <= self.left:
                out[list(ends)] = True
        out &= allowed
        return out if out.any() else allowed

    def advance(self, token_id: int) -> None:
        self.matcher.advance(token_id)
        self.left -= 1
        if self.vocabulary.eos_mask[token_id]:
            return
        data = self.vocabulary.token_bytes[token_id]
        for b in data:
            self.state = self.automaton.transition(self.state, b)
        if self.forced is not None:
            self.forced = self.forced[len(data) :] if self.forced.startswith(data) else None


_SLACK = 16  # tokens, beside the bound on growth, before tokens are checked one by one
