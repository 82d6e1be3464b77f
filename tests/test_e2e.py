"""End-to-end: the demo page in Debian's Chromium, driven by Playwright, against the CPython engine.

Needs a local Pyodide distribution (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1; see
docs/pyodide.md) and skips, saying so, without one. Screenshots go to test-artifacts/e2e/.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "e2e"
CHROMIUM = "/usr/bin/chromium"
WEIGHTS = "/models/smollm2-135m-instruct/model.safetensors"
LOAD_TIMEOUT_MS = 180_000

_spec = importlib.util.spec_from_file_location("demo_serve", ROOT / "web" / "serve.py")
serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve)

DIST = serve.local_pyodide()
pytestmark = pytest.mark.skipif(
    DIST is None,
    reason="no local Pyodide distribution: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy "
    "(docs/pyodide.md says how to make one)",
)


@pytest.fixture(scope="module")
def server(smollm2_dir):
    httpd = serve.DemoServer(0, DIST)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


@pytest.fixture(scope="module")
def base_url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), (
        "Debian's chromium is missing: ./build.sh test installs it (apt-get install chromium)"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=serve.CHROMIUM_ARGS)
        yield browser
        browser.close()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def open_demo(browser, url: str):
    """A fresh browser context (empty caches) on the page, not yet waited for."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(url)
    return context, page


def wait_state(page, state: str, timeout: int = LOAD_TIMEOUT_MS) -> None:
    page.wait_for_selector(f'[data-testid=status][data-state="{state}"]', timeout=timeout)


def watch_output(page) -> None:
    """Record every text the last assistant message shows, as it streams."""
    page.evaluate(
        """() => {
            window.__snapshots = [];
            new MutationObserver(() => {
                const out = document.querySelector('[data-testid=output]');
                if (out) window.__snapshots.push(out.textContent);
            }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
        }"""
    )


def ask(page, prompt: str) -> None:
    page.fill("[data-testid=prompt]", prompt)
    page.press("[data-testid=prompt]", "Enter")
    wait_state(page, "generating", 10_000)


def cpython_chat(prompt: str, max_tokens: int) -> str:
    args = [sys.executable, "-m", "ruvllm", "generate", str(ROOT / "models" / "smollm2-135m-instruct"), "--chat"]
    args += ["--prompt", prompt, "--temperature", "0", "--max-tokens", str(max_tokens), "--json"]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)["text"]


@pytest.fixture(scope="module")
def demo(browser, base_url):
    """One page with the model loaded, shared by the chat tests (loading takes several seconds)."""
    context, page = open_demo(browser, base_url)
    page.evaluate(
        """() => {
            window.__progress = [];
            new MutationObserver(() => window.__progress.push(document.querySelector('[data-testid=progress]').value))
                .observe(document.querySelector('[data-testid=progress]'), { attributes: true });
        }"""
    )
    wait_state(page, "ready")
    shot(page, "loaded")
    page.fill("[data-testid=temperature]", "0")
    yield page
    context.close()


def test_the_model_loads_and_progress_reaches_100(demo):
    assert demo.get_attribute("[data-testid=progress]", "value") == "100"
    assert "92.2 MiB (100%)" in demo.text_content("#progress-text")
    assert demo.text_content("[data-testid=status]").startswith("Ready")
    assert demo.is_enabled("[data-testid=prompt]") and demo.is_enabled("[data-testid=send]")
    assert not demo.is_enabled("[data-testid=stop]")


def test_a_greedy_answer_streams_and_equals_cpython(demo):
    demo.click("[data-testid=clear]")
    demo.fill("[data-testid=max-tokens]", "40")
    watch_output(demo)
    prompt = "Write a short poem about the sea."
    ask(demo, prompt)
    wait_state(demo, "ready")
    shot(demo, "finished")
    final = demo.text_content("[data-testid=output]")
    snapshots = [s for s in demo.evaluate("window.__snapshots") if s]
    assert len(set(snapshots)) >= 5, "the answer arrived all at once"
    assert all(final.startswith(s) for s in snapshots), "the output only ever grows"
    assert final == cpython_chat(prompt, 40)
    assert "tok/s" in demo.text_content("[data-testid=stats]")


def test_a_second_prompt_continues_the_same_chat(demo, smollm2):
    demo.click("[data-testid=clear]")
    demo.fill("[data-testid=max-tokens]", "24")
    ask(demo, "What is the capital of France?")
    wait_state(demo, "ready")
    first = demo.text_content("[data-testid=output]")
    ask(demo, "And what is its most famous tower?")
    wait_state(demo, "ready")
    second = demo.text_content("[data-testid=output]")
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "And what is its most famous tower?"},
    ]
    expected = "".join(c.text for c in smollm2.chat(messages, temperature=0, max_tokens=24))
    assert second == expected
    assert len(demo.query_selector_all("#messages li")) == 4


def test_stop_ends_the_stream_within_a_second_and_the_next_prompt_works(demo):
    demo.click("[data-testid=clear]")
    demo.fill("[data-testid=max-tokens]", "400")
    ask(demo, "Write a long story about a dragon who learns to cook.")
    demo.wait_for_function("document.querySelector('[data-testid=output]').textContent.length > 20", timeout=60_000)
    started = time.monotonic()
    demo.click("[data-testid=stop]")
    wait_state(demo, "ready", 5_000)
    assert time.monotonic() - started < 1.0
    stopped = demo.text_content("[data-testid=output]")
    demo.wait_for_timeout(700)
    assert demo.text_content("[data-testid=output]") == stopped, "text kept arriving after Stop"
    demo.fill("[data-testid=max-tokens]", "16")
    ask(demo, "Thank you!")
    wait_state(demo, "ready", 60_000)
    assert demo.text_content("[data-testid=output]").strip()
    assert len(demo.query_selector_all("#messages li")) == 4


def test_clear_chat_during_an_answer_starts_a_fresh_chat(demo):
    demo.click("[data-testid=clear]")
    demo.fill("[data-testid=max-tokens]", "400")
    ask(demo, "Write a long story about a dragon who learns to cook.")
    demo.wait_for_function("document.querySelector('[data-testid=output]').textContent.length > 20", timeout=60_000)
    demo.click("[data-testid=clear]")
    wait_state(demo, "ready", 5_000)
    demo.fill("[data-testid=max-tokens]", "16")
    ask(demo, "What is the capital of France?")
    wait_state(demo, "ready", 60_000)
    assert demo.text_content("[data-testid=output]") == cpython_chat("What is the capital of France?", 16)
    assert len(demo.query_selector_all("#messages li")) == 2


def test_a_reload_takes_the_weights_from_the_cache_api(browser, base_url, server):
    before = server.requests[WEIGHTS]
    context, page = open_demo(browser, base_url)
    wait_state(page, "ready")
    assert server.requests[WEIGHTS] == before + 1
    page.reload()
    wait_state(page, "ready")
    assert server.requests[WEIGHTS] == before + 1, "the weights were downloaded again"
    assert "from the browser cache" in page.text_content("[data-testid=status]")
    context.close()


def test_a_bad_model_url_shows_a_readable_error(browser, base_url):
    context, page = open_demo(browser, base_url + "?model=/models/no-such-model/")
    wait_state(page, "error", 60_000)
    message = page.text_content("[data-testid=status]")
    assert message.startswith("Could not download the model: config.json:")
    assert "/models/no-such-model/config.json answered HTTP 404" in message
    assert page.is_disabled("[data-testid=send]")
    shot(page, "bad-model")
    context.close()


def test_feedback_teaches_the_model_and_the_adapter_downloads(demo, tmp_path):
    import zipfile

    demo.click("[data-testid=clear]")
    demo.fill("[data-testid=max-tokens]", "16")
    ask(demo, "What is the secret code?")
    wait_state(demo, "ready")
    assert demo.is_disabled("[data-testid=download-adapter]")
    demo.click("[data-testid=thumbs-up]")
    wait_state(demo, "learning", 10_000)
    wait_state(demo, "ready", 120_000)
    report = demo.text_content("[data-testid=learning]")
    assert report.startswith("Learned (good answer): log-probability of that answer ")
    before, after = (float(v) for v in report.split("answer ")[1].split(" in ")[0].split(" → "))
    assert after > before
    assert demo.get_attribute("[data-testid=thumbs-up]", "aria-pressed") == "true"
    with demo.expect_download() as download:
        demo.click("[data-testid=download-adapter]")
    path = tmp_path / "adapter.zip"
    download.value.save_as(path)
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
            "learning_state.safetensors",
        ]
        assert json.loads(z.read("adapter_config.json"))["target_modules"] == ["down_proj"]
        z.extractall(tmp_path / "adapter")
    # the downloaded adapter works on CPython
    args = [sys.executable, "-m", "ruvllm", "generate", str(ROOT / "models" / "smollm2-135m-instruct"), "--chat"]
    result = subprocess.run(
        [*args, "--prompt", "Hi", "--max-tokens", "4", "--adapter", str(tmp_path / "adapter")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    shot(demo, "learned")
