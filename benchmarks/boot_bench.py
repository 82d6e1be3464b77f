"""Boot benchmark: how long Python (Pyodide, NumPy, ruvllm) takes to start in the npm package's worker,
on a first visit (nothing saved: a fresh boot that saves the boot snapshot) and on a second visit
(restored from it), in Pyodide under Node and in headless Chromium, in the same run.

    .venv/bin/python benchmarks/boot_bench.py [--runs 3] [--json OUT] [--no-node] [--no-browser] [--plain]

Each run of each runtime: a first visit with nothing saved, a second visit, and a visit with
`bootCache: false` (a fresh boot, everything else as warm as the second visit: Chromium's HTTP cache and
compiled-code cache, the weights in the Cache API). Under Node every visit is its own process, with its
own cache root ($RUVLLM_CACHE_DIR) per run; in Chromium a run is one new browser context (empty caches)
and its visits are loads of the same page. --plain never passes `bootCache`, to measure a version of the package from
before the boot snapshot (its third visit is then one more like the second).

Figures per visit: `python` (the worker's time from the start of the boot to Python ready, info.boot.ms),
`plan` (from RuvLLM.load to the first step after the boot, comparable with versions without a boot
snapshot), `load` (the whole load, with the weights). The ratio first/second is taken within each run.

Needs the demo model (./build.sh), a local Pyodide distribution (docs/pyodide.md), the wheel and browser
bundle in npm/ (./build.sh npm) and, for the browser, Debian's chromium.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
MODEL = "models/smollm2-135m-instruct"
VISITS = (("first", None), ("second", None), ("no snapshot", "false"))


def load_serve_module():
    spec = importlib.util.spec_from_file_location("demo_serve", ROOT / "web" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node_runs(dist: Path, runs: int, plain: bool) -> list[dict]:
    results = []
    for run in range(runs):
        with tempfile.TemporaryDirectory(prefix="ruvllm-boot-bench-") as cache:
            for visit, boot_cache in VISITS:
                args = ["node", str(ROOT / "benchmarks" / "boot_node.mjs"), str(dist), str(ROOT / MODEL)]
                args += [boot_cache] if boot_cache and not plain else []
                env = {**os.environ, "RUVLLM_CACHE_DIR": cache}  # a cache root of its own: the snapshot goes to boot/
                out = subprocess.run(args, env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"node, {visit} visit: {out.stderr.strip()[-2000:]}")
                result = {"runtime": "node", "run": run, "visit": visit, **json.loads(out.stdout.splitlines()[-1])}
                print(json.dumps(result), flush=True)
                results.append(result)
    return results


def browser_runs(dist: Path, runs: int, plain: bool) -> tuple[str, list[dict]]:
    from playwright.sync_api import sync_playwright

    serve = load_serve_module()
    server = serve.DemoServer(0, dist)
    server.mounts = {"/bench/": ROOT / "benchmarks" / "browser", **server.mounts}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/bench/boot.html"
    results = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=serve.CHROMIUM_ARGS)
        version = browser.version
        for run in range(runs):
            context = browser.new_context()  # empty caches: the first visit of a new visitor
            page = context.new_page()
            for visit, boot_cache in VISITS:
                query = {"model": f"/{MODEL}/", **({"bootCache": boot_cache} if boot_cache and not plain else {})}
                page.goto(f"{base}?{urlencode(query)}")
                page.wait_for_function("window.__result !== undefined", timeout=600_000)
                result = page.evaluate("window.__result")
                if "error" in result:
                    sys.exit(f"chromium, {visit} visit: {result['error']}")
                result = {"runtime": "chromium", "run": run, "visit": visit, **result}
                print(json.dumps(result), flush=True)
                results.append(result)
            context.close()
        browser.close()
    server.shutdown()
    return version, results


def median_s(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) / 1000 if values else None


def summary(results: list[dict]) -> None:
    keys = ("python_ms", "plan_ms", "load_ms")
    for runtime in dict.fromkeys(r["runtime"] for r in results):
        mine = [r for r in results if r["runtime"] == runtime]
        runs = sorted({r["run"] for r in mine})
        print(f"\n{runtime}: median of {len(runs)} run(s), seconds")
        print(f"{'visit':14s}{'python':>9s}{'plan':>9s}{'load':>9s}   boot")
        for visit, _ in VISITS:
            rows = [r for r in mine if r["visit"] == visit]
            cells = [median_s(rows, key) for key in keys]
            boots = sorted({f"{r['boot']['from']}/{r['boot']['cache']}" if r["boot"] else "-" for r in rows})
            figures = "".join(f"{c:9.1f}" if c else f"{'-':>9s}" for c in cells)
            print(f"{visit:14s}{figures}   {', '.join(boots)}")
        by_run = {(r["run"], r["visit"]): r for r in mine}
        for key in keys:
            pairs = [(by_run[(run, "first")][key], by_run[(run, "second")][key]) for run in runs]
            if any(b is None for pair in pairs for b in pair):
                continue
            ratios = [first / second for first, second in pairs]
            warm = [by_run[(run, "no snapshot")][key] / by_run[(run, "second")][key] for run in runs]
            print(
                f"{key[:-3]:>7s}: first/second {statistics.median(ratios):.1f}x (runs: "
                + ", ".join(f"{x:.1f}" for x in ratios)
                + f"); no snapshot/second {statistics.median(warm):.1f}x"
            )
        sizes = {r["boot"]["snapshotBytes"] for r in mine if r["boot"] and r["boot"]["snapshotBytes"]}
        if sizes:
            print("snapshot entry: " + ", ".join(f"{s / 2**20:.1f} MiB" for s in sorted(sizes)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-node", action="store_true")
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--plain", action="store_true", help="never pass bootCache (older versions)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    dist = load_serve_module().local_pyodide()
    if dist is None:
        sys.exit("no local Pyodide distribution (docs/pyodide.md)")
    results, chromium = [], None
    if not args.no_node:
        results += node_runs(dist, args.runs, args.plain)
    if not args.no_browser:
        chromium, browser_results = browser_runs(dist, args.runs, args.plain)
        results += browser_results
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    print(f"\nNode {node}; Chromium {chromium}; {os.cpu_count()} cores; load average {load:.1f} at the end")
    summary(results)
    if args.json:
        Path(args.json).write_text(json.dumps({"node": node, "chromium": chromium, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
