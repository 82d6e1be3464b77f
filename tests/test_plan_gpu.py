"""The decode plan on a WebGPU device (npm/src/worker/gpu/executor.js and its WGSL shaders), driven from
CPython through tests/gpu_host.py (a Node process with Dawn; without a GPU, Chromium's SwiftShader):
every family's tiny random model against the NumPy forward, in float32, q8 and q4 weights, over a
prompt in chunks, decoding and a rewind; both cold-tier formats with a byte budget; LoRA adapters with
gates; the residual tap; and a shader broken on purpose, which the comparison catches.

The GPU's arithmetic is float32 with the weights dequantized in the shaders, where the CPU's plan
quantizes x to int16 (kernels.c's fast products): the logits agree to the NumPy forward's within
test_plan.assert_close's bound, and the top token is the same unless the reference has a near-tie.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_host import GpuHost, HostMemory, gpu_missing
from ruvllm.model.cache import KVCache, KVOptions
from ruvllm.model.plan import DecodePlan
from ruvllm.quant.pool import PoolArray
from ruvllm.runtime.assembly import load_engine

from conftest import tiny_model

missing = gpu_missing()
pytestmark = pytest.mark.skipif(missing is not None, reason=f"no WebGPU host: {missing}")


@pytest.fixture(scope="module")
def host():
    gpu = GpuHost()
    if gpu.reason:
        gpu.close()
        pytest.skip(f"no WebGPU adapter ({gpu.reason}): ./build.sh test installs the Vulkan loader for SwiftShader")
    yield gpu
    gpu.close()


def assert_close(got: np.ndarray, want: np.ndarray, what: str, bound: float = 3e-3) -> None:
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    assert np.isfinite(got).all(), f"{what}: the GPU's logits are not all finite"
    assert err <= bound * scale, f"{what}: the GPU's logits differ by {err:.3g} (scale {scale:.3g})"
    rows = np.arange(len(want))
    margin = want[rows, want.argmax(-1)] - want[rows, got.argmax(-1)]
    assert (margin <= 2 * err).all(), f"{what}: the GPU's top token differs by {margin.max():.3g} (not a near-tie)"


VARIANTS = [
    "gemma3 sliding + global layers",
    "qwen2 with q/k/v biases",
    "llama tied, GQA",
    "llama MQA",
    "qwen3 q/k norms",
    "phi3 fused, GQA, sliding window",
]


def tiny_engine(tmp_path, variant: str, compute: str):
    from test_parity import VARIANTS as ALL

    kind, overrides = ALL[variant]
    tiny_model(kind, tmp_path, **overrides)
    return load_engine(str(tmp_path), compute=compute, kernels="numpy")


@pytest.mark.parametrize("compute", ["f32", "q8", "q4"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_plan_on_the_gpu_gives_the_numpy_forwards_logits(host, tmp_path, variant, compute):
    """A prompt of 7 in chunks of 3 (every row's logits), 6 decoding steps, then a rewind of 4 positions
    and a 2-token continuation: each forward's logits against the NumPy forward's on its own cache."""
    engine = tiny_engine(tmp_path, variant, compute)
    plan = DecodePlan(engine.model, HostMemory(host), 3, engine.context_length)
    program = plan.program("base")
    cache = KVCache(engine.config, engine.context_length, engine.kv, None, None, plan.memory.empty)
    reference = engine.new_cache()
    assert isinstance(cache.layers[0].hot.k, PoolArray)

    def step(ids: np.ndarray, start: int, what: str, last_only: bool = False) -> np.ndarray:
        got = plan.forward(program, ids, start, cache, last_only)
        want = engine.forward(ids, start, reference, last_only)
        assert_close(got, want, what)
        return want

    prompt = np.random.default_rng(1).integers(0, engine.config.vocab_size, 7)
    logits = step(prompt, 0, "the prompt")
    tokens = prompt.tolist()
    for n in range(6):
        token = int(logits[-1].argmax())
        logits = step(np.array([token]), len(tokens), f"decoding step {n}")
        tokens.append(token)
    assert host.last["submits"] == 1 and host.last["readBytes"] == 4 * engine.config.vocab_size
    step(np.array([3, 5]), len(tokens) - 4, "after a rewind", last_only=True)


@pytest.mark.parametrize("kind, cold", [("gemma3", "int4"), ("llama", "int8")])
def test_the_plan_on_the_gpu_over_a_long_chat_with_both_tiers(host, tmp_path, kind, cold):
    """Four turns (a 5-token prompt rewinding into the last answer, 9 decoding steps) on a cache with a
    cold tier and a byte budget, so positions migrate to int8/int4 codes the attention shaders read and
    the oldest are evicted (but for the sinks): the NumPy forward's logits on a cache of its own, and the
    residual tap's rows alike."""
    tiny_model(kind, tmp_path)
    engine = load_engine(str(tmp_path), compute="q4", kernels="numpy")
    budget = 40 * engine.kv.hot_bytes_per_position(engine.config) // 8  # (about 40 cold positions)
    kv = KVOptions(hot_tokens=6, cold=cold, migrate_batch=3, keep=2, budget_bytes=budget)
    plan = DecodePlan(engine.model, HostMemory(host), 4, engine.context_length)
    program = plan.program("base")
    cache = KVCache(engine.config, None, kv, None, None, plan.memory.empty)
    reference = KVCache(engine.config, None, kv, None)
    rng = np.random.default_rng(3)
    tokens: list[int] = []

    def step(ids: np.ndarray, start: int, what: str) -> np.ndarray:
        got = plan.forward(program, ids, start, cache, last_only=True)
        want = engine.forward(ids, start, reference, last_only=True)
        assert_close(got, want, what)
        return want

    for turn in range(4):
        del tokens[max(0, len(tokens) - 2 * turn) :]
        prompt = rng.integers(0, engine.config.vocab_size, 5)
        logits = step(prompt, len(tokens), f"turn {turn}'s prompt")
        tokens += prompt.tolist()
        for n in range(9):
            token = int(logits[-1].argmax())
            logits = step(np.array([token]), len(tokens), f"turn {turn}, step {n}")
            tokens.append(token)
    stats = cache.stats()
    assert stats == reference.stats(), "the two caches kept different positions"
    assert stats["cold_positions"] > 0 and stats["evicted_positions"] > 0, stats


def test_the_plan_on_the_gpu_runs_lora_adapters_with_their_gates_and_the_tap(host, tmp_path):
    """Weights wrapped with gated LoRA adapters (test_plan's), and learning's residual tap: the adapted
    program's logits and the tapped rows as the NumPy forward's; the base program after it the base's."""
    from ruvllm.learning.lora import Gate, LoRAMatrix

    tiny_model("qwen3", tmp_path)
    engine = load_engine(str(tmp_path), compute="q4", kernels="numpy")
    plan = DecodePlan(engine.model, HostMemory(host), 4, engine.context_length)
    base_program = plan.program("base")
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, engine.config.vocab_size, 6)
    base = engine.forward(prompt, 0, engine.new_cache())
    r, layer = 8, engine.weights.layers[1]
    originals = []
    for owner, name in ((layer.self_attn, "q_proj"), (layer.self_attn, "v_proj"), (layer.mlp, "down_proj")):
        linear = getattr(owner, name)
        N, K = linear.matrix.shape
        A = rng.normal(0, 0.3, (r, K)).astype(np.float32)
        B = rng.normal(0, 0.3, (N, r)).astype(np.float32)
        gates = {
            "q_proj": [Gate(0, 4, 3.0, 6.0), Gate(4, 8, 4.0, 4.0)],
            "down_proj": [Gate(0, 4, 12.0, 20.0), Gate(4, 8, 9.0, 9.0)],
        }.get(name, [])
        originals.append((linear, linear.matrix))
        linear.matrix = LoRAMatrix(linear.matrix, A, B, 2.0, gates)
    tap = 1
    try:
        reference = KVCache(engine.config, engine.context_length, engine.kv, tap)
        want = engine.forward(prompt, 0, reference)
        assert np.abs(want - base).max() > 0.05, "the adapters change nothing: this test could not fail"
        planned = KVCache(engine.config, engine.context_length, engine.kv, tap, None, plan.memory.empty)
        assert_close(plan.forward(plan.program("adapted"), prompt, 0, planned), want, "adapted weights")
        assert planned.tap is not None and reference.tap is not None
        got_rows, want_rows = np.asarray(planned.tap.read(6)), reference.tap.read(6)
        assert np.abs(got_rows - want_rows).max() <= 1e-4 * np.abs(want_rows).max(), "the residual tap's rows"
    finally:
        for linear, matrix in originals:
            linear.matrix = matrix
    planned = KVCache(engine.config, engine.context_length, engine.kv, None, None, plan.memory.empty)
    assert_close(plan.forward(base_program, prompt, 0, planned), base, "the base program after them")


@pytest.mark.parametrize("shader", ["mix", "gated"])
def test_a_shader_broken_on_purpose_gives_logits_the_comparison_refuses(host, tmp_path, shader):
    """The host with one shader's output scaled by 1.5: the same comparison fails (so the tests above,
    and the parity check at load that uses it, can see a wrong shader)."""
    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), compute="q8", kernels="numpy")
    broken = GpuHost(broken=shader)
    try:
        plan = DecodePlan(engine.model, HostMemory(broken), 4, engine.context_length)
        prompt = np.random.default_rng(2).integers(0, engine.config.vocab_size, 5)
        cache = KVCache(engine.config, engine.context_length, engine.kv, None, None, plan.memory.empty)
        got = plan.forward(plan.program("base"), prompt, 0, cache)
        want = engine.forward(prompt, 0, engine.new_cache())
        with pytest.raises(AssertionError, match="differ by"):
            assert_close(got, want, "a broken shader")
    finally:
        broken.close()


def test_programs_share_the_base_weights_on_the_gpu(host, tmp_path):
    """A second program (the weights wrapped with an adapter) copies only the adapter and its own words
    to the GPU: the base weights are placed once (DecodePlan.shared)."""
    from ruvllm.learning.lora import LoRAMatrix

    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), compute="q4", kernels="numpy")
    plan = DecodePlan(engine.model, HostMemory(host), 4, engine.context_length)
    before = host.written
    plan.program("base")
    base = host.written - before
    linear = engine.weights.layers[0].self_attn.q_proj
    N, K = linear.matrix.shape
    original = linear.matrix
    A, B = np.ones((4, K), np.float32), np.ones((N, 4), np.float32)
    linear.matrix = LoRAMatrix(original, A, B, 1.0, [])
    try:
        before = host.written
        plan.program("adapted")
        adapted = host.written - before
    finally:
        linear.matrix = original
    assert base > engine.weights.nbytes // 2, "the base program placed less than the weights"
    assert adapted <= A.nbytes + B.nbytes + 64 * 1024, f"the adapter's program copied {adapted} bytes"


@pytest.mark.parametrize("choice", ["auto", "webgpu"])
def test_a_gpu_that_passes_the_check_runs_every_forward(host, tmp_path, choice):
    """runtime/device.use_gpu: the check's figures within the bound, the engine's forward on the GPU from
    then on (its caches in the GPU's memory), giving the CPU's logits."""
    from ruvllm.runtime.device import use_gpu

    tiny_model("qwen2", tmp_path)
    engine = load_engine(str(tmp_path), compute="q8", kernels="numpy")
    want = engine.forward(np.array([3, 1, 4, 1, 5]), 0, engine.new_cache())
    report = use_gpu(engine, HostMemory(host), choice)
    assert report["path"] == "webgpu" and report["reason"] is None and engine.device == "webgpu"
    check = report["check"]
    assert check["passed"] and check["top1"] == 1.0 and check["relative"] < 1e-4, check
    cache = engine.new_cache()
    assert isinstance(cache.layers[0].hot.k, PoolArray)
    host.last = {}
    assert_close(engine.forward(np.array([3, 1, 4, 1, 5]), 0, cache), want, "the engine's forward")
    assert host.last["submits"] == 1, "the forward did not run on the GPU"


def test_a_gpu_that_fails_the_check_is_not_used_and_says_why(host, tmp_path):
    """A shader broken on purpose: with 'auto' the CPU runs and the report says which check failed, with
    the figures; with 'webgpu' the load fails, naming them."""
    from ruvllm.errors import LoadError
    from ruvllm.runtime.device import use_gpu

    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), compute="q4", kernels="numpy")
    broken = GpuHost(broken="gated")
    try:
        report = use_gpu(engine, HostMemory(broken), "auto")
        assert report["path"] == "cpu" and engine.device == "cpu" and engine.decode_plan is None
        assert "failed the check" in report["reason"] and not report["check"]["passed"], report
        assert report["check"]["relative"] > 0.05, report["check"]
        with pytest.raises(LoadError, match="device 'webgpu': the GPU's logits failed the check"):
            use_gpu(engine, HostMemory(broken), "webgpu")
    finally:
        broken.close()


@pytest.mark.parametrize("compute", ["q8", "q4"])
def test_float16_scales_go_to_the_gpu_as_such(host, tmp_path, compute):
    """Scales and mins that are exactly float16 (as GGUF's q4_0, q4_1 and q8_0 store them, and our own
    quantizers) are placed as float16 (plan.py HALF: 20 bytes a group of q4 weights) and give the NumPy
    forward's logits; nudged off float16, they stay float32 and give them too."""
    from ruvllm.model.plan import HALF, _linears
    from ruvllm.quant.matrices import Int8Matrix

    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), compute=compute, kernels="numpy")
    prompt = np.random.default_rng(4).integers(0, engine.config.vocab_size, 6)
    for exact in (True, False):
        for _, linear in _linears(engine.model):
            m = linear.matrix
            if isinstance(m, Int8Matrix):
                for part in (m.scales, m.mins):
                    if part is not None:
                        part[...] = part.astype(np.float16) * (1 if exact else np.float32(1.0001))
        want = engine.forward(prompt, 0, engine.new_cache())
        plan = DecodePlan(engine.model, HostMemory(host), 4, engine.context_length)
        program = plan.program("base")
        flags = product_flags(program)
        assert flags and all(bool(word & HALF) == exact for word in flags), (exact, flags)
        cache = KVCache(engine.config, engine.context_length, engine.kv, None, None, plan.memory.empty)
        assert_close(plan.forward(program, prompt, 0, cache), want, f"exactly float16 scales: {exact}")


def product_flags(program) -> list[int]:
    """The flags word of each quantized product step of a program."""
    from ruvllm.model.plan import PRODUCT

    words = np.asarray(program.words).reshape(-1, 16)
    return [int(w[12]) for w in words if w[0] == PRODUCT and w[1] != 0]


@pytest.mark.parametrize("compute", ["f32", "q8", "q4"])
def test_a_matrix_larger_than_a_binding_is_split_in_parts(tmp_path, compute):
    """With the largest binding at 48 KiB (RUVLLM_GPU_MAX_BINDING), the tied embedding of a 2048-token
    vocabulary (64 KiB of q4 codes, 128 KiB of q8, 512 KiB of float32) lies in several buffers and its
    product runs a dispatch per part: the NumPy forward's logits all the same."""
    tiny_model("llama", tmp_path, vocab_size=2048, tie_word_embeddings=True)
    engine = load_engine(str(tmp_path), compute=compute, kernels="numpy", context_length=64)
    small = GpuHost(max_binding=48 * 1024)
    try:
        if small.reason:
            pytest.skip(f"no WebGPU adapter: {small.reason}")
        plan = DecodePlan(engine.model, HostMemory(small), 3, engine.context_length)
        program = plan.program("base")
        cache = KVCache(engine.config, engine.context_length, engine.kv, None, None, plan.memory.empty)
        reference = engine.new_cache()
        prompt = np.random.default_rng(6).integers(0, engine.config.vocab_size, 5)
        assert_close(plan.forward(program, prompt, 0, cache), engine.forward(prompt, 0, reference), "the prompt")
        token = np.array([7])
        assert_close(plan.forward(program, token, 5, cache), engine.forward(token, 5, reference), "a step")
        split = small.last["dispatches"]
        whole = GpuHost()
        try:
            one = DecodePlan(engine.model, HostMemory(whole), 3, engine.context_length)
            cache = KVCache(engine.config, 64, engine.kv, None, None, one.memory.empty)
            one.forward(one.program("base"), token, 0, cache)
            parts = {"f32": 11, "q8": 3, "q4": 2}[compute]  # (the logits' product, of 2048 rows, in parts)
            assert split == whole.last["dispatches"] + parts - 1, "the lm_head was not split as expected"
        finally:
            whole.close()
    finally:
        small.close()


def grouped_model(tmp_path, group: int = 8, nan_rows: tuple[int, ...] = ()) -> None:
    """A tiny Llama whose output rows come in groups of `group` equal rows (so every logit is tied with
    group - 1 others, exactly: equal rows give equal sums), and rows of NaN at `nan_rows`."""
    import torch

    model = tiny_model("llama")
    with torch.no_grad():
        w = model.get_output_embeddings().weight  # (V, D)
        w.copy_(w[(torch.arange(w.shape[0]) // group) * group])
        for row in nan_rows:
            w[row] = float("nan")
    model.save_pretrained(tmp_path)


@pytest.mark.parametrize("compute", ["f32", "q4"])
def test_a_pick_reads_back_the_largest_logits_of_the_gpus_row_in_order(host, tmp_path, compute):
    """plan.pick against the GPU's own row of logits (plan.forward on a twin cache): the same ids as
    sampling.top_candidates takes from it, ties by id at the cut too, the values bit for bit; only
    1 + 2k words read back."""
    from ruvllm.runtime.sampling import top_candidates

    grouped_model(tmp_path)
    engine = load_engine(str(tmp_path), compute=compute, kernels="numpy")
    plan = DecodePlan(engine.model, HostMemory(host), 4, engine.context_length)
    program = plan.program("base")

    def cache() -> KVCache:
        return KVCache(engine.config, engine.context_length, engine.kv, None, None, plan.memory.empty)

    rows, picks = cache(), cache()
    ids = np.array([5, 17, 99, 3, 64, 12])
    for k in (1, 5, 8, 13, 64):
        row = plan.forward(program, ids, 0, rows, last_only=True)[0]
        top = plan.pick(program, ids, 0, picks, k)
        assert host.last["readBytes"] == 4 * (1 + 2 * k) and host.last["submits"] == 1
        want_ids, want_values = top_candidates(row, k)
        assert top.ids.tolist() == want_ids.tolist(), f"k={k}"
        assert top.values.tobytes() == want_values.tobytes() and top.nonfinite == 0
    assert len(set(row.tolist())) == engine.config.vocab_size // 8, "the logits are not tied in groups of 8"


def test_a_pick_counts_non_finite_logits_and_the_decoder_refuses_them(host, tmp_path):
    """Rows of NaN weights: the pick never takes their logits and counts them, and the Decoder raises
    the error the CPU's row gives."""
    from ruvllm.errors import InferenceError
    from ruvllm.runtime.generate import Decoder, GenerationOptions

    grouped_model(tmp_path, group=1, nan_rows=(7, 40, 41))
    engine = load_engine(str(tmp_path), compute="f32", kernels="numpy")
    plan = DecodePlan(engine.model, HostMemory(host), 4, engine.context_length)
    cache = KVCache(engine.config, engine.context_length, engine.kv, None, None, plan.memory.empty)
    top = plan.pick(plan.program("base"), np.array([1, 2, 3]), 0, cache, 64)
    assert top.nonfinite == 3 and not {7, 40, 41} & set(top.ids.tolist()) and len(top.ids) == 64
    decoder = Decoder([1, 2, 3], GenerationOptions.from_kwargs(temperature=0), set(), None)
    with pytest.raises(InferenceError, match="non-finite logits at position 2"):
        decoder.choose(top)


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=3), dict(temperature=1.5, top_k=5, top_p=0.8, seed=9)],
    ids=str,
)
def test_generation_on_the_gpu_picks_the_tokens_its_rows_give(host, tmp_path, sampling):
    """generate_tokens on an engine whose plan runs on the GPU: greedy and top-k sampling read back only
    the largest logits (1 + 2k words a token) and give the tokens the same generation gives reading
    back whole rows (the plan told it picks nothing); repetition penalties and log-probabilities read rows."""
    from ruvllm.runtime.device import use_gpu
    from ruvllm.runtime.generate import GenerationOptions, Step, generate_tokens

    tiny_model("qwen3", tmp_path)
    engine = load_engine(str(tmp_path), compute="q4", kernels="numpy")
    assert use_gpu(engine, HostMemory(host), "webgpu")["path"] == "webgpu"
    plan = engine.decode_plan

    def tokens(**extra) -> list[int]:
        options = GenerationOptions.from_kwargs(max_tokens=12, ignore_eos=True, **sampling, **extra)
        steps = generate_tokens(engine, [3, 14, 15, 92, 65], options)
        return [s.token_id for s in steps if isinstance(s, Step)]

    picked = tokens()
    k = 1 if sampling["temperature"] == 0 else sampling["top_k"]
    assert host.last["readBytes"] == 4 * (1 + 2 * k)
    plan.picks = False
    try:
        assert tokens() == picked
        assert host.last["readBytes"] == 4 * engine.config.vocab_size
    finally:
        plan.picks = True
    tokens(repetition_penalty=1.1)
    assert host.last["readBytes"] == 4 * engine.config.vocab_size
    tokens(logprobs=2)
    assert host.last["readBytes"] == 4 * engine.config.vocab_size
