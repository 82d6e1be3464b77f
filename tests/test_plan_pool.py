"""The decode plan's buffers and the KV cache in the kernel thread pool's memory (quant/pool.py PoolMemory,
PoolArray), on CPython, against the same things in NumPy's memory.

- A PoolArray against the NumPy array it holds: reads, views by integers and slices of step 1 (nested,
  negative), assignment through views (broadcast, overlapping moves as cache.py makes them), indexing
  that falls back to a copy in the heap, np.searchsorted, and the errors; float32 and the cold tier's
  int8/uint8 codes.
- The KV cache (cache.py) with its buffers from `PoolMemory.empty` against one from `np.empty`, driven
  as the NumPy forward drives it (each layer's update_and_fetch, migration to an int8/int4 tier, the
  byte budget's evictions, rewinds, the residual tap): every segment and every statistic alike.
- The decode plan through PoolMemory against the plan in the kernels' own memory (test_plan.py's
  HostMemory, as Pyodide's heap): tiny random models (Gemma 3, Qwen2 with biases, Llama; float32 and
  q4 weights), a prompt, decoding, a rewind, a long chat with a cold tier and evictions, and the
  residual tap; the logits and the cache bit for bit.

In the browser, PoolMemory calls the worker's `api` (npm/src/worker/threads.js `pythonApi`), whose
addresses are of two memories: Pyodide's heap (NumPy data pointers) and the pool's shared WebAssembly
memory. FakePoolApi is that object on CPython: the heap is this process's memory (`wasm.address` gives an
array's real data pointer here), and the pool's memory is a KernelHost's linear memory (tests/kernel_host.py:
the pool's addresses are offsets in it, where the kernels' run_plan reads them), or, for the tests that
only copy, this process's memory again (addresses are then pointers). Copies are ctypes.memmove, each
checked to stay inside a region that has not been freed.
"""

from __future__ import annotations

import ctypes
import gc
import re
from types import SimpleNamespace

import numpy as np
import pytest

from ruvllm.model.cache import KVCache, KVOptions
from ruvllm.model.config import ModelConfig
from ruvllm.model.kv import DenseSegment
from ruvllm.model.plan import DecodePlan
from ruvllm.quant.pool import PoolArray, PoolMemory
from ruvllm.runtime.assembly import load_engine

kernel_host = pytest.importorskip("kernel_host", reason="tests/kernel_host.py")
from kernel_host import KernelHost, kernel_wasm_paths  # noqa: E402

from conftest import tiny_model  # noqa: E402

WASMS = kernel_wasm_paths()
needs_kernels = pytest.mark.skipif(not WASMS, reason="the WebAssembly kernels are not built (./build.sh kernels)")


class FakePoolApi:
    """threads.js `pythonApi` as PoolMemory calls it (region, free, write, fetch, plan, threads), with the
    pool's memory in `host` (its offsets are the pool's addresses), or without one in this process's
    memory (addresses are pointers: the pool cannot run a plan then)."""

    threads = 1

    def __init__(self, host: KernelHost | None = None) -> None:
        self.host = host
        self.base = 0 if host is None else host.base  # where the pool's address 0 is in this process
        self.regions: dict[int, np.ndarray] = {}  # pool address -> the block that holds the region
        self.memory: PoolMemory | None = None  # the PoolMemory calling (plan reads its staged pairs)
        self.plans = 0  # calls of `plan`

    def region(self, nbytes: int, row: int = 0) -> int:
        block = np.zeros(nbytes, np.uint8) if self.host is None else self.host.zeros(nbytes, np.uint8)
        at = block.ctypes.data - self.base
        self.regions[at] = block
        return at

    def free(self, at: int) -> None:
        del self.regions[at]

    def pointer(self, at: int, nbytes: int) -> int:
        """This process's address of the pool's bytes at..at+nbytes, which must lie in one live region."""
        inside = any(start <= at and at + nbytes <= start + len(b) for start, b in self.regions.items())
        assert inside, f"{nbytes} bytes at {at} of the pool are in no region (or in a freed one)"
        return self.base + at

    def write(self, heap: int, nbytes: int, at: int) -> None:
        ctypes.memmove(self.pointer(at, nbytes), heap, nbytes)

    def fetch(self, at: int, nbytes: int, heap: int) -> None:
        ctypes.memmove(heap, self.pointer(at, nbytes), nbytes)

    def plan(self, program: int, state: int, T: int, copies: int, count: int) -> None:
        """Copy the rows (direction, heap address, pool address, bytes) of direction 0 in, run the program
        on one thread (kernels.c run_plan), then copy those of direction 1 out. (T: the pool's threads
        share a prompt's rows; one thread has no use for it.)"""
        assert self.host is not None, "a plan runs in a KernelHost's memory"
        self.plans += 1
        rows = np.ctypeslib.as_array((ctypes.c_uint32 * (4 * count)).from_address(copies)).reshape(count, 4).copy()
        for direction, low, at, nbytes in rows.tolist():
            if direction == 0:
                ctypes.memmove(self.pointer(at, nbytes), self.heap(low, at, nbytes), nbytes)
        self.host.exports.run_plan(program, state)
        for direction, low, at, nbytes in rows.tolist():
            if direction == 1:
                ctypes.memmove(self.heap(low, at, nbytes), self.pointer(at, nbytes), nbytes)

    def heap(self, low: int, at: int, nbytes: int) -> int:
        """The heap address of a copy's row. A row holds 32 bits of it, all of a pointer in Pyodide's wasm32
        but the low half of one on CPython: the rest comes from the staged array whose twin region `at` is
        in (PoolMemory.staged), and the row's 32 bits must be that address's."""
        assert self.memory is not None
        for heap, (size, pool) in self.memory._staged.items():
            if pool <= at and at + nbytes <= pool + size:
                whole = heap + at - pool
                assert whole & 0xFFFFFFFF == low, f"a copy's heap address {low:#x} is not its staged array's"
                return whole
        raise AssertionError(f"a copy of {nbytes} bytes at {at} of the pool is not in a staged array's region")


def pool_memory(host: KernelHost | None = None) -> tuple[PoolMemory, FakePoolApi]:
    """A PoolMemory over a FakePoolApi (what it reads of PoolKernels: `api` and `threads`)."""
    api = FakePoolApi(host)
    memory = PoolMemory(SimpleNamespace(api=api, threads=api.threads))  # type: ignore[arg-type]
    api.memory = memory
    return memory, api


# ---- PoolArray against NumPy -----------------------------------------------------------------------------

VIEWS = [
    np.s_[...],
    np.s_[:, 2:5],
    np.s_[1],
    np.s_[1, 3:],
    np.s_[-1],
    np.s_[-2, -1],
    np.s_[1:3, -4],
    np.s_[:, :, 1:2],
    np.s_[3:1],  # empty
    np.s_[2, 5, 4],  # one value (a 0-d view)
    np.s_[np.int64(2), np.int32(-3)],
]
COPIES = [np.s_[[0, 2]], np.s_[np.array([3, 1])], np.s_[:, ::2], np.s_[1, ..., 2], np.s_[None, 1], np.s_[:, [True] * 6]]


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    if np.dtype(dtype).kind == "f":
        return rng.normal(0, 1, shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8])
def test_a_pool_array_reads_as_the_numpy_array_it_holds(dtype):
    rng = np.random.default_rng(1)
    memory, _ = pool_memory()
    want = values(rng, (4, 6, 5), dtype)
    a = memory.empty((4, 6, 5), dtype)
    a[...] = want
    assert isinstance(a, PoolArray)
    assert (a.shape, a.ndim, a.dtype, a.size, a.nbytes, len(a)) == (want.shape, 3, want.dtype, 120, want.nbytes, 4)
    assert np.array_equal(np.asarray(a), want) and np.array_equal(a.copy(), want)
    assert np.asarray(a, np.float64).dtype == np.float64 and np.array_equal(np.asarray(a, np.float64), want)
    for index in VIEWS:
        view = a[index]
        assert isinstance(view, PoolArray), f"a[{index}] is not a view"
        assert view.shape == want[index].shape and len(view.shape) == view.ndim, f"a[{index}]'s shape"
        assert np.array_equal(np.asarray(view), want[index]), f"a[{index}]"
    nested = a[1:4][1:, 2:5][0, -1]  # = a[2, 2:5, 4]
    assert isinstance(nested, PoolArray) and np.array_equal(np.asarray(nested), want[1:4][1:, 2:5][0, -1])
    for index in COPIES:
        copied = a[index]
        assert type(copied) is np.ndarray, f"a[{index}] should be a copy in the heap"
        assert np.array_equal(copied, want[index]), f"a[{index}]"


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8])
def test_assigning_through_a_view_writes_what_numpy_would(dtype):
    rng = np.random.default_rng(2)
    memory, _ = pool_memory()
    want = values(rng, (4, 6, 5), dtype)
    a = memory.empty((4, 6, 5), dtype)
    a[...] = want
    x = values(rng, (4, 2, 5), dtype)
    a[:, 1:3] = want[:, 1:3] = x
    a[2][1:4, 2] = want[2][1:4, 2] = 7  # a scalar broadcast, through a view of a view
    a[:, 0] = want[:, 0] = x[0, 0]  # a row broadcast over the first axis
    a[-1, -1, -1] = want[-1, -1, -1] = 3
    assert np.array_equal(np.asarray(a), want)
    # HotTier.take_oldest: the rest of a tier moves to its front, onto itself; then a move the other way
    a[:, :4] = a[:, 2:6]
    want[:, :4] = want[:, 2:6]
    assert np.array_equal(np.asarray(a), want)
    a[:, 2:6] = a[:, 0:4]
    want[:, 2:6] = want[:, 0:4].copy()
    assert np.array_equal(np.asarray(a), want)
    a[1:3] = a[1:3]  # in place, the same bytes
    assert np.array_equal(np.asarray(a), want)


def test_a_pool_array_refuses_what_it_cannot_index():
    memory, _ = pool_memory()
    want = np.arange(120, dtype=np.float32).reshape(4, 6, 5)
    a = memory.empty((4, 6, 5))
    a[...] = want
    for index, axis, size in ((np.s_[4], 0, 4), (np.s_[-5], 0, 4), (np.s_[1, -7], 1, 6), (np.s_[0, 0, 5], 2, 5)):
        with pytest.raises(IndexError, match=f"out of bounds for axis {axis} with size {size}"):
            a[index]
        with pytest.raises(IndexError, match=f"out of bounds for axis {axis} with size {size}"):
            a[index] = 0
    for index in (np.s_[:, ::2], np.s_[[0, 1]], np.s_[1, ..., 2]):
        with pytest.raises(TypeError, match=re.escape(f"not {index!r}")):
            a[index] = 0
    assert np.array_equal(np.asarray(a), want), "a refused assignment wrote"


def test_searchsorted_reads_an_int32_pool_array():
    memory, _ = pool_memory()
    positions = memory.empty(8, np.int32)  # as ColdTier.positions: sinks, then a gap where positions went
    positions[:7] = [0, 1, 2, 3, 9, 12, 15]
    assert [int(np.searchsorted(positions[:7], p)) for p in (0, 3, 4, 9, 10, 15, 16)] == [0, 3, 4, 4, 5, 6, 7]
    assert int(np.searchsorted(positions[:4], 9)) == 4


def test_a_region_is_freed_when_its_last_view_goes():
    memory, api = pool_memory()
    a = memory.empty((3, 4))
    at, view = a.at, a[1:]
    del a
    gc.collect()
    assert at in api.regions, "a view's region went with the array it was taken from"
    del view
    gc.collect()
    assert at not in api.regions


def test_staged_arrays_and_placed_copies_have_pool_addresses():
    memory, api = pool_memory()
    staged = memory.staged((3, 4))
    twin = memory.address(staged)
    assert twin in api.regions and memory.address(staged[1:, 2:]) == twin + 4 * (4 + 2)
    with pytest.raises(ValueError, match="not in the kernel pool's memory"):
        memory.address(np.zeros(3, np.float32))
    kept = memory.place(np.arange(6, dtype=np.int64).reshape(2, 3), np.float32)
    assert isinstance(kept, PoolArray) and kept.dtype == np.float32 and memory.address(kept) == kept.at
    assert np.array_equal(np.asarray(kept), np.arange(6, dtype=np.float32).reshape(2, 3))
    # a staged array's twin goes with it (a plan dropped when another model loads leaves nothing behind)
    del staged
    gc.collect()
    assert twin not in api.regions and not memory._staged


# ---- the KV cache in the pool's memory -------------------------------------------------------------------

CONFIG = ModelConfig(
    architecture="LlamaForCausalLM",
    vocab_size=64,
    hidden_size=24,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-5,
    max_position_embeddings=512,
    rope_theta=10000.0,
)
# (start, new positions) of each forward: a prompt, decoding, rewinds, and a chunk past a STEP of 256
CALLS = [(0, 7), *((n, 1) for n in range(7, 19)), (10, 4), *((n, 1) for n in range(14, 20)), (20, 250), (265, 3)]
CACHES = {
    "all hot": (KVOptions(), False),
    "int8 cold tier": (KVOptions(hot_tokens=5, migrate_batch=3, keep=2, cold="int8"), False),
    # (a position takes 256 bytes hot, 64 cold: 3072 bytes leave about 20 cold positions beside 5 hot)
    "int4 cold tier, a budget": (
        KVOptions(hot_tokens=5, migrate_batch=3, keep=2, cold="int4", budget_bytes=3072),
        True,
    ),
}


def assert_same_segments(got: list, want: list, what: str) -> None:
    assert [type(s) for s in got] == [type(s) for s in want], what
    for g, w in zip(got, want, strict=True):
        names = ("keys", "values") if isinstance(w, DenseSegment) else ("k_codes", "k_scales", "v_codes", "v_scales")
        for name in (*names, "positions"):
            a, b = getattr(g, name), getattr(w, name)
            assert type(a) is np.ndarray, f"{what}: a segment's {name} is a {type(a).__name__}, not read into the heap"
            assert a.dtype == b.dtype and np.array_equal(a, b), f"{what}: {type(w).__name__}.{name}"


def assert_same_caches(got: KVCache, want: KVCache) -> None:
    assert got.tokens == want.tokens and got.stats() == want.stats()
    for i, (a, b) in enumerate(zip(got.layers, want.layers, strict=True)):
        assert_same_segments([a.hot.segment()], [b.hot.segment()], f"layer {i}'s float32 tier")
        if b.cold is not None and b.cold.length:
            assert_same_segments([a.cold.segment()], [b.cold.segment()], f"layer {i}'s cold tier")


def forward_call(
    pooled: KVCache, plain: KVCache, start: int, tokens: np.ndarray, entering: np.ndarray, kv: np.ndarray, what: str
) -> None:
    """What a forward call does with a cache (forward.hidden_batch, run_layers), to both caches, for `tokens`
    at start.., with `entering` (T, D) as the residual stream entering each layer and kv (L, 2, K, T, E) as
    each layer's new keys and values. Each layer's segments are compared as attention reads them: before
    the call goes on (a NumPy tier's segments are views of it, which the budget's evictions change)."""
    for cache in (pooled, plain):
        if start < len(cache.tokens):
            cache.truncate(start)  # rewinding
    positions = np.arange(start, start + len(tokens))
    for i in range(len(plain.layers)):
        for cache in (pooled, plain):
            if cache.tap is not None and cache.tap.layer == i:
                cache.tap.write(positions, entering)
        got = pooled.layers[i].update_and_fetch(kv[i, 0], kv[i, 1], positions)
        want = plain.layers[i].update_and_fetch(kv[i, 0], kv[i, 1], positions)
        assert_same_segments(got, want, f"{what}, layer {i}")
    for cache in (pooled, plain):
        cache.record(tokens)
        cache.keep_within_budget()
    assert pooled.stats() == plain.stats(), what


@pytest.mark.parametrize("kind", list(CACHES))
def test_the_kv_cache_in_pool_arrays_keeps_what_numpys_keeps(kind):
    options, evicts = CACHES[kind]
    memory, api = pool_memory()
    tap = 1  # learning's residual tap, entering layer 1
    pooled = KVCache(CONFIG, 400, options, tap, empty=memory.empty)
    plain = KVCache(CONFIG, 400, options, tap, empty=np.empty)
    assert isinstance(pooled.layers[0].hot.k, PoolArray) and pooled.tap is not None and plain.tap is not None
    rng = np.random.default_rng(3)
    L, K, E, D = CONFIG.num_hidden_layers, CONFIG.num_key_value_heads, CONFIG.head_dim, CONFIG.hidden_size
    for call, (start, T) in enumerate(CALLS):
        tokens = rng.integers(0, CONFIG.vocab_size, T)
        entering = rng.normal(0, 1, (T, D)).astype(np.float32)
        kv = rng.normal(0, 1, (L, 2, K, T, E)).astype(np.float32)
        forward_call(pooled, plain, start, tokens, entering, kv, f"call {call}")
    assert_same_caches(pooled, plain)
    stats = plain.stats()
    assert (stats["cold_positions"] > 0) == (options.hot_tokens is not None), stats
    assert (stats["evicted_positions"] > 0) == evicts, stats
    n = len(plain.tokens)
    assert np.array_equal(np.asarray(pooled.tap.read(n)), plain.tap.read(n)), "the residual tap"
    recomputed = np.arange(n - 4, n)  # as forward.recompute_layers reads the tap
    assert np.array_equal(pooled.tap.read(n)[recomputed], plain.tap.read(n)[recomputed]), "the tap's rows"
    del pooled
    gc.collect()
    assert not api.regions, "regions outlived the buffers in them (the tiers' old ones, as they grew, or the cache's)"


# ---- the decode plan in the pool's memory ----------------------------------------------------------------

PLAN_VARIANTS = ["gemma3 sliding + global layers", "qwen2 with q/k/v biases", "llama tied, GQA"]


def tiny_engine(tmp_path, variant: str, compute: str):
    from test_parity import VARIANTS  # (here, not at the top: it needs torch, which only these tests use)

    kind, overrides = VARIANTS[variant]
    tiny_model(kind, tmp_path, **overrides)
    return load_engine(str(tmp_path), compute=compute, kernels="numpy")


def two_plans(engine, rows: int) -> tuple[DecodePlan, DecodePlan, FakePoolApi]:
    """The engine's decode plan in the kernels' memory as Pyodide's heap (test_plan's HostMemory), and in
    a pool whose memory is another KernelHost's; the fake pool's api."""
    from test_plan import HostMemory  # (here: test_plan needs the kernels built to be imported)

    pool, api = pool_memory(KernelHost(WASMS[0]))
    in_heap, in_pool = (
        DecodePlan(engine.model, memory, rows, engine.context_length)
        for memory in (HostMemory(KernelHost(WASMS[0])), pool)
    )
    return in_heap, in_pool, api


@needs_kernels
@pytest.mark.parametrize("compute", ["f32", "q4"])
@pytest.mark.parametrize("variant", PLAN_VARIANTS)
def test_the_plan_in_the_pool_gives_the_bits_of_the_plan_in_the_heap(tmp_path, variant, compute):
    """A prompt of 7 in chunks of 3 (every row's logits), 6 decoding steps, then a rewind of 4 positions
    and a 2-token continuation (the last row's logits): the same logits, cache and residual tap."""
    from test_plan import assert_close

    engine = tiny_engine(tmp_path, variant, compute)
    in_heap, in_pool, api = two_plans(engine, rows=3)
    tap = engine.config.num_hidden_layers - 1
    caches = [
        KVCache(engine.config, engine.context_length, engine.kv, tap, None, p.memory.empty) for p in (in_heap, in_pool)
    ]
    assert isinstance(caches[1].layers[0].hot.k, PoolArray) and type(caches[0].layers[0].hot.k) is np.ndarray
    programs = [in_heap.program("base"), in_pool.program("base")]

    def step(ids: np.ndarray, start: int, what: str, last_only: bool = False) -> np.ndarray:
        want, got = (
            plan.forward(program, ids, start, cache, last_only)
            for plan, program, cache in zip((in_heap, in_pool), programs, caches, strict=True)
        )
        assert got.shape == want.shape and np.array_equal(got, want), f"{what}: the logits differ"
        return want

    prompt = np.random.default_rng(1).integers(0, engine.config.vocab_size, 7)
    logits = step(prompt, 0, "the prompt")
    assert_close(logits, engine.forward(prompt, 0, engine.new_cache()), "the prompt")  # (a plan that runs)
    tokens = prompt.tolist()
    for n in range(6):
        token = int(logits[-1].argmax())
        logits = step(np.array([token]), len(tokens), f"decoding step {n}")
        tokens.append(token)
    step(np.array([3, 5]), len(tokens) - 4, "after a rewind", last_only=True)
    assert api.plans == 3 + 6 + 1, "not every forward went through the pool's plan"
    assert_same_caches(caches[1], caches[0])
    n = len(caches[0].tokens)
    assert np.array_equal(np.asarray(caches[1].tap.read(n)), caches[0].tap.read(n)), "the residual tap's rows"


@needs_kernels
@pytest.mark.parametrize("kind, cold", [("gemma3", "int4"), ("llama", "int8")])
def test_the_plan_in_the_pool_over_a_long_chat_with_both_tiers(tmp_path, kind, cold):
    """Four turns (a 5-token prompt rewinding into the last answer, 9 decoding steps) on a cache with a
    cold tier and a byte budget: positions migrate and the oldest are evicted (but for the sinks), in
    the pool as in the heap, bit for bit."""
    tiny_model(kind, tmp_path)
    engine = load_engine(str(tmp_path), compute="q4", kernels="numpy")
    budget = 40 * engine.kv.hot_bytes_per_position(engine.config) // 8  # (about 40 cold positions)
    kv = KVOptions(hot_tokens=6, cold=cold, migrate_batch=3, keep=2, budget_bytes=budget)
    in_heap, in_pool, api = two_plans(engine, rows=4)
    plans = [
        (p, p.program("base"), KVCache(engine.config, None, kv, None, None, p.memory.empty)) for p in (in_heap, in_pool)
    ]
    rng = np.random.default_rng(3)
    tokens: list[int] = []

    def step(ids: np.ndarray, start: int, what: str) -> np.ndarray:
        want, got = (plan.forward(program, ids, start, cache, last_only=True) for plan, program, cache in plans)
        assert np.array_equal(got, want), f"{what}: the logits differ"
        return want

    for turn in range(4):
        del tokens[max(0, len(tokens) - 2 * turn) :]  # a rewind into the last answer (none at first)
        prompt = rng.integers(0, engine.config.vocab_size, 5)
        logits = step(prompt, len(tokens), f"turn {turn}'s prompt")
        tokens += prompt.tolist()
        for n in range(9):
            token = int(logits[-1].argmax())
            logits = step(np.array([token]), len(tokens), f"turn {turn}, step {n}")
            tokens.append(token)
        assert_same_caches(plans[1][2], plans[0][2])
    stats = plans[1][2].stats()
    assert stats["cold_positions"] > 0 and stats["evicted_positions"] > 0, stats
    assert api.plans == 4 * (2 + 9), "not every forward went through the pool's plan"
