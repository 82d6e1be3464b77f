"""The blueprint of a model: a frozen dataclass built from a Hugging Face `config.json`.

Unknown keys are ignored; what the forward needs but the file leaves implicit (head size, per-layer
sliding windows, the RoPE variant, what a family adds to the Llama block) is derived once, in `from_dict`.

The families differ from Llama in a few switches:
    Qwen2     q/k/v biases, sliding window on upper layers
    Mistral   sliding window
    Qwen3     RMSNorm of each query and key head (qk_norm)
    Phi-3     fused qkv and gate/up projections (split at load: weights.py)
    Gemma 3   GeGLU (tanh GELU), qk_norm, norms after attention and MLP too (sandwich_norms), norms
              that scale by 1 + weight, embeddings times sqrt(D), queries scaled by
              query_pre_attn_scalar^-1/2, sliding-window layers with their own RoPE base
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import LoadError
from ..files import jsonfields as fields

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Phi3ForCausalLM",
    "Gemma3ForCausalLM",
)
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
MAX_LAYERS = 4096  # far above any released model (a few hundred): a larger count is a damaged file


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3", ...} or None for plain RoPE
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2, or Llama with attention_bias
    o_bias: bool = False  # Llama with attention_bias
    mlp_bias: bool = False
    sliding_windows: tuple[int | None, ...] = field(default=())  # per layer; None = full attention
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    hidden_act: str = "silu"  # the MLP's gate activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU)
    qk_norm: bool = False  # RMSNorm of every query and key head before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # Gemma 3: norms on the attention and MLP outputs, before each residual add
    norm_offset: float = 0.0  # Gemma: a norm multiplies by (norm_offset + weight)
    embed_scale: float = 1.0  # Gemma: embeddings are multiplied by sqrt(hidden_size)
    query_scale: float = 0.0  # attention scores scale; 0 means head_dim^-1/2
    local_rope_theta: float | None = None  # Gemma 3: the RoPE base of sliding-window layers
    fused_projections: bool = False  # Phi-3: qkv_proj and gate_up_proj are stored fused

    @property
    def attention_scale(self) -> float:
        return self.query_scale or self.head_dim**-0.5

    @property
    def llama_block(self) -> bool:
        """True for the plain pre-norm SwiGLU block activation-aware ISQ knows."""
        return (self.hidden_act, self.qk_norm, self.sandwich_norms, self.norm_offset, self.embed_scale) == (
            "silu",
            False,
            False,
            0.0,
            1.0,
        ) and self.query_scale in (0.0, self.head_dim**-0.5)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (GQA); 1 is multi-head attention."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, document: object, source: str = "config.json") -> ModelConfig:
        """The config of a `config.json` document; a LoadError naming `source` and the field for any value
        of the wrong type or outside what a model can have."""
        raw = fields.obj(document, source)
        architecture = _architecture(raw, source)
        hidden, heads = fields.integer(raw, "hidden_size", source), fields.integer(raw, "num_attention_heads", source)
        kv_heads = fields.integer(raw, "num_key_value_heads", source, default=heads)
        if heads % kv_heads:
            raise LoadError(
                f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        layers = fields.integer(raw, "num_hidden_layers", source, maximum=MAX_LAYERS)
        gemma = architecture == "Gemma3ForCausalLM"
        act_key = "hidden_activation" if gemma and "hidden_activation" in raw else "hidden_act"
        act = fields.string(raw, act_key, source, default="gelu_pytorch_tanh" if gemma else "silu")
        if act not in ACTIVATIONS:
            raise LoadError(f"{source}: {act_key} {act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if raw.get(key) is not None:
                raise LoadError(f"{source}: {key} {raw[key]!r} is not supported (only null, as in Gemma 3)")
        if fields.boolean(raw, "use_bidirectional_attention", source):
            raise LoadError(f"{source}: use_bidirectional_attention is not supported (a decoder attends causally)")

        theta, scaling, local_theta = _rope(raw, source)
        attention_bias = fields.boolean(raw, "attention_bias", source)
        head_dim = fields.integer(raw, "head_dim", source, default=hidden // heads)
        windows = _sliding_windows(raw, architecture, layers, source)
        vocab = fields.integer(raw, "vocab_size", source)
        bos = fields.token_ids(raw, "bos_token_id", source, vocab)
        if len(bos) > 1:
            raise fields.fail(source, "bos_token_id", "one token id", raw["bos_token_id"])
        return cls(
            architecture=architecture,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=fields.integer(raw, "intermediate_size", source),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=fields.number(raw, "rms_norm_eps", source, default=1e-6, below=1.0),
            max_position_embeddings=fields.integer(raw, "max_position_embeddings", source, default=2048),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=fields.boolean(raw, "tie_word_embeddings", source),
            qkv_bias=architecture == "Qwen2ForCausalLM" or attention_bias,
            o_bias=architecture in ("LlamaForCausalLM", "Gemma3ForCausalLM") and attention_bias,
            mlp_bias=fields.boolean(raw, "mlp_bias", source),
            sliding_windows=windows,
            bos_token_id=bos[0] if bos else None,
            eos_token_ids=fields.token_ids(raw, "eos_token_id", source, vocab),
            hidden_act=act,
            qk_norm=architecture in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"),
            sandwich_norms=gemma,
            norm_offset=1.0 if gemma else 0.0,
            embed_scale=float(np.float32(hidden**0.5)) if gemma else 1.0,
            query_scale=fields.number(raw, "query_pre_attn_scalar", source, default=head_dim) ** -0.5 if gemma else 0.0,
            local_rope_theta=local_theta if gemma else None,
            fused_projections=architecture == "Phi3ForCausalLM",
        )


def _architecture(raw: dict, source: str) -> str:
    names = fields.strings(raw, "architectures", source)
    model_type = raw.get("model_type")
    if not names and isinstance(model_type, str) and model_type in _MODEL_TYPES:
        names = [_MODEL_TYPES[model_type]]
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    found = ", ".join(names) or f"model_type {model_type!r}"
    raise LoadError(f"{source}: unsupported architecture {found}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def _rope(raw: dict, source: str) -> tuple[float, dict | None, float]:
    """(theta, scaling, theta of sliding-window layers) from either `rope_parameters` (transformers 5;
    Gemma 3 keeps one per layer type) or `rope_theta` + `rope_scaling` (+ Gemma 3's rope_local_base_freq)."""
    params = dict(fields.obj(raw.get("rope_parameters") or {}, source, "'rope_parameters'"))
    local_theta = fields.number(raw, "rope_local_base_freq", source, default=10000.0)
    if "full_attention" in params or "sliding_attention" in params:
        local = fields.obj(params.get("sliding_attention") or {}, source, "'rope_parameters.sliding_attention'")
        if local.get("rope_type", "default") != "default":
            raise LoadError(f"{source}: RoPE scaling of sliding-window layers is not supported")
        local_theta = fields.number(local, "rope_theta", source, default=local_theta)
        params = dict(fields.obj(params.get("full_attention") or {}, source, "'rope_parameters.full_attention'"))
    for where in (raw, params):
        if fields.number(where, "partial_rotary_factor", source, default=1.0) != 1.0:
            raise LoadError(f"{source}: partial_rotary_factor {where['partial_rotary_factor']} is not supported")
    scaling = dict(fields.obj(raw.get("rope_scaling") or {}, source, "'rope_scaling'"))
    merged = {**raw, **params}
    theta = fields.number(merged, "rope_theta", source, default=10000.0)
    merged = {**scaling, **params}
    merged.pop("rope_theta", None)
    merged.pop("partial_rotary_factor", None)
    rope_type = merged.pop("rope_type", merged.pop("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise LoadError(
            f"{source}: RoPE type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None, local_theta
    required = {
        "linear": ("factor",),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    }
    missing = [k for k in required[rope_type] if k not in merged]
    if missing:
        raise LoadError(f"{source}: RoPE type {rope_type!r} needs {', '.join(missing)}")
    values = {k: fields.number(merged, k, source) for k in required[rope_type]}
    if rope_type == "llama3" and values["low_freq_factor"] >= values["high_freq_factor"]:
        raise LoadError(
            f"{source}: RoPE low_freq_factor {values['low_freq_factor']} must be below high_freq_factor "
            f"{values['high_freq_factor']}"
        )
    return theta, {"rope_type": rope_type, **values}, local_theta


def _sliding_windows(raw: dict, architecture: str, layers: int, source: str) -> tuple[int | None, ...]:
    if raw.get("sliding_window") is None or architecture == "LlamaForCausalLM":
        return (None,) * layers
    window = fields.integer(raw, "sliding_window", source)
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and not fields.boolean(
        raw, "use_sliding_window", source
    ):
        return (None,) * layers
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        layer_types = fields.strings(raw, "layer_types", source)
        if len(layer_types) != layers:
            raise LoadError(f"{source}: layer_types has {len(layer_types)} entries for {layers} layers")
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    if architecture == "Gemma3ForCausalLM":  # every sixth layer attends globally
        pattern = fields.integer(raw, "sliding_window_pattern", source, default=6)
        return tuple(window if (i + 1) % pattern else None for i in range(layers))
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        first = fields.integer(raw, "max_window_layers", source, default=layers, minimum=0)
        return tuple(window if i >= first else None for i in range(layers))
    return (window,) * layers
