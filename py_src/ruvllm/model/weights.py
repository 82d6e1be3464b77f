"""The weights the forward reads: containers whose field names are the Hugging Face names, filled from a
`TensorStore` with every matrix prepared in its compute form (matrices.py).

Dimension letters: V vocab, D hidden, H query heads, K key/value heads, E head size, F MLP size.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError, LoadError
from ..files.formats import DEQUANTIZED_FORMATS, GROUP, get_format, packs_nibbles
from ..files.store import TensorStore, sanitize
from ..quant.matrices import KERNELS, DenseMatrix, Int4Matrix, Int8Matrix, MatrixLike
from ..quant.provider import KernelProvider
from .config import ModelConfig

Matrix = DenseMatrix | Int8Matrix | Int4Matrix
COMPUTE_FORMS = ("f32", "q8", "q4")
FLOAT_FORMATS = ("f32", "f16", "bf16")


@dataclass
class Linear:
    """y = x @ W.T + bias, W in any compute form. The one place a projection happens."""

    matrix: MatrixLike  # (out, in): a compute form, or an adapter's wrapper of one
    bias: np.ndarray | None = None  # (out,)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self.matrix(x)  # (T, out)
        if self.bias is not None:
            y += self.bias
        return y


def linear(x: np.ndarray, w: Linear) -> np.ndarray:
    """The single entry point for every projection; the model never looks at a weight's format."""
    return w(x)


@dataclass
class Attention:
    q_proj: Linear  # (H*E, D)
    k_proj: Linear  # (K*E, D)
    v_proj: Linear  # (K*E, D)
    o_proj: Linear  # (D, H*E)
    q_norm: np.ndarray | None = None  # (E,) with config.qk_norm
    k_norm: np.ndarray | None = None  # (E,)

    def projections(self) -> dict[str, Linear]:
        return {"q_proj": self.q_proj, "k_proj": self.k_proj, "v_proj": self.v_proj, "o_proj": self.o_proj}


@dataclass
class MLP:
    gate_proj: Linear  # (F, D)
    up_proj: Linear  # (F, D)
    down_proj: Linear  # (D, F)

    def projections(self) -> dict[str, Linear]:
        return {"gate_proj": self.gate_proj, "up_proj": self.up_proj, "down_proj": self.down_proj}


@dataclass
class DecoderLayer:
    """Norm names are the HF ones: in a Llama block post_attention_layernorm is the MLP's input norm; with
    config.sandwich_norms (Gemma 3) it normalizes the attention output, and the MLP has its own two."""

    input_layernorm: np.ndarray  # (D,)
    self_attn: Attention
    post_attention_layernorm: np.ndarray  # (D,)
    mlp: MLP
    pre_feedforward_layernorm: np.ndarray | None = None  # (D,) with config.sandwich_norms
    post_feedforward_layernorm: np.ndarray | None = None  # (D,)

    def projections(self) -> list[Linear]:
        return [*self.self_attn.projections().values(), *self.mlp.projections().values()]

    def vectors(self) -> list[np.ndarray]:
        """Norm weights and biases."""
        norms: tuple[np.ndarray | None, ...] = (
            self.input_layernorm,
            self.post_attention_layernorm,
            self.pre_feedforward_layernorm,
        )
        norms += (self.post_feedforward_layernorm, self.self_attn.q_norm, self.self_attn.k_norm)
        biases = [lin.bias for lin in self.projections()]
        return [v for v in (*norms, *biases) if v is not None]


@dataclass
class Weights:
    embed_tokens: Matrix  # (V, D), read by rows
    layers: list[DecoderLayer]
    norm: np.ndarray  # (D,)
    lm_head: Linear  # (V, D); shares the embed_tokens matrix when the embeddings are tied

    def matrices(self) -> list[MatrixLike]:
        """Every distinct matrix, once (a tied lm_head is the embedding matrix)."""
        found: dict[int, MatrixLike] = {
            id(self.embed_tokens): self.embed_tokens,
            id(self.lm_head.matrix): self.lm_head.matrix,
        }
        for layer in self.layers:
            for lin in layer.projections():
                found[id(lin.matrix)] = lin.matrix
        return list(found.values())

    @property
    def nbytes(self) -> int:
        vectors = [self.norm, *(v for layer in self.layers for v in layer.vectors())]
        return sum(m.nbytes for m in self.matrices()) + sum(v.nbytes for v in vectors)


@dataclass(frozen=True, kw_only=True)
class ComputeOptions:
    """How weights live in memory while computing.

    form: "f32" (expanded, fastest), "q8" (int8 codes, ~1.1 bytes/weight) or "q4" (packed 4-bit,
      ~0.6). Quantized tensors keep their exact values in any form that can hold them (a q8 tensor
      stays int8 under "q4"); float tensors are quantized at load (runtime quantization, round to
      nearest) to q8, or to `isq_format` under "q4".
    numpy_kernel: how NumPy multiplies, "blas" (best on CPython) or "einsum" (best in Pyodide); see
      matrices.py. (LoadOptions.kernels chooses between NumPy and a kernel provider.)
    provider: a kernel provider (quant/provider.py) that computes the products instead of NumPy.
    """

    form: str = "f32"
    numpy_kernel: str = "blas"
    isq_format: str = "q4_1"
    provider: KernelProvider | None = None

    def __post_init__(self) -> None:
        if self.form not in COMPUTE_FORMS:
            raise InvalidArgumentError(f"compute must be one of {', '.join(COMPUTE_FORMS)}, got {self.form!r}")
        if self.numpy_kernel not in KERNELS:
            raise InvalidArgumentError(f"numpy_kernel must be one of {', '.join(KERNELS)}, got {self.numpy_kernel!r}")
        if self.isq_format not in ("q4_0", "q4_1"):
            raise InvalidArgumentError(f"isq_format must be q4_0 or q4_1, got {self.isq_format!r}")


def compute_form(stored: str, shape: tuple[int, ...], options: ComputeOptions) -> tuple[type[Matrix], str]:
    """The matrix type a stored tensor gets under `options`, and the storage format of the values it
    holds: the stored one, or for a float matrix under "q8"/"q4" the one it is quantized to at load.
    The one place this is decided: loading follows it, and the memory planner asks it."""
    if options.form == "f32" or len(shape) != 2 or shape[1] % GROUP:
        return DenseMatrix, "f32"
    if stored in FLOAT_FORMATS or stored in DEQUANTIZED_FORMATS:  # runtime quantization (round to nearest)
        stored = "q8" if options.form == "q8" else options.isq_format
    if options.form == "q8" or not packs_nibbles(stored):
        return Int8Matrix, stored  # 4-bit values keep their exact values as int8 codes
    return Int4Matrix, stored


def prepare_matrix(fmt: str, parts: dict[str, np.ndarray], shape: tuple[int, ...], options: ComputeOptions) -> Matrix:
    """A stored matrix in the compute form `options` asks for, never losing precision it has."""
    cls, values = compute_form(fmt, shape, options)
    matrix: Matrix
    if issubclass(cls, DenseMatrix):
        matrix = DenseMatrix(get_format(fmt).dequantize(parts, shape), options.numpy_kernel)
    else:
        if values != fmt:
            parts = get_format(values).quantize(get_format(fmt).dequantize(parts, shape))
        matrix = cls.from_parts(values, parts, options.numpy_kernel)
    matrix.use_provider(options.provider)
    return matrix


def load_weights(config: ModelConfig, store: TensorStore, options: ComputeOptions | None = None) -> Weights:
    """Read and check every tensor the config calls for, and prepare it in its compute form."""
    options = options or ComputeOptions()
    names = sanitize(store.names())
    D, E, F, V = config.hidden_size, config.head_dim, config.intermediate_size, config.vocab_size
    H, K = config.num_attention_heads, config.num_key_value_heads

    def stored(name: str, shape: tuple[int, ...]):
        if name not in names:
            raise LoadError(f"the weights have no tensor {name!r}, which config.json calls for ({config.architecture})")
        t = store.tensors[names[name]]
        if t.shape != shape:
            raise LoadError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} from config.json")
        return t

    def vector(name: str, size: int) -> np.ndarray:
        return store.load_f32(stored(name, (size,)).name)

    def norm(name: str, size: int) -> np.ndarray:
        """A norm's effective multiplier: Gemma stores w and multiplies by 1 + w (in float32, as HF)."""
        w = vector(name, size)
        return w + np.float32(config.norm_offset) if config.norm_offset else w

    def matrix(name: str, shape: tuple[int, int]) -> Matrix:
        t = stored(name, shape)
        return prepare_matrix(t.format, store.parts(t.name), t.shape, options)

    def proj(prefix: str, out_dim: int, in_dim: int, bias: bool) -> Linear:
        return Linear(
            matrix(f"{prefix}.weight", (out_dim, in_dim)), vector(f"{prefix}.bias", out_dim) if bias else None
        )

    def fused(name: str, sizes: tuple[int, ...], in_dim: int) -> list[Linear]:
        """Phi-3's fused projections, cut into their parts by rows (rows hold whole quantization groups)."""
        t = stored(name, (sum(sizes), in_dim))
        parts, bounds = store.parts(t.name), np.cumsum((0, *sizes))
        return [
            Linear(prepare_matrix(t.format, {k: p[lo:hi] for k, p in parts.items()}, (hi - lo, in_dim), options))
            for lo, hi in itertools.pairwise(bounds)
        ]

    def attention(p: str) -> Attention:
        if config.fused_projections:
            q, k, v = fused(f"{p}.self_attn.qkv_proj.weight", (H * E, K * E, K * E), D)
        else:
            q = proj(f"{p}.self_attn.q_proj", H * E, D, config.qkv_bias)
            k = proj(f"{p}.self_attn.k_proj", K * E, D, config.qkv_bias)
            v = proj(f"{p}.self_attn.v_proj", K * E, D, config.qkv_bias)
        o = proj(f"{p}.self_attn.o_proj", D, H * E, config.o_bias)
        if not config.qk_norm:
            return Attention(q, k, v, o)
        return Attention(q, k, v, o, norm(f"{p}.self_attn.q_norm.weight", E), norm(f"{p}.self_attn.k_norm.weight", E))

    def mlp(p: str) -> MLP:
        if config.fused_projections:
            gate, up = fused(f"{p}.mlp.gate_up_proj.weight", (F, F), D)
        else:
            gate = proj(f"{p}.mlp.gate_proj", F, D, config.mlp_bias)
            up = proj(f"{p}.mlp.up_proj", F, D, config.mlp_bias)
        return MLP(gate, up, proj(f"{p}.mlp.down_proj", D, F, config.mlp_bias))

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}"
        layer = DecoderLayer(
            input_layernorm=norm(f"{p}.input_layernorm.weight", D),
            self_attn=attention(p),
            post_attention_layernorm=norm(f"{p}.post_attention_layernorm.weight", D),
            mlp=mlp(p),
        )
        if config.sandwich_norms:
            layer.pre_feedforward_layernorm = norm(f"{p}.pre_feedforward_layernorm.weight", D)
            layer.post_feedforward_layernorm = norm(f"{p}.post_feedforward_layernorm.weight", D)
        fuse = getattr(options.provider, "fuse", None)  # a provider that runs products sharing x at once
        if fuse is not None:
            a, m = layer.self_attn, layer.mlp
            fuse([a.q_proj.matrix, a.k_proj.matrix, a.v_proj.matrix])
            fuse([m.gate_proj.matrix, m.up_proj.matrix])
        layers.append(layer)
    embed = matrix("model.embed_tokens.weight", (V, D))
    lm_head = Linear(embed) if config.tie_word_embeddings else proj("lm_head", V, D, False)
    return Weights(embed_tokens=embed, layers=layers, norm=norm("model.norm.weight", D), lm_head=lm_head)
