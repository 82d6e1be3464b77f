"""The real SmolLM2-135M-Instruct (Q4_1 GGUF, converted): greedy tokens equal transformers' on the
same dequantized weights (transformers reads the GGUF itself, so the converter is checked too)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from transformers import AutoModelForCausalLM

from ruvllm.runtime.assembly import open_store

pytestmark = pytest.mark.parity

NEW_TOKENS = 40
RAW_PROMPTS = ["Once upon a time", "The three primary colors are", "def fibonacci(n):\n"]
CHAT_PROMPTS = ["What is the capital of France?", "Write a short poem about the sea."]


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    hf = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    hf.generation_config.eos_token_id = None  # run the full length, as ignore_eos does
    hf.generation_config.pad_token_id = 2
    return hf.eval()


def reference_greedy(reference, prompt_ids: list[int]) -> list[int]:
    inputs = torch.tensor([prompt_ids])
    # An explicit mask: without one, generate() treats every pad id (2 = <|im_end|>, in chat prompts) as padding.
    with torch.no_grad():
        out = reference.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            top_p=None,
            top_k=None,
        )
    return out[0, len(prompt_ids) :].tolist()


def our_greedy(model, prompt_ids: list[int]) -> list[int]:
    return [c.token_id for c in model.generate(prompt_ids, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)]


def test_weights_equal_transformers_dequantization(model, reference):
    state = reference.state_dict()
    ours = model.engine.weights
    for name, got in [
        ("model.embed_tokens.weight", ours.embed_tokens.weight),
        ("model.layers.0.self_attn.q_proj.weight", ours.layers[0].self_attn.q_proj.matrix.weight),
        ("model.layers.7.self_attn.k_proj.weight", ours.layers[7].self_attn.k_proj.matrix.weight),
        ("model.layers.29.mlp.down_proj.weight", ours.layers[29].mlp.down_proj.matrix.weight),
        ("model.norm.weight", ours.norm),
    ]:
        np.testing.assert_array_equal(got, state[name].numpy(), err_msg=name)


def test_converted_storage_formats(smollm2_dir):
    formats = {t.name: t.format for t in open_store(str(smollm2_dir), header_only=True).tensors.values()}
    assert formats["model.embed_tokens.weight"] == "q8"  # GGUF Q8_0 kept lossless under --weights q4_1
    assert formats["model.layers.0.self_attn.q_proj.weight"] == "q4_1"
    assert formats["model.norm.weight"] == "f32"


@pytest.mark.parametrize("prompt", RAW_PROMPTS)
def test_greedy_raw_text_matches_transformers(model, reference, prompt):
    ids = model.tokenizer.encode(prompt)
    ours = our_greedy(model, ids)
    assert len(ours) == NEW_TOKENS
    assert ours == reference_greedy(reference, ids)


@pytest.mark.parametrize("prompt", CHAT_PROMPTS)
def test_greedy_chat_matches_transformers(model, reference, prompt):
    ids = model.tokenizer.encode_chat([{"role": "user", "content": prompt}])
    ours = our_greedy(model, ids)
    assert len(ours) == NEW_TOKENS
    assert ours == reference_greedy(reference, ids)


def test_chat_stops_at_im_end(model):
    chunks = list(model.chat([{"role": "user", "content": "What is the capital of France?"}], temperature=0))
    assert chunks[-1].finish_reason == "stop" and chunks[-1].token_id == 2  # <|im_end|>
    text = "".join(c.text for c in chunks)
    assert "Paris" in text and "<|im_end|>" not in text


def test_two_identical_calls_are_independent(model):
    def run() -> list[int]:
        return [c.token_id for c in model.generate("The weather today", max_tokens=24, temperature=0)]

    first = run()
    model.generate("Something unrelated to fill the cache with other tokens", max_tokens=8, temperature=0)
    list(model.chat([{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0.9, seed=3))
    assert run() == first


def test_seeded_sampling_reproduces_and_seeds_differ(model):
    def run(seed: int) -> list[int]:
        options = dict(max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, ignore_eos=True)
        return [c.token_id for c in model.generate("My favourite animal is", **options)]

    assert run(7) == run(7)
    assert run(7) != run(8)
