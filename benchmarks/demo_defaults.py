"""The demo page's sampling defaults and example prompts, chosen by measurement (issue 35): for each
chat example of the page and each candidate setting, N sampled answers of SmolLM2-135M-Instruct (seeds
0..N-1, as the page's chat would sample them: the library's top-k 40 and min-p 0.05 beside the
setting), each judged by what the greedy answer shows a good one holds:

- capital: names Paris (the greedy answer does);
- sleep: about sleep (sleep, bed, rest) and with at least two tips (two list items or sentences);
- poem: about the sea (sea, ocean, wave, tide, shore);
- rainbow: about light and colour (rainbow, and light, colo(u)r, sun or rain);

and, for every example, not looping (no 4-word run repeated 3 times or more) and in English (at most 2%
of its letters outside ASCII). The answers are generated in batches through the server's scheduler
(one forward per step for the N samples of a setting). Prints the share of good answers per example and
setting, and their mean.

    .venv/bin/python benchmarks/demo_defaults.py [--samples 20] [--max-tokens 96] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "smollm2-135m-instruct"

EXAMPLES = {
    "capital": "What is the capital of France?",
    "sleep": "Give me two tips for better sleep.",
    "poem": "Write a short poem about the sea.",
    "rainbow": "Explain what a rainbow is to a child.",
}
TOPIC = {
    "capital": [r"\bParis\b"],
    "sleep": [r"\b(sleep|bed|rest)"],
    "poem": [r"\b(sea|ocean|wave|tide|shore)"],
    "rainbow": [r"\brainbow", r"\b(light|colou?r|sun|rain)"],
}
# (temperature, top_p, repetition_penalty): the page's old defaults among them (0.5, 0.9, 1.1)
CANDIDATES = [(t, p, r) for t, p, r in itertools.product((0.2, 0.3, 0.5, 0.7), (0.9,), (1.0, 1.05, 1.1))] + [
    (0.1, 0.9, 1.1),
    (0.2, 0.8, 1.1),
    (0.0, 1.0, 1.0),
    (0.0, 1.0, 1.1),
]


def loops(text: str) -> bool:
    words = re.findall(r"\w+", text.lower())
    runs: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - 3):
        run = tuple(words[i : i + 4])
        runs[run] = runs.get(run, 0) + 1
    return max(runs.values(), default=0) >= 3


def good(example: str, text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    foreign = sum(not c.isascii() for c in letters) / max(1, len(letters))
    if loops(text) or foreign > 0.02 or not all(re.search(p, text, re.IGNORECASE) for p in TOPIC[example]):
        return False
    if example == "sleep":
        items = re.findall(r"(?m)^\s*(?:\d+[.)]|[-*•])\s", text)
        return len(items) >= 2 or len(re.findall(r"[.!?](\s|$)", text)) >= 2
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path, help="write every answer and judgement here")
    parser.add_argument("--settings", help="only these, e.g. 0.2/0.9/1.1,0.5/0.9/1.1 (temperature/top_p/penalty)")
    args = parser.parse_args()

    import ruvllm
    from ruvllm.runtime.batching import Scheduler
    from ruvllm.runtime.generate import GenerationOptions

    model = ruvllm.load(str(MODEL), threads=1)
    detokenize = model.tokenizer.decode
    record: dict = {}
    print(f"{args.samples} answers per example and setting, {args.max_tokens} tokens at most", flush=True)
    print(f"{'temperature':>11} {'top_p':>5} {'penalty':>7}  " + " ".join(f"{k:>8}" for k in EXAMPLES) + "     mean")
    chosen = CANDIDATES
    if args.settings:
        chosen = [tuple(float(x) for x in s.split("/")) for s in args.settings.split(",")]  # type: ignore[misc]
    for temperature, top_p, penalty in chosen:
        shares = []
        for example, question in EXAMPLES.items():
            prompt = model.tokenizer.encode_chat([{"role": "user", "content": question}])
            samples = 1 if temperature == 0 else args.samples
            scheduler = Scheduler(model.engine, max_concurrent=samples, max_context=len(prompt) + args.max_tokens + 1)
            outputs: list[list] = [[] for _ in range(samples)]
            for seed in range(samples):
                options = GenerationOptions.from_kwargs(
                    max_tokens=args.max_tokens, temperature=temperature, top_p=top_p,
                    repetition_penalty=penalty, seed=seed,
                )  # fmt: skip
                scheduler.submit(prompt, options, outputs[seed].append, model.eos_token_ids)
            while scheduler.running or scheduler.waiting:
                scheduler.step()
            ends = set(model.eos_token_ids)
            texts = [detokenize([s.token_id for s in steps if s.token_id not in ends]) for steps in outputs]
            judged = [good(example, text) for text in texts]
            shares.append(sum(judged) / len(judged))
            record[f"{temperature}/{top_p}/{penalty}/{example}"] = list(zip(texts, judged, strict=True))
        mean = sum(shares) / len(shares)
        row = " ".join(f"{s:8.0%}" for s in shares)
        print(f"{temperature:11} {top_p:5} {penalty:7}  {row} {mean:8.0%}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
