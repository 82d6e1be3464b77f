"""The key/value cache: one preallocated buffer per layer, written in place, never concatenated.

Dimension letters: K key/value heads, S cached positions, T new positions, E head size.
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .errors import ContextFullError

STEP = 256  # capacity grows in blocks of this many positions, up to the context length


class LayerCache:
    def __init__(self, kv_heads: int, head_dim: int, max_positions: int, dtype: np.dtype = np.float32) -> None:
        self.max_positions = max_positions
        self.keys = np.empty((kv_heads, 0, head_dim), dtype=dtype)  # (K, capacity, E)
        self.values = np.empty((kv_heads, 0, head_dim), dtype=dtype)  # (K, capacity, E)
        self.offset = 0  # positions [0, offset) hold valid entries

    def reserve(self, positions: int) -> None:
        """Make room for `positions` entries (rounded up to STEP, capped at the context length)."""
        if positions > self.max_positions:
            raise ContextFullError(f"{positions} positions do not fit the context window of {self.max_positions}")
        if positions <= self.keys.shape[1]:
            return
        capacity = min(self.max_positions, -(-positions // STEP) * STEP)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = np.empty((old.shape[0], capacity, old.shape[2]), dtype=old.dtype)  # (K, capacity, E)
            new[:, : self.offset] = old[:, : self.offset]
            setattr(self, name, new)

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Store k, v (K, T, E) at positions start.., return every valid entry (K, start+T, E).

        `start` may be below `offset` (rewinding discards what came after); it may not leave a gap.
        """
        assert start <= self.offset, f"cache write at {start} would leave a gap after {self.offset}"
        end = start + k.shape[1]
        self.reserve(end)
        self.keys[:, start:end] = k
        self.values[:, start:end] = v
        self.offset = end
        return self.keys[:, :end], self.values[:, :end]  # (K, S, E) each

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class KVCache:
    """One `LayerCache` per layer; `length` is how many positions the model has seen."""

    def __init__(self, config: ModelConfig, max_positions: int, dtype: np.dtype = np.float32) -> None:
        self.max_positions = max_positions
        self.layers = [
            LayerCache(config.num_key_value_heads, config.head_dim, max_positions, dtype)
            for _ in range(config.num_hidden_layers)
        ]

    @property
    def length(self) -> int:
        return self.layers[0].offset

    def reserve(self, positions: int) -> None:
        for layer in self.layers:
            layer.reserve(positions)

    def reset(self) -> None:
        for layer in self.layers:
            layer.offset = 0

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)
