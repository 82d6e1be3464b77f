"""Serve the demo on 127.0.0.1: the page (web/), the npm package (npm/), the converted models (models/),
the GGUF files of build/downloads/ (under /gguf/), the examples (examples/: /examples/pyscript/ is ruvllm
from Python in a PyScript page) and, when one is on disk, a local Pyodide distribution (else the page uses
the official CDN).

    python web/serve.py [--port 8000]

Every response carries COOP/COEP headers (cross-origin isolation) and the right MIME types for .mjs and
.wasm. `/config.json` tells the page the models it can pick (those on disk when it is asked: a model
fetched while the server runs is listed at once), the default one and where Pyodide is;
`/examples/pyscript/pyscript.json` tells PyScript where Pyodide is and which wheels to install (the ones
on disk: `./build.sh serve` makes them).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "/models/smollm2-135m-instruct/"
# The models the page's picker lists, when they are on disk: (name, URL, path under the repository, mode).
# The mode is how the page uses the model: "chat" (through its chat template) or "completion" (it continues
# the visitor's text: a base model, which was not trained to chat).
MODELS = (
    (
        "SmolLM2-135M-Instruct (chat)",
        DEFAULT_MODEL,
        "models/smollm2-135m-instruct/config.json",
        "chat",
    ),
    (
        "Gemma 3 270M base (text completion)",
        "/gguf/gemma-3-270m-q4_k_m.gguf",
        "build/downloads/gemma-3-270m-q4_k_m.gguf",
        "completion",
    ),
)
PYODIDE_VERSION = "314.0.1"
PYODIDE_CDN = f"https://cdn.jsdelivr.net/pyodide/v{PYODIDE_VERSION}/full/"  # the npm package's default too
# Debian's chromium in this sandbox, headless, as the browser tests and benchmarks drive it.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def local_pyodide() -> Path | None:
    """RUVLLM_PYODIDE_DIST, else ~/.cache/ruvllm/pyodide/<version>, if it holds a distribution."""
    candidate = os.environ.get("RUVLLM_PYODIDE_DIST") or Path.home() / ".cache" / "ruvllm" / "pyodide" / PYODIDE_VERSION
    path = Path(candidate)
    return path if (path / "pyodide.asm.wasm").exists() and (path / "pyodide-lock.json").exists() else None


class DemoServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, pyodide: Path | None) -> None:
        self.mounts = {
            "/npm/": ROOT / "npm",
            "/models/": ROOT / "models",
            "/gguf/": ROOT / "build" / "downloads",
            # examples/pyscript: PyScript from npm (the top package.json) and the wheels micropip installs
            "/examples/": ROOT / "examples",
            "/pyscript/": ROOT / "node_modules" / "@pyscript" / "core" / "dist",
            "/pyodide-wheels/": ROOT / "build" / "pyodide-wheels",
            "/": ROOT / "web",
        }
        if pyodide is not None:
            self.mounts = {"/pyodide/": pyodide, **self.mounts}
        self.pyodide = pyodide
        self.requests: Counter[str] = Counter()  # path -> GET count, for tests
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), DemoHandler)

    def config(self) -> dict:
        """What the page can pick, looked at now (a model fetched by `./build.sh gemma` while the server runs
        is listed without a restart)."""
        on_disk = [(name, url, mode) for name, url, path, mode in MODELS if (ROOT / path).exists()]
        models = [{"name": name, "url": url, "mode": mode} for name, url, mode in on_disk]
        return {"model": DEFAULT_MODEL, "models": models, "pyodideIndexURL": "/pyodide/" if self.pyodide else None}

    def pyscript_config(self) -> dict:
        """examples/pyscript's PyScript config: the local Pyodide or the CDN's, and the wheels micropip
        installs (jinja2 and MarkupSafe as ./build.sh makes them, then ours, as npm/wheel/manifest.json names it)."""
        index = "/pyodide/" if self.pyodide else PYODIDE_CDN
        wheels = sorted(p.name for p in (ROOT / "build" / "pyodide-wheels").glob("*.whl"))
        ours = ROOT / "npm" / "wheel" / "manifest.json"
        packages = [f"/pyodide-wheels/{name}" for name in sorted(wheels, key=lambda n: not n.startswith("markupsafe"))]
        if ours.exists():
            packages.append(f"/npm/wheel/{json.loads(ours.read_text())['file']}")
        return {"interpreter": f"{index}pyodide.mjs", "packages_cache": "never", "packages": packages}


class DemoHandler(SimpleHTTPRequestHandler):
    server: DemoServer
    extensions_map: ClassVar[dict[str, str]] = {
        **SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
        ".json": "application/json",
        ".safetensors": "application/octet-stream",
        ".whl": "application/zip",
        ".zip": "application/zip",
    }

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.server.lock:
            self.server.requests[path] += 1
        made = {"/config.json": self.server.config, "/examples/pyscript/pyscript.json": self.server.pyscript_config}
        if path in made:
            body = json.dumps(made[path]()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def translate_path(self, path: str) -> str:
        path = unquote(urlsplit(path).path)
        if path.startswith("/gguf/") and not path.endswith(".gguf"):  # only the GGUF files of build/downloads
            return str(ROOT / "web" / "__not_found__")
        for prefix, folder in self.server.mounts.items():
            if path.startswith(prefix):
                target = (folder / path[len(prefix) :]).resolve()
                if target == folder.resolve() or folder.resolve() in target.parents:
                    return str(target)
        return str(ROOT / "web" / "__not_found__")

    def log_message(self, format: str, *args: object) -> None:  # quiet: the page is the interface
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    pyodide = local_pyodide()
    try:
        server = DemoServer(args.port, pyodide)
    except OSError as e:  # the port is taken (or not ours to take): one line, not a traceback
        why = e.strerror or e
        raise SystemExit(f"cannot serve on 127.0.0.1:{args.port} ({why}): pick another with --port N") from None
    where = f"local Pyodide from {pyodide}" if pyodide else f"Pyodide {PYODIDE_VERSION} from the official CDN"
    print(f"ruvllm demo: http://127.0.0.1:{server.server_address[1]}/  ({where}; Ctrl+C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
