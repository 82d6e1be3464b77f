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
    logprob: float | None = None  # the Step's (GenerationOptions.logprobs)
    top_logprobs: tuple[tuple[int, float], ...] = ()


class TextStream:
    """Text deltas for each step of one generation, pushed one at a time (`add`): cut right before the
    first stop string; EOS adds no text. The batching scheduler pushes steps as they come; a solo
    generation pulls them (`generate_text`)."""

    def __init__(
        self,
        detokenizer: StreamingDetokenizer,
        prompt_tokens: int,
        stop: Sequence[str] = (),
        eos_ids: Iterable[int] = (),
        started: float | None = None,
    ) -> None:
        self.detokenizer, self.prompt_tokens, self.stop, self.eos = detokenizer, prompt_tokens, stop, set(eos_ids)
        self.started = time.perf_counter() if started is None else started
        self.held = ""  # decoded text not yet emitted: it may be the start of a stop string
        self.prefill_ms = self.first_at = 0.0
        self.count = self.cached = 0

    def add(self, step: Step) -> Chunk:
        now = time.perf_counter()
        self.count += 1
        if step.prefill_ms is not None:
            self.prefill_ms, self.first_at, self.cached = step.prefill_ms, now, step.cached_tokens
        finish = step.finish_reason
        if not (finish == "stop" and step.token_id in self.eos):
            self.held += self.detokenizer.add(step.token_id)
        if finish is not None:
            self.held += self.detokenizer.finish()
        emit, self.held, hit = _split_at_stop(self.held, self.stop, final=finish is not None)
        if hit:
            finish = "stop"
        decode_s = now - self.first_at
        stats = Stats(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.count,
            prefill_ms=self.prefill_ms,
            ttft_ms=(self.first_at - self.started) * 1000,
            decode_tok_s=(self.count - 1) / decode_s if self.count > 1 and decode_s > 0 else 0.0,
            cached_tokens=self.cached,
        )
        return Chunk(emit, step.token_id, finish, stats, step.logprob, step.top_logprobs)


def generate_text(
    steps: Iterator[Step | Prefilling],
    detokenizer: StreamingDetokenizer,
    prompt_tokens: int,
    stop: Sequence[str] = (),
    eos_ids: Iterable[int] = (),
    started: float | None = None,
) -> Iterator[Chunk | Prefilling]:
    """`TextStream` over a generator of steps. A `Prefilling` (from generate_tokens' report_prefill)
    passes through as it is."""
    text = TextStream(detokenizer, prompt_tokens, stop, eos_ids, started)
    for step in steps:
        if isinstance(step, Prefilling):
            yield step
            continue
        chunk = text.add(step)
        yield chunk
        if chunk.finish_reason is not None:
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
