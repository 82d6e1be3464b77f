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

import numpy as np

from ..errors import LoadError
from . import ggml
from .gguf import GGUFFile

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


def hf_name(gguf_name: str, arch: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for tensors the model does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, index, rest = gguf_name.split(".", 2)
        name = _FAMILY_NAMES.get(arch, {}).get(rest) or _LAYER_NAMES.get(rest)
        if name is not None:
            return f"model.layers.{index}.{name}"
    return None


class GGUFModel:
    """The model in a GGUF file: `config` (a config.json document), and its tensors by Hugging Face name
    for a TensorStore (`logical_tensors`, `get`). Works on a header-only GGUFFile too (for planning)."""

    def __init__(self, file: GGUFFile) -> None:
        self.file = file
        self.source = file.source
        self.metadata = file.metadata
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or arch not in ARCHITECTURES:
            raise LoadError(
                f"{self.source}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
            )
        self.arch = arch
        self.names: dict[str, str] = {}  # HF name -> GGUF name
        for name in file.tensors:
            if name in _REFUSED:
                raise LoadError(f"{self.source}: {_REFUSED[name]} are not supported")
            hf = hf_name(name, arch)
            if hf is not None:
                self.names[hf] = name
        self.config = gguf_config(self.metadata, set(file.tensors), self.source)
        self.formats = {hf: self._format(gguf) for hf, gguf in self.names.items()}

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

    def tokenizer_files(self) -> tuple[dict, dict, dict]:
        """(tokenizer.json, tokenizer_config.json, generation_config.json) contents from the metadata."""
        from .gguf_vocab import tokenizer_files

        tokenizer, tokenizer_config, generation = tokenizer_files(self.metadata, self.source)
        tokenizer_config.setdefault("model_max_length", self.config["max_position_embeddings"])
        return tokenizer, tokenizer_config, generation


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K permutation: within each head, rows (0, 2, 4, .., 1, 3, 5, ..) interleaved back.

    llama.cpp stores head rows as pairs (r, r + E/2) side by side; HF keeps the two halves apart.
    """
    rows = w.shape[0]
    return np.ascontiguousarray(w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def gguf_config(meta: dict, tensor_names: set[str], src: str) -> dict:
    """A Hugging Face config.json document from GGUF metadata."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise LoadError(f"{src}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")

    def key(name: str, default: object = None, integer: bool = True) -> int | float:
        """A positive number from the metadata: an integer (sizes, counts) or a finite float."""
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise LoadError(f"{src}: GGUF metadata has no {arch}.{name}")
        kinds = int if integer else (int, float)
        if not isinstance(value, kinds) or isinstance(value, bool) or not 0 < value < float("inf"):
            expected = "a positive integer" if integer else "a finite number > 0"
            raise LoadError(f"{src}: GGUF metadata {arch}.{name} must be {expected}, found {value!r}")
        return value

    hidden, heads = key("embedding_length"), key("attention.head_count")
    head_dim = key("attention.key_length", hidden // heads)
    if key("rope.dimension_count", head_dim) != head_dim:
        raise LoadError(f"{src}: partial RoPE ({arch}.rope.dimension_count != head size) is not supported")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = int(meta.get(f"{arch}.vocab_size") or (len(tokens) if isinstance(tokens, list) else 0))
    hf_arch, model_type = ARCHITECTURES[arch]
    layers = key("block_count")
    theta = float(str(np.float32(key("rope.freq_base", 10000.0, integer=False))))
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": key("context_length"),
        # f32 in the file: 9.999999747e-06 is 1e-05 written with f32 precision.
        "rms_norm_eps": float(str(np.float32(key("attention.layer_norm_rms_epsilon", integer=False)))),
        "rope_theta": theta,
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(key("rope.scaling.factor", integer=False))}
    elif scaling not in (None, "none"):
        raise LoadError(f"{src}: RoPE scaling {scaling!r} is not supported")
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
    for name in ("bos_token_id", "eos_token_id", "padding_token_id"):
        token = meta.get(f"tokenizer.ggml.{name}")
        if token is not None:
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise LoadError(f"{src}: GGUF metadata tokenizer.ggml.{name} must be a token id, found {token!r}")
            config[name.replace("padding", "pad")] = token
    return config
