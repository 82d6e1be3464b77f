"""What the browser tests share: the demo server (web/serve.py, loaded from its file), the local Pyodide
distribution they need (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1; docs/pyodide.md) and
the markers that skip them, saying why, without one. The `browser` fixture (Debian's Chromium driven by
Playwright) is in conftest.py.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"

_spec = importlib.util.spec_from_file_location("demo_serve", ROOT / "web" / "serve.py")
assert _spec is not None and _spec.loader is not None
serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve)

DIST = serve.local_pyodide()
PYODIDE_MARKS = [
    pytest.mark.e2e,
    pytest.mark.pyodide,
    pytest.mark.skipif(
        DIST is None,
        reason="no local Pyodide distribution: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy "
        "(docs/pyodide.md says how to make one)",
    ),
]


@contextmanager
def demo_server(handler: type | None = None) -> Iterator:
    """web/serve.py's server on 127.0.0.1 at a free port, serving the local Pyodide, in a thread
    (handler: another request handler class, e.g. one that leaves out the isolation headers)."""
    httpd = serve.DemoServer(0, DIST)
    if handler is not None:
        httpd.RequestHandlerClass = handler
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()


def url_of(httpd) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/"
