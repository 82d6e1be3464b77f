"""Byte-pair encoding of one pre-tokenized piece, as the `BPE` model of a tokenizer.json does it.

The piece starts as one symbol per character (a character missing from the vocabulary becomes its UTF-8
bytes as `<0xNN>` tokens with `byte_fallback`, else the unknown token, fused with its unknown neighbours
with `fuse_unk`). Then, as in `tokenizers` (models/bpe/word.rs), the adjacent pair with the lowest merge
rank is merged, the leftmost one among equals, until no pair is a merge. A short piece keeps the ranks of
its pairs in a list and finds the lowest with `min` (C speed); a long one uses a heap, so a piece of n
symbols costs O(n log n) and not O(n^2).

Results are cached per piece: text is mostly the same few thousand words.

A SentencePiece vocabulary (Gemma) has no pre-tokenizer that splits words: its whole text is one piece.
Such a piece is first cut before each `▁` that no merge can join to the character in front of it (no
token of the vocabulary holds that character followed by `▁`; found once, at load): the parts merge
exactly as the whole would, and they are short and cacheable.
"""

from __future__ import annotations

import heapq
import itertools
import re

from ..errors import LoadError

_NO_MERGE = 1 << 62  # the rank of a pair that is not a merge
_SHORT = 48  # symbols: up to this many, the list and `min`; above, the heap
_CACHE_SIZE, _CACHED_LENGTH = 50_000, 256  # pieces, characters
_SPACE = "\u2581"


class BPE:
    def __init__(self, model: dict, source: str) -> None:
        where = f"{source}: model"
        vocab, merges = model.get("vocab"), model.get("merges")
        if not isinstance(vocab, dict) or not (
            set(map(type, vocab.values())) <= {int} or all(isinstance(i, int) for i in vocab.values())
        ):
            raise LoadError(f"{where}.vocab must be an object of token -> id")
        if not isinstance(merges, list):
            raise LoadError(f"{where}.merges must be a list")
        for name in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(name):
                raise LoadError(f"{where}.{name} is not supported without the `tokenizers` package")
        self.vocab: dict[str, int] = vocab
        self.source = source
        try:
            if merges and isinstance(merges[0], str):  # the older format: "left right"
                pairs = [tuple(m.split(" ")) for m in merges]
            else:
                pairs = list(map(tuple, merges))
        except (TypeError, AttributeError):
            raise LoadError(f"{where}.merges must hold 'left right' strings or [left, right] pairs") from None
        if not set(map(len, pairs)) <= {2}:  # (at C speed: Gemma has half a million)
            bad = next(m for m, p in zip(merges, pairs, strict=True) if len(p) != 2)
            raise LoadError(f"{where}.merges: {bad!r} is not a pair of tokens")
        ranks = dict(zip(pairs, range(len(pairs)), strict=True))  # a repeated pair: its last rank
        if model.get("merges_by_position") and not pairs:
            self._rank = self._rank_by_position
        else:
            self._rank = lambda left, right: ranks.get((left, right), _NO_MERGE)
        self.unk = model.get("unk_token")
        if self.unk is not None and self.unk not in vocab:
            raise LoadError(f"{where}.unk_token {self.unk!r} is not in model.vocab")
        self.fuse_unk = bool(model.get("fuse_unk", False))
        self.byte_fallback = bool(model.get("byte_fallback", False))
        self.ignore_merges = bool(model.get("ignore_merges", False))
        self._cache: dict[str, list[int]] = {}
        self._outside_joins = False  # a byte or unknown token may join a `▁` after it
        self._cuts = self._cut_pattern()

    def tokenize(self, piece: str) -> list[int]:
        """The ids of one pre-tokenized piece."""
        if self.ignore_merges and piece in self.vocab:
            return [self.vocab[piece]]
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        if self._cuts is not None and _SPACE in piece[1:]:
            return self._remember(piece, [i for part in self._cut(piece) for i in self._merged_ids(part)])
        return self._merged_ids(piece)

    def _merged_ids(self, piece: str) -> list[int]:
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        symbols = self._symbols(piece)
        merged = self._merge_short(symbols) if len(symbols) <= _SHORT else self._merge_long(symbols)
        try:
            ids = [self.vocab[s] for s in merged]
        except KeyError as e:
            raise LoadError(f"{self.source}: a merge makes {e.args[0]!r}, which is not in model.vocab") from None
        return self._remember(piece, ids)

    def _remember(self, piece: str, ids: list[int]) -> list[int]:
        if len(piece) <= _CACHED_LENGTH:  # (as `tokenizers`: a long piece is rarely seen twice)
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()
            self._cache[piece] = ids
        return ids

    def _symbols(self, piece: str) -> list[str]:
        vocab = self.vocab
        if all(map(vocab.__contains__, piece)):
            return list(piece)
        symbols: list[str] = []
        unknown = False  # the last symbol is an unknown token that a next one may fuse with
        for char in piece:
            if char in vocab:
                symbols.append(char)
                unknown = False
                continue
            if self.byte_fallback:
                pieces = [f"<0x{b:02X}>" for b in char.encode("utf-8")]
                if all(p in vocab for p in pieces):
                    symbols += pieces
                    unknown = False
                    continue
            if self.unk is None:
                continue  # dropped, as `tokenizers` drops it (a byte-level vocabulary may lack a rare byte)
            if not (unknown and self.fuse_unk):
                symbols.append(self.unk)
            unknown = True
        return symbols

    def _rank_by_position(self, left: str, right: str) -> int:
        """Gemma's merges (files/gguf_vocab.py `merges_by_position`) without the list: every cut of a token
        into two tokens, ranked by the token's id, then by the longer left part. Both sides are symbols,
        so tokens already; the pair is a merge when what they make is one too."""
        made = self.vocab.get(left + right)
        return _NO_MERGE if made is None else (made << 16) - len(left)

    def _merge_short(self, symbols: list[str]) -> list[str]:
        rank = self._rank
        ranks = [rank(a, b) for a, b in itertools.pairwise(symbols)]
        while ranks:
            best = min(ranks)
            if best == _NO_MERGE:
                break
            i = ranks.index(best)  # the leftmost of the lowest rank
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
            del ranks[i]
            if i > 0:
                ranks[i - 1] = rank(symbols[i - 1], symbols[i])
            if i < len(ranks):
                ranks[i] = rank(symbols[i], symbols[i + 1])
        return symbols

    def _merge_long(self, symbols: list[str]) -> list[str]:
        """The same merges with a heap of (rank, position, merged text) and a linked list of symbols."""
        rank_of = self._rank
        n = len(symbols)
        live: list[str | None] = list(symbols)
        after, before = list(range(1, n + 1)), list(range(-1, n - 1))
        after[-1] = -1
        pairs = enumerate(itertools.pairwise(symbols))
        heap = [(r, i, a + b) for i, (a, b) in pairs if (r := rank_of(a, b)) != _NO_MERGE]
        heapq.heapify(heap)
        while heap:
            _, i, merged = heapq.heappop(heap)
            left, j = live[i], after[i]
            if left is None or j < 0:
                continue
            right = live[j]
            assert right is not None
            if len(left) + len(right) != len(merged) or left + right != merged:
                continue  # stale: one side has grown since this pair was queued
            live[i], live[j] = merged, None
            k = after[i] = after[j]
            if k >= 0:
                before[k] = i
                following = live[k]
                assert following is not None
                if (rank := rank_of(merged, following)) != _NO_MERGE:
                    heapq.heappush(heap, (rank, i, merged + following))
            p = before[i]
            if p >= 0:
                previous = live[p]
                assert previous is not None
                if (rank := rank_of(previous, merged)) != _NO_MERGE:
                    heapq.heappush(heap, (rank, p, previous + merged))
        return [s for s in live if s is not None]

    # --- cutting a SentencePiece text before its spaces ---

    def _cut_pattern(self) -> re.Pattern[str] | None:
        """Where a piece may be cut: before a `▁` after a character that no token joins to it."""
        if _SPACE not in self.vocab:
            return None
        # Every character that a token holds in front of a `▁`, found in one pass over all tokens (the
        # separator NUL is never cut after, in case a token holds one).
        joined = "\0".join(self.vocab)
        before = {part[-1] for part in joined.split(_SPACE)[:-1] if part} | {"\0"}
        # A character outside the vocabulary turns into `<0xNN>` or the unknown token: its last character.
        self._outside_joins = ">" in before or (self.unk is not None and self.unk[-1:] in before)
        excluded = "".join(sorted(before | {_SPACE}))
        return re.compile(f"(?<=[^{re.escape(excluded)}])(?={_SPACE})")

    def _cut(self, piece: str) -> list[str]:
        assert self._cuts is not None
        parts = self._cuts.split(piece)
        if not self._outside_joins:
            return parts
        joined = [parts[0]]
        for part in parts[1:]:
            if joined[-1][-1] in self.vocab:
                joined.append(part)
            else:
                joined[-1] += part  # a byte or unknown token in front could join the `▁`
        return joined
