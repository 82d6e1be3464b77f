"""Matcher: follows one generation over a grammar's automaton, giving the mask before each token and
reading the token after.

Dimension letters: V vocabulary size (the width of the logits).
"""

from __future__ import annotations

import numpy as np

from ...errors import InferenceError, InvalidArgumentError
from .grammar import Grammar
from .vocabulary import Vocabulary


class Matcher:
    """Follows one generation: `allowed()` before sampling, `advance(token)` after.

    complete: the output so far is a whole valid document (and suffix), so EOS is allowed; other tokens
    only if the document can also go on (a top-level number: `1` may become `12`). finished: complete,
    and nothing but EOS may follow (all tokens are disallowed if the vocabulary has no EOS: the caller
    stops on `complete` or `finished`).
    """

    def __init__(self, grammar: Grammar, vocabulary: Vocabulary) -> None:
        if not isinstance(grammar, Grammar):
            raise InvalidArgumentError(f"Matcher: grammar must be a Grammar (json_grammar), got {grammar!r}")
        if not isinstance(vocabulary, Vocabulary):
            raise InvalidArgumentError(f"Matcher: vocabulary must be a Vocabulary, got {vocabulary!r}")
        self.vocabulary = vocabulary
        self._automaton = grammar.automaton(vocabulary)
        self._state = self._automaton.initial
        self._tail = b""  # the last bytes written, for error messages
        self._ended = False  # EOS was read

    @property
    def complete(self) -> bool:
        return self._automaton.states[self._state].complete

    @property
    def finished(self) -> bool:
        state = self._automaton.states[self._state]
        return state.complete and all(config == () for config in state.configs)

    def allowed(self) -> np.ndarray:
        """(V,) bool: the tokens that keep the output a prefix of a valid document; when complete, EOS too."""
        if self.finished:
            return self.vocabulary.eos_mask.copy()  # (V,)
        allowed = self._automaton.mask(self._state)  # (V,)
        if self.complete:
            return allowed | self.vocabulary.eos_mask  # (V,)
        if not allowed.any():  # only with a vocabulary that cannot spell some byte (no byte fallback)
            raise InferenceError(f"constrained output: no token of the vocabulary can follow {self._tail!r}")
        return allowed

    def advance(self, token_id: int) -> None:
        """Read one token; InvalidArgumentError if it is not allowed here."""
        vocabulary = self.vocabulary
        if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < vocabulary.size:
            raise InvalidArgumentError(f"Matcher.advance: token id {token_id!r} is not in [0, {vocabulary.size})")
        token_id = int(token_id)
        if self._ended:
            raise InvalidArgumentError(f"Matcher.advance: token {token_id} after EOS")
        if vocabulary.eos_mask[token_id]:
            if not self.complete:
                raise self._refused(token_id, "EOS before the JSON document is complete")
            self._ended = True
            return
        if self.finished:
            raise self._refused(token_id, "the document is complete: only EOS may follow")
        if not vocabulary.eligible[token_id]:
            raise self._refused(token_id, "a special or empty token cannot be part of the JSON output")
        state = self._state
        for b in vocabulary.token_bytes[token_id]:
            state = self._automaton.transition(state, b)
            if state < 0:
                why = "only EOS may follow" if self.complete else "it cannot continue a valid document here"
                raise self._refused(token_id, why)
        self._state = state
        self._tail = (self._tail + vocabulary.token_bytes[token_id])[-40:]

    def _refused(self, token_id: int, why: str) -> InvalidArgumentError:
        data = self.vocabulary.token_bytes[token_id] if token_id < len(self.vocabulary.token_bytes) else b""
        return InvalidArgumentError(
            f"constrained output: token {token_id} ({data!r}) is not allowed after {self._tail!r}: {why}"
        )
