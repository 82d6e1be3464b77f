"""Continuous batching (runtime/batching.py) over the paged KV cache (model/paged.py): every sequence
decodes exactly the tokens it decodes alone, whatever joins, leaves or shares blocks beside it."""

from __future__ import annotations

import numpy as np
import pytest

from ruvllm.errors import ContextFullError, InvalidArgumentError
from ruvllm.runtime.batching import Scheduler
from ruvllm.runtime.generate import GenerationOptions, Step, common_prefix, generate_tokens
from ruvllm.runtime.sampling import SamplingOptions

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "List three colors:",
    "In 1492, Columbus",
    "Water boils at",
    "My favourite food is pizza because it",
    "The quick brown fox",
]
SYSTEM = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."}]


def greedy(max_tokens: int, **options) -> GenerationOptions:
    return GenerationOptions(max_tokens=max_tokens, sampling=SamplingOptions(temperature=0, **options))


def solo(model, ids: list[int], options: GenerationOptions) -> list[int]:
    engine = model.engine
    steps = generate_tokens(engine, ids, options, model.eos_token_ids, cache=engine.new_cache(), reuse_prefix=False)
    return [s.token_id for s in steps]


def run(scheduler: Scheduler, jobs: list[tuple[int, list[int], GenerationOptions]], model) -> list[list]:
    """Submit each job (join step, prompt ids, options) at its step; step until all are done."""
    outputs: list[list] = [[] for _ in jobs]
    step = 0
    while step < 2000:
        for i, (join, ids, options) in enumerate(jobs):
            if join == step:
                scheduler.submit(ids, options, outputs[i].append, model.eos_token_ids)
        scheduler.step()
        step += 1
        if step > max(j for j, _, _ in jobs) and not scheduler.running and not scheduler.waiting:
            return outputs
    raise AssertionError("the scheduler did not finish")


def ids_of(outputs: list) -> list[int]:
    assert all(isinstance(s, Step) for s in outputs), outputs
    return [s.token_id for s in outputs]


def test_eight_requests_joining_at_different_steps_decode_what_they_decode_alone(smollm2):
    chat = [smollm2.tokenizer.encode_chat([*SYSTEM, {"role": "user", "content": p}]) for p in PROMPTS[:4]]
    prompts = [smollm2.tokenizer.encode(p) for p in PROMPTS[4:]] + chat  # 4 raw, 4 chats of different lengths
    lengths = [12, 20, 16, 8, 24, 10, 18, 14]
    joins = [0, 0, 1, 3, 3, 5, 8, 9]
    jobs = [(j, ids, greedy(n)) for j, ids, n in zip(joins, prompts, lengths, strict=True)]
    scheduler = Scheduler(smollm2.engine, max_concurrent=8, max_context=512, prefill_tokens=16)
    batched = run(scheduler, jobs, smollm2)
    for (_, ids, options), out in zip(jobs, batched, strict=True):
        assert ids_of(out) == solo(smollm2, ids, options)
    assert scheduler.metrics.last_batch_sequences >= 1 and scheduler.metrics.steps < sum(lengths)
    # the three later chats found the blocks of the system prompt the first chat computed
    shared = common_prefix(chat[0], chat[1]) // 16 * 16
    assert shared >= 16 and [out[0].cached_tokens for out in batched[5:]] == [shared] * 3
    assert scheduler.pool.in_use == 0 and scheduler.pool.reserved == 0  # every block went back


def test_many_concurrent_requests_with_different_prompts_never_see_each_others_keys(smollm2):
    """The seeds' KV-leak bug: 16 requests through 6 slots and a pool too small for all of them at
    once (they queue), each compared with its solo run."""
    rng = np.random.default_rng(7)
    topics = ["cats", "rain", "trains", "music", "bread", "stars", "rivers", "chess"]
    prompts = [smollm2.tokenizer.encode(f"A few words about {topics[i % 8]} ({i}):") for i in range(16)]
    lengths = [int(n) for n in rng.integers(3, 9, size=16)]
    jobs = [(int(rng.integers(0, 8)), ids, greedy(n)) for ids, n in zip(prompts, lengths, strict=True)]
    scheduler = Scheduler(smollm2.engine, max_concurrent=6, max_context=64, blocks=12, block_size=8)
    outputs = run(scheduler, jobs, smollm2)
    for (_, ids, options), out in zip(jobs, outputs, strict=True):
        assert ids_of(out) == solo(smollm2, ids, options)
    assert scheduler.metrics.finished == 16 and scheduler.pool.reserved == 0


def test_sampling_with_a_seed_gives_the_same_tokens_batched_and_alone(smollm2):
    ids = [smollm2.tokenizer.encode(p) for p in PROMPTS[:3]]
    options = GenerationOptions(max_tokens=12, sampling=SamplingOptions(temperature=0.9, seed=5))
    outputs = run(Scheduler(smollm2.engine, max_concurrent=3, max_context=128), [(0, p, options) for p in ids], smollm2)
    for p, out in zip(ids, outputs, strict=True):
        assert ids_of(out) == solo(smollm2, p, options)


def test_a_cancelled_request_frees_its_blocks_at_the_next_step(smollm2):
    scheduler = Scheduler(smollm2.engine, max_concurrent=2, max_context=128)
    received: list = []
    request = scheduler.submit(smollm2.tokenizer.encode(PROMPTS[0]), greedy(100), received.append)
    for _ in range(3):
        scheduler.step()
    assert scheduler.pool.in_use > 0 and len(received) == 3
    scheduler.cancel(request)
    scheduler.step()
    assert not scheduler.running and scheduler.pool.in_use == 0 and scheduler.pool.reserved == 0
    assert len(received) == 3 and scheduler.metrics.cancelled == 1


def test_requests_that_cannot_fit_are_refused_with_the_reason(smollm2):
    scheduler = Scheduler(smollm2.engine, max_concurrent=2, max_context=16, blocks=2, block_size=4)
    with pytest.raises(ContextFullError, match="the prompt has 20 tokens but the context window is 16"):
        scheduler.submit(list(range(20)), greedy(4), print)
    with pytest.raises(InvalidArgumentError, match="token id 999999 is outside the vocabulary"):
        scheduler.submit([1, 999999], greedy(4), print)
    received: list = []
    scheduler.submit(list(range(1, 10)), greedy(4), received.append)  # 13 positions: 4 blocks, the pool has 2
    scheduler.step()
    assert len(received) == 1 and isinstance(received[0], ContextFullError)
    assert "needs 4 KV blocks; there are 2" in str(received[0])
    assert not scheduler.waiting and scheduler.metrics.refused == 2  # at submit, then at admission


@pytest.mark.parametrize("cold", ["int8", "int4"])
def test_blocks_past_the_hot_window_go_cold_and_batching_still_changes_nothing(smollm2_dir, cold):
    """With hot_tokens, whole blocks older than each sequence's newest positions become int8/int4 codes
    (their float32 slots reused); every sequence still decodes the same tokens batched as alone."""
    import ruvllm
    from ruvllm.model.cache import KVOptions

    model = ruvllm.load(smollm2_dir, kv=KVOptions(hot_tokens=16, cold=cold))
    story = "Once upon a time, in a small village by the sea, there lived an old fisherman and his cat."
    prompts = [model.tokenizer.encode(f"Chapter {n}. {story}") for n in range(4)]  # no common prefix
    jobs = [(i, ids, greedy(10 + 2 * i)) for i, ids in enumerate(prompts)]
    batched = Scheduler(model.engine, max_concurrent=4, max_context=128, block_size=8)
    seen_cold = []
    outputs: list[list] = [[] for _ in jobs]
    for step in range(200):
        for i, (join, ids, options) in enumerate(jobs):
            if join == step:
                batched.submit(ids, options, outputs[i].append, model.eos_token_ids)
        batched.step()
        seen_cold.append(batched.pool.cold_blocks)
        if step > 4 and not batched.running:
            break
    assert max(seen_cold) >= 4 * 2  # each sequence's old blocks went cold
    for (_, ids, options), out in zip(jobs, outputs, strict=True):
        alone = Scheduler(model.engine, max_concurrent=1, max_context=128, block_size=8)
        assert ids_of(out) == ids_of(run(alone, [(0, ids, options)], model)[0])


def test_a_cold_block_reads_back_within_half_a_quantization_step(smollm2):
    from ruvllm.model.blocks import BlockPool

    config = smollm2.config
    pool = BlockPool(config, count=4, size=8, cold="int8")
    store = pool.storage
    pool.reserve(2)
    first, second = pool.take(), pool.take()
    rng = np.random.default_rng(0)
    for layer in range(config.num_hidden_layers):
        store.k[layer][:, store.slot[first]] = rng.standard_normal(store.k[layer][:, 0].shape)
        store.v[layer][:, store.slot[first]] = rng.standard_normal(store.v[layer][:, 0].shape)
    before = [(store.k[i][:, store.slot[first]].copy(), store.v[i][:, store.slot[first]].copy()) for i in range(3)]
    slot = store.slot[first]
    store.freeze(first)
    assert store.is_cold[first] and store.slot[first] == -1 and store.free_slots[-1] == slot  # the slot is reused next
    for layer, (k, v) in enumerate(before):
        keys, values = store.gather(layer, np.array([first, second]))  # (K, 2, B, E)
        for original, read, scales in ((k, keys[:, 0], store.k_scales[layer][:, first]),
                                       (v, values[:, 0], store.v_scales[layer][:, first])):  # fmt: skip
            assert np.all(np.abs(read - original) <= scales[..., None] / 2 + 1e-6)
            assert np.abs(read - original).max() > 0  # really quantized


def test_the_pool_takes_empty_blocks_first_then_the_least_recently_freed_registered_one(smollm2):
    from ruvllm.model.blocks import BlockPool

    pool, root, prompt = BlockPool(smollm2.config, count=3, size=2), ("weights", 0), [1, 2, 3, 4, 5]
    registry = pool.registry
    assert pool.reserve(3)
    a, b, c = pool.take(), pool.take(), pool.take()
    registry.register(a, registry.key(root, (1, 2)))
    registry.register(b, registry.key(registry.before(a), (3, 4)))
    for block in (b, a, c):  # b goes idle first, then a; c was never registered: it is emptied
        pool.release(block)
    assert pool.in_use == 0 and pool.free == 3 and pool.find_prefix(prompt, root) == [a, b]
    assert pool.reserve(3)
    assert [pool.take(), pool.take()] == [c, b]  # the empty block, then the oldest idle one (forgotten)
    assert pool.find_prefix(prompt, root) == [a]
    pool.share(a)  # an idle block held again comes out of the reservation too
    assert pool.in_use == 3 and pool.reserved == 0 and pool.free == 0
    for block in (a, b, c):
        pool.release(block)
    pool.clear_registry()  # other weights: nothing registered is valid
    assert pool.find_prefix(prompt, root) == [] and pool.free == 3 and pool.hot_slots == 0


def test_a_receiver_that_fails_ends_its_own_request_only(smollm2):
    scheduler = Scheduler(smollm2.engine, max_concurrent=2, max_context=64)

    def gone(step):
        raise RuntimeError("Event loop is closed")

    received: list = []
    scheduler.submit(smollm2.tokenizer.encode(PROMPTS[0]), greedy(50), gone)
    scheduler.submit(smollm2.tokenizer.encode(PROMPTS[1]), greedy(6), received.append)
    for _ in range(10):
        scheduler.step()
    assert ids_of(received) == solo(smollm2, smollm2.tokenizer.encode(PROMPTS[1]), greedy(6))
    assert not scheduler.running and scheduler.pool.in_use == 0
