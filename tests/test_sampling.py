"""Sampling on constructed logits: filters against transformers' warpers, seeds, and option checks."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ruvllm.errors import InvalidArgumentError
from ruvllm.model.plan import PICK_MAX, TopLogits
from ruvllm.runtime.generate import GenerationOptions
from ruvllm.runtime.sampling import (
    SamplingOptions,
    apply_repetition_penalty,
    filter_candidates,
    make_sampler,
    picked,
    top_candidates,
)

pytestmark = pytest.mark.parity

V = 1000


def logits(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, V).astype(np.float32)


def hf_allowed(x: np.ndarray, o: SamplingOptions) -> set[int]:
    scores = torch.from_numpy(x.astype(np.float64))[None]
    ids = torch.zeros((1, 1), dtype=torch.long)
    warpers = [TemperatureLogitsWarper(o.temperature)]
    if o.top_k:
        warpers.append(TopKLogitsWarper(o.top_k))
    if o.top_p < 1:
        warpers.append(TopPLogitsWarper(o.top_p))
    if o.min_p > 0:
        warpers.append(MinPLogitsWarper(o.min_p))
    for w in warpers:
        scores = w(ids, scores)
    return set(torch.nonzero(torch.isfinite(scores[0])).flatten().tolist())


CASES = [
    dict(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0),
    dict(temperature=0.7, top_k=0, top_p=0.9, min_p=0.0),
    dict(temperature=1.3, top_k=0, top_p=1.0, min_p=0.1),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=2.0, top_k=100, top_p=0.5, min_p=0.02),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_filters_keep_the_same_tokens_as_transformers(case):
    for seed in range(5):
        x = logits(seed)
        o = SamplingOptions(**case)
        ids, probs = filter_candidates(x, o)
        assert set(ids.tolist()) == hf_allowed(x, o)
        assert probs.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_samples_never_leave_the_allowed_set(case):
    x = logits(3)
    o = SamplingOptions(**case, seed=11)
    allowed = hf_allowed(x, o)
    sample = make_sampler(o)
    drawn = {sample(x, []) for _ in range(2000)}
    assert drawn <= allowed
    assert len(drawn) > 1 or len(allowed) == 1


def test_draws_follow_the_distribution():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float64)).astype(np.float32)
    sample = make_sampler(SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5))
    counts = np.bincount([sample(x, []) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.015)


def test_greedy_is_argmax():
    x = logits(4)
    assert make_sampler(SamplingOptions(temperature=0))(x, []) == int(np.argmax(x))


def test_same_seed_same_tokens_different_seed_different_tokens():
    x = logits(5)

    def draws(seed):
        sample = make_sampler(SamplingOptions(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed))
        return [sample(x, []) for _ in range(50)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)


def test_top_candidates_take_equal_logits_by_id_at_the_cut_too():
    x = np.array([1, 3, 2, 3, 0, 2, 3, 2], np.float32)
    ids, values = top_candidates(x, 5)
    assert ids.tolist() == [1, 3, 6, 2, 5] and values.tolist() == [3, 3, 3, 2, 2]
    assert top_candidates(x, 0)[0].tolist() == [1, 3, 6, 2, 5, 7, 0, 4] == top_candidates(x, 8)[0].tolist()


@pytest.mark.parametrize(
    "case",
    [dict(temperature=0), CASES[0], CASES[3], dict(temperature=0.5, top_k=PICK_MAX, top_p=0.7, min_p=0.1)],
    ids=str,
)
def test_the_largest_logits_alone_give_the_rows_tokens(case):
    """What a GPU's plan reads back in place of the row (plan.TopLogits: the `picked` largest, as
    top_candidates takes them): the sampler draws the same tokens from them as from the row, ties
    included (every logit here is one of 50 values)."""
    x = np.repeat(logits(7)[:50], V // 50)[np.random.default_rng(1).permutation(V)]
    o = SamplingOptions(**case, seed=4)
    k = picked(o, V)
    assert k == (1 if o.temperature == 0 else o.top_k)
    from_rows, from_top = make_sampler(o), make_sampler(o)
    top = TopLogits(*top_candidates(x, k), nonfinite=0)
    drawn = [from_rows(x, []) for _ in range(300)]
    assert drawn == [from_top(top, []) for _ in range(300)]
    assert len(set(drawn)) == 1 if o.temperature == 0 else len(set(drawn)) > 1


def test_only_greedy_and_top_k_without_a_penalty_pick():
    assert picked(SamplingOptions(top_k=0), V) == 0  # every logit counts
    assert picked(SamplingOptions(top_k=PICK_MAX + 1), V) == 0
    assert picked(SamplingOptions(top_k=40, repetition_penalty=1.1), V) == 0  # seen tokens' logits change
    assert picked(SamplingOptions(temperature=0, repetition_penalty=1.1), V) == 0
    assert picked(SamplingOptions(top_k=40), 30) == 30  # a vocabulary smaller than k: all of it


def test_repetition_penalty_matches_transformers():
    x = logits(6)
    history = [3, 17, 17, 512, 999, 4]
    expected = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([history]), torch.from_numpy(x.copy())[None])[0]
    np.testing.assert_allclose(apply_repetition_penalty(x, history, 1.3), expected.numpy(), rtol=1e-6)
    # and it changes greedy choices: the best token, once seen, can lose its place
    best = int(np.argmax(x))
    assert make_sampler(SamplingOptions(temperature=0, repetition_penalty=100.0))(x, [best]) != best


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(temperature=-0.5), r"temperature must be >= 0, got -0.5"),
        (dict(temperature=float("nan")), r"temperature must be >= 0, got nan"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(top_k=-1), r"top_k must be an integer >= 0, got -1"),
        (dict(min_p=2.0), r"min_p must be in \[0, 1\], got 2.0"),
        (dict(repetition_penalty=0.0), r"repetition_penalty must be > 0, got 0.0"),
        (dict(seed=-3), r"seed must be an integer >= 0, got -3"),
        (dict(temperature="hot"), r"temperature must be a number, got 'hot'"),
        (dict(max_tokens=0), r"max_tokens must be an integer >= 1, got 0"),
        (dict(stop=[""]), r"stop must be a list of non-empty strings"),
        (dict(tempreature=1.0), r"unknown option 'tempreature'"),
    ],
)
def test_invalid_options_are_refused_by_name(options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        GenerationOptions.from_kwargs(**options)
