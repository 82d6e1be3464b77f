"""Bad feedback on SmolLM2: a chat's greedy answer marked Bad, then what the model says. Prints the answer
before and after, the lesson (steps, log-probability, wall time), the held-out perplexity before and
after, and answers elsewhere that must survive (raw text, another chat, a list).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bad_feedback.py [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import ruvllm
    from ruvllm.tools.perplexity import perplexity

    model = ruvllm.load(str(ROOT / "models" / "smollm2-135m-instruct"), threads=args.threads)
    eval_ids = model.tokenizer.encode((ROOT / "benchmarks" / "data" / "eval.txt").read_text())

    def chat(question: str, n: int = 40) -> str:
        messages = [{"role": "user", "content": question}]
        return "".join(c.text for c in model.chat(messages, max_tokens=n, temperature=0))

    def raw(prompt: str) -> str:
        return "".join(c.text for c in model.generate(prompt, max_tokens=12, temperature=0))

    elsewhere = {
        "raw 'The capital of France is'": lambda: raw("The capital of France is"),
        "chat 'What is the capital of Germany?'": lambda: chat("What is the capital of Germany?", 24),
        "chat 'Give me two tips for better sleep.'": lambda: chat("Give me two tips for better sleep.", 40),
    }
    question = "What is the capital of France?"
    before = {name: run() for name, run in elsewhere.items()}
    base_ppl = perplexity(model.engine, eval_ids, 1024).perplexity
    answer = chat(question)
    started = time.perf_counter()
    report = model.adapt([{"role": "user", "content": question}], answer, reward=-1, chat=True)
    seconds = time.perf_counter() - started
    print(f"answer before: {answer!r}")
    print(f"answer after:  {chat(question)!r}")
    print(
        f"lesson: {report.steps} steps, mean log-prob {report.log_prob_before:.3f} -> {report.log_prob_after:.3f}, "
        f"{seconds:.1f} s (a fresh adapter: its projection included)"
    )
    ppl = perplexity(model.engine, eval_ids, 1024).perplexity
    print(f"perplexity {base_ppl:.3f} -> {ppl:.3f} ({ppl / base_ppl - 1:+.2%})")
    for name, run in elsewhere.items():
        print(f"{name}: {before[name]!r} -> {run()!r}")


if __name__ == "__main__":
    main()
