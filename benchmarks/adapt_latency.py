"""Latency of one MicroLoRA adapt step on SmolLM2 (forward + backward through all 30 layers + update),
for a ~32-token prompt and its completion, on CPython. The same measurement in Pyodide under Node:
`node npm/bench/adapt.js`.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/adapt_latency.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "py_src"))

import ruvllm  # noqa: E402

PROMPT = (
    "Our team meets every Tuesday at ten in the small room on the third floor. Remember this: the code to the room is"
)
COMPLETION = " 4471, and the key is kept at the front desk."


def main() -> None:
    model = ruvllm.load(str(ROOT / "models" / "smollm2-135m-instruct"))
    prompt_ids, completion_ids = model.feedback_ids(PROMPT, COMPLETION, chat=False)
    results = {}
    for targets in (("q_proj", "v_proj"), ("down_proj",)):
        model.new_adapter("bench", rank=2, targets=targets)
        model.adapt(PROMPT, COMPLETION, adapter="bench", steps=1)  # warm-up
        report = model.adapt(PROMPT, COMPLETION, adapter="bench", steps=4)
        results["+".join(targets)] = report.step_ms
    print(json.dumps({"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids), "step_ms": results}))


if __name__ == "__main__":
    main()
