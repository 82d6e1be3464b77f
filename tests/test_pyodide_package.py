"""ruvllm as a Pyodide package (issue: the wheel alone in any Pyodide): a plain Pyodide under Node, as a
notebook has one (no npm package, no worker), installs the built wheel with micropip (NumPy from the
distribution's lock file, jinja2 and MarkupSafe from pure-Python wheels built offline) and runs the
engine there, its WebAssembly kernels started from Python (host.py).

Needs a local Pyodide distribution (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1; see
docs/pyodide.md) and the wheels `./build.sh wheel` and `./build.sh test` make; skips, saying so, without.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_support import DIST, demo_server, url_of

ROOT = Path(__file__).resolve().parent.parent
WHEELS = sorted((ROOT / "build" / "pyodide-wheels").glob("*.whl"))
OURS = sorted((ROOT / "build" / "wheel").glob("ruvllm-*.whl"))

pytestmark = [
    pytest.mark.pyodide,
    pytest.mark.skipif(
        DIST is None,
        reason="no local Pyodide distribution: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy "
        "(docs/pyodide.md says how to make one)",
    ),
    pytest.mark.skipif(
        not WHEELS or not OURS, reason="no wheels to install: ./build.sh wheel and ./build.sh test make them"
    ),
]


def in_pyodide(code: str, mounts: dict[str, str] | None = None, ours: bool = True) -> object:
    """Run `code` in a fresh plain Pyodide with our wheel installed (not with ours=False: jinja2 and
    MarkupSafe alone); its `result`, as JSON."""
    wheels = WHEELS + OURS if ours else WHEELS
    request = {"dist": str(DIST), "wheels": [str(w) for w in wheels], "mounts": mounts or {}, "code": code}
    done = subprocess.run(
        ["node", str(ROOT / "tests" / "plain_pyodide.mjs")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard: a run takes seconds
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in answer, answer["error"] + "\n" + done.stderr[-3000:]
    return answer["ok"]


def test_micropip_installs_the_wheel_and_its_kernels_start_from_python():
    """host.wasm_kernels compiles the wheel's kernels.wasm, passes the known answer, and its products
    on Pyodide's memory equal NumPy's float32 products (exact arithmetic: the same values, summed in
    another order)."""
    result = in_pyodide(
        """
import sys, numpy as np
from ruvllm import host
from ruvllm.quant.matrices import DenseMatrix
kernels, reason = host.wasm_kernels("exact")
rng = np.random.default_rng(0)
W = rng.standard_normal((67, 96), dtype=np.float32)
x = rng.standard_normal((3, 96), dtype=np.float32)
product = kernels.prepare(DenseMatrix(W, "einsum"))
result = {"platform": sys.platform, "reason": reason, "name": kernels.name,
          "error": float(np.abs(product(x) - x @ W.T).max()), "scale": float(np.abs(x @ W.T).max())}
"""
    )
    assert (result["platform"], result["reason"], result["name"]) == ("emscripten", None, "wasm")
    assert result["error"] <= 1e-5 * result["scale"]


# A prompt's ids (SmolLM2's tokens for a short story opening): ids, so that this needs no tokenizer.
PROMPT = [19556, 2056, 253, 655, 28, 665, 60, 253, 1345, 11127, 2631, 260]
GREEDY = """
from ruvllm import host
from ruvllm.runtime.assembly import open_model
from ruvllm.runtime.engine import Engine, LoadOptions
from ruvllm.runtime.generate import GenerationOptions, generate_tokens
provider, reason = host.wasm_kernels("exact") if KERNELS == "wasm" else (None, None)
options = LoadOptions(compute="q8", kernels=KERNELS, provider=provider)
engine = Engine.from_store(*open_model(MODEL), options)
steps = generate_tokens(engine, PROMPT, GenerationOptions.from_kwargs(max_tokens=16, temperature=0, ignore_eos=True))
result = {"ids": [s.token_id for s in steps], "kernels": engine.kernels, "arithmetic": engine.arithmetic}
"""


def test_greedy_ids_with_the_kernels_in_a_plain_pyodide_equal_cpython(smollm2_dir):
    code = f"MODEL, PROMPT, KERNELS = '/models/m', {PROMPT!r}, 'wasm'\n" + GREEDY
    got = in_pyodide(code, {"/models/m": str(smollm2_dir)})
    scope = {}
    exec(f"MODEL, PROMPT, KERNELS = {str(smollm2_dir)!r}, {PROMPT!r}, 'numpy'\n" + GREEDY, scope)
    assert (got["kernels"], got["arithmetic"]) == ("wasm", "exact")
    assert got["ids"] == scope["result"]["ids"]


@pytest.fixture(scope="module")
def base_url(smollm2_dir, smollm2_gguf):
    with demo_server() as httpd:  # web/serve.py: /models/ (model folders) and /gguf/ (build/downloads)
        yield url_of(httpd)


FETCHED = """
import json
from ruvllm import host
from ruvllm.runtime.engine import LoadOptions
from ruvllm.runtime.generate import GenerationOptions, generate_tokens
provider, _ = host.wasm_kernels("exact")
options = LoadOptions(compute="q8", kernels="wasm", provider=provider)
seen = []
fetched = await host.fetch_model(URL, options, seen.append)
engine = fetched.build()
steps = generate_tokens(engine, PROMPT, GenerationOptions.from_kwargs(max_tokens=16, temperature=0, ignore_eos=True))
result = {"ids": [s.token_id for s in steps], "files": sorted({p["file"] for p in seen}),
          "complete": all(p["loaded"] <= p["total"] for p in seen) and seen[-1]["loaded"] == seen[-1]["total"],
          "vocab": len(json.loads(fetched.tokenizer_files()[0])["model"]["vocab"])
                   if fetched.gguf is None else len(fetched.tokenizer_files()[0]["model"]["vocab"])}
"""


@pytest.mark.parametrize("where", ["gguf/SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2-135m-instruct"])
def test_a_model_fetched_by_url_computes_cpython_s_greedy_ids(where, base_url, smollm2_dir, smollm2_gguf):
    """host.fetch_model reads a GGUF file or a model folder (no trailing slash needed) over fetch, with
    progress per piece, and the engine built from it gives CPython's greedy ids for the same file."""
    got = in_pyodide(f"URL, PROMPT = {base_url + where!r}, {PROMPT!r}\n" + FETCHED)
    local = smollm2_gguf if where.endswith(".gguf") else smollm2_dir
    scope: dict = {}
    exec(f"MODEL, PROMPT, KERNELS = {str(local)!r}, {PROMPT!r}, 'numpy'\n" + GREEDY, scope)
    assert got["ids"] == scope["result"]["ids"]
    assert got["files"] == [where.rsplit("/", 1)[-1] if where.endswith(".gguf") else "model.safetensors"]
    assert got["complete"] and got["vocab"] == 49152


def test_fetching_refuses_a_model_that_cannot_fit_before_its_weights_and_names_missing_files(base_url):
    """The GGUF header is enough to refuse: the download stops with the header, before any tensor data
    is copied (no progress is reported: that counts the data); a missing file is a DownloadError with the
    URL and the HTTP status."""
    result = in_pyodide(
        f"""
from ruvllm import load_async, LoadError, DownloadError
seen, errors = [], []
try:
    await load_async({base_url + "gguf/SmolLM2-135M-Instruct.Q4_1.gguf"!r}, seen.append, memory_budget=10_000_000)
except LoadError as e:
    errors.append(str(e))
try:
    await load_async({base_url + "gguf/missing.gguf"!r})
except DownloadError as e:
    errors.append(str(e))
result = {{"errors": errors, "seen": seen}}
"""
    )
    refused, missing = result["errors"]
    assert "does not fit" in refused or "memory budget" in refused, refused
    assert result["seen"] == []  # stopped with the header: no tensor data was copied
    assert missing == f"{base_url}gguf/missing.gguf: HTTP 404 File not found"


def test_load_async_text_and_chat_in_a_plain_pyodide_give_cpython_s_ids(base_url, smollm2_gguf):
    """The whole user path in a plain Pyodide: micropip's wheel, load_async of the GGUF by URL, the text
    tokenized in plain Python (no `tokenizers` there), the kernels active: a raw continuation and a chat
    answer have CPython's ids."""
    from ruvllm import load

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    got = in_pyodide(
        f"""
import ruvllm
model = await ruvllm.load_async({base_url + "gguf/SmolLM2-135M-Instruct.Q4_1.gguf"!r}, arithmetic="exact")
raw = [c.token_id for c in model.generate("Once upon a time", temperature=0, max_tokens=16)]
chat = [c.token_id for c in model.chat({messages!r}, temperature=0, max_tokens=24)]
result = {{"raw": raw, "chat": chat, "kernels": model.engine.kernels, "pure": model.tokenizer._pure is not None}}
"""
    )
    model = load(str(smollm2_gguf), kernels="numpy")
    assert (got["kernels"], got["pure"]) == ("wasm", True)
    assert got["raw"] == [c.token_id for c in model.generate("Once upon a time", temperature=0, max_tokens=16)]
    assert got["chat"] == [c.token_id for c in model.chat(messages, temperature=0, max_tokens=24)]


def test_the_cli_runs_in_a_plain_pyodide(smollm2_dir):
    """ruvllm.cli.main in Pyodide: generate with --kernels wasm and --arithmetic exact prints CPython's
    text; a bad --kernels is argparse's usage error (exit 2), not a traceback."""
    got = in_pyodide(
        """
import contextlib, io
from ruvllm.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["generate", "/models/m", "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens",
                 "12", "--kernels", "wasm", "--arithmetic", "exact"])
with contextlib.redirect_stderr(err):
    try:
        main(["generate", "/models/m", "--prompt", "x", "--kernels", "gpu"])
        bad = None
    except SystemExit as e:
        bad = e.code
result = {"code": code, "text": out.getvalue(), "bad": bad, "usage": err.getvalue()}
""",
        {"/models/m": str(smollm2_dir)},
    )
    args = ["generate", str(smollm2_dir), "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens", "12"]
    expected = subprocess.run([sys.executable, "-m", "ruvllm", *args], capture_output=True, text=True, check=True)
    assert (got["code"], got["text"]) == (0, expected.stdout)
    assert got["bad"] == 2 and "argument --kernels: invalid choice: 'gpu'" in got["usage"]


@pytest.fixture(scope="module")
def bad_server():
    """Servers that misbehave, on 127.0.0.1 (each path a model folder whose config.json is the fault):
    silent/ never answers, drip/ sends a byte a second, short/ ends 990 bytes short of its Content-Length,
    huge/ and huger/ announce 2^32-1 and 10^12 bytes, deep/ is JSON 100,000 levels deep."""
    import http.server
    import threading

    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            kind = self.path.strip("/").split("/")[0]
            if kind == "silent":
                stop.wait(60)
                return
            body = b"[" * 100_000 + b"]" * 100_000 if kind == "deep" else b"{" + b" " * 998 + b"}"
            length = {"huge": 2**32 - 1, "huger": 10**12}.get(kind, len(body))
            self.send_response(200)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            if kind == "drip":
                for b in body:
                    if stop.wait(1):
                        return
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
            elif kind in ("short", "huge", "huger"):
                self.wfile.write(body[:10])
            else:
                self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    stop.set()
    server.shutdown()


def test_load_async_gives_up_on_servers_that_misbehave_with_one_line_each(bad_server):
    """A server that never answers or drips a byte a second used to hang load_async for good; a body
    cut short was a raw JsException; 2^32-1 announced bytes were allocated first ("Maximum allowed
    dimension exceeded"); 100,000 levels of JSON were a fatal stack overflow. (Stall: 2 s here.)"""
    errors = in_pyodide(
        f"""
import os
os.environ["RUVLLM_HF_STALL_SECONDS"] = "2"
from ruvllm import load_async
from ruvllm.errors import RuvLLMError
result = {{}}
for kind in ("silent", "drip", "short", "huge", "huger", "deep"):
    try:
        await load_async({bad_server!r} + kind + "/")
        result[kind] = "loaded"
    except RuvLLMError as e:
        result[kind] = [e.type, str(e)]
"""
    )
    config = f"{bad_server}%s/config.json"
    stall = "fewer than 2048 bytes in 2 s (RUVLLM_HF_MIN_SPEED=1024 bytes/s over RUVLLM_HF_STALL_SECONDS=2)"
    assert errors["silent"] == ["download", f"{config % 'silent'}: no answer within 2 s (a stall: {stall})"]
    assert errors["drip"][0] == "download"
    assert errors["drip"][1].startswith(f"{config % 'drip'}: stalled after ")
    assert errors["drip"][1].endswith(f" of 1,000 bytes ({stall})")
    assert errors["short"][0] == "download"
    assert errors["short"][1].startswith(f"{config % 'short'}: ")
    assert "of 1,000 bytes" in errors["short"][1]  # ended, or broke off, after 10 (as the runtime reports it)
    for kind, size in (("huge", "4,294,967,295"), ("huger", "1,000,000,000,000")):
        assert errors[kind] == [
            "download",
            f"{config % kind}: the server announces {size} bytes, more than one file may hold in Pyodide's "
            "memory (2,147,483,647: a model this large comes in shards)",
        ]
    assert errors["deep"] == ["load", f"{config % 'deep'} is not valid JSON (nested 100,000 levels deep; at most 100)"]


def test_attention_through_the_kernels_gives_numpy_s_logits_over_a_long_prompt(smollm2_dir):
    """With the fast arithmetic, attention's two products over the cache run in the kernels (dense, mix):
    8-13x NumPy's speed in Pyodide on a 1024-token prompt. The same engine with them and without them: a
    600-token prompt then 4 decoding steps give the same logits within float32's sum order."""
    got = in_pyodide(
        """
import numpy as np
from ruvllm import host
from ruvllm.runtime.assembly import open_model
from ruvllm.runtime.engine import Engine, LoadOptions
provider, _ = host.wasm_kernels("fast")
engine = Engine.from_store(*open_model("/models/m"), LoadOptions(compute="q8", kernels="wasm", provider=provider))
ids = [int(i) for i in np.random.default_rng(0).integers(100, 40000, 600)]
def run():
    cache, out = engine.new_cache(), []
    for c in range(0, 600, 256):
        out.append(engine.forward(ids[c:c + 256], c, cache)[-1])
    for i in range(4):
        out.append(engine.forward([ids[i]], 600 + i, cache)[-1])
    return np.stack(out)
kernels_on = engine.attention is not None
with_kernels = run()
engine.attention = None
with_numpy = run()
same_top = bool((with_kernels.argmax(1) == with_numpy.argmax(1)).all())
error, scale = float(np.abs(with_kernels - with_numpy).max()), float(np.abs(with_numpy).max())
result = {"on": kernels_on, "error": error, "scale": scale, "same_top": same_top}
""",
        {"/models/m": str(smollm2_dir)},
    )
    assert got["on"] and got["same_top"]
    assert got["error"] <= 1e-3 * got["scale"], got


# The kernels' fast arithmetic through the decode plan: 48 greedy ids and the bits of a forward's logits.
SAME_KERNELS = """
import hashlib, sys
from ruvllm.runtime.assembly import open_model
from ruvllm.runtime.engine import Engine, LoadOptions
from ruvllm.runtime.generate import GenerationOptions, generate_tokens
if sys.platform == "emscripten":
    from ruvllm import host
    provider, reason = host.wasm_kernels("fast")
    relaxed = bool(provider.exports.relaxed_simd())
else:
    from ruvllm.quant.native import NativeHost, NativeKernels, kernel_wasm_paths
    path = [p for p in kernel_wasm_paths() if ("relaxed" in p.name) == RELAXED][0]
    heap = NativeHost(path)
    provider, relaxed = NativeKernels(heap.exports, "fast", heap), heap.relaxed_simd
engine = Engine.from_store(*open_model(MODEL), LoadOptions(kernels="wasm", provider=provider))
options = GenerationOptions.from_kwargs(max_tokens=48, temperature=0, ignore_eos=True)
ids = [s.token_id for s in generate_tokens(engine, PROMPT, options)]
logits = engine.forward(PROMPT + ids[:8], 0, engine.new_cache())
bits = hashlib.sha256(logits.tobytes()).hexdigest()
result = {"ids": ids, "plan": engine.plan_note, "relaxed": relaxed, "bits": bits, "compute": engine.plan.compute}
"""


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_cpython_with_the_kernels_gives_pyodides_bits(model, smollm2_dir, request):
    """kernels='wasm' on CPython (wasmtime, quant/native.py) and in Pyodide run the same binary (the build
    Pyodide's runtime took) through the decode plan: the same 48 greedy ids, and a forward's logits bit
    for bit (issue 40, item 4)."""
    pytest.importorskip("wasmtime")
    path = smollm2_dir if model == "smollm2" else request.getfixturevalue("gemma_gguf")
    prompt = PROMPT if model == "smollm2" else [2, 818, 5279, 529, 7001, 563]  # (ids: no tokenizer needed)
    mount = "/models/m" + ("" if model == "smollm2" else ".gguf")
    got = in_pyodide(f"MODEL, PROMPT = {mount!r}, {prompt!r}\n" + SAME_KERNELS, {mount: str(path)})
    scope: dict = {}
    exec(f"MODEL, PROMPT, RELAXED = {str(path)!r}, {prompt!r}, {got['relaxed']!r}\n" + SAME_KERNELS, scope)
    want = scope["result"]
    assert got["plan"] is None and want["plan"] is None, (got["plan"], want["plan"])
    assert got["compute"] == want["compute"]
    assert got["ids"] == want["ids"] and len(set(want["ids"])) > 5
    assert got["bits"] == want["bits"], "the logits differ in their bits"
