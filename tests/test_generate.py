"""Generation layers: stop strings, finish reasons, context limits, and the chunk stream."""

from __future__ import annotations

import numpy as np
import pytest

from ruvllm.errors import ContextFullError, InvalidArgumentError
from ruvllm.runtime.assembly import load_engine
from ruvllm.runtime.generate import GenerationOptions, Step, generate_tokens
from ruvllm.text.detokenizer import StreamingDetokenizer
from ruvllm.text.stream import generate_text

from conftest import numpy_model

TABLE = [b"Hel", b"lo", b" wor", b"ld", b"!", b"\xf0\x9f", b"\xa4\x96", b"<eos>"]
EOS = 7


def run_text(token_ids: list[int], stop: list[str], last_reason: str = "length"):
    steps = [Step(t, None, 1.0 if i == 0 else None) for i, t in enumerate(token_ids)]
    steps[-1] = Step(token_ids[-1], "stop" if token_ids[-1] == EOS else last_reason, steps[-1].prefill_ms)
    return list(generate_text(iter(steps), StreamingDetokenizer(TABLE), 3, stop, [EOS]))


def text_of(chunks) -> str:
    return "".join(c.text for c in chunks)


def test_stop_string_spanning_tokens_cuts_right_before_it():
    chunks = run_text([0, 1, 2, 3, 4], ["lo w"])
    assert text_of(chunks) == "Hel"
    assert chunks[-1].finish_reason == "stop" and chunks[-1].token_id == 2  # found once " wor" arrived
    assert len(chunks) == 3


def test_text_that_might_start_a_stop_string_is_held_then_released():
    chunks = run_text([0, 1, 2, 3, 4], ["lox"])
    # "l", then "lo" could begin "lox": each is held until the next token rules it out
    assert [c.text for c in chunks] == ["He", "l", "lo wor", "ld", "!"]
    assert chunks[-1].finish_reason == "length"


def test_earliest_of_several_stop_strings_wins():
    assert text_of(run_text([0, 1, 2, 3, 4], ["ld!", "o w"])) == "Hell"


def test_eos_ends_with_stop_and_adds_no_text():
    chunks = run_text([0, 1, EOS], [])
    assert text_of(chunks) == "Hello" and chunks[-1].finish_reason == "stop" and chunks[-1].token_id == EOS
    assert chunks[-1].stats.completion_tokens == 3 and chunks[-1].stats.prompt_tokens == 3


def test_a_character_split_over_tokens_arrives_whole():
    chunks = run_text([0, 5, 6, 1], [])
    assert [c.text for c in chunks] == ["Hel", "", "🤖", "lo"]


# --- token layer on a tiny random model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    numpy_model("llama", folder, max_position_embeddings=64)
    return load_engine(str(folder), context_length=32)


def test_max_tokens_gives_length(engine):
    steps = list(generate_tokens(engine, [1, 2, 3], GenerationOptions(max_tokens=5)))
    assert len(steps) == 5 and [s.finish_reason for s in steps] == [None] * 4 + ["length"]
    assert steps[0].prefill_ms is not None and steps[1].prefill_ms is None


def test_eos_stops_unless_ignored(engine):
    greedy = GenerationOptions.from_kwargs(max_tokens=6, temperature=0)
    first = [s.token_id for s in generate_tokens(engine, [5, 6, 7], greedy)]
    eos = first[2]  # pretend the third greedy token is the end-of-sequence token
    stopped = list(generate_tokens(engine, [5, 6, 7], greedy, eos_ids=[eos]))
    assert [s.token_id for s in stopped] == first[: first.index(eos) + 1] and stopped[-1].finish_reason == "stop"
    ignoring = GenerationOptions.from_kwargs(max_tokens=6, temperature=0, ignore_eos=True)
    assert [s.token_id for s in generate_tokens(engine, [5, 6, 7], ignoring, eos_ids=[eos])] == first


def test_prompt_longer_than_the_context_is_refused(engine):
    with pytest.raises(ContextFullError, match="the prompt has 33 tokens but the context window is 32"):
        generate_tokens(engine, list(range(33)), GenerationOptions())


def test_generation_stops_with_length_when_the_context_fills(engine):
    steps = list(generate_tokens(engine, list(range(30)), GenerationOptions(max_tokens=100)))
    assert len(steps) == 3 and steps[-1].finish_reason == "length"  # positions 30, 31 fed back; the 3rd has no room


def test_bad_token_ids_and_empty_prompts_are_refused(engine):
    with pytest.raises(InvalidArgumentError, match=r"token id 500 is outside the vocabulary \[0, 128\)"):
        list(generate_tokens(engine, [1, 500], GenerationOptions()))
    with pytest.raises(InvalidArgumentError, match="the prompt is empty"):
        generate_tokens(engine, [], GenerationOptions())
    for ids in ([3, -1, 7], np.array([3, 128, -2]), np.array([5, 2**40], np.uint64)):  # the first bad one named
        with pytest.raises(InvalidArgumentError, match=rf"token id {ids[1]} is outside the vocabulary \[0, 128\)"):
            engine.forward(ids, 0, engine.new_cache())


# --- on the real model


def test_stop_string_on_the_real_model(smollm2):
    full = "".join(c.text for c in smollm2.generate("Once upon a time", max_tokens=40, temperature=0))
    stop = full.split()[6]  # a word from the middle of the greedy text
    chunks = list(smollm2.generate("Once upon a time", max_tokens=40, temperature=0, stop=[stop]))
    assert "".join(c.text for c in chunks) == full[: full.index(stop)]
    assert chunks[-1].finish_reason == "stop"


def test_stats_are_filled(smollm2):
    chunks = list(smollm2.generate("Hello there", max_tokens=8, temperature=0, ignore_eos=True))
    stats = chunks[-1].stats
    assert stats.prompt_tokens == len(smollm2.tokenizer.encode("Hello there"))
    assert stats.completion_tokens == 8
    assert 0 < stats.prefill_ms <= stats.ttft_ms and stats.decode_tok_s > 0
