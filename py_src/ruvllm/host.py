"""What the runtime hosting Python offers the engine beyond NumPy. In Pyodide (any Pyodide: a notebook,
PyScript, a console, the npm package's worker):
- the WebAssembly SIMD kernels: this module compiles the wheel's own kernels.wasm, checks a known answer
  on a memory of its own, then instantiates it on Pyodide's memory, so the kernels read and write
  NumPy's arrays in place (quant/wasm.py);
- fetch: a model's files by URL (`fetch_model`, for `api.load_async`), the GGUF header first so a model
  that cannot fit is refused before its weights download, each piece copied once into memory Python
  owns, kept in the page's Cache API where it has one.
CPython offers neither: its NumPy has a BLAS, and `api.load` reads files and downloads from the hub.

With the bridge, the only module that imports `js`/`pyodide`; it does so only inside Pyodide.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from .errors import DownloadError, InvalidArgumentError, LoadError
from .files import jsonfields as fields
from .files.gguf import GGUFFile, header_size
from .files.gguf_model import GGUFModel
from .files.hub import is_hub_name, parse
from .files.store import TensorStore
from .files.tensorfile import PieceBuffer, SafetensorsFile
from .files.transfer import Stall
from .model.config import ModelConfig
from .quant.provider import DEFAULT_ARITHMETIC
from .quant.wasm import WasmKernels
from .text.tokenizer import tokenizers_installed

IN_PYODIDE = sys.platform == "emscripten"


def kernels_wasm(name: str = "kernels.wasm") -> bytes | None:
    """A kernels module the wheel carries, if it does (build.sh puts npm/wasm/kernels.wasm and, where it
    has clang-19, kernels-relaxed.wasm in it)."""
    file = resources.files("ruvllm.quant").joinpath(name)
    return file.read_bytes() if file.is_file() else None


def known_answer() -> dict[str, np.ndarray]:
    """The self-test's inputs and answers: y = x @ W.T for two rows of q4 codes (0..15, the second row
    reversed) with scale 0.5 and min -1, also as float32 weights:
    - x = [1, ..., 32] (5 rows), through the exact paths;
    - x_fast, integers from 16383 down to -16353 (so the fast arithmetic's 15-bit x is x itself, and the
      relaxed build's split x takes high bytes from 127 to -128), through the fast path, as q4_1
      (offset 0: answer_fast) and as q4_0 (offset 8: answer_fast8). Every sum is an exact float32."""
    k = np.arange(32)
    codes = np.stack([k % 16, 15 - k % 16]).astype(np.uint8)  # (2, 32)
    packed = (codes[:, :16] | (codes[:, 16:] << 4)).astype(np.uint8)  # low nibbles first, as kernels.c
    dense = (0.5 * codes - 1).astype(np.float32)
    x = np.tile(np.arange(1, 33, dtype=np.float32), (5, 1))
    x_fast = (16383 - 1056 * k).astype(np.float32)[None]  # (1, 32)
    dense8 = (0.5 * (codes.astype(np.float32) - 8) - 1).astype(np.float32)
    return {
        "x": x,
        "packed": packed,
        "dense": dense,
        "answer": (x[:1] @ dense.T)[0],
        "x_fast": x_fast,
        "answer_fast": (x_fast.astype(np.float64) @ dense.T)[0].astype(np.float32),
        "answer_fast8": (x_fast.astype(np.float64) @ dense8.T)[0].astype(np.float32),
    }


def _self_test(js: Any, module: Any) -> bool:
    """The known answer through the decoding (1 row) and tiled (5 rows) q4 paths, the fast q4 path
    (offsets 0 and 8) and the float32 product, on a memory of its own: a runtime whose SIMD computes
    wrongly is found before the kernels touch Pyodide's memory."""
    from pyodide.ffi import to_js

    memory = js.WebAssembly.Memory.new(to_js({"initial": 2}, dict_converter=js.Object.fromEntries))
    imports = to_js({"env": {"memory": memory}}, dict_converter=js.Object.fromEntries)
    exports = js.WebAssembly.Instance.new(module, imports).exports
    case = known_answer()
    at = {"x": 0, "packed": 1024, "scales": 2048, "mins": 2064, "y": 2080, "scratch": 4096, "dense": 8192}
    at |= {"x_fast": 12288, "xq": 16384}
    heap = js.Uint8Array.new(memory.buffer)
    for name, array in (
        ("x", case["x"]),
        ("packed", case["packed"]),
        ("scales", np.full(2, 0.5, np.float32)),
        ("mins", np.full(2, -1, np.float32)),
        ("dense", case["dense"]),
        ("x_fast", case["x_fast"]),
    ):
        heap.set(to_js(array.tobytes()), at[name])
    xq, d, xs = at["xq"], at["xq"] + 2 * 32, at["xq"] + 2 * 32 + 4

    def exact(T: int) -> None:  # (T rows of x: 1 decodes group by group, 5 goes through the tiles)
        exports.q4_exact(at["x"], at["packed"], at["scales"], at["mins"], 0, at["y"], at["scratch"], T, 2, 32)

    def fast(offset: int) -> None:
        exports.quantize_x(at["x_fast"], xq, d, xs, 1, 32)
        exports.q4_fast(xq, d, xs, at["packed"], at["scales"], at["mins"], offset, at["y"], 1, 2, 32)

    runs = [
        (lambda: exact(1), "answer"),
        (lambda: exact(5), "answer"),
        (lambda: exports.dense(at["x"], at["dense"], at["y"], 1, 2, 32), "answer"),
        (lambda: fast(0), "answer_fast"),
        (lambda: fast(8), "answer_fast8"),
    ]
    y = js.Float32Array.new(memory.buffer, at["y"], 2)
    for run, answer in runs:
        y.fill(float("nan"))
        run()
        if not np.array_equal(np.asarray(y.to_py(), np.float32), case[answer]):
            return False
    return True


def wasm_kernels(arithmetic: str = DEFAULT_ARITHMETIC) -> tuple[WasmKernels | None, str | None]:
    """The WebAssembly SIMD kernels on Pyodide's memory, or None and why they cannot run here."""
    if not IN_PYODIDE:
        return None, "the WebAssembly kernels run inside Pyodide; CPython's NumPy has a BLAS instead"
    exports, reason = kernel_exports()
    return (None, reason) if exports is None else (WasmKernels(exports, arithmetic), None)


KERNEL_BUILDS = ("auto", "plain", "relaxed")


@functools.cache
def kernel_exports(build: str = "auto") -> tuple[Any, str | None]:
    """The kernels' exports on Pyodide's memory (compiled and checked once), or None and why not. The
    npm package's worker starts its kernels here too (npm/src/worker/kernels.js). build "auto": the
    relaxed SIMD build where the runtime validates it and it passes the known-answer test (its exports'
    relaxed_simd() says 1), else the plain one; "plain" or "relaxed": that build alone (benchmarks
    compare them)."""
    import js
    import pyodide_js
    from pyodide.ffi import to_js

    if build not in KERNEL_BUILDS:
        raise ValueError(f"build must be one of {', '.join(KERNEL_BUILDS)}, got {build!r}")
    data = kernels_wasm()
    if data is None:
        return None, "this ruvllm wheel has no quant/kernels.wasm (./build.sh wheel puts it in)"
    code = to_js(data)
    if not js.WebAssembly.validate(code):
        return None, "this runtime does not support WebAssembly SIMD128"
    memory = getattr(pyodide_js._module, "memory", None)  # (Pyodide has no public handle on its memory)
    if memory is None or not js.WebAssembly.Memory.prototype.isPrototypeOf(memory):
        return None, "this Pyodide does not expose its WebAssembly memory (pyodide._module.memory)"
    module = None
    if build != "plain":
        relaxed = kernels_wasm("kernels-relaxed.wasm")
        if relaxed is None:
            why = "this ruvllm wheel has no quant/kernels-relaxed.wasm (./build.sh makes it with clang-19)"
        elif not js.WebAssembly.validate(relaxed_code := to_js(relaxed)):
            why = "this runtime does not validate relaxed SIMD"
        elif not _self_test(js, candidate := js.WebAssembly.Module.new(relaxed_code)):
            why = "this runtime's relaxed SIMD gave a wrong answer on the kernels' self-test"
        else:
            module, why = candidate, None
        if build == "relaxed" and module is None:
            return None, why
    if module is None:
        module = js.WebAssembly.Module.new(code)
        if not _self_test(js, module):
            return None, "this runtime's SIMD128 gave a wrong answer on the kernels' self-test"
    imports = to_js({"env": {"memory": memory}}, dict_converter=js.Object.fromEntries)
    return js.WebAssembly.Instance.new(module, imports).exports, None


# --- fetch: a model by URL ----------------------------------------------------------------------------

MODELS_CACHE = "ruvllm-models-v1"  # the Cache API store the npm package's worker keeps models in too


@dataclass
class Fetched:
    """A model's files, read over fetch: what `api.load_async` builds the model from."""

    config: ModelConfig
    store: TensorStore
    tokenizer: dict  # tokenizer.json's document (for a GGUF: made from its metadata)
    tokenizer_config: dict
    generation_config: dict
    where: str  # the URL, for messages


Progress = Callable[[dict], None]  # {"file", "loaded", "total"} after each piece of a file
PlanCheck = Callable[[ModelConfig, TensorStore], object]  # raises when the model cannot be loaded


async def fetch_model(source: str, check: PlanCheck, on_progress: Progress | None = None) -> Fetched:
    """The files of the model at `source`: a GGUF file's URL, a model folder's URL (config.json,
    tokenizer.json, model.safetensors or its shards), or a hub name (`hf:OWNER/REPO[/FILE.gguf]`, from
    $RUVLLM_HF_ENDPOINT or the hub). `check` sees the config and the weights' headers before their data:
    a model it refuses is not downloaded (a sharded folder's earlier shards are, before the last one's
    header completes the picture)."""
    if not IN_PYODIDE:
        raise InvalidArgumentError("load_async fetches over JavaScript's fetch, inside Pyodide; on CPython use load()")
    if is_hub_name(source):
        hub = parse(source)
        url_of: Callable[[str], str] = hub.url
        gguf = hub.file
    else:
        base = source if source.endswith("/") or source.lower().endswith(".gguf") else source + "/"
        url_of, gguf = (lambda path: urllib.parse.urljoin(base, path)), (None if base.endswith("/") else "")
    if gguf is not None:
        return await _fetch_gguf(url_of(gguf) if gguf else source, check, on_progress)
    return await _fetch_folder(url_of, check, on_progress)


async def _fetch_gguf(url: str, check: PlanCheck, on_progress: Progress | None) -> Fetched:
    name = urllib.parse.unquote(url.rsplit("/", 1)[-1].split("?")[0]) or url
    header: list[GGUFModel] = []

    def on_piece(piece: PieceBuffer) -> None:
        if header:
            return
        at = header_size(piece.array[: piece.filled], piece.array.size, url)
        if at is not None and piece.filled >= at:
            model = GGUFModel(GGUFFile.from_header(piece.array[:at], piece.array.size, url))
            check(ModelConfig.from_dict(model.config, f"{url} (GGUF metadata)"), TensorStore([model]))
            header.append(model)

    piece = await _download(url, name, on_progress, on_piece)
    piece.check_complete()
    model = GGUFModel(GGUFFile(piece.array, url))
    config = ModelConfig.from_dict(model.config, f"{url} (GGUF metadata)")
    tokenizer, tokenizer_config, generation_config = model.tokenizer_files(merges=tokenizers_installed())
    return Fetched(config, TensorStore([model]), tokenizer, tokenizer_config, generation_config, url)


async def _fetch_folder(url_of: Callable[[str], str], check: PlanCheck, on_progress: Progress | None) -> Fetched:
    where = url_of("")

    async def document(path: str, optional: bool = False) -> dict:
        piece = await _download(url_of(path), path, None, optional=optional)
        if piece is None:
            return {}
        return fields.obj(fields.parse_json(piece.array.tobytes(), url_of(path)), url_of(path))

    config = ModelConfig.from_dict(await document("config.json"), url_of("config.json"))
    tokenizer = await document("tokenizer.json")
    tokenizer_config = await document("tokenizer_config.json", optional=True)
    generation_config = await document("generation_config.json", optional=True)
    index = await document("model.safetensors.index.json", optional=True)
    weight_map = fields.obj(index.get("weight_map", {}), url_of("model.safetensors.index.json"))
    shards = sorted(set(map(str, weight_map.values()))) or ["model.safetensors"]
    for shard in shards:
        if not _is_plain_path(shard):
            raise LoadError(f"{url_of('model.safetensors.index.json')}: shard name {shard!r} is not a file name")
    files: list[SafetensorsFile | GGUFModel] = []
    for i, shard in enumerate(shards):
        last = i == len(shards) - 1  # once its header is in, every weight file's is: the plan can be checked
        on_piece = _check_on_header(config, files, shard, check) if last else None
        piece = await _download(url_of(shard), shard, on_progress, on_piece)
        files.append(piece.finish())
    return Fetched(config, TensorStore(files), tokenizer, tokenizer_config, generation_config, where)


def _check_on_header(
    config: ModelConfig, files: list[SafetensorsFile | GGUFModel], name: str, check: PlanCheck
) -> Callable[[PieceBuffer], None]:
    """What checks the plan as soon as the header of the weight file `name` is in (`files`: the others)."""
    checked = False

    def on_piece(piece: PieceBuffer) -> None:
        nonlocal checked
        if not checked and piece.header() is not None:
            checked = True
            head = SafetensorsFile.from_header(piece.array[: piece.filled].data, piece.array.size, name)
            check(config, TensorStore([*files, head]))

    return on_piece


def _is_plain_path(path: str) -> bool:
    return all(part not in ("", ".", "..") and "\\" not in part for part in path.split("/"))


# The most bytes one file may announce: one NumPy array in Pyodide's 32-bit memory holds at most this (a
# larger model is split into shards). An announced size past it is refused before anything is allocated.
MAX_DOWNLOAD_BYTES = 2**31 - 1


async def _download(
    url: str,
    name: str,
    on_progress: Progress | None,
    on_piece: Callable[[PieceBuffer], None] | None = None,
    optional: bool = False,
) -> Any:
    """The bytes at `url` in a buffer Python owns (each piece copied once, straight into it), from the
    Cache API when the page has one and it holds them (stored there after a complete download); None
    for an optional file the server does not have (404).

    As the CPython downloader (files/transfer.py), a server that sends fewer than $RUVLLM_HF_MIN_SPEED
    bytes/s over $RUVLLM_HF_STALL_SECONDS (headers included: one that never answers) is given up on;
    a size past MAX_DOWNLOAD_BYTES is refused before it is allocated, and a body that ends short of the
    size announced, or breaks off, is a DownloadError saying how much arrived."""
    import js
    from pyodide.ffi import JsException, to_js

    stall = Stall.from_env()
    store = None
    if hasattr(js, "caches"):
        try:
            store = await js.caches.open(MODELS_CACHE)
        except JsException:
            store = None  # (an opaque origin, a private window): no caching
    response: Any = await store.match(url) if store is not None else None
    cached = bool(response)
    if not cached:
        controller = js.AbortController.new()
        options = to_js({"signal": controller.signal}, dict_converter=js.Object.fromEntries)
        try:
            response = await asyncio.wait_for(_awaited(js.fetch(url, options)), stall.seconds)
        except TimeoutError:
            controller.abort()
            raise DownloadError(f"{url}: no answer within {stall.seconds:g} s (a stall: {stall.describe()})") from None
        except JsException as e:
            raise DownloadError(f"{url}: cannot fetch it ({e.message})") from None
        if response.status == 404 and optional:
            return None
        if not response.ok:
            raise DownloadError(f"{url}: HTTP {response.status} {response.statusText}".rstrip())
    length = response.headers.get("content-length")
    if length is None or not str(length).isdigit():
        raise DownloadError(f"{url}: the server gave no Content-Length, so the file's size is unknown")
    size = int(length)
    if size > MAX_DOWNLOAD_BYTES:
        await response.body.cancel()
        raise DownloadError(
            f"{url}: the server announces {size:,} bytes, more than one file may hold in Pyodide's memory "
            f"({MAX_DOWNLOAD_BYTES:,}: a model this large comes in shards)"
        )
    try:
        piece = PieceBuffer(size, url)
    except MemoryError:
        await response.body.cancel()
        raise DownloadError(f"{url}: no room in Pyodide's memory for its {size:,} bytes") from None
    reader = response.body.getReader()
    loop = asyncio.get_running_loop()
    window, got = loop.time(), 0  # a window of stall.seconds, begun anew each time its quota is met
    try:
        while True:
            now = loop.time()
            if got >= stall.min_bytes:
                window, got = now, 0
            try:
                part = await asyncio.wait_for(_awaited(reader.read()), max(0.0, window + stall.seconds - now))
            except TimeoutError:
                raise DownloadError(
                    f"{url}: stalled after {piece.filled:,} of {size:,} bytes ({stall.describe()})"
                ) from None
            except JsException as e:
                raise DownloadError(
                    f"{url}: the download broke off after {piece.filled:,} of {size:,} bytes ({e.message})"
                ) from None
            if part.done:
                break
            chunk = part.value
            got += int(chunk.length)
            chunk.assign_to(piece.next_slice(int(chunk.length)))
            if on_progress is not None:
                on_progress({"file": name, "loaded": piece.filled, "total": piece.array.size})
            if on_piece is not None:
                on_piece(piece)
    except BaseException:
        try:
            await reader.cancel()
        except JsException:
            pass  # (a stream that broke off is already closed)
        raise
    if piece.filled != size:
        raise DownloadError(f"{url}: the download ended after {piece.filled:,} of the {size:,} bytes announced")
    if store is not None and not cached:
        try:  # (a failed write only costs the caching)
            headers = to_js({"content-length": str(piece.filled)}, dict_converter=js.Object.fromEntries)
            await store.put(url, js.Response.new(to_js(piece.array), to_js({"headers": headers})))
        except JsException:
            pass
    return piece


async def _awaited(promise: Any) -> Any:
    """A JavaScript promise as a coroutine (what asyncio.wait_for takes)."""
    return await promise
