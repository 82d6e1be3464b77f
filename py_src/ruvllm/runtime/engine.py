"""The engine: a loaded model that maps token ids to logits. NumPy only, no text, no I/O: it is built
from the tensors it is given (assembly.py reads a model's files); the Pyodide worker and the CPython API
both drive it through token ids.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import InvalidArgumentError
from ..files.store import TensorStore, sanitize
from ..model.cache import KVCache, KVOptions
from ..model.config import ModelConfig
from ..model.forward import forward, hidden_batch, logits, recompute_layers
from ..model.kv import Cache, WeightsIdentity
from ..model.plan import DecodePlan, Program, TopLogits, plan_refusal
from ..model.transformer import Transformer
from ..model.weights import ComputeOptions, Weights, load_weights
from ..quant.provider import AttentionProducts, KernelProvider, resolve_kernels
from .planner import FORM_ORDER, PREFILL_CHUNK, MemoryPlan, choose_compute, provider_form_order
from .threads import BlasThreads

DEFAULT_MAX_CONTEXT = 4096  # cache positions reserved at most by default (memory grows with it)


BASE_WEIGHTS = WeightsIdentity(0, None, 0, 0)  # a model no adapter has touched


MIXTURE_NOTE = (
    "the active adapter is an X-LoRA mixture: its router runs passes of its own over the weights, so the NumPy "
    "forward computes it (the decode plan runs again once a LoRA adapter, or none, is active)"
)


class Wrappers(Protocol):
    """What may wrap an engine's weights (learning.adapters.AdapterSet): the engine asks it which weights a
    computation uses and has it put them in place. The runtime layer never imports the learning layer."""

    def identity(self) -> WeightsIdentity:
        """The weights computations use now, as a value that changes whenever what they compute does."""
        ...

    def use(self, identity: WeightsIdentity) -> None:
        """Put the weights `identity` names in place, or raise if they changed since it was taken."""
        ...

    def shared_layers(self, a: WeightsIdentity, b: WeightsIdentity) -> int:
        """How many decoder layers, from the bottom, compute the same under identities a and b."""
        ...

    def routing(self) -> Routing | None:
        """What mixes the weights per token in place now (an X-LoRA mixture), if anything."""
        ...

    def mixing(self) -> bool:
        """Whether the active weights are an X-LoRA mixture (routed per token by passes of its own)."""
        ...

    @property
    def tap_layer(self) -> int | None:
        """The layer whose entering hidden states new caches keep (what a lesson starts from), if any."""
        ...


class Routing(Protocol):
    """Weights mixed per token (learning.adapters.MixedForward over an xlora.Mixture): the forward's hidden
    states come from passes the mixture runs itself (a scaling pass, then the one that counts)."""

    def hidden(self, engine: Engine, tokens: np.ndarray, start: int, cache: Cache) -> np.ndarray:
        """The last layer's output (T, D) for tokens at positions start.., entries added to `cache`."""
        ...


def default_kernel() -> str:
    """The matrix kernel for this runtime: NumPy in Pyodide (emscripten) has no BLAS, einsum wins there."""
    return "einsum" if sys.platform == "emscripten" else "blas"


def default_prefill_chunk() -> int:
    """Prompt positions per forward call. With BLAS (CPython) larger products run faster, up to the
    planner's bound. In Pyodide a prompt goes as fast in chunks of 8 to 128 (SmolLM2, 128 tokens:
    3.8-4.1 s for each size, measured under Node), and a worker can take an abort only between two
    calls: chunks of 32 keep that wait near one second."""
    return 32 if sys.platform == "emscripten" else PREFILL_CHUNK


def resolve_context(config: ModelConfig, context_length: int | None) -> int:
    limit = config.max_position_embeddings
    if context_length is None:
        return min(limit, DEFAULT_MAX_CONTEXT)
    if not isinstance(context_length, int) or isinstance(context_length, bool) or not 1 <= context_length <= limit:
        raise InvalidArgumentError(f"context_length must be an integer in [1, {limit}], got {context_length!r}")
    return context_length


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    """How to load a model (keywords only). compute: "auto" (the fastest form within `memory_budget` and
    the machine's memory: planner.py), "f32", "q8", "q4", or ComputeOptions (refused if it does not fit
    them). kernels: "auto", "wasm" or "numpy" (quant/provider.py), choosing between NumPy and
    `provider`, the kernel provider the runtime offers (the Pyodide bridge passes the WebAssembly one);
    numpy_kernel: how NumPy multiplies when it does ("blas" or "einsum"; None: the better one here).
    plan: run each forward as one call of the kernels' decode plan (model/plan.py) where the provider
    offers a memory for it and the arithmetic is fast; False: the NumPy forward drives the products."""

    context_length: int | None = None
    compute: str | ComputeOptions = "auto"
    memory_budget: int | None = None
    numpy_kernel: str | None = None
    kv: KVOptions = field(default_factory=KVOptions)
    isq: str = "rtn"  # how float models are quantized at load: "rtn" or "awq" (activation-aware)
    isq_format: str = "q4_1"  # the 4-bit format float matrices get under compute "q4"
    calibration_ids: tuple[int, ...] | None = None  # token ids of a calibration text, for "awq"
    threads: int | None = None  # BLAS threads for prompt processing (threads.py); None: the available CPUs
    kernels: str = "auto"
    provider: KernelProvider | None = None
    plan: bool = True

    def __post_init__(self) -> None:
        if self.isq not in ("rtn", "awq"):
            raise InvalidArgumentError(f"isq must be rtn or awq, got {self.isq!r}")
        BlasThreads(self.threads)  # a bad thread count is refused before the slow load
        resolve_kernels(self.kernels, self.provider)  # a wrong choice is refused before the download

    @property
    def chosen_provider(self) -> KernelProvider | None:
        return resolve_kernels(self.kernels, self.provider)


def plan_for(config: ModelConfig, store: TensorStore, options: LoadOptions) -> MemoryPlan:
    """The memory plan this load would follow (nothing is allocated)."""
    compute = options.compute
    form, isq_format = (
        (compute.form, compute.isq_format) if isinstance(compute, ComputeOptions) else (compute, options.isq_format)
    )
    tensors = {
        name: (store.tensors[stored].format, store.tensors[stored].shape)
        for name, stored in sanitize(store.names()).items()
    }
    context = resolve_context(config, options.context_length)
    order = FORM_ORDER if options.chosen_provider is None else provider_form_order(tensors.values())
    return choose_compute(form, config, tensors, context, options.kv, options.memory_budget, isq_format, order)


def _activation_aware(config: ModelConfig, store: TensorStore, compute: ComputeOptions, ids) -> tuple:
    from .isq import quantize_activation_aware

    if not config.llama_block:
        raise InvalidArgumentError(f"isq='awq' runs on Llama-style blocks; {config.architecture} is not supported")
    stored = {t.format for t in store.tensors.values() if len(t.shape) == 2}
    if not stored <= {"f32", "f16", "bf16"}:
        raise InvalidArgumentError(
            f"isq='awq' quantizes float models; this one is already stored as {', '.join(sorted(stored))}"
        )
    if not ids:
        raise InvalidArgumentError("isq='awq' needs calibration token ids")
    as_f32 = ComputeOptions(form="f32", numpy_kernel=compute.numpy_kernel, provider=compute.provider)
    dense = load_weights(config, store, as_f32)
    return quantize_activation_aware(dense, config, compute, list(ids))


class Engine:
    def __init__(
        self,
        config: ModelConfig,
        weights: Weights,
        context_length: int | None = None,
        kv: KVOptions | None = None,
        threads: int | None = None,
    ) -> None:
        self.model = Transformer(config, weights)  # what the forward takes (never replaced)
        self.context_length = resolve_context(config, context_length)
        self.kv = kv or KVOptions()
        self.plan: MemoryPlan | None = None  # set when loaded through from_store
        self.lock = threading.RLock()  # held while computing, and while adapters change the weights
        self.threads = BlasThreads(threads)
        self.prefill_chunk = default_prefill_chunk()
        self.wrappers: Wrappers | None = None  # what wraps the weights (attach), if anything

    @classmethod
    def from_store(
        cls, config: ModelConfig, store: TensorStore, options: LoadOptions, plan: MemoryPlan | None = None
    ) -> Engine:
        """Plan (unless `plan`, made for these options, is given), check the plan against the memory
        budget, then prepare the weights."""
        plan = plan or plan_for(config, store, options)
        compute = options.compute
        if not isinstance(compute, ComputeOptions):
            kernel = options.numpy_kernel or default_kernel()
            compute = ComputeOptions(
                form=plan.compute, numpy_kernel=kernel, isq_format=options.isq_format, provider=options.chosen_provider
            )
        report = None
        if options.isq == "awq" and compute.form != "f32":
            weights, report = _activation_aware(config, store, compute, options.calibration_ids)
        else:
            weights = load_weights(config, store, compute)
        engine = cls(config, weights, options.context_length, options.kv, options.threads)
        engine.plan = plan
        engine.isq_report = report
        if compute.provider is not None:
            engine.kernels, engine.arithmetic = compute.provider.name, compute.provider.arithmetic
            if engine.arithmetic == "fast":  # (their sums come in another order than NumPy's: not exact)
                engine.attention = getattr(compute.provider, "attention", None)
        engine.use_plan(options.plan, compute.provider)
        return engine

    def use_plan(self, wanted: bool, provider: KernelProvider | None) -> None:
        """Build the decode plan (model/plan.py) if `wanted` and this engine can run it, else say why not
        in `plan_note`."""
        self.decode_plan = None
        memory = getattr(provider, "memory", None)
        if not wanted:
            self.plan_note = "off (plan=False)"
        elif provider is None or memory is None:
            self.plan_note = "no kernel memory to run it in (NumPy computes)"
        else:
            refusal = plan_refusal(self.model, provider.arithmetic)
            if refusal is None:
                self.decode_plan = DecodePlan(self.model, memory, PREFILL_CHUNK, self.context_length)
                self.plan_note = None
            else:
                self.plan_note = refusal

    def use_device_plan(self, plan: DecodePlan) -> None:
        """Run every forward the plan can take through `plan`, built in a device's memory (a GPU's:
        runtime/device.py, once it passed its check); caches made from now on live there."""
        self.decode_plan, self.plan_note, self.device = plan, None, "webgpu"

    def plan_now(self) -> str | None:
        """Why a forward with the weights active now does not run through the decode plan (the NumPy
        forward computes it), or None when it does."""
        if self.decode_plan is None:
            return self.plan_note
        if self.wrappers is not None and self.wrappers.mixing():
            return MIXTURE_NOTE
        return None

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def weights(self) -> Weights:
        return self.model.weights

    isq_report: list[dict] | None = None  # per group of matrices, after activation-aware quantization
    kernels: str = "numpy"  # what computes the matrix products: "numpy", or the kernel provider's name
    arithmetic: str = "exact"  # the provider's arithmetic (NumPy's is exact)
    attention: AttentionProducts | None = None  # attention's products over the cache (None: NumPy's)
    decode_plan: DecodePlan | None = None  # the forward as one kernels call (use_plan), where it runs
    plan_merges = 0  # the adapter merges the decode plan's programs include (WeightsIdentity.merges)
    plan_note: str | None = "off (no kernels)"  # why there is no decode_plan (None: there is one)
    device = "cpu"  # where the decode plan runs: "cpu" (the kernels), "webgpu" (use_device_plan)

    def attach(self, wrappers: Wrappers) -> None:
        """Let `wrappers` (the LoRA adapters of learning.adapters.AdapterSet) wrap the weights; they must hold
        this engine's `lock` while they change them."""
        if self.wrappers is not None and self.wrappers is not wrappers:
            raise InvalidArgumentError("this engine's weights already have wrappers attached")
        self.wrappers = wrappers

    def check_ids(self, ids) -> None:
        """Refuse token ids outside the vocabulary (the one check every way in makes), naming the first."""
        vocab = self.config.vocab_size
        if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu":  # a prompt's ids: checked in NumPy
            if not ids.size or (ids.min() >= 0 and ids.max() < vocab):
                return
            ids = ids.tolist()
        bad = next((int(t) for t in ids if not 0 <= t < vocab), None)  # (Python ints of any size too)
        if bad is not None:
            raise InvalidArgumentError(f"token id {bad} is outside the vocabulary [0, {vocab})")

    def weights_identity(self) -> WeightsIdentity:
        """What the weights compute with now (the active adapter, its version): the tag of cached keys and
        values, and what a generation pins for all its steps."""
        return BASE_WEIGHTS if self.wrappers is None else self.wrappers.identity()

    def new_cache(self) -> KVCache:
        """An empty cache: at most `context_length` positions, or a byte budget (KVOptions); it keeps
        the hidden states entering the wrappers' `tap_layer` unless it has a budget (it could grow
        without end)."""
        tap = None if self.wrappers is None or self.kv.budget_bytes is not None else self.wrappers.tap_layer
        empty = np.empty if self.decode_plan is None else self.decode_plan.memory.empty
        return KVCache(self.config, self.context_length, self.kv, tap, self.attention, empty)

    def kept_layers(self, owner: WeightsIdentity | None, identity: WeightsIdentity) -> int:
        """How many decoder layers, from the bottom, of a cache computed with weights `owner` hold what
        the weights `identity` compute (all when they are the same; those below an adapter that
        learned or was switched when not)."""
        if owner == identity:
            return self.config.num_hidden_layers
        if owner is None or self.wrappers is None:
            return 0
        return self.wrappers.shared_layers(owner, identity)

    def recompute(self, cache: KVCache, start: int, stop: int, weights: WeightsIdentity) -> None:
        """Positions start..stop-1 of the layers from cache.tap.layer up, from the tap's hidden states,
        with the weights `weights` (forward.recompute_layers)."""
        with self.lock, self.threads.limit(stop - start):
            if self.wrappers is not None:
                self.wrappers.use(weights)
            recompute_layers(self.model, cache, np.arange(start, stop))

    def forward(
        self,
        tokens: list[int] | np.ndarray,
        start: int,
        cache: KVCache,
        last_only: bool = False,
        weights: WeightsIdentity | None = None,
    ) -> np.ndarray:
        """Logits (T, V) for tokens at positions start.. (or (1, V) for the last one).

        weights: a `weights_identity()` to compute with (a generation pins the one it started with, so
        calls interleaved from other generations or threads cannot change its adapter); None: the
        active adapter. Calls from several threads take turns.
        """
        out = self._forward(tokens, start, cache, last_only, weights, 0)
        assert isinstance(out, np.ndarray)
        return out

    def forward_top(
        self, tokens: list[int] | np.ndarray, start: int, cache: KVCache, k: int, weights: WeightsIdentity | None = None
    ) -> np.ndarray | TopLogits:
        """The last token's logits (V,), as forward; or, where the decode plan runs in a memory that picks
        (a GPU's), only their k <= PICK_MAX largest (TopLogits), which is all that is read back."""
        out = self._forward(tokens, start, cache, True, weights, k)
        return out if isinstance(out, TopLogits) else out[0]

    def _forward(
        self,
        tokens: list[int] | np.ndarray,
        start: int,
        cache: KVCache,
        last_only: bool,
        weights: WeightsIdentity | None,
        pick: int,
    ) -> np.ndarray | TopLogits:
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise InvalidArgumentError("tokens must be a non-empty 1-D sequence of ids")
        self.check_ids(tokens)
        with self.lock, self.threads.limit(len(tokens)):
            identity = BASE_WEIGHTS
            if self.wrappers is not None:
                identity = weights or self.wrappers.identity()
                self.wrappers.use(identity)
                routing = self.wrappers.routing()
                if routing is not None:
                    x = routing.hidden(self, tokens, start, cache)
                    return logits(self.weights, self.config, x[-1:] if last_only else x)
            plan = self.decode_plan
            if plan is not None and plan.refusal(cache) is None:
                if identity.merges != self.plan_merges:  # the base weights' arrays were replaced
                    plan.forget()
                    self.plan_merges = identity.merges
                program = plan.program(identity)
                if isinstance(program, Program):
                    if pick and plan.picks:
                        return plan.pick(program, tokens, start, cache, pick)
                    return plan.forward(program, tokens, start, cache, last_only)
            return forward(self.model, tokens, start, cache, last_only)

    def forward_batch(
        self,
        entries: Sequence[tuple[np.ndarray, int, Cache]],
        sampled: list[bool],
        weights: WeightsIdentity | None = None,
    ) -> np.ndarray:
        """Logits (R, V) of the last row of each entry (tokens, start, cache) whose `sampled` is true,
        all entries computed as one batch (forward.hidden_batch); R = the number of true values."""
        lengths = [len(tokens) for tokens, _, _ in entries]
        with self.lock, self.threads.limit(sum(lengths)):
            if self.wrappers is not None:
                self.wrappers.use(weights or self.wrappers.identity())
            routing = None if self.wrappers is None else self.wrappers.routing()
            if routing is None:
                x = hidden_batch(self.model, entries)  # (N, D)
            else:  # each sequence routes its own tokens: one at a time
                x = np.concatenate([routing.hidden(self, np.asarray(t), s, c) for t, s, c in entries])
            rows = (np.cumsum(lengths) - 1)[np.asarray(sampled, dtype=bool)]  # (R,)
            if not len(rows):
                return np.empty((0, self.config.vocab_size), np.float32)
            return logits(self.weights, self.config, x[rows])  # (R, V)
