"""Which tokens a patterned string can read, for any state of its regex: the regex's DFA run with NumPy
over the vocabulary's trie of plain characters (Vocabulary.char_trie), instead of stepping the parser
through the whole byte trie for each new regex state.

Built once per regex and vocabulary (automaton.py keeps them). The characters of the regex's alphabet
fall into classes that no DFA state tells apart (`^[0-9a-f]{24}$`: hex digits and the rest); the trie
is folded by class, and a branch whose class no state reads is cut, so the trie run per regex state is
small. Exact: a token is allowed iff reading it character by character the parser would allow it (see
`reachable` for why checking the lengths at its last character is enough).

Dimension letters: V vocabulary size, K nodes of the class trie (+ 1: the dead node, last).
"""

from __future__ import annotations

import numpy as np

from .nodes import String
from .regex import Regex
from .vocabulary import Vocabulary


class PatternTokens:
    """The class trie of one regex over one vocabulary's plain heads, and the regex state each class
    node leads to from any regex state (computed when first asked, then kept).

    token_node[t]: the class node of plain token t (the dead node for other tokens and dead paths).
    others: (id, characters, class node, rest) of the tokens that start with plain characters and go
    on with something else (a quote, a backslash, an unfinished character): the rest is the parser's.
    """

    def __init__(self, regex: Regex, vocabulary: Vocabulary) -> None:
        trie = vocabulary.char_trie
        moves = np.array(regex.next, np.int64).reshape(-1, 129)  # (R, 129) -1: no match can follow
        self.dead = len(moves)
        columns, classes = np.unique(moves.T, axis=0, return_inverse=True)  # (C, R), (129,)
        classes = classes.reshape(-1)
        count = len(columns)
        # (C,) a class some state reads. NumPy's stubs type any(axis=...) as np.bool | ndarray whatever the
        # array's rank; over axis 1 of a 2-D array it is always a 1-D array
        readable: np.ndarray = (columns >= 0).any(axis=1)  # type: ignore[assignment]
        rows = np.where(columns.T < 0, self.dead, columns.T)  # (R, C)
        self.table = np.vstack([rows, np.full((1, count), self.dead)]).astype(np.int16)  # (R + 1, C)
        self.parents: list[np.ndarray] = []  # per level, as in _CharTrie
        self.classes: list[np.ndarray] = []
        offsets = [0, 1]
        node = np.zeros(1, np.int64)  # the class node of each character-trie node of the level above; -1 dead
        to_class = [node]  # per level: character-trie node -> class node (global; -1: dead)
        for parents, symbols in zip(trie.parents, trie.symbols, strict=True):
            above, symbol_class = node[parents], classes[symbols]
            live = (above >= 0) & readable[symbol_class]
            keys, inverse = np.unique(above[live] * count + symbol_class[live], return_inverse=True)
            if not len(keys):
                break
            self.parents.append(keys // count - (offsets[-2]))
            self.classes.append(keys % count)
            node = np.full(len(parents), -1, np.int64)
            node[live] = offsets[-1] + inverse.reshape(-1)
            to_class.append(node)
            offsets.append(offsets[-1] + len(keys))
        self.nodes = offsets[-1]
        mapping = np.concatenate(to_class)  # (character-trie nodes so far,)
        mapping = np.concatenate([mapping, np.full(trie.nodes + 1 - len(mapping), -1)])  # deeper ones: dead
        mapping[mapping < 0] = self.nodes
        self.token_node = mapping[vocabulary.plain_node]  # (V,)
        self.others = [(i, chars, int(mapping[node]), rest) for i, chars, node, rest in vocabulary.headed_others]
        per_level = np.diff(offsets).astype(np.intp)  # (np.repeat takes intp: int32 in Pyodide's wasm32)
        self.depth = np.append(np.repeat(np.arange(len(offsets) - 1), per_level), 0)  # (K + 1,) characters
        self.shortest = np.array([*regex.shortest, 0], np.int64)  # (R + 1,)
        self.longest = np.array([*regex.longest, -1], np.int64)  # (R + 1,)
        self._finals: dict[int, np.ndarray] = {}

    def finals(self, r: int) -> np.ndarray:
        """(K + 1,) int16: the regex state after the characters of each class node, from state r."""
        out = self._finals.get(r)
        if out is None:
            states = np.array([r], np.int16)  # (1,) the root
            levels = [states]
            for parents, classes in zip(self.parents, self.classes, strict=True):
                states = self.table[states[parents], classes]  # (level nodes,)
                levels.append(states)
                if (states == self.dead).all():  # and so are all the deeper ones
                    break
            left = self.nodes + 1 - sum(len(level) for level in levels)
            out = self._finals[r] = np.concatenate([*levels, np.full(left, self.dead, np.int16)])
        return out

    def reachable(self, spec: String, count: int, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(K + 1,) bool: whether the characters of each class node can be read by a patterned string of
        `spec` with `count` characters so far in regex state r; and the regex states they lead to.

        The parser checks the lengths at every character (parser._pattern_next): `count + j +
        shortest[r_j] <= max_length` never decreases along a path (shortest[r_j] <= 1 + shortest[r_j+1]),
        and `count + j + longest[r_j] >= min_length` never increases while longest is finite (and once
        it is not, it is not before either): the last character's check implies all the others.
        """
        final = self.finals(r)  # (K + 1,)
        ok = final != self.dead  # (K + 1,)
        chars = count + self.depth  # (K + 1,)
        if spec.max_length >= 0:
            ok &= chars + self.shortest[final] <= spec.max_length
        if spec.min_length > 0:
            longest = self.longest[final]  # (K + 1,)
            ok &= (longest < 0) | (chars + longest >= spec.min_length)
        return ok, final
