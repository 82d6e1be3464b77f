"""What MicroLoRA learns, and what it costs the model: held-out facts taught one after another
(benchmarks/data/facts.jsonl) on one adapter, for several adapter placements and learning rates.

For each configuration: how many of the 10 facts greedy decoding reproduces at the end, whether "The
capital of France is" still gives " Paris", the perplexity change on benchmarks/data/eval.txt, and the
mean time of one learning step (CPython; run with one BLAS thread for comparable times).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/adapt_quality.py [--layers 4,30] [--lr 0.004,0.01]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "py_src"))

import ruvllm  # noqa: E402
from ruvllm.tools.perplexity import perplexity  # noqa: E402

FACTS = [json.loads(line) for line in (ROOT / "benchmarks" / "data" / "facts.jsonl").read_text().splitlines()]
EVAL = ROOT / "benchmarks" / "data" / "eval.txt"


def greedy(model, prompt: str, n: int = 8) -> str:
    return "".join(c.text for c in model.generate(prompt, max_tokens=n, temperature=0))


def numbers(text: str, kind=float) -> list:
    return [kind(v) for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    parser.add_argument("--targets", default="down_proj")
    parser.add_argument("--layers", default="30,8,4,2,1", help="how many top layers to adapt (each a run)")
    parser.add_argument("--lr", default="0.004", help="learning rates (each a run)")
    parser.add_argument("--steps", default="6", help="steps per fact (each a run)")
    parser.add_argument("--rank", default="2", help="ranks (each a run)")
    parser.add_argument("--ewc", default="10000", help="consolidation strengths (each a run)")
    parser.add_argument("--facts", type=int, default=len(FACTS))
    parser.add_argument("--until-greedy", action="store_true", help="a lesson ends once greedy decoding gives it")
    args = parser.parse_args()

    model = ruvllm.load(args.model)
    count = model.engine.config.num_hidden_layers
    eval_ids = model.tokenizer.encode(EVAL.read_text())
    base_ppl = perplexity(model.engine, eval_ids, 1024).perplexity
    facts = FACTS[: args.facts]
    known = sum(greedy(model, f["prompt"]).startswith(f["completion"]) for f in facts)
    print(json.dumps({"base_perplexity": round(base_ppl, 3), "facts_known_before": known}), flush=True)
    targets = tuple(args.targets.split(","))
    runs = [
        (top, lr, steps, rank, ewc)
        for top in numbers(args.layers, int)
        for lr in numbers(args.lr)
        for steps in numbers(args.steps, int)
        for rank in numbers(args.rank, int)
        for ewc in numbers(args.ewc)
    ]
    for top, lr, steps, rank, ewc in runs:
        if True:
            layers = None if top >= count else tuple(range(count - top, count))
            model.new_adapter("sweep", rank=rank, targets=targets, layers=layers)
            step_ms, started = [], time.perf_counter()
            first = None
            for i, fact in enumerate(facts):
                report = model.adapt(
                    fact["prompt"], fact["completion"], fact["reward"], "sweep", steps=steps, lr=lr, ewc=ewc
                )
                step_ms.append(report.step_ms)
                if i == 0:
                    ppl = perplexity(model.engine, eval_ids, 1024).perplexity
                    kept = greedy(model, fact["prompt"]).startswith(fact["completion"])
                    first = {"reproduced": kept, "perplexity_change": round(ppl / base_ppl - 1, 4)}
            learn_s = time.perf_counter() - started
            reproduced = [greedy(model, f["prompt"]).startswith(f["completion"]) for f in facts]
            paris = greedy(model, "The capital of France is").startswith(" Paris")
            ppl = perplexity(model.engine, eval_ids, 1024).perplexity
            row = {
                "targets": args.targets,
                "top_layers": top,
                "lr": lr,
                "steps": steps,
                "rank": rank,
                "ewc": ewc,
                "first_fact": first,
                "facts_reproduced": sum(reproduced),
                "of": len(facts),
                "paris": paris,
                "perplexity_change": round(ppl / base_ppl - 1, 4),
                "step_ms": round(sum(step_ms) / len(step_ms), 1),
                "learning_s": round(learn_s, 1),
            }
            print(json.dumps(row), flush=True)
            model.set_adapter(None)


if __name__ == "__main__":
    main()
