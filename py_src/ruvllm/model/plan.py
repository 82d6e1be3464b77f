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
(quant/wasm.py `HeapMemory`: a NumPy array's address is its data pointer), any memory a host gives
NumPy views of, or the kernel thread pool's shared memory (quant/pool.py `PoolMemory`: its buffers are
PoolArrays that Python reads and assigns by copies, and the arrays Python fills or reads each call are
staged: copied in and out by the one call, kernels.c `run_plan_pool`, whose large steps the pool's
threads share). Keys and values are kept in the cache's own tiers (cache.HotTier, ColdTier), allocated
by the memory's `empty` (Engine.new_cache), so the plan and the NumPy forward read and write the same
cache and either can continue what the other started.

The plan runs both tiers of the cache (the cold one's int8/int4 codes too), LoRA adapters with their
gates (a program per weights identity: Engine.forward), and writes learning's residual tap
(kv.ResidualTap). What it does not run goes to the NumPy forward, which stays the reference
(`plan_refusal`, `weights_refusal`, `DecodePlan.refusal`): the exact arithmetic, a matrix form the
kernels do not compute, X-LoRA mixtures (their routing runs its own passes), a cache that is not a
KVCache (the paged cache of batching).

Dimension letters as forward.py: T rows, D hidden, H query heads, K key/value heads, E head size,
F MLP size, V vocab; L layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..quant.matrices import DenseMatrix, Int8Matrix
from ..quant.wasm import GROUPED_MAX_ROWS, TILE_ROWS, kernel_form
from .cache import KVCache, LayerCache
from .forward import embed
from .rope import rope_tables_at
from .transformer import Transformer
from .weights import Linear

STEP_WORDS = 16  # kernels.c: each step's words
END, NORM, PRODUCT, BIAS, ROPE, APPEND, ATTEND, ADD, GATED, COPY, LORA = range(11)  # kernels.c's PLAN_*
FORMS = {"dense": 0, "q8": 1, "q8h": 2, "q4": 3}  # kernels.c's FORM_*
# a product's flags: quantize x first; the logits (the tail rows); scales and mins in float16 (a memory
# whose `half_scales` is true, where they are exactly float16: a GPU's, which reads 20 bytes a group of 32
# q4 weights then, GGUF's q4_1 size, not 24; kernels.c reads float32 and never sees the flag)
QUANTIZE, TAIL, HALF = 1, 2, 4
ACTIVATION_KINDS = {"silu": 0, "gelu_pytorch_tanh": 1}
STATE_WORDS = 8  # kernels.c run_plan's state: T, pos0, last, logits, tap, tapped, scores
ENTRY_WORDS = 16  # kernels.c: a layer's cache as attention reads it (both tiers)
PICK_MAX = 64  # the most logits a memory that picks (a GPU's: `picks`) reads back in place of the row
NONE = 0xFFFFFFFF  # a pick's id where the row has fewer finite logits than were asked for


@dataclass(frozen=True)
class TopLogits:
    """A row's largest logits, best first (equal ones in the order of their ids, the lower first),
    picked where the logits are (a GPU's plan: npm/src/worker/gpu/shaders.js PICK_*), so that only
    they are read back, not the row: runtime/sampling.py's sampler chooses from them what it would from
    the row."""

    ids: np.ndarray  # (k,) int64
    values: np.ndarray  # (k,) float32
    nonfinite: int  # the row's logits that are NaN or infinite (never picked)


class KernelMemory(Protocol):
    """Where the kernels read and write, as NumPy sees it: Pyodide's heap on one thread (quant/wasm.py
    HeapMemory), or the kernel thread pool's shared memory (quant/pool.py PoolMemory), which Python reaches
    by copies."""

    threads: int  # the threads that may run a program's steps at once (each has its own scratch)

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> Any:
        """A new array in the kernels' memory (an ndarray, or a stand-in that copies what is read or
        assigned: pool.PoolArray)."""
        ...

    def staged(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        """A new NumPy array that Python fills before a call or reads after it, which the kernels see at
        `address` (in their memory, or a copy there that `run` refreshes)."""
        ...

    def address(self, a: Any) -> int:
        """The kernels' address of an array from `empty`, `staged` (or a view of one) or `place`."""
        ...

    def place(self, a: Any, dtype: Any = None) -> Any:
        """`a` (as `dtype`) itself where it is in the kernels' memory already (and contiguous), else a
        copy there: what the plan's steps read weights from (the plan keeps it)."""
        ...

    def run(self, program: int, state: np.ndarray, rows: int, inputs: list, outputs: list, pick: int = 0) -> None:
        """kernels.c run_plan(program, state) for `rows` rows, after copying `inputs` into the kernels'
        memory, then `outputs` out of it (where the two differ): (staged array, bytes from its start).
        `pick` k (a memory whose `picks` is true; never asked of others): the logits' k largest go to
        the one output in place of the row, as uint32 words [nonfinite, k ids, k float32 values]."""
        ...


def f32_bits(value: float) -> int:
    """A float32's bits as the int32 word a step carries."""
    return int(np.array([value], np.float32).view(np.int32)[0])


def word(value: int) -> int:
    """An address (or any value below 2^32) as the int32 word a step or table carries: the kernels read
    words as unsigned addresses, and a memory may pass 2 GiB."""
    return value - (1 << 32) if value >= 1 << 31 else value


def quantized_x_bytes(rows: int, K: int) -> int:
    """kernels.c QUANTIZED_X_BYTES: quantize_x's outputs for `rows` rows of K values."""
    return rows * (4 * K + 12 * (K // 32))


def exactly_half(m: Int8Matrix) -> bool:
    """Whether a matrix's scales and mins are all float16 values (GGUF's q4_0, q4_1 and q8_0 store them so;
    the K-quants' products of two scales mostly are not)."""
    parts = [np.asarray(m.scales, np.float32)] + ([] if m.mins is None else [np.asarray(m.mins, np.float32)])
    return all(np.array_equal(p.astype(np.float16).astype(np.float32), p) for p in parts)


def plan_refusal(model: Transformer, arithmetic: str) -> str | None:
    """Why the plan cannot run this model with this arithmetic, or None when it can (the weights as they
    are wrapped now: `weights_refusal`)."""
    config = model.config
    if arithmetic != "fast":
        return "the exact arithmetic keeps the NumPy forward's order of operations (the plan computes fast)"
    if config.hidden_act not in ACTIVATION_KINDS:
        return f"the activation {config.hidden_act!r} has no kernel step"
    if config.head_dim % 2:
        return f"head size {config.head_dim} is odd (RoPE rotates halves)"
    return weights_refusal(model)


def weights_refusal(model: Transformer) -> str | None:
    """Why the plan cannot run the model's weights as they are now (a form the kernels do not compute,
    a wrapper that is not a plain LoRA adapter), or None."""
    for name, linear in _linears(model):
        wrapped = low_rank(linear.matrix)
        base = linear.matrix if wrapped is None else wrapped.base
        if kernel_form(base) is None:
            return f"{name} is kept in a form the kernels do not compute ({type(base).__name__})"
        if not isinstance(base, DenseMatrix) and base.shape[1] % 32:
            return f"{name}'s input size {base.shape[1]} is not a multiple of 32"
    return None


def _linears(model: Transformer):
    for i, layer in enumerate(model.weights.layers):
        for name, linear in (*layer.self_attn.projections().items(), *layer.mlp.projections().items()):
            yield f"layer {i}'s {name}", linear
    yield "lm_head", model.weights.lm_head


class LowRank(Protocol):
    """A LoRA adapter's wrapper of a matrix (learning/lora.py LoRAMatrix): y = base(x) + scale *
    gated(x @ A.T) @ B.T, each gate (start, stop, low, high: lora.Gate) scaling its rows of x @ A.T."""

    base: Any
    A: np.ndarray  # (r, K)
    B: np.ndarray  # (N, r)
    scale: np.float32
    gates: list[Any]


def low_rank(matrix: object) -> LowRank | None:
    """The matrix as a LoRA wrapper, if it is one. Seen by its parts: the model layer does not import
    the learning layer."""
    if all(hasattr(matrix, name) for name in ("base", "A", "B", "scale", "gates")):
        return matrix  # type: ignore[return-value]  # (it has a LowRank's parts)
    return None


class Program:
    """The steps of one set of weights (the base, or the base wrapped with an adapter) as kernels.c
    reads them, in the kernels' memory, with the arrays they read (`placed`)."""

    def __init__(self, plan: DecodePlan) -> None:
        self.plan = plan
        self.placed: list[np.ndarray] = []  # the weights' arrays the steps read, in the kernels' memory
        self.lora: tuple[np.ndarray, np.ndarray] | None = None  # low (rows, r), tmp (rows, N) for adapters
        steps = self._steps()
        words = np.zeros((len(steps) + 1, STEP_WORDS), np.int32)
        for i, step in enumerate(steps):
            words[i, : len(step)] = [word(v) for v in step]
        self.words = plan.memory.place(words)
        self.at = plan.memory.address(self.words)

    def _place(self, a: Any, dtype: Any = None, base: bool = True) -> int:
        """The address of `a` in the kernels' memory: a base weight's copy shared by every program of the
        plan (placed once: a GPU's memory holds each weight once, whichever adapters run), an adapter's
        own to this program."""
        kept = self.plan.shared(a, dtype) if base else self.plan.memory.place(a, dtype)
        self.placed.append(kept)
        return self.plan.memory.address(kept)

    def _steps(self) -> list[list[int]]:
        plan, place = self.plan, self._place
        c, w, at = plan.model.config, plan.model.weights, plan.memory.address
        D, H, K, E, F = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
        eps = f32_bits(c.rms_norm_eps)
        x, a, qkv, att, o, gu, s = (at(b) for b in (plan.x, plan.a, plan.qkv, plan.att, plan.o, plan.gu, plan.s))
        width = plan.width
        adapters = [m for _, linear in _linears(plan.model) if (m := low_rank(linear.matrix)) is not None]
        if adapters:
            r = max(m.A.shape[0] for m in adapters)
            N = max(m.B.shape[0] for m in adapters)
            self.lora = plan.memory.empty((plan.rows, r)), plan.memory.empty((plan.rows, N))

        def norm(src: int, weight: np.ndarray, dst: int, heads: int = 1, size: int = D, ld: int = D, tail: int = 0):
            return [NORM, src, place(weight, np.float32), dst, heads, size, ld, ld, eps, tail]

        def product(linear: Linear, src: int, dst: int, ldy: int, flags: int) -> tuple[list[int], list[list[int]]]:
            """The product step, and the steps after it: its adapter, its bias (after every product
            sharing its x, so those run as one dispatch of the thread pool: each writes its own columns)."""
            wrapped = low_rank(linear.matrix)
            m = linear.matrix if wrapped is None else wrapped.base
            known = kernel_form(m)
            assert known is not None  # (weights_refusal checked every matrix)
            form, codes = known
            if isinstance(m, DenseMatrix):
                parts = [place(codes, np.float32), 0, 0, 0]
            else:
                assert isinstance(m, Int8Matrix)  # (every other form the kernels know)
                small = np.float16 if getattr(plan.memory, "half_scales", False) and exactly_half(m) else np.float32
                flags |= HALF if small is np.float16 else 0
                mins = 0 if m.mins is None else place(m.mins, small)
                parts = [place(codes), place(m.scales, small), mins, int(m.offset)]
            N, Kin = m.shape
            step = [PRODUCT, FORMS[form], *parts, N, Kin, src, dst, ldy, at(plan.xq), flags, at(plan.scratch)]
            step.append(plan.scratch_stride)
            after: list[list[int]] = []
            if wrapped is not None:
                assert self.lora is not None
                gates = np.array(
                    [[g.start, g.stop, f32_bits(g.low), f32_bits(g.high)] for g in wrapped.gates] or [[0] * 4],
                    np.int32,
                )
                low, tmp = (at(b) for b in self.lora)
                A, B = place(wrapped.A, np.float32, False), place(wrapped.B, np.float32, False)
                r = wrapped.A.shape[0]
                scale = f32_bits(float(wrapped.scale))
                gates_at = place(gates, None, False)
                after.append([LORA, src, A, r, Kin, B, N, dst, ldy, scale, low, tmp, gates_at, len(wrapped.gates)])
            if linear.bias is not None:
                after.append([BIAS, dst, place(linear.bias, np.float32), N, ldy])
            return step, after

        def products(*each: tuple[list[int], list[list[int]]]) -> list[list[int]]:
            """Products sharing x, then what comes after each."""
            return [step for step, _ in each] + [later for _, after in each for later in after]

        steps: list[list[int]] = []
        for i, layer in enumerate(w.layers):
            attn, mlp = layer.self_attn, layer.mlp
            cos, sin = (at(t) for t in plan.rope[id(plan.model.inv_freq[i])])
            entry = at(plan.table) + 4 * ENTRY_WORDS * i
            steps.append([COPY, i, x, D])  # (learning's residual tap, when it is at this layer)
            steps.append(norm(x, layer.input_layernorm, a))
            steps += products(
                product(attn.q_proj, a, qkv, width, QUANTIZE),
                product(attn.k_proj, a, qkv + 4 * H * E, width, 0),
                product(attn.v_proj, a, qkv + 4 * (H + K) * E, width, 0),
            )
            if attn.q_norm is not None and attn.k_norm is not None:
                steps.append(norm(qkv, attn.q_norm, qkv, H, E, width))
                steps.append(norm(qkv + 4 * H * E, attn.k_norm, qkv + 4 * H * E, K, E, width))
            steps.append([ROPE, qkv, cos, sin, H, E, width])
            steps.append([ROPE, qkv + 4 * H * E, cos, sin, K, E, width])
            steps.append([APPEND, qkv + 4 * H * E, width, entry, K, E, 0])
            steps.append([APPEND, qkv + 4 * (H + K) * E, width, entry, K, E, 1])
            window, scale = c.sliding_windows[i] or 0, f32_bits(c.attention_scale)
            steps.append([ATTEND, qkv, width, entry, att, H * E, H, K, E, window, scale])
            steps += products(product(attn.o_proj, att, o, D, QUANTIZE))
            if c.sandwich_norms:
                assert layer.pre_feedforward_layernorm is not None and layer.post_feedforward_layernorm is not None
                steps.append(norm(o, layer.post_attention_layernorm, o))
                steps.append([ADD, x, o, D])
                steps.append(norm(x, layer.pre_feedforward_layernorm, a))
            else:
                steps.append([ADD, x, o, D])
                steps.append(norm(x, layer.post_attention_layernorm, a))
            steps += products(
                product(mlp.gate_proj, a, gu, 2 * F, QUANTIZE), product(mlp.up_proj, a, gu + 4 * F, 2 * F, 0)
            )
            steps.append([GATED, ACTIVATION_KINDS[c.hidden_act], gu, s, F])
            steps += products(product(mlp.down_proj, s, o, D, QUANTIZE))
            if c.sandwich_norms:
                steps.append(norm(o, layer.post_feedforward_layernorm, o))  # type: ignore[arg-type]
            steps.append([ADD, x, o, D])
        steps.append(norm(x, w.norm, a, tail=1))
        steps += products(product(w.lm_head, a, at(plan.logits), c.vocab_size, QUANTIZE | TAIL))
        return steps


class DecodePlan:
    """One model's forward as kernels.c programs over buffers in `memory`, for up to `rows` new rows a
    call (longer inputs go in chunks of that many): one program for each set of weights it has run (the
    base weights, each adapter's version), the last few kept."""

    KEPT = 4  # programs kept (switching between adapters rebuilds none of these)

    def __init__(self, model: Transformer, memory: KernelMemory, rows: int, context: int) -> None:
        self.model, self.memory, self.rows = model, memory, rows
        c = model.config
        D, H, K, E, F, V = (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.intermediate_size,
            c.vocab_size,
        )
        self.width = (H + 2 * K) * E  # a row of q, k and v
        empty, staged, threads = memory.empty, memory.staged, memory.threads
        self.x = staged((rows, D))  # the residual stream
        self.a = staged((rows, D))  # a norm's output, a sublayer's input
        self.qkv = empty((rows, self.width))
        self.att = empty((rows, H * E))
        self.o = empty((rows, D))  # a sublayer's output
        self.gu = empty((rows, 2 * F))  # gate then up
        self.s = empty((rows, F))
        self.logits = staged((1, V))
        self.picks = bool(getattr(memory, "picks", False))  # whether `pick` reads back only the largest logits
        self.top = staged(1 + 2 * PICK_MAX, np.uint32) if self.picks else None  # a pick's words (KernelMemory.run)
        widest = max(D, F, H * E)
        self.xq = empty(quantized_x_bytes(GROUPED_MAX_ROWS, widest), np.uint8)
        self.scratch_stride = TILE_ROWS * widest  # floats of each thread's scratch (a prompt's exact tiles)
        self.scratch = empty(threads * self.scratch_stride)
        # attention's scratch: each thread's scores of one query, grown with the cache
        self.scores_stride = max(context, 16)
        self.scores = empty(threads * self.scores_stride)
        self.table = staged((c.num_hidden_layers, ENTRY_WORDS), np.int32)  # each layer's cache (kernels.c)
        self.table[:] = 0
        self.state = staged(STATE_WORDS, np.int32)
        self.bases = {id(f): f for f in model.inv_freq}  # one pair of tables per distinct RoPE base
        self.rope = {key: (staged((rows, E // 2)), staged((rows, E // 2))) for key in self.bases}
        self.held: list[tuple[np.ndarray, ...] | None] = [None] * c.num_hidden_layers  # what the table points at
        self.programs: dict[object, Program | str] = {}  # by weights key: the program, or why there is none
        # the base weights in the kernels' memory, by id of the array placed (which is kept, so its id
        # stays its own): every program reads the same copy
        self._shared: dict[tuple[int, str | None], tuple[Any, Any]] = {}

    def shared(self, a: Any, dtype: Any = None) -> Any:
        """`a` (a base weight, as `dtype`) in the kernels' memory, placed the first time a program asks."""
        key = (id(a), None if dtype is None else np.dtype(dtype).str)
        found = self._shared.get(key)
        if found is None:
            found = self._shared[key] = (a, self.memory.place(a, dtype))
        return found[1]

    def forget(self) -> None:
        """Drop every program and every base weight placed: the base weights' arrays were replaced (an
        adapter merged into them)."""
        self.programs.clear()
        self._shared.clear()

    def program(self, key: object) -> Program | str:
        """The program of the model's weights as they are now, which `key` names (an Engine's
        WeightsIdentity), built on first use; or why the plan cannot run them."""
        found = self.programs.pop(key, None)
        if found is None:
            found = weights_refusal(self.model) or Program(self)
        self.programs[key] = found  # (the most recent last)
        while len(self.programs) > self.KEPT:
            del self.programs[next(iter(self.programs))]
        return found

    # ---- running ----

    @staticmethod
    def _buffers(layer: LayerCache) -> tuple[np.ndarray, ...]:
        hot, cold = layer.hot, layer.cold
        if cold is None:
            return hot.k, hot.v
        return hot.k, hot.v, cold.k_codes, cold.v_codes, cold.k_scales, cold.v_scales, cold.positions

    def _points_at(self, layer: LayerCache) -> bool:
        """Whether the first layer's table entry points at this layer's buffers."""
        held, arrays = self.held[0], self._buffers(layer)
        return held is not None and len(held) == len(arrays) and all(a is b for a, b in zip(held, arrays, strict=True))

    def _point_at(self, i: int, layer: LayerCache) -> None:
        """Layer i's table entry at its cache's buffers, where they are now (they move when they grow)."""
        hot, cold = layer.hot, layer.cold
        arrays = self._buffers(layer)
        address = self.memory.address
        entry = self.table[i]
        entry[:] = 0
        entry[0], entry[1], entry[2] = word(address(hot.k)), word(address(hot.v)), hot.k.shape[1]
        entry[12] = 8
        if cold is not None:
            entry[5], entry[6] = word(address(cold.k_codes)), word(address(cold.v_codes))
            entry[7], entry[8] = word(address(cold.k_scales)), word(address(cold.v_scales))
            entry[9], entry[11], entry[12] = cold.k_codes.shape[1], word(address(cold.positions)), cold.codes.bits
        self.held[i] = arrays

    def refusal(self, cache: object) -> str | None:
        """Why this cache cannot go through the plan (the NumPy forward takes it), or None."""
        if not isinstance(cache, KVCache):
            return f"a {type(cache).__name__} (the plan reads a KVCache's tiers)"
        return None

    def forward(
        self, program: Program, tokens: np.ndarray, start: int, cache: KVCache, last_only: bool = False
    ) -> np.ndarray:
        """forward.forward's logits for `tokens` at positions start.. of `cache` through `program` (this
        plan's, for the weights as they are now): (T, V), or (1, V) for the last token only."""
        out, _ = self._forward(program, tokens, start, cache, last_only, 0)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def pick(self, program: Program, tokens: np.ndarray, start: int, cache: KVCache, k: int) -> TopLogits:
        """forward's last row as its k <= PICK_MAX largest logits, picked in the memory (whose `picks` is
        true): only those are read back."""
        assert self.picks and 0 < k <= PICK_MAX, f"a pick of {k} logits in a memory that picks {self.picks}"
        _, top = self._forward(program, tokens, start, cache, True, k)
        assert top is not None
        return top

    def _forward(
        self, program: Program, tokens: np.ndarray, start: int, cache: KVCache, last_only: bool, pick: int
    ) -> tuple[list[np.ndarray], TopLogits | None]:
        """The rows of logits wanted, or the last row's `pick` largest."""
        if start < len(cache.tokens):
            cache.truncate(start)  # rewinding: what came after `start` is forgotten
        for layer in cache.layers:
            layer.migrate()  # once a forward, before writing (as LayerCache.update_and_fetch does)
        T, out, top = len(tokens), [], None
        for at in range(0, T, self.rows):
            chunk = tokens[at : at + self.rows]
            n = len(chunk)
            wanted = not last_only or at + n == T
            direct = wanted and (last_only or n == 1)  # the plan's own logits product serves one row
            picked = pick if direct else 0
            self._run(program, chunk, start + at, cache, last_only, direct, wanted and not direct, picked)
            if picked:
                top = self._picked(picked)
            elif direct:
                out.append(self.logits.copy())
            elif wanted:
                out.append(self.model.weights.lm_head(self.a[:n]))
        return out, top

    def _picked(self, k: int) -> TopLogits:
        """What a pick of k wrote to `top`: [nonfinite, k ids, k float32 values], NONE ids past the finite logits."""
        words = self.top[: 1 + 2 * k]  # type: ignore[index]
        ids, values = words[1 : 1 + k], words[1 + k :].view(np.float32)
        found = ids != NONE
        return TopLogits(ids[found].astype(np.int64), values[found].copy(), int(words[0]))

    def _run(
        self,
        program: Program,
        tokens: np.ndarray,
        start: int,
        cache: KVCache,
        last: bool,
        logits: bool,
        normed: bool,
        pick: int = 0,
    ) -> None:
        """Run `program` over `tokens` at `start`; then `logits` holds the last row's logits (logits), or
        `top` their `pick` largest (logits and pick), or `a` the final norm's rows (normed)."""
        T = len(tokens)
        layers = cache.layers
        hot, cold = layers[0].hot, layers[0].cold
        length = hot.length
        # Every layer's tiers grow, migrate and shrink together (KVCache moves them in step), so the
        # first layer's say whether the room must grow (or the context is full: reserve raises) and
        # whether any buffer moved. (A token's Python outside the plan's call: ~1 ms in Pyodide.)
        limit = cache.max_positions
        if length + T > hot.k.shape[1] or (limit is not None and layers[0].length + T > limit):
            cache.reserve(T)
        if not self._points_at(layers[0]):
            for i, layer in enumerate(layers):
                self._point_at(i, layer)
        self.table[:, 3] = length + T  # float32 slots in use once the new rows are written
        self.table[:, 4] = hot.positions[0] if length else start  # the position of slot 0
        self.table[:, 10] = 0 if cold is None else cold.length
        needed = length + T + (0 if cold is None else cold.length)
        if needed > self.scores_stride:
            self.scores_stride = 2 * needed
            self.scores = self.memory.empty(self.memory.threads * self.scores_stride)
        self.x[:T] = embed(self.model.weights, self.model.config, tokens)
        positions = np.arange(start, start + T)
        for key, frequencies in self.bases.items():
            cos, sin = rope_tables_at(frequencies, positions)
            self.rope[key][0][:T], self.rope[key][1][:T] = cos, sin
        assert len(cache.tokens) == start, f"the cache holds {len(cache.tokens)} positions, the plan writes at {start}"
        tap = cache.tap
        tapped = 0 if tap is None else self.memory.address(tap.rows(start, start + T))  # (the plan copies them)
        tap_layer = -1 if tap is None else tap.layer
        scores = self.memory.address(self.scores)
        self.state[:] = (T, start, int(last), int(logits), tap_layer, word(tapped), word(scores), self.scores_stride)

        def rows(a: np.ndarray, n: int = T) -> tuple[np.ndarray, int]:  # a staged array's first n rows
            return a, n * a.shape[1] * a.itemsize

        inputs = [
            rows(self.x),
            *(rows(t) for pair in self.rope.values() for t in pair),
            rows(self.table, len(self.table)),
        ]
        inputs.append((self.state, self.state.nbytes))
        if pick:
            outputs = [(self.top, 4 * (1 + 2 * pick))]
        else:
            outputs = [rows(self.logits, 1)] if logits else [rows(self.a)] if normed else []
        self.memory.run(program.at, self.state, T, inputs, outputs, pick)
        for each in layers:
            each.hot.occupy(positions)  # (the plan wrote their keys and values)
        cache.record(tokens)
        cache.keep_within_budget()
