"""A GGUF file seen as a model folder: the config.json it implies, Hugging Face names for its tensors,
and those tensors in storage formats the engine computes with (no conversion, no requantization).

Facts this relies on (llama.cpp's convert_hf_to_gguf.py, llama-arch.cpp, llama-model.cpp):
- Tensor shapes are listed in ggml order ([in, out]); the data itself is row-major (out, in).
- In `llama` files the rows of Wq and Wk are permuted for ggml's interleaved RoPE; we undo it so the
  model uses the Hugging Face RoPE. Rows hold whole quantization blocks, so this is lossless. The other
  families (qwen2, qwen3, phi3, gemma3) use the NeoX RoPE, which is the Hugging Face one: no permutation.
- No `output.weight` means the output projection is tied to `token_embd`.
- Gemma's converter stores every norm weight as 1 + w; transformers subtracts the 1 again and its
  Gemma norms multiply by 1 + w: we do the same, so both compute the very same float32 multipliers.
- Gemma 3: every sixth layer attends globally, the others over a sliding window with RoPE base 10000
  (llama.cpp hard-codes both); queries are scaled by head_dim^-1/2.
- Phi-3 keeps q, k and v fused in `attn_qkv`, and gate and up fused in `ffn_up` (gate first).

Tensors keep their GGUF types: F32/F16/BF16 become our float formats, quantized types the "ggml:<TYPE>"
formats whose blocks files/ggml.py turns into exact integer codes (formats.py, quant/matrices.py); the
grid i-quants (IQ1/IQ2/IQ3) decode to float32 only and load as a float matrix does (expanded under
f32, quantized again, with loss, under q8/q4).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ..errors import LoadError
from . import ggml
from .gguf import GGUFFile, GGUFTensor
from .gguf_vocab import GGUFVocabulary

_Dims = tuple[tuple[int, str], ...]  # a tensor's expected shape: each dimension, with the metadata that implies it

# GGUF architecture -> (Hugging Face architecture, model_type)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Where a family's names differ from the table above.
_FAMILY_NAMES = {
    "gemma3": {
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_norm.weight": "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    },
    "phi3": {"ffn_up.weight": "mlp.gate_up_proj.weight"},
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF float types -> our storage formats (ggml:<TYPE> for the quantized ones)
_FLOAT_FORMATS = {"F32": ("f32", np.float32), "F16": ("f16", np.float16), "BF16": ("bf16", np.uint16)}
# Tensors llama.cpp may add that change what the model computes: refused, not skipped.
_REFUSED = {
    "rope_freqs.weight": "precomputed RoPE scaling factors (rope_freqs)",
    "rope_factors_long.weight": "LongRoPE scaling factors (rope_factors_long, as in Phi-3 128k)",
    "rope_factors_short.weight": "LongRoPE scaling factors (rope_factors_short, as in Phi-3 128k)",
}
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0

BLOCK_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)", re.ASCII | re.DOTALL)  # llama.cpp writes blk.%d.<part>
MAX_SIZE = 2**31 - 1  # sizes and counts: ModelConfig's bound (jsonfields.integer)
MAX_CONTEXT = 2**24  # positions: the longest released context is 10M (Llama 4 Scout)
F32_MAX = float(np.finfo(np.float32).max)


def hf_name(gguf_name: str, arch: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for tensors the model does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    block = BLOCK_NAME.fullmatch(gguf_name)
    if block is not None:
        name = _FAMILY_NAMES.get(arch, {}).get(block[2]) or _LAYER_NAMES.get(block[2])
        if name is not None:
            return f"model.layers.{block[1]}.{name}"
    return None


class GGUFModel:
    """The model in a GGUF file: `config` (a config.json document), and its tensors by Hugging Face name
    for a TensorStore (`logical_tensors`, `get`). Works on a header-only GGUFFile too (for planning)."""

    def __init__(self, file: GGUFFile) -> None:
        """Every check that needs no tensor data runs here (so on a header alone): the metadata's values,
        the vocabulary, and the tensors' names, types and shapes against what the metadata says."""
        self.file = file
        self.source = file.source
        self.metadata = file.metadata
        self.arch = _architecture(self.metadata, self.source)
        self.names: dict[str, str] = {}  # HF name -> GGUF name
        for name in file.tensors:
            if name in _REFUSED:
                raise LoadError(f"{self.source}: tensor {name!r} holds {_REFUSED[name]}, which are not supported")
            if name.startswith("blk.") and BLOCK_NAME.fullmatch(name) is None:
                raise LoadError(
                    f"{self.source}: tensor {name!r} is not named blk.<block number>.<part> (as blk.0.attn_q.weight)"
                )
            hf = hf_name(name, self.arch)
            if hf is not None:
                self.names[hf] = name
        self.formats = {hf: self._format(gguf) for hf, gguf in self.names.items()}
        self.vocabulary = GGUFVocabulary.read(self.metadata, self.source)
        self.config = gguf_config(self.metadata, set(file.tensors), self.source, self.vocabulary)
        check_tensors(self.config, file.tensors, self.metadata, self.source)

    def _format(self, name: str) -> str:
        t = self.file.tensors[name]
        if t.type.name in _FLOAT_FORMATS:
            return _FLOAT_FORMATS[t.type.name][0]
        if (t.type.name in ggml.CODE_FORMS or t.type.name in ggml.DEQUANTIZE_ONLY) and len(t.shape) == 2:
            return f"ggml:{t.type.name}"  # DEQUANTIZE_ONLY: loaded as float, quantized again under q8/q4
        supported = ", ".join([*_FLOAT_FORMATS, *ggml.CODE_FORMS, *ggml.DEQUANTIZE_ONLY])
        raise LoadError(
            f"{self.source}: tensor {name!r} has GGUF type {t.type.name}, which ruvllm cannot decode "
            f"(supported: {supported}); requantize the model, e.g. to Q4_K_M"
        )

    def logical_tensors(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(HF name, storage format, shape (out, in)) of every tensor the model uses."""
        return [(hf, self.formats[hf], tuple(reversed(self.file.tensors[g].shape))) for hf, g in self.names.items()]

    def get(self, hf: str) -> np.ndarray:
        """The one stored part of a tensor: float values (out, in) or (n,), or (rows, bytes) of ggml blocks."""
        name = self.names[hf]
        t = self.file.tensors[name]
        raw = self.file.raw(name)  # (rows, bytes per row)
        shape = tuple(reversed(t.shape))
        if t.type.name in _FLOAT_FORMATS:
            data = raw.view(_FLOAT_FORMATS[t.type.name][1]).reshape(shape)
        else:
            data = raw
        if self.arch == "gemma3" and name.endswith("norm.weight"):
            data = data.astype(np.float32) - np.float32(1)  # stored as 1 + w (see the module docstring)
        if self.arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = self.config["num_attention_heads" if "q_proj" in hf else "num_key_value_heads"]
            data = unpermute_rows(data, heads)
        return data

    def tokenizer_files(self, merges: bool = True) -> tuple[dict, dict, dict]:
        """(tokenizer.json, tokenizer_config.json, generation_config.json) contents from the metadata
        (`merges`: see gguf_vocab.tokenizer_files)."""
        from .gguf_vocab import tokenizer_files

        tokenizer, tokenizer_config, generation = tokenizer_files(self.metadata, self.source, self.vocabulary, merges)
        tokenizer_config.setdefault("model_max_length", self.config["max_position_embeddings"])
        return tokenizer, tokenizer_config, generation


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K permutation: within each head, rows (0, 2, 4, .., 1, 3, 5, ..) interleaved back.

    llama.cpp stores head rows as pairs (r, r + E/2) side by side; HF keeps the two halves apart.
    """
    rows = w.shape[0]
    return np.ascontiguousarray(w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _architecture(meta: dict, src: str) -> str:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise LoadError(
            f"{src}: GGUF architecture {_found(arch)} is not supported; supported: {', '.join(ARCHITECTURES)} "
            "(general.architecture)"
        )
    return arch


def gguf_config(meta: dict, tensor_names: set[str], src: str, vocabulary: GGUFVocabulary) -> dict:
    """A Hugging Face config.json document from GGUF metadata, each value checked and a wrong one named by
    its key: sizes and counts are integers in range, floats finite and positive, the head counts and head
    size agree, the vocabulary size is the tokenizer's and the block count that of the blk.N tensors."""
    arch = _architecture(meta, src)

    def key(name: str, default: int | None = None, maximum: int = MAX_SIZE) -> int:
        """A size or a count: an integer from 1 to `maximum`; `default` when the file has no such key."""
        value = meta.get(f"{arch}.{name}")
        if value is None and default is not None:
            return default
        if value is None:
            raise LoadError(f"{src}: GGUF metadata has no {arch}.{name}")
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
            raise LoadError(
                f"{src}: GGUF metadata {arch}.{name} must be an integer from 1 to {maximum}, found {_found(value)}"
            )
        return value

    def number(name: str, default: float | None = None, below: float = math.inf, single: bool = True) -> float:
        """A float in (0, below); `single`: as the float32 the file stores (f32 9.999999747e-06 is 1e-05)."""
        value = meta.get(f"{arch}.{name}")
        if value is None and default is not None:
            return default
        if value is None:
            raise LoadError(f"{src}: GGUF metadata has no {arch}.{name}")
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < min(below, F32_MAX):
            value = float(str(np.float32(value))) if single else float(value)
            if value > 0:  # not rounded to 0 in float32
                return value
        expected = "a finite number > 0" if below == math.inf else f"a number in (0, {below:g})"
        raise LoadError(
            f"{src}: GGUF metadata {arch}.{name} must be {expected}, found {_found(meta[f'{arch}.{name}'])}"
        )

    hidden, heads = key("embedding_length"), key("attention.head_count")
    kv_heads = key("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise LoadError(
            f"{src}: {arch}.attention.head_count {heads} is not a multiple of {arch}.attention.head_count_kv {kv_heads}"
        )
    if f"{arch}.attention.key_length" not in meta and hidden % heads:
        raise LoadError(
            f"{src}: {arch}.embedding_length {hidden} is not a multiple of {arch}.attention.head_count {heads}, "
            f"and there is no {arch}.attention.key_length to give the head size"
        )
    head_dim = key("attention.key_length", hidden // heads)
    for name, what in (
        ("attention.value_length", "value heads of another size are"),
        ("rope.dimension_count", "partial RoPE is"),
    ):
        if key(name, head_dim) != head_dim:
            found = meta[f"{arch}.{name}"]
            raise LoadError(f"{src}: {arch}.{name} is {found}, not the head size {head_dim}: {what} not supported")
    tokens = len(vocabulary.tokens)
    if key("vocab_size", tokens) != tokens:
        raise LoadError(
            f"{src}: {arch}.vocab_size is {meta[f'{arch}.vocab_size']} but tokenizer.ggml.tokens lists {tokens} tokens"
        )
    layers = key("block_count")
    _check_blocks(layers, tensor_names, f"{arch}.block_count", src)
    hf_arch, model_type = ARCHITECTURES[arch]
    theta = number("rope.freq_base", 10000.0)
    config: dict[str, Any] = {  # config.json's fields, as transformers names them
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": tokens,
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": key("context_length", maximum=MAX_CONTEXT),
        "rms_norm_eps": number("attention.layer_norm_rms_epsilon", below=1.0),
        "rope_theta": theta,
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": number("rope.scaling.factor", single=False)}
    elif scaling not in (None, "none"):
        raise LoadError(f"{src}: {arch}.rope.scaling.type {_found(scaling)} is not supported; supported: none, linear")
    window = meta.get(f"{arch}.attention.sliding_window")
    if arch == "gemma3":
        for name in ("final_logit_softcapping", "attn_logit_softcapping"):
            if meta.get(f"{arch}.{name}") is not None:
                raise LoadError(f"{src}: {arch}.{name} is not supported")
        full = {"rope_type": "default", "rope_theta": theta, **config.pop("rope_scaling", {})}
        config.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=head_dim,
            sliding_window=key("attention.sliding_window"),
            layer_types=[
                "full_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN == 0 else "sliding_attention"
                for i in range(layers)
            ],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_ROPE_THETA},
                "full_attention": full,
            },
        )
    elif arch == "phi3" and window:
        config["sliding_window"] = key("attention.sliding_window")
    for name, field in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        if vocabulary.special_ids[name] is not None:  # inside the vocabulary (GGUFVocabulary.read)
            config[field] = vocabulary.special_ids[name]
    return config


def _check_blocks(count: int, tensor_names: set[str], key: str, src: str) -> None:
    """The blk.N tensors are those of blocks 0 to count - 1, each block with at least one."""
    found: dict[int, str] = {}  # block -> one of its tensors
    for name in sorted(tensor_names):
        block = BLOCK_NAME.fullmatch(name)
        if block is not None:  # a block number longer than any count stands for "past the last block"
            found.setdefault(int(block[1]) if len(block[1]) <= 12 else 10**12, name)
    if len(found) == count and max(found, default=-1) == count - 1:
        return
    if not found:
        raise LoadError(f"{src}: {key} is {count} but the file has no block tensors (blk.N.*)")
    if max(found) == len(found) - 1:  # blocks 0 .. n-1, all there: another count
        blocks = "1 block (blk.0)" if len(found) == 1 else f"{len(found)} blocks (blk.0 .. blk.{len(found) - 1})"
        raise LoadError(f"{src}: {key} is {count} but the file has tensors for {blocks}")
    past = [block for block in found if block >= count]
    if past:
        raise LoadError(
            f"{src}: {key} is {count} (blocks blk.0 .. blk.{count - 1}) but the file has tensor {found[min(past)]!r}"
        )
    missing = next(block for block in range(count) if block not in found)
    raise LoadError(f"{src}: {key} is {count} but the file has no tensors for block {missing} (blk.{missing}.*)")


def check_tensors(config: dict, tensors: dict[str, GGUFTensor], meta: dict, src: str) -> None:
    """Every tensor the model computes with is in the file, with the shape the metadata implies: a wrong
    shape is named with the keys that imply the right one. Shapes are in ggml order, [in, out]."""
    arch = meta["general.architecture"]
    H, K, E = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    head = (
        f"{arch}.attention.key_length"
        if f"{arch}.attention.key_length" in meta
        else f"{arch}.embedding_length {config['hidden_size']} / {arch}.attention.head_count {H}"
    )
    V = config["vocab_size"]
    D = (config["hidden_size"], f"{arch}.embedding_length {config['hidden_size']}")
    F = (config["intermediate_size"], f"{arch}.feed_forward_length {config['intermediate_size']}")
    Q = (H * E, f"{arch}.attention.head_count {H} x head size {E}, the head size being {head}")
    KV = (K * E, f"{arch}.attention.head_count_kv {K} x head size {E}, the head size being {head}")
    expected: dict[str, _Dims] = {
        "token_embd.weight": (D, (V, f"the {V} tokens of tokenizer.ggml.tokens")),
        "output_norm.weight": (D,),
    }
    if not config["tie_word_embeddings"]:
        expected["output.weight"] = expected["token_embd.weight"]
    layer: dict[str, _Dims] = {"attn_norm.weight": (D,)}
    if arch == "phi3":  # q, k, v fused; gate and up fused
        layer["attn_qkv.weight"] = (D, (Q[0] + 2 * KV[0], f"{Q[1]} + 2 x {KV[1]}"))
        layer["ffn_up.weight"] = (D, (2 * F[0], f"2 x {F[1]}"))
    else:
        layer.update({"attn_q.weight": (D, Q), "attn_k.weight": (D, KV), "attn_v.weight": (D, KV)})
        layer.update({"ffn_gate.weight": (D, F), "ffn_up.weight": (D, F)})
    if arch == "qwen2":
        layer.update({"attn_q.bias": (Q,), "attn_k.bias": (KV,), "attn_v.bias": (KV,)})
    if arch in ("qwen3", "gemma3"):
        size = (E, f"head size {E}, the head size being {head}")
        layer.update({"attn_q_norm.weight": (size,), "attn_k_norm.weight": (size,)})
    if arch == "gemma3":
        layer.update({"post_attention_norm.weight": (D,), "post_ffw_norm.weight": (D,)})
    layer.update({"attn_output.weight": (Q, D), "ffn_norm.weight": (D,), "ffn_down.weight": (F, D)})
    for i in range(config["num_hidden_layers"]):  # as many as there are blocks (_check_blocks)
        expected.update({f"blk.{i}.{part}": dims for part, dims in layer.items()})

    for name, dims in expected.items():
        if name not in tensors:
            needs = f" (every block of a {arch} model has {', '.join(layer)})" if name.startswith("blk.") else ""
            raise LoadError(f"{src}: the file has no tensor {name!r}{needs}")
        shape, want = tensors[name].shape, tuple(size for size, _ in dims)
        if shape != want:
            wrong = [why for (size, why), found in zip(dims, shape, strict=False) if size != found]
            reasons = wrong if len(shape) == len(want) else [why for _, why in dims]
            raise LoadError(
                f"{src}: tensor {name!r} has shape {list(shape)} but the metadata calls for {list(want)} "
                f"({'; '.join(dict.fromkeys(reasons))})"
            )


def _found(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
