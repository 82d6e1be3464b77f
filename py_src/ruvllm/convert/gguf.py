"""Converting a GGUF file (llama.cpp's format), read with the `gguf` package.

Facts this relies on (llama.cpp's convert_hf_to_gguf.py and ggml):
- Tensor shapes are listed in ggml order ([in, out]); the data itself is row-major (out, in).
- In `llama` files the rows of Wq and Wk are permuted for ggml's interleaved RoPE; we undo it so the
  model uses the Hugging Face RoPE. Rows hold whole quantization blocks, so this is lossless.
- Q8_0, Q4_0 and Q4_1 blocks hold exactly our q8 / q4_0 / q4_1 values in the same nibble order, so they
  are copied; every other type is dequantized and stored in the requested format.
- No `output.weight` means the output projection is tied to `token_embd`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import LoadError
from ..model.config import ModelConfig
from . import encode, report
from .gguf_tokenizer import build_tokenizer
from .writer import ConvertedTensor, ModelFolder, write_model

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# GGUF block layouts we copy: type name -> (our format, bytes per block of 32, byte ranges of the parts)
_LOSSLESS = {
    "Q8_0": ("q8", 34, {".scales": (0, 2, np.float16), "": (2, 34, np.int8)}),
    "Q4_0": ("q4_0", 18, {".scales": (0, 2, np.float16), "": (2, 18, np.uint8)}),
    "Q4_1": ("q4_1", 20, {".scales": (0, 2, np.float16), ".mins": (2, 4, np.float16), "": (4, 20, np.uint8)}),
}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for tensors the model does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, index, rest = gguf_name.split(".", 2)
        if rest in _LAYER_NAMES:
            return f"model.layers.{index}.{_LAYER_NAMES[rest]}"
    return None


def convert_gguf(src: str, out: str, weights: str | None, log: Callable[[str], None]) -> None:
    import gguf

    try:
        reader = gguf.GGUFReader(src)
    except Exception as e:  # the gguf library raises whatever a damaged file makes it hit (IndexError, ...)
        raise LoadError(f"{src}: cannot read as GGUF ({type(e).__name__}: {e})") from None
    for t in reader.tensors:  # the spec aligns every tensor; a misaligned offset points into the wrong bytes
        if (t.data_offset - reader.data_offset) % reader.alignment:
            raise LoadError(
                f"{src}: tensor {t.name!r} starts at data offset {t.data_offset - reader.data_offset}, which is not "
                f"a multiple of the file's alignment {reader.alignment}: the file is damaged"
            )
    meta = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.ggml.")}
    tensor_names = {t.name for t in reader.tensors}
    config = gguf_config(meta, reader, tensor_names, src)
    ModelConfig.from_dict(config, f"{src} (metadata)")  # values no model can have are refused here
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    arch = meta["general.architecture"]

    tensors: list[ConvertedTensor] = []
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            if t.name == "rope_freqs.weight":
                raise LoadError(f"{src}: rope_freqs (precomputed RoPE scaling factors) is not supported")
            log(f"{t.name:48s} skipped (not used by the model)")
            continue
        rows_per_head = None
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            rows_per_head = heads if "q_proj" in name else kv_heads
        converted = _convert_tensor(gguf, t, name, weights, rows_per_head)
        tensors.append(converted)
        log(report(converted))

    folder = ModelFolder(config=config)
    folder.tokenizer, folder.tokenizer_config, folder.generation_config = build_tokenizer(reader, meta, src)
    folder.tokenizer_config["model_max_length"] = config["max_position_embeddings"]
    write_model(out, folder, tensors, log)


def gguf_config(meta: dict, reader, tensor_names: set[str], src: str) -> dict:
    """A Hugging Face config.json from GGUF metadata."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in _ARCHITECTURES:
        raise LoadError(f"{src}: GGUF architecture {arch!r} is not supported; supported: {', '.join(_ARCHITECTURES)}")

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
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(meta.get(f"{arch}.vocab_size") or (len(tokens.data) if tokens else 0))
    config = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": key("context_length"),
        # f32 in the file: 9.999999747e-06 is 1e-05 written with f32 precision.
        "rms_norm_eps": float(str(np.float32(key("attention.layer_norm_rms_epsilon", integer=False)))),
        "rope_theta": float(str(np.float32(key("rope.freq_base", 10000.0, integer=False)))),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(key("rope.scaling.factor", integer=False))}
    elif scaling not in (None, "none"):
        raise LoadError(f"{src}: RoPE scaling {scaling!r} is not supported")
    for name in ("bos_token_id", "eos_token_id", "padding_token_id"):
        value = reader.fields.get(f"tokenizer.ggml.{name}")
        if value is not None:
            token = value.contents()
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise LoadError(f"{src}: GGUF metadata tokenizer.ggml.{name} must be a token id, found {token!r}")
            config[name.replace("padding", "pad")] = token
    return config


def _convert_tensor(gguf, t, name: str, weights: str | None, rows_per_head: int | None) -> ConvertedTensor:
    type_name = t.tensor_type.name
    shape = tuple(int(d) for d in reversed(t.shape))  # ggml [in, out] -> (out, in)
    if type_name in _LOSSLESS and len(shape) == 2:
        fmt, block_bytes, layout = _LOSSLESS[type_name]
        blocks = np.asarray(t.data).reshape(shape[0], -1, block_bytes)  # (R, B, bytes)
        parts = {
            suffix: np.ascontiguousarray(blocks[..., lo:hi]).view(dtype).reshape(shape[0], -1)
            for suffix, (lo, hi, dtype) in layout.items()
        }
        if rows_per_head:
            parts = {suffix: unpermute_rows(p, rows_per_head) for suffix, p in parts.items()}
        return ConvertedTensor(name, fmt, shape, parts, f"{fmt} (copied from GGUF {type_name}, lossless)")

    w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    if rows_per_head:
        w = unpermute_rows(w, rows_per_head)
    if weights is None:
        weights = "f32" if type_name == "F32" else "f16"
    converted = encode(name, w, weights)
    if type_name != "F32" or converted.format != "f32":
        converted.note += f" (from GGUF {type_name})"
    return converted


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K permutation: within each head, rows (0, 2, 4, .., 1, 3, 5, ..) interleaved back.

    llama.cpp stores head rows as pairs (r, r + E/2) side by side; HF keeps the two halves apart.
    """
    rows = w.shape[0]
    return np.ascontiguousarray(w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
