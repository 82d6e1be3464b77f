"""Our WebAssembly SIMD kernels (kernels/kernels.c) on CPython, through wasmtime (PyPI `wasmtime`, the
optional extra `ruvllm[kernels]`): the same binary, and the same bits, as in Pyodide and the browser.

In Pyodide the kernels run on Pyodide's own memory, so a NumPy array's data pointer is a kernel address.
NativeHost gives CPython the same: `empty`, `zeros` and `put` make NumPy arrays whose data lies inside
the module's linear memory, `address` turns such an array (or any view of it) into the i32 the kernels
take, and `exports.<name>(...)` calls a kernel. The module is freestanding: it imports `env.memory`, has
no data section and no stack in linear memory, so the whole memory is ours to allocate, except address 0
(NULL to the kernels: `mins = 0` means no mins), which no array gets. So wasm.py's WasmKernels and its
HeapMemory (the decode plan's) run here unchanged over a NativeHost (quant/wasm.py Heap), and NativeKernels
only moves each matrix's arrays into the memory when it is prepared: the model then holds its weights
there, once, as NumPy arrays that NumPy's own paths read as before.

An array's block goes back to the allocator when the array and all its views are garbage: each array is
made from its own ctypes buffer object, which every view keeps alive, and a weakref.finalize on that
object frees the block. The memory never moves when it grows (memory_may_move off, the whole 4 GiB
reserved), so arrays made before a grow stay valid.

A call from Python into wasmtime costs 40-80 µs (its ctypes binding): a product a call loses to BLAS on
small matrices, a decode plan's token a call does not (docs/kernels.md).
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import functools
import math
import threading
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .matrices import DenseMatrix, Int4Matrix, Int8Matrix
from .provider import DEFAULT_ARITHMETIC
from .wasm import Heap, WasmKernels, kernel_form

try:
    import wasmtime
except ImportError:  # (the optional extra: NumPy computes without it)
    wasmtime = None  # type: ignore[assignment]

PAGE = 65536
MAX_PAGES = 65536  # 4 GiB: all a 32-bit memory can address
INITIAL_PAGES = 64  # 4 MiB
ALIGN = 64  # every block starts on a 64-byte boundary (the kernels' v128 loads want 16)
BUILDS = ("kernels.wasm", "kernels-relaxed.wasm")


def kernel_wasm_paths() -> list[Path]:
    """The builds of the kernels this installation carries (./build.sh wheel puts npm/wasm's into the
    package): plain first, then relaxed."""
    folder = resources.files("ruvllm.quant")
    return [Path(str(folder.joinpath(name))) for name in BUILDS if folder.joinpath(name).is_file()]


class _Exports:
    """The module's functions by attribute: `host.exports.dense(x, w, y, T, N, K)` is wasmtime's
    `Func(store, x, w, y, T, N, K)`. Arguments go to wasmtime as they are: Python ints for i32 (wasmtime
    wraps them to 32 bits silently) and Python floats for f32; NumPy scalars other than float64 are refused
    by wasmtime (TypeError), so pass int(n) and float(s).

    A store may not be entered by two threads at once (wasmtime's C API leaves it undefined), and a call
    releases the GIL: every call holds `lock`, which every engine of the process that computes here
    shares (each holds only its own engine's lock)."""

    def __init__(self, store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        self._store = store
        self._funcs = {name: item for name, item in instance.exports(store).items() if isinstance(item, wasmtime.Func)}
        self.lock = threading.Lock()

    def __getattr__(self, name: str):
        func = self.__dict__.get("_funcs", {}).get(name)
        if func is None:
            raise AttributeError(f"the kernels export no function {name!r} (they have: {', '.join(self._funcs)})")
        call, lock = functools.partial(func, self._store), self.lock

        def locked(*args: Any) -> Any:
            with lock:
                return call(*args)

        setattr(self, name, locked)  # found in __dict__ next time, without __getattr__
        return locked

    def __dir__(self) -> list[str]:
        return sorted(self._funcs)


class NativeHost(Heap):
    """Our kernels.wasm instantiated by wasmtime on CPython, with NumPy arrays that live in its memory.

    relaxed: whether wasmtime validates relaxed SIMD. None (the default) turns it on, which loads both
    builds (the plain one uses none of it); False makes loading the relaxed build fail. `relaxed_simd`
    says which build was loaded (the module's own relaxed_simd())."""

    def __init__(self, wasm_path, relaxed: bool | None = None) -> None:
        config = wasmtime.Config()
        config.wasm_simd = True
        config.wasm_relaxed_simd = relaxed is not False
        # The memory's host address must never change: NumPy arrays point into it.
        config.memory_reservation = MAX_PAGES * PAGE
        config.memory_may_move = False
        self.engine = wasmtime.Engine(config)
        self.store = wasmtime.Store(self.engine)
        self.path = Path(wasm_path)
        self.module = wasmtime.Module.from_file(self.engine, str(self.path))
        self.memory = self._memory_for(self.module)
        self.instance = wasmtime.Instance(self.store, self.module, [self.memory])
        self.exports = _Exports(self.store, self.instance)
        self.base = self._data_address()
        self.relaxed_simd = bool(self.exports.relaxed_simd())

        self._lock = threading.Lock()
        self._top = ALIGN  # the bump region starts here: address 0 stays unallocated (NULL)
        self._free: list[tuple[int, int]] = []  # (offset, size) below _top, sorted, never adjacent
        self._freed: collections.deque[tuple[int, int]] = collections.deque()  # from finalizers, not yet merged

    def _memory_for(self, module: wasmtime.Module) -> wasmtime.Memory:
        """Our memory for the module's one import, env.memory (plain, not shared, 32-bit)."""
        imports = [(item.module, item.name, item.type) for item in module.imports]
        if len(imports) != 1 or imports[0][:2] != ("env", "memory"):
            raise ValueError(f"{self.path.name}: expected one import, env.memory; it imports {imports}")
        ty = imports[0][2]
        if not isinstance(ty, wasmtime.MemoryType) or ty.is_shared or ty.is_64:
            raise ValueError(
                f"{self.path.name}: env.memory is not a plain 32-bit memory (the shared builds need a shared one)"
            )
        pages = max(INITIAL_PAGES, ty.limits.min)
        return wasmtime.Memory(self.store, wasmtime.MemoryType(wasmtime.Limits(pages, MAX_PAGES)))

    def _data_address(self) -> int:
        return ctypes.cast(self.memory.data_ptr(self.store), ctypes.c_void_p).value or 0

    @property
    def memory_size(self) -> int:
        """The linear memory's size in bytes."""
        return self.memory.data_len(self.store)

    # ---- allocation ----------------------------------------------------------------------------------------

    def _grow(self, end: int) -> None:
        """Grows the memory to at least `end` bytes (at least doubling it, up to 4 GiB)."""
        have = self.memory.size(self.store)
        need = -(-end // PAGE)
        if need > MAX_PAGES:
            raise MemoryError(f"the kernels' memory would need {end} bytes; a 32-bit memory has 4 GiB")
        self.memory.grow(self.store, min(max(need, 2 * have), MAX_PAGES) - have)
        if self._data_address() != self.base:
            raise RuntimeError(
                "wasmtime moved the kernels' memory when it grew: every array made before now points at freed "
                "memory (memory_may_move is off and 4 GiB reserved, so this should not happen)"
            )

    def _release(self, offset: int, size: int) -> None:
        """Finalizer: queue the block (the allocator takes it back at its next call, under its lock)."""
        self._freed.append((offset, size))

    def _merge_freed(self) -> None:
        while self._freed:
            offset, size = self._freed.popleft()
            i = bisect.bisect(self._free, (offset, size))
            if i < len(self._free) and offset + size == self._free[i][0]:
                size += self._free.pop(i)[1]
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
                offset, size = self._free[i - 1][0], self._free[i - 1][1] + size
                i -= 1
                self._free.pop(i)
            if offset + size == self._top:
                self._top = offset
            else:
                self._free.insert(i, (offset, size))

    def _allocate(self, nbytes: int) -> tuple[int, int]:
        """A block of at least nbytes (at least one byte, so every array has an address of its own)."""
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self._lock:
            self._merge_freed()
            for i, (offset, have) in enumerate(self._free):  # first fit
                if have >= size:
                    if have == size:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + size, have - size)
                    return offset, size
            offset = self._top
            if offset + size > self.memory_size:
                self._grow(offset + size)
            self._top = offset + size
            return offset, size

    # ---- arrays --------------------------------------------------------------------------------------------

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A new C-contiguous array (uninitialized) whose data is inside the wasm memory, 64-byte aligned."""
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError(f"an array of {dtype} holds Python objects; the kernels cannot read it")
        shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
        count = math.prod(shape)
        offset, size = self._allocate(count * dtype.itemsize)
        buffer = (ctypes.c_char * (count * dtype.itemsize)).from_address(self.base + offset)
        # The block is freed when the buffer is garbage, and every view of the array keeps it alive. The
        # finalizer holds this host, so the memory outlives every array in it.
        weakref.finalize(buffer, self._release, offset, size).atexit = False
        return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)

    def zeros(self, shape, dtype=np.float32) -> np.ndarray:
        """A new array of zeros inside the wasm memory (a reused block holds old data: it is cleared)."""
        array = self.empty(shape, dtype)
        array[...] = 0
        return array

    def put(self, array) -> np.ndarray:
        """A C-contiguous copy of `array` inside the wasm memory."""
        array = np.asarray(array)
        copy = self.empty(array.shape, array.dtype)
        copy[...] = array
        return copy

    def inside(self, a: Any, dtype: Any = None) -> np.ndarray:
        """`a` (as `dtype`) itself where it is a C-contiguous array in this memory already, else a copy here."""
        if isinstance(a, np.ndarray) and (dtype is None or a.dtype == np.dtype(dtype)) and a.flags.c_contiguous:
            data = a.ctypes.data
            if self.base <= data and data + a.nbytes <= self.base + self.memory_size:
                return a
        return self.put(np.asarray(a, dtype))

    def address(self, a: np.ndarray) -> int:
        """The wasm address of a's data; a (an array from this host, or a view of one) must lie wholly
        inside the wasm memory. Only the position is checked: a kernel reads rows as the strides of a
        C-contiguous array, so pass it views that are."""
        if not isinstance(a, np.ndarray):
            raise TypeError(f"address() takes a NumPy array, not {type(a).__name__}")
        data = a.ctypes.data
        low = high = data
        if a.size:
            for n, stride in zip(a.shape, a.strides, strict=True):
                extent = (n - 1) * stride
                low, high = (low + extent, high) if extent < 0 else (low, high + extent)
            high += a.itemsize
        end = self.base + self.memory_size
        if not (self.base <= low and high <= end):
            raise ValueError(
                f"address(): the array's data ({low:#x}..{high:#x}) is not inside this host's wasm memory "
                f"({self.base:#x}..{end:#x}); make it with host.empty(), host.zeros() or host.put()"
            )
        return data - self.base


class NativeKernels(WasmKernels):
    """WasmKernels on CPython, over a NativeHost: `prepare` first moves the matrix's arrays into the
    kernels' memory (the matrix keeps them there: the weights are held once)."""

    heap: NativeHost

    def prepare(self, matrix: object) -> Any:
        if kernel_form(matrix) is None:
            return None  # NumPy computes it
        inside = self.heap.inside
        if isinstance(matrix, DenseMatrix):
            matrix.weight = inside(matrix.weight, np.float32)
        elif isinstance(matrix, Int8Matrix):
            if isinstance(matrix, Int4Matrix):
                matrix.packed = inside(matrix.packed)
            else:
                matrix.codes = inside(matrix.codes)
            matrix.scales = inside(matrix.scales, np.float32)
            if matrix.mins is not None:
                matrix.mins = inside(matrix.mins, np.float32)
        return super().prepare(matrix)


def self_test(host: NativeHost) -> bool:
    """wasm.py's known answer (the q4 decoding, tiled and fast paths, the float32 product) through the
    kernels in `host`, as host.py checks it in Pyodide: a build whose SIMD computes wrongly here is found
    before it computes a model."""
    from . import wasm

    case = wasm.known_answer()
    e, at, put = host.exports, host.address, host.put
    packed, scales, mins = put(case["packed"]), put(np.full(2, 0.5, np.float32)), put(np.full(2, -1, np.float32))
    x, x_fast, dense = put(case["x"]), put(case["x_fast"]), put(case["dense"])
    y, scratch = host.zeros(2), host.zeros(1024)
    # quantize_x's outputs as WasmKernels lays them out: xq int16 (1, 32), d, the group sums, then the
    # relaxed build's split x (room to spare)
    xq = at(host.zeros(1024, np.uint8))
    d, xs = xq + 2 * 32, xq + 2 * 32 + 4

    def exact(T: int) -> None:
        e.q4_exact(at(x), at(packed), at(scales), at(mins), 0, at(y), at(scratch), T, 2, 32)

    def fast(offset: int) -> None:
        e.quantize_x(at(x_fast), xq, d, xs, 1, 32)
        e.q4_fast(xq, d, xs, at(packed), at(scales), at(mins), offset, at(y), 1, 2, 32)

    runs = [
        (lambda: exact(1), "answer"),
        (lambda: exact(5), "answer"),
        (lambda: e.dense(at(x), at(dense), at(y), 1, 2, 32), "answer"),
        (lambda: fast(0), "answer_fast"),
        (lambda: fast(8), "answer_fast8"),
    ]
    for run, answer in runs:
        y[:] = np.nan
        run()
        if not np.array_equal(y, case[answer]):
            return False
    return True


@functools.cache
def native_host() -> tuple[NativeHost | None, str | None]:
    """The kernels on CPython (one host a process, made once): the relaxed SIMD build where wasmtime
    validates it and it passes the self-test, else the plain one; or None and why they cannot run."""
    if wasmtime is None:
        return None, "wasmtime is not installed (pip install 'ruvllm[kernels]')"
    paths = {path.name: path for path in kernel_wasm_paths()}
    if "kernels.wasm" not in paths:
        return None, "this ruvllm installation has no quant/kernels.wasm (./build.sh wheel puts it in)"
    why = None
    for name in ("kernels-relaxed.wasm", "kernels.wasm"):
        if name not in paths:
            continue
        try:
            host = NativeHost(paths[name])
        except Exception as error:  # (a build this wasmtime does not validate: the next one)
            why = f"wasmtime cannot run {name}: {str(error).splitlines()[0]}"
            continue
        if self_test(host):
            return host, None
        why = f"{name} gave a wrong answer on the kernels' self-test under this wasmtime"
    return None, why


def native_kernels(arithmetic: str = DEFAULT_ARITHMETIC) -> tuple[NativeKernels | None, str | None]:
    """The WebAssembly kernels on CPython, or None and why they cannot run here."""
    host, reason = native_host()
    if host is None:
        return None, reason
    return NativeKernels(host.exports, arithmetic, host), None
