"""A constraint that starts where the model opens it (OpenAI's tool_choice "auto": the model may answer
or call): free text until the model writes a trigger (a tag such as `<tool_call>`), then one document of
a grammar up to its end, then free text again (for text, or the trigger once more).

Dimension letters: V vocabulary size (the width of the logits).
"""

from __future__ import annotations

import numpy as np

from .closing import Budgeted, closing_tokens
from .grammar import Grammar
from .vocabulary import Vocabulary


class Triggered:
    """Free text until `trigger` is written, then `grammar`'s document (which ends with its own closing,
    e.g. "\\n</tool_call>"), then free text. `budget`: the tokens generation may take (default: no
    bound); a document is closed within it, and none is opened (no token holding the trigger's first
    byte is written) when the tokens left cannot hold the trigger and the shortest document."""

    def __init__(self, grammar: Grammar, vocabulary: Vocabulary, trigger: str, budget: int = 1 << 30) -> None:
        self.grammar = grammar
        self.vocabulary = vocabulary
        self.trigger = trigger.encode()
        self.free = np.ones(vocabulary.size, dtype=bool)  # (V,)
        self.tail = b""  # the last bytes written, to see the trigger
        self.document: Budgeted | None = None
        self.left = budget
        self.shortest: int | None = None  # tokens: the trigger, the shortest document, EOS
        self.no_trigger = np.zeros(0, bool)  # (V,) tokens without the trigger's first byte (made with shortest)

    def allowed(self) -> np.ndarray:
        if self.document is not None and self.document.complete:  # the document is closed: free text again
            self.document = None
        if self.document is not None:
            return self.document.allowed()
        if self.shortest is None:
            document = Budgeted(self.grammar, self.vocabulary, self.left)
            self.shortest = closing_tokens(self.vocabulary, self.trigger)[0] + document.reserve(document.state)
            first = self.trigger[:1]
            self.no_trigger = np.zeros(self.vocabulary.size, bool)  # (V,)
            self.no_trigger[: len(self.vocabulary.token_bytes)] = [first not in t for t in self.vocabulary.token_bytes]
        if self.left - 1 < self.shortest and not self.tail:
            return self.free & self.no_trigger
        return self.free

    def advance(self, token_id: int) -> None:
        self.left -= 1
        if self.document is not None and not self.document.complete:
            self.document.advance(token_id)
            return
        self.document = None
        self.tail = (self.tail + self.vocabulary.token_bytes[token_id])[-len(self.trigger) :]
        if self.tail.endswith(self.trigger):
            self.document, self.tail = Budgeted(self.grammar, self.vocabulary, self.left), b""
        elif not any(self.tail.endswith(self.trigger[:k]) for k in range(1, len(self.trigger))):
            self.tail = b""  # no part of the trigger is open

    @property
    def complete(self) -> bool:
        return False  # the model ends its reply itself
