"""Learning from feedback: a few optimizer steps on an adapter per (prompt, completion, reward).

Each step follows the true gradient (backprop.py) of

    -reward * mean log p(completion | prompt)  +  ewc / 2 * sum_i F_i (theta_i - anchor_i)^2

so reward +1 makes the completion likelier, -1 less likely. The second term is elastic weight
consolidation: F is the Fisher information (squared log-likelihood gradients) accumulated over past
lessons and `anchor` the adapter after the last one, so a new lesson moves most freely where earlier
ones did not care, and does not erase them. Updates are Adam (default) or SGD, in place, so the
adapter's arrays stay the ones the model reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError
from ..runtime.engine import Engine
from .backprop import loss_and_grads
from .lora import Adapter


@dataclass(frozen=True)
class AdaptOptions:
    steps: int = 6
    lr: float = 4e-3
    optimizer: str = "adam"  # or "sgd"
    ewc: float = 1e4  # strength of the consolidation term (0 turns it off); measured, see benchmarks
    max_grad_norm: float = 1.0  # the gradient is scaled down to this global norm when longer
    fisher_decay: float = 1.0  # weight of older lessons' Fisher information when a new one is added

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise InvalidArgumentError(f"steps must be an integer >= 1, got {self.steps!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < 10):
            raise InvalidArgumentError(f"lr must be a number in (0, 10), got {self.lr!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise InvalidArgumentError(f"optimizer must be adam or sgd, got {self.optimizer!r}")
        if not (isinstance(self.ewc, (int, float)) and self.ewc >= 0):
            raise InvalidArgumentError(f"ewc must be a number >= 0, got {self.ewc!r}")


@dataclass(frozen=True)
class AdaptReport:
    log_prob_before: float  # mean log-probability of the completion's tokens, before the first step
    log_prob_after: float  # ... after the last step
    steps: int
    step_ms: float  # mean time of one step (forward + backward + update)


def adapter_gradients(engine: Engine, adapter: Adapter, tokens: list[int], scored: np.ndarray, reward: float):
    """(loss, mean log-likelihood, {key: gradient}) with `adapter` active in the engine's weights."""
    loss, ll, by_matrix = loss_and_grads(engine.weights, engine.config, engine.inv_freq, tokens, scored, reward)
    grads = {}
    for matrix, dA, dB in by_matrix.values():
        for name, A in adapter.A.items():
            if matrix.A is A:
                grads[f"{name}.lora_A"], grads[f"{name}.lora_B"] = dA, dB
    return loss, ll, grads


def adapt(
    engine: Engine,
    adapter: Adapter,
    prompt_ids: list[int],
    completion_ids: list[int],
    reward: float = 1.0,
    options: AdaptOptions | None = None,
) -> AdaptReport:
    """Teach `adapter` (active in `engine`) that `completion_ids` follows `prompt_ids`, weighted by reward."""
    options = options or AdaptOptions()
    if not prompt_ids or not completion_ids:
        raise InvalidArgumentError("adapt needs a non-empty prompt and a non-empty completion")
    if not isinstance(reward, (int, float)) or not np.isfinite(reward) or reward == 0:
        raise InvalidArgumentError(f"reward must be a non-zero number, got {reward!r}")
    tokens = list(prompt_ids) + list(completion_ids)
    if len(tokens) > engine.context_length:
        raise InvalidArgumentError(
            f"prompt and completion have {len(tokens)} tokens; the context window is {engine.context_length}"
        )
    scored = np.arange(len(prompt_ids) - 1, len(tokens) - 1)
    params = dict(adapter.parameters())
    state = adapter.state
    before = None
    started = time.perf_counter()
    with engine.threads.limit(len(tokens)):  # products over the whole sequence: prompt-sized
        for _ in range(options.steps):
            _, ll, grads = adapter_gradients(engine, adapter, tokens, scored, reward)
            before = ll if before is None else before
            norm = float(np.sqrt(sum(np.sum(g * g) for g in grads.values())))
            if options.max_grad_norm and norm > options.max_grad_norm:
                grads = {k: g * np.float32(options.max_grad_norm / norm) for k, g in grads.items()}
            t = state.get("adam.t", np.zeros(1, np.float32))
            state["adam.t"] = t + 1
            for key, theta in params.items():
                g = grads[key]
                if options.ewc and f"fisher.{key}" in state:
                    g = g + options.ewc * state[f"fisher.{key}"] * (theta - state[f"anchor.{key}"])
                if options.optimizer == "sgd":
                    theta -= options.lr * g
                    continue
                m = state.setdefault(f"adam.m.{key}", np.zeros_like(theta))
                v = state.setdefault(f"adam.v.{key}", np.zeros_like(theta))
                m *= 0.9
                m += 0.1 * g
                v *= 0.999
                v += 0.001 * g * g
                n = float(state["adam.t"][0])
                theta -= options.lr * (m / (1 - 0.9**n)) / (np.sqrt(v / (1 - 0.999**n)) + 1e-8)
            adapter.version += 1
        step_ms = (time.perf_counter() - started) * 1000 / options.steps
        _, after, grads = adapter_gradients(engine, adapter, tokens, scored, 1.0)
    # Consolidate: Fisher information of this lesson (squared log-likelihood gradient), anchor here.
    for key, theta in params.items():
        fisher = grads[key] ** 2
        old = state.get(f"fisher.{key}")
        state[f"fisher.{key}"] = fisher if old is None else options.fisher_decay * old + fisher
        state[f"anchor.{key}"] = theta.copy()
    return AdaptReport(before, after, options.steps, step_ms)
