"""The decode plan (model/plan.py, kernels.c `run_plan`) against the NumPy forward.

The kernels run on CPython through wasmtime (tests/kernel_host.py), on arrays that live in their memory
as Pyodide's heap lives in theirs, so these are the steps the browser and Node run, bit for bit (the
plain build has no nondeterministic instruction; the relaxed build's are used where they are exact).

- Each new step against NumPy: RMSNorm (whole rows and per head, at a stride), RoPE (the same bits as
  rope.apply_rope), the gated activations, exp and tanh, attention over a cache (grouped queries,
  sliding windows, rows that see different prefixes), with awkward sizes.
- The whole plan against the NumPy forward for a tiny random model of every family and every compute
  form: a prompt (every row's logits, in chunks smaller than the prompt), then decoding past Gemma's
  and Mistral's windows, then a rewind and a different continuation.

Tolerances: the steps between products are float32 in another order than NumPy's (and exp/tanh within
a few ulp); the plan's products are the fast arithmetic's (x at 15 bits per group of 32), which moves a
logit by ~1e-4 of the logits' scale. The bounds below are a few times what the first run measured.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from ruvllm.model.cache import KVCache, KVOptions
from ruvllm.model.forward import attention_mask, gelu_tanh, rms_norm, silu, softmax
from ruvllm.model.kv import DenseSegment, QuantSegment
from ruvllm.model.plan import DecodePlan, plan_refusal
from ruvllm.model.rope import apply_rope, rope_tables_at
from ruvllm.quant.kvcodes import KVCodes
from ruvllm.runtime.assembly import load_engine

kernel_host = pytest.importorskip("kernel_host", reason="tests/kernel_host.py")
from kernel_host import KernelHost, kernel_wasm_paths  # noqa: E402
from test_parity import VARIANTS  # noqa: E402

from conftest import tiny_model  # noqa: E402

WASMS = kernel_wasm_paths()
pytestmark = pytest.mark.skipif(not WASMS, reason="the WebAssembly kernels are not built (./build.sh kernels)")


class HostMemory:
    """The wasmtime host as the plan's KernelMemory."""

    threads = 1

    def __init__(self, host: KernelHost) -> None:
        self.host, self.exports = host, host.exports

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        return self.host.empty(shape, dtype)

    staged = empty

    def address(self, a: np.ndarray) -> int:
        return self.host.address(a)

    def place(self, a: np.ndarray, dtype=None) -> np.ndarray:
        return self.host.put(np.ascontiguousarray(a, dtype))

    def run(self, program: int, state: np.ndarray, rows: int, inputs: list, outputs: list, pick: int = 0) -> None:
        self.exports.run_plan(program, self.address(state))


class HostProvider:
    """What Engine.use_plan reads of a kernel provider: its arithmetic and its memory."""

    name, arithmetic = "wasm", "fast"

    def __init__(self, memory: HostMemory) -> None:
        self.memory = memory


@pytest.fixture(scope="module", params=[p.name for p in WASMS])
def host(request) -> KernelHost:
    return KernelHost(next(p for p in WASMS if p.name == request.param))


def put(host: KernelHost, a: np.ndarray) -> np.ndarray:
    """A copy of `a` in the kernels' memory (kept by the caller while the kernels use its address: its
    block is handed out again once it is garbage)."""
    return host.put(np.ascontiguousarray(a))


# ---- each step -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows, heads, E, extra", [(1, 1, 576, 0), (3, 4, 16, 5), (2, 3, 7, 1), (5, 1, 64, 0)])
def test_rms_norm_matches_numpy(host, rows, heads, E, extra):
    rng = np.random.default_rng(rows * 100 + E)
    ld = heads * E + extra  # rows at a stride wider than their heads
    x = rng.normal(0, 2, (rows, ld)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, E).astype(np.float32)
    xs = put(host, x)
    at_x = host.address(xs)
    ws = put(host, w)
    at_w = host.address(ws)
    y = host.zeros((rows, ld))
    host.exports.rms_norm(at_x, at_w, host.address(y), rows, heads, E, ld, ld, 1e-6)
    want = rms_norm(x[:, : heads * E].reshape(rows, heads, E), w, 1e-6).reshape(rows, heads * E)
    np.testing.assert_allclose(y[:, : heads * E], want, rtol=2e-6, atol=1e-6)
    assert not y[:, heads * E :].any(), "a norm wrote past its heads"


@pytest.mark.parametrize("rows, heads, E", [(1, 9, 64), (3, 2, 16), (2, 1, 10)])
def test_rope_has_numpys_bits(host, rows, heads, E):
    rng = np.random.default_rng(E)
    x = rng.normal(0, 1, (rows, heads * E)).astype(np.float32)
    inv = 1.0 / 10000 ** (np.arange(0, E, 2) / E)
    cos, sin = rope_tables_at(inv, np.arange(40, 40 + rows))
    xs = put(host, x)
    at_x = host.address(xs)
    cos_kept = put(host, cos)
    at_c = host.address(cos_kept)
    sin_kept = put(host, sin)
    at_s = host.address(sin_kept)
    host.exports.rope(at_x, at_c, at_s, rows, heads, E, heads * E)
    want = apply_rope(x.reshape(rows, heads, E).transpose(1, 0, 2), cos, sin).transpose(1, 0, 2).reshape(rows, -1)
    assert np.array_equal(xs, want), "RoPE in the kernels must give rope.apply_rope's bits"


def test_exp_and_tanh_precision(host):
    x = np.concatenate([np.linspace(-90, 90, 20001), [-1e-6, 0, 1e-6, -200, 200]]).astype(np.float32)
    xs = put(host, x)
    at_x = host.address(xs)
    y = host.zeros(len(x))
    host.exports.exp_f32(at_x, host.address(y), len(x))
    want = np.exp(x.astype(np.float64))
    finite = (x > -87.3) & (x < 88.37)
    rel = np.abs(y[finite] - want[finite]) / want[finite]
    assert rel.max() < 4e-7, f"exp's largest relative error {rel.max():.3g}"
    assert (y[x < -87.3] == 0).all()
    host.exports.tanh_f32(at_x, host.address(y), len(x))
    err = np.abs(y - np.tanh(x.astype(np.float64)))
    assert err.max() < 2.5e-7, f"tanh's largest absolute error {err.max():.3g}"


@pytest.mark.parametrize("kind, reference", [(0, silu), (1, gelu_tanh)])
def test_gated_activations(host, kind, reference):
    rng = np.random.default_rng(kind)
    rows, F = 3, 37
    gu = rng.normal(0, 3, (rows, 2 * F)).astype(np.float32)
    gu_kept = put(host, gu)
    at = host.address(gu_kept)
    y = host.zeros((rows, F))
    host.exports.gated(kind, at, host.address(y), rows, F)
    g, u = gu[:, :F].astype(np.float64), gu[:, F:].astype(np.float64)
    want = reference(g) * u  # in float64
    # tanh's absolute error (~1.2e-7) times |g| and |u|, where 0.5 + 0.5 tanh cancels (large negative g)
    bound = 4e-7 * np.abs(g * u) + 2e-6 * np.abs(want)
    assert (np.abs(y - want) <= bound).all(), f"largest error {np.abs(y - want).max():.3g}"


@pytest.mark.parametrize("cold_bits", [0, 8, 4])
@pytest.mark.parametrize(
    "T, H, KV, E, window", [(1, 9, 3, 64, 0), (5, 4, 2, 16, 0), (6, 4, 4, 20, 3), (1, 2, 1, 8, 4), (2, 2, 1, 48, 9)]
)
def test_attend_matches_numpy(host, T, H, KV, E, window, cold_bits):
    """Queries at the last T of a cache's positions attend over both its tiers as forward.attend does (the
    segments' scores, scaled, the causal and window mask, softmax, the mix): the float32 tier (KV,
    capacity, E) holding consecutive positions, and a cold tier of int8 or int4 codes (KVCodes) at
    positions with a gap (evicted ones), some outside the window."""
    rng = np.random.default_rng(T * H + E + cold_bits)
    count, capacity, first = 11, 16, 20  # float32 slots in use, positions 20..30
    pos0 = first + count - T
    keys = rng.normal(0, 1, (KV, capacity, E)).astype(np.float32)
    values = rng.normal(0, 1, (KV, capacity, E)).astype(np.float32)
    width = (H + 2 * KV) * E  # queries inside a q/k/v row, as the plan holds them
    rows = put(host, rng.normal(0, 1, (T, width)).astype(np.float32))
    kept = [put(host, keys), put(host, values)]
    entry = host.zeros(16, np.int32)
    entry[:5] = (host.address(kept[0]), host.address(kept[1]), capacity, count, first)
    entry[12] = 8
    key_positions = np.arange(first, first + count)
    segments = [DenseSegment(keys[:, :count], values[:, :count], key_positions)]
    if cold_bits:
        codes = KVCodes(cold_bits)
        cold_positions = np.array([0, 1, 2, 3, 9, 12, 15, 19], np.int32)  # sinks, then a gap
        C, cold_capacity = len(cold_positions), 10
        k_codes, k_scales = codes.quantize(rng.normal(0, 1, (KV, cold_capacity, E)).astype(np.float32))
        v_codes, v_scales = codes.quantize(rng.normal(0, 1, (KV, cold_capacity, E)).astype(np.float32))
        kept += [put(host, a) for a in (k_codes, v_codes, k_scales, v_scales, cold_positions)]
        entry[5:9] = [host.address(a) for a in kept[2:6]]
        entry[9:13] = (cold_capacity, C, host.address(kept[6]), cold_bits)
        cold = QuantSegment(
            codes.unpack(k_codes[:, :C]), k_scales[:, :C], codes.unpack(v_codes[:, :C]), v_scales[:, :C], cold_positions
        )
        segments.insert(0, cold)
        key_positions = np.concatenate([cold_positions, key_positions])
    out = host.zeros((T, H * E))
    scratch = host.zeros(64)
    scale = E**-0.5
    host.exports.attend(
        host.address(rows), width, host.address(entry), host.address(out), H * E, host.address(scratch),
        T, H, KV, E, pos0, window, scale,
    )  # fmt: skip
    G = H // KV
    q = rows[:, : H * E].reshape(T, KV, G, E).transpose(1, 2, 0, 3).reshape(KV, G * T, E)  # as attend stacks it
    scores = np.concatenate([s.scores(q) for s in segments], axis=-1).reshape(KV, G, T, -1) * np.float32(scale)
    mask = attention_mask(np.arange(pos0, pos0 + T), key_positions, window or None)
    if mask is not None:
        scores += mask
    probs = softmax(scores).reshape(KV, G * T, -1)
    bounds = np.cumsum([len(s.positions) for s in segments])[:-1]
    mixed = sum(s.mix(p) for s, p in zip(segments, np.split(probs, bounds, axis=-1), strict=True))
    want = mixed.reshape(KV, G, T, E).transpose(2, 0, 1, 3).reshape(T, H * E)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6)


# ---- the whole plan --------------------------------------------------------------------------------------


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= 3e-3 * scale, f"{what}: the plan's logits differ by {err:.3g} (scale {scale:.3g})"
    # the top token the same, or the reference's two candidates within what the logits may differ by
    rows = np.arange(len(want))
    margin = want[rows, want.argmax(-1)] - want[rows, got.argmax(-1)]
    assert (margin <= 2 * err).all(), f"{what}: the plan's top token differs by {margin.max():.3g} (not a near-tie)"


CASES = [(variant, compute, WASMS[0].name) for variant in VARIANTS for compute in ("f32", "q8", "q4")] if WASMS else []
CASES += [(variant, "q4", w.name) for w in WASMS[1:] for variant in VARIANTS]  # (the relaxed build: its q4 dot)


@pytest.mark.parametrize("variant, compute, build", CASES)
def test_plan_logits_match_the_numpy_forward(tmp_path, variant, compute, build):
    """test_parity's tiny models of every family and switch (GQA/MQA, RoPE scalings, biases, sliding
    windows, q/k norms, Gemma 3's sandwich norms and two RoPE bases): a prompt of 7 in chunks of 3
    (every row's logits), 8 decoding steps past the windows, then a rewind of 5 positions and a 2-token
    continuation (the last row's logits), each against the NumPy forward on a cache of its own; the
    hidden states the caches' residual taps keep (learning's) alike."""
    kind, overrides = VARIANTS[variant]
    tiny_model(kind, tmp_path, **overrides)
    engine = load_engine(str(tmp_path), compute=compute, kernels="numpy")
    assert plan_refusal(engine.model, "fast") is None
    memory = HostMemory(KernelHost(next(p for p in WASMS if p.name == build)))
    plan = DecodePlan(engine.model, memory, rows=3, context=engine.context_length)
    prompt = np.random.default_rng(1).integers(0, engine.config.vocab_size, 7)
    tap = engine.config.num_hidden_layers - 1  # learning's residual tap, written by the plan too
    reference = KVCache(engine.config, engine.context_length, engine.kv, tap)
    planned = KVCache(engine.config, engine.context_length, engine.kv, tap, None, memory.empty)
    want = engine.forward(prompt, 0, reference)  # (7, V) through the NumPy forward
    program = plan.program("base")
    got = plan.forward(program, prompt, 0, planned)
    assert got.shape == want.shape
    assert_close(got, want, "the prompt")
    tokens = list(prompt)
    for step in range(8):
        token = np.array([int(want[-1].argmax())])
        want = engine.forward(token, len(tokens), reference)
        got = plan.forward(program, token, len(tokens), planned)
        assert_close(got, want, f"decoding step {step}")
        tokens.append(int(token[0]))
    assert planned.tokens == reference.tokens == tokens
    assert planned.tap is not None and reference.tap is not None
    entering, want_entering = planned.tap.read(len(tokens)), reference.tap.read(len(tokens))
    assert np.abs(entering - want_entering).max() <= 3e-3 * np.abs(want_entering).max(), "the residual tap"
    other = np.array([3, 5])
    want = engine.forward(other, len(tokens) - 5, reference, last_only=True)
    got = plan.forward(program, other, len(tokens) - 5, planned, last_only=True)
    assert got.shape == want.shape == (1, engine.config.vocab_size)
    assert_close(got, want, "after a rewind")
    assert planned.layers[0].hot.length == len(tokens) - 3 == len(planned.tokens)


def test_the_engine_runs_its_forward_through_the_plan(tmp_path):
    """Engine.use_plan with a provider that has a kernel memory: new caches live in that memory, forward
    goes through the plan (a cache the plan cannot serve, one with a cold tier, through NumPy), and
    plan=False or the exact arithmetic keep the NumPy forward, saying why."""
    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), compute="q4", kernels="numpy")
    assert engine.decode_plan is None and engine.plan_note
    host = KernelHost(WASMS[0])
    provider = HostProvider(HostMemory(host))
    engine.use_plan(True, provider)
    assert engine.decode_plan is not None and engine.plan_note is None
    cache = engine.new_cache()
    ids = np.array([1, 2, 3, 4, 5])
    got = engine.forward(ids, 0, cache, last_only=True)
    host.address(cache.layers[0].hot.k)  # (in the kernels' memory, or this raises)
    numpy_engine = load_engine(str(tmp_path), compute="q4", kernels="numpy")
    want = numpy_engine.forward(ids, 0, numpy_engine.new_cache(), last_only=True)
    assert_close(got, want, "the engine's forward")
    assert not np.array_equal(got, want), "the plan's arithmetic is not NumPy's: this forward did not run it"
    engine.use_plan(False, provider)
    assert engine.decode_plan is None and engine.plan_note == "off (plan=False)"
    provider.arithmetic = "exact"
    engine.use_plan(True, provider)
    assert engine.decode_plan is None and "exact" in engine.plan_note


@pytest.mark.parametrize("compute", ["f32", "q4"])
def test_plan_runs_lora_adapters_with_their_gates(tmp_path, compute):
    """Weights wrapped with LoRA adapters (learning/lora.py LoRAMatrix) on attention and MLP matrices, two
    of them gated (a ramp and a step, at thresholds some rows pass and some do not): the plan's program
    for them gives the NumPy forward's logits, and the base program still gives the base model's."""
    from ruvllm.learning.lora import Gate, LoRAMatrix

    tiny_model("qwen3", tmp_path)
    engine = load_engine(str(tmp_path), compute=compute, kernels="numpy")
    memory = HostMemory(KernelHost(WASMS[0]))
    plan = DecodePlan(engine.model, memory, rows=4, context=engine.context_length)
    base_program = plan.program("base")
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, engine.config.vocab_size, 6)
    base = engine.forward(prompt, 0, engine.new_cache())
    r, layer = 8, engine.weights.layers[1]
    originals = {}
    for owner, name in ((layer.self_attn, "q_proj"), (layer.self_attn, "v_proj"), (layer.mlp, "down_proj")):
        linear = getattr(owner, name)
        N, K = linear.matrix.shape
        A = rng.normal(0, 0.3, (r, K)).astype(np.float32)
        B = rng.normal(0, 0.3, (N, r)).astype(np.float32)
        gates = {  # (the rows' responses here: q_proj's 2.5-6.6, down_proj's 5-23)
            "q_proj": [Gate(0, 4, 3.0, 6.0), Gate(4, 8, 4.0, 4.0)],
            "down_proj": [Gate(0, 4, 12.0, 20.0), Gate(4, 8, 9.0, 9.0)],
        }.get(name, [])
        originals[name] = (linear, linear.matrix)
        linear.matrix = LoRAMatrix(linear.matrix, A, B, 2.0, gates)
    try:
        want = engine.forward(prompt, 0, engine.new_cache())
        assert np.abs(want - base).max() > 0.05, "the adapters change nothing: this test could not fail"
        planned = KVCache(engine.config, engine.context_length, engine.kv, None, None, memory.empty)
        got = plan.forward(plan.program("adapted"), prompt, 0, planned)
        assert_close(got, want, "adapted weights")
    finally:
        for linear, matrix in originals.values():
            linear.matrix = matrix
    planned = KVCache(engine.config, engine.context_length, engine.kv, None, None, memory.empty)
    assert_close(plan.forward(base_program, prompt, 0, planned), base, "the base program after them")


def test_an_x_lora_mixture_falls_back_to_the_numpy_forward_and_says_so(tmp_path):
    """With an X-LoRA mixture active, the engine's forwards run NumPy's (the router's passes), bit for bit
    what they are without a plan, and plan_now says why; with a plain adapter active again, the plan runs."""
    from ruvllm.learning.adapters import AdapterSet
    from ruvllm.learning.lora import LoRAConfig
    from ruvllm.runtime.engine import MIXTURE_NOTE

    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), compute="f32", kernels="numpy")
    engine.use_plan(True, HostProvider(HostMemory(KernelHost(WASMS[0]))))
    adapters = AdapterSet(engine.weights)
    engine.attach(adapters)
    rng = np.random.default_rng(3)
    for name in ("a", "b"):
        adapter = adapters.create(name, LoRAConfig(rank=4, targets=("q_proj", "down_proj")))
        for B in adapter.B.values():
            B[...] = rng.normal(0, 0.3, B.shape)
    assert engine.plan_now() is None  # (b, a LoRA adapter, is active)
    adapters.mix("x", ["a", "b"])
    assert engine.plan_now() == MIXTURE_NOTE
    prompt = rng.integers(0, engine.config.vocab_size, 5)
    mixed = engine.forward(prompt, 0, engine.new_cache())
    plan, engine.decode_plan = engine.decode_plan, None
    try:
        assert np.array_equal(mixed, engine.forward(prompt, 0, engine.new_cache()))
    finally:
        engine.decode_plan = plan
    adapters.activate("a")
    assert engine.plan_now() is None
    planned = engine.forward(prompt, 0, engine.new_cache())
    assert engine.decode_plan is not None and engine.decode_plan.programs, "the plan did not run the adapter"
    assert not np.array_equal(planned, mixed)


@pytest.mark.parametrize("cold", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["gemma3", "llama"])
def test_plan_over_a_long_chat_with_both_tiers(tmp_path, kind, cold):
    """A long chat through the plan on a cache with a cold tier and a byte budget (positions migrate to
    int8/int4 codes in batches, the oldest are evicted but for the sinks), Gemma 3's sliding windows
    reaching into the cold tier, turns that rewind into the previous answer. Each forward's logits against
    the NumPy forward on a copy of the plan's cache as it was (a key the plan computed 1e-4 away from
    NumPy's can round to another int4 code, and the two caches would then drift apart), and the cache's
    bookkeeping (positions per tier, evictions) against a cache the NumPy forward kept all along. Float32
    weights: their products have no quantized x, whose error (1e-4 of a row's largest value) this random
    model, over forty positions, once amplified past the tolerance (as it would without the plan)."""
    tiny_model(kind, tmp_path)
    engine = load_engine(str(tmp_path), compute="f32", kernels="numpy")
    budget = 40 * engine.kv.hot_bytes_per_position(engine.config) // 8  # (about 40 cold positions)
    kv = KVOptions(hot_tokens=6, cold=cold, migrate_batch=3, keep=2, budget_bytes=budget)
    memory = HostMemory(KernelHost(WASMS[0]))
    plan = DecodePlan(engine.model, memory, rows=4, context=engine.context_length)
    program = plan.program("base")
    kept_all_along = KVCache(engine.config, engine.context_length, kv)
    planned = KVCache(engine.config, engine.context_length, kv, None, None, memory.empty)
    in_numpy = {id(planned.layers[0].hot.empty): np.empty}  # (deepcopy: the copy's buffers in NumPy's memory)
    rng = np.random.default_rng(3)
    tokens: list[int] = []

    def step(ids: np.ndarray, start: int, what: str) -> np.ndarray:
        want = engine.forward(ids, start, copy.deepcopy(planned, in_numpy), last_only=True)
        got = plan.forward(program, ids, start, planned, last_only=True)
        engine.forward(ids, start, kept_all_along, last_only=True)
        assert_close(got, want, what)
        return got

    for turn in range(4):
        start = max(0, len(tokens) - 2 * turn)  # a rewind into the last answer (none at first)
        del tokens[start:]
        prompt = rng.integers(0, engine.config.vocab_size, 5)
        logits = step(prompt, start, f"turn {turn}'s prompt")
        tokens += prompt.tolist()
        for n in range(9):
            token = int(logits[-1].argmax())
            logits = step(np.array([token]), len(tokens), f"turn {turn}, step {n}")
            tokens.append(token)
        assert planned.stats() == kept_all_along.stats()
    stats = planned.stats()
    assert stats["cold_positions"] > 0 and stats["evicted_positions"] > 0, stats
