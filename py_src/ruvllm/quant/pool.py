"""The WebAssembly SIMD kernels on several threads (the kernel thread pool, npm/src/worker/pool.js).

The pool has a shared WebAssembly memory of its own, separate from Pyodide's: each matrix's parts
(codes, scales, mins; float32 weights) are copied there once, when the matrix is prepared, and each
product then copies x in and y out, one call from Python through JavaScript per product. That copy is
then the only one: `use_provider` hands the matrix's arrays over (`take_parts`), and the matrix keeps
`RemoteArray` stand-ins that copy what the NumPy paths read (embedding rows, a learning step's blocks,
a whole matrix to merge into) back into Pyodide's heap when they read it. So the weights live in the
pool's memory, a second 4 GiB beside Pyodide's. A matrix whose values change (an adapter merged into
float32 weights) is prepared again (use_provider), and the space of a product that is no longer
referenced (the old one, or the short-lived blocks of a learning step) is handed out again. The pool's
threads each compute a slice of the output features in whole 16-row tiles, so every product has the
bits of the single-thread kernels (wasm.py) at every thread count.

`api` is the worker's object for this (npm/src/worker/threads.js: place, matrix, product, threads), a
JsProxy in Pyodide; nothing here imports `js`. Addresses are NumPy data pointers in Pyodide's memory.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from .matrices import DenseMatrix, Int4Matrix, Int8Matrix
from .provider import DEFAULT_ARITHMETIC, check_arithmetic
from .wasm import GROUPED_MAX_ROWS, WasmKernels, address, kernel_form


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two float32 arrays hold the same bits (so every product of them has the same bits too).
    Their bytes compared: for a decoding row, 2.6 µs against np.array_equal's 18 µs in Pyodide."""
    return a.shape == b.shape and a.tobytes() == b.tobytes()


class RemoteArray:
    """An array whose one copy is outside Pyodide's heap, at `at` of a memory `fetch` reads (the pool's
    memory; a weight file's bytes in JavaScript memory): reading rows of it, a range of rows or all of it
    (np.asarray) copies what is read into a new NumPy array in the heap. It keeps `owner` (what holds those
    bytes: the product of the matrix, the file) alive, and so the bytes."""

    def __init__(
        self, fetch: Callable[[int, int, int], object], owner: object, at: int, shape: tuple[int, ...], dtype: Any
    ) -> None:
        self.fetch, self.owner, self.at = fetch, owner, at
        self.pool: object = None  # the kernel pool whose memory holds it, if one does (PoolKernels._stand_in)
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.ndim = len(shape)
        self.size = math.prod(shape)
        self.nbytes = self.size * self.dtype.itemsize
        self.row_bytes = self.nbytes // shape[0] if shape[0] else 0

    def __len__(self) -> int:
        return self.shape[0]

    def _rows(self, r0: int, r1: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [r0, r1), copied (into `out` when given)."""
        if out is None:
            out = np.empty((r1 - r0, *self.shape[1:]), dtype=self.dtype)
        if out.nbytes:
            self.fetch(self.at + r0 * self.row_bytes, out.nbytes, address(out))
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self._rows(0, self.shape[0])
        return a if dtype is None else a.astype(dtype, copy=False)

    def copy(self) -> np.ndarray:
        return self._rows(0, self.shape[0])

    def __getitem__(self, index: Any) -> np.ndarray:
        n = self.shape[0]
        if isinstance(index, slice):
            r0, r1, step = index.indices(n)
            if step == 1:
                return self._rows(r0, max(r0, r1))
        elif isinstance(index, int | np.integer):
            i = operator.index(index)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis 0 with size {n}")
            return self._rows(i % n, i % n + 1)[0]
        elif isinstance(index, np.ndarray) and index.dtype.kind in "iu":
            return self._gather(index)
        return np.asarray(self)[index]

    def _gather(self, index: np.ndarray) -> np.ndarray:
        """Rows `index` (any shape of integers), one copy per run of consecutive rows."""
        n = self.shape[0]
        ids = index.reshape(-1).astype(np.int64)
        if ids.size and (ids.min() < -n or ids.max() >= n):
            bad = int(ids.max() if ids.max() >= n else ids.min())
            raise IndexError(f"index {bad} is out of bounds for axis 0 with size {n}")
        ids %= max(n, 1)
        out = np.empty((ids.size, *self.shape[1:]), dtype=self.dtype)
        starts = np.flatnonzero(np.diff(ids) != 1) + 1
        for lo, hi in zip([0, *starts.tolist()], [*starts.tolist(), ids.size], strict=True):
            self._rows(int(ids[lo]), int(ids[lo]) + hi - lo, out[lo:hi])
        return out.reshape(*index.shape, *self.shape[1:])


class PoolArray:
    """An array whose one copy is in the kernel thread pool's memory (PoolMemory.empty: the decode plan's
    buffers, the KV cache's tiers and the residual tap when the plan runs on the pool). Indexing with
    integers and slices of step 1 gives a view (another PoolArray over the same bytes); reading it
    (np.asarray, `copy`, any other index) copies into a new NumPy array in the heap; assigning to a view
    copies the value in, one call per contiguous run. That is all cache.py and kv.py do with their buffers,
    so the cache works the same in either memory; only the plan reads it where it is."""

    def __init__(
        self, memory: PoolMemory, at: int, shape: tuple[int, ...], dtype: Any, strides: tuple[int, ...], base: object
    ) -> None:
        self.memory, self.at, self.shape, self.dtype = memory, at, shape, np.dtype(dtype)
        self.strides, self.base = strides, base  # (base: what holds the region, freed when it goes)
        self.ndim, self.size = len(shape), math.prod(shape)
        self.nbytes = self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def _runs(self) -> list[tuple[int, int, int]]:
        """(address in the pool, offset in a C-ordered copy, bytes) of each contiguous run of the view."""
        if not self.size:
            return []
        d, run = self.ndim, self.dtype.itemsize
        while d and (self.shape[d - 1] == 1 or self.strides[d - 1] == run):
            run *= self.shape[d - 1]
            d -= 1
        starts = [
            self.at + sum(i * s for i, s in zip(index, self.strides, strict=False))
            for index in np.ndindex(*self.shape[:d])
        ]
        return [(at, k * run, run) for k, at in enumerate(starts)]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.copy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def copy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        fetch, to = self.memory.fetch, address(out)
        for at, offset, n in self._runs():
            fetch(at, n, to + offset)
        return out

    def _view(self, index: Any) -> PoolArray | None:
        """The view `index` selects, or None when it is not integers and slices of step 1."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) == 1 and index[0] is Ellipsis:  # (not ==: an array in the index compares elementwise)
            index = ()
        if len(index) > self.ndim:
            return None
        at, shape, strides = self.at, [], []
        for axis, i in enumerate(index):
            n, stride = self.shape[axis], self.strides[axis]
            if isinstance(i, slice):
                r0, r1, step = i.indices(n)
                if step != 1:
                    return None
                at += r0 * stride
                shape.append(max(0, r1 - r0))
                strides.append(stride)
            elif isinstance(i, int | np.integer) and not isinstance(i, bool | np.bool_):
                k = operator.index(i)
                if not -n <= k < n:
                    raise IndexError(f"index {k} is out of bounds for axis {axis} with size {n}")
                at += (k % n) * stride
            else:
                return None
        shape += self.shape[len(index) :]
        strides += self.strides[len(index) :]
        return PoolArray(self.memory, at, tuple(shape), self.dtype, tuple(strides), self.base)

    def __getitem__(self, index: Any) -> PoolArray | np.ndarray:
        view = self._view(index)
        return np.asarray(self)[index] if view is None else view

    def __setitem__(self, index: Any, value: Any) -> None:
        view = self._view(index)
        if view is None:
            raise TypeError(f"a PoolArray is assigned through integers and slices of step 1, not {index!r}")
        source = np.ascontiguousarray(np.broadcast_to(np.asarray(value, dtype=self.dtype), view.shape))
        write, source_at = self.memory.write, address(source)
        for at, offset, n in view._runs():
            write(source_at + offset, n, at)


class PoolMemory:
    """The kernel thread pool's shared memory as the decode plan's KernelMemory (model/plan.py): the plan's
    buffers and the KV cache are PoolArrays there; the arrays Python fills or reads every call are NumPy
    arrays in the heap with a twin region in the pool (`staged`), which each call copies (`run`: in and
    out in the one call from Python, with the plan's run on the pool's threads between). The weights of
    the matrices the pool holds are read where they are (their RemoteArray stand-ins); the rest are copied
    there: norms and biases once per plan (DecodePlan.shared), an adapter's arrays once per program.

    Any memory with the same calls can stand in for the pool's (`kernels.api`: region, free, fetch, write
    and plan; `kernels.threads`): the WebGPU executor's is one (npm/src/worker/gpu/executor.js)."""

    TABLE_DTYPE: Any = np.uint32  # run's table of copies: Pyodide's addresses are 32-bit
    half_scales = False  # whether the plan may place exactly-float16 scales as such (a GPU's: plan.py HALF)
    picks = False  # whether `run` can pick the largest logits (a GPU's: plan.py TopLogits)

    def __init__(self, kernels: PoolKernels) -> None:
        api = kernels.api
        self.kernels, self.threads = kernels, kernels.threads
        self.fetch, self.write, self._region, self._free, self._plan = (
            api.fetch,
            api.write,
            api.region,
            api.free,
            api.plan,
        )
        self._staged: dict[int, tuple[int, int]] = {}  # heap address -> (bytes, pool address) of each staged array
        self._tables: dict[tuple, tuple[np.ndarray, int, int, int]] = {}  # run's tables of copies, kept

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> PoolArray:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        row = nbytes // shape[0] if len(shape) > 1 and shape[0] else 0  # (a GPU splits a large matrix by rows)
        at = int(self._region(max(nbytes, 16), row))
        owner = _Region()
        weakref.finalize(owner, self._free, at).atexit = False
        strides: list[int] = []
        step = dtype.itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
        return PoolArray(self, at, shape, dtype, tuple(strides), owner)

    def staged(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> np.ndarray:
        a = np.zeros(shape, dtype)
        heap, at = address(a), int(self._region(max(a.nbytes, 16)))
        self._staged[heap] = a.nbytes, at
        weakref.finalize(a, self._unstage, heap, at).atexit = False  # (its twin goes with it)
        return a

    def _unstage(self, heap: int, at: int) -> None:
        self._staged.pop(heap, None)
        self._tables.clear()  # (they name arrays by id, which a new array may take)
        self._free(at)

    def address(self, a: Any) -> int:
        if isinstance(a, PoolArray | RemoteArray):
            return a.at
        at = address(a)
        for heap, (nbytes, pool) in self._staged.items():
            if heap <= at < heap + max(nbytes, 1):
                return pool + at - heap
        raise ValueError("this array is not in the kernel pool's memory (nor staged for it)")

    def place(self, a: Any, dtype: Any = None) -> Any:
        if isinstance(a, RemoteArray) and getattr(a, "pool", None) is self.kernels:
            if dtype is None or a.dtype == np.dtype(dtype):
                return a  # (a matrix's part the pool holds: read where it is)
        a = np.ascontiguousarray(a, dtype)
        kept = self.empty(a.shape, a.dtype)
        kept[...] = a
        return kept

    def run(self, program: int, state: np.ndarray, rows: int, inputs: list, outputs: list, pick: int = 0) -> None:
        # the copies' table for these inputs and outputs, made once (each address costs microseconds in
        # Pyodide; a token's table is the same every time, a prompt's chunks take a few)
        key = (*((id(a), n) for a, n in inputs), None, *((id(a), n) for a, n in outputs))
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= 64:
                self._tables.clear()
            copies = [(0, a, n) for a, n in inputs] + [(1, a, n) for a, n in outputs]
            mask = int(np.iinfo(self.TABLE_DTYPE).max)  # (Pyodide's pointers past 2 GiB are negative)
            each = np.array([(d, address(a) & mask, self.address(a), n) for d, a, n in copies], self.TABLE_DTYPE)
            self._tables[key] = table = (each, address(each), len(copies), self.address(state))
        _, at, count, state_at = table
        self._plan(program, state_at, rows, at, count, *((pick,) if pick else ()))  # (only a GPU's picks)


class _Region:
    """What a PoolArray's region lives as long as (its views hold it)."""


class OutsideFile:
    """A weight file arriving in pieces into JavaScript memory (threads.js `file`), not Pyodide's heap: with
    the kernel thread pool, the weights never sit in the heap whole. `bytes` reads it (a RemoteArray): the
    tensors are copied into the heap one at a time while their compute forms are made, and those go to
    the pool. The JavaScript buffer is dropped with `bytes` (which the parsed file holds: after the load)."""

    def __init__(self, api: Any, size: int, source: str) -> None:
        self.api, self.size, self.source = api, size, source
        self.filled = 0
        self.id = number = int(api.file(size))
        self._scratch = np.empty(0, dtype=np.uint8)
        read = api.read
        self.bytes = RemoteArray(lambda at, n, to: read(number, at, n, to), None, 0, (size,), np.uint8)
        weakref.finalize(self.bytes, api.drop, number).atexit = False  # (the parsed file holds `bytes`)

    def write(self, chunk: Any, length: int) -> memoryview:
        """Append `length` bytes (a JsProxy of a Uint8Array, or a bytes-like object); their bytes (for the
        digest), through a scratch buffer in the heap that serves every piece."""
        if self._scratch.size < length:
            self._scratch = np.empty(max(length, 2 * self._scratch.size), dtype=np.uint8)
        piece = self._scratch[:length]
        if hasattr(chunk, "assign_to"):
            chunk.assign_to(piece)
        else:
            piece[:] = memoryview(chunk).cast("B")
        self.api.put(self.id, self.filled, address(piece), length)
        self.filled += length
        return piece.data


class Fused:
    """Matrices multiplied by the same x one after another (q, k, v; gate, up): the first product asked
    for runs all of them in one dispatch, and keeps the others' outputs with a copy of x; a sibling asked
    next with an x of the same bits gets its kept output (the bits its own dispatch would give), any
    other x its own dispatch. The outputs of a dispatch lie one after another in one array, so a
    dispatch asks for two addresses whatever the group's size: an address costs microseconds in
    Pyodide, more after a product has streamed megabytes of weights through the caches (each piece
    timed in a 1B model's decoding: RESULTS.md, issue 25)."""

    def __init__(self, kernels: PoolKernels, handles: list[int], rows: list[int], group: int) -> None:
        self.kernels, self.handles, self.group = kernels, handles, group
        self.run = kernels.api.fused  # (looked up once: each lookup of a JsProxy's attribute makes a proxy)
        self.fast = kernels.arithmetic == "fast"
        self.starts = [sum(rows[:i]) for i in range(len(rows) + 1)]  # member i's features in a row of y
        self.x: np.ndarray | None = None
        self.kept: dict[int, np.ndarray] = {}

    def product(self, handle: int, x: np.ndarray) -> np.ndarray:
        """x @ W.T for member `handle` (x float32, contiguous)."""
        kept = self.kept.pop(handle, None)
        if kept is not None and self.x is not None and same_bits(x, self.x):
            return kept
        T, at = x.shape[0], self.starts
        y = np.empty(T * at[-1], dtype=np.float32)  # member i's (T, N_i) at T * at[i]
        self.run(self.group, address(x), T, self.fast and T <= GROUPED_MAX_ROWS, address(y))
        ys = [y[T * a : T * b].reshape(T, b - a) for a, b in itertools.pairwise(at)]
        self.x = x.copy()
        self.kept = {h: out for h, out in zip(self.handles, ys, strict=True) if h != handle}
        return ys[self.handles.index(handle)]


class PoolKernels:
    """Matrix products on the kernel thread pool; the same arithmetic, and the same bits, as WasmKernels.

    `prepare` copies a matrix's arrays into the pool; `take_parts` (use_provider calls it) then swaps
    the matrix's arrays for RemoteArray stand-ins, so the pool's copy is the only one.
    """

    name = "wasm"

    def __init__(
        self, api: Any, arithmetic: str = DEFAULT_ARITHMETIC, local: WasmKernels | None = None
    ) -> None:  # (api: a JsProxy, dynamic)
        self.api = api
        self.arithmetic = check_arithmetic(arithmetic)
        # attention reads the KV cache in Pyodide's memory: the single-thread kernels there compute it
        self.attention = None if local is None else local.attention
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

    def transposed(self, matrix: object) -> Callable[[np.ndarray, np.ndarray, int, int], None] | None:
        """add(dy, y, n0, n1): y (T, K) += dy[:, n0:n1] @ W[n0:n1] on the pool's threads, from the copy of
        the matrix the pool holds (learning's backward; WasmKernels.transposed), or None for a matrix
        this pool does not hold."""
        product = getattr(matrix, "_product", None)
        found = getattr(product, "pool", None)
        if found is None or found[0] is not self:
            return None
        handle, run = found[1], self.api.transposed

        def add(dy: np.ndarray, y: np.ndarray, n0: int, n1: int) -> None:
            assert product is not None  # (kept alive here: its handle names the matrix in the pool)
            run(handle, address(dy), dy.shape[0], address(y), n0, n1)

        return add

    def take_parts(self, matrix: object, product: Callable[[np.ndarray], np.ndarray]) -> None:
        """The matrix's arrays, of which `product` (from prepare) placed copies, become stand-ins that
        read those copies: the NumPy arrays go, and the pool's memory holds the weights."""
        _, _, _, at = product.pool  # type: ignore[attr-defined]
        if isinstance(matrix, DenseMatrix):
            matrix.weight = self._stand_in(product, at["w"], matrix.weight)  # type: ignore[assignment]
            return
        assert isinstance(matrix, Int8Matrix)  # (prepare gave a product: a form the kernels know)
        if isinstance(matrix, Int4Matrix):
            matrix.packed = self._stand_in(product, at["w"], matrix.packed)  # type: ignore[assignment]
        else:
            matrix.codes = self._stand_in(product, at["w"], matrix.codes)  # type: ignore[assignment]
        matrix.scales = self._stand_in(product, at["scales"], matrix.scales)  # type: ignore[assignment]
        if matrix.mins is not None:
            matrix.mins = self._stand_in(product, at["mins"], matrix.mins)  # type: ignore[assignment]

    def _stand_in(self, product: object, at: int, a: np.ndarray | RemoteArray) -> RemoteArray:
        stand_in = RemoteArray(self.api.fetch, product, at, tuple(a.shape), a.dtype)
        stand_in.pool = self  # (in this pool's memory: the decode plan reads it there, PoolMemory.place)
        return stand_in

    @functools.cached_property
    def memory(self) -> PoolMemory:
        """The memory the decode plan runs in: the pool's."""
        return PoolMemory(self)

    def fuse(self, matrices: list[object]) -> bool:
        """Declare that these matrices multiply the same x one after another (Fused). Only matrices whose
        products this provider runs, all with the same K, and in no other group; False (nothing changes)
        otherwise."""
        found = [getattr(getattr(m, "_product", None), "pool", None) for m in matrices]
        products = [p for p in found if p is not None and p[0] is self]
        if len(products) < 2 or len(products) < len(found):
            return False
        handles, shapes = [p[1] for p in products], [p[2] for p in products]  # (p: product.pool)
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

        at = {"w": w, "scales": scales, "mins": mins}  # where its parts are in the pool's memory
        product.pool = (self, handle, (N, K), at)  # type: ignore[attr-defined]  # (what fuse, take_parts read)
        weakref.finalize(product, self._release, handle).atexit = False
        return product
