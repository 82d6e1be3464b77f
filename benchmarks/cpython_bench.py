"""CPython benchmark: ruvllm (NumPy, and its WebAssembly kernels through wasmtime: kernels="wasm") against
Hugging Face transformers (torch, float32) and llama.cpp (through llama-cpp-python, on the same GGUF),
same prompt, greedy, 1 thread and 2 threads, in the same run. Each engine runs in its own process, so
peak memory is its own. ruvllm's kernels run on one thread on CPython for now (issue 40): their row
is measured at 1 thread only.

    .venv/bin/pip install -r benchmarks/requirements.txt
    .venv/bin/python benchmarks/cpython_bench.py [--prompt-length 128] [--gen-length 64] [--json OUT]
        [--model PATH (ruvllm's; default the demo folder)] [--gguf PATH (the peers'; default SmolLM2 Q4_1)]
        [--compute f32 (ruvllm NumPy's form)] [--engines ruvllm,ruvllm-wasm,transformers,llama.cpp]

Gemma 3: --model build/downloads/gemma-3-270m-q4_k_m.gguf --gguf build/downloads/gemma-3-270m-q4_k_m.gguf
(the prompt's ids are SmolLM2's tokens of the same text: any ids do for speed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "smollm2-135m-instruct"
GGUF = ROOT / "build" / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# Each runner: prompt ids on stdin (JSON), figures as one JSON line on stdout.
RUNNERS = {
    "ruvllm": """
import json, sys, time
from ruvllm.tools.bench import run_bench
from ruvllm.runtime.assembly import load_engine
ids, gen, compute = json.loads(sys.stdin.read())
engine = load_engine(sys.argv[1], compute=compute)
r = run_bench(engine, ids, gen)
print(json.dumps({k: r[k] for k in ("prefill_ms", "ttft_ms", "decode_tok_s", "peak_rss_bytes")}))
""",
    "ruvllm-wasm": """
import json, sys
from ruvllm.tools.bench import run_bench
from ruvllm.api import load_options
from ruvllm.runtime.assembly import local_assembly
ids, gen, _ = json.loads(sys.stdin.read())
options = load_options(None, "auto", None, None, "wasm", "fast")
engine = local_assembly(sys.argv[1], options, needs_tokenizer=False).build()
assert engine.decode_plan is not None, engine.plan_note
r = run_bench(engine, ids, gen)
print(json.dumps({k: r[k] for k in ("prefill_ms", "ttft_ms", "decode_tok_s", "peak_rss_bytes", "compute")}))
""",
    "transformers": """
import json, resource, sys, time
import torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(int(sys.argv[3]))
ids, gen, _ = json.loads(sys.stdin.read())
model = AutoModelForCausalLM.from_pretrained(sys.argv[2], gguf_file=sys.argv[4], dtype=torch.float32).eval()
with torch.inference_mode():
    started = time.perf_counter()
    out = model(torch.tensor([ids]), use_cache=True)
    token = int(out.logits[0, -1].argmax())
    first = time.perf_counter()
    past = out.past_key_values
    for _ in range(gen - 1):
        out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        token = int(out.logits[0, -1].argmax())
    done = time.perf_counter()
print(json.dumps({"prefill_ms": (first - started) * 1000, "ttft_ms": (first - started) * 1000,
                  "decode_tok_s": (gen - 1) / (done - first),
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
""",
    "llama.cpp": """
import json, resource, sys, time
import numpy as np
import llama_cpp
from llama_cpp import Llama
ids, gen, _ = json.loads(sys.stdin.read())
threads = int(sys.argv[3])
llm = Llama(model_path=sys.argv[5], n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads,
            logits_all=False, verbose=False)
# With logits_all=False llama-cpp-python leaves llm.scores unfilled: read the last position's logits.
def last():
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),))))
started = time.perf_counter()
llm.eval(ids)
token = last()
first = time.perf_counter()
for _ in range(gen - 1):
    llm.eval([token])
    token = last()
done = time.perf_counter()
print(json.dumps({"prefill_ms": (first - started) * 1000, "ttft_ms": (first - started) * 1000,
                  "decode_tok_s": (gen - 1) / (done - first),
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
""",
}


def run(engine: str, ids: list[int], gen: int, threads: int, compute: str, model: Path, gguf: Path) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    args = [sys.executable, "-c", RUNNERS[engine], str(model), str(gguf.parent), str(threads), gguf.name, str(gguf)]
    result = subprocess.run(args, input=json.dumps([ids, gen, compute]), capture_output=True, text=True, env=env)
    if result.returncode:
        raise SystemExit(f"{engine}: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'failed'}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--compute", default="f32", help="ruvllm NumPy's compute form")
    parser.add_argument("--model", type=Path, default=MODEL, help="what ruvllm loads (a folder or a GGUF)")
    parser.add_argument("--gguf", type=Path, default=GGUF, help="what llama.cpp and transformers load")
    parser.add_argument("--engines", default=",".join(RUNNERS), help="some of " + ", ".join(RUNNERS))
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    engines = args.engines.split(",")
    unknown = set(engines) - set(RUNNERS)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; they are {', '.join(RUNNERS)}")

    sys.path.insert(0, str(ROOT / "py_src"))
    from ruvllm.api import calibration_text
    from ruvllm.text.tokenizer import Tokenizer

    ids = Tokenizer.from_folder(str(MODEL)).encode(calibration_text())[: args.prompt_length]
    results = {}
    for threads in (1, 2):
        for engine in engines:
            if engine == "ruvllm-wasm" and threads > 1:
                continue  # (one thread on CPython for now)
            r = run(engine, ids, args.gen_length, threads, args.compute, args.model, args.gguf)
            results[f"{engine} {threads}t"] = r
            print(f"{engine:13s} {threads} thread(s): {json.dumps(r)}", flush=True)

    print(f"\n{len(ids)}-token prompt, {args.gen_length} greedy tokens; ruvllm {args.model.name} (NumPy: compute")
    print(f"{args.compute}; wasm: its stored or planned forms), peers {args.gguf.name}")
    print(f"{'':26s}{'prefill ms':>12s}{'decode tok/s':>14s}{'peak RSS MiB':>14s}")
    for name, r in results.items():
        print(f"{name:26s}{r['prefill_ms']:>12.0f}{r['decode_tok_s']:>14.2f}{r['peak_rss_bytes'] / 2**20:>14.0f}")
    for threads in (1, 2):
        cpp = results.get(f"llama.cpp {threads}t", {}).get("decode_tok_s")
        hf = results.get(f"transformers {threads}t", {}).get("decode_tok_s")
        for ours in ("ruvllm", "ruvllm-wasm"):
            mine = results.get(f"{ours} {threads}t", {}).get("decode_tok_s")
            if mine is None:
                continue
            ratios = [f"/llama.cpp {mine / cpp:.2f}x" if cpp else "", f"/transformers {mine / hf:.2f}x" if hf else ""]
            if any(ratios):
                print(f"{threads} thread(s): {ours} " + ", ".join(r for r in ratios if r))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"prompt_tokens": len(ids), "gen": args.gen_length, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
