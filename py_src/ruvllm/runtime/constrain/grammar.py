"""Grammar: a compiled JSON grammar (nodes, root, literal prefix/suffix), which caches its automaton
for each vocabulary. `json_grammar` (schema.py) makes them.
"""

from __future__ import annotations

from .automaton import MAX_DFA_STATES, Automaton
from .parser import TEXT, VALUE, Rules, is_complete, read_byte
from .vocabulary import Vocabulary


class Grammar:
    """A compiled JSON grammar (from `json_grammar`): immutable; the automata built from it for each
    vocabulary are cached inside it, so a grammar kept for reuse keeps its masks."""

    def __init__(
        self, nodes: list, root: int, prefix: bytes, suffix: bytes, description: str, whitespace: bool = True
    ) -> None:
        self.rules = Rules(nodes, whitespace)
        self.root = root
        self.prefix = prefix
        self.suffix = suffix
        self.description = description
        self._automata: dict[Vocabulary, Automaton] = {}

    def __repr__(self) -> str:
        return f"Grammar({self.description}, prefix={self.prefix!r}, suffix={self.suffix!r})"

    @property
    def whitespace(self) -> bool:
        return self.rules.whitespace

    def initial_config(self) -> tuple:
        suffix = ((TEXT, self.suffix, 0),) if self.suffix else ()
        prefix = ((TEXT, self.prefix, 0),) if self.prefix else ()
        return (*suffix, (VALUE, self.root), *prefix)

    def accepts(self, node: int, text: bytes) -> bool:
        """Whether `text` is exactly a value of `node` (used to keep the enum values a schema allows)."""
        configs = {((VALUE, node),)}
        for b in text:
            configs = {c for config in configs for c in read_byte(self.rules, config, b)}
        return any(is_complete(self.rules, c) for c in configs)

    def automaton(self, vocabulary: Vocabulary) -> Automaton:
        automaton = self._automata.get(vocabulary)
        if automaton is None or len(automaton.states) > MAX_DFA_STATES:
            automaton = Automaton(self.rules, self.initial_config(), vocabulary)
            self._automata[vocabulary] = automaton
        return automaton
