"""Runtime quantization (ISQ) of a float model's matrices, at load: round-to-nearest, or activation-aware.

Activation-aware (after AWQ, Lin et al. 2023): input channels that carry large activations matter more,
so before rounding, each input channel k of W is scaled up by s_k and the input scaled down by the same
factor (y = (x / s) @ (W * s).T, unchanged before rounding). The scales are s = mean|x|^a over a small
calibration text, with a picked per group of matrices by grid search to minimise the output error. The
1/s is folded into whatever produces the input, so inference costs nothing extra:

    q/k/v      input_layernorm weight
    gate/up    post_attention_layernorm weight
    down       rows and bias of up_proj (its output is down's input, through the SiLU product)
    o          rows and bias of v_proj, for multi-head attention only (with grouped heads one v row feeds
               several o columns, which cannot all get their own scale); otherwise round-to-nearest

Dimension letters: n calibration rows, K input features, N output features.
"""

from __future__ import annotations

import numpy as np

from ..files.formats import get_format
from ..model.cache import KVOptions
from ..model.config import ModelConfig
from ..model.forward import forward
from ..model.transformer import Transformer
from ..model.weights import ComputeOptions, Linear, Matrix, Weights, prepare_matrix
from ..quant.matrices import DenseMatrix

ALPHAS = np.linspace(0.0, 0.5, 6)  # wider exponents overfit a short calibration text (measured)
MAX_ROWS = 2048  # calibration rows kept per projection


class _Recorder:
    """Stands in for a matrix during calibration: passes x through and keeps a copy of it."""

    def __init__(self, inner: DenseMatrix) -> None:
        self.inner = inner
        self.rows: list[np.ndarray] = []  # each x seen (T, K)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.rows.append(x.copy())
        return self.inner(x)

    def rows_seen(self) -> np.ndarray:
        x = np.concatenate(self.rows)  # (n, K)
        step = max(1, len(x) // MAX_ROWS)
        return x[::step][:MAX_ROWS]


def _round(w: np.ndarray, fmt: str) -> np.ndarray:
    f = get_format(fmt)
    return f.dequantize(f.quantize(w), w.shape)


def search_scales(x: np.ndarray, w: np.ndarray, fmt: str) -> tuple[np.ndarray, float, float]:
    """(s (K,), the best exponent, its output error relative to round-to-nearest) for W (N, K) seen with x (n, K)."""
    reference = x @ w.T  # (n, N)
    magnitude = np.abs(x).mean(axis=0) + 1e-8  # (K,)
    best, best_error, rtn_error = np.ones_like(magnitude), np.inf, None
    best_alpha = 0.0
    for alpha in ALPHAS:
        s = magnitude**alpha
        s /= np.sqrt(s.max() * s.min())  # keep the scales centred around 1
        error = float(np.square((x / s) @ _round(w * s, fmt).T - reference).mean())
        if alpha == 0.0:
            rtn_error = error
        if error < best_error:
            best, best_error, best_alpha = s.astype(np.float32), error, float(alpha)
    return best, best_alpha, best_error / rtn_error if rtn_error else 1.0


def calibrate(weights: Weights, config: ModelConfig, ids: list[int], chunk: int = 128) -> dict[str, np.ndarray]:
    """Run the float model over `ids`, recording the input of every projection: name -> rows (n, K)."""
    from ..model.cache import KVCache

    recorders: dict[str, _Recorder] = {}
    originals = []
    for i, layer in enumerate(weights.layers):
        for group in ("self_attn", "mlp"):
            for name, lin in getattr(layer, group).projections().items():
                recorder = _Recorder(lin.matrix)
                recorders[f"{i}.{name}"] = recorder
                originals.append((lin, lin.matrix))
                lin.matrix = recorder
    try:
        cache = KVCache(config, len(ids), KVOptions())
        model = Transformer(config, weights)
        for start in range(0, len(ids), chunk):
            forward(model, np.asarray(ids[start : start + chunk]), start, cache, last_only=True)
    finally:
        for lin, matrix in originals:
            lin.matrix = matrix
    return {name: r.rows_seen() for name, r in recorders.items()}


def _divide_outputs(lin: Linear, s: np.ndarray) -> None:
    """Divide each output of `lin` (its weight row and its bias) by s: the inverse of scaling the input
    channels of the matrix that reads those outputs."""
    lin.matrix = DenseMatrix(lin.matrix.dequantize() / s[:, None])
    if lin.bias is not None:
        lin.bias = lin.bias / s


def quantize_activation_aware(
    weights: Weights, config: ModelConfig, options: ComputeOptions, calibration_ids: list[int]
) -> tuple[Weights, list[dict]]:
    """Scale the float matrices of `weights` (DenseMatrix) per input channel from the activations the
    calibration text produces, then quantize them into `options.form`; returns the new weights and a
    report per group: {layer, group, alpha, error_vs_rtn}."""
    fmt = "q8" if options.form == "q8" else options.isq_format
    report: list[dict] = []

    def quantized(w: np.ndarray) -> Matrix:
        return prepare_matrix("f32", {"": w}, w.shape, options)  # round to nearest, as at any load

    seen = calibrate(weights, config, calibration_ids)
    for i, layer in enumerate(weights.layers):
        attn, mlp = layer.self_attn, layer.mlp
        # down: scale its input channels; the inverse goes into up_proj's rows.
        w_down = mlp.down_proj.matrix.dequantize()
        s, alpha, gain = search_scales(seen[f"{i}.down_proj"], w_down, fmt)
        mlp.down_proj.matrix = DenseMatrix(w_down * s)
        _divide_outputs(mlp.up_proj, s)
        report.append({"layer": i, "group": "down", "alpha": alpha, "error_vs_rtn": gain})
        # gate + up share their input: one set of scales, folded into the post-attention norm.
        x = seen[f"{i}.gate_proj"]
        stacked = np.concatenate([mlp.gate_proj.matrix.dequantize(), mlp.up_proj.matrix.dequantize()])
        s, alpha, gain = search_scales(x, stacked, fmt)
        for lin in (mlp.gate_proj, mlp.up_proj):
            lin.matrix = DenseMatrix(lin.matrix.dequantize() * s)
        layer.post_attention_layernorm = layer.post_attention_layernorm / s
        report.append({"layer": i, "group": "gate_up", "alpha": alpha, "error_vs_rtn": gain})
        # o: only when every o input channel has its own v row (multi-head attention).
        if config.group_size == 1:
            w_o = attn.o_proj.matrix.dequantize()
            s, alpha, gain = search_scales(seen[f"{i}.o_proj"], w_o, fmt)
            attn.o_proj.matrix = DenseMatrix(w_o * s)
            _divide_outputs(attn.v_proj, s)
            report.append({"layer": i, "group": "o", "alpha": alpha, "error_vs_rtn": gain})
        # q, k, v share their input: scales folded into the input norm.
        stacked = np.concatenate([lin.matrix.dequantize() for lin in (attn.q_proj, attn.k_proj, attn.v_proj)])
        s, alpha, gain = search_scales(seen[f"{i}.q_proj"], stacked, fmt)
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj):
            lin.matrix = DenseMatrix(lin.matrix.dequantize() * s)
        layer.input_layernorm = layer.input_layernorm / s
        report.append({"layer": i, "group": "qkv", "alpha": alpha, "error_vs_rtn": gain})

    for layer in weights.layers:
        for group in (layer.self_attn, layer.mlp):
            for lin in group.projections().values():
                lin.matrix = quantized(lin.matrix.dequantize())
    tied = weights.lm_head.matrix is weights.embed_tokens
    weights.embed_tokens = quantized(weights.embed_tokens.dequantize())
    weights.lm_head = Linear(weights.embed_tokens) if tied else Linear(quantized(weights.lm_head.matrix.dequantize()))
    return weights, report
