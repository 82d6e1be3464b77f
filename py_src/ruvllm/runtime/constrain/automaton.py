"""The grammar as a lazy DFA over bytes for one vocabulary: interned parser states, their byte
transitions, and each state's mask of allowed tokens (walked over the vocabulary's byte tries).

Dimension letters: V vocabulary size (the width of the logits).
"""

from __future__ import annotations

import threading

import numpy as np

from .parser import (
    KEY,
    KIND,
    NODE,
    OBJECT,
    OBJECT_KEY,
    PATTERN,
    PATTERN_REGEX,
    PHASE,
    S_CONTENT,
    STRING,
    STRING_CHARS,
    Rules,
    as_undeclared,
    is_complete,
    keys_of,
    read_byte,
    readable_bytes,
)
from .pattern_tokens import PatternTokens
from .regex import Regex
from .vocabulary import Trie, Vocabulary

MAX_DFA_STATES = 200_000  # a grammar's cached automaton is started afresh past this many states


class _State:
    __slots__ = ("complete", "configs", "mask", "next", "readable", "via")

    def __init__(self, configs: frozenset, complete: bool, readable: bytes) -> None:
        self.configs = configs
        self.complete = complete
        self.readable = readable  # [b]: 1 if byte b may be readable (0: surely not)
        self.next: dict[int, int] = {}  # byte -> index of the next state (-1: the byte is not allowed)
        self.mask: np.ndarray | None = None  # packed bits of allowed() once computed
        # a key being written: (the bytes of its key trie that may follow, the state that reads every other
        # byte the same way, its undeclared key's); (): none; None: not found yet
        self.via: tuple | None = None


class Automaton:
    """The grammar as a DFA over bytes, built lazily as generation visits it, with each state's mask.

    Transitions hold state indexes, not states: no reference cycles, so an automaton is freed as soon as
    its grammar is, without waiting for the garbage collector.
    """

    def __init__(self, rules: Rules, initial: tuple, vocabulary: Vocabulary) -> None:
        self.rules = rules
        self.vocabulary = vocabulary
        self.states: list[_State] = []
        self.index: dict[frozenset, int] = {}
        self.tables: dict[int, bytes] = {}  # 256-bit set -> its table of 256 bytes 0/1
        self.patterns: dict[Regex, PatternTokens] = {}
        self.lock = threading.Lock()  # matchers of one grammar may run in several threads
        self.initial = self.intern(frozenset([initial]))

    def intern(self, configs: frozenset) -> int:
        i = self.index.get(configs)
        if i is not None:
            return i
        with self.lock:
            i = self.index.get(configs)
            if i is not None:
                return i
            rules = self.rules
            complete = any(is_complete(rules, c) for c in configs)
            bits = 0
            for config in configs:
                bits |= readable_bytes(rules, config)
            table = self.tables.get(bits)
            if table is None:
                packed = np.frombuffer(bits.to_bytes(32, "little"), np.uint8)  # (32,)
                table = self.tables[bits] = np.unpackbits(packed, bitorder="little").tobytes()
            self.states.append(_State(configs, complete, table))
            i = self.index[configs] = len(self.states) - 1
            return i

    def transition(self, i: int, b: int) -> int:
        """The state after byte b in state i (-1: b is not allowed)."""
        state = self.states[i]
        following = state.next.get(b)
        if following is None:
            via = state.via
            if via is None:
                via = state.via = self._via(state)
            if via and b not in via[0]:  # out of the key trie: as the undeclared key's state, which is shared
                following = state.next[b] = self.transition(via[1], b)
            else:
                configs = frozenset(c for config in state.configs for c in read_byte(self.rules, config, b))
                following = state.next[b] = self.intern(configs) if configs else -1
        return following

    def _via(self, state: _State) -> tuple:
        """state.via: each key prefix is a state of its own, whose masks walk many bytes out of the key
        trie; those lead where they lead from the undeclared key's state, whose transitions are kept."""
        if len(state.configs) != 1:
            return ()
        (config,) = state.configs
        if not config or config[-1][KIND] != OBJECT or config[-1][PHASE] != KEY:
            return ()
        undeclared = as_undeclared(self.rules, config)
        if undeclared is None:
            return ()
        top = config[-1]
        return (keys_of(self.rules, top[NODE]).children[top[OBJECT_KEY]], self.intern(frozenset([undeclared])))

    def mask(self, i: int) -> np.ndarray:
        """(V,) bool: the tokens allowed in state i (EOS excluded; see Matcher.allowed)."""
        size = self.vocabulary.size
        state = self.states[i]
        if state.mask is None:
            if len(state.configs) == 1:
                (config,) = state.configs
                same = self._same_mask(config)
                if same is not None:  # share the mask of that state (the packed array itself)
                    j = self.intern(frozenset([same]))
                    self.mask(j)
                    shared = self.states[j].mask
                    assert shared is not None  # self.mask(j) has just computed it
                    state.mask = shared
                    return np.unpackbits(shared, count=size).view(bool)  # (V,)
                allowed = self._config_mask(i, config)  # (V,)
            else:  # a token is allowed if one of the configurations allows it
                allowed = np.zeros(size, bool)  # (V,)
                for config in state.configs:
                    allowed |= self.mask(self.intern(frozenset([config])))
            state.mask = np.packbits(allowed)  # (ceil(V / 8),) uint8
        return np.unpackbits(state.mask, count=size).view(bool)  # (V,)

    def _same_mask(self, config: tuple) -> tuple | None:
        """Another configuration with the same mask as `config`, that the counts of a string share: the
        string's minimum length, while no token is long enough to reach the maximum length from here
        (the parser then reads every token the same way at any such count); None: none.

        A pattern's length checks also look ahead by the characters its regex still needs (at most the
        largest finite `shortest`), so its counts share a mask that much further from the maximum.
        """
        if not config:
            return None
        top = config[-1]
        if top[KIND] not in (STRING, PATTERN) or top[PHASE] != S_CONTENT:
            return None
        spec = self.rules.nodes[top[NODE]]
        count = top[STRING_CHARS]
        if spec.max_length < 0 or count == spec.min_length:  # unbounded: counts are capped at the minimum
            return None
        last = spec.max_length - self.vocabulary.max_token_bytes  # a token has at most that many characters
        if spec.pattern is not None:
            last -= spec.pattern.farthest
        if not spec.min_length <= count <= last:
            return None
        return (*config[:-1], (*top[:STRING_CHARS], spec.min_length, *top[STRING_CHARS + 1 :]))

    def walked_mask(self, i: int) -> np.ndarray:
        """(V,) bool: the mask of state i by the plain walk of the whole trie, without the shortcuts of
        `mask` (which must give exactly this; the tests compare them)."""
        found: list[tuple[int, ...]] = []
        for config in self.states[i].configs:
            if config:
                self._walk(self.vocabulary.trie, self.intern(frozenset([config])), found)
        allowed = np.zeros(self.vocabulary.size, bool)  # (V,)
        allowed[[token for ids in found for token in ids]] = True
        return allowed

    def _config_mask(self, i: int, config: tuple) -> np.ndarray:
        vocabulary = self.vocabulary
        found: list[tuple[int, ...]] = []
        if not config:  # complete: no token continues it (Matcher.allowed gives EOS)
            return np.zeros(vocabulary.size, bool)  # (V,)
        top = config[-1]
        if top[KIND] == STRING and top[PHASE] == S_CONTENT:  # plain text tokens all at once, then the others
            spec = self.rules.nodes[top[NODE]]
            count = top[STRING_CHARS]
            room = spec.max_length - count if spec.max_length >= 0 else vocabulary.max_plain_chars
            allowed = vocabulary.plain_chars <= room  # (V,)
            for chars, trie in enumerate(vocabulary.rest_tries[: room + 1]):
                head = (STRING, top[NODE], S_CONTENT, min(count + chars, spec.cap), 0)
                self._walk(trie, self.intern(frozenset([(*config[:-1], head)])), found)
        elif top[KIND] == PATTERN and top[PHASE] == S_CONTENT:
            allowed = self._pattern_mask(i, config, found)
        elif top[KIND] == OBJECT and top[PHASE] == KEY and self._free_key(config):
            # a key that may become an undeclared one: plain text fits wherever it leads (a declared
            # key's prefix, or a free string), so only the other tokens are walked
            allowed = vocabulary.plain_mask.copy()  # (V,)
            self._walk(vocabulary.other_trie, i, found)
        else:
            allowed = np.zeros(vocabulary.size, bool)  # (V,)
            self._walk(vocabulary.trie, i, found)
        if found:
            allowed[[token for ids in found for token in ids]] = True
        return allowed

    def _pattern_mask(self, i: int, config: tuple, found: list) -> np.ndarray:
        """(V,) the plain tokens a patterned string can read in state i (config), all at once; the others
        go to `found` as the parser reads them (those starting with plain characters from the state the
        characters lead to)."""
        vocabulary = self.vocabulary
        top = config[-1]
        n, count, r = top[NODE], top[STRING_CHARS], top[PATTERN_REGEX]
        spec = self.rules.nodes[n]
        tokens = self.patterns.get(spec.pattern)
        if tokens is None:
            tokens = self.patterns[spec.pattern] = PatternTokens(spec.pattern, vocabulary)
        ok, final = tokens.reachable(spec, count, r)  # (K + 1,)
        if vocabulary.rest_tries:
            self._walk(vocabulary.rest_tries[0], i, found)  # tokens that start with a quote, a backslash, ...
        for token, chars, node, rest in tokens.others:
            if ok[node]:
                head = (PATTERN, n, S_CONTENT, min(count + chars, spec.cap), 0, int(final[node]))
                s = self.intern(frozenset([(*config[:-1], head)]))
                for b in rest:
                    s = self.transition(s, b)
                    if s < 0:
                        break
                else:
                    found.append((token,))
        return ok[tokens.token_node]  # (V,)

    def _free_key(self, config: tuple) -> bool:
        """Whether any plain text may follow the key so far of the object frame on top of `config` (in
        its key phase): an undeclared key may come, and its string, unbounded and without a pattern, is
        between characters (not in an escape, nor inside a UTF-8 character)."""
        undeclared = as_undeclared(self.rules, config)
        if undeclared is None:
            return False
        string = undeclared[-1]
        return string[KIND] == STRING and string[PHASE] == S_CONTENT and self.rules.nodes[string[NODE]].max_length < 0

    def _walk(self, trie: Trie, i: int, found: list) -> None:
        """Depth-first over the trie and the DFA together; collects the ids of tokens that can be read."""
        first, labels, ends, states = trie.first, trie.labels, trie.ends, self.states
        todo = [(0, i)]
        while todo:
            node, i = todo.pop()
            state = states[i]
            following, readable = state.next, state.readable
            child = first[node]
            for b in labels[node]:
                if readable[b]:
                    s = following.get(b)
                    if s is None:
                        s = self.transition(i, b)
                    if s >= 0:
                        if ends[child] is not None:
                            found.append(ends[child])
                        if labels[child]:
                            todo.append((child, s))
                child += 1
