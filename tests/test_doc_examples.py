"""The examples of the README and docs/, run as written (issue 35: a newcomer copies them straight from
the docs, and several broke): the README's Python snippet, its commands, its server example with the
official `openai` client, docs/serve.md's snippets, and docs/pyodide.md's notebook cell in a plain
Pyodide. What is changed, and only that: the port of a server (a free one, not 8080 or 8000), and the
working folder (a fresh one, with the repository's models/, build/ and benchmarks/ linked in, so the
examples' outputs land there). The npm README's snippets run in npm/test/readme.test.js.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUVLLM = [sys.executable, "-m", "ruvllm"]
# README commands that name files the reader supplies (a hub repo of theirs, their own GGUF and template)
PLACEHOLDERS = ("hf:OWNER/", "my.gguf")


def blocks(document: str, language: str) -> list[str]:
    text = (ROOT / document).read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def block(document: str, language: str, holding: str) -> str:
    """The one ```language block of `document` that holds `holding`."""
    found = [b for b in blocks(document, language) if holding in b]
    assert len(found) == 1, f"{document}: {len(found)} {language} blocks hold {holding!r}"
    return found[0]


@pytest.fixture
def workdir(tmp_path, smollm2_dir, gemma_gguf, monkeypatch) -> Path:
    """A fresh working folder as the examples expect one: models/ (the demo model), build/, benchmarks/."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / smollm2_dir.name).symlink_to(smollm2_dir)
    (tmp_path / "build").symlink_to(ROOT / "build")
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUVLLM_CACHE_DIR", str(tmp_path / "cache"))  # `ruvllm list` looks at a cache of its own
    monkeypatch.delenv("RUVLLM_MODELS_DIR", raising=False)
    return tmp_path


def run_python(code: str) -> tuple[dict, str]:
    """Run a snippet in this process; (its variables, what it printed). The value of a last bare
    expression is kept as `_` (what an interactive session would show)."""
    tree = ast.parse(code)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        target = ast.Name("_", ast.Store())
        tree.body[-1] = ast.copy_location(ast.Assign([target], tree.body[-1].value), tree.body[-1])
        ast.fix_missing_locations(tree)
    scope: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(tree, "<example>", "exec"), scope)
    return scope, printed.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(command: str, port: int):
    """`ruvllm serve ...` as a documented command gives it, on `port`; yields once /health answers."""
    args = shlex.split(command, comments=True)
    assert args[:2] == ["ruvllm", "serve"], args
    if "--port" in args:
        args[args.index("--port") + 1] = str(port)
    else:
        args += ["--port", str(port)]
    server = subprocess.Popen([*RUVLLM, *args[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                time.sleep(0.1)
        yield
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_readme_python_snippet_chats_learns_and_mixes(workdir):
    code = block("README.md", "python", "ruvllm.load(")
    scope, printed = run_python(code)
    assert "Paris" in printed and scope["chunk"].finish_reason == "stop"
    assert sorted(os.listdir(workdir / "adapters" / "facts")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "learning_state.safetensors",
    ]
    model = scope["model"]
    assert {a["name"] for a in model.list_adapters()} == {"facts", "polite", "both"}
    assert scope["lesson"].done


def test_the_readme_commands_run_as_written(workdir):
    """Every `ruvllm ...` line of the README's command block, in order (outputs go to the fresh folder),
    each exit 0; a few outputs checked: the lesson took, the adapter merged."""
    commands = block("README.md", "bash", "ruvllm convert")
    outputs = {}
    for line in commands.splitlines():
        if not line.startswith("ruvllm ") or any(p in line for p in PLACEHOLDERS):
            continue
        args = shlex.split(line, comments=True)
        if args[1] == "chat":  # interactive: a question, then /quit
            done = subprocess.run([*RUVLLM, *args[1:]], input="Hi\n/quit\n", capture_output=True, text=True)
        else:
            done = subprocess.run([*RUVLLM, *args[1:]], capture_output=True, text=True)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        outputs[line.split("#")[0].strip()] = done.stdout
    assert len(outputs) >= 15
    taught = [out for line, out in outputs.items() if "--adapter adapters/code" in line]
    assert taught and "BLUE-42" in taught[0]
    assert (workdir / "models" / "smollm2-facts" / "config.json").exists()
    assert (workdir / "models" / "my-smollm2" / "config.json").exists()


def test_the_readme_server_example_with_the_openai_client(workdir):
    """It ran ten minutes (3,880 tokens of undeclared keys) before issue 35: now only the declared
    property is written and the answer ends by itself."""
    pytest.importorskip("openai")
    code = block("README.md", "python", "from openai import OpenAI")
    command = re.search(r"# after: (ruvllm serve .*)", code)
    assert command
    port = free_port()
    with serving(command.group(1), port):
        scope, _ = run_python(code.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
    answer = scope["_"]
    document = json.loads(answer.choices[0].message.content)
    assert list(document) == ["name"] and isinstance(document["name"], str)
    assert answer.choices[0].finish_reason == "stop" and answer.usage.completion_tokens <= 512


def test_the_serve_docs_python_snippet(workdir):
    code = block("docs/serve.md", "python", "ruvllm.load(")
    scope, printed = run_python(code)
    assert scope["answer"]["choices"][0]["message"]["content"] and "chat.completion.chunk" in printed
    assert scope["_"]["object"] == "text_completion"


def test_the_serve_docs_server_and_client(workdir):
    pytest.importorskip("openai")
    command = block("docs/serve.md", "bash", "ruvllm serve").splitlines()[-1]
    client = block("docs/serve.md", "python", "from openai import OpenAI")
    port = free_port()
    with serving(command, port):
        _, printed = run_python(client.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
    assert printed.strip()


@pytest.mark.pyodide
def test_the_pyodide_notebook_cell_runs_in_a_plain_pyodide(smollm2_gguf):
    """docs/pyodide.md's cell, after `./build.sh serve`: micropip installs our wheel by its URL (jinja2 comes
    with it; here from the offline wheels, as the CDN is out of reach), load_async reads the GGUF."""
    from e2e_support import DIST, demo_server, url_of
    from test_pyodide_package import WHEELS, in_pyodide

    if DIST is None or not WHEELS:
        pytest.skip("no local Pyodide distribution or offline wheels (docs/pyodide.md; ./build.sh test)")
    cell = block("docs/pyodide.md", "python", "micropip")
    wheel = re.search(r"/npm/wheel/([^\"]+\.whl)", cell)
    assert wheel and (ROOT / "npm" / "wheel" / wheel.group(1)).exists(), "the cell names the wheel ./build.sh makes"
    with demo_server() as httpd:
        code = cell.replace("http://127.0.0.1:8000/", url_of(httpd))
        printed = in_pyodide(
            "import contextlib, io\nprinted = io.StringIO()\nwith contextlib.redirect_stdout(printed):\n"
            + "\n".join("    " + line for line in code.splitlines())
            + "\nresult = printed.getvalue()",
            ours=False,
        )
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in printed  # the progress lines
    assert printed.rsplit("\r", 1)[-1].strip()  # and an answer after them
