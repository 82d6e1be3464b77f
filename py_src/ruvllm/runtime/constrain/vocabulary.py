"""The model's vocabulary for constrained decoding: each token's bytes, byte tries of them, and the
token classes the masks use (eligible tokens, EOS, plain string text with its character counts, and a
trie of the plain text's characters for patterned strings).

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
# Bytes that string text can read after a whole character: printable ASCII (with `"` and `\`) and UTF-8
# lead bytes. A token that goes on with another byte (a control byte, a stray continuation byte) there is
# never allowed, so the tries of what follows plain text leave it out.
_AFTER_CHARACTER = frozenset(range(0x20, 0x80)) | frozenset(range(0xC2, 0xF5))


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
        heads: list[tuple[bytes, int]] = []  # (plain head, characters in it) of every eligible token
        rests: list[
            list[tuple[bytes, int]]
        ] = []  # rests[k]: (what follows, id) of tokens with k plain characters first
        for i, data in enumerate(self.token_bytes):
            if not data or i in special or self.eos_mask[i]:
                continue
            self.eligible[i] = True
            tokens.append((data, i))
            head, chars = _plain_head(data)
            heads.append((data[:head], chars))
            if head == len(data):
                self.plain_chars[i] = chars
            elif data[head] in _AFTER_CHARACTER:
                rests.extend([] for _ in range(chars + 1 - len(rests)))
                rests[chars].append((data[head:], i))
        self.trie = Trie(tokens)
        self.rest_tries = [Trie(pairs) for pairs in rests]
        # the tokens that are not plain text but may go on string text (their first byte can follow a character)
        self.other_trie = Trie(
            [(data, i) for data, i in tokens if self.plain_chars[i] == _NOT_PLAIN and data[0] in _AFTER_CHARACTER]
        )
        self.plain_mask = self.plain_chars != _NOT_PLAIN  # (V,)
        self.max_plain_chars = int(self.plain_chars[self.plain_mask].max(initial=0))
        self.max_token_bytes = max((len(data) for data, _ in tokens), default=0)
        self.char_trie = _CharTrie([head for head, _ in heads], [chars for _, chars in heads])
        ids = np.array([i for _, i in tokens], np.int64)  # (E,)
        nodes = self.char_trie.head_nodes  # (E,) the trie node of each eligible token's plain head
        # (V,) the node of each plain token; the others point one past the last node (never allowed)
        self.plain_node = np.full(size, self.char_trie.nodes, np.int32)
        plain = self.plain_mask[ids]  # (E,)
        self.plain_node[ids[plain]] = nodes[plain]
        # the tokens that are not plain text but start with some: (id, characters, head node, the rest)
        self.headed_others = [
            (i, chars, int(node), data[len(head) :])
            for (data, i), (head, chars), node in zip(tokens, heads, nodes, strict=True)
            if chars > 0 and len(head) < len(data) and data[len(head)] in _AFTER_CHARACTER
        ]
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


class Trie:
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


class _CharTrie:
    """A trie of the tokens' plain heads by characters, not bytes, for running a pattern's DFA over them
    with NumPy. A character is a symbol of regex.py's alphabet: its code if ASCII, else NON_ASCII (128).

    Level k holds the nodes k characters deep, numbered in a row from offsets[k] (the root, level 0,
    is node 0; offsets[-1] = nodes, how many there are): parents[k - 1][j] is the parent of node
    offsets[k] + j (an index within level k - 1), symbols[k - 1][j] the symbol that leads to it.
    head_nodes[e]: the node of the e-th head.
    """

    def __init__(self, heads: Sequence[bytes], chars: Sequence[int]) -> None:
        lengths = np.array(chars, np.int64)  # (E,)
        data = np.frombuffer(b"".join(heads), np.uint8)  # the heads are whole UTF-8 characters
        starts = (data < 0x80) | (data >= 0xC0)  # the first byte of each character
        symbols = np.where(data < 0x80, data, 128)[starts].astype(np.int64)  # (N,) one per character
        counts = lengths.astype(np.intp)  # (repeat and bincount take intp: int32 in Pyodide's wasm32)
        owner = np.repeat(np.arange(len(lengths)), counts)  # (N,) the head of each character
        depth = np.arange(len(symbols)) - np.repeat(np.cumsum(lengths) - lengths, counts)  # (N,) 0-based
        order = np.argsort(depth, kind="stable")  # characters by depth, each depth in head order
        bounds = np.cumsum(np.bincount(depth.astype(np.intp), minlength=1))  # (L,) end of each depth in `order`
        node = np.zeros(len(lengths), np.int64)  # (E,) each head's node within the level reached so far
        self.parents: list[np.ndarray] = []
        self.symbols: list[np.ndarray] = []
        self.offsets = [0, 1]
        for k in range(len(bounds) if len(symbols) else 0):
            at = order[bounds[k - 1] if k else 0 : bounds[k]]  # the characters at depth k
            heads_at = owner[at]
            keys, inverse = np.unique(node[heads_at] * 129 + symbols[at], return_inverse=True)
            self.parents.append((keys // 129).astype(np.int32))
            self.symbols.append((keys % 129).astype(np.int32))
            self.offsets.append(self.offsets[-1] + len(keys))
            node[heads_at] = inverse.reshape(-1)
        self.nodes = self.offsets[-1]  # how many nodes there are
        self.head_nodes = np.array(self.offsets)[lengths] + node  # (E,)


def _plain_head(data: bytes) -> tuple[int, int]:
    """(bytes, characters) of the longest head of `data` made of whole plain string characters."""
    special = _SPECIAL_IN_STRING.search(data)
    head = data if special is None else data[: special.start()]
    try:
        return len(head), len(head.decode("utf-8"))
    except UnicodeDecodeError as e:  # a broken or unfinished character: the head stops before it
        return e.start, len(head[: e.start].decode("utf-8"))
