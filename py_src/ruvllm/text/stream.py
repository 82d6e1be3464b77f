"""Generation, the text layer: streaming detokenization, stop strings and timings over the token layer
(`runtime.generate.generate_tokens`), yielding `Chunk`s with their `Stats`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..runtime.generate import Prefilling, Step
from .detokenizer import StreamingDetokenizer


@dataclass(frozen=True)
class Stats:
    prompt_tokens: int
    completion_tokens: int
    prefill_ms: float
    ttft_ms: float
    decode_tok_s: float
    cached_tokens: int = 0  # prompt tokens reused from the cache (not computed again)


@dataclass(frozen=True)
class Chunk:
    text: str  # new text since the previous chunk (may be empty while a character or stop string is pending)
    token_id: int
    finish_reason: str | None
    stats: Stats


def generate_text(
    steps: Iterator[Step | Prefilling],
    detokenizer: StreamingDetokenizer,
    prompt_tokens: int,
    stop: Sequence[str] = (),
    eos_ids: Iterable[int] = (),
    started: float | None = None,
) -> Iterator[Chunk | Prefilling]:
    """Text deltas for each step; cut right before the first stop string; EOS adds no text. A
    `Prefilling` (from generate_tokens' report_prefill) passes through as it is."""
    started = time.perf_counter() if started is None else started
    eos = set(eos_ids)
    held = ""  # decoded text not yet emitted: it may be the start of a stop string
    prefill_ms = first_at = 0.0
    count = cached = 0
    for step in steps:
        if isinstance(step, Prefilling):
            yield step
            continue
        now = time.perf_counter()
        count += 1
        if step.prefill_ms is not None:
            prefill_ms, first_at, cached = step.prefill_ms, now, step.cached_tokens
        finish = step.finish_reason
        if not (finish == "stop" and step.token_id in eos):
            held += detokenizer.add(step.token_id)
        if finish is not None:
            held += detokenizer.finish()
        emit, held, hit = _split_at_stop(held, stop, final=finish is not None)
        if hit:
            finish = "stop"
        decode_s = now - first_at
        stats = Stats(
            prompt_tokens=prompt_tokens,
            completion_tokens=count,
            prefill_ms=prefill_ms,
            ttft_ms=(first_at - started) * 1000,
            decode_tok_s=(count - 1) / decode_s if count > 1 and decode_s > 0 else 0.0,
            cached_tokens=cached,
        )
        yield Chunk(emit, step.token_id, finish, stats)
        if finish is not None:
            return


def _split_at_stop(text: str, stop: Sequence[str], final: bool) -> tuple[str, str, bool]:
    """(text to emit now, text to hold back, whether a stop string was found)."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    if cut >= 0:
        return text[:cut], "", True
    if final or not stop:
        return text, "", False
    # Hold back the longest tail that could still grow into a stop string.
    hold = max((k for s in stop for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])), default=0)
    return text[: len(text) - hold], text[len(text) - hold :], False
