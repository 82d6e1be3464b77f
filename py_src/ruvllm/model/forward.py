"""The transformer forward: plain functions over config, weights, explicit positions and a cache.

Every family shares this code: pre-norm decoder blocks with RMSNorm, rotary grouped-query attention
(Qwen2 adds q/k/v biases, Mistral a sliding window, Qwen3 and Gemma 3 a norm of each query and key
head) and a gated MLP (SwiGLU; GeGLU in Gemma 3, which also normalizes each sublayer's output before
its residual add). The switches are config fields (config.py). Everything is float32.

Dimension letters: N rows of a batch (the new tokens of every sequence in it), T one sequence's new
tokens, S cached positions (S >= T), D hidden size, H query heads, K key/value heads, G = H/K query
heads per key/value head, E head size, F MLP size, V vocab.

Given a `Tape`, the forward also keeps what the backward pass (learning/backprop.py) needs, so
gradients are always those of this one forward.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from .config import ModelConfig
from .kv import Cache, DenseSegment, LayerKV
from .rope import apply_rope, rope_tables_at
from .transformer import Transformer
from .weights import MLP, Attention, DecoderLayer, Weights, linear


@dataclass
class LayerTape:
    """What one decoder layer computed, kept for the backward pass."""

    x: np.ndarray | None = None  # (T, D) layer input
    a: np.ndarray | None = None  # (T, D) after the input norm
    q_heads: np.ndarray | None = None  # (H, T, E) queries before their norm (config.qk_norm only)
    k_heads: np.ndarray | None = None  # (K, T, E) keys before their norm (config.qk_norm only)
    q: np.ndarray | None = None  # (K, G*T, E) rotated queries
    k: np.ndarray | None = None  # (K, S, E) rotated keys attended to
    v: np.ndarray | None = None  # (K, S, E) values attended to
    probs: np.ndarray | None = None  # (K, G*T, S)
    o: np.ndarray | None = None  # (T, H*E) attention output before o_proj
    attended: np.ndarray | None = None  # (T, D) o_proj's output (config.sandwich_norms only)
    h: np.ndarray | None = None  # (T, D) after the attention residual
    b: np.ndarray | None = None  # (T, D) the MLP's input, after its norm
    gate: np.ndarray | None = None  # (T, F)
    up: np.ndarray | None = None  # (T, F)
    act: np.ndarray | None = None  # (T, F) act(gate)
    s: np.ndarray | None = None  # (T, F) act(gate) * up
    m: np.ndarray | None = None  # (T, D) down_proj's output (config.sandwich_norms only)


@dataclass
class Tape:
    """What a forward computed, layer by layer."""

    layers: list[LayerTape] = field(default_factory=list)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    # np.mean's bits (the same float32 sum, divided by the count) without its layers of Python code,
    # which cost tens of µs a call in Pyodide after a product has left the caches cold
    variance = np.add.reduce(x * x, axis=-1, keepdims=True) / np.float32(x.shape[-1])  # (T, 1)
    return x / np.sqrt(variance + np.float32(eps)) * weight  # (T, D)


def silu(x: np.ndarray) -> np.ndarray:
    # x * sigmoid(x), with sigmoid via tanh so that no exp() overflows for large |x|.
    return x * (np.float32(0.5) + np.float32(0.5) * np.tanh(np.float32(0.5) * x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's gelu(approximate="tanh"), Gemma's hidden_activation)."""
    inner = np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))


ACTIVATIONS = {"silu": silu, "gelu_pytorch_tanh": gelu_tanh}


def softmax(x: np.ndarray, in_place: bool = False) -> np.ndarray:
    """Softmax over the last axis; `in_place` overwrites x (the same values, without three temporaries
    the size of x: attention's scores grow with the square of a prompt's length)."""
    if not in_place:
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


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


@dataclass
class Sequence:
    """One sequence's share of a batched forward: its new tokens are rows `rows` of the batch's (N, D)
    activations, at absolute `positions` (T,), attending over its own `cache`."""

    rows: slice
    positions: np.ndarray  # (T,)
    cache: Cache  # cache.KVCache or paged.PagedSequence
    masks: Masks


def attention(
    x: np.ndarray,
    w: Attention,
    config: ModelConfig,
    rope: tuple[np.ndarray, np.ndarray],
    batch: list[Sequence],
    layer: int,
    window: int | None,
    tape: LayerTape | None = None,
) -> np.ndarray:
    """x (N, D): the new rows of every sequence in `batch`. The projections run once for all rows (one
    matrix product each); each sequence attends over its own cache, those whose cache has the
    `batched_decode` capability (a paged pool's) and read one token each all at once (`decode_attention`)."""
    N = x.shape[0]
    H, K, E = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = linear(x, w.q_proj).reshape(N, H, E).transpose(1, 0, 2)  # (H, N, E)
    k = linear(x, w.k_proj).reshape(N, K, E).transpose(1, 0, 2)  # (K, N, E)
    v = linear(x, w.v_proj).reshape(N, K, E).transpose(1, 0, 2)  # (K, N, E)
    if w.q_norm is not None:  # config.qk_norm: each head normalized over E
        assert w.k_norm is not None  # (qk_norm: both)
        if tape is not None:
            tape.q_heads, tape.k_heads = q, k
        q, k = rms_norm(q, w.q_norm, config.rms_norm_eps), rms_norm(k, w.k_norm, config.rms_norm_eps)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if len(batch) == 1:
        s = batch[0]
        out = attend(q, k, v, config, s.positions, s.cache.layers[layer], window, s.masks, tape)  # (N, H*E)
        return linear(out, w.o_proj)  # (N, D)
    out = np.empty((N, H * E), np.float32)  # (N, H*E)
    decoding = [s for s in batch if len(s.positions) == 1 and s.cache.batched_decode]
    if len(decoding) > 1:  # sequences of one pool reading one token each: one batched product for all of them
        rows = np.array([s.rows.start for s in decoding])  # (B,)
        caches = [s.cache for s in decoding]
        out[rows] = caches[0].decode_attention(q[:, rows], k[:, rows], v[:, rows], caches, layer, window)
    batched = {id(s) for s in decoding} if len(decoding) > 1 else set()
    for s in batch:
        if id(s) not in batched:
            layer_cache = s.cache.layers[layer]
            out[s.rows] = attend(
                q[:, s.rows], k[:, s.rows], v[:, s.rows], config, s.positions, layer_cache, window, s.masks
            )
    return linear(out, w.o_proj)  # (N, D)


def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    config: ModelConfig,
    positions: np.ndarray,
    cache: LayerKV,
    window: int | None,
    masks: Masks,
    tape: LayerTape | None = None,
) -> np.ndarray:
    """One sequence's attention: q (H, T, E), k and v (K, T, E) of its new tokens, stored in `cache`,
    then every query attends over the keys it may see. Returns (T, H*E)."""
    H, T, E = q.shape
    K, G = config.num_key_value_heads, config.group_size
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
    probs = softmax(scores, in_place=True).reshape(K, G * T, S)  # (K, G*T, S)
    if len(segments) == 1:
        out = segments[0].mix(probs)  # (K, G*T, E)
    else:
        bounds = np.cumsum([len(s.positions) for s in segments])[:-1]
        parts = np.split(probs, bounds, axis=-1)
        out = sum(s.mix(p) for s, p in zip(segments, parts, strict=True))  # type: ignore[assignment]  # (arrays)
    out = out.reshape(H, T, E).transpose(1, 0, 2).reshape(T, H * E)  # (T, H*E)
    if tape is not None:
        assert len(segments) == 1 and isinstance(segments[0], DenseSegment), "the backward reads one float32 segment"
        tape.q, tape.k, tape.v, tape.probs, tape.o = q, segments[0].keys, segments[0].values, probs, out
    return out


def mlp(x: np.ndarray, w: MLP, config: ModelConfig, tape: LayerTape | None = None) -> np.ndarray:
    gate, up = linear(x, w.gate_proj), linear(x, w.up_proj)  # (T, F) each
    act = ACTIVATIONS[config.hidden_act](gate)  # (T, F)
    s = act * up  # (T, F)
    if tape is not None:
        tape.gate, tape.up, tape.act, tape.s = gate, up, act, s
    return linear(s, w.down_proj)  # (T, D)


def block(
    x: np.ndarray,
    w: DecoderLayer,
    config: ModelConfig,
    rope: tuple[np.ndarray, np.ndarray],
    batch: list[Sequence],
    layer: int,
    window: int | None,
    tape: LayerTape | None = None,
) -> np.ndarray:
    """Decoder layer `layer` over the rows of every sequence in `batch`: x (N, D) -> (N, D)."""
    eps = config.rms_norm_eps
    a = rms_norm(x, w.input_layernorm, eps)  # (N, D)
    attended = attention(a, w.self_attn, config, rope, batch, layer, window, tape)  # (N, D)
    if config.sandwich_norms:  # Gemma 3: each sublayer's output normalized before its residual add
        assert w.pre_feedforward_layernorm is not None and w.post_feedforward_layernorm is not None
        h = x + rms_norm(attended, w.post_attention_layernorm, eps)  # (N, D)
        b = rms_norm(h, w.pre_feedforward_layernorm, eps)  # (N, D)
        m = mlp(b, w.mlp, config, tape)  # (N, D)
        if tape is not None:
            tape.x, tape.a, tape.attended, tape.h, tape.b, tape.m = x, a, attended, h, b, m
        return h + rms_norm(m, w.post_feedforward_layernorm, eps)  # (N, D)
    h = x + attended  # (N, D)
    b = rms_norm(h, w.post_attention_layernorm, eps)  # (N, D)
    if tape is not None:
        tape.x, tape.a, tape.h, tape.b = x, a, h, b
    return h + mlp(b, w.mlp, config, tape)  # (N, D)


def forward(
    model: Transformer,
    tokens: np.ndarray,
    start: int,
    cache: Cache,
    last_only: bool = False,
) -> np.ndarray:
    """Logits for `tokens` placed at positions start, start+1, ...; appends their keys/values to `cache`.

    Returns (T, V), or (1, V) for the last token only when `last_only` (prefill needs no more).
    """
    weights, config = model.weights, model.config
    x = hidden(model, tokens, start, cache)  # (T, D)
    return logits(weights, config, x[-1:] if last_only else x)  # (T, V)


def hidden(
    model: Transformer,
    tokens: np.ndarray,
    start: int,
    cache: Cache,
    tape: Tape | None = None,
) -> np.ndarray:
    """The last decoder layer's output (T, D) for `tokens` at positions start..; fills `tape` if given."""
    return hidden_batch(model, [(tokens, start, cache)], tape)


def hidden_batch(
    model: Transformer,
    entries: Collection[tuple[np.ndarray, int, Cache]],
    tape: Tape | None = None,
) -> np.ndarray:
    """The last decoder layer's output (N, D) for several sequences at once, each entry (tokens (T_i,),
    start, cache) placing its tokens at positions start.. of its own cache; rows in entry order, N = sum
    of T_i. Every projection is one matrix product over all N rows (continuous batching: a decode step
    of B sequences is a (B, D) product, not B vector products). A `tape` needs a single entry."""
    weights, config = model.weights, model.config
    assert tape is None or len(entries) == 1, "the backward pass follows one sequence"
    batch, ids, at = [], [], 0
    for tokens, start, cache in entries:
        tokens = np.asarray(tokens, dtype=np.int64)
        assert start <= len(cache.tokens), f"position {start} would leave a gap after {len(cache.tokens)}"
        if start < len(cache.tokens):
            cache.truncate(start)  # rewinding: what came after `start` is forgotten
        positions = np.arange(start, start + len(tokens))  # (T,)
        batch.append(Sequence(slice(at, at + len(tokens)), positions, cache, Masks(positions)))
        ids.append(tokens)
        at += len(tokens)
    tokens = ids[0] if len(ids) == 1 else np.concatenate(ids)  # (N,)
    x = embed(weights, config, tokens)  # (N, D)
    x = run_layers(model, x, batch, range(config.num_hidden_layers), tape)
    for s, tokens in zip(batch, ids, strict=True):
        s.cache.record(tokens)
        s.cache.keep_within_budget()
    return x


def embed(weights: Weights, config: ModelConfig, tokens: np.ndarray) -> np.ndarray:
    """The input embeddings (N, D) of token ids (N,)."""
    x = weights.embed_tokens.rows(tokens)  # (N, D)
    return x * np.float32(config.embed_scale) if config.embed_scale != 1.0 else x


def run_layers(
    model: Transformer,
    x: np.ndarray,
    batch: list[Sequence],
    layers: range,
    tape: Tape | None = None,
) -> np.ndarray:
    """Decoder layers `layers` (consecutive) over x (N, D), the hidden states entering the first of them
    for the rows of every sequence in `batch`; returns the last one's output (N, D). A cache with a
    `tap` at one of these layers keeps the hidden states entering it."""
    weights, config, inv_freq = model.weights, model.config, model.inv_freq
    positions = batch[0].positions if len(batch) == 1 else np.concatenate([s.positions for s in batch])  # (N,)
    bases = {id(f): f for f in inv_freq}  # layers share their frequency arrays: one table per distinct base
    tables = {key: rope_tables_at(f, positions) for key, f in bases.items()}  # (N, E/2) cos, sin
    for i in layers:
        for s in batch:
            tap = s.cache.tap
            if tap is not None and tap.layer == i:
                tap.write(s.positions, x[s.rows])
        layer_tape = None
        if tape is not None:
            layer_tape = LayerTape()
            tape.layers.append(layer_tape)
        window, frequencies = config.sliding_windows[i], inv_freq[i]
        x = block(x, weights.layers[i], config, tables[id(frequencies)], batch, i, window, layer_tape)  # (N, D)
    return x


def recompute_layers(model: Transformer, cache: Cache, positions: np.ndarray) -> None:
    """The keys and values at consecutive `positions` (T,) of the layers from `cache.tap.layer` up,
    recomputed from the hidden states the tap kept there and appended to those layers (which must
    hold exactly the positions before them: KVCache.forget_layers first). What an adapter on those
    layers changed (after it learned) costs a prefill of those layers only."""
    assert cache.tap is not None, "recompute_layers needs a cache that taps a layer"
    first = cache.tap.layer
    s = Sequence(slice(0, len(positions)), positions, cache, Masks(positions))
    entering = cache.tap.read(int(positions[-1]) + 1)[positions]  # (T, D)
    run_layers(model, entering, [s], range(first, model.config.num_hidden_layers))


def logits(weights: Weights, config: ModelConfig, x: np.ndarray) -> np.ndarray:
    """The output projection of hidden states x (T, D): (T, V)."""
    return linear(rms_norm(x, weights.norm, config.rms_norm_eps), weights.lm_head)  # (T, V)
