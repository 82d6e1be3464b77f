"""A paged KV cache for many sequences at once (continuous batching), with prefix sharing.

Keys and values of every sequence live in one pool of fixed-size blocks per layer (as in vLLM's
PagedAttention; the pool is blocks.py). A sequence holds a block table: its position p is at block
`table[p // B]`, row `p % B`. Blocks are counted by reference:

- A block is *full* once all B of its positions are computed; a full block is registered under its
  contents (the tokens it holds and the block before it), so a later sequence whose prompt starts with
  the same tokens takes the block as it is (read-only, shared): a common system prompt is computed
  once. Only a sequence's last, partly filled block is ever written, and it is never shared; it is
  also the only one a sequence can rewind (`truncate`).
- A block nobody holds any more stays registered until it is reused for other contents (least
  recently freed first), so the next request with that prefix still finds it.
- `BlockPool.reserve` counts blocks before a sequence starts: a sequence is admitted only when the
  blocks it may need (prompt + max_tokens) are free, so no step ever runs out of blocks mid-way.

With a cold format (the engine's `KVOptions`: `hot_tokens` and `cold`), blocks wholly older than a
sequence's newest `hot_tokens` positions are quantized, as the solo cache's cold tier does per position
(int8 or int4 codes with one float32 scale per head and position, quant/kvcodes.py): a block's float32
slot goes back to be reused (most recently freed first, so the memory the process touches stays near
the hot working set), and attention reads the block through its codes. Shared and registered blocks
move too: every holder reads the same codes.

A `PagedSequence` is a `kv.Cache` (the interface the forward uses), with the `batched_decode`
capability: the forward hands it every paged sequence reading one token, for one batched product.

Dimension letters: K key/value heads, B positions per block, E head size, T new positions, S positions
of a sequence, P blocks in the pool.
"""

from __future__ import annotations

import numpy as np

from ..errors import ContextFullError, InvalidArgumentError
from .blocks import BlockPool
from .config import ModelConfig
from .forward import softmax
from .kv import Cache, DenseSegment, LayerKV, QuantSegment, Segment

ROOT = (-1, 0)  # the "block before" the first block of every sequence


class PagedLayer(LayerKV):
    """One layer's view of a sequence's blocks."""

    def __init__(self, sequence: PagedSequence, layer: int) -> None:
        self.sequence, self.layer = sequence, layer

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> list:
        """Write k, v (K, T, E) at `positions` (T,) into the sequence's blocks; return every position
        up to the last one written: its cold blocks as one quantized segment, then the rest."""
        pool, table = self.sequence.pool, np.asarray(self.sequence.table, dtype=np.int64)
        store, size = pool.storage, pool.size
        slots = store.slot[table[positions // size]]  # (T,) the newest blocks are never cold
        rows = positions % size  # (T,)
        k_pool, v_pool = store.k[self.layer], store.v[self.layer]  # (K, P, B, E)
        k_pool[:, slots, rows], v_pool[:, slots, rows] = k, v
        end = int(positions[-1]) + 1
        used = table[: -(-end // size)]
        K, E = k.shape[0], k.shape[2]
        cold = int(store.is_cold[used].sum())  # cold blocks come first: the oldest positions
        segments: list[Segment] = []
        if cold:
            assert store.codes is not None  # (blocks go cold only in a pool with codes)
            frozen, at = used[:cold], cold * size
            k_codes = store.codes.unpack(store.k_codes[self.layer][:, frozen])  # (K, cold, B, E)
            v_codes = store.codes.unpack(store.v_codes[self.layer][:, frozen])  # (K, cold, B, E)
            segments.append(
                QuantSegment(
                    k_codes.reshape(K, at, E),
                    store.k_scales[self.layer][:, frozen].reshape(K, at),
                    v_codes.reshape(K, at, E),
                    store.v_scales[self.layer][:, frozen].reshape(K, at),
                    np.arange(at),
                )
            )
        else:
            at = 0
        hot = store.slot[used[cold:]]
        keys = k_pool[:, hot].reshape(K, -1, E)[:, : end - at]  # (K, S, E)
        values = v_pool[:, hot].reshape(K, -1, E)[:, : end - at]  # (K, S, E)
        segments.append(DenseSegment(keys, values, np.arange(at, end)))
        return segments


class PagedSequence(Cache):
    """One sequence's block table over a `BlockPool`, at most `max_positions` positions."""

    batched_decode = True

    def __init__(
        self, pool: BlockPool, config: ModelConfig, max_positions: int, reserved: int, hot_tokens: int | None = None
    ) -> None:
        self.pool, self.config, self.max_positions = pool, config, max_positions
        cold = pool.storage.codes is not None
        self.hot_tokens = hot_tokens if cold else None  # newest positions kept float32 (None: all)
        self.frozen = 0  # blocks at the start of the table known to be cold
        self.table: list[int] = []
        self.tokens: list[int] = []
        self.layers = [PagedLayer(self, i) for i in range(config.num_hidden_layers)]
        self.reserved = reserved  # blocks the pool promised this sequence and it has not taken yet
        self.registered = 0  # full blocks registered for sharing
        self.shared = 0  # positions taken from other sequences' blocks
        self.root = ROOT

    def share_prefix(self, prompt: list[int], blocks: list[int], root: tuple) -> int:
        """Start with `blocks` (BlockPool.find_prefix: they hold the start of `prompt`), computed by other
        sequences. `root` names the weights (blocks computed with other weights never match). Returns the
        positions they hold."""
        for block in blocks:
            self.pool.share(block)
        self.table = list(blocks)
        self.tokens = list(prompt[: len(blocks) * self.pool.size])
        self.registered = len(blocks)
        self.shared = len(self.tokens)
        self.root = root
        return self.shared

    def reserve(self, count: int) -> None:
        """Blocks for `count` more positions, taken from the sequence's reservation."""
        total = len(self.tokens) + count
        if total > self.max_positions:
            raise ContextFullError(f"{total} positions do not fit the context window of {self.max_positions}")
        while len(self.table) * self.pool.size < total:
            assert self.reserved > 0, "a sequence took more blocks than it reserved"
            self.table.append(self.pool.take())
            self.reserved -= 1

    def record(self, tokens: list[int] | np.ndarray) -> None:
        """Note the ids of positions just computed, and register blocks that became full."""
        self.tokens.extend(int(t) for t in tokens)
        size, registry = self.pool.size, self.pool.registry
        while (self.registered + 1) * size <= len(self.tokens):
            i = self.registered
            before = self.root if i == 0 else registry.before(self.table[i - 1])
            registry.register(self.table[i], registry.key(before, tuple(self.tokens[i * size : (i + 1) * size])))
            self.registered += 1
        if self.hot_tokens is not None:  # whole blocks older than the newest hot_tokens positions go cold
            while (self.frozen + 1) * size <= len(self.tokens) - self.hot_tokens:
                self.pool.storage.freeze(self.table[self.frozen])
                self.frozen += 1

    def decode_attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        sequences: list[PagedSequence],  # type: ignore[override]  # (batched_decode: caches of its own kind)
        layer: int,
        window: int | None,
    ) -> np.ndarray:
        """Attention of B sequences of this pool (this one among them) reading one new token each: the
        batched decode step of paged attention. q (H, B, E), k and v (K, B, E) of their new tokens, each
        at the position after the ones its sequence holds. Stores k and v in each sequence's block, then
        computes every sequence's attention in one batched product over its blocks, padded to the
        longest (the padding masked). Returns (B, H*E). The same softmax attention as forward.attend,
        without a loop in Python."""
        pool, store = self.pool, self.pool.storage
        H, B, E = q.shape
        K = k.shape[0]
        G, size = H // K, pool.size
        positions = np.array([len(s.tokens) for s in sequences])  # (B,) where each new token goes
        blocks = -(-(int(positions.max()) + 1) // size)
        tables = np.full((B, blocks), sequences[0].table[0], np.int64)  # padded with a block in use: masked below
        for i, s in enumerate(sequences):
            used = s.table[:blocks]
            tables[i, : len(used)] = used
        at = store.slot[tables[np.arange(B), positions // size]]  # (B,) the slot of each new token's block
        store.k[layer][:, at, positions % size], store.v[layer][:, at, positions % size] = k, v
        S = blocks * size
        keys, values = store.gather(layer, tables)  # (K, B, blocks, size, E) each
        keys, values = keys.reshape(K, B, S, E), values.reshape(K, B, S, E)  # (K, B, S, E)
        queries = q.reshape(K, G, B, E).transpose(0, 2, 1, 3)  # (K, B, G, E)
        scores = queries @ keys.transpose(0, 1, 3, 2)  # (K, B, G, S)
        scores *= np.float32(self.config.attention_scale)
        hidden = np.arange(S)[None, :] > positions[:, None]  # (B, S) padding and other sequences' rows
        if window is not None:
            hidden |= positions[:, None] - np.arange(S)[None, :] >= window
        scores += np.where(hidden, np.float32(-np.inf), np.float32(0))[None, :, None, :]  # (K, B, G, S)
        out = softmax(scores) @ values  # (K, B, G, S) @ (K, B, S, E) -> (K, B, G, E)
        return out.transpose(1, 0, 2, 3).reshape(B, H * E)  # (B, H*E)

    def keep_within_budget(self) -> None:
        """Nothing to drop: admission reserved every block this sequence may need."""

    def truncate(self, position: int) -> None:
        """Forget every position >= `position`, within the last, partly filled block only: that block is
        this sequence's alone (rewritten in place), the full ones before it are registered for sharing
        (other sequences may hold them, or find them by their contents) and may be cold."""
        first = self.registered * self.pool.size  # the first position of the block being filled
        if position < first:
            raise InvalidArgumentError(
                f"a paged sequence cannot rewind to position {position}: its positions before {first} are in "
                f"full blocks other sequences may share (it can forget positions {first}.. only)"
            )
        del self.tokens[position:]

    def release(self) -> None:
        """Give every block back (finished, cancelled or disconnected) and the unused reservation."""
        for block in self.table:
            self.pool.release(block)
        self.pool.unreserve(self.reserved)
        self.table, self.reserved = [], 0
