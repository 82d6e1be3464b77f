"""Where the decode plan runs: the CPU's kernels (Pyodide's heap, or the kernel thread pool's memory), or
a GPU: the same programs (model/plan.py) in a WebGPU device's memory, run by its shaders (the npm
package's worker: npm/src/worker/gpu/), which Python reaches through the same calls as the thread pool's
memory (quant/pool.py PoolMemory over the worker's `api`).

A GPU computes in float32 with the weights dequantized in its shaders; drivers and browsers have bugs
that make such output silently wrong (f16 overflow, miscompiled shaders). So a GPU runs the plan only
once it passed a check at load: a fixed short prompt and a few decoding steps through the GPU's plan and
through the CPU's forward (the plan on the kernels, the reference the CPU keeps), compared row by row:
the largest difference of the logits against their scale, and the top token (the same, or a near-tie of
the CPU's two candidates). The bound, from measurements (benchmarks/RESULTS.md, issue 39): SwiftShader's
logits for SmolLM2 differ from the NumPy forward's by ~2e-6 of their scale, from the CPU plan's (its fast
arithmetic: up to ~3e-3, tests/test_plan.py's bound) by 3.6e-4, Gemma 3's by 5.8e-4; a shader whose output
is scaled by 1.5 (the tests' broken ones) gives 0.51-0.53 on a tiny Llama. RELATIVE_BOUND sits between.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from ..errors import LoadError
from ..model.cache import KVCache
from ..model.plan import DecodePlan, KernelMemory, Program, plan_refusal
from ..quant.pool import PoolMemory
from .planner import PREFILL_CHUNK

DEVICE_CHOICES = ("auto", "webgpu", "cpu")
RELATIVE_BOUND = 2e-2  # the largest logit difference the check lets through, of the logits' scale
CHECK_PROMPT = 6  # tokens of the check's prompt, then CHECK_STEPS decoding steps
CHECK_STEPS = 2


def gpu_memory(api: Any) -> PoolMemory:
    """The GPU's memory as the plan's KernelMemory: PoolMemory over the worker's calls (`api`, a JsProxy:
    region, free, fetch, write, plan), one thread (a program's steps run one after another)."""
    memory = PoolMemory(SimpleNamespace(api=api, threads=1))  # type: ignore[arg-type]  # (what it reads of PoolKernels)
    memory.half_scales = True  # (exactly float16 scales and mins go as such: plan.py HALF)
    memory.picks = True  # (greedy and top-k sampling read back only the largest logits: plan.py TopLogits)
    return memory


def check_ids(vocab_size: int) -> np.ndarray:
    """The check's prompt: fixed ids spread over the vocabulary (the same for every load of a model)."""
    return (np.arange(1, CHECK_PROMPT + 1, dtype=np.int64) * 7919) % vocab_size


def compare(got: np.ndarray, want: np.ndarray) -> dict:
    """The check's figures for the GPU's logits `got` against the CPU's `want` (rows, V): the largest
    difference, the logits' scale, their ratio, the share of rows whose top token agrees, and whether
    every row that disagrees is a near-tie (the CPU's two candidates within twice the difference)."""
    scale = float(np.abs(want).max())
    diff = float(np.abs(got - want).max()) if np.isfinite(got).all() else float("inf")
    rows = np.arange(len(want))
    top_got, top_want = got.argmax(-1), want.argmax(-1)
    margins = want[rows, top_want] - want[rows, top_got]
    relative = diff / scale if scale else diff
    return {
        "rows": len(want),
        "top1": float((top_got == top_want).mean()),
        "max_diff": diff,
        "scale": scale,
        "relative": relative,
        "bound": RELATIVE_BOUND,
        "near_ties": bool((margins <= 2 * diff).all()),
        "passed": bool(relative <= RELATIVE_BOUND and (margins <= 2 * diff).all()),
    }


def check_plan(engine: Any, plan: DecodePlan) -> dict:
    """Run the check's prompt and steps through `plan` and through the engine's forward as it is now;
    the figures (compare) over all their rows."""
    program = plan.program("device check")
    if not isinstance(program, Program):
        return {"passed": False, "refusal": program}
    config = engine.config
    cache = KVCache(config, engine.context_length, engine.kv, None, None, plan.memory.empty)
    reference = engine.new_cache()
    ids = check_ids(config.vocab_size)
    got, want = [plan.forward(program, ids, 0, cache)], [engine.forward(ids, 0, reference)]
    position = len(ids)
    for _ in range(CHECK_STEPS):
        token = np.array([int(want[-1][-1].argmax())])
        got.append(plan.forward(program, token, position, cache))
        want.append(engine.forward(token, position, reference))
        position += 1
    plan.programs.pop("device check", None)
    return compare(np.concatenate(got), np.concatenate(want))


def use_gpu(engine: Any, memory: KernelMemory, choice: str) -> dict:
    """Build the decode plan in the GPU's memory (`memory`: PoolMemory over the worker's calls, gpu_memory),
    check it against the CPU, and let it run every forward if it passed. The device's report for `info`: the path
    taken ("webgpu" or "cpu"), why not the GPU (null when it runs), the check's figures. With `choice`
    "webgpu" a GPU that cannot run the plan is a load error naming why; with "auto" the CPU runs."""

    def refuse(reason: str, check: dict | None = None) -> dict:
        if choice == "webgpu":
            raise LoadError(f"device 'webgpu': {reason}")
        return {"path": "cpu", "reason": reason, "check": check}

    refusal = plan_refusal(engine.model, "fast")
    if refusal is not None:
        return refuse(f"the decode plan cannot run this model ({refusal})")
    if engine.kernels != "numpy" and engine.arithmetic == "exact":  # (asked for: the kernels' default is fast)
        return refuse("the exact arithmetic keeps the CPU's NumPy forward")
    plan = DecodePlan(engine.model, memory, PREFILL_CHUNK, engine.context_length)
    check = check_plan(engine, plan)
    if not check["passed"]:
        figures = f"largest difference {check.get('relative', float('nan')):.3g} of the logits' scale"
        figures += f", top-1 agreement {check.get('top1')}"
        return refuse(f"the GPU's logits failed the check against the CPU ({figures})", check)
    engine.use_device_plan(plan)
    return {"path": "webgpu", "reason": None, "check": check}
