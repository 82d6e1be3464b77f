"""One model, several generations at once: threads, generators stepped in turn, abandoned generators,
and adapters that differ between them or change under them. Each must give the tokens it gives alone.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ruvllm.errors import InferenceError

PROMPTS = ("Once upon a time", "The three primary colors are")
GREEDY = dict(max_tokens=12, temperature=0, ignore_eos=True)


def ids_of(chunks) -> list[int]:
    return [c.token_id for c in chunks]


@pytest.fixture(scope="module")
def alone(smollm2) -> dict[str, list[int]]:
    """Each prompt's greedy tokens, generated with nothing else going on."""
    return {prompt: ids_of(smollm2.generate(prompt, **GREEDY)) for prompt in PROMPTS}


@pytest.fixture
def adapted(smollm2):
    """An adapter that visibly changes the output (B away from zero), removed afterwards."""
    adapter = smollm2.new_adapter("concurrency", targets=("down_proj",))
    rng = np.random.default_rng(0)
    for b in adapter.B.values():
        b[...] = rng.normal(0, 0.5, b.shape)
    smollm2.set_adapter(None)
    yield "concurrency"
    smollm2.set_adapter(None)


def test_two_threads_on_one_model_each_get_the_tokens_they_get_alone(smollm2, alone):
    results, errors = {}, []
    start = threading.Barrier(len(PROMPTS))

    def run(prompt: str) -> None:
        try:
            start.wait()
            results[prompt] = [ids_of(smollm2.generate(prompt, **GREEDY)) for _ in range(2)]
        except Exception as e:  # reported below: a thread's exception would otherwise vanish
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for prompt in PROMPTS:
        assert results[prompt] == [alone[prompt]] * 2


def test_two_generators_stepped_in_turn_each_get_their_tokens(smollm2, alone):
    streams = [smollm2.generate(p, **GREEDY) for p in PROMPTS]
    got = [[], []]
    for _ in range(GREEDY["max_tokens"]):
        for i, stream in enumerate(streams):
            got[i].append(next(stream).token_id)
    assert got == [alone[p] for p in PROMPTS]


def test_an_abandoned_generator_resumed_after_another_call_continues_correctly(smollm2, alone):
    first = smollm2.generate(PROMPTS[0], **GREEDY)
    begun = [next(first).token_id for _ in range(3)]
    assert ids_of(smollm2.generate(PROMPTS[1], **GREEDY)) == alone[PROMPTS[1]]
    assert begun + ids_of(first) == alone[PROMPTS[0]]


def test_a_chat_turn_still_reuses_the_cache_of_the_previous_one(smollm2):
    turn = [{"role": "user", "content": "Name a colour."}]
    reply = "".join(c.text for c in smollm2.chat(turn, max_tokens=8, temperature=0))
    follow_up = [*turn, {"role": "assistant", "content": reply}, {"role": "user", "content": "Another one?"}]
    first = next(smollm2.chat(follow_up, max_tokens=1, temperature=0))
    assert first.stats.cached_tokens >= len(smollm2.tokenizer.encode_chat(turn))


def test_interleaved_generations_each_keep_their_own_adapter(smollm2, adapted):
    prompt = PROMPTS[0]
    base = ids_of(smollm2.generate(prompt, **GREEDY, adapter=None))
    with_adapter = ids_of(smollm2.generate(prompt, **GREEDY, adapter=adapted))
    assert base != with_adapter
    streams = [smollm2.generate(prompt, **GREEDY, adapter=adapted), smollm2.generate(prompt, **GREEDY, adapter=None)]
    got = [[], []]
    for _ in range(GREEDY["max_tokens"]):
        for i, stream in enumerate(streams):
            got[i].append(next(stream).token_id)
    assert got == [with_adapter, base]
    assert smollm2.adapters.active is None  # the last option given stays selected, as before


def test_an_adapter_that_learns_during_a_generation_ends_it_with_an_error(smollm2, adapted):
    stream = smollm2.generate(PROMPTS[0], **GREEDY, adapter=adapted)
    next(stream)
    smollm2.adapt("The sky is", " green.", adapter=adapted, steps=1)
    with pytest.raises(InferenceError, match="adapter 'concurrency' changed while this generation was running"):
        next(stream)
