"""End-to-end: examples/pyscript (ruvllm from Python in a PyScript page) in Debian's Chromium. PyScript
(from npm) starts the local Pyodide, micropip installs the wheels of pyscript.json, and chat.py loads the
demo GGUF by URL with ruvllm.load_async and streams a chat answer into the page: its ids are CPython's.

Needs a local Pyodide distribution (docs/pyodide.md) and skips, saying so, without one.
"""

from __future__ import annotations

import json

import pytest

from e2e_support import CHROMIUM, PYODIDE_MARKS, ROOT, demo_server, serve, url_of

pytestmark = PYODIDE_MARKS
QUESTION = "What is the capital of France?"


@pytest.fixture
def browser():
    """A fresh Chromium for each test: PyScript runs Python on the page's main thread, and in one run of
    the whole suite the pages after the first crashed in a shared browser (Target crashed); alone, or
    each in its own browser, they pass. Each test's browser is its own."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=serve.CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    if not (ROOT / "node_modules" / "@pyscript" / "core" / "dist" / "core.js").exists():
        pytest.fail("PyScript is missing: npm ci at the top of the repository installs it (./build.sh test does)")
    with demo_server() as httpd:
        yield httpd


@pytest.fixture(scope="module")
def base_url(server):
    return url_of(server)


def answer_of(browser, url: str, context=None) -> tuple[dict, str]:
    own = context is None
    context = context or browser.new_context()
    page = context.new_page()
    page.goto(url)
    page.wait_for_function("window.__result !== undefined", timeout=300_000)
    result = json.loads(page.evaluate("window.__result"))
    shown = page.locator("#answer").inner_text()
    page.close()
    if own:
        context.close()
    assert "error" not in result, result["error"]
    return result, shown


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_a_pyscript_page_loads_a_gguf_by_url_and_streams_cpython_s_answer(kind, browser, base_url, smollm2_gguf):
    """A chat answer (the chat template in jinja2, the text in plain Python) and a raw continuation."""
    from ruvllm import load

    query = f"q={QUESTION.replace(' ', '+')}" if kind == "chat" else "text=Once+upon+a+time"
    result, shown = answer_of(browser, f"{base_url}examples/pyscript/?{query}&arithmetic=exact")
    model = load(str(smollm2_gguf), kernels="numpy")
    if kind == "chat":
        expected = list(model.chat([{"role": "user", "content": QUESTION}], temperature=0, max_tokens=48))
    else:
        expected = list(model.generate("Once upon a time", temperature=0, max_tokens=24))
    assert result["kernels"] == "wasm"
    assert result["ids"] == [c.token_id for c in expected]
    assert result["text"] == "".join(c.text for c in expected)
    assert shown.strip() == result["text"].strip()
    if kind == "chat":
        assert "Paris" in result["text"]


def test_a_second_visit_takes_the_gguf_from_the_cache_api(browser, server, base_url):
    """load_async keeps a file read to its end in the page's Cache API (the npm package's store): the
    next visit of the same browser reads it from there, and the server is not asked again."""
    gguf = "/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
    url = f"{base_url}examples/pyscript/?model={gguf}&text=Once+upon+a+time"
    context = browser.new_context()
    before = server.requests[gguf]
    first, _ = answer_of(browser, url, context)
    page = context.new_page()
    page.goto(base_url + "examples/pyscript/missing-page")  # (same origin: its caches)
    stored = page.evaluate("caches.open('ruvllm-models-v1').then((c) => c.keys()).then((k) => k.map((r) => r.url))")
    second, _ = answer_of(browser, url, context)
    context.close()
    assert stored == [base_url.rstrip("/") + gguf]
    assert server.requests[gguf] == before + 1  # the second visit did not ask the server
    assert second["ids"] == first["ids"]


def test_the_page_shows_chat_py_and_says_why_it_cannot_start_when_pyscript_is_missing(browser, base_url):
    """Before `./build.sh serve` built PyScript, /pyscript/core.js was a 404 and the page said 'Starting
    Python...' for ever; it also promised 'the Python below (chat.py)' and showed none."""
    context = browser.new_context()
    context.route("**/pyscript/core.js", lambda route: route.fulfill(status=404, body="not found"))
    page = context.new_page()
    page.goto(f"{base_url}examples/pyscript/")
    page.wait_for_function("document.getElementById('status').className === 'error'", timeout=60_000)
    status = page.text_content("#status")
    assert status.startswith("Could not load /pyscript/core.js, so Python cannot start. Run ./build.sh serve")
    page.wait_for_function("document.getElementById('source').textContent.includes('import ruvllm')")
    assert page.text_content("#source") == (ROOT / "examples" / "pyscript" / "chat.py").read_text()
    context.close()
