"""Where an adapter may not look: the input directions ordinary text uses most.

An adapter's update on W responds to an input x through A x. Inputs of ordinary text share a few large
directions; an update keyed on them shows up on every token (perplexity drifts, unrelated prompts
change). So the rows of A are kept out of the subspace that holds `energy` (99%) of the inputs'
energy on a calibration text: A starts there and every gradient of A is projected onto the complement
(dA - dA U U^T, U an orthonormal basis of that subspace). Measured on SmolLM2: ten facts taught in a
row stay learned with perplexity within a few percent only with this projection (benchmarks/RESULTS.md).

The basis comes from the calibration text's inputs X (T, K) of each adapted matrix, through the small
Gram matrix: X^T X (K, K) gives U as its eigenvectors; when T < K, X X^T (T, T) is smaller, and its
eigenvectors V and eigenvalues s give U = X^T V / sqrt(s). The whole decomposition is kept too (a
`Spectrum`): a keyed lesson (learn.py) whitens its own inputs with it, so that the rows it writes into
A respond to its text and as little as they can to ordinary text's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.cache import KVCache, KVOptions
from ..model.forward import Masks, Sequence, Tape, embed, run_layers
from ..quant.matrices import DenseMatrix
from ..runtime.engine import Engine
from .backprop import bypassed, transposed_product
from .lora import linear_of
from .per_model import ModelLearning

CALIBRATION_TOKENS = 2048  # of the calibration text (all of the built-in one), where the bases come from
# ... then the calibration chat's turns in the model's own template, as many as fit in this many in all:
# measured on SmolLM2, whitening from the raw text alone let a chat lesson move 31 of 40 unrelated chat
# answers, from both 16 (benchmarks/RESULTS.md, "Learning that works")
CALIBRATION_ALL = 4096
CALIBRATION_PIECE = 512  # tokens per sequence the calibration text is cut into
# The units of work of a BasesJob, each far below the worker's 100 ms slice in Pyodide. Measured under
# Node on a busy 2-core machine (SmolLM2, 1082 calibration tokens, down_proj of the top 2 layers), where
# a unit used to be a chunk through all 30 layers with its Gram products (0.6-2.1 s) or a basis block of
# 64 columns (1.1-2.5 s): 32 tokens through 2 layers 53-128 ms (attending to more positions further
# into a piece), a Gram block of 256 columns 27 ms, 16 basis columns 51 ms from the rows laid out
# transposed (418 ms from the rows as they are).
PROJECTION_WORK = 64  # token-layers of the calibration text's forward per unit (chunks of 32: 2 layers)
GRAM_COLUMNS = 256  # columns of a Gram matrix's block per unit
BASIS_BLOCK = 16  # basis columns made per unit


def calibration_text() -> str:
    """The built-in calibration text (varied prose, dialogue, code and numbers)."""
    return (Path(__file__).parent.parent / "data" / "calibration.txt").read_text(encoding="utf-8")


def calibration_chat() -> list[tuple[str, str]]:
    """The built-in calibration chat: (user message, assistant answer) turns on everyday topics, none of
    them among tools/locality.py's prompts."""
    data = json.loads((Path(__file__).parent.parent / "data" / "calibration_chat.json").read_text(encoding="utf-8"))
    return [(str(user), str(answer)) for user, answer in data["conversations"]]


def calibration_ids(text_ids: list[int], turns: list[list[int]]) -> list[int]:
    """The calibration token ids: the text's first CALIBRATION_TOKENS, then whole chat turns (each its
    ids in the model's template) while they fit in CALIBRATION_ALL."""
    ids = list(text_ids[:CALIBRATION_TOKENS])
    for turn in turns:
        if len(ids) + len(turn) > CALIBRATION_ALL:
            break
        ids += turn
    return ids


# which recorded activation each target multiplies (model/forward.py LayerTape)
INPUTS = {
    "q_proj": "a",
    "k_proj": "a",
    "v_proj": "a",
    "o_proj": "o",
    "gate_proj": "b",
    "up_proj": "b",
    "down_proj": "s",
}


@dataclass(frozen=True)
class Spectrum:
    """The calibration inputs' Gram matrix X^T X of one adapted matrix, decomposed: its eigenvalues
    (descending) and eigenvectors, as the rows of a matrix (k, K) (k < K when the text had fewer tokens
    than the matrix has inputs: the directions left out have eigenvalue 0). Its products run as the
    model's do (`use_provider`: the WebAssembly kernels in Pyodide, where NumPy has no BLAS; measured in
    Pyodide, whitening a lesson's keys in float64 NumPy took 0.25 s of its first step)."""

    values: np.ndarray  # (k,) float64
    directions: DenseMatrix  # (k, K) float32: the eigenvectors, one a row

    def basis(self, energy: float) -> np.ndarray:
        """The orthonormal basis (K, k') of the subspace holding `energy` of the inputs' energy."""
        k = int(np.searchsorted(np.cumsum(self.values) / self.values.sum(), energy)) + 1
        return np.ascontiguousarray(self.directions.rows(np.arange(min(k, len(self.values)))).T)

    def use_provider(self, provider) -> None:
        """Let a kernel provider compute whiten's products (None: NumPy)."""
        self.directions.use_provider(provider)

    def whiten(self, rows: np.ndarray, ridge: float) -> np.ndarray:
        """rows (n, K) times (G + ridge * mean eigenvalue * I)^-1, G the Gram matrix: the directions
        ordinary text uses most shrink, the ones it barely uses grow (the ridge bounds them)."""
        k, K = self.directions.shape
        floor = ridge * float(self.values.sum()) / K  # (the mean over all K eigenvalues)
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        inside = self.directions(rows).astype(np.float64)  # (n, k): rows @ V
        scaled = np.ascontiguousarray(inside / (self.values + floor), dtype=np.float32)
        white = transposed_product(scaled, self.directions).astype(np.float64)  # (n, K)
        if k == K:  # every direction has its eigenvalue: nothing lies outside
            return white
        back = transposed_product(np.ascontiguousarray(inside, dtype=np.float32), self.directions)
        return white + (rows - back) / floor  # (the directions with eigenvalue 0)


class BasesJob:
    """For each module (HF name; lm_head is left out), an orthonormal basis (K, k) of the subspace
    holding `energy` of its inputs' energy over the calibration token ids `ids` (base weights), made in
    small units of work, for a worker that answers requests in between: each CALIBRATION_PIECE-token
    piece of the calibration text runs from position 0 (as lessons do), `chunk` tokens at a time
    through the layers up to the highest adapted one (its own KV cache across the piece), a few layers
    per unit (PROJECTION_WORK); each module's inputs then join the smaller of its Gram matrices, a
    block of GRAM_COLUMNS columns per unit; then each module's eigendecomposition is a unit (one LAPACK
    call: it cannot be cut; 1.1-3.5 s in Pyodide for 1082 tokens), and its basis a unit per
    BASIS_BLOCK columns. `progress` counts the units. The caller holds the lock that guards the
    weights."""

    def __init__(self, engine: Engine, modules: list[str], ids: list[int], energy: float, chunk: int = 32) -> None:
        self.engine, self.ids, self.energy, self.chunk = engine, list(ids), energy, chunk
        self.modules = [name for name in modules if name != "lm_head"]
        self.bases: dict[str, np.ndarray] | None = None if self.modules else {}
        self.spectra: dict[str, Spectrum] = {}  # made with the bases
        self.key: tuple | None = None  # where the engine keeps them (bases_job)
        self.units = 0  # units of work done
        self.total = self._count() if self.modules else 0  # ... and in all
        self._work = self._units()

    @property
    def done(self) -> bool:
        return self.bases is not None

    @property
    def progress(self) -> tuple[int, int]:
        """(units of work done, units in all)."""
        return self.units, self.total

    def step(self) -> bool:
        """One unit of work (a chunk through a few layers, a block of a Gram matrix, a decomposition, a
        block of a basis); True when done."""
        if not self.done:
            next(self._work, None)
            self.units += 1
        return self.done

    def _layers(self) -> tuple[list[int], list[range]]:
        """The adapted layers, and the layers each unit of a chunk's forward runs."""
        adapted = [int(name.split(".")[2]) for name in self.modules]
        per_unit = max(1, PROJECTION_WORK // self.chunk)
        top = max(adapted) + 1
        return adapted, [range(a, min(a + per_unit, top)) for a in range(0, top, per_unit)]

    def _count(self) -> int:
        """The units _units() takes, counted the same way."""
        T, (_, groups) = len(self.ids), self._layers()
        K = {name: linear_of(self.engine.weights, name).matrix.shape[1] for name in self.modules}
        units = 1  # the Gram matrices made
        for begin in range(0, T, CALIBRATION_PIECE):
            for at in range(begin, min(begin + CALIBRATION_PIECE, T), self.chunk):
                stop = min(at + self.chunk, begin + CALIBRATION_PIECE, T)
                units += len(groups)
                units += sum(-(-(K[name] if K[name] <= T else stop) // GRAM_COLUMNS) for name in self.modules)
        for name in self.modules:  # an eigendecomposition, then with the rows a unit per block of the basis
            units += 1 + (0 if K[name] <= T else -(-min(T, K[name]) // BASIS_BLOCK))
        return units + 1  # the last one hands the bases over

    def _units(self):
        engine, T = self.engine, len(self.ids)
        weights, config = engine.weights, engine.config
        adapted, groups = self._layers()
        first = min(adapted)
        K = {name: linear_of(weights, name).matrix.shape[1] for name in self.modules}
        # the smaller Gram matrix: the inputs' K x K, summed as they come; or, for a matrix with more
        # inputs than the text has tokens, the T x T one of the rows (kept), block by block
        gram = {name: np.zeros((K[name], K[name]) if K[name] <= T else (T, T)) for name in self.modules}
        rows = {name: np.zeros((T, K[name])) for name in self.modules if K[name] > T}
        yield  # (tens of megabytes: a unit of its own)
        for begin in range(0, T, CALIBRATION_PIECE):
            cache = KVCache(config, CALIBRATION_PIECE, KVOptions())
            for at in range(begin, min(begin + CALIBRATION_PIECE, T), self.chunk):
                stop = min(at + self.chunk, begin + CALIBRATION_PIECE, T)
                positions = np.arange(at - begin, stop - begin)
                batch = [Sequence(slice(None), positions, cache, Masks(positions))]
                tape = Tape()
                x = None
                for layers in groups:
                    with bypassed(weights):  # (only while the unit runs: generations run in between)
                        x = embed(weights, config, np.asarray(self.ids[at:stop])) if x is None else x
                        split = min(max(layers.start, first), layers.stop)  # taped from the lowest adapted layer on
                        x = run_layers(engine.model, x, batch, range(layers.start, split))
                        x = run_layers(engine.model, x, batch, range(split, layers.stop), tape)
                    yield
                for name in self.modules:
                    _, _, index, _, target = name.split(".")
                    x = getattr(tape.layers[int(index) - first], INPUTS[target]).astype(np.float64)  # (t, K)
                    if name not in rows:
                        for c in range(0, K[name], GRAM_COLUMNS):
                            block = slice(c, c + GRAM_COLUMNS)
                            gram[name][:, block] += x.T @ x[:, block]  # (K, c)
                            yield
                        continue
                    rows[name][at:stop] = x
                    for c in range(0, stop, GRAM_COLUMNS):
                        block = slice(c, min(c + GRAM_COLUMNS, stop))
                        gram[name][at:stop, block] = x @ rows[name][block].T  # (t, c)
                        yield
                    gram[name][:at, at:stop] = gram[name][at:stop, :at].T
        bases = {}
        for name in self.modules:
            self.spectra[name] = yield from decomposition(gram.pop(name), rows.pop(name, None))
            self.spectra[name].use_provider(_provider(linear_of(weights, name).matrix))
            bases[name] = self.spectra[name].basis(self.energy)
        self.bases = bases


def shared_bases(learning: ModelLearning, modules: list[str], ids: list[int], energy: float) -> dict[str, np.ndarray]:
    """The bases (BasesJob), computed once per loaded model (kept in `learning`, its Session's, for the
    weights as they are: a merge into them makes new ones): every fresh adapter on the same matrices
    reuses them. A job
    making them in the background (`bases_job`) is finished here; otherwise each calibration piece
    runs as one forward (small chunks round differently, and measured, a lesson at the edge of being
    learned in its 20 steps can end either side of it)."""
    job = bases_job(learning, modules, ids, energy, chunk=CALIBRATION_PIECE)
    while job is not None and not advance(learning, job):
        pass
    bases = ready_bases(learning, modules, ids, energy)
    assert bases is not None  # (the job made every missing one)
    return bases


def _provider(matrix):
    """The kernel provider computing an adapted matrix's products (under its adapters' wrappers), if any."""
    while hasattr(matrix, "base"):
        matrix = matrix.base
    return getattr(matrix, "provider", None)


def ready_spectra(learning: ModelLearning, modules: list[str], ids: list[int]) -> dict[str, Spectrum] | None:
    """The spectra of `modules` (made by a BasesJob for any energy) if all are made, else None."""
    held = learning.spectra.get(_key(learning.engine, ids, None), {})
    wanted = [name for name in modules if name != "lm_head"]
    return {name: held[name] for name in wanted} if all(name in held for name in wanted) else None


def ready_bases(
    learning: ModelLearning, modules: list[str], ids: list[int], energy: float
) -> dict[str, np.ndarray] | None:
    """The bases of `modules` if all are made, else None."""
    held = learning.bases.get(_key(learning.engine, ids, energy), {})
    wanted = [name for name in modules if name != "lm_head"]
    return {name: held[name] for name in wanted} if all(name in held for name in wanted) else None


def bases_job(
    learning: ModelLearning, modules: list[str], ids: list[int], energy: float, chunk: int = 32
) -> BasesJob | None:
    """The job making the bases of `modules` that are not made yet (`chunk` tokens a step), registered
    with the engine so the background loop advances it (`pending_job`, `advance`); None when all are
    made. A job already under way for them is returned as it is."""
    key = _key(learning.engine, ids, energy)
    held = learning.bases.setdefault(key, {})
    missing = [name for name in modules if name != "lm_head" and name not in held]
    if not missing:
        return None
    jobs = learning.jobs
    for job in jobs:
        if job.key == key and set(missing) <= set(job.modules):
            return job
    job = BasesJob(learning.engine, missing, ids, energy, chunk)
    job.key = key
    jobs.append(job)
    return job


def pending_job(learning: ModelLearning) -> BasesJob | None:
    """The first job waiting to be advanced, if any."""
    return learning.jobs[0] if learning.jobs else None


def advance(learning: ModelLearning, job: BasesJob) -> bool:
    """One step of `job`; once done, its bases join the engine's and the job leaves (as it does when a
    step fails: the error goes to the caller, not to every later call). True when done."""
    jobs = learning.jobs
    try:
        done = job.step()
    except Exception:
        if job in jobs:
            jobs.remove(job)
        raise
    if done:
        assert job.key is not None and job.bases is not None  # (registered by bases_job; made, being done)
        learning.bases.setdefault(job.key, {}).update(job.bases)
        learning.spectra.setdefault(_key(learning.engine, job.ids, None), {}).update(job.spectra)
        if job in jobs:
            jobs.remove(job)
    return done


def _key(engine: Engine, ids: list[int], energy: float | None) -> tuple:
    return ("input_bases", engine.weights_identity().merges, hash(tuple(ids)), energy)


def decomposition(gram: np.ndarray, rows: np.ndarray | None):
    """A generator of units of work making the Spectrum of the inputs, from their Gram matrix X^T X
    (K, K), or from X X^T (T, T) and the rows X (T, K) themselves (its eigenvectors V and eigenvalues s
    give the inputs' own U = X^T V / sqrt(s)); it returns the Spectrum. A unit is the
    eigendecomposition, then each block of BASIS_BLOCK columns."""
    values, vectors = np.linalg.eigh(gram)  # ascending
    values, vectors = np.maximum(values[::-1], 0), vectors[:, ::-1]
    if rows is None:
        spectrum = Spectrum(values, DenseMatrix(vectors.T))  # (K, K)
        yield
        return spectrum
    k = int(np.count_nonzero(values > values[0] * 1e-12)) if len(values) and values[0] > 0 else 0
    columns = np.ascontiguousarray(rows.T)  # (K, T): the products below read it row by row, 8x faster in Pyodide
    vectors_K = np.zeros((rows.shape[1], k), np.float32)  # (K, k)
    yield
    for j in range(0, -(-min(rows.shape) // BASIS_BLOCK) * BASIS_BLOCK, BASIS_BLOCK):
        if j < k:
            block = slice(j, min(j + BASIS_BLOCK, k))
            vectors_K[:, block] = columns @ vectors[:, block] / np.sqrt(values[block])  # (K, b)
        yield
    return Spectrum(values[:k], DenseMatrix(vectors_K.T))


def project(matrix: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """The rows of `matrix` (r, K) without their components in span(basis) (K, k)."""
    return matrix - (matrix @ basis) @ basis.T
