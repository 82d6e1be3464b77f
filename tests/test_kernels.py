"""The WebAssembly SIMD kernels (kernels/kernels.c) against NumPy's products (quant/matrices.py).

The kernels run in Node's plain WebAssembly runtime (npm/test/support/kernels-harness.js), not in
Pyodide, so these tests run wherever `./build.sh kernels` can build the module. Every compute form and
awkward shapes: K not a multiple of 128, N = 1, a last partial tile of weight rows, 1 to 33 rows of x.

Tolerances, per output y[t, n], with S = sum_k |x[t, k]| |w[n, k]|:
- exact: |y - NumPy's y| <= 1e-5 S: both sum the same float32 products, in different orders.
- fast: x is quantized per group of 32 to 15 bits (d = max|x| / 16383, xq = round(x / d)); the kernels must
  compute exactly that scheme: |y - y_scheme| <= 1e-5 S, where y_scheme is worked out here in float64.

Every build runs the same tests: the plain one, and the relaxed SIMD one (kernels-relaxed.wasm, when
clang-19 built it) in V8's default tiers and in its optimizing tier alone (Node 20's baseline tier once
computed a relaxed dot wrongly: docs/kernels.md).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess

import numpy as np
import pytest

from ruvllm.files.formats import GROUP, get_format
from ruvllm.quant.matrices import DenseMatrix, Int4Matrix, Int8Matrix

from conftest import ROOT

WASM = ROOT / "npm" / "wasm" / "kernels.wasm"
RELAXED = ROOT / "npm" / "wasm" / "kernels-relaxed.wasm"
HARNESS = ROOT / "npm" / "test" / "support" / "kernels-harness.js"
RELAXED_FLAG = "--experimental-wasm-relaxed-simd"  # Node 20 validates relaxed SIMD only with it
pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        not WASM.exists() or shutil.which("node") is None,
        reason="the WebAssembly kernels are not built (./build.sh kernels) or node is missing",
    ),
]


def node_for(wasm) -> list[str]:
    """node's command line for the harness on `wasm`: with the relaxed SIMD flag where this Node needs it."""
    probe = f"process.exit(WebAssembly.validate(require('fs').readFileSync({str(wasm)!r})) ? 0 : 1)"
    if subprocess.run(["node", "-e", probe]).returncode == 0:
        return ["node"]
    return ["node", RELAXED_FLAG]


@pytest.fixture(scope="module", params=["plain", "relaxed", "relaxed, optimizing tier only"])
def build(request) -> list[str]:
    """The command that runs the harness on one build of the kernels."""
    if request.param == "plain":
        return ["node", str(HARNESS), str(WASM)]
    if not RELAXED.exists():
        pytest.skip("no relaxed SIMD build (./build.sh kernels makes it where Debian's clang-19 installs)")
    tiers = ["--no-liftoff"] if request.param.endswith("only") else []
    return [*node_for(RELAXED), *tiers, str(HARNESS), str(RELAXED)]


QUANT_SHAPES = [(1, 32), (7, 96), (37, 160), (64, 576)]  # (N, K); 37 rows: 2 tiles of 16 and one of 5
DENSE_SHAPES = [*QUANT_SHAPES, (5, 30), (3, 7)]  # float32 K need not be a multiple of 4
ROWS = (1, 2, 4, 5, 17, 33)  # up to 4: contracted group by group; more: tiles expanded to float32


def forms(w: np.ndarray):
    """(label, matrix, kernel prefix, the bytes the kernel reads as the matrix) for every compute form."""
    K = w.shape[1]
    yield "f32", DenseMatrix(w), "dense", w
    if K % GROUP:
        return
    for fmt in ("q8", "q4_0", "q4_1"):
        parts = get_format(fmt).quantize(w)
        m8 = Int8Matrix.from_parts(fmt, parts)
        yield f"{fmt} as int8", m8, "q8", m8.codes
        if fmt != "q8":
            m4 = Int4Matrix.from_parts(fmt, parts)
            yield f"{fmt} packed", m4, "q4", m4.packed
    # GGUF Q6_K / Q3_K: int8 codes with a scale per 16 weights
    codes = np.clip(np.round(w * 8), -32, 31).astype(np.int8)
    scales = np.random.default_rng(K).uniform(0.05, 0.2, (w.shape[0], K // 16)).astype(np.float32)
    m16 = Int8Matrix(codes, scales, None, "blas", group=16)
    yield "int8 groups of 16", m16, "q8h", m16.codes


def b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def run_kernels(build: list[str], cases: list[dict]) -> list[np.ndarray]:
    request = json.dumps({"cases": cases})
    done = subprocess.run(build, input=request, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [np.frombuffer(base64.b64decode(y), dtype=np.float32) for y in json.loads(done.stdout)]


def case(call: str, m, weight_bytes: np.ndarray, x: np.ndarray) -> dict:
    arrays = {"x": b64(x), "w": b64(weight_bytes)}
    if not call.startswith("dense"):
        arrays["scales"] = b64(m.scales)
        if m.mins is not None:
            arrays["mins"] = b64(m.mins)
    N, K = m.shape
    return {"call": call, "T": x.shape[0], "N": N, "K": K, "offset": int(getattr(m, "offset", 0)), "arrays": arrays}


def quantized_x(x: np.ndarray) -> np.ndarray:
    """x as the fast kernels see it: d * round(x / d) per group of 32, d and x / d in float32 as the kernel
    forms them."""
    T, K = x.shape
    g = x.reshape(T, K // GROUP, GROUP)
    d = np.abs(g).max(axis=-1, keepdims=True) / np.float32(16383)  # (T, G, 1) float32
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    xq = np.rint(g * inv)  # (T, G, 32), round half to even like f32x4.nearest
    return (xq.astype(np.float64) * d).reshape(T, K)


def outside_tolerance(results: list[np.ndarray], expected: list[tuple]) -> list[str]:
    """The results (name, reference, scale) whose error passes the exact tolerance, 1e-5 * scale."""
    wrong = []
    for got, (name, reference, scale) in zip(results, expected, strict=True):
        err = np.abs(got.reshape(reference.shape) - reference)
        if not np.all(err <= 1e-5 * scale + 1e-30):
            wrong.append(f"{name}: error {err.max():.3g}, allowed {1e-5 * scale.max():.3g}")
    return wrong


def test_every_form_and_awkward_shapes_match_numpy(build):
    rng = np.random.default_rng(0)
    cases, expected = [], []
    for N, K in DENSE_SHAPES:
        w = rng.standard_normal((N, K)).astype(np.float32)
        for T in ROWS:
            x = rng.standard_normal((T, K)).astype(np.float32)
            for label, m, prefix, weight_bytes in forms(w):
                W = m.dequantize().astype(np.float64)  # (N, K), the values NumPy computes with
                S = np.abs(x.astype(np.float64)) @ np.abs(W).T  # (T, N)
                calls = ["dense"] if prefix == "dense" else [f"{prefix}_exact", f"{prefix}_fast"]
                for call in calls:
                    if call.endswith("_fast"):
                        xf = quantized_x(x)
                        reference, scale = xf @ W.T, np.abs(xf) @ np.abs(W).T
                        # the mins meet exact group sums of x, not the quantized ones
                        if m.mins is not None:
                            G = K // GROUP
                            dx = (x.astype(np.float64) - xf).reshape(T, G, GROUP).sum(-1)  # (T, G)
                            reference += dx @ m.mins.astype(np.float64).T
                    else:
                        reference, scale = m(x).astype(np.float64), S
                    cases.append(case(call, m, weight_bytes, x))
                    expected.append((f"{label} {call} T={T} N={N} K={K}", reference, scale))
    results = run_kernels(build, cases)
    assert len(results) == len(expected)
    assert outside_tolerance(results, expected) == []


def test_the_fast_arithmetic_is_close_to_the_exact_one(build):
    """The price of fast: x rounded to 15 bits per group costs at most half a step of each group's scale."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 576)).astype(np.float32)
    x = rng.standard_normal((1, 576)).astype(np.float32)
    m = Int4Matrix.from_parts("q4_1", get_format("q4_1").quantize(w))
    exact, fast = run_kernels(build, [case("q4_exact", m, m.packed, x), case("q4_fast", m, m.packed, x)])
    step = np.abs(x).reshape(18, 32).max(-1) / 16383  # (G,) each group's quantization step of x
    bound = (np.abs(m.dequantize() - m.mins.repeat(32, axis=1)).reshape(64, 18, 32).sum(-1) @ (step / 2)) * 1.001
    assert np.all(np.abs(fast - exact) <= bound + 1e-4)
    assert not np.array_equal(fast, exact)  # it is an approximation, and the test can tell


@pytest.mark.parametrize("E", [64, 16, 80, 7])
def test_attention_s_mix_is_the_weighted_sum_of_the_value_rows(build, E):
    """mix (y = p @ v: attention's second product, with the fast arithmetic) on 1 to 9 query rows (odd and
    even) and 1 to 300 positions; E a multiple of 16, not, and below 16. The sums are float32 in one order:
    within 1e-5 of |p| @ |v|."""
    rng = np.random.default_rng(E)
    cases, expected = [], []
    for Q, S in ((1, 1), (2, 5), (3, 300), (9, 77)):
        p = rng.random((Q, S)).astype(np.float32)
        p /= p.sum(axis=1, keepdims=True)
        v = rng.standard_normal((S, E)).astype(np.float32)
        cases.append({"call": "mix", "T": Q, "N": E, "K": S, "offset": 0, "arrays": {"x": b64(p), "w": b64(v)}})
        p64, v64 = p.astype(np.float64), v.astype(np.float64)
        expected.append((f"Q={Q} S={S}", p64 @ v64, np.abs(p64) @ np.abs(v64)))
    for got, (name, reference, scale) in zip(run_kernels(build, cases), expected, strict=True):
        err = np.abs(got.reshape(reference.shape) - reference)
        assert np.all(err <= 1e-5 * scale + 1e-30), f"{name}: error {err.max():.3g}"


def test_the_backward_s_product_adds_dy_times_w_for_every_form(build):
    """dense_t, q8_t, q8h_t, q4_t (learning's dx = dy @ W, read from the matrix as it is kept): y[:, k0:k1]
    += dy[:, n0:n1] @ W[n0:n1, k0:k1], columns outside left alone, within the exact tolerance; rows of dy
    that are zero (skipped) included; column slices at multiples of 32 together equal the whole bit for bit
    (the thread pool's units)."""
    rng = np.random.default_rng(5)
    cases, expected = [], []
    for N, K in [(1, 32), (7, 96), (37, 320), (64, 576), (5, 30)]:
        w = rng.standard_normal((N, K)).astype(np.float32)
        for T in (1, 3, 6):
            dy = rng.standard_normal((T, N)).astype(np.float32)
            dy[T // 2] = 0  # a row of zeros: skipped, and still right
            y0 = rng.standard_normal((T, K)).astype(np.float32)
            ranges = [(0, N, 0, K), (N // 3, N, 32 if K > 64 else 0, K)]
            for label, m, prefix, weight_bytes in forms(w):
                W = m.dequantize().astype(np.float64)  # (N, K)
                for n0, n1, k0, k1 in ranges:
                    reference = y0.astype(np.float64).copy()
                    reference[:, k0:k1] += dy[:, n0:n1].astype(np.float64) @ W[n0:n1, k0:k1]
                    scale = np.abs(y0) + np.abs(dy.astype(np.float64)) @ np.abs(W)
                    call = case(f"{prefix}_t", m, weight_bytes, dy)
                    call["K"], call["range"] = K, [n0, n1, k0, k1]
                    call["arrays"]["y"] = b64(y0)
                    cases.append(call)
                    expected.append((f"{label} T={T} N={N} K={K} {n0}:{n1} {k0}:{k1}", reference, scale))
    results = run_kernels(build, cases)
    assert outside_tolerance(results, expected) == []
    # two column slices, each over its own columns, against the whole: the same bits
    w = rng.standard_normal((37, 320)).astype(np.float32)
    m = Int4Matrix.from_parts("q4_1", get_format("q4_1").quantize(w))
    dy, y0 = rng.standard_normal((5, 37)).astype(np.float32), np.zeros((5, 320), np.float32)
    calls = []
    for bounds in ([0, 37, 0, 320], [0, 37, 0, 96], [0, 37, 96, 320]):
        call = case("q4_t", m, m.packed, dy)
        call["K"], call["range"], call["arrays"]["y"] = 320, bounds, b64(y0)
        calls.append(call)
    whole, left, right = (y.reshape(5, 320) for y in run_kernels(build, calls))
    np.testing.assert_array_equal(np.concatenate([left[:, :96], right[:, 96:]], axis=1), whole)
