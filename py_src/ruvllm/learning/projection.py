"""Where an adapter may not look: the input directions ordinary text uses most.

An adapter's update on W responds to an input x through A x. Inputs of ordinary text share a few large
directions; an update keyed on them shows up on every token (perplexity drifts, unrelated prompts
change). So the rows of A are kept out of the subspace that holds `energy` (99%) of the inputs'
energy on a calibration text: A starts there and every gradient of A is projected onto the complement
(dA - dA U U^T, U an orthonormal basis of that subspace). Measured on SmolLM2: ten facts taught in a
row stay learned with perplexity within a few percent only with this projection (benchmarks/RESULTS.md).

The basis comes from the calibration text's inputs X (T, K) of each adapted matrix, through the small
Gram matrix: X^T X (K, K) gives U as its eigenvectors; when T < K, X X^T (T, T) is smaller, and its
eigenvectors V and eigenvalues s give U = X^T V / sqrt(s).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..runtime.engine import Engine
from .backprop import Start, bypassed, entering_states, run_from

CALIBRATION_TOKENS = 2048  # of the calibration text (all of the built-in one), where the bases come from
CALIBRATION_PIECE = 512  # tokens per sequence the calibration text is cut into


def calibration_text() -> str:
    """The built-in calibration text (varied prose, dialogue, code and numbers)."""
    return (Path(__file__).parent.parent / "data" / "calibration.txt").read_text(encoding="utf-8")


# which recorded activation each target multiplies (model/forward.py LayerTape)
_INPUT = {
    "q_proj": "a",
    "k_proj": "a",
    "v_proj": "a",
    "o_proj": "o",
    "gate_proj": "b",
    "up_proj": "b",
    "down_proj": "s",
}


def input_bases(engine: Engine, modules: list[str], ids: list[int], energy: float) -> dict[str, np.ndarray]:
    """For each module (HF name; lm_head is left out), an orthonormal basis (K, k) of the subspace
    holding `energy` of its inputs' energy over the calibration token ids `ids` (base weights)."""
    layers = [int(name.split(".")[2]) for name in modules if name != "lm_head"]
    if not layers:
        return {}
    first = min(layers)
    weights, config, inv_freq = engine.weights, engine.config, engine.inv_freq
    rows: dict[str, list[np.ndarray]] = {name: [] for name in modules if name != "lm_head"}
    with bypassed(weights):  # the layers below, then those adapted with their inputs recorded
        for begin in range(0, len(ids), CALIBRATION_PIECE):  # pieces from position 0, as lessons are
            entering = entering_states(weights, config, inv_freq, ids[begin : begin + CALIBRATION_PIECE], first)
            _, tapes = run_from(weights, config, inv_freq, Start(first, entering))
            for name in rows:
                _, _, index, _, target = name.split(".")
                rows[name].append(getattr(tapes[int(index) - first], _INPUT[target]))
    return {name: _basis(np.concatenate(rows[name]).astype(np.float64), energy) for name in rows}


def shared_bases(engine: Engine, modules: list[str], ids: list[int], energy: float) -> dict[str, np.ndarray]:
    """input_bases, computed once per loaded model (kept in `engine.memo`, for the weights as they are:
    a merge into them makes new ones): every fresh adapter on the same matrices reuses them."""
    key = ("input_bases", engine.weights_identity()[0], hash(tuple(ids)), energy)
    held = engine.memo.setdefault(key, {})
    missing = [name for name in modules if name != "lm_head" and name not in held]
    if missing:
        held.update(input_bases(engine, missing, ids, energy))
    return {name: held[name] for name in modules if name in held}


def _basis(x: np.ndarray, energy: float) -> np.ndarray:
    """An orthonormal basis (K, k) of the subspace holding `energy` of the rows of x (T, K), from the
    smaller of the two Gram matrices (an eigendecomposition costs its size cubed)."""
    T, K = x.shape
    values, vectors = np.linalg.eigh(x.T @ x if K <= T else x @ x.T)  # ascending
    values, vectors = np.maximum(values[::-1], 0), vectors[:, ::-1]
    k = int(np.searchsorted(np.cumsum(values) / values.sum(), energy)) + 1
    if K <= T:
        return vectors[:, :k].astype(np.float32)  # (K, k)
    return (x.T @ vectors[:, :k] / np.sqrt(values[:k])).astype(np.float32)  # (K, k)


def project(matrix: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """The rows of `matrix` (r, K) without their components in span(basis) (K, k)."""
    return matrix - (matrix @ basis) @ basis.T
