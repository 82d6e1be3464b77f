"""The README's main command, `./build.sh serve`, as a newcomer meets it (issue 35): it builds what every
page it serves needs (the PyScript example's PyScript and wheels too, which only `./build.sh test` made),
lists a model fetched while it runs, says in one line when its port is taken, and keeps the wheel (same
inputs, same bytes) so that a restart does not invalidate the page's boot snapshot."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_build_sh_serve_serves_every_file_the_pyscript_example_needs(smollm2_dir):
    """After `./build.sh serve` alone, /pyscript/core.js and the wheels were 404 and the page said nothing."""
    port = free_port()
    env = {**os.environ, "RUVLLM_VENV": str(Path(sys.executable).parent.parent)}
    server = subprocess.Popen(
        ["bash", str(ROOT / "build.sh"), "serve", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):  # the build, when something is stale (a hang guard, not a timing)
            try:
                if get(f"{base}/config.json")[0] == 200:
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                time.sleep(0.25)
        page = get(f"{base}/examples/pyscript/")[1].decode()
        needed = re.findall(r'(?:src|href)="(/[^"]+)"', page)
        assert "/pyscript/core.js" in needed and "/pyscript/core.css" in needed
        config = json.loads(get(f"{base}/examples/pyscript/pyscript.json")[1])
        names = [p.rsplit("/", 1)[-1] for p in config["packages"]]
        assert [n.split("-")[0] for n in names] == ["markupsafe", "jinja2", "ruvllm"], names
        for path in [*needed, *config["packages"], "/examples/pyscript/chat.py"]:
            assert get(base + path)[0] == 200, path
        interpreter = config["interpreter"]
        assert interpreter == "/pyodide/pyodide.mjs" or interpreter.startswith("https://cdn.jsdelivr.net/pyodide/")
        if interpreter.startswith("/"):
            assert get(base + interpreter)[0] == 200
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_port_in_use_is_one_line_not_a_traceback():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, str(ROOT / "web" / "serve.py"), "--port", str(port)], capture_output=True, text=True
        )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"cannot serve on 127.0.0.1:{port} (Address already in use): pick another with --port N"
    )


def test_a_model_that_arrives_while_the_server_runs_is_listed_without_a_restart(tmp_path, monkeypatch):
    """`./build.sh gemma` while the demo runs: Gemma was listed only after a restart."""
    from e2e_support import demo_server, serve, url_of

    arriving = tmp_path / "late.gguf"
    monkeypatch.setattr(serve, "MODELS", (*serve.MODELS, ("Late", "/gguf/late.gguf", str(arriving), "completion")))
    with demo_server() as httpd:
        names = lambda: [m["name"] for m in json.loads(get(f"{url_of(httpd)}config.json")[1])["models"]]  # noqa: E731
        assert "Late" not in names()
        arriving.write_bytes(b"GGUF")
        assert "Late" in names()


def test_the_wheel_build_sh_makes_is_the_same_bytes_from_the_same_sources(tmp_path):
    """Every restart of `serve` rebuilt the wheel with a new hash (12.7 s to a page that took 4.7 s from its
    boot snapshot): build.sh now builds it only when its inputs change, with SOURCE_DATE_EPOCH fixed. Two
    builds of these sources, as build.sh runs pip, give the bytes of the wheel it made; and once made,
    `./build.sh wheel` leaves it alone."""
    env = {**os.environ, "RUVLLM_VENV": str(Path(sys.executable).parent.parent)}
    build = ["bash", str(ROOT / "build.sh"), "wheel"]
    subprocess.run(build, cwd=ROOT, env=env, check=True, capture_output=True)  # (CI: made already; a no-op)
    again = subprocess.run(build, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    assert "building the ruvllm wheel" not in again.stderr
    shipped = json.loads((ROOT / "npm" / "wheel" / "manifest.json").read_text())
    epoch = re.search(r"SOURCE_DATE_EPOCH=(\d+)", (ROOT / "build.sh").read_text())
    assert epoch and "inputs" in shipped
    digests = []
    for i in range(2):
        out = tmp_path / str(i)
        env = {**os.environ, "SOURCE_DATE_EPOCH": epoch.group(1)}
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", out, "."]
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
        (wheel,) = out.glob("ruvllm-*.whl")
        digests.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
    assert digests[0] == hashlib.sha256((ROOT / "npm" / "wheel" / shipped["file"]).read_bytes()).hexdigest()


def test_a_clang_named_by_the_clang_variable_that_cannot_build_webassembly_is_refused_by_name():
    """Off Debian (issue 35): CLANG names the kernels' compiler (Homebrew's on macOS). One that cannot build
    a WebAssembly SIMD module is an error that names it, before anything is compiled or installed."""
    before = {p.name: p.stat().st_mtime_ns for p in (ROOT / "npm" / "wasm").glob("*.wasm")}
    done = subprocess.run(
        ["bash", str(ROOT / "build.sh"), "kernels"], cwd=ROOT, env={**os.environ, "CLANG": "/bin/false"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1
    assert "CLANG=/bin/false cannot build a WebAssembly SIMD module (it needs the wasm32 target and wasm-ld)" in (
        done.stderr
    )
    assert {p.name: p.stat().st_mtime_ns for p in (ROOT / "npm" / "wasm").glob("*.wasm")} == before
