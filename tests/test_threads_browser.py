"""`threads` in the browser: the npm package's browser build in Debian's Chromium, driven by Playwright.

On a cross-origin isolated page (web/serve.py sends COOP/COEP) two threads compute and the greedy tokens
equal CPython's; on a page without those headers one thread runs, the model still answers, and
`info.threads.reason` says why. Needs a local Pyodide distribution (as tests/test_e2e.py) and the built
kernels and browser bundle (npm/browser, npm/wasm).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
MODEL = ROOT / "models" / "smollm2-135m-instruct"
PROMPT = "The three primary colors are"
TOKENS = 12

_spec = importlib.util.spec_from_file_location("demo_serve", ROOT / "web" / "serve.py")
serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve)

DIST = serve.local_pyodide()
BUILT = (ROOT / "npm" / "browser" / "worker" / "pool-worker.js").exists() and (
    ROOT / "npm" / "wasm" / "kernels-shared.wasm"
).exists()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.pyodide,
    pytest.mark.skipif(DIST is None, reason="no local Pyodide distribution (docs/pyodide.md says how to make one)"),
    pytest.mark.skipif(not BUILT, reason="the browser bundle or the kernels are not built (./build.sh npm)"),
]

# Loads the model with the given options, generates greedily and answers {ids, threads, isolated}.
RUN = """async ({ options, prompt, tokens }) => {
    const { RuvLLM } = await import('/npm/browser/index.js');
    const llm = await RuvLLM.load({ model: '/models/smollm2-135m-instruct/', pyodide: { indexURL: '/pyodide/' },
        cache: false, ...options });
    const ids = [];
    for await (const chunk of llm.generate(prompt, { temperature: 0, maxTokens: tokens, ignoreEos: true }))
        ids.push(chunk.tokenId);
    const threads = llm.info.threads;
    await llm.dispose();
    return { ids, threads, isolated: self.crossOriginIsolated };
}"""


class PlainHandler(serve.DemoHandler):
    """The demo server's files without the cross-origin isolation headers."""

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-cache")
        SimpleHTTPRequestHandler.end_headers(self)


def start(handler: type) -> tuple[serve.DemoServer, str]:
    httpd = serve.DemoServer(0, DIST)
    httpd.RequestHandlerClass = handler
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/"


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=serve.CHROMIUM_ARGS)
        yield browser.new_page()
        browser.close()


def cpython_ids() -> list[int]:
    args = [sys.executable, "-m", "ruvllm", "generate", str(MODEL), "--prompt", PROMPT, "--temperature", "0"]
    args += ["--max-tokens", str(TOKENS), "--ignore-eos", "--json"]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)["token_ids"]


def test_an_isolated_page_runs_two_threads_with_cpythons_tokens(page, smollm2_dir):
    httpd, url = start(serve.DemoHandler)
    try:
        page.goto(url + "npm/README.md")
        got = page.evaluate(RUN, {"options": {"threads": 2, "arithmetic": "exact"}, "prompt": PROMPT, "tokens": TOKENS})
    finally:
        httpd.shutdown()
    assert got["isolated"] is True
    assert got["threads"] == {"count": 2, "reason": None, "adaptive": False}
    assert got["ids"] == cpython_ids()


def test_a_page_that_is_not_isolated_runs_one_thread_and_says_why(page, smollm2_dir):
    httpd, url = start(PlainHandler)
    try:
        page.goto(url + "npm/README.md")
        got = page.evaluate(RUN, {"options": {"threads": 2, "arithmetic": "exact"}, "prompt": PROMPT, "tokens": TOKENS})
    finally:
        httpd.shutdown()
    assert got["isolated"] is False
    assert got["threads"]["count"] == 1
    assert "not cross-origin isolated" in got["threads"]["reason"]
    assert len(got["ids"]) == TOKENS
