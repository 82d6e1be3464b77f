"""The model's vocabulary for constrained decoding: each token's bytes, byte tries of them, and the
token classes the masks use (eligible tokens, EOS, plain string text with its character counts).

Built once per tokenizer (and EOS ids); every grammar's automaton reads the same Vocabulary.
Dimension letters: V vocabulary size (the width of the logits).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence

import numpy as np

from ...errors import InvalidArgumentError

_SPECIAL_IN_STRING = re.compile(rb'[\x00-\x1f"\\]')  # bytes that end plain string text
_NOT_PLAIN = np.iinfo(np.int32).max


class Vocabulary:
    """The model's tokens as bytes, prepared once per tokenizer (tries / token classes).

    token_bytes: the bytes each id decodes to (`Tokenizer.token_bytes`). size: the model's vocabulary
    size, the width of the logits (ids >= len(token_bytes) are never allowed). special_ids: never
    allowed inside constrained output. eos_ids: allowed only when the document is complete.
    `build_seconds`: the time this took (SmolLM2: ~0.3 s).
    """

    def __init__(
        self, token_bytes: Sequence[bytes], size: int, special_ids: Iterable[int], eos_ids: Iterable[int]
    ) -> None:
        started = time.perf_counter()
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise InvalidArgumentError(f"Vocabulary: size must be a positive integer, got {size!r}")
        self.size = size
        self.eos_ids = tuple(sorted({i for i in (_token_id(i, "eos_ids") for i in eos_ids) if 0 <= i < size}))
        special = {_token_id(i, "special_ids") for i in special_ids}
        self.token_bytes = [bytes(b) for b in token_bytes[:size]]
        self.eos_mask = np.zeros(size, bool)  # (V,)
        self.eos_mask[list(self.eos_ids)] = True
        self.eligible = np.zeros(size, bool)  # (V,) tokens that may appear inside the output
        self.plain_chars = np.full(size, _NOT_PLAIN, np.int32)  # (V,) characters of plain-text tokens
        tokens: list[tuple[bytes, int]] = []  # (bytes, id) of every eligible token
        rests: list[
            list[tuple[bytes, int]]
        ] = []  # rests[k]: (what follows, id) of tokens with k plain characters first
        for i, data in enumerate(self.token_bytes):
            if not data or i in special or self.eos_mask[i]:
                continue
            self.eligible[i] = True
            tokens.append((data, i))
            head, chars = _plain_head(data)
            if head == len(data):
                self.plain_chars[i] = chars
            else:
                rests.extend([] for _ in range(chars + 1 - len(rests)))
                rests[chars].append((data[head:], i))
        self.trie = _Trie(tokens)
        self.rest_tries = [_Trie(pairs) for pairs in rests]
        self.other_trie = _Trie([(data, i) for data, i in tokens if self.plain_chars[i] == _NOT_PLAIN])
        self.plain_mask = self.plain_chars != _NOT_PLAIN  # (V,)
        self.max_plain_chars = int(self.plain_chars[self.plain_mask].max(initial=0))
        self.build_seconds = time.perf_counter() - started

    def __repr__(self) -> str:
        return (
            f"Vocabulary(size={self.size}, tokens={int(self.eligible.sum())}, "
            f"plain={int(self.plain_mask.sum())}, eos_ids={self.eos_ids})"
        )


def _token_id(value: object, where: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise InvalidArgumentError(f"Vocabulary: {where} must hold integer token ids, got {value!r}")
    return int(value)


class _Trie:
    """A byte trie of tokens in flat lists: the children of node n are first[n], first[n] + 1, ... with
    the bytes labels[n]; ends[n] holds the ids of the tokens spelled by the path to n. Node 0 is the root.

    Flat lists rather than a dict per node: 100k dicts would make each full garbage collection of the
    process walk them all (tens of milliseconds, in the middle of a generation).
    """

    def __init__(self, tokens: Sequence[tuple[bytes, int]]) -> None:
        nested: dict = {}  # while building: byte -> child dict, and None -> ids
        for data, token_id in tokens:
            node = nested
            for b in data:
                child = node.get(b)
                if child is None:
                    child = node[b] = {}
                node = child
            node[None] = (*node.get(None, ()), token_id)
        self.first: list[int] = []
        self.labels: list[bytes] = []
        self.ends: list[tuple[int, ...] | None] = []
        order = [nested]  # breadth first, so that the children of a node are numbered in a row
        for node in order:
            labels = bytes(sorted(b for b in node if b is not None))
            self.first.append(len(order))
            self.labels.append(labels)
            self.ends.append(node.get(None))
            order.extend(node[b] for b in labels)


def _plain_head(data: bytes) -> tuple[int, int]:
    """(bytes, characters) of the longest head of `data` made of whole plain string characters."""
    special = _SPECIAL_IN_STRING.search(data)
    head = data if special is None else data[: special.start()]
    try:
        return len(head), len(head.decode("utf-8"))
    except UnicodeDecodeError as e:  # a broken or unfinished character: the head stops before it
        return e.start, len(head[: e.start].decode("utf-8"))
