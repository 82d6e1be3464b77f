"""The WebAssembly SIMD kernels on several threads (the kernel thread pool, npm/src/worker/pool.js).

The pool has a shared WebAssembly memory of its own, separate from Pyodide's: each matrix's parts
(codes, scales, mins; float32 weights) are copied there once, when the matrix is prepared, and each
product then copies x in and y out, one call from Python through JavaScript per product. The copy is
what the products read: a matrix whose values change in place (an adapter merged into float32 weights)
is prepared again (use_provider), and the space of a product that is no longer referenced (the old one,
or the short-lived blocks of a learning step) is handed out again. The pool's
threads each compute a slice of the output features in whole 16-row tiles, so every product has the
bits of the single-thread kernels (wasm.py) at every thread count.

`api` is the worker's object for this (npm/src/worker/threads.js: place, matrix, product, threads), a
JsProxy in Pyodide; nothing here imports `js`. Addresses are NumPy data pointers in Pyodide's memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .matrices import DenseMatrix, Int8Matrix
from .provider import DEFAULT_ARITHMETIC, check_arithmetic
from .wasm import GROUPED_MAX_ROWS, address, kernel_form


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two float32 arrays hold the same bits (so every product of them has the same bits too)."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


class Fused:
    """Matrices multiplied by the same x one after another (q, k, v; gate, up): the first product asked
    for runs all of them in one dispatch, and keeps the others' outputs with a copy of x; a sibling asked
    next with an x of the same bits gets its kept output (the bits its own dispatch would give), any
    other x its own dispatch."""

    def __init__(self, kernels: PoolKernels, handles: list[int], rows: list[int], group: int) -> None:
        self.kernels, self.handles, self.rows, self.group = kernels, handles, rows, group
        self.x: np.ndarray | None = None
        self.kept: dict[int, np.ndarray] = {}

    def product(self, handle: int, x: np.ndarray) -> np.ndarray:
        """x @ W.T for member `handle` (x float32, contiguous)."""
        kept = self.kept.pop(handle, None)
        if kept is not None and self.x is not None and same_bits(x, self.x):
            return kept
        T = x.shape[0]
        ys = [np.empty((T, n), dtype=np.float32) for n in self.rows]  # (T, N_i) each
        fast = self.kernels.arithmetic == "fast" and T <= GROUPED_MAX_ROWS
        self.kernels.api.fused(self.group, address(x), T, fast, *[address(y) for y in ys])
        self.x = x.copy()
        self.kept = {h: y for h, y in zip(self.handles, ys, strict=True) if h != handle}
        return ys[self.handles.index(handle)]


class PoolKernels:
    """Matrix products on the kernel thread pool; the same arithmetic, and the same bits, as WasmKernels.

    The matrices' NumPy arrays stay where they are (the NumPy paths still read them); the pool holds a
    copy of each prepared matrix.
    """

    name = "wasm"

    def __init__(self, api: Any, arithmetic: str = DEFAULT_ARITHMETIC) -> None:  # (a JsProxy: dynamic)
        self.api = api
        self.arithmetic = check_arithmetic(arithmetic)
        self.threads = int(api.threads)
        self.fused: dict[int, Fused] = {}  # handle -> its group

    def place(self, a: np.ndarray) -> int:
        """A copy of the array in the pool's memory: its address there."""
        a = np.ascontiguousarray(a)
        return int(self.api.place(address(a), a.nbytes))

    def prepare(self, matrix: object) -> Callable[[np.ndarray], np.ndarray] | None:
        known = kernel_form(matrix)
        if known is None:
            return None  # NumPy computes it (as with WasmKernels)
        form, codes = known
        if isinstance(matrix, DenseMatrix):
            weight = np.ascontiguousarray(codes, dtype=np.float32)
            return self._product("dense", matrix.shape, self.place(weight), 0, 0, 0)
        assert isinstance(matrix, Int8Matrix)  # (every other form the kernels know)
        return self._quantized(matrix, codes, form)

    def fuse(self, matrices: list[object]) -> bool:
        """Declare that these matrices multiply the same x one after another (Fused). Only matrices whose
        products this provider runs, all with the same K, and in no other group; False (nothing changes)
        otherwise."""
        found = [getattr(getattr(m, "_product", None), "pool", None) for m in matrices]
        products = [p for p in found if p is not None and p[0] is self]
        if len(products) < 2 or len(products) < len(found):
            return False
        handles, shapes = [p[1] for p in products], [p[2] for p in products]
        if (
            len({K for _, K in shapes}) != 1
            or any(h in self.fused for h in handles)
            or len(set(handles)) < len(handles)
        ):
            return False
        group = Fused(self, handles, [N for N, _ in shapes], int(self.api.fuse(*handles)))
        for h in handles:
            self.fused[h] = group
        return True

    def _release(self, handle: int) -> None:
        """A product is no longer referenced: its group (if any) ends, and its matrix leaves the pool."""
        group = self.fused.get(handle)
        if group is not None:
            for h in group.handles:
                self.fused.pop(h, None)
            self.api.unfuse(group.group)
        self.api.release(handle)

    def _quantized(self, m: Int8Matrix, codes: np.ndarray, form: str) -> Callable[[np.ndarray], np.ndarray]:
        scales = self.place(np.asarray(m.scales, dtype=np.float32))
        mins = 0 if m.mins is None else self.place(np.asarray(m.mins, dtype=np.float32))
        return self._product(form, m.shape, self.place(codes), scales, mins, int(m.offset))

    def _product(
        self, form: str, shape: tuple[int, int], w: int, scales: int, mins: int, offset: int
    ) -> Callable[[np.ndarray], np.ndarray]:
        N, K = shape
        handle = int(self.api.matrix(form, w, scales, mins, offset, N, K))
        run = self.api.product
        fast = self.arithmetic == "fast" and form != "dense"

        fused = self.fused

        def product(x: np.ndarray) -> np.ndarray:
            x = np.ascontiguousarray(x, dtype=np.float32)  # (T, K)
            group = fused.get(handle)
            if group is not None:
                return group.product(handle, x)
            T = x.shape[0]
            y = np.empty((T, N), dtype=np.float32)  # (T, N)
            run(handle, address(x), T, address(y), fast and T <= GROUPED_MAX_ROWS)
            return y

        product.pool = (self, handle, (N, K))  # type: ignore[attr-defined]  # (what fuse reads)
        weakref.finalize(product, self._release, handle).atexit = False
        return product
