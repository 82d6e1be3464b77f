"""One benchmark run: prefill, time to first token and decode speed of a greedy generation, with the
memory it took. Used by `ruvllm bench` on CPython and by the npm package's bench inside Pyodide."""

from __future__ import annotations

import time

from ..runtime.engine import Engine
from ..runtime.generate import GenerationOptions, Step, generate_tokens


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory, where the platform says (not inside Pyodide)."""
    try:
        import resource
    except ImportError:
        return None
    try:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    except (AttributeError, OSError):
        return None


def run_bench(engine: Engine, prompt_ids: list[int], gen_length: int) -> dict:
    """Generate `gen_length` greedy tokens after `prompt_ids` from an empty cache; figures as a dict."""
    cache = engine.new_cache()
    options = GenerationOptions.from_kwargs(max_tokens=gen_length, temperature=0, ignore_eos=True)
    started = time.perf_counter()
    first_at = last_at = started
    prefill_ms = 0.0
    count = 0
    for step in generate_tokens(engine, prompt_ids, options, cache=cache, reuse_prefix=False):
        assert isinstance(step, Step)  # (no report_prefill: no Prefilling marker comes)
        last_at = time.perf_counter()
        count += 1
        if step.prefill_ms is not None:
            prefill_ms, first_at = step.prefill_ms, last_at
    kv = cache.stats()
    plan = engine.plan.as_dict() if engine.plan else None
    return {
        "compute": engine.plan.compute if engine.plan else None,
        "prompt_tokens": len(prompt_ids),
        "generated_tokens": count,
        "prefill_ms": prefill_ms,
        "prefill_tok_s": len(prompt_ids) / (prefill_ms / 1000) if prefill_ms else 0.0,
        "ttft_ms": (first_at - started) * 1000,
        "decode_tok_s": (count - 1) / (last_at - first_at) if count > 1 and last_at > first_at else 0.0,
        "peak_rss_bytes": peak_rss_bytes(),
        "weight_bytes": engine.weights.nbytes,
        "kv_hot_bytes": kv["hot_bytes"],
        "kv_cold_bytes": kv["cold_bytes"],
        "kv_cold_format": kv["cold_format"] if kv["cold_positions"] else None,
        "planned_bytes": plan["total_bytes"] if plan else None,
    }
