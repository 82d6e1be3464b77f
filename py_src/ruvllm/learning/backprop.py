"""Gradients of a sequence's log-likelihood with respect to LoRA adapters, through the network.

`loss_and_grads` runs the inference forward (model/forward.py) over one whole sequence, from an empty
float32 cache, with a tape that keeps what the backward pass needs, then walks back from the logits.
Only adapter matrices (`LoRAMatrix`) get gradients; base weights stay frozen, but every activation's
gradient flows through them. Being the one forward, a change to it cannot leave the gradients behind
unnoticed.

Nothing below the lowest adapted layer depends on the adapter, so the forward and the backward run
from that layer up only, given the hidden states entering it (`entering`: kept by the cache of the
generation that produced the text, or computed once per lesson by `entering_states`). An adapter on
the top layers costs a few layers per step, not the whole network.

    reward > 0:  loss = -reward * mean_i log p(target_i | tokens before it)        over the chosen positions
    reward < 0:  loss = -|reward| * log (1 - p(target_w | tokens before it))   (unlikelihood at w)

Bad feedback uses unlikelihood (Welleck et al., 2019, "Neural Text Generation with Unlikelihood
Training") rather than the log-likelihood with its sign flipped: that one has no floor (pushing
log p to minus infinity takes every other prediction along with it), while log(1 - p) stops pulling
once p is small. And it applies at one position, w, the weakest: where the target leads the likeliest
other token by the least. Greedy decoding leaves the completion as soon as one position's target stops
being the likeliest, and the weakest one needs the smallest push. The first position is left out when
there are others: it follows the prompt's end, which in a chat is the template's assistant header that
every answer shares, so a push there changes how every answer starts. Measured on SmolLM2 ("What is the
capital of France?" answered "The capital of France is Paris."): unlikelihood at every position pushed
hardest where the model was surest (p / (1 - p) weights its gradient), " Paris", and the model lost the
fact; at the weakest position including the first ("The", 0.08 ahead of "L"), every chat answer started
otherwise (German for Germany, French garbage for France); at the weakest later one (".", 0.29 ahead of
",") the answer changes and the rest stays (benchmarks/RESULTS.md, "Bad feedback"). The last position is
left out too when there are more than two: in a chat it is the end of turn, and an answer that only
goes on past it reads the same (Bad on an answer a Good lesson had taught pushed there, once lessons
were gated, and greedy decoding gave the same text: tests/test_learning.py).

Dimension letters: T tokens, P scored positions, D hidden, H query heads, K key/value heads,
G = H/K, E head size, F MLP size, V vocab, r rank.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np

from ..model.cache import KVCache, KVOptions
from ..model.config import ModelConfig
from ..model.forward import LayerTape, Masks, Sequence, Tape, embed, logits, rms_norm, run_layers
from ..model.rope import apply_rope, rope_tables
from ..model.transformer import Transformer
from ..model.weights import Linear, Weights, linear
from ..quant.matrices import DenseMatrix, dense_product
from .lora import LoRAMatrix, gated_backward
from .xlora import MixedMatrix


@dataclass
class Gradients:
    loss: float
    log_likelihood: float  # mean over the scored positions
    greedy: bool  # whether every target is the likeliest token at its position
    margin: float  # min over the scored positions of log p(target) - log p(likeliest other token)
    by_matrix: dict[int, tuple[LoRAMatrix, np.ndarray, np.ndarray]]  # id(matrix): (matrix, dA, dB)
    kept: dict | None = None  # the same, of the kept-predictions term apart (with `keep`)
    mixes: dict[int, np.ndarray] | None = None  # X-LoRA: {projection index: gradient (T, E) of its mix}
    margins: np.ndarray | None = None  # (P,) the margin at each scored position
    tapes: list[LayerTape] | None = None  # the forward's layer tapes, from the first layer it ran
    outputs: dict[int, np.ndarray] | None = None  # id(matrix): the loss's gradient (T, N) at its output
    kept_outputs: dict[int, np.ndarray] | None = None  # the same, of the kept-predictions term
    kept_probs: np.ndarray | None = None  # (K, V) the predictions kept (a Keep without probs: this pass's)


TRANSPOSED_BLOCK = 4096  # rows of W expanded at a time for a kernel provider's transposed product
# Rows of the output projection (and their softmax) computed per unit of a gradient pass in units
# (gradient_units). Measured in Pyodide under Node (SmolLM2, 49152 x 576, q4): ~35 ms a call plus ~3 ms a
# row, and the softmax ~2 ms a row: 16 rows are ~120 ms, where a 160-token answer's 168 rows at once
# took 2.4 s, a single step far over the worker's 100 ms slice.
LOGIT_ROWS = 16


def drained(units):
    """What a generator of units of work returns, all of its units run."""
    while True:
        try:
            next(units)
        except StopIteration as end:
            return end.value


def transposed_product(dy: np.ndarray, matrix) -> np.ndarray:
    """dy (T, N) @ W (N, K), with the matrix's own kernel; a quantized W is expanded for this product only.
    With a kernel provider (the WebAssembly kernels in Pyodide, where NumPy has no BLAS), TRANSPOSED_BLOCK
    rows at a time: through the provider's own backward product (`transposed`: kernels.c `*_t`, from the
    matrix as it is kept, on the pool's threads), else expanded by NumPy and transposed into a float32
    matrix the provider multiplies. Measured in Pyodide (a chat lesson on SmolLM2, benchmarks/RESULTS.md,
    "Gemma 3 learns"): expanding and transposing took half of each step."""
    return drained(_transposed_units(dy, matrix))


def _transposed_units(dy: np.ndarray, matrix):
    """transposed_product in units of work: with a kernel provider, a unit per block of rows."""
    provider = getattr(matrix, "provider", None)
    if provider is None:
        return dense_product(dy, matrix.dequantize().T, matrix.kernel)
    N, K = matrix.shape
    out = np.zeros((dy.shape[0], K), np.float32)
    transposed = getattr(provider, "transposed", None)
    add = None if transposed is None else transposed(matrix)
    dy = np.ascontiguousarray(dy, dtype=np.float32)
    for start in range(0, N, TRANSPOSED_BLOCK):
        stop = min(start + TRANSPOSED_BLOCK, N)
        if add is not None:
            add(dy, out, start, stop)
        else:
            block = DenseMatrix(matrix.rows(np.arange(start, stop)).T, matrix.kernel)  # (K, b)
            block.use_provider(provider)
            out += block(np.ascontiguousarray(dy[:, start:stop]))
        if stop < N:
            yield
    return out


def _bad_span(P: int) -> tuple[int, int]:
    """The positions (start, stop) of a P-token bad completion where it may be changed: not its first
    (every answer after the same prompt starts there), nor, with more than two, its last (a chat
    answer's end of turn: ending otherwise is the same answer)."""
    return (1 if P > 1 else 0), (P - 1 if P > 2 else P)


def bad_position(margins: np.ndarray) -> int:
    """Where a bad lesson pushes: in _bad_span, the target nearest the likeliest other token (either side)."""
    start, stop = _bad_span(len(margins))
    return start + int(np.argmin(np.abs(margins[start:stop])))


def _min_margin(margins: np.ndarray, reward: float) -> float:
    """The smallest margin: over every position for a good completion, over those up to the end of
    _bad_span for a bad one (whether greedy decoding still gives it is decided there)."""
    return float(margins.min() if reward > 0 else margins[: _bad_span(len(margins))[1]].min())


class _Grads:
    """Accumulates dA, dB per LoRAMatrix seen in the backward pass."""

    def __init__(self) -> None:
        self.by_matrix: dict[int, tuple[LoRAMatrix, np.ndarray, np.ndarray]] = {}
        self.mixes: dict[int, np.ndarray] = {}
        self.outputs: dict[int, np.ndarray] = {}  # dy at each LoRAMatrix's output (a keyed lesson's new rows)

    def linear_backward(self, lin: Linear, dy: np.ndarray, x: np.ndarray, need_input: bool = True):
        """dx for y = lin(x), given dy (T, N) (None unless `need_input`); records the adapter's dA, dB
        (or, for a projection mixed by X-LoRA, the gradient of its mix)."""
        return drained(self.linear_units(lin, dy, x, need_input))

    def linear_units(self, lin: Linear, dy: np.ndarray, x: np.ndarray, need_input: bool = True):
        """linear_backward in units of work (the transposed product's blocks)."""
        matrix = lin.matrix
        if isinstance(matrix, MixedMatrix):
            d_mix, dx = matrix.backward(dy, x)
            self.mixes[matrix.index] = self.mixes.get(matrix.index, 0) + d_mix
            return (yield from _transposed_units(dy, matrix.base)) + dx if need_input else None
        if isinstance(matrix, LoRAMatrix):
            z, raw = matrix.gated(x)  # (T, r): gated, and before the gates (None: no gates)
            dz = (dy @ matrix.B) * matrix.scale  # (T, r)
            if raw is not None:
                dz = gated_backward(dz, raw, matrix.gates)
            dB = matrix.scale * (dy.T @ z)  # (N, r)
            dA = dz.T @ x  # (r, K)
            if id(matrix) in self.by_matrix:
                _, old_a, old_b = self.by_matrix[id(matrix)]
                dA, dB = dA + old_a, dB + old_b
            self.by_matrix[id(matrix)] = (matrix, dA, dB)
            self.outputs[id(matrix)] = dy + self.outputs.get(id(matrix), 0)
            return (yield from _transposed_units(dy, matrix.base)) + dz @ matrix.A if need_input else None  # (T, K)
        return (yield from _transposed_units(dy, matrix)) if need_input else None  # (T, K)


def _adapted(*linears: Linear) -> bool:
    return any(isinstance(lin.matrix, (LoRAMatrix, MixedMatrix)) for lin in linears)


def _rms_backward(dy: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """dx for y = x / sqrt(mean(x^2) + eps) * weight."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))  # (T, 1)
    g = dy * weight  # (T, D)
    return r * g - (r**3 / x.shape[-1]) * x * np.sum(g * x, axis=-1, keepdims=True)  # (T, D)


def _silu_grad(x: np.ndarray) -> np.ndarray:
    sig = np.float32(0.5) + np.float32(0.5) * np.tanh(np.float32(0.5) * x)
    return sig * (1 + x * (1 - sig))


def _gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    """d/dx of 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2 / pi) (forward.gelu_tanh)."""
    c = np.float32(np.sqrt(2 / np.pi))
    t = np.tanh(c * (x + np.float32(0.044715) * x * x * x))
    return np.float32(0.5) * (1 + t) + np.float32(0.5) * x * (1 - t * t) * c * (1 + np.float32(3 * 0.044715) * x * x)


# the gate activation's derivative, by config.hidden_act (forward.ACTIVATIONS)
ACTIVATION_GRADS = {"silu": _silu_grad, "gelu_pytorch_tanh": _gelu_tanh_grad}


def entering_states(model: Transformer, tokens, layer: int):
    """The hidden states (T, D) entering decoder layer `layer` for `tokens` (T,) from position 0."""
    weights, config = model.weights, model.config
    return advance(model, embed(weights, config, np.asarray(tokens)), range(layer))


def advance(model: Transformer, x: np.ndarray, layers: range):
    """x (T, D), entering `layers.start` at positions 0..T-1, carried through `layers` (the inference
    forward, no tape): the hidden states entering `layers.stop`."""
    config = model.config
    if not len(layers):
        return x
    positions = np.arange(len(x))
    cache = KVCache(config, len(x), KVOptions())
    return run_layers(model, x, [Sequence(slice(None), positions, cache, Masks(positions))], layers)


@dataclass
class Keep:
    """Positions whose predictions a lesson keeps: the model's distributions there are pulled towards
    `probs` (K, V) (the base model's), by `weight` times their mean KL divergence. probs None: the
    model computes as the base model (an adapter still zero), so its predictions in the pass are the
    ones kept (Gradients.kept_probs returns them, for the next passes)."""

    positions: np.ndarray  # (K,)
    probs: np.ndarray | None  # (K, V)
    weight: float


def _softmax64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def base_probs(model: Transformer, start: Start, positions):
    """The base model's next-token distributions (K, V) at `positions` (K,), from `start`: the passes
    with every adapter matrix bypassed (the caller holds the lock that guards the weights)."""
    return drained(base_prob_units(model, start, positions))


def base_prob_units(model: Transformer, start: Start, positions):
    """base_probs in units of work, a layer each, then the output projection, each with the adapters
    bypassed while it runs only (generations may run in between)."""
    weights, config = model.weights, model.config
    passes = _run_from_units(model, start)
    while True:
        with bypassed(weights):
            try:
                next(passes)
            except StopIteration as end:
                x, _ = end.value  # (T, D)
                break
        yield
    yield
    with bypassed(weights):
        return _softmax64(logits(weights, config, x[positions])).astype(np.float32)


@contextmanager
def bypassed(weights: Weights):
    """The weights without their adapter matrices (LoRA or X-LoRA) while inside (the caller holds their
    lock)."""
    swapped: list[tuple[Linear, LoRAMatrix | MixedMatrix]] = []
    for layer in weights.layers:
        for lin in [*layer.self_attn.projections().values(), *layer.mlp.projections().values()]:
            if isinstance(lin.matrix, (LoRAMatrix, MixedMatrix)):
                swapped.append((lin, lin.matrix))
    if isinstance(weights.lm_head.matrix, (LoRAMatrix, MixedMatrix)):
        swapped.append((weights.lm_head, weights.lm_head.matrix))
    try:
        for lin, matrix in swapped:
            lin.matrix = matrix.base
        yield
    finally:
        for lin, matrix in swapped:
            lin.matrix = matrix


@dataclass
class Start:
    """Where the passes of a lesson start: at layer `first`, with the hidden states entering it (T, D).
    When that layer's only adapted matrix is down_proj, everything it computes before that product is
    the same at every step: `frozen` keeps it (the layer's tape), and a step starts at the product."""

    first: int
    entering: np.ndarray
    frozen: LayerTape | None = None


def start_at(model: Transformer, entering: np.ndarray, first: int):
    """The Start of passes at layer `first` entering with `entering` (T, D)."""
    weights, config = model.weights, model.config
    if first == config.num_hidden_layers:
        return Start(first, entering)
    layer = weights.layers[first]
    w, m = layer.self_attn, layer.mlp
    if _adapted(w.q_proj, w.k_proj, w.v_proj, w.o_proj, m.gate_proj, m.up_proj):
        return Start(first, entering)
    _, tapes = run_from(model, Start(first, entering), stop=first + 1)
    return Start(first, entering, tapes[0])


def run_from(model: Transformer, start: Start, stop: int | None = None):
    """The inference forward of layers start.first.. (to `stop`) over positions 0..T-1, from an empty
    float32 cache: (the last layer's output (T, D), the tapes of those layers)."""
    return drained(_run_from_units(model, start, stop))


def _run_from_units(model: Transformer, start: Start, stop: int | None = None):
    """run_from in units of work, a layer each; returns the same."""
    weights, config = model.weights, model.config
    tape = Tape()
    first, x = start.first, start.entering
    if start.frozen is not None:
        x, frozen = _resume(weights, config, start)
        tape.layers.append(frozen)
        first += 1
    T = len(x)
    positions = np.arange(T)
    cache = KVCache(config, T, KVOptions())
    batch = [Sequence(slice(None), positions, cache, Masks(positions))]
    for layer in range(first, config.num_hidden_layers if stop is None else stop):
        yield
        x = run_layers(model, x, batch, range(layer, layer + 1), tape)  # (T, D)
    return x, tape.layers


def _resume(weights: Weights, config: ModelConfig, start: Start) -> tuple[np.ndarray, LayerTape]:
    """Layer start.first's output (T, D) from its frozen down_proj input on, and its tape with that
    product's output."""
    frozen, layer = start.frozen, weights.layers[start.first]
    assert frozen is not None and frozen.h is not None and frozen.s is not None  # (start_at taped that layer)
    m = linear(frozen.s, layer.mlp.down_proj)  # (T, D)
    if not config.sandwich_norms:
        return frozen.h + m, frozen
    assert layer.post_feedforward_layernorm is not None  # (sandwich_norms)
    return frozen.h + rms_norm(m, layer.post_feedforward_layernorm, config.rms_norm_eps), replace(frozen, m=m)


def logits_for(model: Transformer, tokens: list[int]) -> np.ndarray:
    """All logits (T, V) of the forward the backward pass runs on."""
    weights, config = model.weights, model.config
    x, _ = run_from(model, Start(0, entering_states(model, tokens, 0)))
    return logits(weights, config, x)


def loss_and_grads(model: Transformer, *args, **kwargs) -> Gradients:
    """gradient_units (its arguments) in one piece: the loss, its gradients and the log-likelihood."""
    return drained(gradient_units(model, *args, **kwargs))


def gradient_units(
    model: Transformer,
    tokens: list[int],
    scored: np.ndarray,
    reward: float = 1.0,
    keep: Keep | None = None,
    first: int = 0,
    start: Start | None = None,
):
    """The loss, its gradients (by LoRAMatrix) and the targets' log-likelihood for predicting tokens[p + 1]
    from the positions p in `scored` (P,), weighted by `reward`; with `keep`, plus its weight times the
    mean KL divergence from its reference distributions to the model's at its positions (what the
    model predicted there stays).

    The forward and backward run through layers `first`.. (no adapter may sit below it), from `start`
    (start_at: the hidden states entering there at positions 0..max(scored); default: computed).

    In units of work, for a caller that answers requests in between (the worker's idle loop): a
    generator that yields between units and returns the Gradients (loss_and_grads drains it). A unit is
    a decoder layer's pass (forward or back) over the tokens, LOGIT_ROWS rows of the output projection
    with their softmax, or a block of the output projection's backward product (with a kernel provider).
    The weights must stay as they are until it returns."""
    weights, config = model.weights, model.config
    ids = np.asarray(tokens)  # (T',)
    T = int(scored.max()) + 1  # positions fed: the last one scored is the last one needed
    if start is None:
        start = start_at(model, entering_states(model, ids[:T], first), first)
        yield
    assert start.first == first and len(start.entering) == T, "a start for other positions or another layer"
    x_last, tapes = yield from _run_from_units(model, start)
    P = len(scored)
    rows = scored if keep is None else np.concatenate([scored, keep.positions])  # (R,)
    xs = x_last[rows]  # (R, D)
    final = rms_norm(xs, weights.norm, config.rms_norm_eps)  # (R, D)
    targets = ids[scored + 1]  # (P,)
    R = len(rows)
    probs = None  # (R, V)
    likeliest = np.empty(P, np.int64)  # (P,) the likeliest token at each scored position
    runner_up = np.empty(P)  # (P,) the probability of the likeliest token other than the target
    for b in range(0, R, LOGIT_ROWS):
        yield
        block = slice(b, min(b + LOGIT_ROWS, R))
        part = _softmax64(weights.lm_head(final[block]))  # (b, V)
        probs = np.empty((R, part.shape[1])) if probs is None else probs
        probs[block] = part
        scored_rows = slice(b, min(b + LOGIT_ROWS, P))
        if scored_rows.start < scored_rows.stop:
            mine = probs[scored_rows]  # (b, V)
            likeliest[scored_rows] = mine.argmax(axis=-1)
            others = mine.copy()
            others[np.arange(len(others)), targets[scored_rows]] = 0.0
            runner_up[scored_rows] = others.max(axis=-1)
    assert probs is not None  # (R >= P >= 1 rows: the loop made it)
    p_target = probs[np.arange(P), targets].copy()  # (P,)
    log_likelihood = float(np.mean(np.log(p_target)))
    greedy = bool(np.all(likeliest == targets))  # every target is the likeliest token
    margins = np.log(p_target) - np.log(runner_up + 1e-300)  # (P,)
    dlogits = probs  # (R, V), made the gradient of the loss with respect to the logits in place
    if reward > 0:
        loss = -reward * log_likelihood
        dlogits[np.arange(P), targets] -= 1.0
        dlogits[:P] *= reward / P
    else:  # at the weakest position w: d/dz -log(1 - p_w) = p_w / (1 - p_w) * (onehot_w - p)
        w = bad_position(margins)
        rest = max(1.0 - p_target[w], 1e-12)
        loss = reward * float(np.log(rest))
        dlogits[w, targets[w]] -= 1.0
        dlogits[w] *= reward * p_target[w] / rest  # (reward < 0: the sign of -(onehot - p))
        dlogits[:w], dlogits[w + 1 : P] = 0.0, 0.0
    if keep is not None:
        kept_probs = probs[P:].astype(np.float32) if keep.probs is None else keep.probs  # (K, V)
        ref = kept_probs.astype(np.float64)  # (K, V)
        kept = probs[P:]
        loss += keep.weight * float(np.mean(np.sum(ref * (np.log(ref + 1e-30) - np.log(kept + 1e-30)), axis=-1)))
        dlogits[P:] = (kept - ref) * (keep.weight / len(ref))
    dlogits = dlogits.astype(np.float32)
    yield
    if keep is None:
        grads = yield from _backward(model, first, tapes, x_last, rows, final, dlogits)
        min_margin = _min_margin(margins, reward)
        return Gradients(
            loss, log_likelihood, greedy, min_margin, grads.by_matrix, None, grads.mixes, margins, tapes, grads.outputs
        )
    only = dlogits[P:].copy()  # the two terms apart: a caller may clip the first alone
    dlogits[P:] = 0
    grads = yield from _backward(model, first, tapes, x_last, rows, final, dlogits)
    yield
    kept = yield from _kept_backward(model, first, tapes, x_last, keep.positions, final[P:], only, grads)
    return Gradients(
        loss,
        log_likelihood,
        greedy,
        _min_margin(margins, reward),
        grads.by_matrix,
        kept.by_matrix,
        grads.mixes,
        margins,
        tapes,
        grads.outputs,
        kept.outputs,
        kept_probs,
    )


def _kept_backward(model: Transformer, first: int, tapes, x_last, positions, final, only, like: _Grads):
    """_backward for the kept predictions' term alone: dlogits `only` (K, V) at `positions` (K,), the
    prompt's. Its gradient reaches no position after the last of them (attention looks back only), so
    the pass runs over the positions up to it; none at all where the term is zero (a fresh keyed
    lesson's first step: the adapter computes as the base model then), its gradients then zeros shaped
    as `like`'s. dy at the adapters' outputs (`outputs`) comes back (T, N), zero past those positions."""
    T = len(x_last)
    if not only.any():
        zero = _Grads()
        zero.by_matrix = {k: (m, np.zeros_like(dA), np.zeros_like(dB)) for k, (m, dA, dB) in like.by_matrix.items()}
        zero.outputs = {k: np.zeros_like(dy) for k, dy in like.outputs.items()}
        return zero
    L = int(positions.max()) + 1
    short = [_first_positions(tape, L, T) for tape in tapes]
    grads = yield from _backward(model, first, short, x_last[:L], positions, final, only)
    for key, dy in grads.outputs.items():
        grads.outputs[key] = np.concatenate([dy, np.zeros((T - L, dy.shape[1]), dy.dtype)])
    return grads


def _first_positions(tape: LayerTape, L: int, T: int) -> LayerTape:
    """A layer's tape over positions 0..T-1 (from an empty cache) cut to positions 0..L-1."""
    cut: dict[str, np.ndarray | None] = {}
    for name, a in vars(tape).items():
        if a is None:
            cut[name] = None
        elif name in ("q_heads", "k_heads", "k", "v"):  # (heads, T, E)
            cut[name] = a[:, :L]
        elif name == "q":  # (K, G*T, E): the G heads of each key/value head stacked
            K, GT, E = a.shape
            cut[name] = a.reshape(K, GT // T, T, E)[:, :, :L].reshape(K, -1, E)
        elif name == "probs":  # (K, G*T, T): causal, so rows before L attend to none at or after it
            K, GT, _ = a.shape
            cut[name] = a.reshape(K, GT // T, T, T)[:, :, :L, :L].reshape(K, -1, L)
        else:  # (T, ...)
            cut[name] = a[:L]
    return LayerTape(**cut)


def _backward(model: Transformer, first: int, tapes, x_last, rows, final, dlogits):
    """The gradients (_Grads: by_matrix {id(matrix): (matrix, dA, dB)}, mixes) for dlogits (R, V), the
    gradient of the logits at `rows` (R,), from the forward whose last layer gave x_last (T, D) and
    whose layers from `first` left `tapes`. A generator of units of work (the output projection's blocks,
    then a layer each) that returns them."""
    weights, config, inv_freq = model.weights, model.config, model.inv_freq
    grads = _Grads()
    T = len(x_last)
    H, K, G, E = config.num_attention_heads, config.num_key_value_heads, config.group_size, config.head_dim
    if first == config.num_hidden_layers:  # only the output projection is adapted: nothing below needs dx
        yield from grads.linear_units(weights.lm_head, dlogits, final, need_input=False)
        return grads
    dfinal = yield from grads.linear_units(weights.lm_head, dlogits, final)  # (R, D)
    dx = np.zeros_like(x_last)  # (T, D)
    xs = x_last[rows]  # (R, D)
    np.add.at(dx, rows, _rms_backward(dfinal, xs, weights.norm, config.rms_norm_eps))  # a row may be in both
    scale = np.float32(config.attention_scale)

    layers = zip(weights.layers[first:], tapes, inv_freq[first:], strict=True)
    act_grad = ACTIVATION_GRADS[config.hidden_act]
    eps, sandwich = config.rms_norm_eps, config.sandwich_norms
    for depth, (layer, tape, frequencies) in enumerate(reversed(list(layers))):
        yield
        cos, sin = rope_tables(frequencies, 0, T)
        w, m = layer.self_attn, layer.mlp
        lowest = depth == len(tapes) - 1  # nothing below needs dx: stop where no adapter is left
        attention_adapted = _adapted(w.q_proj, w.k_proj, w.v_proj, w.o_proj)
        # MLP: x_out = h + down(act(gate) * up), or h + norm(down(...)) with sandwich norms
        dm = _rms_backward(dx, tape.m, layer.post_feedforward_layernorm, eps) if sandwich else dx  # (T, D)
        if lowest and not attention_adapted and not _adapted(m.gate_proj, m.up_proj):
            grads.linear_backward(m.down_proj, dm, tape.s, need_input=False)
            break
        ds = grads.linear_backward(m.down_proj, dm, tape.s)  # (T, F)
        dgate = ds * tape.up * act_grad(tape.gate)  # (T, F)
        dup = ds * tape.act  # (T, F)
        db = grads.linear_backward(m.gate_proj, dgate, tape.b) + grads.linear_backward(m.up_proj, dup, tape.b)  # (T, D)
        if lowest and not attention_adapted:
            break
        yield  # (the layer's attention is a unit of its own)
        mlp_norm = layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm
        dh = dx + _rms_backward(db, tape.h, mlp_norm, eps)  # (T, D)
        # attention: h = x + o_proj(softmax(q k^T * scale + mask) v), or x + norm(o_proj(...)) with sandwich norms
        dattended = _rms_backward(dh, tape.attended, layer.post_attention_layernorm, eps) if sandwich else dh
        do = grads.linear_backward(w.o_proj, dattended, tape.o)  # (T, H*E)
        do = do.reshape(T, H, E).transpose(1, 0, 2).reshape(K, G * T, E)  # (K, G*T, E)
        dprobs = do @ tape.v.transpose(0, 2, 1)  # (K, G*T, T)
        dv = tape.probs.transpose(0, 2, 1) @ do  # (K, T, E), summed over the G heads
        dscores = tape.probs * (dprobs - np.sum(dprobs * tape.probs, axis=-1, keepdims=True)) * scale
        dq = apply_rope((dscores @ tape.k).reshape(H, T, E), cos, -sin)  # (H, T, E): the inverse rotation
        dk = apply_rope(dscores.transpose(0, 2, 1) @ tape.q, cos, -sin)  # (K, T, E)
        if w.q_norm is not None:  # config.qk_norm: each head was normalized over E before the rotation
            dq = _rms_backward(dq, tape.q_heads, w.q_norm, eps)
            dk = _rms_backward(dk, tape.k_heads, w.k_norm, eps)
        dq = dq.transpose(1, 0, 2).reshape(T, H * E)
        dk = dk.transpose(1, 0, 2).reshape(T, K * E)
        dv = dv.transpose(1, 0, 2).reshape(T, K * E)
        da = (
            grads.linear_backward(w.q_proj, dq, tape.a)
            + grads.linear_backward(w.k_proj, dk, tape.a)
            + grads.linear_backward(w.v_proj, dv, tape.a)
        )  # (T, D)
        dx = dh + _rms_backward(da, tape.x, layer.input_layernorm, eps)  # (T, D)
    return grads
