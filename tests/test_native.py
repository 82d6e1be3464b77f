"""kernels="wasm" on CPython: our WebAssembly kernels through wasmtime (quant/native.py), the decode plan
in their memory. Tiny models in every weight form against the NumPy forward; SmolLM2's greedy tokens
against NumPy's; the weights held once, in the kernels' memory; learning's backward product; and the
errors a user sees where they cannot run. ("auto" keeps NumPy on CPython until the kernels' threads and
their measurements against BLAS are in: issue 40.)"""

from __future__ import annotations

import numpy as np
import pytest

import ruvllm
from ruvllm.api import load_options
from ruvllm.errors import InvalidArgumentError
from ruvllm.model.plan import DecodePlan
from ruvllm.quant import native
from ruvllm.quant.matrices import Int8Matrix
from ruvllm.quant.wasm import kernel_form
from ruvllm.runtime.assembly import local_assembly

from conftest import numpy_model

HOST, WHY = native.native_host()
pytestmark = pytest.mark.skipif(HOST is None, reason=f"no kernels on CPython here: {WHY}")


def engine_of(folder, kernels: str, compute: str = "auto"):
    options = load_options(None, compute, None, None, kernels, "fast")
    return local_assembly(str(folder), options, needs_tokenizer=False).build()


@pytest.mark.parametrize("compute", ["f32", "q8", "q4"])
def test_the_plan_on_cpython_gives_the_numpy_forwards_logits(tmp_path, compute):
    """A prompt, then decoding steps: each forward's logits against the NumPy forward's on its own cache
    (the fast arithmetic's bound: tests/test_plan.py), the top token the same or a near-tie."""
    numpy_model("llama", tmp_path)
    fast, exact = engine_of(tmp_path, "wasm", compute), engine_of(tmp_path, "numpy", compute)
    assert fast.kernels == "wasm" and isinstance(fast.decode_plan, DecodePlan) and fast.plan_note is None
    a, b = fast.new_cache(), exact.new_cache()
    tokens = [5, 17, 99, 3, 64, 12, 7]
    got, want = fast.forward(tokens, 0, a), exact.forward(tokens, 0, b)
    for n in range(6):
        scale = np.abs(want).max()
        assert np.abs(got - want).max() <= 3e-3 * scale, f"step {n}"
        rows = np.arange(len(want))
        margin = want[rows, want.argmax(-1)] - want[rows, got.argmax(-1)]
        assert (margin <= 2 * np.abs(got - want).max()).all(), f"step {n}: the top token is no near-tie"
        token = int(want[-1].argmax())
        got, want = fast.forward([token], len(tokens), a), exact.forward([token], len(tokens), b)
        tokens.append(token)


def test_smollm2_greedy_on_cpython_with_the_kernels(smollm2_dir):
    """24 greedy tokens of a chat prompt equal NumPy's (they part only at a near-tie: none here), each
    matrix's weights held once, as NumPy arrays inside the kernels' memory."""
    fast, exact = ruvllm.load(smollm2_dir, kernels="wasm"), ruvllm.load(smollm2_dir, kernels="numpy")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    options = {"max_tokens": 24, "temperature": 0}
    answers = ["".join(c.text for c in model.chat(messages, **options)) for model in (fast, exact)]
    assert answers[0] == answers[1] and len(answers[0]) > 20, answers
    engine = fast.engine
    assert engine.decode_plan is not None and engine.plan_note is None
    host = engine.decode_plan.memory.heap
    for linear in engine.weights.layers[0].projections():
        matrix = linear.matrix
        _, codes = kernel_form(matrix)
        assert host.inside(codes) is codes and host.inside(matrix.scales) is matrix.scales


def test_the_backward_product_adds_into_arrays_outside_the_kernels_memory():
    """Learning's dx += dy @ W through the kernels (WasmKernels.transposed) with dy and y NumPy's own:
    copied in, and y updated in place."""
    rng = np.random.default_rng(0)
    N, K, T = 48, 64, 3
    codes = rng.integers(-127, 128, (N, K)).astype(np.int8)
    scales = rng.uniform(0.01, 0.02, (N, K // 32)).astype(np.float32)
    matrix = Int8Matrix(codes, scales, None, 0)
    kernels, _ = native.native_kernels("exact")
    assert kernels is not None and kernels.prepare(matrix) is not None
    add = kernels.transposed(matrix)
    dy = rng.normal(size=(T, N)).astype(np.float32)
    y = np.ones((T, K), np.float32)
    add(dy, y, 0, N)
    w = codes.astype(np.float32) * np.repeat(scales, 32, axis=1)
    np.testing.assert_allclose(y, 1 + dy @ w, rtol=1e-5, atol=1e-5)


def test_auto_keeps_numpy_on_cpython_and_wasm_without_wasmtime_says_how_to_get_it(tmp_path, monkeypatch):
    numpy_model("llama", tmp_path)
    assert engine_of(tmp_path, "auto").kernels == "numpy"
    monkeypatch.setattr(native, "wasmtime", None)
    native.native_host.cache_clear()
    try:
        with pytest.raises(InvalidArgumentError, match=r"kernels='wasm' cannot run here: wasmtime is not installed"):
            engine_of(tmp_path, "wasm")
    finally:
        monkeypatch.undo()
        native.native_host.cache_clear()


def test_two_engines_on_two_threads_share_the_kernels_store_in_turns(tmp_path):
    """One wasmtime store serves every engine of the process, and a call releases the GIL: two engines
    decoding on two threads at once give the logits each gives alone (their calls take turns)."""
    import threading

    numpy_model("llama", tmp_path / "a")
    numpy_model("qwen2", tmp_path / "b", seed=1)
    engines = [engine_of(tmp_path / "a", "wasm", "q4"), engine_of(tmp_path / "b", "wasm", "q8")]

    def decode(engine, out: list) -> None:
        cache, token = engine.new_cache(), 3
        for position in range(40):
            logits = engine.forward([token], position, cache)[0]
            out.append(logits)
            token = int(logits.argmax())

    alone = [[], []]
    for engine, out in zip(engines, alone, strict=True):
        decode(engine, out)
    together: list[list] = [[], []]
    threads = [threading.Thread(target=decode, args=pair) for pair in zip(engines, together, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(alone, together, strict=True):
        assert len(b) == 40 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_build_that_fails_the_known_answer_is_not_used_and_says_which(monkeypatch):
    """The self-test (wasm.py's known answer, host.py's in Pyodide) runs before the kernels compute a
    model: a wrong answer refuses them, naming the build."""
    from ruvllm.quant import wasm

    right = wasm.known_answer

    def wrong() -> dict:
        case = right()
        case["answer_fast"] = case["answer_fast"] + 1
        return case

    monkeypatch.setattr(wasm, "known_answer", wrong)
    native.native_host.cache_clear()
    try:
        found, why = native.native_host()
        assert found is None and why.endswith("gave a wrong answer on the kernels' self-test under this wasmtime")
        assert why.startswith("kernels.wasm")  # (the relaxed build was refused first, then the plain one)
    finally:
        monkeypatch.undo()
        native.native_host.cache_clear()
