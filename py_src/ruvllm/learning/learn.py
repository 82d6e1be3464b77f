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
from .state import sgd


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
    if not engine.config.llama_block:
        raise InvalidArgumentError(
            f"adapt (MicroLoRA learning) runs on Llama-style blocks (Llama, Mistral, Qwen2, Phi-3); "
            f"{engine.config.architecture} is not supported yet (applying a trained adapter is)"
        )
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
    params, state = dict(adapter.parameters()), adapter.state
    before = None
    started = time.perf_counter()
    with engine.threads.limit(len(tokens)):  # products over the whole sequence: prompt-sized
        for _ in range(options.steps):
            _, ll, grads = adapter_gradients(engine, adapter, tokens, scored, reward)
            before = ll if before is None else before
            grads = clipped(grads, options.max_grad_norm)
            if options.ewc:
                grads = state.ewc.pulled(grads, params, options.ewc)
            if options.optimizer == "sgd":
                sgd(params, grads, options.lr)
            else:
                state.adam.update(params, grads, options.lr)
            adapter.version += 1
        step_ms = (time.perf_counter() - started) * 1000 / options.steps
        _, after, grads = adapter_gradients(engine, adapter, tokens, scored, 1.0)
    state.ewc.consolidate(params, grads, options.fisher_decay)
    return AdaptReport(before, after, options.steps, step_ms)


def clipped(grads: dict[str, np.ndarray], max_norm: float) -> dict[str, np.ndarray]:
    """The gradients scaled down to a global norm of `max_norm` when longer (0: as they are)."""
    norm = float(np.sqrt(sum(np.sum(g * g) for g in grads.values())))
    if not max_norm or norm <= max_norm:
        return grads
    return {k: g * np.float32(max_norm / norm) for k, g in grads.items()}
