"""BLAS threads: one for decoding, the policy's count for prompts, the library's own setting restored."""

from __future__ import annotations

import pytest

from ruvllm.errors import InvalidArgumentError
from ruvllm.runtime.engine import load_engine
from ruvllm.runtime.threads import BlasThreads, _blas_libraries

from conftest import tiny_model

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
    tiny_model("llama", tmp_path)
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
