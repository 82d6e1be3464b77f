"""`threads` in the browser: the npm package's browser build in Debian's Chromium, driven by Playwright.

On a cross-origin isolated page (web/serve.py sends COOP/COEP) one, two and three threads compute and
the greedy tokens (exact arithmetic) equal CPython's, and the fast arithmetic (through the relaxed SIMD
build) gives the same tokens at one and two threads; on a page without those headers one thread runs,
the model still answers, and `info.threads.reason` says why. Needs a local Pyodide distribution (as
tests/test_e2e.py) and the built kernels and browser bundle (npm/browser, npm/wasm).
"""

from __future__ import annotations

import json
import subprocess
import sys
from http.server import SimpleHTTPRequestHandler

import pytest

from e2e_support import PYODIDE_MARKS, ROOT, demo_server, serve, url_of

MODEL = ROOT / "models" / "smollm2-135m-instruct"
PROMPT = "The three primary colors are"
TOKENS = 12

BUILT = (ROOT / "npm" / "browser" / "worker" / "pool-worker.js").exists() and (
    ROOT / "npm" / "wasm" / "kernels-shared.wasm"
).exists()
RELAXED_BUILT = (ROOT / "npm" / "wasm" / "kernels-relaxed-shared.wasm").exists()  # (build.sh: with clang-19)
pytestmark = [
    *PYODIDE_MARKS,
    pytest.mark.skipif(not BUILT, reason="the browser bundle or the kernels are not built (./build.sh npm)"),
]

# Loads the model with the given options, generates greedily and answers {ids, threads, relaxed, isolated}.
RUN = """async ({ options, prompt, tokens }) => {
    const { RuvLLM } = await import('/npm/browser/index.js');
    const llm = await RuvLLM.load({ model: '/models/smollm2-135m-instruct/', pyodide: { indexURL: '/pyodide/' },
        cache: false, ...options });
    const ids = [];
    for await (const chunk of llm.generate(prompt, { temperature: 0, maxTokens: tokens, ignoreEos: true }))
        ids.push(chunk.tokenId);
    const { threads, relaxedSimd } = llm.info;
    await llm.dispose();
    return { ids, threads, relaxed: relaxedSimd, isolated: self.crossOriginIsolated };
}"""


class PlainHandler(serve.DemoHandler):
    """The demo server's files without the cross-origin isolation headers."""

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-cache")
        SimpleHTTPRequestHandler.end_headers(self)


@pytest.fixture(scope="module")
def page(browser):
    return browser.new_page()


def cpython_ids() -> list[int]:
    args = [sys.executable, "-m", "ruvllm", "generate", str(MODEL), "--prompt", PROMPT, "--temperature", "0"]
    args += ["--max-tokens", str(TOKENS), "--ignore-eos", "--json"]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)["token_ids"]


def test_an_isolated_page_runs_one_two_and_three_threads_with_cpythons_tokens(page, smollm2_dir):
    expected = cpython_ids()
    with demo_server() as httpd:
        page.goto(url_of(httpd) + "npm/README.md")
        for threads in (1, 2, 3):
            options = {"threads": threads, "arithmetic": "exact"}
            got = page.evaluate(RUN, {"options": options, "prompt": PROMPT, "tokens": TOKENS})
            assert got["isolated"] is True
            assert got["threads"]["count"] == threads and got["threads"]["adaptive"] is False, got["threads"]
            assert (got["threads"]["reason"] is None) == (threads > 1), got["threads"]
            assert got["ids"] == expected, f"{threads} threads"
        # the fast arithmetic (the default) through the relaxed SIMD build, which Chromium validates and
        # whose known-answer test passes here, and the pool's twin of it: the same bits at 1 and 2 threads
        fast = [page.evaluate(RUN, {"options": {"threads": n}, "prompt": PROMPT, "tokens": TOKENS}) for n in (1, 2)]
        assert [got["relaxed"] for got in fast] == [RELAXED_BUILT] * 2
        assert [got["threads"]["count"] for got in fast] == [1, 2]
        assert fast[0]["ids"] == fast[1]["ids"] == expected  # (fast's tokens equal CPython's here: measured)


def test_a_page_that_is_not_isolated_runs_one_thread_and_says_why(page, smollm2_dir):
    with demo_server(PlainHandler) as httpd:
        page.goto(url_of(httpd) + "npm/README.md")
        got = page.evaluate(RUN, {"options": {"threads": 2, "arithmetic": "exact"}, "prompt": PROMPT, "tokens": TOKENS})
    assert got["isolated"] is False
    assert got["threads"]["count"] == 1
    assert "not cross-origin isolated" in got["threads"]["reason"]
    assert len(got["ids"]) == TOKENS
