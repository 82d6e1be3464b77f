"""The two-tier KV cache: exact when everything is hot, quantized cold tier, byte budget with attention
sinks, and prefix reuse across requests; the interface it shares with the paged cache, and what a paged
sequence can rewind."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ruvllm.errors import InvalidArgumentError
from ruvllm.files.formats import quantize_symmetric
from ruvllm.model.blocks import BlockPool
from ruvllm.model.cache import COLD_FORMATS, KVCache, KVOptions, LayerCache
from ruvllm.model.kv import Cache, LayerKV
from ruvllm.model.paged import PagedSequence
from ruvllm.quant.kvcodes import pack_int4, unpack_int4
from ruvllm.runtime.assembly import load_engine
from ruvllm.runtime.generate import GenerationOptions, generate_tokens

from conftest import numpy_model

IDS = np.random.default_rng(2).integers(0, 128, 60)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    numpy_model("llama", path, max_position_embeddings=512)
    return path


def run(engine, kv: KVOptions | None, ids=IDS, prefill: int = 20) -> tuple[np.ndarray, KVCache]:
    engine.kv = kv or KVOptions()
    cache = engine.new_cache()
    out = [engine.forward(ids[:prefill], 0, cache)]
    for i in range(prefill, len(ids)):
        out.append(engine.forward(ids[i : i + 1], i, cache))
    return np.concatenate(out), cache


def test_all_hot_is_exactly_the_plain_cache(folder):
    engine = load_engine(str(folder))
    plain, _ = run(engine, None)
    hot, cache = run(engine, KVOptions(hot_tokens=len(IDS), cold="int4"))
    np.testing.assert_array_equal(hot, plain)
    assert cache.stats()["cold_positions"] == 0


def test_sliding_window_model_all_hot_is_exact(tmp_path):
    numpy_model("mistral", tmp_path, sliding_window=7)
    engine = load_engine(str(tmp_path))
    np.testing.assert_array_equal(run(engine, KVOptions(hot_tokens=100))[0], run(engine, None)[0])


@pytest.mark.parametrize("bits, bound", [(8, 1 / 254), (4, 1 / 14)])
def test_cold_codes_round_trip_within_half_a_step(bits, bound):
    x = np.random.default_rng(0).normal(size=(3, 10, 64)).astype(np.float32)
    codes, scales = quantize_symmetric(x, bits)
    if bits == 4:
        packed = pack_int4(codes)
        assert packed.shape == (3, 10, 32) and packed.dtype == np.uint8
        np.testing.assert_array_equal(unpack_int4(packed), codes)
        assert codes.min() >= -8 and codes.max() <= 7
    error = np.abs(codes * scales[..., None] - x)
    assert np.all(error <= np.abs(x).max(axis=-1, keepdims=True) * bound + 1e-7)


@pytest.mark.parametrize("cold", ["int8", "int4"])
def test_attention_over_both_tiers_is_attention_over_the_dequantized_values(cold):
    bits = COLD_FORMATS[cold]
    layer = LayerCache(2, 8, None, KVOptions(hot_tokens=4, cold=cold, migrate_batch=2))
    rng = np.random.default_rng(0)
    keys, values = rng.normal(size=(2, 12, 8)).astype(np.float32), rng.normal(size=(2, 12, 8)).astype(np.float32)
    for p in range(12):
        segments = layer.update_and_fetch(keys[:, p : p + 1], values[:, p : p + 1], np.array([p]))
    n = layer.cold.length
    assert n == 6 and layer.hot.length == 6 and [len(s.positions) for s in segments] == [6, 6]
    assert list(np.concatenate([s.positions for s in segments])) == list(range(12))
    k_codes, k_scales = quantize_symmetric(keys[:, :n], bits)
    v_codes, v_scales = quantize_symmetric(values[:, :n], bits)
    k_ref = np.concatenate([k_codes * k_scales[..., None], keys[:, n:]], axis=1)
    v_ref = np.concatenate([v_codes * v_scales[..., None], values[:, n:]], axis=1)
    q = rng.normal(size=(2, 3, 8)).astype(np.float32)
    scores = np.concatenate([s.scores(q) for s in segments], axis=-1)
    np.testing.assert_allclose(scores, q @ k_ref.transpose(0, 2, 1), atol=1e-5)
    probs = rng.random((2, 3, 12)).astype(np.float32)
    mixed = segments[0].mix(probs[..., :n]) + segments[1].mix(probs[..., n:])
    np.testing.assert_allclose(mixed, probs @ v_ref, atol=1e-5)


def test_cold_tier_bytes_are_really_at_that_width(folder):
    engine = load_engine(str(folder))
    for cold, width, dtype in (("int8", 16, np.int8), ("int4", 8, np.uint8)):
        _, cache = run(engine, KVOptions(hot_tokens=8, cold=cold, migrate_batch=4))
        stats = cache.stats()
        assert stats["hot_positions"] + stats["cold_positions"] == len(IDS)
        assert 8 <= stats["hot_positions"] <= 8 + 4 + 1 and stats["cold_positions"] >= 40
        layer = cache.layers[0]
        assert layer.cold.k_codes.shape[2] == width and layer.cold.k_codes.dtype == dtype  # head size 16
        per_position = engine.config.num_hidden_layers * engine.config.num_key_value_heads * 2 * (width + 4)
        assert stats["cold_bytes"] == stats["cold_positions"] * per_position
        assert stats["hot_bytes"] == stats["hot_positions"] * engine.config.num_hidden_layers * 2 * 16 * 4 * 2


TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable "
    "metal type, oil-based ink and a wooden press adapted from wine making. Within fifty years, presses had spread "
    "to more than two hundred cities across Europe, and the price of books fell sharply. "
) * 3


def text_nll(model, kv: KVOptions | None) -> float:
    """SmolLM2's mean negative log-likelihood of TEXT, decoded a token at a time with the cache `kv`."""
    ids = np.array(model.tokenizer.encode(TEXT))
    try:
        logits, _ = run(model.engine, kv, ids, prefill=8)
    finally:
        model.engine.kv = KVOptions()
    logits = logits[:-1].astype(np.float64)
    top = logits.max(axis=-1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))
    return float(np.mean(lse - logits[np.arange(len(ids) - 1), ids[1:]]))


@pytest.fixture(scope="module")
def plain_nll(smollm2) -> float:
    """The plain cache's, the reference of both cold formats below (measured once)."""
    return text_nll(smollm2, None)


@pytest.mark.parametrize("cold, hot, limit", [("int8", 8, 1.01), ("int4", 32, 1.05)])
def test_smollm2_perplexity_with_a_cold_tier(smollm2, plain_nll, cold, hot, limit):
    """Quality targets: cold int8 within 1% of the plain cache's perplexity, cold int4 within 5%."""
    ratio = np.exp(text_nll(smollm2, KVOptions(hot_tokens=hot, cold=cold, migrate_batch=8)) - plain_nll)
    assert 0.99 < ratio <= limit


def test_a_budget_drops_old_positions_but_keeps_the_sinks(folder):
    engine = load_engine(str(folder), context_length=32)
    options = KVOptions(hot_tokens=8, cold="int8", budget_bytes=12_000, keep=4, migrate_batch=4)
    engine.kv = options
    cache = engine.new_cache()
    steps = list(
        generate_tokens(engine, list(IDS[:40]), GenerationOptions(max_tokens=100, ignore_eos=True), cache=cache)
    )
    assert len(steps) == 100 and steps[-1].finish_reason == "length"  # far past context_length, no error
    stats = cache.stats()
    assert stats["evicted_positions"] > 0 and stats["seen_positions"] == 40 + 99
    assert stats["hot_bytes"] + stats["cold_bytes"] <= 12_000
    layer = cache.layers[0]
    assert list(layer.cold.positions[:4]) == [0, 1, 2, 3]  # the attention sinks
    assert layer.cold.positions[4] > 4  # what came after them was dropped
    held = [layer.cold.positions[: layer.cold.length], layer.hot.positions[: layer.hot.length]]
    assert np.all(np.diff(np.concatenate(held)) > 0)


def test_without_a_budget_the_context_still_limits(folder):
    engine = load_engine(str(folder), context_length=32, kv=KVOptions(hot_tokens=8))
    steps = list(generate_tokens(engine, list(IDS[:30]), GenerationOptions(max_tokens=100)))
    assert len(steps) == 3 and steps[-1].finish_reason == "length"


def test_prefix_reuse_computes_only_the_new_tokens(folder):
    engine = load_engine(str(folder))
    cache = engine.new_cache()
    greedy = GenerationOptions.from_kwargs(max_tokens=8, temperature=0, ignore_eos=True)
    first_prompt = list(IDS[:30])
    first = [s.token_id for s in generate_tokens(engine, first_prompt, greedy, cache=cache)]
    follow_up = first_prompt + first + list(IDS[30:40])  # the next turn of a conversation
    steps = list(generate_tokens(engine, follow_up, greedy, cache=cache))
    assert steps[0].cached_tokens == len(first_prompt) + len(first) - 1  # the last sampled token was never fed
    cold = list(generate_tokens(engine, follow_up, greedy, cache=engine.new_cache(), reuse_prefix=False))
    assert cold[0].cached_tokens == 0
    assert [s.token_id for s in steps] == [s.token_id for s in cold]
    again = list(generate_tokens(engine, follow_up, greedy, cache=cache))  # the same prompt again
    assert again[0].cached_tokens == len(follow_up) - 1
    assert [s.token_id for s in again] == [s.token_id for s in cold]


def test_bad_kv_options_are_refused():
    with pytest.raises(InvalidArgumentError, match="cold must be one of int8, int4, got 'int2'"):
        KVOptions(hot_tokens=8, cold="int2")
    with pytest.raises(InvalidArgumentError, match="hot_tokens must be an integer >= 1, got 0"):
        KVOptions(hot_tokens=0)
    with pytest.raises(InvalidArgumentError, match="a KV budget needs hot_tokens"):
        KVOptions(budget_bytes=1000)


def test_both_caches_are_the_one_cache_interface_with_their_capabilities_stated(folder):
    engine = load_engine(str(folder))
    config = engine.config
    solo, paged = engine.new_cache(), PagedSequence(BlockPool(config, count=2, size=8), config, 16, reserved=0)
    for cache in (solo, paged):
        assert isinstance(cache, Cache) and len(cache.layers) == config.num_hidden_layers
        assert all(isinstance(layer, LayerKV) for layer in cache.layers)
        assert cache.tap is None  # no hidden states kept unless asked for (the adapters' tap_layer)
    assert (solo.batched_decode, paged.batched_decode) == (False, True)
    q, kv = np.zeros((config.num_attention_heads, 1, config.head_dim)), np.zeros((2, 1, config.head_dim))
    with pytest.raises(NotImplementedError, match="KVCache has no batched decode attention"):
        solo.decode_attention(q, kv, kv, [solo], 0, None)

    class Incomplete(Cache):  # a cache that forgot `truncate` cannot be made
        def reserve(self, positions: int) -> None: ...

        def record(self, tokens) -> None: ...

    with pytest.raises(TypeError, match="truncate"):
        Incomplete()


def test_a_paged_sequence_rewinds_within_its_last_block_and_refuses_to_rewind_into_full_ones(folder):
    engine = load_engine(str(folder))
    pool = BlockPool(engine.config, count=8, size=8)

    def sequence() -> PagedSequence:
        assert pool.reserve(3)
        cache = PagedSequence(pool, engine.config, 24, reserved=3)
        cache.reserve(20)
        return cache

    other = np.array([5, 6])
    rewound = sequence()
    engine.forward_batch([(IDS[:20], 0, rewound)], [True])  # blocks 0 and 1 full (registered), 2 holds 16..19
    got = engine.forward_batch([(other, 18, rewound)], [True])  # positions 18 and 19 rewritten
    assert rewound.tokens == [*IDS[:18], 5, 6]
    fresh = sequence()
    engine.forward_batch([(IDS[:18], 0, fresh)], [False])
    np.testing.assert_allclose(got, engine.forward_batch([(other, 18, fresh)], [True]), rtol=1e-5, atol=1e-5)

    message = (
        "a paged sequence cannot rewind to position 10: its positions before 16 are in full blocks other "
        "sequences may share (it can forget positions 16.. only)"
    )
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        engine.forward_batch([(other, 10, rewound)], [True])
    assert rewound.tokens == [*IDS[:18], 5, 6]  # refused before anything changed
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        rewound.truncate(10)
    for cache in (rewound, fresh):
        cache.release()
    assert pool.in_use == 0 and pool.reserved == 0
