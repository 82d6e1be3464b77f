"""The block pool behind the paged KV cache (paged.py): P blocks of B positions each, in three parts
with one job each (as vLLM v0.2 keeps its `BlockAllocator` apart from the block tables):

- `BlockAllocator`: who holds which block (reference counts), the free blocks that hold nothing worth
  keeping, and the blocks promised to admitted sequences (`reserve`).
- `PrefixRegistry`: full blocks registered under their contents (the tokens they hold and the block
  before them), so a later sequence whose prompt starts with the same tokens takes them as they are,
  and the eviction order of registered blocks nobody holds: least recently freed goes first.
- `BlockStorage`: the keys and values themselves, a float32 slot per hot block and integer codes
  (quant/kvcodes.py) per cold block.

`BlockPool` ties them together: taking a block (an empty one, else the registry's oldest idle one),
sharing a registered one, releasing one (back to the registry's idle blocks if registered, else
emptied).

A block that is free or held only by the registry counts as free: it can be taken. A block nobody holds
stays registered until it is reused for other contents, so the next request with that prefix still
finds it.

Dimension letters: K key/value heads, B positions per block, E head size, P blocks in the pool.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..quant.kvcodes import KVCodes
from .cache import COLD_FORMATS
from .config import ModelConfig


class BlockAllocator:
    """Reference counts of `count` blocks, the free list of those holding nothing worth keeping
    (`empty`), and the count of blocks promised to admitted sequences and not yet taken (`reserved`)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.refs = [0] * count
        self.empty = list(range(count - 1, -1, -1))  # taken from the end
        self.in_use = 0  # blocks held by at least one sequence
        self.reserved = 0

    @property
    def free(self) -> int:
        """Blocks that can be taken now (empty, or held only by the registry)."""
        return self.count - self.in_use

    def reserve(self, blocks: int) -> bool:
        """Promise `blocks` blocks to a sequence about to start; False if they are not all free."""
        if blocks > self.free - self.reserved:
            return False
        self.reserved += blocks
        return True

    def unreserve(self, blocks: int) -> None:
        self.reserved -= blocks
        assert self.reserved >= 0

    def hold(self, block: int) -> None:
        """One more holder of `block`; a free block taken this way comes out of the reservation."""
        if self.refs[block] == 0:
            self.in_use += 1
            self.reserved -= 1
        self.refs[block] += 1

    def drop(self, block: int) -> bool:
        """One holder fewer; True when nobody holds `block` any more."""
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.in_use -= 1
            return True
        return False


class PrefixRegistry:
    """Full blocks by contents: key (block before, its generation, tokens) -> block, and the registered
    blocks nobody holds (`idle`), least recently freed first: the order they are evicted in."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self.generation = [0] * count  # bumped when a block is reused: keys naming the old contents go stale
        self.by_key: dict[tuple, int] = {}
        self.key_of: dict[int, tuple] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()

    def before(self, block: int) -> tuple[int, int]:
        """What a key says of the block before: the block and the generation of its contents."""
        return block, self.generation[block]

    def key(self, before: tuple, tokens: tuple[int, ...]) -> tuple:
        return (*before, tokens)

    def register(self, block: int, key: tuple) -> None:
        """Make `block` findable under `key` (the first block registered with given contents stays)."""
        if key not in self.by_key and block not in self.key_of:
            self.by_key[key], self.key_of[block] = block, key

    def lookup(self, key: tuple) -> int | None:
        return self.by_key.get(key)

    def holds(self, block: int) -> bool:
        return block in self.key_of

    def find_prefix(self, prompt: list[int], root: tuple) -> list[int]:
        """The registered blocks that hold the start of `prompt`: whole blocks, never the one holding the
        last prompt token (its logits must be computed)."""
        blocks, before = [], root
        for start in range(0, len(prompt) - self.size, self.size):
            block = self.lookup(self.key(before, tuple(prompt[start : start + self.size])))
            if block is None:
                break
            blocks.append(block)
            before = self.before(block)
        return blocks

    def park(self, block: int) -> None:
        """A registered block nobody holds any more: findable until its room is needed."""
        self.idle[block] = None

    def unpark(self, block: int) -> None:
        """An idle block a sequence holds again."""
        del self.idle[block]

    def evict(self) -> int:
        """Forget the least recently freed idle block; returns it, for new contents."""
        block, _ = self.idle.popitem(last=False)
        del self.by_key[self.key_of.pop(block)]
        self.generation[block] += 1
        return block

    def clear(self) -> list[int]:
        """Forget every registered contents (the weights changed); returns the blocks that were idle,
        oldest first."""
        idle = list(self.idle)
        self.idle.clear()
        for block in self.key_of:
            self.generation[block] += 1
        self.by_key.clear()
        self.key_of.clear()
        return idle


class BlockStorage:
    """Every layer's keys and values of `count` blocks: float32 slots k[layer] and v[layer] (K, P, B, E),
    block b in slot[b]; with `codes`, the codes and scales of cold blocks by block id (a cold block
    holds no slot)."""

    def __init__(self, config: ModelConfig, count: int, size: int, codes: KVCodes | None) -> None:
        K, E, L = config.num_key_value_heads, config.head_dim, config.num_hidden_layers
        # np.zeros: the OS hands out pages as they are first written, so unused slots cost no memory.
        self.k = [np.zeros((K, count, size, E), np.float32) for _ in range(L)]  # float32 slots
        self.v = [np.zeros((K, count, size, E), np.float32) for _ in range(L)]
        self.slot = np.full(count, -1, np.int64)  # block -> its float32 slot; -1: none (free, or cold)
        self.free_slots = list(range(count - 1, -1, -1))  # taken from the end: the most recently freed
        self.codes = codes
        self.is_cold = np.zeros(count, bool)  # the block's keys and values are codes in the cold arrays
        if codes is not None:
            width = codes.width(E)
            self.k_codes = [np.zeros((K, count, size, width), codes.dtype) for _ in range(L)]  # by block id
            self.v_codes = [np.zeros((K, count, size, width), codes.dtype) for _ in range(L)]
            self.k_scales = [np.zeros((K, count, size), np.float32) for _ in range(L)]
            self.v_scales = [np.zeros((K, count, size), np.float32) for _ in range(L)]

    @property
    def cold_blocks(self) -> int:
        return int(self.is_cold.sum())

    @property
    def hot_slots(self) -> int:
        """float32 slots holding a block (the hot working set)."""
        return len(self.slot) - len(self.free_slots)

    def make_hot(self, block: int) -> None:
        """A float32 slot for a block about to get new contents."""
        if self.slot[block] < 0:
            self.slot[block] = self.free_slots.pop()
        self.is_cold[block] = False

    def forget(self, block: int) -> None:
        """A block whose contents are worth nothing: its float32 slot serves others."""
        if self.slot[block] >= 0:
            self.free_slots.append(int(self.slot[block]))
            self.slot[block] = -1
        self.is_cold[block] = False

    def freeze(self, block: int) -> None:
        """Quantize a full block into the cold arrays and give its float32 slot back."""
        if self.is_cold[block]:
            return
        slot = self.slot[block]
        assert self.codes is not None  # (blocks go cold only in a pool with codes)
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
        assert self.codes is not None  # (blocks go cold only in a pool with codes)
        return self.codes.dequantize(codes[:, blocks], scales[:, blocks])  # (K, ..., B, E)


class BlockPool:
    """`count` blocks of `size` positions: the allocator, the prefix registry and the storage, and the
    moves that involve more than one of them. `cold` ("int8", "int4" or None) is the code format of
    blocks frozen past a sequence's hot window."""

    def __init__(self, config: ModelConfig, count: int, size: int = 16, cold: str | None = None) -> None:
        self.size, self.count = size, count
        self.allocator = BlockAllocator(count)
        self.registry = PrefixRegistry(count, size)
        self.storage = BlockStorage(config, count, size, KVCodes(COLD_FORMATS[cold]) if cold else None)

    @property
    def free(self) -> int:
        return self.allocator.free

    @property
    def in_use(self) -> int:
        return self.allocator.in_use

    @property
    def reserved(self) -> int:
        return self.allocator.reserved

    @property
    def cold_blocks(self) -> int:
        return self.storage.cold_blocks

    @property
    def hot_slots(self) -> int:
        return self.storage.hot_slots

    def reserve(self, blocks: int) -> bool:
        return self.allocator.reserve(blocks)

    def unreserve(self, blocks: int) -> None:
        self.allocator.unreserve(blocks)

    def find_prefix(self, prompt: list[int], root: tuple) -> list[int]:
        return self.registry.find_prefix(prompt, root)

    def prefix_cost(self, blocks: list[int]) -> int:
        """Free blocks among `blocks`: sharing them takes them out of the free count."""
        return sum(self.allocator.refs[b] == 0 for b in blocks)

    def take(self) -> int:
        """A block for new contents (from the sequence's reservation): an empty one, else the least
        recently freed registered one."""
        allocator = self.allocator
        block = allocator.empty.pop() if allocator.empty else self.registry.evict()
        self.storage.make_hot(block)
        allocator.hold(block)
        return block

    def share(self, block: int) -> None:
        """Hold a registered block (a prefix another sequence computed). A block nobody held was counted
        as free: the sharing sequence reserved it (`prefix_cost`)."""
        if self.allocator.refs[block] == 0:
            self.registry.unpark(block)
        self.allocator.hold(block)

    def release(self, block: int) -> None:
        if self.allocator.drop(block):
            if self.registry.holds(block):
                self.registry.park(block)
            else:
                self._empty(block)

    def clear_registry(self) -> None:
        """Forget every registered contents (the weights changed: cached keys and values are stale)."""
        for block in self.registry.clear():
            self._empty(block)

    def _empty(self, block: int) -> None:
        self.allocator.empty.append(block)
        self.storage.forget(block)
