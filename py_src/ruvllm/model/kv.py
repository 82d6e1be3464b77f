"""What the forward asks of a KV cache: one interface every cache implements, and the segments attention
reads (as mlx-lm's `_BaseCache`: the forward never asks which cache it holds).

- `Cache`: a sequence's cache. `layers[i].update_and_fetch` stores layer i's new keys and values and
  returns what attention reads; `tokens` are the ids of every position computed; `reserve`, `record`,
  `truncate` and `keep_within_budget` frame each forward call. Two capabilities are stated here, not
  probed with `hasattr`: `batched_decode` (`decode_attention` serves many sequences reading one token
  each in one product) and `tap` (hidden states kept entering one layer, for learning; None without).
- `LayerKV`: one layer's share of a cache.
- `DenseSegment`, `QuantSegment`: a run of cached positions, float32 or integer codes, each with its
  `scores` and `mix`.

The caches: cache.KVCache (one sequence, hot and cold tiers) and paged.PagedSequence (a block table in
a pool shared by many sequences).

Dimension letters: K key/value heads, S cached positions, T new positions, E head size, H query heads,
B sequences, Q = G*T rows of queries per key/value head.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .cache import Residuals


class DenseSegment:
    """Float32 keys and values (K, S, E) at absolute `positions` (S,)."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, positions: np.ndarray) -> None:
        self.keys, self.values, self.positions = keys, values, positions

    def scores(self, q: np.ndarray) -> np.ndarray:
        return q @ self.keys.transpose(0, 2, 1)  # (K, Q, E) @ (K, E, S) -> (K, Q, S)

    def mix(self, probs: np.ndarray) -> np.ndarray:
        return probs @ self.values  # (K, Q, S) @ (K, S, E) -> (K, Q, E)


class QuantSegment:
    """Keys and values as integer codes (K, S, E) int8 with scales (K, S): x = scale * code."""

    def __init__(self, k_codes, k_scales, v_codes, v_scales, positions) -> None:
        self.k_codes, self.k_scales = k_codes, k_scales
        self.v_codes, self.v_scales = v_codes, v_scales
        self.positions = positions

    def scores(self, q: np.ndarray) -> np.ndarray:
        raw = np.einsum("kqe,kse->kqs", q, self.k_codes)  # (K, Q, S)
        return raw * self.k_scales[:, None, :]

    def mix(self, probs: np.ndarray) -> np.ndarray:
        return np.einsum("kqs,kse->kqe", probs * self.v_scales[:, None, :], self.v_codes)  # (K, Q, E)


Segment = DenseSegment | QuantSegment


class LayerKV(ABC):
    """One decoder layer's keys and values in a cache."""

    @abstractmethod
    def update_and_fetch(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> list[Segment]:
        """Store k, v (K, T, E) at absolute `positions` (T,), then return the segments attention reads,
        in position order (every position up to the last one written)."""


class Cache(ABC):
    """A sequence's KV cache, as the forward uses it (forward.hidden_batch): `reserve` room, then every
    layer's `update_and_fetch`, then `record` the ids and `keep_within_budget`. A forward starting before
    `len(tokens)` first `truncate`s there."""

    layers: list[LayerKV]  # one per decoder layer
    tokens: list[int]  # the ids of every position computed
    tap: Residuals | None = None  # the hidden states entering one layer, kept for learning; None: none kept
    batched_decode: bool = False  # whether `decode_attention` serves many sequences at once

    @abstractmethod
    def reserve(self, positions: int) -> None:
        """Room for `positions` more positions (raises ContextFullError past the context window)."""

    @abstractmethod
    def record(self, tokens: list[int] | np.ndarray) -> None:
        """Note the ids of positions just computed."""

    @abstractmethod
    def truncate(self, position: int) -> None:
        """Forget every position >= `position` (rewinding for prefix reuse), or raise a RuvLLMError that
        says why this cache cannot."""

    def keep_within_budget(self) -> None:  # noqa: B027 (a default, not a method to fill in)
        """After a forward call: drop what a byte budget requires (nothing, unless a cache has one)."""

    def decode_attention(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, caches: list[Cache], layer: int, window: int | None
    ) -> np.ndarray:
        """With `batched_decode`: attention of B caches of the same kind (this one among them) reading one
        new token each, q (H, B, E), k and v (K, B, E); stores k and v, returns (B, H*E)."""
        raise NotImplementedError(f"{type(self).__name__} has no batched decode attention")
