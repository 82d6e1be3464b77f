"""BLAS threads: prefill and decode speed with one thread, with every core, with every core for prompts
only (ruvllm's default before) and with ruvllm's default (one thread to decode; for prompts one or every
core, whichever measures faster as it runs), on a quiet machine and with other busy processes, in one
run. The figures behind the choice in py_src/ruvllm/runtime/threads.py. Each policy's prefill is the
median of --repeats prompts (the default's includes its first measurements).

    .venv/bin/python benchmarks/threads_bench.py [--busy 0 1 2] [--compute f32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "smollm2-135m-instruct"


def spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="other busy processes, per row")
    parser.add_argument("--compute", default="f32")
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--gen-length", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "py_src"))
    import ruvllm
    from ruvllm.api import calibration_text
    from ruvllm.runtime.generate import GenerationOptions, generate_tokens
    from ruvllm.runtime.threads import BlasThreads, available_cpus

    class Everywhere(BlasThreads):  # what OpenBLAS does by default: every product on every core
        def for_rows(self, rows: int) -> int:
            return self.prefill

    cores = available_cpus()
    policies = {
        "1 thread": BlasThreads(1),
        f"{cores} everywhere": Everywhere(cores),
        f"{cores} for prompts": BlasThreads(cores),
        "ruvllm default": BlasThreads(),
    }
    model = ruvllm.load(str(MODEL), compute=args.compute)
    ids = model.tokenizer.encode(calibration_text())[: args.prompt_length]
    options = GenerationOptions.from_kwargs(max_tokens=args.gen_length, temperature=0, ignore_eos=True)

    def once() -> tuple[float, float]:
        steps = generate_tokens(model.engine, ids, options, cache=model.engine.new_cache())
        first = next(steps)
        started = time.perf_counter()
        count = sum(1 for _ in steps)
        return first.prefill_ms, count / (time.perf_counter() - started)

    print(f"{len(ids)}-token prompt, {args.gen_length} greedy tokens, compute {args.compute}, {cores} CPUs")
    print(f"{'busy':>4s}  {'policy':16s}{'prefill ms':>12s}{'decode tok/s':>14s}")
    for busy in args.busy:
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
        for p in spinners:
            p.start()
        try:
            results = {name: [] for name in policies}
            for _ in range(args.repeats):  # policies interleaved, so drift hits each alike
                for name, policy in policies.items():
                    model.engine.threads = policy
                    results[name].append(once())
        finally:
            for p in spinners:
                p.terminate()
        for name, runs in results.items():
            prefill = statistics.median(r[0] for r in runs)
            decode = statistics.median(r[1] for r in runs)
            print(f"{busy:>4d}  {name:16s}{prefill:>12.0f}{decode:>14.1f}", flush=True)


if __name__ == "__main__":
    main()
