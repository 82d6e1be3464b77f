"""The transformer forward: plain functions over config, weights, explicit positions and a cache.

Every family shares this code: pre-norm decoder blocks with RMSNorm, rotary grouped-query attention
(Qwen2 adds q/k/v biases, Mistral a sliding window, Qwen3 and Gemma 3 a norm of each query and key
head) and a gated MLP (SwiGLU; GeGLU in Gemma 3, which also normalizes each sublayer's output before
its residual add). The switches are config fields (config.py). Everything is float32.

Dimension letters: T new tokens, S cached positions (S >= T), D hidden size, H query heads,
K key/value heads, G = H/K query heads per key/value head, E head size, F MLP size, V vocab.

Given a `Tape`, the forward also keeps what the backward pass (learning/backprop.py) needs, so
gradients are always those of this one forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cache import KVCache, LayerCache
from .config import ModelConfig
from .rope import apply_rope, rope_tables
from .weights import MLP, Attention, DecoderLayer, Weights, linear


@dataclass
class LayerTape:
    """What one decoder layer computed, kept for the backward pass."""

    x: np.ndarray | None = None  # (T, D) layer input
    a: np.ndarray | None = None  # (T, D) after the input norm
    q: np.ndarray | None = None  # (K, G*T, E) rotated queries
    k: np.ndarray | None = None  # (K, S, E) rotated keys attended to
    v: np.ndarray | None = None  # (K, S, E) values attended to
    probs: np.ndarray | None = None  # (K, G*T, S)
    o: np.ndarray | None = None  # (T, H*E) attention output before o_proj
    h: np.ndarray | None = None  # (T, D) after the attention residual
    b: np.ndarray | None = None  # (T, D) after the post-attention norm
    gate: np.ndarray | None = None  # (T, F)
    up: np.ndarray | None = None  # (T, F)
    s: np.ndarray | None = None  # (T, F) silu(gate) * up


@dataclass
class Tape:
    """What a forward computed, layer by layer."""

    layers: list[LayerTape] = field(default_factory=list)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True)  # (T, 1)
    return x / np.sqrt(variance + np.float32(eps)) * weight  # (T, D)


def silu(x: np.ndarray) -> np.ndarray:
    # x * sigmoid(x), with sigmoid via tanh so that no exp() overflows for large |x|.
    return x * (np.float32(0.5) + np.float32(0.5) * np.tanh(np.float32(0.5) * x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's gelu(approximate="tanh"), Gemma's hidden_activation)."""
    inner = np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))


ACTIVATIONS = {"silu": silu, "gelu_pytorch_tanh": gelu_tanh}


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Masks:
    """The additive attention masks of one forward call, one per window size. Every layer attends over
    the same positions (the cache's tiers move in step across layers), so the first layer that needs a
    mask makes it and the others reuse it."""

    def __init__(self, queries: np.ndarray) -> None:
        self.queries = queries  # (T,) positions of the new tokens
        self.made: dict[int | None, np.ndarray | None] = {}

    def get(self, keys: np.ndarray, window: int | None) -> np.ndarray | None:
        if window not in self.made:
            self.made[window] = attention_mask(self.queries, keys, window)
        mask = self.made[window]
        assert mask is None or mask.shape[1] == len(keys), "layers attend over different positions"
        return mask


def attention_mask(queries: np.ndarray, keys: np.ndarray, window: int | None) -> np.ndarray | None:
    """Additive mask (T, S) from absolute positions: a query at p sees a key at j iff j <= p and, with a
    window, p - j < window. None when nothing is masked (a single new token, no window in reach)."""
    if len(queries) == 1 and (window is None or queries[0] - keys[0] < window):
        return None
    allowed = keys[None, :] <= queries[:, None]  # (T, S)
    if window is not None:
        allowed &= queries[:, None] - keys[None, :] < window
    return np.where(allowed, np.float32(0), np.float32(-np.inf))  # (T, S)


def attention(
    x: np.ndarray,
    w: Attention,
    config: ModelConfig,
    rope: tuple[np.ndarray, np.ndarray],
    positions: np.ndarray,
    cache: LayerCache,
    window: int | None,
    masks: Masks,
    tape: LayerTape | None = None,
) -> np.ndarray:
    T = x.shape[0]
    H, K, G, E = config.num_attention_heads, config.num_key_value_heads, config.group_size, config.head_dim
    q = linear(x, w.q_proj).reshape(T, H, E).transpose(1, 0, 2)  # (H, T, E)
    k = linear(x, w.k_proj).reshape(T, K, E).transpose(1, 0, 2)  # (K, T, E)
    v = linear(x, w.v_proj).reshape(T, K, E).transpose(1, 0, 2)  # (K, T, E)
    if w.q_norm is not None:  # config.qk_norm: each head normalized over E
        q, k = rms_norm(q, w.q_norm, config.rms_norm_eps), rms_norm(k, w.k_norm, config.rms_norm_eps)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    segments = cache.update_and_fetch(k, v, positions)  # cold (quantized) then hot, in position order

    q = q.reshape(K, G * T, E)  # (K, G*T, E): the G heads sharing one key/value head, stacked
    parts = [segment.scores(q) for segment in segments]  # (K, G*T, S_i) each
    scores = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)  # (K, G*T, S)
    S = scores.shape[-1]
    scores = scores.reshape(K, G, T, S)
    scores *= np.float32(config.attention_scale)
    key_positions = segments[0].positions if len(segments) == 1 else np.concatenate([s.positions for s in segments])
    mask = masks.get(key_positions, window)
    if mask is not None:
        scores += mask
    probs = softmax(scores).reshape(K, G * T, S)  # (K, G*T, S)
    if len(segments) == 1:
        out = segments[0].mix(probs)  # (K, G*T, E)
    else:
        bounds = np.cumsum([len(s.positions) for s in segments])[:-1]
        out = sum(s.mix(p) for s, p in zip(segments, np.split(probs, bounds, axis=-1), strict=True))
    out = out.reshape(H, T, E).transpose(1, 0, 2).reshape(T, H * E)  # (T, H*E)
    if tape is not None:
        assert len(segments) == 1, "the backward pass reads one float32 segment"
        tape.q, tape.k, tape.v, tape.probs, tape.o = q, segments[0].keys, segments[0].values, probs, out
    return linear(out, w.o_proj)  # (T, D)


def mlp(x: np.ndarray, w: MLP, config: ModelConfig, tape: LayerTape | None = None) -> np.ndarray:
    gate, up = linear(x, w.gate_proj), linear(x, w.up_proj)  # (T, F) each
    s = ACTIVATIONS[config.hidden_act](gate) * up  # (T, F)
    if tape is not None:
        tape.gate, tape.up, tape.s = gate, up, s
    return linear(s, w.down_proj)  # (T, D)


def block(
    x: np.ndarray,
    w: DecoderLayer,
    config: ModelConfig,
    rope: tuple[np.ndarray, np.ndarray],
    positions: np.ndarray,
    cache: LayerCache,
    window: int | None,
    masks: Masks,
    tape: LayerTape | None = None,
) -> np.ndarray:
    eps = config.rms_norm_eps
    a = rms_norm(x, w.input_layernorm, eps)  # (T, D)
    attended = attention(a, w.self_attn, config, rope, positions, cache, window, masks, tape)  # (T, D)
    if config.sandwich_norms:  # Gemma 3: each sublayer's output normalized before its residual add
        assert tape is None, "the backward pass knows the Llama block only (config.llama_block)"
        h = x + rms_norm(attended, w.post_attention_layernorm, eps)  # (T, D)
        b = rms_norm(h, w.pre_feedforward_layernorm, eps)  # (T, D)
        return h + rms_norm(mlp(b, w.mlp, config), w.post_feedforward_layernorm, eps)  # (T, D)
    h = x + attended  # (T, D)
    b = rms_norm(h, w.post_attention_layernorm, eps)  # (T, D)
    if tape is not None:
        tape.x, tape.a, tape.h, tape.b = x, a, h, b
    return h + mlp(b, w.mlp, config, tape)  # (T, D)


def forward(
    weights: Weights,
    config: ModelConfig,
    inv_freq: list[np.ndarray],
    tokens: np.ndarray,
    start: int,
    cache: KVCache,
    last_only: bool = False,
) -> np.ndarray:
    """Logits for `tokens` placed at positions start, start+1, ...; appends their keys/values to `cache`.

    Returns (T, V), or (1, V) for the last token only when `last_only` (prefill needs no more).
    """
    x = hidden(weights, config, inv_freq, tokens, start, cache)  # (T, D)
    return logits(weights, config, x[-1:] if last_only else x)  # (T, V)


def hidden(
    weights: Weights,
    config: ModelConfig,
    inv_freq: list[np.ndarray],
    tokens: np.ndarray,
    start: int,
    cache: KVCache,
    tape: Tape | None = None,
) -> np.ndarray:
    """The last decoder layer's output (T, D) for `tokens` at positions start..; fills `tape` if given.
    `inv_freq`: each layer's RoPE frequencies (rope.inverse_frequencies)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    assert start <= len(cache.tokens), f"position {start} would leave a gap after {len(cache.tokens)}"
    if start < len(cache.tokens):
        cache.truncate(start)  # rewinding: what came after `start` is forgotten
    positions = np.arange(start, start + len(tokens))  # (T,)
    x = weights.embed_tokens.rows(tokens)  # (T, D)
    if config.embed_scale != 1.0:
        x = x * np.float32(config.embed_scale)  # (T, D)
    bases = {id(f): f for f in inv_freq}  # layers share their frequency arrays: one table per distinct base
    tables = {key: rope_tables(f, start, len(tokens)) for key, f in bases.items()}  # (T, E/2) cos, sin
    masks = Masks(positions)
    layers = zip(weights.layers, cache.layers, config.sliding_windows, inv_freq, strict=True)
    for layer, layer_cache, window, frequencies in layers:
        layer_tape = None if tape is None else LayerTape()
        if tape is not None:
            tape.layers.append(layer_tape)
        rope = tables[id(frequencies)]
        x = block(x, layer, config, rope, positions, layer_cache, window, masks, layer_tape)  # (T, D)
    cache.record(tokens)
    cache.keep_within_budget()
    return x


def logits(weights: Weights, config: ModelConfig, x: np.ndarray) -> np.ndarray:
    """The output projection of hidden states x (T, D): (T, V)."""
    return linear(rms_norm(x, weights.norm, config.rms_norm_eps), weights.lm_head)  # (T, V)
