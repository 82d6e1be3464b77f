"""What the runtime hosting Python offers the engine beyond NumPy. In Pyodide (any Pyodide: a notebook,
PyScript, a console, the npm package's worker) that is the WebAssembly SIMD kernels: this module
compiles the wheel's own kernels.wasm, checks a known answer on a memory of its own, then instantiates
it on Pyodide's memory, so the kernels read and write NumPy's arrays in place (quant/wasm.py). CPython
offers nothing: its NumPy has a BLAS.

With the bridge, the only module that imports `js`/`pyodide`; it does so only inside Pyodide.
"""

from __future__ import annotations

import functools
import sys
from importlib import resources
from typing import Any

import numpy as np

from .quant.provider import DEFAULT_ARITHMETIC
from .quant.wasm import WasmKernels

IN_PYODIDE = sys.platform == "emscripten"


def kernels_wasm() -> bytes | None:
    """The kernels module the wheel carries (build.sh puts npm/wasm/kernels.wasm in it), if it does."""
    file = resources.files("ruvllm.quant").joinpath("kernels.wasm")
    return file.read_bytes() if file.is_file() else None


def known_answer() -> dict[str, np.ndarray]:
    """The self-test's inputs and answer: y = x @ W.T for x = [1, ..., 32] (5 rows) and two rows of q4
    codes (0..15, the second row reversed) with scale 0.5 and min -1, also as float32 weights."""
    k = np.arange(32)
    codes = np.stack([k % 16, 15 - k % 16]).astype(np.uint8)  # (2, 32)
    packed = (codes[:, :16] | (codes[:, 16:] << 4)).astype(np.uint8)  # low nibbles first, as kernels.c
    dense = (0.5 * codes - 1).astype(np.float32)
    x = np.tile(np.arange(1, 33, dtype=np.float32), (5, 1))
    return {"x": x, "packed": packed, "dense": dense, "answer": (x[:1] @ dense.T)[0]}


def _self_test(js: Any, module: Any) -> bool:
    """The known answer through the decoding (1 row) and tiled (5 rows) q4 paths and the float32
    product, on a memory of its own: a runtime whose SIMD computes wrongly is found before the kernels
    touch Pyodide's memory."""
    from pyodide.ffi import to_js

    memory = js.WebAssembly.Memory.new(to_js({"initial": 2}, dict_converter=js.Object.fromEntries))
    imports = to_js({"env": {"memory": memory}}, dict_converter=js.Object.fromEntries)
    exports = js.WebAssembly.Instance.new(module, imports).exports
    case = known_answer()
    at = {"x": 0, "packed": 1024, "scales": 2048, "mins": 2064, "y": 2080, "scratch": 4096, "dense": 8192}
    heap = js.Uint8Array.new(memory.buffer)
    for name, array in (
        ("x", case["x"]),
        ("packed", case["packed"]),
        ("scales", np.full(2, 0.5, np.float32)),
        ("mins", np.full(2, -1, np.float32)),
        ("dense", case["dense"]),
    ):
        heap.set(to_js(array.tobytes()), at[name])
    runs = [
        lambda: exports.q4_exact(at["x"], at["packed"], at["scales"], at["mins"], 0, at["y"], at["scratch"], 1, 2, 32),
        lambda: exports.q4_exact(at["x"], at["packed"], at["scales"], at["mins"], 0, at["y"], at["scratch"], 5, 2, 32),
        lambda: exports.dense(at["x"], at["dense"], at["y"], 1, 2, 32),
    ]
    y = js.Float32Array.new(memory.buffer, at["y"], 2)
    for run in runs:
        y.fill(float("nan"))
        run()
        if not np.array_equal(np.asarray(y.to_py(), np.float32), case["answer"]):
            return False
    return True


def wasm_kernels(arithmetic: str = DEFAULT_ARITHMETIC) -> tuple[WasmKernels | None, str | None]:
    """The WebAssembly SIMD kernels on Pyodide's memory, or None and why they cannot run here."""
    if not IN_PYODIDE:
        return None, "the WebAssembly kernels run inside Pyodide; CPython's NumPy has a BLAS instead"
    exports, reason = _kernel_exports()
    return (None, reason) if exports is None else (WasmKernels(exports, arithmetic), None)


@functools.cache
def _kernel_exports() -> tuple[Any, str | None]:
    """The kernels' exports on Pyodide's memory (compiled and checked once), or None and why not."""
    import js
    import pyodide_js

    data = kernels_wasm()
    if data is None:
        return None, "this ruvllm wheel has no quant/kernels.wasm (./build.sh wheel puts it in)"
    from pyodide.ffi import to_js

    code = to_js(data)
    if not js.WebAssembly.validate(code):
        return None, "this runtime does not support WebAssembly SIMD128"
    memory = getattr(pyodide_js._module, "memory", None)  # (Pyodide has no public handle on its memory)
    if memory is None or not js.WebAssembly.Memory.prototype.isPrototypeOf(memory):
        return None, "this Pyodide does not expose its WebAssembly memory (pyodide._module.memory)"
    module = js.WebAssembly.Module.new(code)
    if not _self_test(js, module):
        return None, "this runtime's SIMD128 gave a wrong answer on the kernels' self-test"
    imports = to_js({"env": {"memory": memory}}, dict_converter=js.Object.fromEntries)
    return js.WebAssembly.Instance.new(module, imports).exports, None
