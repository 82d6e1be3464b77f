"""The key/value cache: preallocated buffers written in place, in up to two tiers per layer.

- Hot tier: the newest positions in float32, exactly as computed.
- Cold tier (when `KVOptions.hot_tokens` is set): older positions, moved over in batches and stored
  as int8 or packed int4 codes with one float32 scale per (head, position): x = scale * code.
- A byte budget (`KVOptions.budget_bytes`): once the cache would exceed it, the oldest cold positions
  are dropped, except the first `keep` positions (attention sinks), so generation never stops for lack
  of room. Dropped positions stay in `tokens` (the history), so a follow-up prompt can still reuse the
  cache for its prefix.

With `hot_tokens` unset (the default) everything stays hot and the cache is a plain KV cache.

Attention reads a layer's cache as segments (cold, then hot), each with its absolute positions.

Dimension letters: K key/value heads, S cached positions, T new positions, E head size, Q = G*T rows
of queries per key/value head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ContextFullError, InvalidArgumentError
from ..files.formats import pack_nibbles, quantize_symmetric, unpack_nibbles
from .config import ModelConfig

STEP = 256  # buffers grow in blocks of this many positions
COLD_FORMATS = {"int8": 8, "int4": 4}


@dataclass(frozen=True)
class KVOptions:
    hot_tokens: int | None = None  # newest positions kept in float32; None keeps all (a plain cache)
    cold: str = "int8"  # storage of older positions: "int8" or "int4"
    budget_bytes: int | None = None  # cap for the whole cache; past it the oldest cold positions go
    keep: int = 4  # first positions never dropped (attention sinks)
    migrate_batch: int = 64  # positions moved from hot to cold at a time

    def __post_init__(self) -> None:
        def positive(name: str, value: object, allow_none: bool = True, minimum: int = 1) -> None:
            if value is None and allow_none:
                return
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")

        positive("hot_tokens", self.hot_tokens)
        positive("budget_bytes", self.budget_bytes)
        positive("keep", self.keep, allow_none=False, minimum=0)
        positive("migrate_batch", self.migrate_batch, allow_none=False)
        if self.cold not in COLD_FORMATS:
            raise InvalidArgumentError(f"cold must be one of {', '.join(COLD_FORMATS)}, got {self.cold!r}")
        if self.budget_bytes is not None and self.hot_tokens is None:
            raise InvalidArgumentError("a KV budget needs hot_tokens: only cold positions can be dropped")

    def hot_bytes_per_position(self, config: ModelConfig) -> int:
        return config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2 * 4

    def cold_bytes_per_position(self, config: ModelConfig) -> int:
        code_bytes = config.head_dim * COLD_FORMATS[self.cold] // 8
        return config.num_hidden_layers * config.num_key_value_heads * (code_bytes + 4) * 2


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


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """(K, S, E) codes in [-8, 7] -> (K, S, E/2) bytes: stored + 8, in the weights' nibble order."""
    return pack_nibbles((codes + np.int8(8)).view(np.uint8))


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_int4: int8 codes (K, S, E)."""
    return unpack_nibbles(packed).view(np.int8) - np.int8(8)


def _grow(array: np.ndarray, needed: int, limit: int | None, axis: int) -> np.ndarray:
    """`array` with room for `needed` entries along `axis` (blocks of STEP), its contents kept."""
    if needed <= array.shape[axis]:
        return array
    capacity = -(-needed // STEP) * STEP
    if limit is not None:
        capacity = min(capacity, max(limit, needed))
    shape = list(array.shape)
    shape[axis] = capacity
    new = np.empty(shape, dtype=array.dtype)
    index = [slice(None)] * array.ndim
    index[axis] = slice(0, array.shape[axis])
    new[tuple(index)] = array
    return new


class LayerCache:
    def __init__(self, kv_heads: int, head_dim: int, max_positions: int | None, options: KVOptions) -> None:
        self.options = options
        self.bits = COLD_FORMATS[options.cold]
        self.max_positions = max_positions  # hot + cold entries at most (None: bounded by the budget)
        K, E = kv_heads, head_dim
        self.hot_k = np.empty((K, 0, E), np.float32)  # (K, capacity, E)
        self.hot_v = np.empty((K, 0, E), np.float32)
        self.hot_pos = np.empty(0, np.int64)
        self.hot_len = 0
        code_width = E if self.bits == 8 else E // 2
        code_dtype = np.int8 if self.bits == 8 else np.uint8
        self.cold_k = np.empty((K, 0, code_width), code_dtype)  # (K, capacity, E or E/2)
        self.cold_v = np.empty((K, 0, code_width), code_dtype)
        self.cold_ks = np.empty((K, 0), np.float32)  # (K, capacity) scales
        self.cold_vs = np.empty((K, 0), np.float32)
        self.cold_pos = np.empty(0, np.int64)
        self.cold_len = 0
        self.evicted = 0

    @property
    def length(self) -> int:
        return self.hot_len + self.cold_len

    def reserve(self, positions: int) -> None:
        """Room for `positions` more hot entries (a whole prefill chunk, or decoding steps)."""
        needed = self.hot_len + positions
        if self.max_positions is not None and self.cold_len + needed > self.max_positions:
            raise ContextFullError(
                f"{self.cold_len + needed} positions do not fit the context window of {self.max_positions}"
            )
        hot_limit = self.max_positions
        if self.options.hot_tokens is not None:
            hot_limit = self.options.hot_tokens + self.options.migrate_batch + positions
        self.hot_k = _grow(self.hot_k, needed, hot_limit, 1)
        self.hot_v = _grow(self.hot_v, needed, hot_limit, 1)
        self.hot_pos = _grow(self.hot_pos, needed, hot_limit, 0)

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> list:
        """Store k, v (K, T, E) at absolute `positions` (T,), then return the segments attention reads."""
        T = k.shape[1]
        hot = self.options.hot_tokens
        if hot is not None and self.hot_len >= hot + self.options.migrate_batch:
            self._migrate(self.hot_len - hot)  # before writing: the hot tier never holds more than hot + batch + T
        self.reserve(T)
        end = self.hot_len + T
        self.hot_k[:, self.hot_len : end] = k
        self.hot_v[:, self.hot_len : end] = v
        self.hot_pos[self.hot_len : end] = positions
        self.hot_len = end
        segments = []
        if self.cold_len:
            segments.append(self._cold_segment())
        segments.append(
            DenseSegment(self.hot_k[:, : self.hot_len], self.hot_v[:, : self.hot_len], self.hot_pos[: self.hot_len])
        )
        return segments

    def _cold_segment(self) -> QuantSegment:
        n = self.cold_len
        k, v = self.cold_k[:, :n], self.cold_v[:, :n]
        if self.bits == 4:
            k, v = unpack_int4(k), unpack_int4(v)
        return QuantSegment(k, self.cold_ks[:, :n], v, self.cold_vs[:, :n], self.cold_pos[:n])

    def _migrate(self, count: int) -> None:
        """Move the `count` oldest hot positions into the cold tier."""
        k_codes, k_scales = quantize_symmetric(self.hot_k[:, :count], self.bits)  # per (head, position)
        v_codes, v_scales = quantize_symmetric(self.hot_v[:, :count], self.bits)
        if self.bits == 4:
            k_codes, v_codes = pack_int4(k_codes), pack_int4(v_codes)
        start, end = self.cold_len, self.cold_len + count
        for name, data in (("cold_k", k_codes), ("cold_v", v_codes), ("cold_ks", k_scales), ("cold_vs", v_scales)):
            array = _grow(getattr(self, name), end, None, 1)
            array[:, start:end] = data
            setattr(self, name, array)
        self.cold_pos = _grow(self.cold_pos, end, None, 0)
        self.cold_pos[start:end] = self.hot_pos[:count]
        self.cold_len = end
        remaining = self.hot_len - count  # shift the rest of the hot tier to the front
        for array in (self.hot_k, self.hot_v):
            array[:, :remaining] = array[:, count : self.hot_len].copy()
        self.hot_pos[:remaining] = self.hot_pos[count : self.hot_len].copy()
        self.hot_len = remaining

    def evict(self, count: int) -> int:
        """Drop up to `count` of the oldest cold positions after the first `keep`; returns how many went."""
        keep = int(np.searchsorted(self.cold_pos[: self.cold_len], self.options.keep))  # sinks in the cold tier
        count = min(count, self.cold_len - keep)
        if count <= 0:
            return 0
        n = self.cold_len
        for name in ("cold_k", "cold_v", "cold_ks", "cold_vs"):
            array = getattr(self, name)
            array[:, keep : n - count] = array[:, keep + count : n].copy()
        self.cold_pos[keep : n - count] = self.cold_pos[keep + count : n].copy()
        self.cold_len -= count
        self.evicted += count
        return count

    def truncate(self, position: int) -> None:
        """Forget every entry at an absolute position >= `position` (rewinding for prefix reuse)."""
        self.hot_len = int(np.searchsorted(self.hot_pos[: self.hot_len], position))
        self.cold_len = int(np.searchsorted(self.cold_pos[: self.cold_len], position))

    @property
    def hot_nbytes(self) -> int:
        return self.hot_k.nbytes + self.hot_v.nbytes

    @property
    def cold_nbytes(self) -> int:
        return sum(a.nbytes for a in (self.cold_k, self.cold_v, self.cold_ks, self.cold_vs))


class KVCache:
    """One `LayerCache` per layer, plus `tokens`: the ids of every position the cache has seen."""

    def __init__(self, config: ModelConfig, max_positions: int | None, options: KVOptions | None = None) -> None:
        self.config = config
        self.options = options or KVOptions()
        self.max_positions = None if self.options.budget_bytes is not None else max_positions
        self.layers = [
            LayerCache(config.num_key_value_heads, config.head_dim, self.max_positions, self.options)
            for _ in range(config.num_hidden_layers)
        ]
        self.tokens: list[int] = []
        self.owner: tuple | None = None  # the weights_identity() the entries were computed with

    @property
    def length(self) -> int:
        """Entries held (after any were dropped)."""
        return self.layers[0].length

    def reserve(self, positions: int) -> None:
        for layer in self.layers:
            layer.reserve(positions)

    def reset(self) -> None:
        self.truncate(0)

    def truncate(self, position: int) -> None:
        for layer in self.layers:
            layer.truncate(position)
        del self.tokens[position:]

    def record(self, tokens: list[int] | np.ndarray) -> None:
        """Note the ids of positions just computed, then keep within the byte budget."""
        self.tokens.extend(int(t) for t in tokens)
        budget = self.options.budget_bytes
        if budget is None:
            return
        layer = self.layers[0]
        per_position = self.options.cold_bytes_per_position(self.config)
        hot = layer.hot_len * self.options.hot_bytes_per_position(self.config)
        over = hot + layer.cold_len * per_position - budget
        if over > 0:
            count = max(-(-over // per_position), self.options.migrate_batch)
            for each in self.layers:
                each.evict(count)

    @property
    def nbytes(self) -> int:
        return sum(layer.hot_nbytes + layer.cold_nbytes for layer in self.layers)

    def stats(self) -> dict:
        """Positions and bytes per tier (bytes in use, not the preallocated capacity)."""
        layer = self.layers[0]
        hot = layer.hot_len * self.options.hot_bytes_per_position(self.config)
        cold = layer.cold_len * self.options.cold_bytes_per_position(self.config)
        return {
            "hot_positions": layer.hot_len,
            "hot_bytes": hot,
            "cold_positions": layer.cold_len,
            "cold_bytes": cold,
            "cold_format": self.options.cold,
            "evicted_positions": layer.evicted,
            "seen_positions": len(self.tokens),
        }
