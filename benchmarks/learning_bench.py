"""What learning from feedback costs a chat, on SmolLM2, in CPython, Pyodide under Node and Chromium,
for the old default adapter (q_proj and v_proj on every layer: every step a forward and backward
through all 30 layers, the whole conversation prefilled again afterwards) and today's default, in the
same run (npm/bench/learning.js holds the scenario; this file runs the same one on CPython):

a chat turn (24 greedy tokens), Good on its answer, then the time until the first update is applied,
until the lesson is done, and the next turn's time to first token against the same turn without
feedback.

    .venv/bin/python benchmarks/learning_bench.py [--runtimes cpython,node,chromium] [--threads 1]
        [--answer-tokens 40] [--chromium-threads 2]

Node and Chromium need a local Pyodide distribution (docs/pyodide.md); Chromium is Debian's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "py_src"))

import ruvllm  # noqa: E402

MODEL = ROOT / "models" / "smollm2-135m-instruct"
SCENARIO = json.loads((ROOT / "npm" / "bench" / "learning-scenario.json").read_text())  # shared with JS
CONFIGS = [(c["label"], c["config"], c["lesson"]) for c in SCENARIO["configs"]]


def turn(model, messages: list[dict], tokens: int) -> tuple[str, dict]:
    chunks = list(model.chat(messages, temperature=0, max_tokens=tokens, ignore_eos=True))
    return "".join(c.text for c in chunks), chunks[0].stats


def cpython_scenario(config: dict, lesson: dict, threads: int, tokens: int) -> dict:
    model = ruvllm.load(str(MODEL), threads=threads)  # the engine sets BLAS threads itself: the env is not enough
    started = time.perf_counter()
    model.session.prepare_learning()  # what the worker does in idle time after load
    model.learn(None)
    preparing_ms = (time.perf_counter() - started) * 1000
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    model.new_adapter("bench", **config)
    messages = [{"role": "user", "content": SCENARIO["question"]}]
    answer, _ = turn(model, messages, tokens)
    follow = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": SCENARIO["follow_up"]}]
    _, ordinary = turn(model, follow, tokens)
    turn(model, messages, tokens)  # the cache holds the answer again, as right after it was given
    started = time.perf_counter()
    options = {"until_greedy" if k == "untilGreedy" else k: v for k, v in lesson.items()}
    lesson = model.feedback(messages, answer, 1.0, "bench", **options)  # the first step, at once
    first_update_ms = (time.perf_counter() - started) * 1000
    model.learn(None)
    lesson_ms = (time.perf_counter() - started) * 1000
    reply, after = turn(model, follow, tokens)
    started = time.perf_counter()
    model.feedback(follow, reply, 1.0, "bench", **options)  # a second lesson: the adapter exists already
    second_update_ms = (time.perf_counter() - started) * 1000
    model.learn(None)
    return {
        "preparing_ms": preparing_ms,
        "second_lesson_first_update_ms": second_update_ms,
        "first_update_ms": first_update_ms,
        "lesson_ms": lesson_ms,
        "steps": lesson.report.steps,
        "step_ms": lesson.report.step_ms,
        "ordinary_next_ttft_ms": ordinary.ttft_ms,
        "next_ttft_after_feedback_ms": after.ttft_ms,
        "cached_tokens_after_feedback": after.cached_tokens,
    }


def node_results(tokens: int) -> list[dict]:
    script = str(ROOT / "npm" / "bench" / "learning.js")
    out = subprocess.run(["node", script, str(tokens)], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"node: {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def chromium_results(tokens: int, threads: str) -> list[dict]:
    import importlib.util

    from playwright.sync_api import sync_playwright

    spec = importlib.util.spec_from_file_location("demo_serve", ROOT / "web" / "serve.py")
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    dist = serve.local_pyodide()
    if dist is None:
        sys.exit("no local Pyodide distribution (docs/pyodide.md)")
    server = serve.DemoServer(0, dist)
    server.mounts = {"/bench/": ROOT / "benchmarks" / "browser", **server.mounts}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=serve.CHROMIUM_ARGS)
        page = browser.new_page()
        query = f"model=/models/smollm2-135m-instruct/&tokens={tokens}" + (f"&threads={threads}" if threads else "")
        page.goto(f"{base}/bench/learning.html?{query}")
        page.wait_for_function("window.__result !== undefined", timeout=1_800_000)
        result = page.evaluate("window.__result")
        browser.close()
    server.shutdown()
    if "error" in result:
        sys.exit(f"chromium: {result['error']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", default="cpython,node,chromium")
    parser.add_argument("--threads", type=int, default=1, help="CPython's BLAS threads (default 1)")
    parser.add_argument("--answer-tokens", type=int, default=SCENARIO["answer_tokens"], help="the answer's length")
    parser.add_argument("--chromium-threads", default="", help="the page's kernel threads (default: its own, auto)")
    args = parser.parse_args()
    tokens = args.answer_tokens
    rows = []
    for runtime in args.runtimes.split(","):
        if runtime == "cpython":
            found = [
                {"runtime": "cpython", "adapter": label, **cpython_scenario(c, o, args.threads, tokens)}
                for label, c, o in CONFIGS
            ]
        elif runtime == "node":
            found = node_results(tokens)
        else:
            found = chromium_results(tokens, args.chromium_threads)
        for row in found:
            print(json.dumps(row), flush=True)
        rows += found
    print(
        f"\n{'runtime':13s} {'adapter':36s} {'2nd lesson':>11s} {'1st update':>11s} {'lesson':>9s} {'steps':>5s} "
        f"{'TTFT next':>10s} {'after':>9s} {'ratio':>6s}"
    )
    for r in rows:
        ratio = r["next_ttft_after_feedback_ms"] / r["ordinary_next_ttft_ms"]
        print(
            f"{r['runtime']:13s} {r['adapter']:36s} {r['second_lesson_first_update_ms']:9.0f}ms "
            f"{r['first_update_ms']:9.0f}ms {r['lesson_ms']:7.0f}ms "
            f"{r['steps']:5d} {r['ordinary_next_ttft_ms']:8.0f}ms {r['next_ttft_after_feedback_ms']:7.0f}ms "
            f"{ratio:5.2f}x"
        )


if __name__ == "__main__":
    main()
