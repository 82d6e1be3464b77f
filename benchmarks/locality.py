"""What a lesson does to the answers it is not about (issue 36): the README's fact lesson, a Good lesson
and a Bad lesson on chat answers, each on a fresh default adapter, then the greedy answers of the fixed
prompt set (tools/locality.py: 40 chat questions, 8 raw texts) compared with the base model's, and the
lesson's own figures (its report, its wall time on this machine).

    .venv/bin/python benchmarks/locality.py [MODEL] [--layers 28,29] [--rank 32] [--before]

--before runs each lesson as ruvllm learned before issue 36's keyed rows, in the same run: the top two
layers, A and B trained (A projected), lr 1, at most 20 steps.

Run with one BLAS thread for times that compare (OPENBLAS_NUM_THREADS=1); the locality figures do not
depend on load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from itertools import product
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import ruvllm
from ruvllm.tools.locality import Answers

ROOT = Path(__file__).resolve().parent.parent
# (name, prompt, completion (None: the base model's greedy answer, 40 tokens), reward, chat)
LESSONS = [
    ("README fact", "The secret code is", " BLUE-42.", 1.0, False),
    ("Good (chat)", "What is the secret code?", "The secret code is BLUE-42.", 1.0, True),
    ("Bad (chat)", "Tell me a joke.", None, -1.0, True),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    parser.add_argument("--layers", help="the adapted layers (default: the adapter's default)")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--before", action="store_true", help="also each lesson as learned before keyed rows")
    args = parser.parse_args()
    model = ruvllm.load(args.model, threads=1)
    started = time.perf_counter()
    answers = Answers.of(model)
    print(f"{args.model}: {len(answers.prompts)} greedy answers in {time.perf_counter() - started:.1f} s")
    shape: dict = {"rank": args.rank}
    if args.layers:
        shape["layers"] = [int(v) for v in args.layers.split(",")]
    started = time.perf_counter()
    model.session.prepare_learning()  # what the worker does in idle time after loading
    model.learn(None)
    print(f"preparing the default adapter's spectra (once per model, idle time): {time.perf_counter() - started:.1f} s")
    ways = [("keyed", shape, {})]
    if args.before:
        ways.append(("before", {**shape, "layers": [-2, -1]}, {"keyed": False, "lr": 1.0, "steps": 20}))
    for (name, prompt, completion, reward, chat), (way, made, options) in product(LESSONS, ways):
        model.set_adapter(None)
        if completion is None:
            asked = model.chat([{"role": "user", "content": prompt}], max_tokens=40, temperature=0)
            completion = "".join(c.text for c in asked)
        model.new_adapter(f"{name} {way}", **made)
        started = time.perf_counter()
        report = model.adapt(prompt, completion, reward=reward, adapter=f"{name} {way}", chat=chat, **options)
        seconds = time.perf_counter() - started
        locality = answers.compare()
        print(f"\n{name} ({way}): {prompt!r} -> {completion!r} (reward {reward:+g})")
        print(f"  {report.summary}")
        print(
            f"  lesson {seconds:.1f} s ({report.steps} steps, {report.rehearsal_steps} rehearsal, "
            f"{report.step_ms:.0f} ms a pass)"
        )
        print(f"  locality: {locality.summary()}")
        for text, before, now in locality.moved[:3]:
            print(f"    {text!r}: {before!r} -> {now!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
