"""The decode plan: a model's whole forward (forward.py) as one program of kernel steps, built once at
load and run in one call per forward (kernels.c `run_plan`).

The NumPy forward drives a token one operation at a time: ~200 products, each a call from Python into
the kernels, and everything between them (norms, RoPE, attention, activations, residuals) in NumPy,
which in Pyodide has neither a BLAS nor SIMD. The plan writes every step of a token (the norms, the
q/k/v products sharing one quantized x, Qwen2's biases, Qwen3/Gemma's per-head norms, RoPE, the KV
append, attention over the cache with sliding windows and grouped queries, the o product, residuals,
Gemma's sandwich norms, the gated MLP, the final norm and the logits) as steps over buffers in the
kernels' memory; Python fills the embedding rows and the RoPE angles, calls `run_plan` once, and reads
the logits. The arithmetic is the kernels' fast one (docs/kernels.md): the same products as the fast
path, the steps between them in float32 SIMD, with exp and tanh of their own.

`KernelMemory` is where the plan's buffers live and how the kernels are called: Pyodide's heap itself
(quant/wasm.py `HeapMemory`: a NumPy array's address is its data pointer), or any memory a host gives
NumPy views of. Keys and values are kept in the cache's own float32 tier (cache.HotTier), allocated
by the memory's `empty` (Engine.new_cache), so the plan and the NumPy forward read and write the same
cache and either can continue what the other started.

What the plan does not run goes to the NumPy forward, which stays the reference (`plan_refusal`,
`DecodePlan.refusal`): a matrix form the kernels do not compute, the exact arithmetic, adapters, and
caches with a cold tier. Learning's residual tap (kv.ResidualTap) is written by the plan.

Dimension letters as forward.py: T rows, D hidden, H query heads, K key/value heads, E head size,
F MLP size, V vocab; L layers.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..quant.matrices import DenseMatrix
from ..quant.wasm import TILE_ROWS, kernel_form
from .cache import KVCache
from .forward import embed
from .kv import grow
from .rope import rope_tables_at
from .transformer import Transformer
from .weights import Linear

STEP_WORDS = 16  # kernels.c: each step's words
END, NORM, PRODUCT, BIAS, ROPE, APPEND, ATTEND, ADD, GATED, COPY = range(10)  # kernels.c's PLAN_*
FORMS = {"dense": 0, "q8": 1, "q8h": 2, "q4": 3}  # kernels.c's FORM_*
QUANTIZE, TAIL = 1, 2  # a product's flags: quantize x first; the logits (the tail rows)
ACTIVATION_KINDS = {"silu": 0, "gelu_pytorch_tanh": 1}
FAST_ROWS = 4  # kernels.c GROUPED_MAX_ROWS: up to this many rows take the fast arithmetic
STATE_WORDS = 8  # kernels.c run_plan's state: T, pos0, count, first, last, logits, tap, tapped


class KernelMemory(Protocol):
    """Where the kernels read and write, as NumPy sees it."""

    exports: Any  # the kernels' exported functions (kernels.c), called with addresses and sizes

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        """A new array in the kernels' memory."""
        ...

    def address(self, a: np.ndarray) -> int:
        """The kernels' address of an array in their memory."""
        ...

    def place(self, a: np.ndarray) -> np.ndarray:
        """`a` itself where it is in the kernels' memory (and C-contiguous), else a copy there: what the
        plan's steps read weights from (the plan keeps it)."""
        ...


def f32_bits(value: float) -> int:
    """A float32's bits as the int32 word a step carries."""
    return int(np.array([value], np.float32).view(np.int32)[0])


def quantized_x_bytes(rows: int, K: int) -> int:
    """kernels.c QUANTIZED_X_BYTES: quantize_x's outputs for `rows` rows of K values."""
    return rows * (4 * K + 12 * (K // 32))


def plan_refusal(model: Transformer, arithmetic: str) -> str | None:
    """Why the plan cannot run this model with this arithmetic, or None when it can."""
    config = model.config
    if arithmetic != "fast":
        return "the exact arithmetic keeps the NumPy forward's order of operations (the plan computes fast)"
    if config.hidden_act not in ACTIVATION_KINDS:
        return f"the activation {config.hidden_act!r} has no kernel step"
    if config.head_dim % 2:
        return f"head size {config.head_dim} is odd (RoPE rotates halves)"
    for name, linear in _linears(model):
        if kernel_form(linear.matrix) is None:
            return f"{name} is kept in a form the kernels do not compute ({type(linear.matrix).__name__})"
        if not isinstance(linear.matrix, DenseMatrix) and linear.matrix.shape[1] % 32:
            return f"{name}'s input size {linear.matrix.shape[1]} is not a multiple of 32"
    return None


def _linears(model: Transformer):
    for i, layer in enumerate(model.weights.layers):
        for name, linear in (*layer.self_attn.projections().items(), *layer.mlp.projections().items()):
            yield f"layer {i}'s {name}", linear
    yield "lm_head", model.weights.lm_head


class DecodePlan:
    """One model's forward as a kernels.c program over buffers in `memory`, for up to `rows` new rows a
    call (longer inputs go in chunks of that many)."""

    def __init__(self, model: Transformer, memory: KernelMemory, rows: int, context: int) -> None:
        self.model, self.memory, self.rows = model, memory, rows
        c = model.config
        D, H, K, E, F, V = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size, c.vocab_size
        self.width = (H + 2 * K) * E  # a row of q, k and v
        empty = memory.empty
        self.x = empty((rows, D))  # the residual stream
        self.a = empty((rows, D))  # a norm's output, a sublayer's input
        self.qkv = empty((rows, self.width))
        self.att = empty((rows, H * E))
        self.o = empty((rows, D))  # a sublayer's output
        self.gu = empty((rows, 2 * F))  # gate then up
        self.s = empty((rows, F))
        self.logits = empty((1, V))
        widest = max(D, F, H * E)
        self.xq = empty(quantized_x_bytes(FAST_ROWS, widest), np.uint8)
        self.scratch = empty(TILE_ROWS * widest)
        self.scores = empty(max(context, 16))
        self.table = empty((c.num_hidden_layers, 3), np.int32)  # each layer's keys, values, capacity
        self.state = empty(STATE_WORDS, np.int32)
        self.bases = {id(f): f for f in model.inv_freq}  # one pair of tables per distinct RoPE base
        self.rope = {key: (empty((rows, E // 2)), empty((rows, E // 2))) for key in self.bases}
        self.held: list[tuple[np.ndarray, np.ndarray] | None] = [None] * c.num_hidden_layers
        self.placed: list[np.ndarray] = []  # the weights' arrays the steps read
        steps = self._steps()
        self.program = empty((len(steps) + 1, STEP_WORDS), np.int32)
        self.program[:] = 0
        for i, step in enumerate(steps):
            self.program[i, : len(step)] = step
        self.run = memory.exports.run_plan
        self.at_program, self.at_state = memory.address(self.program), memory.address(self.state)

    # ---- building ----

    def _steps(self) -> list[list[int]]:
        c, w, at = self.model.config, self.model.weights, self.memory.address

        def place(a: np.ndarray, dtype: Any = None) -> int:
            kept = self.memory.place(np.asarray(a, dtype))
            self.placed.append(kept)
            return at(kept)

        D, H, K, E, F = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
        eps = f32_bits(c.rms_norm_eps)
        x, a, qkv, att, o, gu, s = (at(b) for b in (self.x, self.a, self.qkv, self.att, self.o, self.gu, self.s))
        width = self.width

        def norm(src: int, weight: np.ndarray, dst: int, heads: int = 1, size: int = D, ld: int = D, tail: int = 0):
            return [NORM, src, place(weight, np.float32), dst, heads, size, ld, ld, eps, tail]

        def product(linear: Linear, src: int, dst: int, ldy: int, flags: int) -> list[list[int]]:
            form, codes = kernel_form(linear.matrix)  # type: ignore[misc]  # (plan_refusal checked every one)
            m = linear.matrix
            N, Kin = m.shape  # type: ignore[union-attr]
            if form == "dense":
                parts = [place(codes, np.float32), 0, 0, 0]
            else:
                mins = getattr(m, "mins", None)
                parts = [
                    place(codes),
                    place(m.scales, np.float32),  # type: ignore[union-attr]
                    0 if mins is None else place(mins, np.float32),
                    int(m.offset),  # type: ignore[union-attr]
                ]
            step = [PRODUCT, FORMS[form], *parts, N, Kin, src, dst, ldy, at(self.xq), flags, at(self.scratch)]
            steps = [step]
            if linear.bias is not None:
                steps.append([BIAS, dst, place(linear.bias, np.float32), N, ldy])
            return steps

        steps: list[list[int]] = []
        for i, layer in enumerate(w.layers):
            attn, mlp = layer.self_attn, layer.mlp
            cos, sin = (at(t) for t in self.rope[id(self.model.inv_freq[i])])
            entry = at(self.table) + 12 * i
            steps.append([COPY, i, x, D])  # (learning's residual tap, when it is at this layer)
            steps.append(norm(x, layer.input_layernorm, a))
            steps += product(attn.q_proj, a, qkv, width, QUANTIZE)
            steps += product(attn.k_proj, a, qkv + 4 * H * E, width, 0)
            steps += product(attn.v_proj, a, qkv + 4 * (H + K) * E, width, 0)
            if attn.q_norm is not None and attn.k_norm is not None:
                steps.append(norm(qkv, attn.q_norm, qkv, H, E, width))
                steps.append(norm(qkv + 4 * H * E, attn.k_norm, qkv + 4 * H * E, K, E, width))
            steps.append([ROPE, qkv, cos, sin, H, E, width])
            steps.append([ROPE, qkv + 4 * H * E, cos, sin, K, E, width])
            steps.append([APPEND, qkv + 4 * H * E, width, entry, K, E, 0])
            steps.append([APPEND, qkv + 4 * (H + K) * E, width, entry, K, E, 1])
            window = c.sliding_windows[i] or 0
            steps.append([ATTEND, qkv, width, entry, att, H * E, H, K, E, window, f32_bits(c.attention_scale), at(self.scores)])
            steps += product(attn.o_proj, att, o, D, QUANTIZE)
            if c.sandwich_norms:
                assert layer.pre_feedforward_layernorm is not None and layer.post_feedforward_layernorm is not None
                steps.append(norm(o, layer.post_attention_layernorm, o))
                steps.append([ADD, x, o, D])
                steps.append(norm(x, layer.pre_feedforward_layernorm, a))
            else:
                steps.append([ADD, x, o, D])
                steps.append(norm(x, layer.post_attention_layernorm, a))
            steps += product(mlp.gate_proj, a, gu, 2 * F, QUANTIZE)
            steps += product(mlp.up_proj, a, gu + 4 * F, 2 * F, 0)
            steps.append([GATED, ACTIVATION_KINDS[c.hidden_act], gu, s, F])
            steps += product(mlp.down_proj, s, o, D, QUANTIZE)
            if c.sandwich_norms:
                steps.append(norm(o, layer.post_feedforward_layernorm, o))  # type: ignore[arg-type]
            steps.append([ADD, x, o, D])
        steps.append(norm(x, w.norm, a, tail=1))
        steps += product(w.lm_head, a, at(self.logits), c.vocab_size, QUANTIZE | TAIL)
        return steps

    # ---- running ----

    def refusal(self, cache: object) -> str | None:
        """Why this cache cannot go through the plan (the NumPy forward takes it), or None."""
        if not isinstance(cache, KVCache):
            return f"a {type(cache).__name__} (the plan reads a KVCache's float32 tier)"
        if cache.options.hot_tokens is not None:
            return "a cache with a cold tier"
        return None

    def forward(self, tokens: np.ndarray, start: int, cache: KVCache, last_only: bool = False) -> np.ndarray:
        """forward.forward's logits for `tokens` at positions start.. of `cache`: (T, V), or (1, V) for the
        last token only."""
        if start < len(cache.tokens):
            cache.truncate(start)  # rewinding: what came after `start` is forgotten
        T, out = len(tokens), []
        for at in range(0, T, self.rows):
            chunk = tokens[at : at + self.rows]
            n = len(chunk)
            wanted = not last_only or at + n == T
            direct = wanted and (last_only or n == 1)  # the plan's own logits product serves one row
            self._run(chunk, start + at, cache, last=last_only, logits=direct)
            if direct:
                out.append(self.logits.copy())
            elif wanted:
                out.append(self.model.weights.lm_head(self.a[:n]))
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _run(self, tokens: np.ndarray, start: int, cache: KVCache, last: bool, logits: bool) -> None:
        T = len(tokens)
        cache.reserve(T)
        layers = cache.layers
        for i, layer in enumerate(layers):
            hot = layer.hot
            held = self.held[i]
            if held is None or held[0] is not hot.k or held[1] is not hot.v:
                self.table[i] = (self.memory.address(hot.k), self.memory.address(hot.v), hot.k.shape[1])
                self.held[i] = (hot.k, hot.v)
        self.x[:T] = embed(self.model.weights, self.model.config, tokens)
        positions = np.arange(start, start + T)
        for key, frequencies in self.bases.items():
            cos, sin = rope_tables_at(frequencies, positions)
            self.rope[key][0][:T], self.rope[key][1][:T] = cos, sin
        length = layers[0].hot.length
        assert length == start, f"the cache holds {length} positions, the plan writes at {start}"
        tap, tapped = cache.tap, 0
        if tap is not None:  # ResidualTap.write's bookkeeping; the plan copies the rows
            tap.values = grow(tap.values, start + T, tap.max_positions, 0, tap.empty)
            tap.length = max(tap.length, start + T)
            tapped = self.memory.address(tap.values) + 4 * start * tap.values.shape[1]
        self.state[:] = (T, start, length + T, 0, int(last), int(logits), -1 if tap is None else tap.layer, tapped)
        self.run(self.at_program, self.at_state)
        for layer in layers:
            hot = layer.hot
            hot.positions[length : length + T] = positions
            hot.length = length + T
        cache.record(tokens)
        cache.keep_within_budget()
