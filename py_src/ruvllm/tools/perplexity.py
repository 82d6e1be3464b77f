"""Perplexity of a model on a text: exp(mean negative log-likelihood of each next token).

The text is cut into windows of `window` tokens, each evaluated from an empty cache; inside a window
the tokens go through the model in chunks of `chunk`, so a two-tier KV cache migrates and a byte
budget evicts exactly as they would while generating.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError
from ..runtime.engine import Engine


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per predicted token (nats)
    tokens: int  # predicted tokens
    windows: int


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] for each row; logits (T, V), targets (T,)."""
    logits = logits.astype(np.float64)
    top = logits.max(axis=-1)  # (T,)
    log_sum = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))  # (T,)
    return log_sum - logits[np.arange(len(targets)), targets]  # (T,)


def check_window(window: int) -> int:
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise InvalidArgumentError(f"window must be an integer >= 1 (tokens per evaluation window), got {window!r}")
    return window


def perplexity(engine: Engine, ids: list[int], window: int | None = None, chunk: int = 64) -> PerplexityResult:
    window = engine.context_length if window is None else check_window(window)
    if engine.kv.budget_bytes is None and window > engine.context_length:
        raise InvalidArgumentError(f"window {window} is longer than the context window {engine.context_length}")
    if len(ids) < 2:
        raise InvalidArgumentError("the text must have at least 2 tokens")
    losses, windows = [], 0
    for begin in range(0, len(ids) - 1, window):
        piece = np.asarray(ids[begin : begin + window + 1])
        if len(piece) < 2:
            break
        cache = engine.new_cache()
        for start in range(0, len(piece) - 1, chunk):
            tokens = piece[start : min(start + chunk, len(piece) - 1)]
            logits = engine.forward(tokens, start, cache)  # (t, V)
            losses.append(token_nll(logits, piece[start + 1 : start + 1 + len(tokens)]))
        windows += 1
    nll = np.concatenate(losses)
    return PerplexityResult(float(np.exp(nll.mean())), float(nll.mean()), int(nll.size), windows)
