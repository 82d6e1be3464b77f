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

from ..model.cache import KVCache, KVOptions
from ..model.forward import Masks, Sequence, Tape, embed, run_layers
from ..runtime.engine import Engine
from .backprop import bypassed

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
    job = BasesJob(engine, modules, ids, energy, chunk=CALIBRATION_PIECE)
    while not job.step():
        pass
    return job.bases


class BasesJob:
    """input_bases in small pieces of work, for a worker that answers requests in between: each
    CALIBRATION_PIECE-token piece of the calibration text runs from position 0 (as lessons do), `chunk`
    tokens per `step()` through the layers up to the highest adapted one (its own KV cache across the
    piece), adding each module's inputs to its Gram matrix; the last step decomposes them. The caller
    holds the lock that guards the weights."""

    def __init__(self, engine: Engine, modules: list[str], ids: list[int], energy: float, chunk: int = 32) -> None:
        self.engine, self.ids, self.energy, self.chunk = engine, list(ids), energy, chunk
        self.modules = [name for name in modules if name != "lm_head"]
        layers = [int(name.split(".")[2]) for name in self.modules]
        self.first, self.last = (min(layers), max(layers)) if layers else (0, -1)
        K = {name: _input_size(engine, name) for name in self.modules}
        # the smaller Gram matrix: inputs' K x K, summed as they come, or the T x T of all rows (kept)
        self.gram = {name: np.zeros((K[name], K[name])) for name in self.modules if K[name] <= len(self.ids)}
        self.rows: dict[str, list[np.ndarray]] = {name: [] for name in self.modules if name not in self.gram}
        self.position = 0  # tokens of `ids` done
        self.cache: KVCache | None = None
        self.bases: dict[str, np.ndarray] | None = None if self.modules else {}

    @property
    def done(self) -> bool:
        return self.bases is not None

    def step(self) -> bool:
        """One chunk of the calibration text, or the decomposition once all are in; True when done."""
        if self.done:
            return True
        if self.position >= len(self.ids):
            rows = {name: np.concatenate(parts).astype(np.float64) for name, parts in self.rows.items()}
            self.bases = {name: _decomposed(self.gram.get(name), rows.get(name), self.energy) for name in self.modules}
            return True
        engine = self.engine
        weights, config, inv_freq = engine.weights, engine.config, engine.inv_freq
        offset = self.position % CALIBRATION_PIECE  # where in its piece this chunk starts
        if offset == 0:
            self.cache = KVCache(config, CALIBRATION_PIECE, KVOptions())
        stop = min(self.position + self.chunk, self.position - offset + CALIBRATION_PIECE, len(self.ids))
        positions = np.arange(offset, offset + stop - self.position)
        batch = [Sequence(slice(None), positions, self.cache, Masks(positions))]
        tape = Tape()
        with bypassed(weights):
            x = embed(weights, config, np.asarray(self.ids[self.position : stop]))
            x = run_layers(weights, config, inv_freq, x, batch, range(self.first))
            run_layers(weights, config, inv_freq, x, batch, range(self.first, self.last + 1), tape)
        for name in self.modules:
            _, _, index, _, target = name.split(".")
            x = getattr(tape.layers[int(index) - self.first], _INPUT[target]).astype(np.float64)  # (t, K)
            if name in self.gram:
                self.gram[name] += x.T @ x
            else:
                self.rows[name].append(x)
        self.position = stop
        return False


def _input_size(engine: Engine, name: str) -> int:
    from .lora import linear_of

    return linear_of(engine.weights, name).matrix.shape[1]


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
    return _decomposed(x.T @ x, None, energy) if K <= T else _decomposed(None, x, energy)


def _decomposed(gram: np.ndarray | None, x: np.ndarray | None, energy: float) -> np.ndarray:
    """The basis (K, k) from the inputs' Gram matrix X^T X (K, K), or from the rows X (T, K) themselves
    through X X^T (T, T): its eigenvectors V and eigenvalues s give U = X^T V / sqrt(s)."""
    values, vectors = np.linalg.eigh(gram if gram is not None else x @ x.T)  # ascending
    values, vectors = np.maximum(values[::-1], 0), vectors[:, ::-1]
    k = int(np.searchsorted(np.cumsum(values) / values.sum(), energy)) + 1
    if gram is not None:
        return vectors[:, :k].astype(np.float32)  # (K, k)
    return (x.T @ vectors[:, :k] / np.sqrt(values[:k])).astype(np.float32)  # (K, k)


def project(matrix: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """The rows of `matrix` (r, K) without their components in span(basis) (K, k)."""
    return matrix - (matrix @ basis) @ basis.T
