"""End-to-end: the boot snapshot in Debian's Chromium (npm/src/worker/snapshot.js): a first visit saves it
in the Cache API, a second visit of the same browser restores Python from it and answers the same, and
bootCache: false starts Python afresh. Driven by Playwright on a small page of the test's own (the npm
package's browser bundle, served by web/serve.py).

Needs a local Pyodide distribution (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1; see
docs/pyodide.md) and skips, saying so, without one.
"""

from __future__ import annotations

import pytest

from e2e_support import PYODIDE_MARKS, demo_server, url_of

pytestmark = PYODIDE_MARKS

# ?bootCache=false turns the snapshot off; window.__result = { boot, text } or { error }.
PAGE = """<!doctype html>
<meta charset="utf-8">
<script type="module">
import { RuvLLM } from '/npm/browser/index.js';
const q = new URLSearchParams(location.search);
try {
  const llm = await RuvLLM.load({
    model: '/models/smollm2-135m-instruct/',
    pyodide: { indexURL: '/pyodide/' },
    bootCache: q.get('bootCache') !== 'false',
  });
  let text = '';
  for await (const c of llm.generate('Once upon a time', { temperature: 0, maxTokens: 8, ignoreEos: true }))
    text += c.text;
  window.__result = { boot: llm.info.boot, text, caches: await caches.keys() };
  await llm.dispose();
} catch (error) {
  window.__result = { error: String(error) };
}
</script>
"""


@pytest.fixture(scope="module")
def base_url(smollm2_dir):
    with demo_server() as httpd:
        yield url_of(httpd)


def visit(page, url: str) -> dict:
    page.goto(url)
    page.wait_for_function("window.__result !== undefined", timeout=300_000)
    result = page.evaluate("window.__result")
    assert "error" not in result, result["error"]
    return result


def test_a_second_visit_starts_python_from_the_snapshot_and_answers_the_same(browser, base_url):
    context = browser.new_context()  # empty caches: a first visit
    context.route(f"{base_url}boot-test.html*", lambda route: route.fulfill(body=PAGE, content_type="text/html"))
    page = context.new_page()
    first = visit(page, f"{base_url}boot-test.html")
    assert (first["boot"]["from"], first["boot"]["cache"], first["boot"]["note"]) == ("fresh", "saved", None)
    assert "ruvllm-boot-v1" in first["caches"]

    second = visit(page, f"{base_url}boot-test.html")
    assert (second["boot"]["from"], second["boot"]["cache"], second["boot"]["note"]) == ("snapshot", "restored", None)
    assert second["text"] == first["text"]

    off = visit(page, f"{base_url}boot-test.html?bootCache=false")
    assert (off["boot"]["from"], off["boot"]["cache"]) == ("fresh", "off")
    assert off["text"] == first["text"]
    context.close()
