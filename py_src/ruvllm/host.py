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
from importlib import resources
from typing import Any

import numpy as np

from .errors import DownloadError, InvalidArgumentError
from .files.hub import is_hub_name, parse
from .files.layout import is_gguf_name
from .files.transfer import Stall
from .quant.provider import DEFAULT_ARITHMETIC
from .quant.wasm import WasmKernels, known_answer
from .runtime.assembly import Assembly
from .runtime.engine import LoadOptions

IN_PYODIDE = sys.platform == "emscripten"


def kernels_wasm(name: str = "kernels.wasm") -> bytes | None:
    """A kernels module the wheel carries, if it does (build.sh puts npm/wasm/kernels.wasm and, where it
    has clang-19, kernels-relaxed.wasm in it)."""
    file = resources.files("ruvllm.quant").joinpath(name)
    return file.read_bytes() if file.is_file() else None


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

MODELS_CACHE = "ruvllm-models-v1"  # the Cache API store the npm worker keeps models in too (bridge-schema.js)


Progress = Callable[[dict], None]  # {"file", "loaded", "total"} after each piece of a file


async def fetch_model(source: str, options: LoadOptions, on_progress: Progress | None = None) -> Assembly:
    """The model at `source`, assembled from its files over fetch (runtime/assembly.py): a GGUF file's URL,
    a model folder's URL (files/layout.py), or a hub name (`hf:OWNER/REPO[/FILE.gguf]`, from
    $RUVLLM_HF_ENDPOINT or the hub). Every weight file's header is read before any tensor data, so a model
    the memory plan refuses is not downloaded."""
    if not IN_PYODIDE:
        raise InvalidArgumentError("load_async fetches over JavaScript's fetch, inside Pyodide; on CPython use load()")
    if is_hub_name(source):
        hub = parse(source)
        url_of: Callable[[str], str] = hub.url
        gguf = hub.file
        where = hub.url(gguf) if gguf else hub.url("")
    else:
        base = source if source.endswith("/") or is_gguf_name(source) else source + "/"
        url_of, gguf, where = (lambda path: urllib.parse.urljoin(base, path)), None, base
        if is_gguf_name(base):
            gguf, url_of = base, lambda path: base  # (the file is its own URL)
    name = None if gguf is None else urllib.parse.unquote(gguf.rsplit("/", 1)[-1].split("?")[0]) or gguf
    assembly = Assembly(options, name, where)
    downloads: dict[str, _Download] = {}
    try:
        while (want := assembly.next()) is not None:
            url = url_of(gguf if gguf is not None else want.name)
            if want.part == "document":
                assembly.give_document(want.name, await _document(url, want.optional))
            elif want.part == "header":
                download = downloads[want.name] = await _Download.open(url)
                assembly.give_header(want.name, download.size, await download.header(assembly, want.name))
            else:
                await downloads.pop(want.name).copy_into(assembly, want.name, on_progress)
    finally:
        for download in downloads.values():  # (a refused plan: the tensor data is not fetched)
            await download.cancel()
    return assembly


async def _document(url: str, optional: bool) -> bytes | None:
    """A small file's bytes (None: an optional one the server does not have)."""
    download = await _Download.open(url, optional)
    if download is None:
        return None
    parts = []
    while (chunk := await download.read()) is not None:
        parts.append(chunk.to_bytes())
    download.check_complete()
    data = b"".join(parts)
    await download.keep(data)
    return data


# The most bytes one file may announce: one NumPy array in Pyodide's 32-bit memory holds at most this (a
# larger model is split into shards). An announced size past it is refused before anything is allocated.
MAX_DOWNLOAD_BYTES = 2**31 - 1


class _Download:
    """One file read over fetch, from the Cache API when the page has one and it holds the file (stored
    there after a complete download).

    As the CPython downloader (files/transfer.py), a server that sends fewer than $RUVLLM_HF_MIN_SPEED
    bytes/s over $RUVLLM_HF_STALL_SECONDS (headers included: one that never answers) is given up on;
    a size past MAX_DOWNLOAD_BYTES is refused before it is allocated, and a body that ends short of the
    size announced, or breaks off, is a DownloadError saying how much arrived."""

    def __init__(self, url: str, response: Any, store: Any, cached: bool, stall: Stall) -> None:
        self.url, self.response, self.store, self.cached, self.stall = url, response, store, cached, stall
        self.size = self._size()
        self.reader = response.body.getReader()
        self.buffered: list[Any] = []  # chunks read for the header, written again with the data
        self.got = 0
        loop = asyncio.get_running_loop()
        self.window, self.quota = loop.time(), 0  # a window of stall.seconds, begun anew each time its quota is met

    @classmethod
    async def open(cls, url: str, optional: bool = False) -> Any:
        """The file at `url`, its size known and its body not yet read; None for an optional file the
        server does not have (404)."""
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
                raise DownloadError(
                    f"{url}: no answer within {stall.seconds:g} s (a stall: {stall.describe()})"
                ) from None
            except JsException as e:
                raise DownloadError(f"{url}: cannot fetch it ({e.message})") from None
            if response.status == 404 and optional:
                return None
            if not response.ok:
                raise DownloadError(f"{url}: HTTP {response.status} {response.statusText}".rstrip())
        try:
            return cls(url, response, store, cached, stall)
        except DownloadError:  # (a size refused before anything is allocated: the body is not read)
            await response.body.cancel()
            raise

    def _size(self) -> int:
        length = self.response.headers.get("content-length")
        if length is None or not str(length).isdigit():
            raise DownloadError(f"{self.url}: the server gave no Content-Length, so the file's size is unknown")
        size = int(length)
        if size > MAX_DOWNLOAD_BYTES:
            raise DownloadError(
                f"{self.url}: the server announces {size:,} bytes, more than one file may hold in Pyodide's "
                f"memory ({MAX_DOWNLOAD_BYTES:,}: a model this large comes in shards)"
            )
        return size

    async def read(self) -> Any:
        """The next chunk (a JsProxy of a Uint8Array), or None at the end of the body."""
        from pyodide.ffi import JsException

        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.quota >= self.stall.min_bytes:
            self.window, self.quota = now, 0
        try:
            part = await asyncio.wait_for(
                _awaited(self.reader.read()), max(0.0, self.window + self.stall.seconds - now)
            )
        except TimeoutError:
            raise DownloadError(
                f"{self.url}: stalled after {self.got:,} of {self.size:,} bytes ({self.stall.describe()})"
            ) from None
        except JsException as e:
            raise DownloadError(
                f"{self.url}: the download broke off after {self.got:,} of {self.size:,} bytes ({e.message})"
            ) from None
        if part.done:
            return None
        self.got += int(part.value.length)
        self.quota += int(part.value.length)
        return part.value

    def check_complete(self) -> None:
        if self.got != self.size:
            raise DownloadError(
                f"{self.url}: the download ended after {self.got:,} of the {self.size:,} bytes announced"
            )

    async def header(self, assembly: Assembly, name: str) -> bytes:
        """The file's first bytes, read until they hold its header (the chunks are kept for `copy_into`)."""
        parts: list[bytes] = []
        have, ask = 0, 8  # asked again each time twice as many bytes are in (or as many as it said)
        while (chunk := await self.read()) is not None:
            self.buffered.append(chunk)
            parts.append(chunk.to_bytes())
            have += len(parts[-1])
            if have >= ask:
                parts = [b"".join(parts)]
                at = assembly.header_size(name, self.size, parts[0])
                if at is not None and have >= at:
                    break
                ask = max(at or 0, 2 * ask)
        return b"".join(parts)  # (a file that ends inside its header: the assembly says what is wrong)

    async def copy_into(self, assembly: Assembly, name: str, on_progress: Progress | None) -> None:
        """The whole file into the assembly's buffer for `name`, each piece copied once; stored in the
        Cache API once whole."""
        try:
            assembly.begin(name, self.size)
        except MemoryError:
            await self.cancel()
            raise DownloadError(f"{self.url}: no room in Pyodide's memory for its {self.size:,} bytes") from None
        buffered, self.buffered = self.buffered, []
        while (chunk := buffered.pop(0) if buffered else await self.read()) is not None:
            filled = assembly.write(name, chunk)
            if on_progress is not None:
                on_progress({"file": name, "loaded": filled, "total": self.size})
        self.check_complete()
        array = assembly.finish(name).array
        if array is not None:
            await self.keep(array)

    async def keep(self, data: bytes | np.ndarray) -> None:
        """Store the whole file in the Cache API, where the page has one and it did not come from there."""
        import js
        from pyodide.ffi import JsException, to_js

        if self.store is None or self.cached:
            return
        try:  # (a failed write only costs the caching)
            headers = to_js({"content-length": str(self.size)}, dict_converter=js.Object.fromEntries)
            await self.store.put(self.url, js.Response.new(to_js(data), to_js({"headers": headers})))
        except JsException:  # (the page's storage refused it)
            pass

    async def cancel(self) -> None:
        from pyodide.ffi import JsException

        try:
            await self.reader.cancel()
        except JsException:
            pass  # (a stream that broke off is already closed)


async def _awaited(promise: Any) -> Any:
    """A JavaScript promise as a coroutine (what asyncio.wait_for takes)."""
    return await promise
