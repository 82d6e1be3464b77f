"""Weights: the stored tensors of a model folder, and the containers the forward reads.

`TensorStore` sees one or more safetensors files as logical tensors, each with a storage format
(`formats.py`) taken from the file's own metadata: ruvllm files say it in `__metadata__`; plain
Hugging Face checkpoints (f32/f16/bf16 only) are read by dtype. `load_weights` prepares every tensor
for compute (float32 for now) and fills the containers, whose field names are the HF names.

Dimension letters: V vocab, D hidden, H query heads, K key/value heads, E head size, F MLP size.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .errors import LoadError
from .formats import GROUP, get_format
from .tensorfile import SafetensorsFile

FORMAT_NAME = "ruvllm"
FORMAT_VERSION = "1"
_DTYPE_FORMATS = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


@dataclass(frozen=True)
class StoredTensor:
    name: str
    format: str
    shape: tuple[int, ...]
    file: SafetensorsFile


class TensorStore:
    """Logical tensors over a set of safetensors files (a model may be split into shards)."""

    def __init__(self, files: list[SafetensorsFile]) -> None:
        self.tensors: dict[str, StoredTensor] = {}
        for f in files:
            for name, fmt, shape in _logical_tensors(f):
                if name in self.tensors:
                    raise LoadError(f"tensor {name!r} appears in both {self.tensors[name].file.source} and {f.source}")
                self.tensors[name] = StoredTensor(name, fmt, shape, f)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def names(self) -> list[str]:
        return list(self.tensors)

    def parts(self, name: str) -> dict[str, np.ndarray]:
        """The stored entries of one tensor (views into the file), keyed by suffix."""
        t = self._get(name)
        return {suffix: t.file.get(name + suffix) for suffix in get_format(t.format).part_specs(t.shape)}

    def load_f32(self, name: str) -> np.ndarray:
        """The tensor dequantized to a new float32 array."""
        t = self._get(name)
        return get_format(t.format).dequantize(self.parts(name), t.shape)

    def _get(self, name: str) -> StoredTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise LoadError(f"the model has no tensor {name!r}") from None


def _logical_tensors(f: SafetensorsFile) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, format, shape) of each logical tensor in one file, checked against the stored entries."""
    if f.metadata.get("format") != FORMAT_NAME:
        result = []
        for name, info in f.tensors.items():
            if info.dtype not in _DTYPE_FORMATS:
                raise LoadError(
                    f"{f.source}: tensor {name!r} has dtype {info.dtype}; a plain safetensors checkpoint must hold "
                    "F32, F16 or BF16 (convert it with `ruvllm convert`)"
                )
            result.append((name, _DTYPE_FORMATS[info.dtype], info.shape))
        return result

    version = f.metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise LoadError(
            f"{f.source}: ruvllm format version {version!r} is not supported (this build reads {FORMAT_VERSION})"
        )
    try:
        table = json.loads(f.metadata["tensors"])
    except (KeyError, json.JSONDecodeError):
        raise LoadError(f"{f.source}: __metadata__ 'tensors' is missing or not JSON") from None
    result, claimed = [], set()
    for name, entry in table.items():
        fmt = get_format(entry.get("format"), f"{f.source}: tensor {name!r}")
        shape = tuple(entry.get("shape", ()))
        if fmt.quantized and entry.get("group_size") != GROUP:
            raise LoadError(
                f"{f.source}: tensor {name!r}: group_size {entry.get('group_size')!r} is not supported (only {GROUP})"
            )
        try:
            specs = fmt.part_specs(shape)
        except ValueError as e:
            raise LoadError(f"{f.source}: tensor {name!r}: {e}") from None
        for suffix, (dtype, part_shape) in specs.items():
            stored = f.tensors.get(name + suffix)
            if stored is None:
                raise LoadError(f"{f.source}: tensor {name!r} ({fmt.name}) has no entry {name + suffix!r}")
            if stored.shape != part_shape or stored.dtype != dtype:
                raise LoadError(
                    f"{f.source}: entry {name + suffix!r} of {fmt.name} tensor {name!r} {list(shape)} should be "
                    f"{dtype} {list(part_shape)}, found {stored.dtype} {list(stored.shape)}"
                )
            claimed.add(name + suffix)
        result.append((name, fmt.name, shape))
    stray = set(f.tensors) - claimed
    if stray:
        raise LoadError(f"{f.source}: entries not described by the metadata: {', '.join(sorted(stray)[:5])}")
    return result


# ---------------------------------------------------------------------------------------------------
# Compute-side containers. Field names are the Hugging Face names.


@dataclass
class Linear:
    """y = x @ weight.T + bias, with `weight` (out, in) float32. The one place a matmul happens."""

    weight: np.ndarray  # (out, in)
    bias: np.ndarray | None = None  # (out,)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight.T  # (T, out)
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


@dataclass
class MLP:
    gate_proj: Linear  # (F, D)
    up_proj: Linear  # (F, D)
    down_proj: Linear  # (D, F)


@dataclass
class DecoderLayer:
    input_layernorm: np.ndarray  # (D,)
    self_attn: Attention
    post_attention_layernorm: np.ndarray  # (D,)
    mlp: MLP


@dataclass
class Weights:
    embed_tokens: np.ndarray  # (V, D)
    layers: list[DecoderLayer]
    norm: np.ndarray  # (D,)
    lm_head: Linear  # (V, D); shares embed_tokens when the embeddings are tied


def sanitize(names: list[str]) -> dict[str, str]:
    """HF name -> stored name. Every key fix-up lives here.

    Checkpoints saved from some trainers drop the `model.` prefix; old Llama checkpoints carry
    `rotary_emb.inv_freq` buffers, which are recomputed from the config instead.
    """
    mapping = {}
    for stored in names:
        if stored.endswith("rotary_emb.inv_freq"):
            continue
        name = stored
        if not name.startswith(("model.", "lm_head.")):
            name = "model." + name
        mapping[name] = stored
    return mapping


def load_weights(config: ModelConfig, store: TensorStore, dtype: np.dtype = np.float32) -> Weights:
    """Read, check and dequantize every tensor the config calls for."""
    names = sanitize(store.names())
    D, E, F, V = config.hidden_size, config.head_dim, config.intermediate_size, config.vocab_size
    H, K = config.num_attention_heads, config.num_key_value_heads

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in names:
            raise LoadError(f"the model has no tensor {name!r} (needed by {config.architecture})")
        stored = store.tensors[names[name]]
        if stored.shape != shape:
            raise LoadError(f"tensor {name!r} has shape {list(stored.shape)}, expected {list(shape)} from config.json")
        return store.load_f32(names[name]).astype(dtype, copy=False)

    def proj(prefix: str, out_dim: int, in_dim: int, bias: bool) -> Linear:
        return Linear(
            tensor(f"{prefix}.weight", (out_dim, in_dim)), tensor(f"{prefix}.bias", (out_dim,)) if bias else None
        )

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}"
        layers.append(
            DecoderLayer(
                input_layernorm=tensor(f"{p}.input_layernorm.weight", (D,)),
                self_attn=Attention(
                    q_proj=proj(f"{p}.self_attn.q_proj", H * E, D, config.qkv_bias),
                    k_proj=proj(f"{p}.self_attn.k_proj", K * E, D, config.qkv_bias),
                    v_proj=proj(f"{p}.self_attn.v_proj", K * E, D, config.qkv_bias),
                    o_proj=proj(f"{p}.self_attn.o_proj", D, H * E, config.o_bias),
                ),
                post_attention_layernorm=tensor(f"{p}.post_attention_layernorm.weight", (D,)),
                mlp=MLP(
                    gate_proj=proj(f"{p}.mlp.gate_proj", F, D, config.mlp_bias),
                    up_proj=proj(f"{p}.mlp.up_proj", F, D, config.mlp_bias),
                    down_proj=proj(f"{p}.mlp.down_proj", D, F, config.mlp_bias),
                ),
            )
        )
    embed = tensor("model.embed_tokens.weight", (V, D))
    lm_head = Linear(embed) if config.tie_word_embeddings else proj("lm_head", V, D, False)
    return Weights(embed_tokens=embed, layers=layers, norm=tensor("model.norm.weight", (D,)), lm_head=lm_head)


def count_parameters(store: TensorStore, is_counted: Callable[[str], bool] = lambda name: True) -> int:
    return sum(int(np.prod(t.shape)) for t in store.tensors.values() if is_counted(t.name))
