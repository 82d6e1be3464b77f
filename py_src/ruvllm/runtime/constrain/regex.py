"""JSON Schema `pattern` (ECMA-262 regular expressions, the subset real schemas use) as a DFA over the
characters of a string, for the string frames of parser.py.

The alphabet is the 128 ASCII characters and one symbol, NON_ASCII, for every other character. A class
that holds only some non-ASCII characters (`\\s`, `[é]`) does not take NON_ASCII: such a character is
never written where it might not match (restrictive, never unsound). Supported: literals and escapes,
`.`, classes with ranges and negation, `\\d \\w \\s \\D \\W \\S`, groups (capturing, `(?:`, named),
`|`, `* + ? {n} {n,} {n,m}` (lazy forms too), `^` at the start and `$` at the end of the pattern or of
a top-level alternative. A pattern is a search: without `^`/`$` anything may come before/after the
match. Refused with `RegexError` (the caller names the keyword and path): backreferences, lookaround,
word boundaries, `\\p{...}`, anchors elsewhere, a quantifier on a quantifier (`a**`, as ECMA-262),
patterns longer than MAX_PATTERN_CHARS or with groups nested deeper than MAX_GROUP_DEPTH (the parser
recurses once per group), and patterns whose DFA has more than MAX_REGEX_STATES.
"""

from __future__ import annotations

MAX_REGEX_STATES = 2000
MAX_NFA_STATES = 20000
MAX_PATTERN_CHARS = 16384  # JSONSchemaBench's longest pattern has 5,153
MAX_GROUP_DEPTH = 32  # groups within groups; JSONSchemaBench's patterns nest at most 8
NON_ASCII = 128
_PARTIAL = -1  # in a parsed class: some non-ASCII characters (not all); never an edge of the NFA
_SYMBOLS = 129
_ALL = frozenset(range(_SYMBOLS))
_DIGIT = frozenset(range(48, 58))
_WORD = _DIGIT | frozenset(range(65, 91)) | frozenset(range(97, 123)) | {95}
_SPACE = frozenset(b" \t\n\r\x0b\x0c")
_LINE_END = frozenset(b"\n\r")
_FAR = 1 << 30  # shortest[s] of a state that cannot reach a match


class RegexError(ValueError):
    """A pattern that is not supported, or not a regular expression."""


class Regex:
    """A DFA: state 0 starts; next[s][c] the state after symbol c (-1: no match can follow); only
    states that can still reach a match are kept. shortest[s] / longest[s]: characters still needed
    to reach a match at least / at most (longest -1: unbounded); farthest: the largest shortest[s] of a
    state that can reach a match."""

    def __init__(self, source: str, *more: str) -> None:
        """The DFA of `source`, or of any of several sources (a string matching one of them)."""
        self.source = source
        start, accept, nfa = _Nfa.build((source, *more))
        self.next, self.accepting = _determinize(nfa, start, accept)
        self.shortest, self.longest = _distances(self.next, self.accepting)
        self.farthest = max((n for n in self.shortest if n < _FAR), default=0)  # the largest shortest

    @classmethod
    def both(cls, first: Regex, second: Regex) -> Regex | None:
        """The DFA of the strings that both match (a `pattern` beside a `format`): their product, kept to
        the pairs of states reached from the start. None: no string matches both."""
        index = {(0, 0): 0}
        order = [(0, 0)]
        table: list[list[int]] = []
        while len(table) < len(order):
            a, b = order[len(table)]
            row = [-1] * _SYMBOLS
            for c, (ta, tb) in enumerate(zip(first.next[a], second.next[b], strict=True)):
                if ta < 0 or tb < 0:
                    continue
                target = index.get((ta, tb))
                if target is None:
                    if len(order) >= MAX_REGEX_STATES:
                        raise RegexError(f"the patterns together need more than {MAX_REGEX_STATES} DFA states")
                    target = index[ta, tb] = len(order)
                    order.append((ta, tb))
                row[c] = target
            table.append(row)
        accepting = [first.accepting[a] and second.accepting[b] for a, b in order]
        try:
            table, accepting = _trim(table, accepting)
        except RegexError:  # (its one error: the start reaches no match)
            return None
        # pairs from which no string matches both are dropped (numbered anew; the start stays 0)
        live = [s for s, row in enumerate(table) if accepting[s] or any(t >= 0 for t in row)]
        number = {s: i for i, s in enumerate(live)}
        regex = cls.__new__(cls)
        regex.source = f"{first.source} and {second.source}"
        regex.next = [[number.get(t, -1) for t in table[s]] for s in live]
        regex.accepting = [accepting[s] for s in live]
        regex.shortest, regex.longest = _distances(regex.next, regex.accepting)
        regex.farthest = max((n for n in regex.shortest if n < _FAR), default=0)
        return regex

    def symbol(self, char: int) -> int:
        return char if char < 128 else NON_ASCII

    def matches(self, text: str) -> bool:
        state = 0
        for ch in text:
            state = self.next[state][self.symbol(ord(ch))]
            if state < 0:
                return False
        return self.accepting[state]


# --- parsing ----------------------------------------------------------------------------------------
# AST: ("set", frozenset) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", node, low, high or None)
# | ("bol",) | ("eol",)


class _Parser:
    def __init__(self, source: str) -> None:
        if len(source) > MAX_PATTERN_CHARS:
            raise RegexError(f"the pattern has {len(source):,} characters (at most {MAX_PATTERN_CHARS:,})")
        self.s = source
        self.i = 0
        self.depth = 0  # groups open

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def take(self) -> str:
        ch = self.peek()
        if not ch:
            raise RegexError(f"the pattern {self.s!r} ends early")
        self.i += 1
        return ch

    def alternation(self) -> tuple:
        options = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def sequence(self) -> tuple:
        items: list[tuple] = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantified(self.atom()))
        return ("cat", items)

    def quantified(self, atom: tuple) -> tuple:
        repeated = False  # (a group's own quantifier, `(a*)*`, is another matter: that is allowed)
        while True:
            ch = self.peek()
            if ch in ("*", "+", "?"):
                self.i += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
            elif ch == "{" and self._counted() is not None:
                low, high = self._counted()  # type: ignore[misc]
                self.i = self.s.index("}", self.i) + 1
            else:
                return atom
            if atom[0] in ("bol", "eol"):
                raise RegexError(f"a quantifier after an anchor in {self.s!r}")
            if repeated:
                raise RegexError("nothing to repeat (a quantifier on a quantifier)")
            if self.peek() == "?":  # lazy: the same language
                self.i += 1
            atom, repeated = ("rep", atom, low, high), True

    def _counted(self) -> tuple[int, int | None] | None:
        end = self.s.find("}", self.i)
        if end < 0:
            return None
        body = self.s[self.i + 1 : end]
        low, comma, high = body.partition(",")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        bounds = (int(low), int(high) if high else None if comma else int(low))
        if bounds[1] is not None and bounds[1] < bounds[0]:
            raise RegexError(f"the quantifier {{{body}}} in {self.s!r} has its bounds reversed")
        return bounds

    def atom(self) -> tuple:
        ch = self.take()
        if ch == "(":
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.s.startswith("?<", self.i) and self.s[self.i + 2 : self.i + 3] not in ("=", "!"):
                self.i = self.s.index(">", self.i) + 1  # a named group
            elif self.peek() == "?":
                raise RegexError(f"lookaround in {self.s!r} is not supported")
            self.depth += 1
            if self.depth > MAX_GROUP_DEPTH:
                raise RegexError(f"groups nest deeper than {MAX_GROUP_DEPTH} levels")
            inner = self.alternation()
            self.depth -= 1
            if self.take() != ")":
                raise RegexError(f"unbalanced parenthesis in {self.s!r}")
            return inner
        if ch == "[":
            return ("set", self.char_class())
        if ch == ".":
            return ("set", _ALL - _LINE_END)
        if ch == "^":
            return ("bol",)
        if ch == "$":
            return ("eol",)
        if ch == "\\":
            return ("set", self.escape(in_class=False))
        if ch == ")":
            raise RegexError(f"unbalanced parenthesis in {self.s!r}")
        if ch in "*+?":
            raise RegexError(f"nothing to repeat in {self.s!r}")
        return ("set", _literal(ch))

    def escape(self, in_class: bool) -> frozenset[int]:
        """The characters of an escape; _PARTIAL in it: some non-ASCII characters (not all)."""
        ch = self.take()
        classes = {"d": _DIGIT, "w": _WORD, "D": _ALL - _DIGIT, "W": _ALL - _WORD}
        if ch in classes:
            return frozenset(classes[ch])
        if ch == "S":  # some non-ASCII characters are spaces
            return _ALL - _SPACE - {NON_ASCII} | {_PARTIAL}
        if ch == "s":
            return _SPACE | {_PARTIAL}
        controls = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "0": 0}
        if ch in controls:
            return frozenset({controls[ch]})
        if ch == "b" and in_class:
            return frozenset({8})
        if ch in "xu":
            digits = 2 if ch == "x" else 4
            code = self.s[self.i : self.i + digits]
            if len(code) == digits and all(c in "0123456789abcdefABCDEF" for c in code):
                self.i += digits
                return _literal(chr(int(code, 16)))
            return _literal(ch)
        if ch.isdigit() or ch in "bBpPk":
            raise RegexError(f"'\\{ch}' in {self.s!r} is not supported")
        return _literal(ch)

    def char_class(self) -> frozenset[int]:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        members: set[int] = set()
        first = True
        while True:
            ch = self.take()
            if ch == "]" and not first:
                break
            first = False
            start = self.escape(in_class=True) if ch == "\\" else _literal(ch)
            if self.peek() == "-" and self.s[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                end_ch = self.take()
                end = self.escape(in_class=True) if end_ch == "\\" else _literal(end_ch)
                low, high = _single(start, self.s), _single(end, self.s)
                if low > high:
                    raise RegexError(f"the range in {self.s!r} is reversed")
                members.update(range(low, min(high, 127) + 1))
                if high > 127:
                    members.add(_PARTIAL)
                continue
            members.update(start)
        if NON_ASCII in members:  # all non-ASCII characters: a partial set among them adds nothing
            members.discard(_PARTIAL)
        if negate:
            out = _ALL - members
            return out - {NON_ASCII} if _PARTIAL in members else out
        return frozenset(members)


def _literal(ch: str) -> frozenset[int]:
    code = ord(ch)
    if code >= 128:  # one particular non-ASCII character: never written (see the module docstring)
        return frozenset({_PARTIAL})
    return frozenset({code})


def _single(members: frozenset[int], source: str) -> int:
    if len(members) != 1:
        raise RegexError(f"a class escape as a range end in {source!r}")
    (code,) = members
    return 128 if code == _PARTIAL else code  # a non-ASCII range end: the range reaches past ASCII


# --- NFA and DFA --------------------------------------------------------------------------------------


class _Nfa:
    def __init__(self) -> None:
        self.edges: list[list[tuple[frozenset[int] | None, int]]] = []  # None: an empty move
        self.sink = -1  # the state after an unanchored match: any characters, all accepted

    def state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise RegexError(f"the pattern needs more than {MAX_NFA_STATES} NFA states")
        self.edges.append([])
        return len(self.edges) - 1

    @classmethod
    def build(cls, sources: tuple[str, ...]) -> tuple[int, int, _Nfa]:
        options: list[tuple] = []
        for source in sources:
            parser = _Parser(source)
            tree = parser.alternation()
            if parser.i != len(source):
                raise RegexError(f"unbalanced parenthesis in {source!r}")
            options.extend(_top_options(tree))
        source = " | ".join(sources)
        nfa = cls()
        start, accept = nfa.state(), nfa.state()
        # After a match that is not anchored at the end anything may follow: one state for all of that,
        # so that a search for many words does not multiply states (see _determinize).
        nfa.sink = nfa.state()
        nfa.edges[nfa.sink] += [(_ALL, nfa.sink), (None, accept)]
        anything = ("rep", ("set", _ALL), 0, None)
        for option in options:
            items = list(option[1]) if option[0] == "cat" else [option]
            anchored_start = bool(items) and items[0] == ("bol",)
            anchored_end = bool(items) and items[-1] == ("eol",)
            items = items[1 if anchored_start else 0 : len(items) - 1 if anchored_end else len(items)]
            if any(_has_anchor(item) for item in items):
                raise RegexError(f"'^' or '$' inside {source!r} (only at its start or end) is not supported")
            s, e = nfa.fragment(("cat", [*([] if anchored_start else [anything]), *items]))
            nfa.edges[start].append((None, s))
            nfa.edges[e].append((None, accept if anchored_end else nfa.sink))
        return start, accept, nfa

    def fragment(self, node: tuple) -> tuple[int, int]:
        kind = node[0]
        start = self.state()
        if kind == "set":
            end = self.state()
            symbols = frozenset(c for c in node[1] if c != _PARTIAL)
            if symbols:
                self.edges[start].append((symbols, end))
            return start, end
        if kind == "cat":
            end = start
            for item in node[1]:
                s, e = self.fragment(item)
                self.edges[end].append((None, s))
                end = e
            return start, end
        if kind == "alt":
            end = self.state()
            for item in node[1]:
                s, e = self.fragment(item)
                self.edges[start].append((None, s))
                self.edges[e].append((None, end))
            return start, end
        _, inner, low, high = node  # rep
        end = start
        for _ in range(low):
            s, e = self.fragment(inner)
            self.edges[end].append((None, s))
            end = e
        if high is None:
            s, e = self.fragment(inner)
            self.edges[end].append((None, s))
            self.edges[e].append((None, s))
            out = self.state()
            self.edges[end].append((None, out))
            self.edges[e].append((None, out))
            return start, out
        out = self.state()
        self.edges[end].append((None, out))
        for _ in range(high - low):
            s, e = self.fragment(inner)
            self.edges[end].append((None, s))
            self.edges[e].append((None, out))
            end = e
        return start, out


def _top_options(tree: tuple) -> list[tuple]:
    """The alternatives of a pattern, looking into a group that is a whole alternative (`(^a$)|b`)."""
    if tree[0] == "alt":
        return [option for sub in tree[1] for option in _top_options(sub)]
    if tree[0] == "cat" and len(tree[1]) == 1 and tree[1][0][0] in ("alt", "cat"):
        return _top_options(tree[1][0])
    return [tree]


def _has_anchor(node: tuple) -> bool:
    if node[0] in ("bol", "eol"):
        return True
    if node[0] in ("cat", "alt"):
        return any(_has_anchor(n) for n in node[1])
    return node[0] == "rep" and _has_anchor(node[1])


def _determinize(nfa: _Nfa, start: int, accept: int) -> tuple[list[list[int]], list[bool]]:
    sets = {frozenset(s) for edges in nfa.edges for s, _ in edges if s is not None}
    classes: dict[tuple, list[int]] = {}  # symbols that no edge tells apart move together
    for c in range(_SYMBOLS):
        classes.setdefault(tuple(c in s for s in sets), []).append(c)

    def closure(states: frozenset[int]) -> frozenset[int]:
        out, todo = set(states), list(states)
        while todo:
            for symbols, target in nfa.edges[todo.pop()]:
                if symbols is None and target not in out:
                    out.add(target)
                    todo.append(target)
        if nfa.sink in out:  # whatever else is possible, every continuation matches: one state
            return frozenset({nfa.sink, accept})
        return frozenset(out)

    index = {closure(frozenset({start})): 0}
    order = list(index)
    table: list[list[int]] = []
    while len(table) < len(order):
        current = order[len(table)]
        row = [-1] * _SYMBOLS
        for members in classes.values():
            c = members[0]
            moved = frozenset(t for s in current for symbols, t in nfa.edges[s] if symbols is not None and c in symbols)
            if not moved:
                continue
            target = closure(moved)
            if target not in index:
                if len(order) >= MAX_REGEX_STATES:
                    raise RegexError(f"the pattern needs more than {MAX_REGEX_STATES} DFA states")
                index[target] = len(order)
                order.append(target)
            for member in members:
                row[member] = index[target]
        table.append(row)
    accepting = [accept in states for states in order]
    return _trim(table, accepting)


def _trim(table: list[list[int]], accepting: list[bool]) -> tuple[list[list[int]], list[bool]]:
    """Drop the states from which no match can be reached (moves into them become -1)."""
    live = {s for s, ok in enumerate(accepting) if ok}
    changed = True
    while changed:
        changed = False
        for s, row in enumerate(table):
            if s not in live and any(t in live for t in row):
                live.add(s)
                changed = True
    if 0 not in live:
        raise RegexError("the pattern matches no string")
    return [[t if t in live else -1 for t in row] for row in table], accepting


def _distances(table: list[list[int]], accepting: list[bool]) -> tuple[list[int], list[int]]:
    """Characters still needed to reach a match from each state: the fewest, and the most (-1: any
    number, the state reaches a cycle)."""
    big = _FAR
    successors = [sorted({t for t in row if t >= 0}) for row in table]
    shortest = [0 if ok else big for ok in accepting]
    changed = True
    while changed:
        changed = False
        for s, targets in enumerate(successors):
            best = min((shortest[t] + 1 for t in targets), default=big)
            if best < shortest[s]:
                shortest[s] = best
                changed = True
    # Peel states whose successors are all peeled: what remains reaches a cycle. Peeled states get
    # their longest path in peeling order (their successors are known by then).
    predecessors: list[list[int]] = [[] for _ in table]
    for s, targets in enumerate(successors):
        for t in targets:
            predecessors[t].append(s)
    waiting = [len(targets) for targets in successors]
    longest = [-1] * len(table)
    ready = [s for s, n in enumerate(waiting) if n == 0]
    while ready:
        s = ready.pop()
        longest[s] = max([0] * accepting[s] + [longest[t] + 1 for t in successors[s]])
        for p in predecessors[s]:
            waiting[p] -= 1
            if waiting[p] == 0:
                ready.append(p)
    return shortest, longest
