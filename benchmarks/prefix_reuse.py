"""Prefix reuse: time to first token of a chat's second turn, when the cache still holds the first turn,
against the same prompt from a cold cache (same run, CPython).

    .venv/bin/python benchmarks/prefix_reuse.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "py_src"))

import ruvllm  # noqa: E402
import ruvllm.api  # noqa: E402


def ttft(model, messages) -> tuple[float, int, str]:
    chunks = list(model.chat(messages, temperature=0, max_tokens=48))
    return chunks[-1].stats.ttft_ms, chunks[-1].stats.cached_tokens, "".join(c.text for c in chunks)


def main() -> None:
    model = ruvllm.load(str(ROOT / "models" / "smollm2-135m-instruct"))
    system = {"role": "system", "content": ruvllm.api.calibration_text()[:1500]}
    turn1 = [system, {"role": "user", "content": "Summarize the text above in two sentences."}]
    _, _, reply = ttft(model, turn1)
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "Now in one sentence."}]
    warm_ms, cached, _ = ttft(model, turn2)
    ttft(model, [{"role": "user", "content": "Something unrelated, to empty the cache of this chat."}])
    cold_ms, cold_cached, _ = ttft(model, turn2)
    prompt = len(model.tokenizer.encode_chat(turn2))
    result = {"prompt_tokens": prompt, "reused_tokens": cached, "ttft_warm_ms": warm_ms, "ttft_cold_ms": cold_ms}
    print(json.dumps(result))
    print(
        f"second turn, {prompt} prompt tokens: TTFT {warm_ms:.0f} ms reusing {cached} cached tokens, "
        f"{cold_ms:.0f} ms from a cold cache ({cold_cached} reused): {cold_ms / warm_ms:.1f}x faster"
    )


if __name__ == "__main__":
    main()
