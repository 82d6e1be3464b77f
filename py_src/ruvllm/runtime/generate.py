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

import numpy as np

from ..errors import ContextFullError, InferenceError, InvalidArgumentError
from ..model.cache import KVCache
from .engine import Engine
from .sampling import SamplingOptions, make_sampler

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class GenerationOptions:
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    sampling: SamplingOptions = field(default_factory=SamplingOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidArgumentError(f"stop must be a list of non-empty strings, got {self.stop!r}")

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> GenerationOptions:
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
    finish_reason: str | None  # "stop" (end-of-sequence token), "length", or None to continue
    prefill_ms: float | None = None  # on the first step only
    cached_tokens: int = 0  # on the first step: prompt tokens whose keys/values came from the cache


def generate_tokens(
    engine: Engine,
    prompt_ids: Sequence[int],
    options: GenerationOptions,
    eos_ids: Iterable[int] = (),
    cache: KVCache | None = None,
    reuse_prefix: bool = True,
    report_prefill: bool = False,
) -> Iterator[Step | Prefilling]:
    """Prefill the prompt, then sample one token per step until EOS, `max_tokens` or a full context.

    With `reuse_prefix`, the longest prefix of the prompt that `cache` already holds (the previous turn
    of a chat) is not computed again. With `report_prefill`, a `Prefilling` comes between the forward
    calls of a long prompt. Bad prompts raise here, at call time; the returned generator does the work.
    """
    prompt = [int(t) for t in prompt_ids]
    cache = cache if cache is not None else engine.new_cache()
    limit = cache.max_positions
    if not prompt:
        raise InvalidArgumentError("the prompt is empty: give at least one token")
    if limit is not None and len(prompt) > limit:
        raise ContextFullError(f"the prompt has {len(prompt)} tokens but the context window is {limit}")
    bad = [t for t in prompt if not 0 <= t < engine.config.vocab_size]
    if bad:
        raise InvalidArgumentError(f"token id {bad[0]} is outside the vocabulary [0, {engine.config.vocab_size})")
    identity = engine.weights_identity()  # every step computes with these weights (the adapter active now)
    if cache.owner != identity:  # other weights (an adapter switched or updated): nothing can be reused
        cache.reset()
        cache.owner = identity
    reused = common_prefix(cache.tokens, prompt) if reuse_prefix else 0
    reused = min(reused, len(prompt) - 1)  # the last prompt token is always computed: it gives the logits
    eos = set() if options.ignore_eos else set(eos_ids)
    return _token_loop(engine, prompt, reused, options, eos, cache, identity, report_prefill)


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
    options: GenerationOptions,
    eos: set[int],
    cache: KVCache,
    weights: tuple,
    report_prefill: bool,
) -> Iterator[Step | Prefilling]:
    limit = cache.max_positions
    sample = make_sampler(options.sampling)

    def next_logits(tokens: list[int], start: int) -> np.ndarray:
        logits = engine.forward(tokens, start, cache, last_only=True, weights=weights)[0]  # (V,)
        if not np.isfinite(logits).all():  # NaN or inf weights, or an overflow: never sample from garbage
            raise InferenceError(
                f"the model computed non-finite logits at position {start + len(tokens) - 1} "
                "(its weights or config values are broken)"
            )
        return logits

    cache.truncate(reused)
    if limit is not None and cache.options.hot_tokens is None:  # a plain cache: allocate it once
        cache.reserve(min(limit - reused, len(prompt) - reused + options.max_tokens))

    started = time.perf_counter()
    chunk = engine.prefill_chunk
    for start in range(reused, len(prompt), chunk):
        logits = next_logits(prompt[start : start + chunk], start)
        if report_prefill and start + chunk < len(prompt):
            yield Prefilling(start + chunk, len(prompt))
    prefill_ms = (time.perf_counter() - started) * 1000
    history = list(prompt)
    for i in range(options.max_tokens):
        token = sample(logits, history)
        history.append(token)
        position = len(history) - 1  # where this token goes when fed back
        if token in eos:
            reason = "stop"
        elif i == options.max_tokens - 1 or (limit is not None and position >= limit):
            reason = "length"
        else:
            reason = None
        first = i == 0
        yield Step(token, reason, prefill_ms if first else None, reused if first else 0)
        if reason is not None:
            return
        logits = next_logits([token], position)
