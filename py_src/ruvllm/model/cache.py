"""The key/value cache: preallocated buffers written in place, in up to two tiers per layer.

- `HotTier`: the newest positions in float32, exactly as computed.
- `ColdTier` (when `KVOptions.hot_tokens` is set): older positions, moved over in batches and stored
  as int8 or packed int4 codes with one float32 scale per (head, position): x = scale * code.
- A byte budget (`KVOptions.budget_bytes`): after each forward call, `KVCache.keep_within_budget`
  drops the oldest cold positions past it, except the first `keep` positions (attention sinks), so
  generation never stops for lack of room. Dropped positions stay in `tokens` (the history), so a
  follow-up prompt can still reuse the cache for its prefix.

With `hot_tokens` unset (the default) everything stays hot and the cache is a plain KV cache.

Attention reads a layer's cache as segments (cold, then hot; kv.py), each with its absolute positions,
`scores` and `mix`. `KVCache` is a `kv.Cache` (the interface the forward uses), each `LayerCache` a
`kv.LayerKV`.

Dimension letters: K key/value heads, S cached positions, T new positions, E head size, Q = G*T rows
of queries per key/value head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ContextFullError, InvalidArgumentError
from ..quant.kvcodes import KVCodes
from ..quant.provider import AttentionProducts
from .config import ModelConfig
from .kv import Cache, DenseSegment, Empty, LayerKV, QuantSegment, ResidualTap, WeightsIdentity, grow

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


class HotTier:
    """The newest positions, float32 as computed: keys and values (K, capacity, E) and their absolute
    positions (capacity,); the first `length` are in use. Keys and values are allocated by `empty` (the
    decode plan's kernel memory, where the plan writes them: model/plan.py)."""

    def __init__(
        self, kv_heads: int, head_dim: int, products: AttentionProducts | None = None, empty: Empty = np.empty
    ) -> None:
        self.products = products  # attention's products over these (a kernel provider's), or NumPy's
        self.empty = empty
        self.k = empty((kv_heads, 0, head_dim), np.float32)
        self.v = empty((kv_heads, 0, head_dim), np.float32)
        self.positions = np.empty(0, np.int64)
        self.length = 0

    def reserve(self, count: int, limit: int | None) -> None:
        """Room for `count` more positions (the buffers grow in blocks of STEP, at most to `limit`)."""
        needed = self.length + count
        self.k, self.v = grow(self.k, needed, limit, 1, self.empty), grow(self.v, needed, limit, 1, self.empty)
        self.positions = grow(self.positions, needed, limit, 0)

    def append(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> None:
        """Store k, v (K, T, E) at `positions` (T,) after the positions held (room must be reserved)."""
        end = self.length + k.shape[1]
        self.k[:, self.length : end], self.v[:, self.length : end] = k, v
        self.occupy(positions)

    def occupy(self, positions: np.ndarray) -> None:
        """Count the slots after those held as positions (T,), their keys and values written there."""
        end = self.length + len(positions)
        self.positions[self.length : end] = positions
        self.length = end

    def take_oldest(self, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Remove the `count` oldest positions; returns their keys, values (K, count, E) and positions."""
        taken = self.k[:, :count].copy(), self.v[:, :count].copy(), self.positions[:count].copy()
        rest = self.length - count  # the rest moves to the front
        self.k[:, :rest], self.v[:, :rest] = self.k[:, count : self.length], self.v[:, count : self.length]
        self.positions[:rest] = self.positions[count : self.length].copy()
        self.length = rest
        return taken

    def truncate(self, position: int) -> None:
        """Forget every position >= `position`."""
        self.length = int(np.searchsorted(self.positions[: self.length], position))

    def segment(self) -> DenseSegment:
        n = self.length  # (np.asarray: a kernel pool's buffers are read into the heap; views of NumPy's stay views)
        return DenseSegment(np.asarray(self.k[:, :n]), np.asarray(self.v[:, :n]), self.positions[:n], self.products)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class ColdTier:
    """Older positions as integer codes with one float32 scale per (head, position): x = scale * code.
    Codes are int8 (K, capacity, E), or for int4 two per byte (K, capacity, E/2) in the weights' nibble
    order; the first `length` positions are in use, at `positions` (int32: the decode plan reads them).
    Its buffers come from `empty` (as HotTier's)."""

    def __init__(self, kv_heads: int, head_dim: int, bits: int, empty: Empty = np.empty) -> None:
        self.codes = KVCodes(bits)
        self.empty = empty
        width = self.codes.width(head_dim)
        self.k_codes = empty((kv_heads, 0, width), self.codes.dtype)
        self.v_codes = empty((kv_heads, 0, width), self.codes.dtype)
        self.k_scales = empty((kv_heads, 0), np.float32)
        self.v_scales = empty((kv_heads, 0), np.float32)
        self.positions = empty((0,), np.int32)
        self.length = 0
        self.dropped = 0  # positions evicted over the cache's life

    def append(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> None:
        """Quantize k, v (K, T, E) and store them at `positions` (T,) after the positions held."""
        k_codes, k_scales = self.codes.quantize(k)  # (K, T, width), (K, T): per (head, position)
        v_codes, v_scales = self.codes.quantize(v)
        start, end = self.length, self.length + k.shape[1]
        for name in ("k_codes", "v_codes", "k_scales", "v_scales"):
            setattr(self, name, grow(getattr(self, name), end, None, 1, self.empty))
        self.positions = grow(self.positions, end, None, 0, self.empty)
        self.k_codes[:, start:end], self.k_scales[:, start:end] = k_codes, k_scales
        self.v_codes[:, start:end], self.v_scales[:, start:end] = v_codes, v_scales
        self.positions[start:end] = positions
        self.length = end

    def drop_oldest(self, count: int, keep: int) -> int:
        """Drop up to `count` of the oldest positions after the first `keep` (the attention sinks);
        returns how many went."""
        first = int(np.searchsorted(self.positions[: self.length], keep))  # the sinks held here
        count = min(count, self.length - first)
        if count <= 0:
            return 0
        n, rest = self.length, slice(first + count, self.length)
        for array in (self.k_codes, self.v_codes, self.k_scales, self.v_scales):
            array[:, first : n - count] = array[:, rest].copy()
        self.positions[first : n - count] = self.positions[rest].copy()
        self.length -= count
        self.dropped += count
        return count

    def truncate(self, position: int) -> None:
        """Forget every position >= `position`."""
        self.length = int(np.searchsorted(self.positions[: self.length], position))

    def segment(self) -> QuantSegment:
        n = self.length
        k, v = self.codes.unpack(np.asarray(self.k_codes[:, :n])), self.codes.unpack(np.asarray(self.v_codes[:, :n]))
        k_scales, v_scales, positions = (
            np.asarray(a) for a in (self.k_scales[:, :n], self.v_scales[:, :n], self.positions[:n])
        )
        return QuantSegment(k, k_scales, v, v_scales, positions)  # (k, v: (K, S, E))

    @property
    def nbytes(self) -> int:
        return self.k_codes.nbytes + self.v_codes.nbytes + self.k_scales.nbytes + self.v_scales.nbytes


class LayerCache(LayerKV):
    """One layer's keys and values: a hot tier, and a cold tier when `KVOptions.hot_tokens` is set."""

    def __init__(
        self,
        kv_heads: int,
        head_dim: int,
        max_positions: int | None,
        options: KVOptions,
        products: AttentionProducts | None = None,
        empty: Empty = np.empty,
    ) -> None:
        self.options = options
        self.max_positions = max_positions  # hot + cold positions at most (None: bounded by the budget)
        self.hot = HotTier(kv_heads, head_dim, products, empty)
        self.cold = ColdTier(kv_heads, head_dim, COLD_FORMATS[options.cold], empty) if options.hot_tokens else None

    @property
    def length(self) -> int:
        return self.hot.length + (self.cold.length if self.cold else 0)

    def reserve(self, positions: int) -> None:
        """Room for `positions` more hot entries (a whole prefill chunk, or decoding steps)."""
        total = self.length + positions
        if self.max_positions is not None and total > self.max_positions:
            raise ContextFullError(f"{total} positions do not fit the context window of {self.max_positions}")
        limit = self.max_positions
        if self.options.hot_tokens is not None:
            limit = self.options.hot_tokens + self.options.migrate_batch + positions
        self.hot.reserve(positions, limit)

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> list:
        """Store k, v (K, T, E) at absolute `positions` (T,), then return the segments attention reads:
        cold (quantized) then hot, in position order."""
        self.migrate()
        self.reserve(k.shape[1])
        self.hot.append(k, v, positions)
        if self.cold is not None and self.cold.length:
            return [self.cold.segment(), self.hot.segment()]
        return [self.hot.segment()]

    def migrate(self) -> None:
        """Before new positions are written: once the hot tier holds a migration batch past `hot_tokens`,
        its oldest go to the cold tier (so it stays bounded)."""
        hot = self.options.hot_tokens
        if hot is not None and self.cold is not None and self.hot.length >= hot + self.options.migrate_batch:
            self.cold.append(*self.hot.take_oldest(self.hot.length - hot))

    def truncate(self, position: int) -> None:
        """Forget every entry at an absolute position >= `position` (rewinding for prefix reuse)."""
        self.hot.truncate(position)
        if self.cold is not None:
            self.cold.truncate(position)

    @property
    def nbytes(self) -> int:
        return self.hot.nbytes + (self.cold.nbytes if self.cold else 0)


class KVCache(Cache):
    """One `LayerCache` per layer, plus `tokens`: the ids of every position the cache has seen, and
    with `tap_layer` the hidden states entering that layer (`tap`, ResidualTap)."""

    layers: list[LayerCache]

    def __init__(
        self,
        config: ModelConfig,
        max_positions: int | None,
        options: KVOptions | None = None,
        tap_layer: int | None = None,
        products: AttentionProducts | None = None,
        empty: Empty = np.empty,
    ) -> None:
        """products: attention's products over the float32 tier (a kernel provider's; None: NumPy);
        empty: where the tiers' and the tap's buffers come from (kv.grow)."""
        self.config = config
        self.options = options or KVOptions()
        self.max_positions = None if self.options.budget_bytes is not None else max_positions
        K, E = config.num_key_value_heads, config.head_dim
        self.layers = [
            LayerCache(K, E, self.max_positions, self.options, products, empty) for _ in range(config.num_hidden_layers)
        ]
        self.tokens: list[int] = []
        self.owner: WeightsIdentity | None = None  # the weights_identity() the entries were computed with
        self.tap = None if tap_layer is None else ResidualTap(tap_layer, config.hidden_size, self.max_positions, empty)

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
        if self.tap is not None:
            self.tap.truncate(position)
        del self.tokens[position:]

    def forget_layers(self, first: int) -> None:
        """Empty the layers from `first` up (to recompute them); the others and `tokens` stay."""
        for layer in self.layers[first:]:
            layer.truncate(0)

    def record(self, tokens: list[int] | np.ndarray) -> None:
        """Note the ids of positions just computed."""
        self.tokens.extend(int(t) for t in tokens)

    def keep_within_budget(self) -> None:
        """Drop the oldest cold positions (never the first `keep`) while the cache is over its byte
        budget, at least a migration batch at a time."""
        budget = self.options.budget_bytes
        if budget is None:
            return
        layer = self.layers[0]
        assert layer.cold is not None  # (a budget needs hot_tokens, so every layer has a cold tier)
        per_position = self.options.cold_bytes_per_position(self.config)
        hot = layer.hot.length * self.options.hot_bytes_per_position(self.config)
        over = hot + layer.cold.length * per_position - budget
        if over > 0:
            count = max(-(-over // per_position), self.options.migrate_batch)
            for each in self.layers:
                assert each.cold is not None
                each.cold.drop_oldest(count, self.options.keep)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def stats(self) -> dict:
        """Positions and bytes per tier (bytes in use, not the preallocated capacity)."""
        layer = self.layers[0]
        cold = layer.cold.length if layer.cold else 0
        return {
            "hot_positions": layer.hot.length,
            "hot_bytes": layer.hot.length * self.options.hot_bytes_per_position(self.config),
            "cold_positions": cold,
            "cold_bytes": cold * self.options.cold_bytes_per_position(self.config),
            "cold_format": self.options.cold,
            "evicted_positions": layer.cold.dropped if layer.cold else 0,
            "seen_positions": len(self.tokens),
        }
