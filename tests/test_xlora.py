"""X-LoRA: PEFT X-LoRA checkpoints load and compute as PEFT's XLoraModel does (logits, scalings), a
generation's cached decode equals the full forward, mixtures save and load, the router's gradient
equals torch autograd's through PEFT's model, and a router learns from feedback."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from ruvllm.errors import InvalidArgumentError, LoadError
from ruvllm.learning.adapters import AdapterSet
from ruvllm.learning.learn import AdaptOptions, RouteLesson, route_gradients
from ruvllm.learning.lora import Adapter
from ruvllm.learning.xlora import Mixture, RouterConfig
from ruvllm.runtime.assembly import load_engine

from conftest import tiny_model

pytestmark = pytest.mark.parity

TOKENS = list(np.random.default_rng(5).integers(0, 128, 20))
EXPERT_TARGETS = (["q_proj", "down_proj"], ["v_proj", "down_proj"], ["up_proj", "o_proj"])


def experts(folder, count: int = 3) -> list[str]:
    """PEFT LoRA adapters on the seeded tiny Llama, each on other projections, B away from zero."""
    from peft import LoraConfig, get_peft_model

    paths = []
    for i, targets in enumerate(EXPERT_TARGETS[:count]):
        peft_model = get_peft_model(tiny_model("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        torch.manual_seed(10 + i)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
        path = folder / f"e{i}"
        peft_model.save_pretrained(path)
        paths.append(path)
    return paths


def peft_xlora(paths, seed: int = 0, **config):
    """PEFT's XLoraModel over the experts, its router randomized (PEFT names experts "0", "1", ...)."""
    from peft import XLoraConfig, get_peft_model

    base = tiny_model("llama")
    base.config.use_cache = False  # XLoraModel requires it
    adapters = {str(i): str(p) for i, p in enumerate(paths)}
    model = get_peft_model(base, XLoraConfig(task_type="CAUSAL_LM", hidden_size=64, adapters=adapters, **config))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "internal_xlora_classifier" in name:
                p.normal_(0, 0.5)
    return model.eval()


def save_checkpoint(model, paths, folder) -> None:
    """The X-LoRA checkpoint in PEFT's layout: its config, the router's tensors and each expert in a
    subfolder named after it (the Hub layout). PEFT 0.21's own save_pretrained drops router layer 0
    (keys with ".0" lose it with an expert named "0"), so the tensors are written from the model."""
    from safetensors.torch import save_file

    folder.mkdir()
    config = model.peft_config["default"].to_dict()
    config["adapters"] = {str(i): str(folder / str(i)) for i in range(len(paths))}
    (folder / "adapter_config.json").write_text(json.dumps(config, default=sorted))
    router = {n: p.detach().contiguous() for n, p in model.named_parameters() if "internal_xlora_classifier" in n}
    save_file(router, folder / "adapter_model.safetensors")
    for i, path in enumerate(paths):
        shutil.copytree(path, folder / str(i))


def routed(engine, mixture) -> AdapterSet:
    adapters = AdapterSet(engine.weights)
    engine.attach(adapters)
    adapters.add("x", mixture)
    adapters.activate("x")
    return adapters


CONFIGS = {
    "dense depth 1": dict(),
    "top-2 of 3, softmax over the kept": dict(top_k_lora=2, enable_softmax_topk=True, enable_softmax=False),
    "layerwise depth 2, scaling pass 0.3, weight 1.5": dict(
        xlora_depth=2, xlora_size=16, layerwise_scalings=True, scaling_pass_value=0.3, global_scaling_weight=1.5
    ),
    "top-1, temperature 0.5, no dropout": dict(
        top_k_lora=1, softmax_temperature=0.5, xlora_depth=3, xlora_size=8, xlora_dropout_p=0.0
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_peft_xlora_checkpoints_compute_as_peft(name, tmp_path):
    from peft import PeftModel

    tiny_model("llama", tmp_path / "m")
    paths = experts(tmp_path)
    model = peft_xlora(paths, **CONFIGS[name])
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        expected = model(input_ids=ids).logits[0].numpy()
        scalings = model.get_latest_scalings()[0].numpy()  # (T, L, E)
    save_checkpoint(model, paths, tmp_path / "x")
    base = tiny_model("llama")
    base.config.use_cache = False
    again = PeftModel.from_pretrained(base, str(tmp_path / "x"))  # PEFT reads this layout back
    with torch.no_grad():
        np.testing.assert_array_equal(again(input_ids=ids).logits[0].numpy(), expected)

    engine = load_engine(str(tmp_path / "m"))
    shutil.rmtree(paths[0])  # the config's paths: the subfolders are found first
    mixture = Mixture.load(str(tmp_path / "x"), engine.weights)
    assert mixture.names == ["0", "1", "2"] and len(mixture.modules) == scalings.shape[1]
    routed(engine, mixture)
    got = engine.forward(TOKENS, 0, engine.new_cache())
    np.testing.assert_allclose(got, expected, atol=2e-4)
    np.testing.assert_allclose(np.stack([m for m in mixture.mixes], axis=1), _kept(model, scalings), atol=1e-5)
    with torch.no_grad():
        base_logits = tiny_model("llama")(input_ids=ids).logits[0].numpy()
    assert np.abs(expected - base_logits).max() > 1e-2  # the experts do change the model


def _kept(model, scalings: np.ndarray) -> np.ndarray:
    """PEFT's per-projection scalings after top-k (what each projection multiplies by)."""
    from peft.tuners.xlora.layer import XLoraLayer

    config = model.peft_config["default"]
    out = []
    for index in range(scalings.shape[1]):
        stub = XLoraLayer(model, None, None, index, config)
        out.append(stub.get_maybe_topk_scalings(torch.tensor(scalings[None]))[0].numpy())
    return np.stack(out, axis=1)


def test_cached_decode_equals_the_full_forward(tmp_path):
    """Token by token with the KV cache (and the scaling pass's own cache), a rewind, then more: the
    same logits as one forward over the whole sequence."""
    tiny_model("llama", tmp_path / "m")
    paths = experts(tmp_path)
    model = peft_xlora(paths, xlora_depth=2, xlora_size=16, layerwise_scalings=True, scaling_pass_value=0.2)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([TOKENS])).logits[0].numpy()
    save_checkpoint(model, paths, tmp_path / "x")
    engine = load_engine(str(tmp_path / "m"))
    routed(engine, Mixture.load(str(tmp_path / "x"), engine.weights))
    cache = engine.new_cache()
    rows = [engine.forward(TOKENS[:8], 0, cache)]
    rows += [engine.forward([t], 8 + i, cache) for i, t in enumerate(TOKENS[8:14])]
    engine.forward([5, 6, 7], 14, cache)  # a branch, then rewound
    rows += [engine.forward(TOKENS[14:], 14, cache)]
    np.testing.assert_allclose(np.concatenate(rows), expected, atol=2e-4)
    side = engine.wrappers.scaling_caches[cache]  # the scaling pass's entries, kept beside the cache
    assert side.tokens == TOKENS
    cache.truncate(3)  # a rewind: the next forward rewinds the scaling pass's entries too
    engine.forward(TOKENS[3:5], 3, cache)
    assert side.tokens == TOKENS[:5]


def test_mixtures_compose_save_and_load(tmp_path):
    tiny_model("llama", tmp_path / "m")
    engine = load_engine(str(tmp_path / "m"))
    held = {f"e{i}": Adapter.load(str(p), engine.weights) for i, p in enumerate(experts(tmp_path, 2))}
    fresh = Mixture.new(held, 64, RouterConfig(depth=2, size=8, top_k=1))
    np.testing.assert_allclose(fresh.route(np.ones((3, 64), np.float32)), 0.5)  # equal scalings at first
    rng = np.random.default_rng(0)
    for _, array in fresh.parameters():
        array[...] = rng.normal(0, 0.3, array.shape)
    adapters = routed(engine, fresh)
    before = engine.forward(TOKENS, 0, engine.new_cache())
    fresh.save(str(tmp_path / "saved"))
    again = Mixture.load(str(tmp_path / "saved"), engine.weights)
    assert again.config == fresh.config and again.names == ["e0", "e1"]
    adapters.add("y", again)
    adapters.activate("y")
    np.testing.assert_array_equal(engine.forward(TOKENS, 0, engine.new_cache()), before)
    adapters.activate(None)  # the base model again: nothing of the mixture left in the weights
    ours = engine.forward(TOKENS, 0, engine.new_cache())
    with torch.no_grad():
        np.testing.assert_allclose(ours, tiny_model("llama")(torch.tensor([TOKENS])).logits[0].numpy(), atol=1e-4)


def test_bad_mixtures_are_refused(tmp_path):
    tiny_model("llama", tmp_path / "m")
    engine = load_engine(str(tmp_path / "m"))
    paths = experts(tmp_path, 2)
    save_checkpoint(peft_xlora(paths), paths, tmp_path / "x")
    config = json.loads((tmp_path / "x" / "adapter_config.json").read_text())
    shutil.rmtree(tmp_path / "x" / "1")
    config["adapters"]["1"] = "../e1"  # a path relative to the folder
    (tmp_path / "x" / "adapter_config.json").write_text(json.dumps(config))
    assert Mixture.load(str(tmp_path / "x"), engine.weights).names == ["0", "1"]
    shutil.rmtree(paths[1])
    with pytest.raises(LoadError, match=r"expert '1' not found \(looked in .*x/1, .*x/\.\./e1\)"):
        Mixture.load(str(tmp_path / "x"), engine.weights)
    shutil.copytree(paths[0], tmp_path / "x" / "1")
    (tmp_path / "x" / "adapter_config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    with pytest.raises(LoadError, match="hidden_size is 32, this model's is 64"):
        Mixture.load(str(tmp_path / "x"), engine.weights)
    (tmp_path / "x" / "adapter_config.json").write_text(json.dumps({**config, "xlora_depth": 2}))
    with pytest.raises(LoadError, match=r"has no base_model\.internal_xlora_classifier\.layers\.3\.weight"):
        Mixture.load(str(tmp_path / "x"), engine.weights)
    (tmp_path / "x" / "adapter_config.json").write_text(json.dumps({**config, "top_k_lora": 0}))
    with pytest.raises(LoadError, match="top_k must be a positive integer or None, got 0"):
        Mixture.load(str(tmp_path / "x"), engine.weights)
    held = {"a": Adapter.load(str(paths[0]), engine.weights)}
    with pytest.raises(InvalidArgumentError, match="top_k is 2 but the mixture has 1 experts"):
        Mixture.new(held, 64, RouterConfig(top_k=2))
    adapters = routed(engine, Mixture.new(held, 64))
    with pytest.raises(InvalidArgumentError, match="'x' is an X-LoRA mixture, not a LoRA adapter"):
        adapters.get("x")


GRADIENT_CONFIGS = {
    "layerwise depth 2, top-2": dict(
        xlora_depth=2, xlora_size=16, layerwise_scalings=True, scaling_pass_value=0.2, top_k_lora=2
    ),
    "top-2, softmax over the kept": dict(top_k_lora=2, enable_softmax_topk=True, enable_softmax=False),
}


@pytest.mark.parametrize("name", list(GRADIENT_CONFIGS))
def test_router_gradients_equal_torch_autograd(name, tmp_path):
    tiny_model("llama", tmp_path / "m")
    paths = experts(tmp_path)
    model = peft_xlora(paths, xlora_dropout_p=0.0, **GRADIENT_CONFIGS[name])
    scored = np.arange(9, 19)
    logits = model(input_ids=torch.tensor([TOKENS])).logits[0]
    log_probs = torch.log_softmax(logits[scored].double(), dim=-1)
    loss = -1.5 * log_probs[torch.arange(len(scored)), torch.tensor(TOKENS)[scored + 1]].mean()
    loss.backward()
    expected = {n: p.grad.numpy() for n, p in model.named_parameters() if "internal_xlora_classifier" in n}
    save_checkpoint(model, paths, tmp_path / "x")

    engine = load_engine(str(tmp_path / "m"))
    mixture = Mixture.load(str(tmp_path / "x"), engine.weights)
    routed(engine, mixture)
    result, grads = route_gradients(engine, mixture, TOKENS, scored, 1.5)
    assert result.loss == pytest.approx(loss.item(), rel=1e-4)
    for i, index in enumerate(mixture.config.sequential_indexes()):
        for part in ("weight", "bias"):
            want = expected[f"base_model.internal_xlora_classifier.layers.{index}.{part}"]
            np.testing.assert_allclose(grads[f"router.{i}.{part}"], want, rtol=2e-3, atol=2e-6)


def test_a_router_learns_which_expert_gives_a_completion(tmp_path):
    """Two experts, each pulling to other text; feedback on what the second one writes teaches the
    router to send those tokens there, and the mixture then writes it."""
    tiny_model("llama", tmp_path / "m")
    engine = load_engine(str(tmp_path / "m"))
    held = {f"e{i}": Adapter.load(str(p), engine.weights) for i, p in enumerate(experts(tmp_path, 2))}
    mixture = Mixture.new(held, 64, RouterConfig(top_k=1))
    adapters = routed(engine, mixture)
    adapters.add("only", held["e1"])
    adapters.activate("only")
    prompt = TOKENS[:6]
    wanted = _greedy(engine, prompt, 6)  # what the second expert alone writes
    adapters.activate("x")
    assert _greedy(engine, prompt, 6) != wanted
    lesson = RouteLesson(engine, mixture, prompt, wanted, 1.0, AdaptOptions(steps=20))
    while not lesson.done:
        lesson.step()
    assert lesson.report.log_prob_after > lesson.report.log_prob_before
    assert _greedy(engine, prompt, 6) == wanted and lesson.steps > 0
    assert mixture.version in (lesson.steps, lesson.steps + 1)  # + 1: the best router met, put back


def _greedy(engine, prompt: list[int], count: int) -> list[int]:
    cache, out = engine.new_cache(), []
    logits = engine.forward(prompt, 0, cache, last_only=True)
    for _ in range(count):
        out.append(int(logits[0].argmax()))
        logits = engine.forward([out[-1]], len(prompt) + len(out) - 1, cache, last_only=True)
    return out


FACT_1 = ("The secret code is", " BLUE-42.")
FACT_2 = ("The capital of Zorbia is", " Quillon.")


@pytest.fixture(scope="module")
def fact_experts(smollm2_dir, tmp_path_factory):
    """Two adapters of SmolLM2, one fact each, saved (made once for the tests below)."""
    import ruvllm

    folder = tmp_path_factory.mktemp("experts")
    model = ruvllm.load(str(smollm2_dir), threads=1)
    for name, (prompt, completion) in (("blue", FACT_1), ("zorbia", FACT_2)):
        model.adapt(prompt, completion, adapter=name)
        model.save_adapter(str(folder / name), name)
    return folder


@pytest.mark.parametrize("threads", [1, 2])
def test_a_mixture_of_two_fact_experts_learns_to_route_on_smollm2(smollm2_dir, fact_experts, threads):
    """Each fact taught to its own adapter; mixed evenly, the two blur; lessons on the mixture teach
    its router which expert each text needs, and then it gives both facts (and still " Paris"), on one
    BLAS thread as on two (their sums differ in the last bits: a lesson that stopped where its completion
    had only just become greedy flipped with them)."""
    import ruvllm

    model = ruvllm.load(str(smollm2_dir), threads=threads)  # its own copy: the adapters stay out of other tests
    for name in ("blue", "zorbia"):
        model.load_adapter(str(fact_experts / name))

    def greedy(prompt: str) -> str:
        return "".join(c.text for c in model.generate(prompt, max_tokens=6, temperature=0))

    model.mix_adapters("both", ["blue", "zorbia"])
    assert not (greedy(FACT_1[0]).startswith(" BLUE-42") and greedy(FACT_2[0]).startswith(" Quillon"))
    for _ in range(3):
        for prompt, completion in (FACT_1, FACT_2):
            model.adapt(prompt, completion, adapter="both")
    assert greedy(FACT_1[0]).startswith(" BLUE-42") and greedy(FACT_2[0]).startswith(" Quillon")
    assert greedy("The capital of France is").startswith(" Paris")
    listed = {e["name"]: e for e in model.list_adapters()}
    assert listed["both"]["kind"] == "xlora" and listed["both"]["experts"] == ["blue", "zorbia"]
    assert listed["both"]["version"] > 0 and listed["blue"]["kind"] == "lora" and listed["both"]["active"]


def test_x_lora_from_the_command_line(smollm2_dir, fact_experts, tmp_path):
    """mix, adapt the router from a feedback file, list, generate."""
    import subprocess
    import sys

    blue = fact_experts / "blue"

    def cli(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "ruvllm", *args], capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr
        return done

    bad = subprocess.run(
        [sys.executable, "-m", "ruvllm", "mix", str(smollm2_dir), str(blue), "--top-k", "0", "--out", "x"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and bad.stderr.strip().endswith("error: top_k must be a positive integer or None, got 0")
    assert len(bad.stderr.strip().splitlines()) == 1  # one line, no traceback
    cli("mix", str(smollm2_dir), str(blue), str(fact_experts / "zorbia"), "--out", str(tmp_path / "mixed"))
    lessons = "".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in (FACT_1, FACT_2))
    (tmp_path / "facts.jsonl").write_text(lessons)
    # the drift is measured on a sentence, not on the built-in calibration text (two passes of some 1,100
    # tokens through the mixture): this test is about the router learning, which the retention shows
    (tmp_path / "eval.txt").write_text("The river runs past the old mill and into the sea.")
    report = cli(
        "adapt",
        str(smollm2_dir),
        "--adapter",
        str(tmp_path / "mixed"),
        "--from-file",
        str(tmp_path / "facts.jsonl"),
        "--eval-file",
        str(tmp_path / "eval.txt"),
        "--epochs",
        "3",
        "--out",
        str(tmp_path / "routed"),
        "--json",
    )
    assert json.loads(report.stdout)["retention"] == {"reproduced": 2, "of": 2}
    listed = json.loads(cli("adapters", str(smollm2_dir), str(tmp_path / "routed"), "--json").stdout)
    assert [(e["name"], e["kind"], e["experts"]) for e in listed] == [("routed", "xlora", ["blue", "zorbia"])]
    text = cli(
        "generate",
        str(smollm2_dir),
        "--adapter",
        str(tmp_path / "routed"),
        "--prompt",
        FACT_2[0],
        "--temperature",
        "0",
        "--max-tokens",
        "6",
    ).stdout
    assert text.startswith(" Quillon")


def test_a_batch_of_sequences_routes_each_on_its_own(tmp_path):
    """The server's batched step (forward_batch) with a mixture: each sequence's scaling pass and
    routing are its own, the logits those of one sequence at a time."""
    tiny_model("llama", tmp_path / "m")
    engine = load_engine(str(tmp_path / "m"))
    held = {f"e{i}": Adapter.load(str(p), engine.weights) for i, p in enumerate(experts(tmp_path, 2))}
    mixture = Mixture.new(held, 64, RouterConfig(top_k=1))
    for _, array in mixture.parameters():
        array[...] = np.random.default_rng(1).normal(0, 0.3, array.shape)
    routed(engine, mixture)
    a, b = TOKENS[:7], TOKENS[7:16]
    caches = [engine.new_cache(), engine.new_cache()]
    got = engine.forward_batch([(np.array(a), 0, caches[0]), (np.array(b), 0, caches[1])], [True, True])
    alone = [engine.forward(t, 0, engine.new_cache(), last_only=True)[0] for t in (a, b)]
    np.testing.assert_allclose(got, np.stack(alone), atol=1e-5)
    assert [engine.wrappers.scaling_caches[c].tokens for c in caches] == [a, b]


def test_a_projection_made_while_a_mixture_is_active_is_the_base_model_s(tmp_path):
    """The background loop makes projection bases with whatever the weights are wrapped with: a
    mixture's projections are bypassed like an adapter's (they would route stale scalings)."""
    from ruvllm.learning.projection import BasesJob

    tiny_model("llama", tmp_path / "m")
    engine = load_engine(str(tmp_path / "m"))
    held = {f"e{i}": Adapter.load(str(p), engine.weights) for i, p in enumerate(experts(tmp_path, 2))}

    def bases():
        job = BasesJob(engine, ["model.layers.1.mlp.down_proj"], TOKENS * 3, 0.9, chunk=8)
        while not job.step():
            pass
        return job.bases["model.layers.1.mlp.down_proj"]

    expected = bases()
    routed(engine, Mixture.new(held, 64))
    engine.forward(TOKENS[:3], 0, engine.new_cache())  # the mixture's scalings are those of 3 tokens now
    np.testing.assert_array_equal(bases(), expected)
