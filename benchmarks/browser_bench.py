"""Browser benchmark: ruvllm in Pyodide against wllama (llama.cpp compiled to WebAssembly), same GGUF-derived
model, same prompt, greedy, in the same headless Chromium, in the same run.

    (cd benchmarks/browser && npm install)      # the wllama peer, from the npm registry
    .venv/bin/python benchmarks/browser_bench.py [--prompt-length 128] [--gen-length 64] [--runs 2] [--json OUT]
        [--configs q4:wasm:fast,q4:wasm:exact,f32:numpy,q4:wasm:fast:2,q4:wasm:fast:1:noplan] [--peer-threads 1,2]
        [--model /models/NAME/ | --gguf /gguf/NAME.gguf] [--no-peer] [--page-timeout 600]

Each ruvllm config is COMPUTE:KERNELS[:ARITHMETIC[:THREADS[:noplan]]] (the load options compute, kernels,
arithmetic, threads; THREADS is an integer or auto, default 1; noplan: plan false, the products driven from
Python instead of the decode plan's one call a forward). --model serves another folder of models/ (e.g. a synthetic
one from benchmarks/synthetic_model.py) to ruvllm; --gguf NAME serves build/downloads/NAME (as web/serve.py
does, under /gguf/) to both engines; without either, ruvllm reads the demo folder and wllama the demo's GGUF.
--peer-threads lists wllama's thread counts (wllama 3.x starts its multi-thread build when asked for more
than one thread in a cross-origin isolated page; each row says whether it did). --no-peer skips wllama (it
needs a GGUF). Each run loads every page in a fresh browser context, in the order given, so `--runs 2`
interleaves 1, 2, 1, 2 threads. Each row prints crossOriginIsolated (web/serve.py sends COOP/COEP: more than
one thread needs it) and, for ruvllm, its two heaps: Pyodide's WebAssembly memory (info.heapBytes) and the
kernel thread pool's (info.poolBytes, which holds the weights when threads > 1). The summary takes each
row's best run and prints the ratios to its 1-thread run and to wllama at the same thread count. A page that
fails is reported with its error and the others go on (the exit status is then 1).

Issue 25's table: see benchmarks/README.md. Needs a local Pyodide distribution (docs/pyodide.md), the npm
package's browser bundle (npm run build in npm/) and Debian's chromium.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import threading
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
MODEL = "/models/smollm2-135m-instruct/"
GGUF = "/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
MiB = 2**20


def load_serve_module():
    spec = importlib.util.spec_from_file_location("demo_serve", ROOT / "web" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompt_text(length: int) -> str:
    """The first `length` tokens (SmolLM2's) of the calibration text, as text: both engines tokenize the same
    text, so with another model's tokenizer the prompt's token count differs a little (each row reports it)."""
    sys.path.insert(0, str(ROOT / "py_src"))
    from ruvllm.api import calibration_text
    from ruvllm.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(str(ROOT / "models" / "smollm2-135m-instruct"))
    text, ids = calibration_text(), []
    while len(ids) < length:  # (the text is ~1,000 tokens: longer prompts repeat it)
        ids = tokenizer.encode(text)
        text += "\n\n" + calibration_text()
    return tokenizer.decode(ids[:length])


def parse_config(text: str) -> dict[str, str]:
    """COMPUTE:KERNELS[:ARITHMETIC[:THREADS[:noplan]]] -> the ruvllm page's query options."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 5 or not all(parts[:2]) or parts[4:] not in ([], ["noplan"]):
        raise ValueError(f"--configs: {text!r} is not COMPUTE:KERNELS[:ARITHMETIC[:THREADS[:noplan]]]")
    if parts[4:]:
        parts[4] = "false"
    options = dict(zip(("compute", "kernels", "arithmetic", "threads", "plan"), parts, strict=False))
    options.setdefault("threads", "1")
    options["arithmetic"] = options.get("arithmetic") or "fast"
    if options["threads"] != "auto" and not (options["threads"].isdigit() and int(options["threads"]) >= 1):
        raise ValueError(f"--configs: {text!r}: THREADS must be an integer >= 1 or auto, got {options['threads']!r}")
    return options


def parse_threads(text: str) -> list[int]:
    counts = text.split(",")
    if not all(c.isdigit() and int(c) >= 1 for c in counts):
        raise ValueError(f"--peer-threads takes a comma-separated list of integers >= 1, got {text!r}")
    return [int(c) for c in counts]


def gguf_url(name: str) -> str:
    """--gguf as the URL web/serve.py serves it at, checked against build/downloads."""
    file = name.removeprefix("/gguf/")
    if "/" in file or not file.endswith(".gguf"):
        raise ValueError(f"--gguf: expected /gguf/NAME.gguf (a file of build/downloads), got {name!r}")
    if not (ROOT / "build" / "downloads" / file).is_file():
        raise ValueError(f"--gguf: no {file} in build/downloads")
    return f"/gguf/{file}"


def run_page(browser, url: str, timeout_s: int) -> dict:
    """Open one page in a fresh context and return its window.__result, or {"error": ...}."""
    from playwright.sync_api import Error as PlaywrightError

    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(f"{message.type}: {message.text}"))
    try:
        page.goto(url)
        page.wait_for_function("window.__result !== undefined", timeout=timeout_s * 1000)
        result = page.evaluate("window.__result")
    except PlaywrightError as error:
        result = {"error": f"{error}".splitlines()[0]}
    context.close()
    if "error" in result and errors:
        result["console"] = errors[-8:]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--configs", default="q4:wasm:fast,q4:wasm:exact,q4:numpy,f32:numpy")
    parser.add_argument("--model", help=f"a model folder served under /models/ (default {MODEL})")
    parser.add_argument("--gguf", help="/gguf/NAME.gguf: build/downloads/NAME.gguf for both engines")
    parser.add_argument("--peer-threads", default="1")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--page-timeout", type=int, default=600, help="seconds a page may take (a hang guard)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    try:
        configs = [parse_config(c) for c in args.configs.split(",") if c]  # --configs "": wllama alone
        peer_threads = parse_threads(args.peer_threads)
        if args.model and args.gguf:
            raise ValueError("--model and --gguf both name the model: give one")
        model = gguf_url(args.gguf) if args.gguf else args.model or MODEL
    except ValueError as error:
        sys.exit(str(error))
    peer_model = model if args.gguf else GGUF
    if args.prompt_length < 1 or args.gen_length < 1 or args.runs < 1:
        sys.exit("--prompt-length, --gen-length and --runs must be >= 1")

    serve = load_serve_module()
    dist = serve.local_pyodide()
    if dist is None:
        sys.exit("no local Pyodide distribution (docs/pyodide.md)")
    if not args.no_peer and not (ROOT / "benchmarks" / "browser" / "node_modules" / "@wllama").exists():
        sys.exit("the wllama peer is missing: (cd benchmarks/browser && npm install)")
    if not (ROOT / "npm" / "browser" / "index.js").exists():
        sys.exit("the npm package's browser bundle is missing: (cd npm && npm run build)")
    server = serve.DemoServer(0, dist)
    browser_dir = ROOT / "benchmarks" / "browser"
    server.mounts = {
        # by its real path: in a git worktree node_modules is a link out of the folder, which serve.py refuses
        "/bench/node_modules/": (browser_dir / "node_modules").resolve(),
        "/bench/": browser_dir,
        **server.mounts,
    }
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    prompt = prompt_text(args.prompt_length)

    from playwright.sync_api import sync_playwright

    pages = [("ruvllm.html", model, options) for options in configs]
    if not args.no_peer:
        context = max(1024, -(-(args.prompt_length + args.gen_length + 64) // 512) * 512)  # wllama's n_ctx
        pages += [("wllama.html", peer_model, {"threads": str(n), "ctx": str(context)}) for n in peer_threads]
    results, failures = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=serve.CHROMIUM_ARGS)
        version = browser.version
        for run in range(args.runs):
            for page_name, page_model, options in pages:
                query = urlencode({"prompt": prompt, "gen": args.gen_length, "model": page_model, **options})
                result = run_page(browser, f"{base}/bench/{page_name}?{query}", args.page_timeout)
                result.update(run=run, page=page_name, options=options)
                print(json.dumps(result), flush=True)
                (failures if "error" in result else results).append(result)
        browser.close()
    server.shutdown()

    summarize(results, args, version, model)
    for failure in failures:
        print(f"FAILED {failure['page']} {failure['options']}: {failure['error']}")
    if args.json:
        best = best_runs(results)
        Path(args.json).write_text(
            json.dumps({"chromium": version, "runs": results, "failures": failures, "best": best}, indent=1)
        )
    if failures:
        sys.exit(1)


def best_runs(results: list[dict]) -> dict[str, dict]:
    """The best run (by decode speed) of each engine row: the machine is shared and noisy."""
    best: dict[str, dict] = {}
    for r in results:
        if r["engine"] not in best or r["decode_tok_s"] > best[r["engine"]]["decode_tok_s"]:
            best[r["engine"]] = r
    return best


def summarize(results: list[dict], args: argparse.Namespace, version: str, model: str) -> None:
    if not results:
        return
    best = best_runs(results)
    names = list(best)
    width = max(24, *(len(n) + 2 for n in names))
    print(
        f"\nChromium {version}; {model}; {args.prompt_length}-token prompt, {args.gen_length} greedy tokens;"
        f" best of {args.runs}"
    )
    print(f"{'':22s}" + "".join(f"{name:>{width}s}" for name in names))
    for key, label, show in (
        ("cross_origin_isolated", "crossOriginIsolated", str),
        ("threads", "threads (count)", str),
        ("load_ms", "load (s)", lambda v: f"{v / 1000:.2f}"),
        ("prompt_tokens", "prompt tokens", str),
        ("prefill_tok_s", "prefill (tok/s)", lambda v: f"{v:.1f}"),
        ("ttft_ms", "TTFT (ms)", lambda v: f"{v:.0f}"),
        ("decode_tok_s", "decode (tok/s)", lambda v: f"{v:.2f}"),
        ("heap_bytes", "wasm heap (MiB)", lambda v: f"{v / MiB:.0f}"),
        ("pool_bytes", "pool (MiB)", lambda v: f"{v / MiB:.0f}"),
    ):
        cells = [best[n].get(key) for n in names]
        print(f"{label:22s}" + "".join(f"{show(c) if c is not None else '-':>{width}s}" for c in cells))
    for r in best.values():
        if r.get("threads_asked") not in (None, "auto") and str(r["threads"]) != r["threads_asked"]:
            reason = r.get("threads_reason") or ("not cross-origin isolated" if not r["cross_origin_isolated"] else "")
            print(f"{r['engine']}: asked {r['threads_asked']} threads, ran {r['threads']} {reason}".rstrip())

    def ratio(r: dict, base: dict) -> str:
        return (
            f"load {r['load_ms'] / base['load_ms']:.2f}x (time),"
            f" prefill {r['prefill_tok_s'] / base['prefill_tok_s']:.2f}x,"
            f" decode {r['decode_tok_s'] / base['decode_tok_s']:.2f}x (speed)"
        )

    print("")
    for name, r in best.items():  # against the same engine and options on 1 thread
        one = {**r["options"], "threads": "1"}
        base = next((b for b in best.values() if b["page"] == r["page"] and b["options"] == one), None)
        if base is not None and base is not r:
            print(f"{name} / {base['engine']}: {ratio(r, base)}")
    peers = {r["threads_asked"]: r for r in best.values() if r["page"] == "wllama.html"}
    for name, r in best.items():  # ruvllm against wllama at the same thread count
        peer = peers.get(r["options"].get("threads")) if r["page"] == "ruvllm.html" else None
        if peer is not None:
            print(f"{name} / {peer['engine']}: {ratio(r, peer)}")


if __name__ == "__main__":
    main()
