"""The blueprint of a model: a frozen dataclass built from a Hugging Face `config.json`.

Unknown keys are ignored; what the forward needs but the file leaves implicit (head size, per-layer
sliding windows, the RoPE variant) is derived once, in `from_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import LoadError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


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

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (GQA); 1 is multi-head attention."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> ModelConfig:
        if not isinstance(raw, dict):
            raise LoadError(f"{source}: expected a JSON object")
        architecture = _architecture(raw, source)

        def need(key: str) -> int:
            value = raw.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise LoadError(f"{source}: {key!r} must be a positive integer, found {value!r}")
            return value

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise LoadError(
                f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        head_dim = raw.get("head_dim") or hidden // heads
        layers = need("num_hidden_layers")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise LoadError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
        if raw.get("partial_rotary_factor", 1.0) != 1.0:
            raise LoadError(f"{source}: partial_rotary_factor {raw['partial_rotary_factor']} is not supported")

        theta, scaling = _rope(raw, source)
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            architecture=architecture,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=architecture == "Qwen2ForCausalLM" or attention_bias,
            o_bias=architecture == "LlamaForCausalLM" and attention_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_windows=_sliding_windows(raw, architecture, layers, source),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_ids(raw.get("eos_token_id")),
        )


def _architecture(raw: dict, source: str) -> str:
    names = raw.get("architectures") or []
    if not names and raw.get("model_type") in _MODEL_TYPES:
        names = [_MODEL_TYPES[raw["model_type"]]]
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    found = ", ".join(map(str, names)) or f"model_type {raw.get('model_type')!r}"
    raise LoadError(f"{source}: unsupported architecture {found}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def _rope(raw: dict, source: str) -> tuple[float, dict | None]:
    """(theta, scaling) from either `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    merged = {**scaling, **params}
    rope_type = merged.pop("rope_type", merged.pop("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise LoadError(
            f"{source}: RoPE type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    required = {
        "linear": ("factor",),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    }
    missing = [k for k in required[rope_type] if k not in merged]
    if missing:
        raise LoadError(f"{source}: RoPE type {rope_type!r} needs {', '.join(missing)}")
    return theta, {"rope_type": rope_type, **{k: float(merged[k]) for k in required[rope_type]}}


def _sliding_windows(raw: dict, architecture: str, layers: int, source: str) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    if architecture == "LlamaForCausalLM" or window is None:
        return (None,) * layers
    if architecture == "Qwen2ForCausalLM" and not raw.get("use_sliding_window", False):
        return (None,) * layers
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        if len(layer_types) != layers:
            raise LoadError(f"{source}: layer_types has {len(layer_types)} entries for {layers} layers")
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    if architecture == "Qwen2ForCausalLM":
        first = int(raw.get("max_window_layers", layers))
        return tuple(window if i >= first else None for i in range(layers))
    return (int(window),) * layers


def _ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
