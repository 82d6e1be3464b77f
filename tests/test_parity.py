"""The NumPy transformer against Hugging Face transformers (torch, float32) on tiny seeded models.

Each variant: a prefill of 20 tokens, then 20 single-token decode steps on the KV cache. Every logit
must be within 1e-4 of transformers' full-sequence forward.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from ruvllm.runtime.assembly import load_engine

from conftest import tiny_model

pytestmark = pytest.mark.parity

PREFILL, DECODE = 20, 20
TOLERANCE = 1e-4

VARIANTS = {
    "llama untied, MHA": ("llama", dict(num_key_value_heads=4)),
    "llama tied, GQA": ("llama", dict(tie_word_embeddings=True)),
    "llama MQA": ("llama", dict(num_key_value_heads=1)),
    "llama3 rope scaling": (
        "llama",
        dict(
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            ),
        ),
    ),
    "llama linear rope scaling": ("llama", dict(rope_scaling=dict(rope_type="linear", factor=4.0))),
    "llama with attention and mlp biases": ("llama", dict(attention_bias=True, mlp_bias=True)),
    "qwen2 with q/k/v biases": ("qwen2", dict()),
    "qwen2 sliding window on upper layers": (
        "qwen2",
        dict(use_sliding_window=True, sliding_window=6, max_window_layers=1),
    ),
    "mistral sliding window < sequence": ("mistral", dict(sliding_window=7)),
    "qwen3 q/k norms": ("qwen3", dict()),
    "qwen3 tied, MQA": ("qwen3", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    "phi3 fused qkv and gate/up": ("phi3", dict()),
    "phi3 fused, GQA, sliding window": ("phi3", dict(num_key_value_heads=2, sliding_window=9)),
    # Gemma 3: GeGLU, q/k norms, sandwich norms, sqrt(D) embeddings, query_pre_attn_scalar, five
    # sliding-window layers (own RoPE base) then a global one with linear RoPE scaling.
    "gemma3 sliding + global layers": (
        "gemma3",
        dict(
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
            }
        ),
    ),
    "gemma3 MHA, untied": ("gemma3", dict(num_key_value_heads=4, tie_word_embeddings=False)),
}


def our_logits(folder, ids: np.ndarray) -> np.ndarray:
    engine = load_engine(str(folder))
    cache = engine.new_cache()
    out = [engine.forward(ids[:PREFILL], 0, cache)]
    for position in range(PREFILL, len(ids)):
        out.append(engine.forward(ids[position : position + 1], position, cache))
    return np.concatenate(out)  # (PREFILL + DECODE, V)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(variant, tmp_path):
    kind, overrides = VARIANTS[variant]
    model = tiny_model(kind, tmp_path, **overrides)
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, PREFILL + DECODE)
    with torch.no_grad():
        reference = model(torch.tensor(ids[None])).logits[0].numpy()
    got = our_logits(tmp_path, ids)
    assert got.shape == reference.shape
    assert np.abs(got - reference).max() <= TOLERANCE
    # The logits are not trivially small: a broken model could not pass by accident.
    assert np.abs(reference).max() > 0.5


def test_sliding_window_changes_the_result(tmp_path):
    """Guard against a parity test that passes because the window never mattered."""
    windowed = tiny_model("mistral", tmp_path / "w", sliding_window=7)
    full = tiny_model("mistral", tmp_path / "f", sliding_window=None)
    ids = np.random.default_rng(1).integers(0, 128, PREFILL + DECODE)
    with torch.no_grad():
        a = windowed(torch.tensor(ids[None])).logits[0].numpy()
        b = full(torch.tensor(ids[None])).logits[0].numpy()
    assert np.abs(a[:7] - b[:7]).max() <= TOLERANCE  # identical inside the first window
    assert np.abs(a[10:] - b[10:]).max() > 1e-2  # different once tokens fall out of it
    assert np.abs(our_logits(tmp_path / "w", ids) - a).max() <= TOLERANCE
