"""The wasmtime host of the kernels (tests/kernel_host.py): NumPy arrays inside the wasm memory, on CPython.

The host lets tests call the kernels the way the engine does in Pyodide, by the addresses of NumPy arrays,
without Node or a browser. Checked here: a kernel reads and writes those arrays (dense and q8_exact against
NumPy, with tests/test_kernels.py's tolerance |y - NumPy's y| <= 1e-5 sum_k |x[t, k]| |w[n, k]|), the
memory grows without moving what is in it, freed blocks are reused, and address() refuses an array that
is not in the wasm memory. Every build that exists runs: the plain one and the relaxed SIMD one.
"""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

wasmtime = pytest.importorskip(
    "wasmtime", reason="wasmtime is not installed (pip install wasmtime==50.0.1, in the test extra)"
)

from kernel_host import INITIAL_PAGES, PAGE, KernelHost, kernel_wasm_paths  # noqa: E402

if not kernel_wasm_paths():
    pytest.skip("the WebAssembly kernels are not built (./build.sh kernels)", allow_module_level=True)

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module", params=kernel_wasm_paths(), ids=lambda path: path.stem)
def wasm(request):
    return request.param


@pytest.fixture(scope="module")
def host(wasm) -> KernelHost:
    """One host per build for the kernel tests."""
    return KernelHost(wasm)


@pytest.fixture
def new_host(wasm) -> KernelHost:
    """A host of its own, for the tests of the allocator: an empty memory of the initial size."""
    gc.collect()  # blocks of earlier hosts' arrays
    return KernelHost(wasm)


def data_address(host: KernelHost) -> int:
    """The memory's host address, as wasmtime answers it now."""
    return ctypes.cast(host.memory.data_ptr(host.store), ctypes.c_void_p).value


def outside_tolerance(y: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Where y is further from x @ w.T (in float64) than 1e-5 sum_k |x[t, k]| |w[n, k]|."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return np.argwhere(np.abs(y - x64 @ w64.T) > 1e-5 * (np.abs(x64) @ np.abs(w64).T))


def test_the_build_is_the_one_loaded(host):
    """relaxed_simd() answers 1 from the relaxed build only: wasmtime validated and ran the file asked for."""
    assert host.relaxed_simd == (host.path.name == "kernels-relaxed.wasm")


def test_the_plain_build_needs_no_relaxed_simd():
    """With relaxed SIMD off, wasmtime loads the plain build and refuses the relaxed one: the plain build is
    the one for runtimes without relaxed SIMD."""
    builds = {path.name: path for path in kernel_wasm_paths()}
    if "kernels.wasm" in builds:
        assert not KernelHost(builds["kernels.wasm"], relaxed=False).relaxed_simd
    if "kernels-relaxed.wasm" in builds:
        with pytest.raises(wasmtime.WasmtimeError, match="relaxed SIMD support is not enabled"):
            KernelHost(builds["kernels-relaxed.wasm"], relaxed=False)


@pytest.mark.parametrize(("T", "N", "K"), [(1, 7, 96), (5, 37, 160), (3, 5, 30)])
def test_dense_matches_numpy(host, T, N, K):
    """dense(x, w, y, T, N, K) writes y = x @ w.T into an array of ours; K = 30 is not a multiple of 4."""
    rng = np.random.default_rng(T * N * K)
    x = host.put(rng.standard_normal((T, K), dtype=np.float32))
    w = host.put(rng.standard_normal((N, K), dtype=np.float32))
    y = host.zeros((T, N))
    host.exports.dense(host.address(x), host.address(w), host.address(y), T, N, K)
    assert not len(bad := outside_tolerance(y, x, w)), f"{len(bad)} outputs off, first at {bad[0]}"


@pytest.mark.parametrize("with_mins", [True, False], ids=["mins", "no mins"])
@pytest.mark.parametrize("T", [1, 5])  # up to 4 rows: group by group; more: tiles expanded to float32
def test_q8_exact_matches_the_dequantized_product(host, T, with_mins):
    """q8_exact against NumPy's x @ w.T with w[n, k] = scales[n, g] (codes[n, k] - offset) + mins[n, g]:
    with mins (offset 0, as q4_1 is run) and without them (mins = 0, the NULL address; offset 8, as q4_0)."""
    N, K = 37, 160  # 37 rows: two tiles of 16 and a last one of 5
    rng = np.random.default_rng(T)
    offset = 0 if with_mins else 8
    # the kernel subtracts the offset in int8 (wrapping): with one, codes are 4-bit ones (0..15)
    low, high = (-128, 128) if with_mins else (0, 16)
    codes = host.put(rng.integers(low, high, (N, K), dtype=np.int8))
    scales = host.put(rng.uniform(0.001, 0.02, (N, K // 32)).astype(np.float32))
    mins = host.put(rng.uniform(-0.1, 0.1, (N, K // 32)).astype(np.float32)) if with_mins else None
    x = host.put(rng.standard_normal((T, K), dtype=np.float32))
    y = host.zeros((T, N))
    scratch = host.empty(16 * K if T > 4 else T * K // 32)
    host.exports.q8_exact(
        host.address(x),
        host.address(codes),
        host.address(scales),
        0 if mins is None else host.address(mins),
        offset,
        host.address(y),
        host.address(scratch),
        T,
        N,
        K,
    )
    w = np.repeat(scales, 32, axis=1) * (codes.astype(np.float32) - offset)
    if mins is not None:
        w += np.repeat(mins, 32, axis=1)
    assert not len(bad := outside_tolerance(y, x, w)), f"{len(bad)} outputs off, first at {bad[0]}"


def test_growing_the_memory_keeps_its_base_and_earlier_arrays(new_host):
    """An array bigger than the initial memory grows it; the memory's host address stays (NumPy arrays point
    into it), an array made before the grow keeps its values, and a kernel writes past the old end."""
    host = new_host
    base = data_address(host)
    before = host.put(np.arange(1000, dtype=np.float32))
    assert host.memory_size == INITIAL_PAGES * PAGE
    big = host.empty(INITIAL_PAGES * PAGE // 4)  # 4 MiB: more than is left
    assert host.memory_size > INITIAL_PAGES * PAGE
    assert host.address(big) + big.nbytes > INITIAL_PAGES * PAGE
    assert data_address(host) == base == host.base
    np.testing.assert_array_equal(before, np.arange(1000, dtype=np.float32))

    x, w = host.put(np.ones((1, 4), np.float32)), host.put(np.full((3, 4), 2, np.float32))
    y = big[-3:]  # past the old end of the memory
    host.exports.dense(host.address(x), host.address(w), host.address(y), 1, 3, 4)
    np.testing.assert_array_equal(y, [8, 8, 8])


def test_a_freed_block_is_reused_once_no_view_holds_it(new_host):
    """An array's block goes back when the array and its views are garbage, and the next array of that size
    gets it; while a view lives, it is not handed out again."""
    host = new_host
    a = host.empty((64, 64))
    address = host.address(a)
    view = a[1:, ::2]
    del a
    gc.collect()
    other = host.empty((64, 64))
    assert host.address(other) != address
    assert host.address(view) == address + 64 * 4
    del view
    gc.collect()
    assert host.address(host.empty((64, 64))) == address
    del other


def test_address_refuses_an_array_outside_the_wasm_memory(host):
    """A plain NumPy array's pointer means nothing to the kernels: address() says so instead of answering."""
    with pytest.raises(ValueError, match=r"not inside this host's wasm memory.*host\.empty\(\)"):
        host.address(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="takes a NumPy array"):
        host.address([1.0, 2.0])
    a = host.zeros(4)
    assert host.address(a[2:]) == host.address(a) + 8
