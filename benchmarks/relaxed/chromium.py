"""Relaxed SIMD, measured in Chromium: benchmarks/relaxed/bench.mjs in a headless tab (Playwright).

    python benchmarks/relaxed/chromium.py [--reps 15] [--json out.json]

The page and its files (bench.mjs, the generator it imports, build/relaxed/relaxed.wasm: build it
first with `node benchmarks/relaxed/bench.mjs --build --reps 1`) are served from memory through Playwright's
routing, so nothing listens on a port. Chromium is Debian's, with web/serve.py's flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "web"))
from serve import CHROMIUM_ARGS  # noqa: E402

ORIGIN = "http://relaxed.bench"
PAGE = """<!doctype html><script type="module">
import { runBench, format } from "./bench.mjs";
const bytes = new Uint8Array(await (await fetch("./relaxed.wasm")).arrayBuffer());
const result = await runBench(bytes, { reps: REPS });
result.engine = navigator.userAgent;
window.done = { result, text: result.engine + "\\n" + format(result) };
</script>"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    wasm = ROOT / "build" / "relaxed" / "relaxed.wasm"
    if not wasm.exists():
        sys.exit(f"{wasm} is missing: build it with `node benchmarks/relaxed/bench.mjs --build --reps 1`")
    files = {
        "/index.html": ("text/html", PAGE.replace("REPS", str(args.reps)).encode()),
        "/bench.mjs": ("text/javascript", (ROOT / "benchmarks" / "relaxed" / "bench.mjs").read_bytes()),
        "/relaxed.wasm": ("application/wasm", wasm.read_bytes()),
        # what bench.mjs imports as ../../npm/test/support/random.js (from /bench.mjs: this path)
        "/npm/test/support/random.js": ("text/javascript", (ROOT / "npm/test/support/random.js").read_bytes()),
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.route(
            f"{ORIGIN}/**",
            lambda route: route.fulfill(
                status=200,
                content_type=files[route.request.url[len(ORIGIN) :]][0],
                body=files[route.request.url[len(ORIGIN) :]][1],
            ),
        )
        page.on("pageerror", lambda e: print("page error:", e, file=sys.stderr))
        page.goto(f"{ORIGIN}/index.html")
        page.wait_for_function("window.done !== undefined", timeout=600_000, polling=1000)
        done = page.evaluate("window.done")
        browser.close()
    print(done["text"])
    if args.json:
        args.json.write_text(json.dumps(done["result"], indent=1))


if __name__ == "__main__":
    main()
