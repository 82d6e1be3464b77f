"""Browser benchmark: ruvllm in Pyodide against wllama (llama.cpp compiled to WebAssembly, single thread),
same GGUF-derived model, same prompt, greedy, in the same headless Chromium, in the same run.

    (cd benchmarks/browser && npm install)      # the wllama peer, from the npm registry
    .venv/bin/python benchmarks/browser_bench.py [--prompt-length 128] [--gen-length 64] [--runs 2] [--json OUT]
        [--configs q4:wasm:fast,q4:wasm:exact,f32:numpy] [--model /models/NAME/ --no-peer]

Each ruvllm config is COMPUTE:KERNELS[:ARITHMETIC] (the load options compute, kernels, arithmetic).
--model serves another folder of models/ (e.g. a synthetic one from benchmarks/synthetic_model.py);
--no-peer skips wllama (which needs the GGUF of the demo model).

Needs the demo model (./build.sh), a local Pyodide distribution (docs/pyodide.md) and Debian's chromium.
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


def load_serve_module():
    spec = importlib.util.spec_from_file_location("demo_serve", ROOT / "web" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompt_text(length: int) -> str:
    """The first `length` tokens of the calibration text, as text (both engines tokenize it alike)."""
    sys.path.insert(0, str(ROOT / "py_src"))
    from ruvllm.api import calibration_text
    from ruvllm.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(str(ROOT / "models" / "smollm2-135m-instruct"))
    return tokenizer.decode(tokenizer.encode(calibration_text())[:length])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--configs", default="q4:wasm:fast,q4:wasm:exact,q4:numpy,f32:numpy")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    serve = load_serve_module()
    dist = serve.local_pyodide()
    if dist is None:
        sys.exit("no local Pyodide distribution (docs/pyodide.md)")
    if not (ROOT / "benchmarks" / "browser" / "node_modules" / "@wllama").exists():
        sys.exit("the wllama peer is missing: (cd benchmarks/browser && npm install)")
    server = serve.DemoServer(0, dist)
    server.mounts = {
        "/bench/": ROOT / "benchmarks" / "browser",
        "/gguf/": ROOT / "build" / "downloads",
        **server.mounts,
    }
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    prompt = prompt_text(args.prompt_length)

    from playwright.sync_api import sync_playwright

    results = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=serve.CHROMIUM_ARGS)
        version = browser.version
        for run in range(args.runs):
            pages = [("ruvllm.html", args.model, config.split(":")) for config in args.configs.split(",")]
            if not args.no_peer:
                pages.append(("wllama.html", GGUF, []))
            for page_name, model, config in pages:
                context = browser.new_context()
                page = context.new_page()
                options = dict(zip(("compute", "kernels", "arithmetic"), config, strict=False))
                query = urlencode({"prompt": prompt, "gen": args.gen_length, "model": model, **options})
                page.goto(f"{base}/bench/{page_name}?{query}")
                page.wait_for_function("window.__result !== undefined", timeout=600_000)
                result = page.evaluate("window.__result")
                context.close()
                if "error" in result:
                    sys.exit(f"{page_name}: {result['error']}")
                result["run"] = run
                results.append(result)
                print(json.dumps(result), flush=True)
        browser.close()
    server.shutdown()

    best = {}
    for r in results:  # best run of each engine: the machine is shared and noisy
        if r["engine"] not in best or r["decode_tok_s"] > best[r["engine"]]["decode_tok_s"]:
            best[r["engine"]] = r
    peer = best.get("wllama (llama.cpp wasm, 1 thread)")
    print(
        f"\nChromium {version}; {args.model}; {args.prompt_length}-token prompt, {args.gen_length} greedy tokens;"
        f" best of {args.runs}"
    )
    names = list(best)
    print(f"{'':18s}" + "".join(f"{name.replace('(llama.cpp wasm, 1 thread)', '1 thread'):>24s}" for name in names))
    for key, label, scale in (
        ("load_ms", "load (ms)", 1),
        ("prefill_ms", "prefill (ms)", 1),
        ("ttft_ms", "TTFT (ms)", 1),
        ("decode_tok_s", "decode (tok/s)", 1),
        ("heap_bytes", "wasm heap (MiB)", 2**-20),
    ):
        cells = [best[n].get(key) for n in names]
        print(f"{label:18s}" + "".join(f"{c * scale:>24.1f}" if c else f"{'-':>24s}" for c in cells))
    if peer:
        for name in names[:-1] if names[-1] == "wllama (llama.cpp wasm, 1 thread)" else names:
            r = best[name]
            print(
                f"{name} / wllama: decode {r['decode_tok_s'] / peer['decode_tok_s']:.2f}x,"
                f" prefill speed {peer['prefill_ms'] / r['prefill_ms']:.2f}x"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"chromium": version, "runs": results, "best": best}, indent=1))


if __name__ == "__main__":
    main()
