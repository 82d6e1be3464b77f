"""GGUF benchmark: ruvllm on CPython (compute f32, q8, q4) beside llama.cpp (through llama-cpp-python) on
the same GGUF files, in the same run: load time, prefill and decode speed, peak memory.

Every measurement runs in its own process, so peak RSS is that engine's alone. Both engines get the same
prompt: the first --prompt-length tokens of ruvllm's built-in calibration text, as ruvllm's tokenizer
encodes it (the prompt of `ruvllm bench` and of the npm bench). llama.cpp tokenizes the same text too;
the table says whether its tokens agree. Decoding is greedy, --gen-length tokens, end-of-sequence
ignored. Each process generates 1 + --repeats times from an empty cache: the first, cold run's prefill
is shown apart (it pays one-off costs), and the fastest of the others counts. The greedy tokens are
compared across engines.

    .venv/bin/pip install -r benchmarks/requirements.txt   # llama-cpp-python (builds with cmake)
    .venv/bin/python benchmarks/gguf_bench.py [--threads 1] [--prompt-length 128] [--gen-length 64]
        [--compute f32,q8,q4] [--repeats 2] [--json OUT] [GGUF ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = (
    ROOT / "build" / "downloads" / "gemma-3-270m-q4_k_m.gguf",
    ROOT / "build" / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf",
)
N_CTX = 512  # llama.cpp's context; ruvllm's KV cache gets the same number of positions
MiB = 2**20


def peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def run_ruvllm(job: dict) -> dict:
    """One ruvllm process: load, tokenize the text, one warm-up generation, then the timed runs."""
    sys.path.insert(0, str(ROOT / "py_src"))
    import ruvllm
    from ruvllm.tools.bench import run_bench

    started = time.perf_counter()
    model = ruvllm.load(job["model"], compute=job["compute"], threads=job["threads"], context_length=N_CTX)
    load_s = time.perf_counter() - started
    ids = model.tokenizer.encode(job["text"])[: job["prompt_length"]]
    first, *runs = [run_bench(model.engine, ids, job["gen"]) for _ in range(1 + job["repeats"])]
    chunks = model.generate(ids, max_tokens=job["gen"], temperature=0, ignore_eos=True)
    return {
        "compute": model.engine.plan.compute,
        "load_s": load_s,
        "prompt_ids": ids,
        "generated_ids": [chunk.token_id for chunk in chunks],
        "first_prefill_tok_s": first["prefill_tok_s"],
        "prefill_tok_s": max(r["prefill_tok_s"] for r in runs),
        "decode_tok_s": max(r["decode_tok_s"] for r in runs),
        "weight_bytes": model.engine.weights.nbytes,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def run_llama_cpp(job: dict) -> dict:
    """One llama.cpp process: the prompt tokens ruvllm used, greedy decoding by argmax of the logits."""
    import llama_cpp
    import numpy as np

    threads = job["threads"]
    started = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=job["model"],
        n_ctx=N_CTX,
        n_batch=N_CTX,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )
    load_s = time.perf_counter() - started
    own_ids = llm.tokenize(job["text"].encode("utf-8"), add_bos=True, special=True)[: job["prompt_length"]]
    ids = job["prompt_ids"]

    def next_token() -> int:
        # The last position's logits straight from the context: with logits_all=False, llama-cpp-python
        # (0.3.x) no longer copies them into `llm.scores`, which then stays zero.
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        return int(np.argmax(logits))

    def generate() -> tuple[float, float, list[int]]:
        llm.reset()
        started = time.perf_counter()
        llm.eval(ids)
        tokens = [next_token()]
        first = time.perf_counter()
        for _ in range(job["gen"] - 1):
            llm.eval(tokens[-1:])
            tokens.append(next_token())
        done = time.perf_counter()
        return len(ids) / (first - started), (job["gen"] - 1) / (done - first), tokens

    first, *runs = [generate() for _ in range(1 + job["repeats"])]
    return {
        "compute": "llama.cpp",
        "load_s": load_s,
        "own_prompt_ids": own_ids,
        "generated_ids": first[2],
        "first_prefill_tok_s": first[0],
        "prefill_tok_s": max(r[0] for r in runs),
        "decode_tok_s": max(r[1] for r in runs),
        "peak_rss_bytes": peak_rss_bytes(),
    }


RUNNERS = {"ruvllm": run_ruvllm, "llama.cpp": run_llama_cpp}


def measure(engine: str, job: dict) -> dict:
    """Run one engine in a fresh process with BLAS/OpenMP limited to the job's threads."""
    threads = str(job["threads"])
    env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    args = [sys.executable, __file__, "--runner", engine]
    result = subprocess.run(args, input=json.dumps(job), capture_output=True, text=True, env=env)
    if result.returncode:
        lines = result.stderr.strip().splitlines()
        raise SystemExit(f"{engine} on {job['model']}: {lines[-1] if lines else 'failed'}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def warm_page_cache(path: Path) -> None:
    """Read the file once so every engine's load finds it in the page cache (not only the second one)."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def matching_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def summary(r: dict) -> str:
    figures = ("load_s", "first_prefill_tok_s", "prefill_tok_s", "decode_tok_s", "peak_rss_bytes")
    return ", ".join(f"{k} {r[k]:.2f}" if isinstance(r[k], float) else f"{k} {r[k]}" for k in figures)


def print_table(name: str, rows: dict[str, dict], gen: int) -> None:
    cpp = rows.get("llama.cpp")
    print(f"\n{name}")
    header = (
        "",
        "load s",
        "prompt tok",
        "1st prefill tok/s",
        "prefill tok/s",
        "decode tok/s",
        "peak RSS MiB",
        "greedy = llama.cpp",
    )
    print(f"{header[0]:16s}" + "".join(f"{h:>{len(h) + 2}s}" for h in header[1:]))
    for label, r in rows.items():
        same = f"{matching_prefix(r['generated_ids'], cpp['generated_ids'])}/{gen}" if cpp else "-"
        tokens = len(r.get("prompt_ids") or r.get("own_prompt_ids"))
        cells = (
            f"{r['load_s']:.2f}",
            str(tokens),
            f"{r['first_prefill_tok_s']:.1f}",
            f"{r['prefill_tok_s']:.1f}",
            f"{r['decode_tok_s']:.2f}",
            f"{r['peak_rss_bytes'] / MiB:.0f}",
            same,
        )
        print(f"{label:16s}" + "".join(f"{c:>{len(h) + 2}s}" for c, h in zip(cells, header[1:], strict=True)))
    if not cpp:
        return
    print("ruvllm / llama.cpp:")
    for label, r in rows.items():
        if r is cpp:
            continue
        ratios = {k: r[k] / cpp[k] for k in ("load_s", "prefill_tok_s", "decode_tok_s", "peak_rss_bytes")}
        print(
            f"  {label:14s} load {ratios['load_s']:.2f}x, prefill {ratios['prefill_tok_s']:.2f}x, "
            f"decode {ratios['decode_tok_s']:.2f}x, peak RSS {ratios['peak_rss_bytes']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=[str(p) for p in MODELS], help="GGUF files")
    parser.add_argument("--threads", type=int, default=1, help="BLAS / llama.cpp threads")
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--compute", default="f32,q8,q4", help="ruvllm compute forms, comma-separated")
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed runs per process after the first; the fastest counts"
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--runner", choices=RUNNERS, help=argparse.SUPPRESS)  # a child process's job
    args = parser.parse_args()
    if args.runner:
        print(json.dumps(RUNNERS[args.runner](json.loads(sys.stdin.read()))))
        return

    with_cpp = importlib.util.find_spec("llama_cpp") is not None
    if not with_cpp:
        print(
            "llama_cpp is not importable: skipping llama.cpp. Install it with\n"
            f"    {Path(sys.executable).parent / 'pip'} install llama-cpp-python   # builds llama.cpp with cmake",
            flush=True,
        )
    text = (ROOT / "py_src" / "ruvllm" / "data" / "calibration.txt").read_text(encoding="utf-8")
    print(
        f"{args.threads} thread(s); prompt: first {args.prompt_length} tokens of calibration.txt; "
        f"{args.gen_length} greedy tokens; best of {args.repeats} timed runs per process",
        flush=True,
    )
    results = {}
    for model in args.models:
        warm_page_cache(Path(model))
        job = {
            "model": str(model),
            "text": text,
            "prompt_length": args.prompt_length,
            "gen": args.gen_length,
            "threads": args.threads,
            "repeats": args.repeats,
        }
        rows = {}
        for compute in args.compute.split(","):
            rows[f"ruvllm {compute}"] = r = measure("ruvllm", {**job, "compute": compute})
            print(f"{Path(model).name} ruvllm {compute}: {summary(r)}", flush=True)
        if with_cpp:
            ids = next(iter(rows.values()))["prompt_ids"]
            rows["llama.cpp"] = r = measure("llama.cpp", {**job, "prompt_ids": ids})
            agree = "same" if r["own_prompt_ids"] == ids else "DIFFERENT"
            print(f"{Path(model).name} llama.cpp: {summary(r)}; its own prompt tokens: {agree}", flush=True)
        results[Path(model).name] = rows
    for name, rows in results.items():
        print_table(name, rows, args.gen_length)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
