"""The parser of a compiled grammar: configurations (stacks of frames) read one byte at a time.

`read_byte(rules, config, b)` gives the configurations after byte b (none: b is not allowed), `is_complete`
says whether a configuration is a whole document, and `readable_bytes` gives a cheap superset of the bytes
it can read. The limits of what is written (whitespace, digits) are enforced here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from fractions import Fraction

from .nodes import Array, Literal, Number, Object, String, Union

MAX_INT_DIGITS = 16
MAX_FRACTION_DIGITS = 16
MAX_EXPONENT_DIGITS = 3
MAX_INDENT = 20  # spaces or tabs after a newline
MAX_NEWLINES = 2


class Rules:
    """What the parser reads: the nodes, and the first frames of each node's alternatives."""

    def __init__(self, nodes: Sequence, whitespace: bool = True) -> None:
        self.nodes = tuple(nodes)
        self.whitespace = whitespace  # False: the compact form, no whitespace between tokens
        self.starts = _Starts(self.nodes)
        self.keys: dict[int, _Keys] = {}  # object node -> the trie of its declared keys (made when first read)


class _Starts:
    """[n]: the first frames of node n's alternatives, found when first asked for: a grammar that reads
    few of its nodes (an enum's filter, `Grammar.accepts`) costs what it reads, not the whole schema."""

    def __init__(self, nodes: tuple) -> None:
        self.nodes = nodes
        self.found: dict[int, tuple[tuple, ...]] = {}

    def __getitem__(self, node: int) -> tuple[tuple, ...]:
        frames = self.found.get(node)
        if frames is None:
            frames = self.found[node] = _start_frames(self.nodes, node)
        return frames


class _Keys:
    """The declared keys of an object (its excluded ones too) as a byte trie. A key being written is a
    node of it, an int: the same prefix is the same parser state whatever led to it, and a byte is a
    lookup, not a re-read of the key from its start.

    Node 0 is the root, node QUOTE the opening quote every key starts with. text[t]: the bytes that lead
    to t; children[t]: byte -> node; below[t]: the properties (bit j: property j) whose key passes through t;
    exact[t]: the property whose key is text[t] (-2: an excluded key, -1: none).
    """

    QUOTE = 1

    def __init__(self, spec: Object) -> None:
        self.text: list[bytes] = [b""]
        self.children: list[dict[int, int]] = [{}]
        self.below: list[int] = [0]
        self.exact: list[int] = [-1]
        self._add(b'"', 0)
        for j, p in enumerate(spec.properties):
            self._add(p.key, 1 << j, j)
        for key in spec.excluded:
            self._add(key, 0, -2)
        self._candidates: dict[int, int] = {}  # an object frame's progress -> the properties that may come next
        self._strings: dict[int, list[tuple]] = {}  # node -> the undeclared key's string frames after text[node]

    def _add(self, key: bytes, bit: int, j: int = -1) -> None:
        t = 0
        for b in key:
            child = self.children[t].get(b)
            if child is None:
                child = self.children[t][b] = len(self.text)
                self.text.append(self.text[t] + bytes((b,)))
                self.children.append({})
                self.below.append(0)
                self.exact.append(-1)
            t = child
            self.below[t] |= bit
        if self.exact[t] == -1:
            self.exact[t] = j

    def candidates(self, spec: Object, i: int) -> int:
        """The properties that may come next (bit j: property j), in a key phase with i the frame's progress."""
        bits = self._candidates.get(i)
        if bits is None:
            if spec.any_order:
                unwritten = (j for j in range(len(spec.properties)) if not i >> j & 1)
                bits = sum(1 << j for j in unwritten if feasible(spec, i | 1 << j))
            else:  # properties i to last_candidate[i]
                bits = (1 << spec.last_candidate[i] + 1) - (1 << i) if i < len(spec.properties) else 0
            self._candidates[i] = bits
        return bits

    def strings(self, g: Rules, spec: Object, t: int) -> list[tuple]:
        """The frames of the undeclared key's string after reading text[t] (none: it cannot be one)."""
        frames = self._strings.get(t)
        if frames is None:
            assert spec.extra_key is not None
            frames = list(g.starts[spec.extra_key])
            for b in self.text[t]:
                frames = [c[-1] for frame in frames for c in _STEPS[frame[KIND]](g, frame, b) if c]
            self._strings[t] = frames
        return frames


def keys_of(g: Rules, n: int) -> _Keys:
    keys = g.keys.get(n)
    if keys is None:
        keys = g.keys[n] = _Keys(g.nodes[n])
    return keys


def key_text(g: Rules, frame: tuple) -> bytes:
    """The key so far of an object frame in its key phase."""
    return keys_of(g, frame[NODE]).text[frame[OBJECT_KEY]]


# A configuration is a tuple of frames, the innermost last: a stack. A frame is a plain tuple, its kind
# first (which picks its step function, _STEPS[frame[KIND]], and keeps frames of different kinds unequal);
# its fields are read through the index constants below, one group per kind. Frames are hashable and equal
# by value, so configurations, and the sets of them that are the automaton's states, are too. They are not
# NamedTuples: the parser builds and reads frames at every byte of a new state, a NamedTuple costs ~0.3 us
# more to build (CPython 3.11) and its fields more to read, and the masks of benchmarks/constrain_bench.py's
# flat object took 7-20% longer with them (median and p95 per token).
# A frame that has read its closing byte is popped. Numbers and literals end without a byte of their own:
# when they can end, the next byte is also offered to the frame below.

TEXT, VALUE, OBJECT, ARRAY, STRING, NUMBER, LITERAL, PATTERN = range(8)  # frame[KIND]
KIND, NODE, PHASE = 0, 1, 2  # every frame's kind; the node of all but TEXT; the phase of all but TEXT, VALUE, LITERAL

# (TEXT, text, offset): literal text (the grammar's prefix or suffix) read up to text[offset]; popped after
# its last byte.
TEXT_BYTES, TEXT_OFFSET = 1, 2

# (VALUE, node): a value of node not started yet (only at the root).

# (OBJECT, node, phase, progress, key, space):
#   progress, in declared order (the default): the index of the next property that may come; at the COLON
#     and VALUE_NEXT of a declared key, that key's index; of an undeclared key, -1 - (the next index).
#     Objects in any order (Object.any_order): the set of properties written (bit j: property j; undeclared
#     keys counted from bit _EXTRA); at the COLON and VALUE_NEXT, the pair (that set, the key's property
#     index or -1 for an undeclared key). Objects of free keys (Object.free_value): always 0.
#   key: in the KEY phase, the key so far: a node of the object's _Keys trie (from the opening quote); else 0.
#   space: the whitespace since the last token (see _whitespace); 0 in the KEY phase.
OBJECT_PROGRESS, OBJECT_KEY, OBJECT_SPACE = 3, 4, 5
OPEN, FIRST, KEY, COLON, VALUE_NEXT, AFTER_VALUE, AFTER_COMMA = range(7)  # the phases of objects and arrays

# (ARRAY, node, phase, items, space): phase OPEN, FIRST, AFTER_VALUE or AFTER_COMMA; items: the items begun
# (capped at Array.cap); space: the whitespace since the last token.
ARRAY_ITEMS, ARRAY_SPACE = 3, 4

# (STRING, node, phase, chars, partial): chars: the characters begun (capped at String.cap); partial, the
# character being read: in S_HEX the digits of its \u escape read so far (-1 after a leading D, which must
# be followed by 0-7: no surrogates); in S_UTF8 (continuation bytes due, lowest and highest next byte);
# else 0.
# (PATTERN, node, phase, chars, partial, regex): a string whose characters must match its regex: the
# fields of STRING (no S_HEX: the only escapes are of `"`, `\` and `/`), and the state of the regex's DFA
# after the characters read.
STRING_CHARS, STRING_PARTIAL, PATTERN_REGEX = 3, 4, 5
S_OPEN, S_CONTENT, S_ESCAPE, S_HEX, S_UTF8 = range(5)  # the phases of strings and patterns

# (NUMBER, node, phase, digits, value): digits: those of the part being written (integer, fraction or
# exponent); value: an integer with bounds or multipleOf, the integer so far (signed); a number with
# bounds, (negative, magnitude so far as a Fraction); else 0.
NUMBER_DIGITS, NUMBER_VALUE = 3, 4
_N_START, _N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRACTION, _N_E, _N_E_SIGN, _N_EXPONENT = range(9)

# (LITERAL, node, text): one of the literal values of node (enum, const, true, false, null), its bytes
# read so far.
LITERAL_TEXT = 2

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
# Bytes that can be inside a string (content, escapes, UTF-8): no control bytes, none that UTF-8 never uses
_TEXT_BITS = _ANY_BYTE & ~_bits(bytes(range(0x20))) & ~_bits(b"\xc0\xc1") & ~_bits(bytes(range(0xF5, 0x100)))
_READABLE = {
    (OBJECT, OPEN): _bits(b"{"),
    (OBJECT, FIRST): _WS_BITS | _bits(b'"}'),
    (OBJECT, COLON): _WS_BITS | _bits(b":"),
    (OBJECT, VALUE_NEXT): _WS_BITS | _VALUE_FIRST,
    (OBJECT, AFTER_VALUE): _WS_BITS | _bits(b",}"),
    (OBJECT, AFTER_COMMA): _WS_BITS | _bits(b'"'),
    (ARRAY, OPEN): _bits(b"["),
    (ARRAY, FIRST): _WS_BITS | _VALUE_FIRST | _bits(b"]"),
    (ARRAY, AFTER_VALUE): _WS_BITS | _bits(b",]"),
    (ARRAY, AFTER_COMMA): _WS_BITS | _VALUE_FIRST,
    (STRING, S_OPEN): _bits(b'"'),
    (STRING, S_CONTENT): _TEXT_BITS,
    (STRING, S_ESCAPE): _bits(b'"\\/bfnrtu'),
    (STRING, S_HEX): _bits(b"0123456789abcdefABCDEF"),
    (STRING, S_UTF8): _bits(bytes(range(0x80, 0xC0))),
    **{(NUMBER, phase): _bits(b"-+.eE0123456789") for phase in range(9)},
}
_READABLE.update({(PATTERN, phase): bits for (kind, phase), bits in list(_READABLE.items()) if kind == STRING})


def readable_bytes(g: Rules, config: tuple) -> int:
    """A superset of the bytes `config` can read, as a 256-bit set."""
    bits = 0
    for frame in reversed(config):
        kind = frame[KIND]
        if kind == TEXT:
            bits |= 1 << frame[TEXT_BYTES][frame[TEXT_OFFSET]]
        elif kind == VALUE:
            bits |= _VALUE_FIRST
        elif kind == LITERAL:
            values, text = g.nodes[frame[NODE]].values, frame[LITERAL_TEXT]
            i = bisect_left(values, text)  # the values that start with `text` follow in a row
            while i < len(values) and values[i].startswith(text):
                if len(values[i]) > len(text):
                    bits |= 1 << values[i][len(text)]
                i += 1
        elif kind == OBJECT and frame[PHASE] == KEY:
            spec, keys = g.nodes[frame[NODE]], keys_of(g, frame[NODE])
            candidates = keys.candidates(spec, frame[OBJECT_PROGRESS])
            for b, child in keys.children[frame[OBJECT_KEY]].items():
                if keys.below[child] & candidates:
                    bits |= 1 << b
            if spec.extra_value is not None:
                bits |= _TEXT_BITS
        else:
            bits |= _READABLE[kind, frame[PHASE]]
        if not can_end(g, frame):
            break
    return bits


def _candidates(spec: Object, i: int) -> list:
    """The declared properties that may come next (in a key phase, i as the object frame holds it)."""
    if spec.any_order:
        return [p for j, p in enumerate(spec.properties) if not i >> j & 1 and feasible(spec, i | 1 << j)]
    return list(spec.properties[i : spec.last_candidate[i] + 1])


_EXTRA = 16  # objects in any order: the bits of i from here count the undeclared keys written (capped)
DECLARED = (1 << _EXTRA) - 1


def _counted(spec: Object) -> bool:
    return spec.min_properties > 0 or spec.max_properties >= 0


def plus_extra(spec: Object, i: int) -> int:
    """i after one more undeclared key (counted only with min/maxProperties, up to what they need)."""
    if not _counted(spec):
        return i
    cap = spec.max_properties + 1 if spec.max_properties >= 0 else 1  # one past the most: never allowed
    return (i & DECLARED) | min((i >> _EXTRA) + 1, cap) << _EXTRA


def feasible(spec: Object, i: int) -> bool:
    """Whether an object in any order can still be completed from i within min/maxProperties (the
    properties due, the count to reach, the room left)."""
    if not _counted(spec):
        return True
    written, extras = i & DECLARED, i >> _EXTRA
    declared = bin(written).count("1")
    due = bin(due_properties(spec, written) & ~written).count("1")
    short = max(0, spec.min_properties - declared - min(extras, 1))  # undeclared keys may repeat: one counts
    available = len(spec.properties) - declared + (1 if spec.extra_value is not None and extras == 0 else 0)
    if short > available:
        return False
    return spec.max_properties < 0 or declared + extras + max(due, short) <= spec.max_properties


def closable_any(spec: Object, i: int) -> bool:
    """Whether an object in any order may close after i: nothing due, minProperties reached."""
    written = i & DECLARED
    if due_properties(spec, written) & ~written:
        return False
    return bin(written).count("1") + min(i >> _EXTRA, 1) >= spec.min_properties


def _can_add(spec: Object, i: int) -> bool:
    """Whether some key (declared and not written yet, or undeclared) may come next."""
    if spec.extra_value is not None and feasible(spec, plus_extra(spec, i)):
        return True
    return any(not i >> j & 1 and feasible(spec, i | 1 << j) for j in range(len(spec.properties)))


def due_properties(spec: Object, written: int) -> int:
    """Objects in any order: the properties that must be written before `}` (required ones, and those
    the written ones require through `dependentRequired`, in turn)."""
    due = spec.required_bits
    changed = bool(spec.dependencies)
    while changed:
        changed = False
        for trigger, needed in spec.dependencies:
            if (written | due) & trigger and needed & ~due:
                due |= needed
                changed = True
    return due


def _start_frames(nodes: Sequence, node: int) -> tuple[tuple, ...]:
    """The first frame of each alternative of a node (unions flattened, cycles ignored)."""
    frames: list[tuple] = []
    seen, todo = set(), deque([node])
    while todo:
        n = todo.popleft()
        if n in seen:
            continue
        seen.add(n)
        spec = nodes[n]
        if isinstance(spec, Union):
            todo.extend(spec.options)
        elif isinstance(spec, Object):
            frames.append((OBJECT, n, OPEN, 0, 0, 0))
        elif isinstance(spec, Array):
            frames.append((ARRAY, n, OPEN, 0, 0))
        elif isinstance(spec, String):
            frames.append((STRING, n, S_OPEN, 0, 0) if spec.pattern is None else (PATTERN, n, S_OPEN, 0, 0, 0))
        elif isinstance(spec, Number):
            bounded_decimal = not spec.integer and (spec.minimum is not None or spec.maximum is not None)
            frames.append((NUMBER, n, _N_START, 0, (False, Fraction(0)) if bounded_decimal else 0))
        elif isinstance(spec, Literal):
            frames.append((LITERAL, n, b""))
    return tuple(frames)


def read_byte(g: Rules, config: tuple, b: int) -> list[tuple]:
    """The configurations after reading byte b (none: b is not allowed)."""
    if not config:  # the document and its suffix are complete
        return []
    top = config[-1]
    below = config[:-1]
    out = [below + frames for frames in _STEPS[top[KIND]](g, top, b)]
    if below and can_end(g, top):
        out.extend(read_byte(g, below, b))
    return out


def is_complete(g: Rules, config: tuple) -> bool:
    return all(can_end(g, frame) for frame in config)


def can_end(g: Rules, frame: tuple) -> bool:
    kind = frame[KIND]
    if kind == NUMBER:
        spec, phase, value = g.nodes[frame[NODE]], frame[PHASE], frame[NUMBER_VALUE]
        if spec.integer:
            return phase in (_N_ZERO, _N_INT) and _within(spec, value)
        if spec.minimum is not None or spec.maximum is not None:
            negative, magnitude = value
            return phase in (_N_ZERO, _N_INT, _N_FRACTION) and _decimal_within(
                spec, -magnitude if negative else magnitude
            )
        return phase in (_N_ZERO, _N_INT, _N_FRACTION, _N_EXPONENT)
    if kind == LITERAL:
        values = g.nodes[frame[NODE]].values
        i = bisect_left(values, frame[LITERAL_TEXT])
        return i < len(values) and values[i] == frame[LITERAL_TEXT]
    return False


def _start_value(g: Rules, node: int, b: int) -> list[tuple]:
    out = []
    for frame in g.starts[node]:
        out.extend(_STEPS[frame[KIND]](g, frame, b))
    return out


def _whitespace(w: int, b: int) -> int | None:
    """The whitespace state after byte b: 0 nothing, 1 one space, 100 * newlines + spaces/tabs after them
    (None: b may not come here)."""
    if b == 0x0A:  # newlines come first
        return w + 100 if w == 0 or (w % 100 == 0 and w // 100 < MAX_NEWLINES) else None
    if w == 0:
        return 1 if b == 0x20 else None
    return w + 1 if w >= 100 and w % 100 < MAX_INDENT else None


def _step_text(g: Rules, frame: tuple, b: int) -> list[tuple]:
    text, offset = frame[TEXT_BYTES], frame[TEXT_OFFSET]
    if text[offset] != b:
        return []
    return [()] if offset + 1 == len(text) else [((TEXT, text, offset + 1),)]


def _step_value(g: Rules, frame: tuple, b: int) -> list[tuple]:
    return _start_value(g, frame[NODE], b)


def _step_object(g: Rules, frame: tuple, b: int) -> list[tuple]:
    n, phase, i = frame[NODE], frame[PHASE], frame[OBJECT_PROGRESS]
    spec = g.nodes[n]
    if spec.any_order:
        return _step_any_order(g, spec, frame, b)
    if phase == KEY:
        keys = keys_of(g, n)
        t = keys.children[frame[OBJECT_KEY]].get(b, -1)
        if t >= 0:
            candidates = keys.candidates(spec, i)
            j = keys.exact[t]
            if j >= 0 and candidates >> j & 1:
                return [((OBJECT, n, COLON, j, 0, 0),)]
            if keys.below[t] & candidates:
                return [((OBJECT, n, KEY, i, t, 0),)]
        if spec.extra_value is None:
            return []
        return _undeclared_key(g, spec, frame, b, t)
    if phase == OPEN:
        return [((OBJECT, n, FIRST, 0, 0, 0),)] if b == 0x7B else []
    if b in _WHITESPACE:
        space = _whitespace(frame[OBJECT_SPACE], b) if g.whitespace else None
        return [] if space is None else [((OBJECT, n, phase, i, 0, space),)]
    free = spec.free_value is not None
    extra = spec.extra_value is not None
    if phase == FIRST or phase == AFTER_COMMA:
        if b == 0x22 and free:
            starts = g.starts[spec.free_key]  # the key's string frame (none: no key is allowed)
            colon = (OBJECT, n, COLON, 0, 0, 0)
            return [(colon, *frames) for key in starts for frames in _STEPS[key[KIND]](g, key, b)]
        if b == 0x22 and (i < len(spec.properties) or extra):
            return [((OBJECT, n, KEY, i, _Keys.QUOTE, 0),)]
        return [()] if b == 0x7D and phase == FIRST and spec.closable[i] else []
    if phase == COLON:
        return [((OBJECT, n, VALUE_NEXT, i, 0, 0),)] if b == 0x3A else []
    if phase == VALUE_NEXT:
        if i < 0:  # an undeclared key's value
            after, value = (OBJECT, n, AFTER_VALUE, -1 - i, 0, 0), spec.extra_value
        else:
            after = (OBJECT, n, AFTER_VALUE, 0 if free else i + 1, 0, 0)
            value = spec.free_value if free else spec.properties[i].value
        return [(after, *frames) for frames in _start_value(g, value, b)]
    # AFTER_VALUE
    if b == 0x2C and (free or extra or i < len(spec.properties)):
        return [((OBJECT, n, AFTER_COMMA, i, 0, 0),)]
    return [()] if b == 0x7D and spec.closable[i] else []


def _step_any_order(g: Rules, spec: Object, frame: tuple, b: int) -> list[tuple]:
    """_step_object for an object whose properties may come in any order, each at most once."""
    n, phase, i = frame[NODE], frame[PHASE], frame[OBJECT_PROGRESS]
    if phase == KEY:  # i: the properties written
        keys = keys_of(g, n)
        t = keys.children[frame[OBJECT_KEY]].get(b, -1)
        if t >= 0:
            candidates = keys.candidates(spec, i)  # not written yet, and the object can still be completed
            j = keys.exact[t]
            if j >= 0 and candidates >> j & 1:
                return [((OBJECT, n, COLON, (i, j), 0, 0),)]
            if keys.below[t] & candidates:
                return [((OBJECT, n, KEY, i, t, 0),)]
        if spec.extra_value is None or not feasible(spec, plus_extra(spec, i)):
            return []
        return _undeclared_key(g, spec, frame, b, t, (i, -1))
    if phase == OPEN:
        return [((OBJECT, n, FIRST, 0, 0, 0),)] if b == 0x7B else []
    if b in _WHITESPACE:
        space = _whitespace(frame[OBJECT_SPACE], b) if g.whitespace else None
        return [] if space is None else [((OBJECT, n, phase, i, 0, space),)]
    if phase == COLON:
        return [((OBJECT, n, VALUE_NEXT, i, 0, 0),)] if b == 0x3A else []
    if phase == VALUE_NEXT:
        written, j = i
        if j < 0:
            assert spec.extra_value is not None  # j < 0 (an undeclared key) is only entered when it is set
            value = spec.extra_value
        else:
            value = spec.properties[j].value
        after = (OBJECT, n, AFTER_VALUE, plus_extra(spec, written) if j < 0 else written | 1 << j, 0, 0)
        return [(after, *frames) for frames in _start_value(g, value, b)]
    if phase == FIRST or phase == AFTER_COMMA:
        if b == 0x22 and _can_add(spec, i):
            return [((OBJECT, n, KEY, i, _Keys.QUOTE, 0),)]
        return [()] if b == 0x7D and phase == FIRST and closable_any(spec, i) else []
    # AFTER_VALUE
    if b == 0x2C and _can_add(spec, i):
        return [((OBJECT, n, AFTER_COMMA, i, 0, 0),)]
    return [()] if b == 0x7D and closable_any(spec, i) else []


def _undeclared_key(
    g: Rules, spec: Object, frame: tuple, b: int, t: int, colon_progress: tuple[int, int] | None = None
) -> list[tuple]:
    """An object key (the key so far of the object frame, a node of the key trie, then byte b, which leads
    to node t; -1: out of the trie) that is none of the next candidates: an undeclared key, if it is not
    (and cannot become) a declared one. Once it cannot, the rest of it is read by a plain string frame.
    colon_progress: the object frame's progress at the colon (default: -1 - progress, declared order)."""
    n, i, key = frame[NODE], frame[OBJECT_PROGRESS], frame[OBJECT_KEY]
    keys = keys_of(g, n)
    if t >= 0 and keys.exact[t] != -1:
        return []  # a declared key out of its place, or written twice
    following = [c for string in keys.strings(g, spec, key) for c in _STEPS[string[KIND]](g, string, b)]
    configs = [c[-1] for c in following if c]  # the string frame of undeclared keys, after the key so far
    if t >= 0:  # it may still become a declared key: keep reading it
        return [((OBJECT, n, KEY, i, t, 0),)] if configs else []
    colon = (OBJECT, n, COLON, -1 - i if colon_progress is None else colon_progress, 0, 0)
    if any(c == () for c in following) and _closes_string(keys.text[key] + bytes((b,))):
        return [(colon,)]
    return [(colon, string) for string in configs]


def as_undeclared(g: Rules, config: tuple) -> tuple | None:
    """For a configuration whose top frame is an object in its key phase: the configuration that reads
    every byte leading out of the key trie as it does (the key taken as an undeclared one: the colon
    frame under the key's string frame); None if there is none (no undeclared key may come here, or its
    string has no frame or more than one)."""
    top = config[-1]
    assert top[KIND] == OBJECT
    n, i = top[NODE], top[OBJECT_PROGRESS]
    spec = g.nodes[n]
    if spec.extra_value is None:
        return None
    if spec.any_order:
        if not feasible(spec, plus_extra(spec, i)):
            return None
        progress: int | tuple = (i, -1)
    else:
        progress = -1 - i
    frames = keys_of(g, n).strings(g, spec, top[OBJECT_KEY])
    if len(frames) != 1:
        return None
    return (*config[:-1], (OBJECT, n, COLON, progress, 0, 0), frames[0])


def _closes_string(key: bytes) -> bool:
    """Whether the closing quote of `key` (a JSON string, quotes included) is not escaped."""
    backslashes = len(key) - 1 - len(key[:-1].rstrip(b"\\"))
    return backslashes % 2 == 0


def _step_array(g: Rules, frame: tuple, b: int) -> list[tuple]:
    n, phase, count = frame[NODE], frame[PHASE], frame[ARRAY_ITEMS]
    spec = g.nodes[n]
    if phase == OPEN:
        return [((ARRAY, n, FIRST, 0, 0),)] if b == 0x5B else []
    if b in _WHITESPACE:
        space = _whitespace(frame[ARRAY_SPACE], b) if g.whitespace else None
        return [] if space is None else [((ARRAY, n, phase, count, space),)]
    if phase == AFTER_VALUE:
        if b == 0x2C and (spec.max_items < 0 or count < spec.max_items):
            return [((ARRAY, n, AFTER_COMMA, count, 0),)]
        return [()] if b == 0x5D and count >= spec.min_items else []
    if phase == FIRST and b == 0x5D:
        return [()] if spec.min_items == 0 else []
    item = spec.prefix[count] if count < len(spec.prefix) else spec.item
    if item is None:
        return []
    after = (ARRAY, n, AFTER_VALUE, min(count + 1, spec.cap), 0)
    return [(after, *frames) for frames in _start_value(g, item, b)]


def _step_string(g: Rules, frame: tuple, b: int) -> list[tuple]:
    n, phase, count, partial = frame[NODE], frame[PHASE], frame[STRING_CHARS], frame[STRING_PARTIAL]
    if phase == S_CONTENT:
        spec = g.nodes[n]
        if b == 0x22:
            return [()] if count >= spec.min_length else []
        if b < 0x20 or (spec.max_length >= 0 and count >= spec.max_length):
            return []
        count = min(count + 1, spec.cap)  # a character starts here
        if b == 0x5C:
            return [((STRING, n, S_ESCAPE, count, 0),)]
        if b < 0x80:
            return [((STRING, n, S_CONTENT, count, 0),)]
        lead = _UTF8_LEAD.get(b)
        return [] if lead is None else [((STRING, n, S_UTF8, count, lead),)]
    if phase == S_UTF8:
        due, low, high = partial
        if not low <= b <= high:
            return []
        more = _UTF8_MORE[due]
        return [((STRING, n, S_CONTENT, count, 0) if more is None else (STRING, n, S_UTF8, count, more),)]
    if phase == S_OPEN:
        return [((STRING, n, S_CONTENT, 0, 0),)] if b == 0x22 else []
    if phase == S_ESCAPE:
        if b in _ESCAPES:
            return [((STRING, n, S_CONTENT, count, 0),)]
        return [((STRING, n, S_HEX, count, 0),)] if b == 0x75 else []
    # S_HEX: partial = hex digits read; -1 after a leading D, which must be followed by 0-7 (no surrogates)
    if b not in _HEX or (partial == -1 and b not in b"01234567"):
        return []
    if partial == 0 and b in b"dD":
        return [((STRING, n, S_HEX, count, -1),)]
    digits = 2 if partial == -1 else partial + 1
    return [((STRING, n, S_CONTENT, count, 0) if digits == 4 else (STRING, n, S_HEX, count, digits),)]


_ESCAPED = {0x22: 0x22, 0x5C: 0x5C, 0x2F: 0x2F}  # the escapes a patterned string may use, and their character


def step_pattern(g: Rules, frame: tuple, b: int) -> list[tuple]:
    """A string whose characters must match a regex; escapes only for `"`, `\\` and `/`."""
    n, phase, count, r = frame[NODE], frame[PHASE], frame[STRING_CHARS], frame[PATTERN_REGEX]
    spec = g.nodes[n]
    if phase == S_OPEN:
        return [((PATTERN, n, S_CONTENT, 0, 0, 0),)] if b == 0x22 else []
    if phase == S_UTF8:
        due, low, high = frame[STRING_PARTIAL]
        if not low <= b <= high:
            return []
        more = _UTF8_MORE[due]
        return [((PATTERN, n, S_CONTENT, count, 0, r) if more is None else (PATTERN, n, S_UTF8, count, more, r),)]
    if phase == S_CONTENT and b == 0x22:
        return [()] if spec.pattern.accepting[r] and count >= spec.min_length else []
    if phase == S_CONTENT and b == 0x5C:
        if all(_pattern_next(spec, count, r, symbol) < 0 for symbol in _ESCAPED.values()):
            return []
        return [((PATTERN, n, S_ESCAPE, count, 0, r),)]
    if phase == S_ESCAPE:
        symbol = _ESCAPED.get(b, -1)
    elif b < 0x20:
        return []
    elif b < 0x80:
        symbol = b
    else:
        symbol = 128 if b in _UTF8_LEAD else -1
    following = -1 if symbol < 0 else _pattern_next(spec, count, r, symbol)
    if following < 0:
        return []
    chars = min(count + 1, spec.cap)
    if symbol == 128:
        return [((PATTERN, n, S_UTF8, chars, _UTF8_LEAD[b], following),)]
    return [((PATTERN, n, S_CONTENT, chars, 0, following),)]


def _pattern_next(spec: String, count: int, r: int, symbol: int) -> int:
    """The regex state after one more character, if the string can still end within its lengths; else -1."""
    regex = spec.pattern
    assert regex is not None
    following = regex.next[r][symbol]
    if following < 0:
        return -1
    chars = count + 1
    if spec.max_length >= 0 and chars + regex.shortest[following] > spec.max_length:
        return -1
    if regex.longest[following] >= 0 and chars + regex.longest[following] < spec.min_length:
        return -1
    return following


def step_number(g: Rules, frame: tuple, b: int) -> list[tuple]:
    n, phase, digits, value = frame[NODE], frame[PHASE], frame[NUMBER_DIGITS], frame[NUMBER_VALUE]
    spec = g.nodes[n]
    bounded = spec.minimum is not None or spec.maximum is not None
    digit = b - 0x30 if b in _DIGITS else -1
    if bounded and not spec.integer:
        return _step_decimal(spec, frame, b, digit)
    bounded = bounded or spec.multiple_of > 1  # integers: the value is tracked
    if phase == _N_START and b == 0x2D:  # '-'
        return [((NUMBER, n, _N_MINUS, 0, 0),)] if spec.minimum is None or spec.minimum <= 0 else []
    if phase in (_N_START, _N_MINUS, _N_INT) and digit >= 0:
        if phase == _N_INT and digits == MAX_INT_DIGITS:
            return []
        negative = phase == _N_MINUS or value < 0
        magnitude = abs(value) * 10 + digit if bounded else 0
        if bounded and not _reachable(spec, negative, magnitude, digits + 1):
            return []
        next_phase = _N_ZERO if phase != _N_INT and digit == 0 else _N_INT
        return [((NUMBER, n, next_phase, digits + 1, -magnitude if negative else magnitude),)]
    if spec.integer:
        return []
    if b == 0x2E and phase in (_N_ZERO, _N_INT):  # '.'
        return [((NUMBER, n, _N_DOT, 0, 0),)]
    if b in b"eE" and phase in (_N_ZERO, _N_INT, _N_FRACTION):
        return [((NUMBER, n, _N_E, 0, 0),)]
    if phase == _N_E and b in b"+-":
        return [((NUMBER, n, _N_E_SIGN, 0, 0),)]
    if digit < 0:
        return []
    if phase == _N_DOT or (phase == _N_FRACTION and digits < MAX_FRACTION_DIGITS):
        return [((NUMBER, n, _N_FRACTION, digits + 1, 0),)]
    if phase in (_N_E, _N_E_SIGN) or (phase == _N_EXPONENT and digits < MAX_EXPONENT_DIGITS):
        return [((NUMBER, n, _N_EXPONENT, digits + 1, 0),)]
    return []


def _reachable(spec: Number, negative: bool, magnitude: int, digits: int) -> bool:
    """Whether some integer written with these leading digits (and sign) lies within the bounds."""
    longest = 0 if magnitude == 0 else MAX_INT_DIGITS - digits  # a leading 0 takes no more digits
    for more in range(longest + 1):
        low, high = magnitude * 10**more, magnitude * 10**more + 10**more - 1
        if negative:
            low, high = -high, -low
        low = low if spec.minimum is None else max(low, spec.minimum)
        high = high if spec.maximum is None else min(high, spec.maximum)
        if low <= high and -(-low // spec.multiple_of) * spec.multiple_of <= high:  # a multiple in [low, high]
            return True
    return False


def _step_decimal(spec: Number, frame: tuple, b: int, digit: int) -> list[tuple]:
    """A number with bounds: value is (negative, magnitude as a Fraction); no exponent is written."""
    n, phase, digits = frame[NODE], frame[PHASE], frame[NUMBER_DIGITS]
    negative, magnitude = frame[NUMBER_VALUE]
    if phase == _N_START and b == 0x2D:  # '-'
        negative, width = True, Fraction(10**MAX_INT_DIGITS)
        following = (NUMBER, n, _N_MINUS, 0, (True, magnitude))
    elif phase in (_N_START, _N_MINUS, _N_INT) and digit >= 0:
        if phase == _N_INT and digits == MAX_INT_DIGITS:
            return []
        magnitude = magnitude * 10 + digit
        next_phase = _N_ZERO if phase != _N_INT and digit == 0 else _N_INT
        more = 0 if magnitude == 0 else MAX_INT_DIGITS - digits - 1  # integer digits that may still come
        if not any(_decimal_reachable(spec, negative, magnitude * 10**k, Fraction(10**k)) for k in range(more + 1)):
            return []
        return [((NUMBER, n, next_phase, digits + 1, (negative, magnitude)),)]
    elif b == 0x2E and phase in (_N_ZERO, _N_INT):  # '.'
        following, width = (NUMBER, n, _N_DOT, 0, (negative, magnitude)), Fraction(1)
    elif digit >= 0 and (phase == _N_DOT or (phase == _N_FRACTION and digits < MAX_FRACTION_DIGITS)):
        width = Fraction(1, 10 ** (digits + 1))
        magnitude = magnitude + digit * width
        following = (NUMBER, n, _N_FRACTION, digits + 1, (negative, magnitude))
    else:
        return []
    return [(following,)] if _decimal_reachable(spec, negative, magnitude, width) else []


def _decimal_reachable(spec: Number, negative: bool, low: Fraction | int, width: Fraction) -> bool:
    """Whether some number of magnitude in [low, low + width), with this sign, lies within the bounds."""
    high = low + width
    if negative:  # values in (-high, -low]
        low, high = -high, -low
        top_ok = spec.maximum is None or low < spec.maximum
        bottom_ok = spec.minimum is None or high > spec.minimum or (high == spec.minimum and not spec.open_min)
    else:  # values in [low, high)
        top_ok = spec.maximum is None or low < spec.maximum or (low == spec.maximum and not spec.open_max)
        bottom_ok = spec.minimum is None or high > spec.minimum
    return top_ok and bottom_ok


def _decimal_within(spec: Number, value: Fraction) -> bool:
    low, high = spec.minimum, spec.maximum
    if low is not None and (value < low or (value == low and spec.open_min)):
        return False
    return high is None or not (value > high or (value == high and spec.open_max))


def _within(spec: Number, value: int) -> bool:
    in_range = (spec.minimum is None or value >= spec.minimum) and (spec.maximum is None or value <= spec.maximum)
    return in_range and value % spec.multiple_of == 0


def _step_literal(g: Rules, frame: tuple, b: int) -> list[tuple]:
    values = g.nodes[frame[NODE]].values
    text = frame[LITERAL_TEXT] + bytes((b,))
    i = bisect_left(values, text)  # the first value starting with `text`, if any does
    if i == len(values) or not values[i].startswith(text):
        return []
    if values[i] == text and (i + 1 == len(values) or not values[i + 1].startswith(text)):
        return [()]  # nothing longer can follow: done
    return [((LITERAL, frame[NODE], text),)]


_STEPS = (  # [kind]: the step function of that kind of frame
    _step_text,
    _step_value,
    _step_object,
    _step_array,
    _step_string,
    step_number,
    _step_literal,
    step_pattern,
)
