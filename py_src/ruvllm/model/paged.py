"""A paged KV cache for many sequences at once (continuous batching), with prefix sharing.

Keys and values of every sequence live in one pool of fixed-size blocks per layer (as in vLLM's
PagedAttention). A sequence holds a block table: its position p is at block `table[p // B]`, row
`p % B`. Blocks are counted by reference:

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

from collections import OrderedDict

import numpy as np

from ..errors import ContextFullError, InvalidArgumentError
from ..quant.kvcodes import KVCodes
from .cache import COLD_FORMATS
from .config import ModelConfig
from .forward import softmax
from .kv import Cache, DenseSegment, LayerKV, QuantSegment

ROOT = (-1, 0)  # the "block before" the first block of every sequence


class BlockPool:
    """Every layer's keys and values for `count` blocks of `size` positions: float32 slots k[layer] and
    v[layer] (K, P, B, E), block b in slot[b]; with a cold format, the codes and scales of cold blocks,
    by block id (a cold block holds no slot)."""

    def __init__(self, config: ModelConfig, count: int, size: int = 16, cold: str | None = None) -> None:
        K, E, L = config.num_key_value_heads, config.head_dim, config.num_hidden_layers
        self.size, self.count = size, count
        # np.zeros: the OS hands out pages as they are first written, so unused slots cost no memory.
        self.k = [np.zeros((K, count, size, E), np.float32) for _ in range(L)]  # float32 slots
        self.v = [np.zeros((K, count, size, E), np.float32) for _ in range(L)]
        self.slot = np.full(count, -1, np.int64)  # block -> its float32 slot; -1: none (free, or cold)
        self.free_slots = list(range(count - 1, -1, -1))  # taken from the end: the most recently freed
        self.codes = KVCodes(COLD_FORMATS[cold]) if cold else None
        self.is_cold = np.zeros(count, bool)  # the block's keys and values are codes in the cold arrays
        if self.codes is not None:
            width = self.codes.width(E)
            self.k_codes = [np.zeros((K, count, size, width), self.codes.dtype) for _ in range(L)]  # by block id
            self.v_codes = [np.zeros((K, count, size, width), self.codes.dtype) for _ in range(L)]
            self.k_scales = [np.zeros((K, count, size), np.float32) for _ in range(L)]
            self.v_scales = [np.zeros((K, count, size), np.float32) for _ in range(L)]
        self.refs = [0] * count
        self.generation = [0] * count  # bumped when a block is reused: keys naming the old contents go stale
        self.empty = list(range(count - 1, -1, -1))  # free blocks holding nothing worth keeping
        self.cached: OrderedDict[int, None] = OrderedDict()  # free blocks still registered, oldest first
        self.by_key: dict[tuple, int] = {}  # (block before, its generation, tokens) -> block
        self.key_of: dict[int, tuple] = {}
        self.reserved = 0  # blocks promised to admitted sequences and not yet taken

    @property
    def free(self) -> int:
        """Blocks that can be taken now (free, or held only by the registry)."""
        return len(self.empty) + len(self.cached)

    @property
    def in_use(self) -> int:
        return self.count - self.free

    @property
    def cold_blocks(self) -> int:
        return int(self.is_cold.sum())

    @property
    def hot_slots(self) -> int:
        """float32 slots holding a block (the hot working set)."""
        return self.count - len(self.free_slots)

    def reserve(self, blocks: int) -> bool:
        """Promise `blocks` blocks to a sequence about to start; False if they are not all free."""
        if blocks > self.free - self.reserved:
            return False
        self.reserved += blocks
        return True

    def unreserve(self, blocks: int) -> None:
        self.reserved -= blocks
        assert self.reserved >= 0

    def take(self) -> int:
        """A block for new contents (from the sequence's reservation)."""
        if self.empty:
            block = self.empty.pop()
        else:
            block, _ = self.cached.popitem(last=False)  # the least recently freed registered block
            del self.by_key[self.key_of.pop(block)]
            self.generation[block] += 1
        if self.slot[block] < 0:
            self.slot[block] = self.free_slots.pop()
        self.is_cold[block] = False
        self.refs[block] = 1
        self.reserved -= 1
        return block

    def freeze(self, block: int) -> None:
        """Quantize a full block into the cold arrays and give its float32 slot back."""
        if self.is_cold[block]:
            return
        slot = self.slot[block]
        for layer in range(len(self.k)):
            for hot, codes, scales in (
                (self.k[layer], self.k_codes[layer], self.k_scales[layer]),
                (self.v[layer], self.v_codes[layer], self.v_scales[layer]),
            ):
                codes[:, block], scales[:, block] = self.codes.quantize(hot[:, slot])  # (K, B, width), (K, B)
        self.free_slots.append(int(slot))
        self.slot[block] = -1
        self.is_cold[block] = True

    def gather(self, layer: int, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of `blocks` (...,) as float32 (K, ..., B, E): cold ones dequantized."""
        slots = self.slot[blocks]  # (...,)
        keys, values = self.k[layer][:, slots], self.v[layer][:, slots]  # (K, ..., B, E)
        cold = self.is_cold[blocks]  # (...,)
        if cold.any():
            pick = cold[None, ..., None, None]
            keys = np.where(pick, self._dequantize(self.k_codes[layer], self.k_scales[layer], blocks), keys)
            values = np.where(pick, self._dequantize(self.v_codes[layer], self.v_scales[layer], blocks), values)
        return keys, values

    def _dequantize(self, codes: np.ndarray, scales: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        return self.codes.dequantize(codes[:, blocks], scales[:, blocks])  # (K, ..., B, E)

    def share(self, block: int) -> None:
        """Hold a registered block (a prefix another sequence computed). A block nobody held was counted
        as free: the sharing sequence reserved it (`prefix_cost`)."""
        if self.refs[block] == 0:
            del self.cached[block]
            self.reserved -= 1
        self.refs[block] += 1

    def find_prefix(self, prompt: list[int], root: tuple) -> list[int]:
        """The registered blocks that hold the start of `prompt`: whole blocks, never the one holding the
        last prompt token (its logits must be computed)."""
        blocks, before = [], root
        for start in range(0, len(prompt) - self.size, self.size):
            block = self.lookup(self.key(before, tuple(prompt[start : start + self.size])))
            if block is None:
                break
            blocks.append(block)
            before = (block, self.generation[block])
        return blocks

    def prefix_cost(self, blocks: list[int]) -> int:
        """Free blocks among `blocks`: sharing them takes them out of the free count."""
        return sum(self.refs[b] == 0 for b in blocks)

    def release(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if block in self.key_of:
                self.cached[block] = None  # findable until its room is needed
            else:
                self.empty.append(block)
                self._drop_contents(block)

    def _drop_contents(self, block: int) -> None:
        """A free block whose contents are worth nothing: its float32 slot serves others."""
        if self.slot[block] >= 0:
            self.free_slots.append(int(self.slot[block]))
            self.slot[block] = -1
        self.is_cold[block] = False

    def key(self, before: tuple[int, int], tokens: tuple[int, ...]) -> tuple:
        return (*before, tokens)

    def register(self, block: int, key: tuple) -> None:
        if key not in self.by_key and block not in self.key_of:
            self.by_key[key], self.key_of[block] = block, key

    def lookup(self, key: tuple) -> int | None:
        return self.by_key.get(key)

    def clear_registry(self) -> None:
        """Forget every registered contents (the weights changed: cached keys and values are stale)."""
        for block in list(self.cached):
            self.empty.append(block)
            self._drop_contents(block)
        self.cached.clear()
        for block in self.key_of:
            self.generation[block] += 1
        self.by_key.clear()
        self.key_of.clear()


class PagedLayer(LayerKV):
    """One layer's view of a sequence's blocks."""

    def __init__(self, sequence: PagedSequence, layer: int) -> None:
        self.sequence, self.layer = sequence, layer

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> list:
        """Write k, v (K, T, E) at `positions` (T,) into the sequence's blocks; return every position
        up to the last one written: its cold blocks as one quantized segment, then the rest."""
        pool, table, size = self.sequence.pool, np.asarray(self.sequence.table, dtype=np.int64), self.sequence.pool.size
        slots = pool.slot[table[positions // size]]  # (T,) the newest blocks are never cold
        rows = positions % size  # (T,)
        k_pool, v_pool = pool.k[self.layer], pool.v[self.layer]  # (K, P, B, E)
        k_pool[:, slots, rows], v_pool[:, slots, rows] = k, v
        end = int(positions[-1]) + 1
        used = table[: -(-end // size)]
        K, E = k.shape[0], k.shape[2]
        cold = int(pool.is_cold[used].sum())  # cold blocks come first: the oldest positions
        segments = []
        if cold:
            frozen, at = used[:cold], cold * size
            k_codes = pool.codes.unpack(pool.k_codes[self.layer][:, frozen])  # (K, cold, B, E)
            v_codes = pool.codes.unpack(pool.v_codes[self.layer][:, frozen])  # (K, cold, B, E)
            segments.append(
                QuantSegment(
                    k_codes.reshape(K, at, E),
                    pool.k_scales[self.layer][:, frozen].reshape(K, at),
                    v_codes.reshape(K, at, E),
                    pool.v_scales[self.layer][:, frozen].reshape(K, at),
                    np.arange(at),
                )
            )
        else:
            at = 0
        hot = pool.slot[used[cold:]]
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
        self.hot_tokens = hot_tokens if pool.codes is not None else None  # newest positions kept float32 (None: all)
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
        size = self.pool.size
        while (self.registered + 1) * size <= len(self.tokens):
            i = self.registered
            before = self.root if i == 0 else (self.table[i - 1], self.pool.generation[self.table[i - 1]])
            key = self.pool.key(before, tuple(self.tokens[i * size : (i + 1) * size]))
            self.pool.register(self.table[i], key)
            self.registered += 1
        if self.hot_tokens is not None:  # whole blocks older than the newest hot_tokens positions go cold
            while (self.frozen + 1) * size <= len(self.tokens) - self.hot_tokens:
                self.pool.freeze(self.table[self.frozen])
                self.frozen += 1

    def decode_attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        sequences: list[PagedSequence],
        layer: int,
        window: int | None,
    ) -> np.ndarray:
        """Attention of B sequences of this pool (this one among them) reading one new token each: the
        batched decode step of paged attention. q (H, B, E), k and v (K, B, E) of their new tokens, each
        at the position after the ones its sequence holds. Stores k and v in each sequence's block, then
        computes every sequence's attention in one batched product over its blocks, padded to the
        longest (the padding masked). Returns (B, H*E). The same softmax attention as forward.attend,
        without a loop in Python."""
        pool = self.pool
        H, B, E = q.shape
        K = k.shape[0]
        G, size = H // K, pool.size
        positions = np.array([len(s.tokens) for s in sequences])  # (B,) where each new token goes
        blocks = -(-(int(positions.max()) + 1) // size)
        tables = np.full((B, blocks), sequences[0].table[0], np.int64)  # padded with a block in use: masked below
        for i, s in enumerate(sequences):
            used = s.table[:blocks]
            tables[i, : len(used)] = used
        at = pool.slot[tables[np.arange(B), positions // size]]  # (B,) the slot of each new token's block
        pool.k[layer][:, at, positions % size], pool.v[layer][:, at, positions % size] = k, v
        S = blocks * size
        keys, values = pool.gather(layer, tables)  # (K, B, blocks, size, E) each
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
