"""The memory plan: bytes a model will take, worked out from its config and its tensors' storage formats
before anything is allocated, so a plan that cannot fit is refused before the download.

    weights    every matrix in its compute form (matrices.py), vectors in float32
    kv cache   at the configured context: float32 hot positions, int8/int4 cold ones, or the KV budget
    workspace  activations of one forward call over a prefill chunk (attention scores dominate)

`choose_compute("auto", ...)` picks the fastest compute form whose plan fits a memory budget, and the
machine's memory (`machine_memory`): a plan larger than the machine is refused before anything is
allocated, even without a budget, with the figures (not a MemoryError gigabytes later). With NumPy
that is float32 first (FORM_ORDER). With a kernel provider (quant/provider.py) quantized products are
as fast as float32 ones or faster (docs/performance.md), so `provider_form_order` puts first the
smallest form that keeps every stored matrix exactly.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..errors import InvalidArgumentError, LoadError
from ..files.formats import DEQUANTIZED_FORMATS
from ..model.cache import KVOptions
from ..model.config import ModelConfig
from ..model.weights import COMPUTE_FORMS, FLOAT_FORMATS, ComputeOptions, compute_form

MiB, GiB = 2**20, 2**30
CGROUP_LIMIT = "/sys/fs/cgroup/memory.max"  # a container's memory limit (cgroup v2), when it has one
PREFILL_CHUNK = 256  # the most prompt positions per forward call (generate.py): bounds the attention workspace
FORM_ORDER = ("f32", "q8", "q4")  # fastest first, with NumPy


def provider_form_order(tensors) -> tuple[str, ...]:
    """The order of forms to try with a kernel provider, given (storage format, shape) of every tensor:
    "q4" first when no matrix is stored as float (a q4 compute form keeps q8 tensors as int8, so it
    loses nothing), float32 first otherwise (a float model is not quantized unless asked, or unless only
    a smaller form fits the budget)."""
    if any(len(shape) == 2 and (fmt in FLOAT_FORMATS or fmt in DEQUANTIZED_FORMATS) for fmt, shape in tensors):
        return FORM_ORDER
    return ("q4", "q8", "f32")


@dataclass(frozen=True)
class MemoryPlan:
    compute: str
    weight_bytes: int
    kv_bytes: int
    workspace_bytes: int
    weight_bytes_by_form: dict[str, int]  # compute form of each matrix -> bytes

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.workspace_bytes

    def as_dict(self) -> dict:
        return {
            "compute": self.compute,
            "weight_bytes": self.weight_bytes,
            "kv_bytes": self.kv_bytes,
            "workspace_bytes": self.workspace_bytes,
            "total_bytes": self.total_bytes,
            "weight_bytes_by_form": dict(self.weight_bytes_by_form),
        }

    def describe(self) -> str:
        forms = ", ".join(f"{form} {n / MiB:.1f}" for form, n in sorted(self.weight_bytes_by_form.items()))
        return (
            f"weights {self.weight_bytes / MiB:.1f} MiB ({forms}) + KV cache {self.kv_bytes / MiB:.1f} MiB"
            f" + workspace {self.workspace_bytes / MiB:.1f} MiB = {self.total_bytes / MiB:.1f} MiB"
        )


def machine_memory() -> int | None:
    """Bytes of memory this machine has (or its container may use); None where that cannot be told: in
    Pyodide the page's engine passes its own memory_budget."""
    if sys.platform == "emscripten":
        return None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None
    try:
        with open(CGROUP_LIMIT, encoding="ascii") as f:
            limit = f.read().strip()  # "max" when there is none
        if limit.isdigit():
            total = min(total, int(limit))
    except (OSError, UnicodeDecodeError):
        pass  # not in a cgroup v2 container
    return total if total > 0 else None


def kv_bytes(config: ModelConfig, context_length: int, kv: KVOptions) -> int:
    hot = kv.hot_bytes_per_position(config)
    if kv.hot_tokens is None:
        return context_length * hot
    hot_positions = min(context_length, kv.hot_tokens + kv.migrate_batch + PREFILL_CHUNK)
    if kv.budget_bytes is not None:
        return max(kv.budget_bytes, hot_positions * hot)
    cold_positions = max(0, context_length - kv.hot_tokens)
    return hot_positions * hot + cold_positions * kv.cold_bytes_per_position(config)


def workspace_bytes(config: ModelConfig, context_length: int, compute: str, largest_matrix: int) -> int:
    T = min(PREFILL_CHUNK, context_length)
    H, D, F, V = config.num_attention_heads, config.hidden_size, config.intermediate_size, config.vocab_size
    scores = 3 * H * T * context_length * 4  # scores, exponentials, probabilities
    activations = T * (3 * F + 8 * D) * 4
    logits = 2 * V * 4
    expanded = largest_matrix * 4 if compute != "f32" else 0  # a quantized matrix expanded for a prefill
    return scores + activations + logits + expanded


def plan_memory(
    config: ModelConfig,
    tensors: dict[str, tuple[str, tuple[int, ...]]],
    compute: str,
    context_length: int,
    kv: KVOptions | None = None,
    isq_format: str = "q4_1",
) -> MemoryPlan:
    """`tensors`: HF name -> (storage format, shape), as a TensorStore lists them."""
    if compute not in COMPUTE_FORMS:
        raise InvalidArgumentError(f"compute must be one of auto, {', '.join(COMPUTE_FORMS)}, got {compute!r}")
    kv = kv or KVOptions()
    options = ComputeOptions(form=compute, isq_format=isq_format)
    by_form: dict[str, int] = {}  # weight bytes by compute form
    weight, largest = 0, 0
    for name, (fmt, shape) in tensors.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if len(shape) == 1:
            weight += shape[0] * 4
            continue
        cls, values = compute_form(fmt, shape, options)  # as loading will decide it
        n = cls.planned_nbytes(shape, values)
        weight += n
        by_form[cls.form] = by_form.get(cls.form, 0) + n
        if name != "model.embed_tokens.weight":
            largest = max(largest, shape[0] * shape[1])
    return MemoryPlan(
        compute=compute,
        weight_bytes=weight,
        kv_bytes=kv_bytes(config, context_length, kv),
        workspace_bytes=workspace_bytes(config, context_length, compute, largest),
        weight_bytes_by_form=by_form,
    )


def choose_compute(
    compute: str,
    config: ModelConfig,
    tensors: dict[str, tuple[str, tuple[int, ...]]],
    context_length: int,
    kv: KVOptions | None,
    memory_budget: int | None,
    isq_format: str = "q4_1",
    order: tuple[str, ...] = FORM_ORDER,
) -> MemoryPlan:
    """The plan for `compute` ("auto": the first form of `order` that fits `memory_budget` and the
    machine's memory), or a LoadError saying what the smallest plan needs and what there is."""
    if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget <= 0):
        raise InvalidArgumentError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    machine = machine_memory()
    limits = [(memory_budget, f"the memory budget of {(memory_budget or 0) / MiB:.0f} MiB")]
    limits.append((machine, f"this machine's memory ({(machine or 0) / GiB:.1f} GiB)"))
    limit, what = min(((n, text) for n, text in limits if n is not None), default=(None, ""))
    forms = order if compute == "auto" else (compute,)
    plans = [plan_memory(config, tensors, form, context_length, kv, isq_format) for form in forms]
    for plan in plans:
        if limit is None or plan.total_bytes <= limit:
            return plan
    assert limit is not None  # (without one, the first plan was returned)
    smallest = min(plans, key=lambda p: p.total_bytes)
    needs = smallest.describe()
    if smallest.total_bytes >= GiB:
        needs = f"{smallest.total_bytes / GiB:.1f} GiB: {needs}"
    if compute != "auto":
        advice = "compute='auto', q8 or q4, or a smaller context_length"
    elif smallest.weight_bytes > limit:
        advice = "a smaller model (its weights alone do not fit)"
    else:
        advice = "a smaller context_length"
    raise LoadError(
        f"the model does not fit {what}: in its smallest form ({smallest.compute}) it needs {needs}; try {advice}"
    )
