"""The WebAssembly SIMD kernel provider (kernels/kernels.c), driven from Python inside Pyodide.

The module is instantiated by the worker on Pyodide's own WebAssembly.Memory, so a NumPy array's data
pointer is an address the kernels read and write in place. This file only passes addresses and sizes:
`exports` is anything whose attributes are the module's exported functions (a JsProxy in Pyodide), so
nothing here imports `js`.

A call from Python through JavaScript into wasm costs a few microseconds and a token makes a few hundred
of them: every matrix's addresses are looked up once, when it is prepared, and the scratch buffer is
kept between calls.

Dimension letters: T rows of x, N output features, K input features, G = K / 32 groups.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..files.formats import GROUP
from .matrices import DenseMatrix, Int4Matrix, Int8Matrix
from .provider import DEFAULT_ARITHMETIC, check_arithmetic

# As kernels.c: weight rows per tile of a many-row product, the most rows contracted group by group, and
# the columns of y the backward's product (`*_t`) takes at a time (its scratch: 4 rows of that many).
TILE_ROWS = 16
GROUPED_MAX_ROWS = 4
TRANSPOSED_COLUMNS = 256


_char: Any  # ctypes.c_char (Any: its from_buffer's types do not know ndarray), or None
try:
    import ctypes

    _char = ctypes.c_char
except ImportError:  # (a Python built without ctypes: NumPy's own way serves)
    _char = None


def address(a: np.ndarray) -> int:
    """Where the array's data starts in the WebAssembly memory (Pyodide: the NumPy data pointer). Every
    product asks for one to three, right after the product before it has streamed its weights through
    the caches, where every Python step is slow: measured in Pyodide after a 16 MB sweep, a ctypes char
    on the array's buffer took 18-21 µs (1.2 hot), NumPy's `ctypes.data`, whose properties are Python
    code, 45-70 µs (4.3 hot), `__array_interface__` 28-33. NumPy's way serves what has no writable
    buffer (read-only, empty)."""
    if _char is not None:
        try:
            return ctypes.addressof(_char.from_buffer(a))
        except (TypeError, ValueError):
            pass
    return a.ctypes.data


def known_answer() -> dict[str, np.ndarray]:
    """The kernels' self-test (host.py in Pyodide, native.py on CPython), its inputs and answers:
    y = x @ W.T for two rows of q4 codes (0..15, the second row reversed) with scale 0.5 and min -1,
    also as float32 weights:
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


class Heap:
    """Where the kernels' arrays live, as NumPy sees them: Pyodide's heap, where every NumPy array is in
    the kernels' memory and an address is its data pointer. quant/native.py's NativeHost is the other
    one: a wasm memory on CPython, whose arrays are NumPy views of it."""

    def address(self, a: np.ndarray) -> int:
        """The kernels' address of the array's data (it must be in their memory)."""
        return address(a)

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        """A new array in the kernels' memory."""
        return np.empty(shape, dtype)

    def inside(self, a: Any, dtype: Any = None) -> np.ndarray:
        """`a` (as `dtype`, C-contiguous) itself where it is in the kernels' memory already, else a copy
        there."""
        return np.ascontiguousarray(a, dtype)


PYODIDE_HEAP = Heap()


def kernel_form(matrix: object) -> tuple[str, np.ndarray] | None:
    """The kernels' name for a matrix's form ("dense", "q4", "q8", "q8h") and the array of its weights
    or codes; None for forms the kernels do not compute (Q2_K: groups of 16 with mins; Q8_K: 256)."""
    if isinstance(matrix, DenseMatrix):
        return "dense", matrix.weight
    if isinstance(matrix, Int4Matrix):  # before Int8Matrix: it is a subclass
        return "q4", matrix.packed
    if isinstance(matrix, Int8Matrix) and matrix.group == GROUP:
        return "q8", matrix.codes
    if isinstance(matrix, Int8Matrix) and matrix.group == GROUP // 2 and matrix.mins is None:  # Q6_K, Q3_K
        return "q8h", matrix.codes
    return None


class WasmKernels:
    """Matrix products through the kernels of kernels/kernels.c.

    arithmetic "exact": codes become float32 in registers, each weight formed as NumPy forms it; results
    differ from NumPy's only in the order of float32 sums. "fast": decoding products take x at 15 bits
    per group of 32 and multiply in 16-bit integers; prefill products stay exact.

    One scratch buffer serves every call: the engine's lock keeps forward calls one at a time (and
    Pyodide runs Python on one thread).
    """

    name = "wasm"

    def __init__(
        self, exports: Any, arithmetic: str = DEFAULT_ARITHMETIC, heap: Heap = PYODIDE_HEAP
    ) -> None:  # (exports: a JsProxy in Pyodide, dynamic)
        self.exports, self.heap = exports, heap
        self.arithmetic = check_arithmetic(arithmetic)
        self._scratch = heap.empty(0, dtype=np.float32)
        self._scratch_at = heap.address(self._scratch)

    def scratch(self, floats: int) -> int:
        """The address of a buffer of at least `floats` float32 values, kept for the next calls."""
        if self._scratch.size < floats:
            self._scratch = self.heap.empty(max(floats, 2 * self._scratch.size), dtype=np.float32)
            self._scratch_at = self.heap.address(self._scratch)
        return self._scratch_at

    def prepare(self, matrix: object) -> Callable[[np.ndarray], np.ndarray] | None:
        known = kernel_form(matrix)
        if known is None:
            return None  # NumPy computes it
        form, codes = known
        if isinstance(matrix, DenseMatrix):
            return self._dense(matrix)
        assert isinstance(matrix, Int8Matrix)  # (every other form the kernels know)
        return self._quantized(matrix, codes, form)

    def transposed(self, matrix: object) -> Callable[[np.ndarray, np.ndarray, int, int], None] | None:
        """add(dy, y, n0, n1): y (T, K) += dy[:, n0:n1] @ W[n0:n1] through kernels.c's `*_t` (learning's
        backward, from the matrix as it is kept: no transposed copy), or None where NumPy computes it."""
        known = kernel_form(matrix)
        if known is None:
            return None
        form, codes = known
        N, K = matrix.shape  # type: ignore[attr-defined]  # (a form the kernels know: a matrix)
        at, inside = self.heap.address, self.heap.inside

        def into(kernel: Callable[[int, int], None], dy: np.ndarray, y: np.ndarray) -> None:
            """kernel(dy's address, y's), with both in the kernels' memory (y copied back if it was not)."""
            there = inside(y)
            kernel(at(inside(dy)), at(there))
            if there is not y:
                y[...] = there

        if isinstance(matrix, DenseMatrix):
            w, dense_t = at(matrix.weight), self.exports.dense_t

            def add_dense(dy: np.ndarray, y: np.ndarray, n0: int, n1: int) -> None:
                into(lambda d, o: dense_t(d, w, o, dy.shape[0], N, K, n0, n1, 0, K), dy, y)

            return add_dense
        assert isinstance(matrix, Int8Matrix)  # (every other form the kernels know)
        w, scales = at(codes), at(matrix.scales)
        mins = 0 if matrix.mins is None else at(matrix.mins)
        offset, kernel = int(matrix.offset), getattr(self.exports, f"{form}_t")

        def add(dy: np.ndarray, y: np.ndarray, n0: int, n1: int) -> None:
            scratch = self.scratch(4 * min(K, TRANSPOSED_COLUMNS))
            into(lambda d, o: kernel(d, w, scales, mins, offset, o, scratch, dy.shape[0], N, K, n0, n1, 0, K), dy, y)

        return add

    @functools.cached_property
    def memory(self) -> HeapMemory:
        """The memory the decode plan runs in (the kernels' heap)."""
        return HeapMemory(self.exports, self.heap)

    @property
    def attention(self) -> WasmAttention:
        """Attention's products through these kernels (provider.AttentionProducts)."""
        return WasmAttention(self.exports, self.heap)

    def _dense(self, m: DenseMatrix) -> Callable[[np.ndarray], np.ndarray]:
        N, K = m.shape
        at, inside, empty = self.heap.address, self.heap.inside, self.heap.empty
        w, dense = at(m.weight), self.exports.dense

        def product(x: np.ndarray) -> np.ndarray:
            x = inside(x, np.float32)  # (T, K)
            y = empty((x.shape[0], N), np.float32)  # (T, N)
            dense(at(x), w, at(y), x.shape[0], N, K)
            return y

        return product

    def _quantized(self, m: Int8Matrix, codes: np.ndarray, kind: str) -> Callable[[np.ndarray], np.ndarray]:
        N, K = m.shape
        G = K // GROUP
        at, inside, empty = self.heap.address, self.heap.inside, self.heap.empty
        w, scales = at(codes), at(m.scales)
        mins = 0 if m.mins is None else at(m.mins)
        offset = int(m.offset)
        exact = getattr(self.exports, f"{kind}_exact")
        fast = getattr(self.exports, f"{kind}_fast") if self.arithmetic == "fast" else None
        quantize_x = self.exports.quantize_x

        def product(x: np.ndarray) -> np.ndarray:
            x = inside(x, np.float32)  # (T, K)
            T = x.shape[0]
            y = empty((T, N), np.float32)  # (T, N)
            if fast is not None and T <= GROUPED_MAX_ROWS:
                # scratch: quantize_x's outputs (kernels.c QUANTIZED_X_BYTES), xq int16 (T, K) first, then
                # d (T, G) and group sums (T, G), then space the relaxed build's split x takes
                xq = self.scratch(T * K + 3 * T * G)
                d = xq + 2 * T * K
                xs = d + 4 * T * G
                quantize_x(at(x), xq, d, xs, T, K)
                fast(xq, d, xs, w, scales, mins, offset, at(y), T, N, K)
            else:
                need = T * G if T <= GROUPED_MAX_ROWS else TILE_ROWS * K
                exact(at(x), w, scales, mins, offset, at(y), self.scratch(need), T, N, K)
            return y

        return product


class HeapMemory:
    """The kernels' heap as the decode plan's memory (model/plan.py KernelMemory): Pyodide's, where every
    NumPy array is and nothing is copied; or a wasm memory on CPython whose arrays are NumPy views of it
    (native.py), where the plan's buffers and the cache are made and the weights placed once."""

    threads = 1

    def __init__(self, exports: Any, heap: Heap = PYODIDE_HEAP) -> None:
        self.exports, self.heap = exports, heap

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        return self.heap.empty(shape, dtype)

    staged = empty

    def address(self, a: np.ndarray) -> int:
        return self.heap.address(a)

    def place(self, a: np.ndarray, dtype: Any = None) -> np.ndarray:
        return self.heap.inside(a, dtype)

    def run(self, program: int, state: np.ndarray, rows: int, inputs: list, outputs: list, pick: int = 0) -> None:
        self.exports.run_plan(program, self.heap.address(state))  # (never asked to pick: no `picks`)


class WasmAttention:
    """Attention's two products through the kernels, head by head: the scores with `dense` (q @ keys^T:
    the keys are the matrix), the mix with `mix` (probs @ values). In Pyodide, NumPy multiplies these
    at ~0.7 GFLOP/s without a BLAS, and a prompt's attention grows with the square of its length: 8-13x
    slower than the kernels on a 1024-token prompt (benchmarks/RESULTS.md, "Long chats")."""

    def __init__(self, exports: Any, heap: Heap = PYODIDE_HEAP) -> None:
        self.dense, self.mixer, self.heap = exports.dense, exports.mix, heap

    def scores(self, q: np.ndarray, keys: np.ndarray) -> np.ndarray:
        K, Q, E = q.shape
        S = keys.shape[1]
        return self._per_head(self.dense, q, keys, (K, Q, S), Q, S, E)  # dense(x, w, y, T=Q, N=S, K=E)

    def mix(self, probs: np.ndarray, values: np.ndarray) -> np.ndarray:
        K, Q, S = probs.shape
        E = values.shape[2]
        return self._per_head(self.mixer, probs, values, (K, Q, E), Q, S, E)  # mix(p, v, y, Q, S, E)

    def _per_head(self, kernel: Any, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...], *sizes: int) -> np.ndarray:
        """kernel(a[h], b[h], y[h], *sizes) for each key/value head h; y of `shape`, float32."""
        at, inside = self.heap.address, self.heap.inside
        a = inside(a, np.float32)
        y = self.heap.empty(shape, np.float32)
        for h in range(shape[0]):
            b_h = inside(b[h], np.float32)  # (S, E): a view of the cache, as it is
            kernel(at(a[h]), at(b_h), at(y[h]), *sizes)
        return y
