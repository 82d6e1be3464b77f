"""Choosing the next token: options, checked once, and a sampler closure that owns its RNG.

Order of operations (as Hugging Face transformers applies its logits warpers): repetition penalty,
then temperature, top-k, top-p, min-p, and a draw from what is left. Temperature 0 is greedy.
The same seed gives the same tokens.

Dimension letters: V vocab, N candidates left after filtering.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError
from ..model.plan import PICK_MAX, TopLogits

Sampler = Callable[[np.ndarray | TopLogits, Sequence[int]], int]
_LARGEST = np.finfo(np.float64).max


@dataclass(frozen=True)
class SamplingOptions:
    """Defaults follow llama.cpp's command line: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05."""

    temperature: float = 0.8
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1 disables
    min_p: float = 0.05  # 0 disables
    repetition_penalty: float = 1.0  # 1 disables
    seed: int | None = None  # None draws a fresh seed from the OS

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            value = getattr(self, name)
            _check(name, value, isinstance(value, (int, float)) and not isinstance(value, bool), "a number")
        _check("temperature", self.temperature, math.isfinite(self.temperature) and self.temperature >= 0, ">= 0")
        _check(
            "top_k",
            self.top_k,
            isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0,
            "an integer >= 0",
        )
        _check("top_p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]")
        _check("min_p", self.min_p, 0 <= self.min_p <= 1, "in [0, 1]")
        _check(
            "repetition_penalty",
            self.repetition_penalty,
            math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0,
            "> 0",
        )
        _check(
            "seed", self.seed, self.seed is None or (isinstance(self.seed, int) and self.seed >= 0), "an integer >= 0"
        )


def _check(name: str, value: object, ok: bool, expected: str) -> None:
    if not ok:
        raise InvalidArgumentError(f"{name} must be {expected}, got {value!r}")


def apply_repetition_penalty(logits: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL-style: for tokens already seen, divide positive logits by `penalty`, multiply negative ones.
    In float64, and never up to +inf (a tiny penalty would make it, and inf - inf is NaN downstream)."""
    if penalty == 1.0 or not len(history):
        return logits
    seen = np.unique(np.asarray(history, dtype=np.int64))  # (n,)
    values = logits[seen].astype(np.float64)  # (n,)
    logits = logits.astype(np.float64)  # (V,)
    with np.errstate(over="ignore"):  # a product past the range is -inf: probability 0, as it tends to
        logits[seen] = np.minimum(np.where(values > 0, values / penalty, values * penalty), _LARGEST)
    return logits


def shifted_logits(logits: np.ndarray, temperature: float) -> np.ndarray:
    """(logits - max) / temperature in float64: 0 for the best token, below 0 or -inf for the others, never
    NaN. Dividing first overflows: a subnormal temperature (1e-320) makes logits of ±inf, and inf - inf is
    NaN; in this order a tiny temperature is the limit it tends to, greedy."""
    logits = logits.astype(np.float64)  # (V,)
    with np.errstate(over="ignore"):  # a quotient past the range is -inf: probability 0, as it tends to
        return (logits - logits.max()) / temperature  # (V,)


def top_candidates(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, logits) of the k largest logits (all of them when k is 0 or >= V), best first; equal
    logits in the order of their ids, the lower first, at the cut too (as np.argmax takes the first). A
    GPU's plan picks the same ones from the same logits (TopLogits), so either way the sampler sees the
    same candidates in the same order."""
    V = logits.size
    if 0 < k < V:
        kth = np.partition(logits, V - k)[V - k]  # the k-th largest value
        above = np.flatnonzero(logits > kth)
        ids = np.sort(np.concatenate([above, np.flatnonzero(logits == kth)[: k - above.size]]))  # (k,)
    else:
        ids = np.arange(V)
    ids = ids[np.argsort(-logits[ids], kind="stable")]  # by value; equal ones stay in the order of their ids
    return ids, logits[ids]


def filter_candidates(logits: np.ndarray, options: SamplingOptions) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities) that survive temperature, top-k, top-p and min-p; probabilities sum to 1."""
    return filter_top(*top_candidates(logits, options.top_k), options)


def filter_top(ids: np.ndarray, values: np.ndarray, options: SamplingOptions) -> tuple[np.ndarray, np.ndarray]:
    """filter_candidates after top-k: from the candidates (ids, logits) of top_candidates, best first."""
    scaled = shifted_logits(values, options.temperature)  # (N,)
    probs = np.exp(scaled)  # the best token's is 1
    probs /= probs.sum()  # (N,)
    if options.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < top_p.
        before = np.cumsum(probs) - probs
        keep = before < options.top_p
        ids, probs = ids[keep], probs[keep]
    if options.min_p > 0.0:
        keep = probs >= options.min_p * probs[0]
        ids, probs = ids[keep], probs[keep]
    return ids, probs / probs.sum()


def make_sampler(options: SamplingOptions) -> Sampler:
    """A closure `sample(logits, history) -> token id` with its own random generator. `logits`: the (V,)
    row, or only its largest (TopLogits, from a GPU's plan: greedy or top-k sampling without a
    repetition penalty needs no more), which give the same token as the row they come from."""
    rng = np.random.default_rng(options.seed)

    def sample(logits: np.ndarray | TopLogits, history: Sequence[int]) -> int:
        if isinstance(logits, TopLogits):
            ids, values = logits.ids, logits.values
            if options.temperature == 0:
                return int(ids[0])
        else:
            logits = apply_repetition_penalty(logits, history, options.repetition_penalty)
            if options.temperature == 0:
                return int(np.argmax(logits))
            ids, values = top_candidates(logits, options.top_k)
        ids, probs = filter_top(ids, values, options)
        mass = np.cumsum(probs)  # (N,)
        # Below the sum as it came out of the rounding: the draw never falls past the end, onto a token of
        # probability 0 (whose log-probability, -inf, is no JSON number).
        draw = min(rng.random() * mass[-1], np.nextafter(mass[-1], 0.0))
        return int(ids[np.searchsorted(mass, draw, side="right")])

    return sample


def picked(options: SamplingOptions, vocab: int) -> int:
    """How many of the largest logits decide the sampler's choice (0: it reads them all): 1 when greedy,
    top_k with top-k sampling, when no repetition penalty looks at the others; a GPU's plan then reads
    back only those (TopLogits), up to PICK_MAX of them."""
    if options.repetition_penalty != 1.0:
        return 0
    k = 1 if options.temperature == 0 else min(options.top_k, vocab)
    return k if 0 < k <= PICK_MAX else 0
