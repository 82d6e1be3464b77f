"""BLAS threads: one for decoding, the policy's count for prompts, the library's own setting restored."""

from __future__ import annotations

import itertools

import pytest

from ruvllm.errors import InvalidArgumentError
from ruvllm.runtime.assembly import load_engine
from ruvllm.runtime.threads import Adaptive, BlasThreads, _blas_libraries

from conftest import numpy_model

BLAS = _blas_libraries()
pytestmark = pytest.mark.skipif(not BLAS, reason="no BLAS library that threadpoolctl can steer")


def blas_threads() -> int:
    return BLAS[0].num_threads


class Spy:
    """Wraps a matrix and records the BLAS thread count while it is multiplied."""

    def __init__(self, matrix) -> None:
        self.matrix, self.seen = matrix, []

    def __call__(self, x):
        self.seen.append(blas_threads())
        return self.matrix(x)

    def __getattr__(self, name):
        return getattr(self.matrix, name)


def test_a_forward_decodes_on_one_thread_and_reads_a_prompt_on_the_policys_count(tmp_path):
    numpy_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), threads=3)
    spy = Spy(engine.weights.layers[0].mlp.down_proj.matrix)
    engine.weights.layers[0].mlp.down_proj.matrix = spy
    BLAS[0].set_num_threads(2)
    cache = engine.new_cache()
    engine.forward(list(range(40)), 0, cache)  # a prompt
    engine.forward([5], 40, cache)  # a decoding step
    assert spy.seen == [3, 1]
    assert blas_threads() == 2  # restored for the rest of the process


def test_thread_counts_are_checked():
    assert BlasThreads(4).for_rows(1) == 1 and BlasThreads(4).for_rows(64) == 4
    with pytest.raises(InvalidArgumentError, match="threads must be an integer >= 1, got 0"):
        BlasThreads(0)


def run_calls(adaptive: Adaptive, rows: int, seconds_per_row: dict[int, float], calls: int) -> list[int]:
    """Counts `adaptive` chooses for `calls` calls of `rows`, each taking seconds_per_row[count] per row."""
    chosen = []
    for _ in range(calls):
        count = adaptive.choose(rows)
        adaptive.record(rows, count, seconds_per_row[count] * rows)
        chosen.append(count)
    return chosen


def test_the_default_measures_both_counts_then_keeps_the_faster():
    adaptive = Adaptive(2)
    quiet = {1: 2.0, 2: 1.1}  # every core nearly twice as fast
    chosen = run_calls(adaptive, 128, quiet, 40)
    assert chosen[:2] == [1, 2]  # one thread first: at worst a new size runs at one thread's speed
    assert chosen[2:6] == [2, 2, 2, 2] and chosen[6] == 1  # the other count, tried again after 4 calls
    probes = [i for i, c in enumerate(chosen) if c == 1 and i > 0]
    assert [b - a for a, b in itertools.pairwise(probes)] == [9, 17]  # then after 8, after 16


def test_the_default_backs_off_to_one_thread_when_the_machine_gets_busy():
    """The collapse measured on a shared 2-core machine: every core ~10x slower than one thread."""
    adaptive = Adaptive(2)
    run_calls(adaptive, 128, {1: 2.0, 2: 1.1}, 20)
    busy = {1: 2.1, 2: 20.0}
    chosen = run_calls(adaptive, 128, busy, 200)
    slow = chosen.count(2)
    assert chosen[-100:].count(2) <= 1  # back on one thread, the other tried again rarely
    assert slow <= 10, chosen
    quiet_again = run_calls(adaptive, 128, {1: 2.0, 2: 1.1}, 300)
    assert quiet_again[-50:].count(2) >= 49  # and back to every core once it is faster again


def test_sizes_are_measured_apart_and_decoding_stays_on_one_thread():
    policy = BlasThreads(None)
    assert policy.for_rows(1) == 1 and policy.for_rows(4) == 1
    if policy.adaptive is not None:
        assert policy.for_rows(100) == 1  # a size never measured: one thread first
        policy.adaptive.record(100, 1, 1.0)
        assert policy.for_rows(100) == policy.prefill and policy.for_rows(1000) == 1


def test_a_forward_is_timed_and_recorded_by_the_default(tmp_path):
    numpy_model("llama", tmp_path)
    ticks = iter(range(0, 10_000, 10))
    engine = load_engine(str(tmp_path))
    if engine.threads.adaptive is None:
        pytest.skip("one CPU: nothing to choose")
    engine.threads.adaptive.clock = lambda: next(ticks)
    cache = engine.new_cache()
    engine.forward(list(range(40)), 0, cache)
    engine.forward([5], 40, cache)  # decoding: not measured
    assert engine.threads.adaptive.sizes[(40).bit_length()].per_row == {1: 10 / 40}
