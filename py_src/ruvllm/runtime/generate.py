"""Generation, the token layer (as in mlx-lm, generation is layered generators):

1. `generate_tokens` - token ids in, one `Step` per sampled token out (prefill, then decode).
   The Pyodide worker drives exactly this layer, one `next()` per token.
2. `text.stream.generate_text` - adds streaming detokenization, stop strings and timings (`Chunk`s).

Every call builds its own sampler and computes with the weights (adapter) active when it started, in
a cache it is given or makes; callers that share a cache between generations must not run two on it
at once (api.Model lends its cache to one generation at a time).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np

from ..errors import ContextFullError, InferenceError, InvalidArgumentError
from ..model.cache import KVCache
from ..model.plan import TopLogits
from .engine import Engine, WeightsIdentity
from .sampling import SamplingOptions, apply_repetition_penalty, make_sampler, picked, shifted_logits

DEFAULT_MAX_TOKENS = 256


MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class GenerationOptions:
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no log-probabilities; k: each token's and the k likeliest alternatives
    sampling: SamplingOptions = field(default_factory=SamplingOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        k = self.logprobs
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_TOP_LOGPROBS):
            raise InvalidArgumentError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {k!r}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidArgumentError(f"stop must be a list of non-empty strings, got {self.stop!r}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> GenerationOptions:
        """Flat keyword options (max_tokens=..., temperature=..., ...), unknown names refused."""
        own = {f.name for f in fields(cls)} - {"sampling"}
        sampling = {f.name for f in fields(SamplingOptions)}
        unknown = set(kwargs) - own - sampling
        if unknown:
            raise InvalidArgumentError(
                f"unknown option {sorted(unknown)[0]!r}; options are: {', '.join(sorted(own | sampling))}"
            )
        if "stop" in kwargs:
            stop = kwargs["stop"]
            kwargs["stop"] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        return cls(
            **{k: v for k, v in kwargs.items() if k in own},
            sampling=SamplingOptions(**{k: v for k, v in kwargs.items() if k in sampling}),
        )


@dataclass(frozen=True)
class Prefilling:
    """Between two forward calls over a long prompt (only with `report_prefill`): a caller that drives
    the generator one step at a time, like the worker, can act on an abort here."""

    done: int  # prompt positions the cache holds so far
    total: int


@dataclass(frozen=True)
class Step:
    token_id: int
    finish_reason: str | None  # "stop" (end-of-sequence token or a complete constrained output), "length", or None
    prefill_ms: float | None = None  # on the first step only
    cached_tokens: int = 0  # on the first step: prompt tokens whose keys/values came from the cache
    logprob: float | None = None  # with options.logprobs: log-probability of token_id (see Decoder)
    top_logprobs: tuple[tuple[int, float], ...] = ()  # the options.logprobs likeliest (id, log-probability)


class Constraint(Protocol):
    """What may restrict each step's choice (constrain.Matcher: a JSON schema)."""

    def allowed(self) -> np.ndarray:
        """(V,) bool: the tokens that may come next."""
        ...

    def advance(self, token_id: int) -> None: ...

    @property
    def complete(self) -> bool:
        """The output so far is whole: only an end-of-sequence token may follow."""
        ...


class Decoder:
    """The choice of each next token from its logits: the constraint's mask, the sampler (which owns its
    RNG), log-probabilities and the finish reason. One per sequence; the solo token loop and the batching
    scheduler both use it, so a sequence decodes the same tokens either way.

    Log-probabilities are those of the distribution the token is drawn from before top-k/top-p/min-p:
    the logits after the repetition penalty and the constraint's mask, divided by the temperature
    (temperature 0, greedy: divided by 1).
    """

    def __init__(
        self,
        prompt: list[int],
        options: GenerationOptions,
        eos: set[int],
        limit: int | None,
        constraint: Constraint | None = None,
    ) -> None:
        self.options, self.eos, self.limit, self.constraint = options, eos, limit, constraint
        self.sample = make_sampler(options.sampling)
        self.history = list(prompt)
        self.count = 0  # tokens chosen

    def picks(self, vocab: int) -> int:
        """How many of the largest logits this sequence's choices need (0: all of them, the row): none
        when a constraint masks or log-probabilities are asked for, else as sampling.picked."""
        if self.constraint is not None or self.options.logprobs is not None:
            return 0
        return picked(self.options.sampling, vocab)

    def choose(self, logits: np.ndarray | TopLogits, first: dict | None = None) -> Step:
        """The Step for logits (V,) of the last position, or their largest (TopLogits, when `picks` asked
        for them); `first`: Step fields of the first step."""
        position = len(self.history) - 1
        if isinstance(logits, TopLogits):
            broken = logits.nonfinite > 0 or not np.isfinite(logits.values).all()
        else:
            broken = not np.isfinite(logits).all()
        if broken:  # NaN or inf weights, or an overflow: never sample from garbage
            raise InferenceError(
                f"the model computed non-finite logits at position {position} (its weights or config values are broken)"
            )
        if self.constraint is not None:
            assert not isinstance(logits, TopLogits), "a constraint masks the whole row"
            logits = np.where(self.constraint.allowed(), logits, np.float32(-np.inf))  # (V,)
        token = self.sample(logits, self.history)
        logprob: float | None = None
        top: tuple[tuple[int, float], ...] = ()
        if self.options.logprobs is not None:
            assert not isinstance(logits, TopLogits), "log-probabilities need the whole row"
            logprob, top = self._logprobs(logits, token)
        self.history.append(token)
        self.count += 1
        position += 1  # where this token goes when fed back
        if self.constraint is not None and token not in self.eos:
            self.constraint.advance(token)
        if token in self.eos or (self.constraint is not None and self.constraint.complete and not self.eos):
            reason = "stop"
        elif self.count == self.options.max_tokens or (self.limit is not None and position >= self.limit):
            reason = "length"
        else:
            reason = None
        return Step(token, reason, **(first or {}), logprob=logprob, top_logprobs=top)

    def _logprobs(self, logits: np.ndarray, token: int) -> tuple[float, tuple[tuple[int, float], ...]]:
        sampling = self.options.sampling
        logits = apply_repetition_penalty(logits, self.history, sampling.repetition_penalty)
        scaled = shifted_logits(logits, sampling.temperature or 1.0)  # (V,) <= 0: finite however small the temperature
        logp = scaled - np.log(np.exp(scaled).sum())  # (V,)
        k = self.options.logprobs
        best = np.argpartition(-logp, k - 1)[:k] if k else np.empty(0, np.int64)
        best = best[np.argsort(-logp[best], kind="stable")]
        best = best[np.isfinite(logp[best])]  # tokens a constraint ruled out are no alternatives
        return float(logp[token]), tuple((int(i), float(logp[i])) for i in best)


def generate_tokens(
    engine: Engine,
    prompt_ids: Sequence[int],
    options: GenerationOptions,
    eos_ids: Iterable[int] = (),
    cache: KVCache | None = None,
    reuse_prefix: bool = True,
    report_prefill: bool = False,
    constraint: Constraint | None = None,
) -> Iterator[Step | Prefilling]:
    """Prefill the prompt, then sample one token per step until EOS, `max_tokens` or a full context.

    A `constraint` (constrain.Matcher) limits every step to the tokens it allows. With `reuse_prefix`,
    the longest prefix of the prompt that `cache` already holds (the previous turn of a chat) is not
    computed again. With `report_prefill`, a `Prefilling` comes between the forward
    calls of a long prompt. Bad prompts raise here, at call time; the returned generator does the work.
    """
    prompt = [int(t) for t in prompt_ids]
    cache = cache if cache is not None else engine.new_cache()
    limit = cache.max_positions
    if not prompt:
        raise InvalidArgumentError("the prompt is empty: give at least one token")
    if limit is not None and len(prompt) > limit:
        raise ContextFullError(f"the prompt has {len(prompt)} tokens but the context window is {limit}")
    engine.check_ids(prompt)
    identity = engine.weights_identity()  # every step computes with these weights (the adapter active now)
    refresh = stale_layers(engine, cache, identity)
    if refresh == 0:  # other weights from the first layer (an adapter switched): nothing can be reused
        cache.reset()
    cache.owner = None if refresh else identity  # mixed until the stale layers are recomputed
    reused = common_prefix(cache.tokens, prompt) if reuse_prefix else 0
    reused = min(reused, len(prompt) - 1)  # the last prompt token is always computed: it gives the logits
    eos = set() if options.ignore_eos else set(eos_ids)
    return _token_loop(engine, prompt, reused, refresh, options, eos, cache, identity, report_prefill, constraint)


def stale_layers(engine: Engine, cache: KVCache, identity: WeightsIdentity) -> int | None:
    """Where the entries of `cache` stop holding what the weights `identity` compute: None when they all
    do; the tap's layer when only layers from there up differ (an adapter there learned: they are
    recomputed from the tap); 0 when the cache must start over."""
    kept = engine.kept_layers(cache.owner, identity)
    if kept >= engine.config.num_hidden_layers or not cache.tokens:
        return None
    tap = cache.tap
    if tap is not None and tap.layer <= kept and tap.length >= len(cache.tokens):
        return tap.layer
    return 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _token_loop(
    engine: Engine,
    prompt: list[int],
    reused: int,
    refresh: int | None,
    options: GenerationOptions,
    eos: set[int],
    cache: KVCache,
    weights: WeightsIdentity,
    report_prefill: bool,
    constraint: Constraint | None,
) -> Iterator[Step | Prefilling]:
    limit = cache.max_positions
    decoder = Decoder(prompt, options, eos, limit, constraint)
    picks = decoder.picks(engine.config.vocab_size)

    def next_logits(tokens: list[int], start: int) -> np.ndarray | TopLogits:
        if picks:  # (a GPU's plan reads back only the largest logits)
            return engine.forward_top(tokens, start, cache, picks, weights)
        return engine.forward(tokens, start, cache, last_only=True, weights=weights)[0]  # (V,)

    cache.truncate(reused)
    if refresh:  # the reused positions' entries from layer `refresh` up are stale: recomputed below
        cache.forget_layers(refresh)
    if limit is not None and cache.options.hot_tokens is None:  # a plain cache: allocate it once
        cache.reserve(min(limit - reused, len(prompt) - reused + options.max_tokens))

    started = time.perf_counter()
    chunk = engine.prefill_chunk
    if refresh:
        for start in range(0, reused, chunk):
            engine.recompute(cache, start, min(start + chunk, reused), weights)
            if report_prefill:
                yield Prefilling(min(start + chunk, reused), len(prompt))
    cache.owner = weights
    for start in range(reused, len(prompt), chunk):
        logits = next_logits(prompt[start : start + chunk], start)
        if report_prefill and start + chunk < len(prompt):
            yield Prefilling(start + chunk, len(prompt))
    first: dict[str, float] | None = {"prefill_ms": (time.perf_counter() - started) * 1000, "cached_tokens": reused}
    while True:
        step = decoder.choose(logits, first)
        first = None
        yield step
        if step.finish_reason is not None:
            return
        logits = next_logits([step.token_id], len(decoder.history) - 1)
