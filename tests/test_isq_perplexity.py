"""Runtime quantization (round-to-nearest and activation-aware) and the perplexity measure."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import ruvllm
import ruvllm.runtime.isq as isq
from ruvllm.errors import InvalidArgumentError
from ruvllm.model.weights import ComputeOptions
from ruvllm.runtime.assembly import load_engine
from ruvllm.runtime.engine import Engine
from ruvllm.tools.perplexity import perplexity

from conftest import tiny_model

pytestmark = pytest.mark.parity

CALIBRATION = list(np.random.default_rng(7).integers(0, 128, 200))


@pytest.mark.parametrize("heads", [4, 2])  # multi-head (o_proj scaled through v_proj) and grouped
@pytest.mark.parametrize("bias", [False, True])  # with biases on v_proj and up_proj, scaled with their rows
def test_activation_aware_scaling_alone_does_not_change_the_model(tmp_path, heads, bias, monkeypatch):
    """With rounding switched off, the scales and their folding into norms and rows cancel exactly."""
    tiny_model("llama", tmp_path, num_key_value_heads=heads, attention_bias=bias, mlp_bias=bias)
    dense = load_engine(str(tmp_path), compute="f32")
    ids = np.random.default_rng(1).integers(0, 128, 40)
    reference = dense.forward(ids, 0, dense.new_cache())

    monkeypatch.setattr(isq, "prepare_matrix", lambda fmt, parts, shape, options: isq.DenseMatrix(parts[""]))
    monkeypatch.setattr(isq, "_round", lambda w, fmt: np.round(w * 8) / 8)  # a coarse grid, so scales matter
    scaled = load_engine(str(tmp_path), compute="f32")
    weights, report = isq.quantize_activation_aware(
        scaled.weights, scaled.config, ComputeOptions(form="q4"), CALIBRATION
    )
    scaled = Engine(scaled.config, weights)
    assert {r["group"] for r in report} == (
        {"down", "gate_up", "qkv", "o"} if heads == 4 else {"down", "gate_up", "qkv"}
    )
    assert any(r["alpha"] > 0 for r in report)
    np.testing.assert_allclose(scaled.forward(ids, 0, scaled.new_cache()), reference, atol=2e-4)


def test_activation_aware_quantization_lowers_the_error_it_measures(tmp_path):
    tiny_model("llama", tmp_path)
    engine = load_engine(str(tmp_path), compute="q4", isq="awq", calibration_ids=CALIBRATION, isq_format="q4_0")
    assert all(0 < r["error_vs_rtn"] <= 1.0 for r in engine.isq_report)
    assert min(r["error_vs_rtn"] for r in engine.isq_report) < 0.95
    assert type(engine.weights.layers[0].mlp.up_proj.matrix).__name__ == "Int4Matrix"


def test_activation_aware_needs_a_float_model(smollm2_dir):
    with pytest.raises(
        InvalidArgumentError, match="isq='awq' quantizes float models; this one is already stored as q4_1, q8"
    ):
        load_engine(str(smollm2_dir), compute="q4", isq="awq", calibration_ids=[1, 2, 3])


def test_perplexity_equals_transformers_loss(tmp_path):
    model = tiny_model("qwen2", tmp_path)
    ids = np.random.default_rng(3).integers(0, 128, 90)
    with torch.no_grad():
        loss = model(torch.tensor(ids[None]), labels=torch.tensor(ids[None])).loss.item()
    result = perplexity(load_engine(str(tmp_path)), list(ids), window=100, chunk=16)
    assert result.tokens == 89 and result.windows == 1
    assert result.nll == pytest.approx(loss, rel=1e-5)
    assert result.perplexity == pytest.approx(np.exp(loss), rel=1e-5)
    split = perplexity(load_engine(str(tmp_path)), list(ids), window=30)
    assert split.windows == 3 and split.tokens == 89


def test_perplexity_command(smollm2_dir, smollm2, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    args = [sys.executable, "-m", "ruvllm", "perplexity", str(smollm2_dir), "--text-file", str(text), "--json"]
    plain = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    assert plain["tokens"] == len(smollm2.tokenizer.encode(text.read_text())) - 1
    assert plain["compute"] == "f32" and 1 < plain["perplexity"] < 50
    cold = json.loads(
        subprocess.run(
            [*args, "--hot-tokens", "16", "--cold", "int8"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert cold["kv"] == {"hot_tokens": 16, "cold": "int8"}
    assert cold["perplexity"] == pytest.approx(plain["perplexity"], rel=0.01)
    missing = subprocess.run([*args[:-3], "--text-file", str(tmp_path / "none.txt")], capture_output=True, text=True)
    assert missing.returncode == 1 and "cannot read" in missing.stderr and "none.txt" in missing.stderr


def test_commands_quantize_with_the_chosen_4bit_format(smollm2_dir, tmp_path):
    """--isq-format reaches the load of generate (and of every command: they share one loader)."""
    tiny_model("llama", tmp_path, vocab_size=49152)  # SmolLM2's vocabulary, so its tokenizer fits
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_dir / name, tmp_path / name)
    args = [sys.executable, "-m", "ruvllm", "generate", str(tmp_path), "--prompt", "The quick brown fox"]
    args += ["--temperature", "0", "--max-tokens", "24", "--ignore-eos", "--json", "--compute", "q4"]
    expected = {}
    for fmt in ("q4_0", "q4_1"):
        model = ruvllm.load(str(tmp_path), compute="q4", isq_format=fmt)
        expected[fmt] = [
            c.token_id for c in model.generate("The quick brown fox", max_tokens=24, temperature=0, ignore_eos=True)
        ]
    assert expected["q4_0"] != expected["q4_1"]  # the two formats are told apart
    for fmt in ("q4_0", "q4_1"):
        out = subprocess.run([*args, "--isq-format", fmt], capture_output=True, text=True, check=True)
        assert json.loads(out.stdout)["token_ids"] == expected[fmt]
