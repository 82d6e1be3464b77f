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
- `ResidualTap`: what `tap` holds (the residual stream tapped entering `tap_layer`); `grow`: a buffer made
  longer in blocks of STEP.

The caches: cache.KVCache (one sequence, hot and cold tiers) and paged.PagedSequence (a block table in
a pool shared by many sequences).

Dimension letters: K key/value heads, S cached positions, T new positions, E head size, H query heads,
B sequences, Q = G*T rows of queries per key/value head.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..quant.provider import AttentionProducts

STEP = 256  # buffers grow in blocks of this many positions
Empty = Callable[[tuple[int, ...], Any], np.ndarray]  # np.empty's shape and dtype: where buffers come from


class DenseSegment:
    """Float32 keys and values (K, S, E) at absolute `positions` (S,); `products` computes attention's
    products over them where a kernel provider offers that (None: NumPy)."""

    def __init__(
        self,
        keys: np.ndarray,
        values: np.ndarray,
        positions: np.ndarray,
        products: AttentionProducts | None = None,
    ) -> None:
        self.keys, self.values, self.positions = keys, values, positions
        self.products = products

    def scores(self, q: np.ndarray) -> np.ndarray:
        if self.products is not None:
            return self.products.scores(q, self.keys)  # (K, Q, S)
        return q @ self.keys.transpose(0, 2, 1)  # (K, Q, E) @ (K, E, S) -> (K, Q, S)

    def mix(self, probs: np.ndarray) -> np.ndarray:
        if self.products is not None:
            return self.products.mix(probs, self.values)  # (K, Q, E)
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


class WeightsIdentity(NamedTuple):
    """What the weights compute with (Engine.weights_identity): cached keys and values are tagged with
    it, and a generation pins it for all its steps."""

    merges: int  # adapters merged into the base weights so far (each merge changes every layer)
    adapter: str | None  # the active adapter's (or X-LoRA mixture's) name; None: the base weights
    uid: int  # that adapter object's id (a replaced adapter of the same name has another)
    version: int  # its version: every learning step bumps it


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

    layers: Sequence[LayerKV]  # one per decoder layer
    tokens: list[int]  # the ids of every position computed
    tap: ResidualTap | None = None  # the hidden states entering one layer, kept for learning; None: none kept
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


def grow(array: np.ndarray, needed: int, limit: int | None, axis: int, empty: Empty = np.empty) -> np.ndarray:
    """`array` with room for `needed` entries along `axis` (blocks of STEP), its contents kept; a new
    buffer comes from `empty` (np.empty, or a kernel memory's: model/plan.py)."""
    if needed <= array.shape[axis]:
        return array
    capacity = -(-needed // STEP) * STEP
    if limit is not None:
        capacity = min(capacity, max(limit, needed))
    shape = list(array.shape)
    shape[axis] = capacity
    new = empty(tuple(shape), array.dtype)
    index = [slice(None)] * array.ndim
    index[axis] = slice(0, array.shape[axis])
    new[tuple(index)] = array
    return new


class ResidualTap:
    """The hidden state entering decoder layer `layer` (the residual stream there), float32 (S, D), at
    every position 0..S-1 the cache has computed. Learning starts from it when its adapter sits at or
    above that layer (no forward through the layers below per step), and after such an adapter
    changed, only the layers from there up are recomputed from it (the keys and values below stay)."""

    def __init__(self, layer: int, hidden_size: int, max_positions: int | None, empty: Empty = np.empty) -> None:
        self.layer = layer
        self.empty = empty  # where the buffer comes from (kv.grow)
        self.values = empty((0, hidden_size), np.float32)  # (capacity, D)
        self.length = 0
        self.max_positions = max_positions

    def write(self, positions: np.ndarray, x: np.ndarray) -> None:
        """x (T, D) entering the layer at consecutive `positions` (T,) starting at or before `length`."""
        self.rows(int(positions[0]), int(positions[-1]) + 1)[:] = x

    def rows(self, start: int, end: int) -> np.ndarray:
        """The rows of positions start..end-1 (end - start, D), to be written now (the decode plan writes
        them itself), with room made and the length counting them."""
        assert start <= self.length, f"position {start} would leave a gap after {self.length}"
        self.values = grow(self.values, end, self.max_positions, 0, self.empty)
        self.length = max(self.length, end)  # rewriting held positions (a recompute) keeps the later ones
        return self.values[start:end]

    def read(self, stop: int) -> np.ndarray:
        """Positions 0..stop-1 (S, D)."""
        assert stop <= self.length
        return self.values[:stop]

    def truncate(self, position: int) -> None:
        self.length = min(self.length, position)
