"""MicroLoRA: adapters inside the linear entry point, gradients through the whole network checked
against torch autograd and finite differences, merge/unmerge, files, PEFT import, switching."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from ruvllm.errors import InvalidArgumentError, LoadError
from ruvllm.learning.adapters import AdapterSet
from ruvllm.learning.backprop import logits_for
from ruvllm.learning.learn import adapter_gradients
from ruvllm.learning.lora import TARGETS, Adapter, Gate, LoRAConfig
from ruvllm.runtime.assembly import load_engine
from ruvllm.runtime.generate import GenerationOptions, generate_tokens

from conftest import tiny_model

pytestmark = pytest.mark.parity

TOKENS = list(np.random.default_rng(4).integers(0, 128, 24))
SCORED = np.arange(9, 23)  # predict tokens 10..23 from what precedes them


def random_adapter(engine, targets=TARGETS, rank=2, seed=1, layers=None) -> Adapter:
    adapter = Adapter.new(engine.weights, LoRAConfig(rank=rank, alpha=3.0, targets=targets, layers=layers), seed=seed)
    rng = np.random.default_rng(seed + 1)
    for name in adapter.B:  # a trained-looking adapter: B away from zero, so dA is not zero
        adapter.B[name][...] = rng.normal(0, 0.05, adapter.B[name].shape)
    return adapter


def torch_adapted(model, adapter: Adapter) -> tuple[dict, dict]:
    """The torch model's parameters with every targeted weight W replaced by W + scale * B @ A, and the
    (A, B) leaves by module: the same loss in torch, for autograd."""
    leaves, params = {}, dict(model.named_parameters(remove_duplicate=False))
    fused: dict[str, dict[int, torch.Tensor]] = {}  # Phi-3's qkv_proj and gate_up_proj: their parts' deltas
    for name in adapter.A:
        A = torch.tensor(adapter.A[name], requires_grad=True)
        B = torch.tensor(adapter.B[name], requires_grad=True)
        leaves[name] = (A, B)
        if f"{name}.weight" in params:
            params[f"{name}.weight"] = params[f"{name}.weight"].detach() + adapter.config.scale * (B @ A)
        else:
            prefix, part = name.rsplit(".", 1)
            whole, index = FUSED[part]
            fused.setdefault(f"{prefix}.{whole}", {})[index] = adapter.config.scale * (B @ A)
    for whole, parts in fused.items():  # (every part adapted: TARGETS)
        params[f"{whole}.weight"] = params[f"{whole}.weight"].detach() + torch.cat([parts[i] for i in sorted(parts)])
    return leaves, params


# where each projection lies in a fused weight: (the fused module, its place in the order of rows)
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2)}
FUSED |= {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def activated(engine, adapter: Adapter) -> AdapterSet:
    adapters = AdapterSet(engine.weights)
    adapters.add("a", adapter)
    adapters.activate("a")
    return adapters


VARIANTS = {
    "llama GQA tied": ("llama", dict(tie_word_embeddings=True), None, TARGETS),
    "qwen2 biases": ("qwen2", dict(), None, TARGETS),
    "mistral window": ("mistral", dict(sliding_window=7), None, TARGETS),
    # the passes start at the adapter's lowest layer (2 of 4), entering with the states computed there;
    # with down_proj alone, the backward stops inside that layer's MLP
    "llama top layers": ("llama", dict(num_hidden_layers=4), (-2, -1), TARGETS),
    "llama top down_proj": ("llama", dict(num_hidden_layers=4), (2, 3), ("down_proj",)),
    # only the output projection: no decoder layer runs per step
    "llama lm_head": ("llama", dict(tie_word_embeddings=True), None, ("lm_head",)),
    # a norm of every query and key head before RoPE
    "qwen3 qk norms": ("qwen3", dict(), None, TARGETS),
    # q/k/v and gate/up stored fused
    "phi3 fused": ("phi3", dict(), None, TARGETS),
    # and GeGLU, a norm on each sublayer's output, sliding windows (8 of 24 tokens), embeddings scaled
    "gemma3 every layer": ("gemma3", dict(), None, TARGETS),
    "gemma3 top down_proj": ("gemma3", dict(), (4, 5), ("down_proj",)),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gradients_equal_torch_autograd(variant, tmp_path):
    kind, overrides, layers, targets = VARIANTS[variant]
    model = tiny_model(kind, tmp_path, **overrides)
    engine = load_engine(str(tmp_path))
    adapter = random_adapter(engine, targets, layers=layers)
    lowest = None if targets == ("lm_head",) else 0 if layers is None else layers[0] % engine.config.num_hidden_layers
    assert adapter.lowest_layer == lowest
    activated(engine, adapter)
    result, grads = adapter_gradients(engine, adapter, TOKENS, SCORED, reward=1.5)
    loss = result.loss

    leaves, params = torch_adapted(model, adapter)
    # tie_weights=False: an adapter on a tied lm_head changes the output projection, not the embedding
    logits = torch.func.functional_call(model, params, (torch.tensor([TOKENS]),), tie_weights=False).logits[0]
    log_probs = torch.log_softmax(logits[SCORED].double(), dim=-1)
    expected_loss = -1.5 * log_probs[torch.arange(len(SCORED)), torch.tensor(TOKENS)[SCORED + 1]].mean()
    expected_loss.backward()
    assert loss == pytest.approx(expected_loss.item(), rel=1e-5)
    for name, (A, B) in leaves.items():
        np.testing.assert_allclose(grads[f"{name}.lora_A"], A.grad.numpy(), rtol=2e-3, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(grads[f"{name}.lora_B"], B.grad.numpy(), rtol=2e-3, atol=2e-6, err_msg=name)


def gated_in_torch(model, adapter: Adapter) -> dict:
    """Forward hooks that add each adapted projection's gated update to its output (torch: each gate's
    rows scaled by its opening, a ramp from low to high of the norm of their response), and the (A, B)
    leaves by module."""
    leaves, modules = {}, dict(model.named_modules())
    for name in adapter.A:
        A = torch.tensor(adapter.A[name], requires_grad=True)
        B = torch.tensor(adapter.B[name], requires_grad=True)
        leaves[name] = (A, B)

        def hook(module, inputs, output, A=A, B=B, gates=tuple(adapter.gates.get(name, ()))):  # noqa: B008
            low = inputs[0] @ A.T  # (1, T, r)
            parts = [low]
            for gate in gates:
                rows = low[..., gate.start : gate.stop]
                opening = ((rows.norm(dim=-1, keepdim=True) - gate.low) / (gate.high - gate.low)).clamp(0, 1)
                parts = [torch.cat([parts[0][..., : gate.start], rows * opening, parts[0][..., gate.stop :]], -1)]
            return output + adapter.config.scale * parts[0] @ B.T

        modules[name].register_forward_hook(hook)
    return leaves


def test_gated_rows_compute_and_learn_as_torch_autograd_says(tmp_path):
    """A keyed lesson's rows are gated (lora.Gate): where an input's response to them is below the
    gate's low they give nothing, above its high all, between a share. Two gates on two rows each,
    ramped from 0.7 to 1.3 times the median response, shut some positions, open some and leave some
    between: the logits and the gradients of A and B (through the openings too) equal torch's (the same
    gates in forward hooks), and differ from the same adapter ungated."""
    model = tiny_model("llama", tmp_path, num_hidden_layers=4)
    engine = load_engine(str(tmp_path))
    adapter = random_adapter(engine, ("down_proj",), rank=4, layers=(2, 3))
    adapters = activated(engine, adapter)
    ungated = engine.forward(TOKENS, 0, engine.new_cache())
    seen = {}
    for name in adapter.A:  # each adapted projection's inputs over TOKENS' positions
        dict(model.named_modules())[name].register_forward_hook(
            lambda m, inputs, out, name=name: seen.update({name: inputs[0][0].detach().numpy()})
        )
    with torch.no_grad():
        model(torch.tensor([TOKENS]))
    model = tiny_model("llama", tmp_path / "again", num_hidden_layers=4)  # (the same seeded model, no hooks)
    between = 0
    for name, x in seen.items():  # each pair of rows ramped around its median response
        low = x @ adapter.A[name].T
        for a in (0, 2):
            norms = np.linalg.norm(low[:, a : a + 2], axis=1)
            adapter.gates[name].append(Gate(a, a + 2, 0.7 * float(np.median(norms)), 1.3 * float(np.median(norms))))
            between += int(((norms > adapter.gates[name][-1].low) & (norms < adapter.gates[name][-1].high)).sum())
    assert between > 4  # (in the first layer's; the second's inputs move with the first's adapter)
    adapters.apply(None)
    adapters.apply("a")  # (the wrappers hold the adapter's lists of gates either way)
    gated = engine.forward(TOKENS, 0, engine.new_cache())
    assert np.abs(gated - ungated).max() > 1e-3
    result, grads = adapter_gradients(engine, adapter, TOKENS, SCORED, reward=1.0)

    leaves = gated_in_torch(model, adapter)
    logits = model(torch.tensor([TOKENS])).logits[0]
    np.testing.assert_allclose(gated, logits.detach().numpy(), atol=1e-4)
    log_probs = torch.log_softmax(logits[SCORED].double(), dim=-1)
    expected_loss = -log_probs[torch.arange(len(SCORED)), torch.tensor(TOKENS)[SCORED + 1]].mean()
    expected_loss.backward()
    assert result.loss == pytest.approx(expected_loss.item(), rel=1e-5)
    for name, (A, B) in leaves.items():
        np.testing.assert_allclose(grads[f"{name}.lora_A"], A.grad.numpy(), rtol=2e-3, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(grads[f"{name}.lora_B"], B.grad.numpy(), rtol=2e-3, atol=2e-6, err_msg=name)


def test_an_adapter_grows_without_changing_what_it_computes(tmp_path):
    """Adapter.grow: more rows of A and columns of B, zero, the scale kept, what learning keeps per
    parameter padded alike; the weights wrapped again (AdapterSet.refresh) compute as before."""
    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path))
    adapter = random_adapter(engine, ("down_proj", "q_proj"), rank=2)
    adapter.state.adam.m = {k: np.ones_like(v) for k, v in adapter.parameters()}
    adapters = activated(engine, adapter)
    before, scale = engine.forward(TOKENS, 0, engine.new_cache()), adapter.config.scale
    adapter.grow(3)
    adapters.refresh(adapter)
    assert adapter.config.rank == 5 and adapter.config.scale == scale and adapter.version == 1
    np.testing.assert_allclose(engine.forward(TOKENS, 0, engine.new_cache()), before, atol=1e-6)
    for key, value in adapter.parameters():
        moment = adapter.state.adam.m[key]
        assert moment.shape == value.shape and moment.sum() == 2 * value.size / 5  # the old ones kept, new zero


def test_gates_are_saved_checked_and_kept_out_of_merges_and_mixtures(tmp_path, capsys):
    """A gated adapter's gates round-trip through adapter_config.json (`ruvllm_gates`); a malformed
    gate is refused naming it; merging one into weights (in memory, or `ruvllm merge`'s folder) is
    refused with the reason (no matrix computes a gate), and `ungated` merges it as the same adapter
    without its gates computes."""
    from ruvllm import cli
    from ruvllm.tools.merge import merge_adapter

    tiny_model("llama", tmp_path / "m")
    engine = load_engine(str(tmp_path / "m"))
    adapter = random_adapter(engine, ("down_proj",), rank=4, layers=(-1,))
    name = next(iter(adapter.A))
    adapter.gates[name] = [Gate(0, 2, 0.25, 0.5), Gate(2, 3, 1.5, 1.5)]
    adapter.save(str(tmp_path / "a"))
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["ruvllm_gates"] == {name: [[0, 2, 0.25, 0.5], [2, 3, 1.5, 1.5]]}
    assert Adapter.load(str(tmp_path / "a"), engine.weights).gates == adapter.gates
    for gates, why in (
        (
            {name: [[0, 9, 1.0, 2.0]]},
            r"a gate of model\.layers\.1\.mlp\.down_proj must be \[start, stop, low, high\] "
            r"with 0 <= start < stop <= 4 and finite 0 <= low <= high, got \[0, 9, 1\.0, 2\.0\]",
        ),
        ({name: [[1, 2, -1, 1]]}, r"got \[1, 2, -1, 1\]"),
        ({name: [[1, 2, 2.0, 1.0]]}, r"got \[1, 2, 2\.0, 1\.0\]"),
        ({name: [[1, 2, 1.0]]}, r"got \[1, 2, 1\.0\]"),
        ({"model.layers.0.mlp.up_proj": [[0, 1, 1.0]]}, "names 'model.layers.0.mlp.up_proj', which the adapter"),
        ([1], "ruvllm_gates must be an object of modules"),
    ):
        (tmp_path / "a" / "adapter_config.json").write_text(json.dumps({**config, "ruvllm_gates": gates}))
        with pytest.raises(LoadError, match=why):
            Adapter.load(str(tmp_path / "a"), engine.weights)
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(config))
    refused = r"this adapter's lessons are gated \(each answers only inputs near its own; .*\): {} cannot hold a gate"
    adapters = activated(engine, adapter)
    with pytest.raises(InvalidArgumentError, match=refused.format("merging into the weights")):
        adapters.merge("a")
    with pytest.raises(InvalidArgumentError, match=refused.format("merging .* into a model") + ".*; --ungated merges"):
        merge_adapter(str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    assert cli.main(["merge", str(tmp_path / "m"), str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err  # the command says why, in one line, and how
    assert "cannot hold a gate" in err and "--ungated merges it so" in err and "Traceback" not in err
    assert (
        cli.main(["merge", str(tmp_path / "m"), str(tmp_path / "a"), "--out", str(tmp_path / "out"), "--ungated"]) == 0
    )
    merged = load_engine(str(tmp_path / "out"))
    for gates in adapter.gates.values():  # (the wrappers hold these lists) the adapter ungated, as merged
        gates.clear()
    np.testing.assert_allclose(
        merged.forward(TOKENS, 0, merged.new_cache()), engine.forward(TOKENS, 0, engine.new_cache()), atol=1e-5
    )


def test_an_x_lora_expert_keeps_its_gates(tmp_path):
    """A gated adapter mixed by X-LoRA computes, as an expert at scaling 1, what it computes alone: its
    rows scaled by its gate's opening, in the forward and in the backward's dx."""
    from ruvllm.learning.lora import LoRAMatrix, gated_backward, linear_of

    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path))
    adapter = random_adapter(engine, ("down_proj",), rank=4, layers=(-1,))
    name = next(iter(adapter.A))
    x = np.random.default_rng(0).normal(0, 1, (12, adapter.A[name].shape[1])).astype(np.float32)
    low = np.linalg.norm(x @ adapter.A[name][:3].T, axis=1)
    adapter.gates[name] = [Gate(0, 3, 0.7 * float(np.median(low)), 1.3 * float(np.median(low)))]
    adapters = activated(engine, adapter)
    alone = linear_of(engine.weights, name).matrix
    assert isinstance(alone, LoRAMatrix)
    expected, raw = alone(x), alone.gated(x)[1]
    assert raw is not None and 0 < (low < 0.7 * np.median(low)).sum() < len(x)
    mixture = adapters.mix("x", ["a"])
    matrix = linear_of(engine.weights, name).matrix
    mixture.mixes = [np.ones((len(x), 1), np.float32)] * len(mixture.modules)
    g = mixture.config.global_scaling_weight
    np.testing.assert_allclose(matrix(x) - alone.base(x), g * (expected - alone.base(x)), rtol=1e-5, atol=1e-6)
    dy = np.random.default_rng(1).normal(0, 1, (len(x), alone.shape[0])).astype(np.float32)
    back = gated_backward(dy @ adapter.B[name] * alone.scale * g, raw, adapter.gates[name])
    np.testing.assert_allclose(matrix.backward(dy, x)[1], back @ adapter.A[name], rtol=1e-4, atol=1e-5)


def test_bad_feedback_s_unlikelihood_gradient_equals_torch_autograd(tmp_path):
    """reward < 0: -|reward| * log(1 - p(target)) at the weakest scored position after the first and
    before the last (the target nearest to the likeliest other token, either side), its gradient as
    torch's autograd gives; the margin reported is the smallest up to that last."""
    model = tiny_model("llama", tmp_path, num_hidden_layers=4)
    engine = load_engine(str(tmp_path))
    adapter = random_adapter(engine, ("q_proj", "down_proj"), layers=(-2, -1))
    activated(engine, adapter)
    result, grads = adapter_gradients(engine, adapter, TOKENS, SCORED, reward=-0.5)

    leaves, params = torch_adapted(model, adapter)
    logits = torch.func.functional_call(model, params, (torch.tensor([TOKENS]),), tie_weights=False).logits[0]
    log_probs = torch.log_softmax(logits[SCORED].double(), dim=-1)  # (P, V)
    targets = torch.tensor(TOKENS)[SCORED + 1]
    target = log_probs[torch.arange(len(SCORED)), targets]
    others = log_probs.detach().clone()
    others[torch.arange(len(SCORED)), targets] = -torch.inf
    margins = target.detach() - others.max(dim=-1).values  # (P,)
    w = 1 + int(margins[1:-1].abs().argmin())
    expected_loss = -0.5 * torch.log1p(-target[w].exp())
    expected_loss.backward()
    assert result.loss == pytest.approx(expected_loss.item(), rel=1e-5)
    assert result.margin == pytest.approx(float(margins[:-1].min()), abs=1e-5)
    for name, (A, B) in leaves.items():
        np.testing.assert_allclose(grads[f"{name}.lora_A"], A.grad.numpy(), rtol=2e-3, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(grads[f"{name}.lora_B"], B.grad.numpy(), rtol=2e-3, atol=2e-6, err_msg=name)


def test_gradients_match_finite_differences(tmp_path):
    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path))
    adapter = random_adapter(engine, targets=("q_proj", "v_proj", "down_proj"))
    activated(engine, adapter)
    _, grads = adapter_gradients(engine, adapter, TOKENS, SCORED, reward=1.0)
    rng = np.random.default_rng(0)
    checked = 0
    for key, array in adapter.parameters():
        for _ in range(2):
            index = tuple(rng.integers(0, n) for n in array.shape)
            original = array[index]
            eps = 1e-2
            array[index] = original + eps
            plus = adapter_gradients(engine, adapter, TOKENS, SCORED, 1.0)[0].loss
            array[index] = original - eps
            minus = adapter_gradients(engine, adapter, TOKENS, SCORED, 1.0)[0].loss
            array[index] = original
            numeric = (plus - minus) / (2 * eps)
            assert grads[key][index] == pytest.approx(numeric, rel=0.05, abs=2e-4), key
            checked += 1
    assert checked == 24


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])
def test_training_forward_is_the_inference_forward(kind, tmp_path):
    tiny_model(kind, tmp_path)
    engine = load_engine(str(tmp_path))
    activated(engine, random_adapter(engine))
    expected = engine.forward(TOKENS, 0, engine.new_cache())
    np.testing.assert_allclose(logits_for(engine.model, TOKENS), expected, atol=1e-5)


def test_a_new_adapter_changes_nothing_until_it_learns(tmp_path):
    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path))
    base = engine.forward(TOKENS, 0, engine.new_cache())
    adapter = Adapter.new(engine.weights, LoRAConfig())
    assert adapter.config.targets == ("down_proj",) and adapter.config.rank == 32
    assert all(not b.any() for b in adapter.B.values()) and all(a.any() for a in adapter.A.values())
    activated(engine, adapter)
    np.testing.assert_array_equal(engine.forward(TOKENS, 0, engine.new_cache()), base)


def test_merge_and_unmerge_are_exact(tmp_path):
    tiny_model("llama", tmp_path, tie_word_embeddings=True)
    engine = load_engine(str(tmp_path))
    base = engine.forward(TOKENS, 0, engine.new_cache())
    adapter = random_adapter(engine)
    adapters = AdapterSet.attached(engine)
    adapters.add("a", adapter)
    adapters.activate("a")
    with_adapter = engine.forward(TOKENS, 0, engine.new_cache())
    adapters.activate(None)
    np.testing.assert_array_equal(engine.forward(TOKENS, 0, engine.new_cache()), base)  # switched off
    embedding = engine.weights.embed_tokens.weight.copy()
    adapters.merge("a")
    np.testing.assert_allclose(engine.forward(TOKENS, 0, engine.new_cache()), with_adapter, atol=1e-5)
    np.testing.assert_array_equal(engine.weights.embed_tokens.weight, embedding)  # the tied lm_head was untied
    adapters.merge("a", sign=-1)
    np.testing.assert_allclose(engine.forward(TOKENS, 0, engine.new_cache()), base, atol=1e-5)
    q4 = load_engine(str(tmp_path), compute="q4")
    AdapterSet.attached(q4).add("a", Adapter.new(q4.weights, LoRAConfig()))
    with pytest.raises(
        InvalidArgumentError, match=r"merging needs float32 weights; model\.layers\.0\.mlp\.down_proj computes as q4"
    ):
        AdapterSet.attached(q4).merge("a")


def test_a_merge_is_not_served_from_keys_cached_before_it(tmp_path):
    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path))
    AdapterSet.attached(engine).add("a", random_adapter(engine))
    cache = engine.new_cache()
    options = GenerationOptions.from_kwargs(max_tokens=4, temperature=0)

    def cached_tokens() -> int:  # of a whole generation on the shared cache
        first, *_ = generate_tokens(engine, TOKENS, options, cache=cache)
        return first.cached_tokens

    assert cached_tokens() == 0
    assert cached_tokens() == len(TOKENS) - 1
    AdapterSet.attached(engine).merge("a")
    assert cached_tokens() == 0


def test_several_adapters_switch_per_request(tmp_path):
    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path))
    adapters = AdapterSet(engine.weights)
    adapters.add("one", random_adapter(engine, seed=1))
    adapters.add("two", random_adapter(engine, seed=5))
    outputs = {}
    for name in ("one", "two", None, "one"):
        adapters.activate(name)
        outputs.setdefault(name, []).append(engine.forward(TOKENS, 0, engine.new_cache()))
    np.testing.assert_array_equal(outputs["one"][0], outputs["one"][1])
    assert np.abs(outputs["one"][0] - outputs["two"][0]).max() > 1e-3
    assert adapters.identity() == (0, "one", adapters.adapters["one"].uid, 0)
    with pytest.raises(InvalidArgumentError, match="no adapter named 'three' \\(adapters: one, two\\)"):
        adapters.activate("three")


def test_save_and_load_round_trip(tmp_path):
    tiny_model("llama", tmp_path / "m")
    engine = load_engine(str(tmp_path / "m"))
    adapter = random_adapter(engine, targets=("q_proj", "o_proj", "lm_head"), rank=3)
    adapter.state.ewc.fisher["x"] = np.ones(3, np.float32)
    adapter.version = 7
    adapter.save(str(tmp_path / "a"), base_model="tiny")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert (
        config["r"] == 3
        and config["target_modules"] == ["q_proj", "o_proj", "lm_head"]
        and config["peft_type"] == "LORA"
    )
    back = Adapter.load(str(tmp_path / "a"), engine.weights)
    assert back.version == 7 and back.config.scale == adapter.config.scale
    for (key, a), (key2, b) in zip(adapter.parameters(), back.parameters(), strict=True):
        assert key == key2
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.state.ewc.fisher["x"], np.ones(3))
    with pytest.raises(LoadError, match=r"an adapter folder needs adapter_config\.json and adapter_model\.safetensors"):
        Adapter.load(str(tmp_path / "m"), engine.weights)


def test_peft_adapters_load_and_match_transformers(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = tiny_model("llama", tmp_path / "m")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    peft_model.save_pretrained(tmp_path / "a")
    with torch.no_grad():
        expected = peft_model(torch.tensor([TOKENS])).logits[0].numpy()
    engine = load_engine(str(tmp_path / "m"))
    adapter = Adapter.load(str(tmp_path / "a"), engine.weights)
    assert adapter.config.rank == 4 and adapter.config.scale == 2.0
    activated(engine, adapter)
    np.testing.assert_allclose(engine.forward(TOKENS, 0, engine.new_cache()), expected, atol=1e-4)
    with torch.no_grad(), peft_model.disable_adapter():
        base = peft_model(torch.tensor([TOKENS])).logits[0].numpy()
    assert np.abs(expected - base).max() > 1e-3  # the adapter does change the model


def test_bad_adapter_files_are_refused(tmp_path):
    tiny_model("llama", tmp_path / "m")
    engine = load_engine(str(tmp_path / "m"))
    adapter = random_adapter(engine, targets=("q_proj",))
    adapter.save(str(tmp_path / "a"))
    big = load_engine(str(tmp_path / "m"))
    big.weights.layers[0].self_attn.q_proj.matrix.shape = (128, 64)  # pretend another model
    with pytest.raises(
        LoadError,
        match=r"base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_B\.weight has shape "
        r"\[64, 2\], expected \[128, 2\]",
    ):
        Adapter.load(str(tmp_path / "a"), big.weights)
    (tmp_path / "a" / "adapter_config.json").write_text('{"peft_type": "PREFIX_TUNING"}')
    with pytest.raises(LoadError, match="peft_type 'PREFIX_TUNING' is not LORA"):
        Adapter.load(str(tmp_path / "a"), engine.weights)
    with pytest.raises(InvalidArgumentError, match="targets must be among"):
        LoRAConfig(targets=("wq",))


def test_our_adapters_load_in_peft(tmp_path):
    from peft import PeftModel

    tiny_model("llama", tmp_path / "m")
    for layers in (None, (-1,)):  # every layer; the top one only (PEFT's layers_to_transform)
        engine = load_engine(str(tmp_path / "m"))
        adapter = random_adapter(engine, targets=("k_proj", "o_proj", "up_proj"), rank=2, layers=layers)
        activated(engine, adapter)
        ours = engine.forward(TOKENS, 0, engine.new_cache())
        folder = tmp_path / f"a{layers}"
        adapter.save(str(folder))
        peft_model = PeftModel.from_pretrained(tiny_model("llama"), str(folder))  # the same seeded model
        assert peft_model.peft_config["default"].layers_to_transform == (None if layers is None else [1])
        with torch.no_grad():
            np.testing.assert_allclose(peft_model(torch.tensor([TOKENS])).logits[0].numpy(), ours, atol=1e-4)
        assert Adapter.load(str(folder), engine.weights).config.layers == (None if layers is None else (1,))


def test_merge_writes_a_model_folder_that_computes_like_the_adapter(tmp_path):
    from ruvllm.tools.merge import merge_adapter

    tiny_model("llama", tmp_path / "m", tie_word_embeddings=True)
    engine = load_engine(str(tmp_path / "m"))
    adapter = random_adapter(engine, targets=("q_proj", "down_proj", "lm_head"), layers=(-1,))
    activated(engine, adapter)
    expected = engine.forward(TOKENS, 0, engine.new_cache())
    adapter.save(str(tmp_path / "a"))
    merge_adapter(str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "merged"))
    merged = load_engine(str(tmp_path / "merged"))
    np.testing.assert_allclose(merged.forward(TOKENS, 0, merged.new_cache()), expected, atol=1e-4)
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False  # the output projection got its own copy
    np.testing.assert_array_equal(
        merged.weights.embed_tokens.weight, load_engine(str(tmp_path / "m")).weights.embed_tokens.weight
    )
    with pytest.raises(InvalidArgumentError, match="is not empty: writing into it would mix old files with new ones"):
        merge_adapter(str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "merged"))
    with pytest.raises(InvalidArgumentError, match="convert the GGUF file into one first"):
        merge_adapter(str(tmp_path / "x.gguf"), str(tmp_path / "a"), str(tmp_path / "other"))


def test_the_kept_predictions_term_equals_torch_autograd(tmp_path):
    from ruvllm.learning.backprop import Keep, loss_and_grads

    model = tiny_model("llama", tmp_path, num_hidden_layers=4)
    engine = load_engine(str(tmp_path))
    adapter = random_adapter(engine, ("down_proj",), layers=(-2, -1))
    activated(engine, adapter)
    rng = np.random.default_rng(9)
    ref = rng.dirichlet(np.ones(engine.config.vocab_size), 3).astype(np.float32)  # (3, V)
    keep = Keep(np.array([1, 4, 9]), ref, 10.0)  # position 9 is also scored: its row counts twice
    result = loss_and_grads(engine.model, TOKENS, SCORED, 1.0, keep, 2)

    leaves, params = torch_adapted(model, adapter)
    logits = torch.func.functional_call(model, params, (torch.tensor([TOKENS]),)).logits[0].double()
    log_probs = torch.log_softmax(logits, dim=-1)
    nll = -log_probs[torch.tensor(SCORED), torch.tensor(TOKENS)[SCORED + 1]].mean()
    target = torch.tensor(ref, dtype=torch.float64)
    kl = (target * (torch.log(target + 1e-30) - log_probs[torch.tensor([1, 4, 9])])).sum(-1).mean()
    (nll + 10.0 * kl).backward()
    assert result.loss == pytest.approx((nll + 10.0 * kl).item(), rel=1e-5)
    lesson = {id(m.A): (dA, dB) for m, dA, dB in result.by_matrix.values()}
    kept = {id(m.A): (dA, dB) for m, dA, dB in result.kept.values()}  # the kept term's, apart
    for name, (A, B) in leaves.items():
        (dA, dB), (kA, kB) = lesson[id(adapter.A[name])], kept[id(adapter.A[name])]
        dA, dB = dA + kA, dB + kB
        np.testing.assert_allclose(dA, A.grad.numpy(), rtol=2e-3, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(dB, B.grad.numpy(), rtol=2e-3, atol=2e-6, err_msg=name)


def test_the_backward_s_transposed_product_through_a_kernel_provider_equals_numpy(tmp_path, monkeypatch):
    """Where a kernel provider computes the products (the WebAssembly kernels in Pyodide), the backward
    pass's dy @ W runs through it a block of rows at a time: the same numbers as NumPy's whole product."""
    from ruvllm.learning import backprop

    class Provider:  # computes x @ M.T as the WebAssembly kernels do, for float32 matrices only
        name, arithmetic, calls = "numpy-stand-in", "exact", 0

        def prepare(self, matrix):
            if not isinstance(matrix, backprop.DenseMatrix):
                return None

            def product(x):
                Provider.calls += 1
                return x @ matrix.weight.T

            return product

    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), compute="q8")
    monkeypatch.setattr(backprop, "TRANSPOSED_BLOCK", 50)
    dy = np.random.default_rng(0).normal(size=(5, 128)).astype(np.float32)
    for matrix in (engine.weights.lm_head.matrix, engine.weights.layers[1].mlp.down_proj.matrix):
        expected = dy[:, : matrix.shape[0]] @ matrix.dequantize()
        matrix.use_provider(Provider())
        before = Provider.calls
        got = backprop.transposed_product(dy[:, : matrix.shape[0]], matrix)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        assert Provider.calls - before == -(-matrix.shape[0] // 50)  # one product per block of rows
