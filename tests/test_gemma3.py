"""Gemma 3 270M, loaded straight from its Q4_K_M GGUF, against transformers reading the same GGUF.

transformers (with accelerate) dequantizes every tensor to float32 and runs Gemma3ForCausalLM; we keep
the tensors' exact values as integer codes (Q5_0, Q8_0, Q6_K as int8, Q4_K as packed int4) or expand them
to float32. Both compute the same function of the same weights, so the greedy ids must agree over 32
tokens, for raw text and for chat (the built-in Gemma turn format: this GGUF carries no template).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import ruvllm

pytestmark = pytest.mark.parity

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
CHATS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
]
TOKENS = 32


@pytest.fixture(scope="module")
def reference(gemma_gguf, gemma_transformers_tokenizer):
    from transformers import AutoModelForCausalLM

    folder, name = str(gemma_gguf.parent), gemma_gguf.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, gemma_transformers_tokenizer


@pytest.fixture(scope="module", params=["q4", "f32"])
def ours(request, gemma_gguf):
    return ruvllm.load(str(gemma_gguf), compute=request.param, context_length=512)


def reference_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False, eos_token_id=[1, 106])
    return out[0, len(ids) :].tolist()


def our_greedy(model, ids: list[int]) -> list[int]:
    return [c.token_id for c in model.generate(ids, max_tokens=TOKENS, temperature=0) if c.token_id is not None]


def test_config_from_the_gguf(ours):
    c = ours.config
    assert (c.architecture, c.hidden_size, c.num_hidden_layers, c.head_dim, c.vocab_size) == (
        "Gemma3ForCausalLM",
        640,
        18,
        256,
        262144,
    )
    assert c.sliding_windows == tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))
    assert (c.rope_theta, c.local_rope_theta, c.hidden_act) == (1e6, 10000.0, "gelu_pytorch_tanh")
    assert ours.eos_token_ids == (1, 106)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_raw_text_greedy_ids_equal_transformers(ours, reference, prompt):
    model, tokenizer = reference
    ids = ours.tokenizer.encode(prompt)
    assert ids == tokenizer.encode(prompt)  # <bos> first: this GGUF asks for it
    expected = reference_greedy(model, ids)
    assert len(expected) >= 8
    assert our_greedy(ours, ids) == expected


@pytest.mark.parametrize("index", range(len(CHATS)))
def test_chat_greedy_ids_equal_transformers(ours, reference, index):
    model, tokenizer = reference
    messages = CHATS[index]
    system = messages[0]["content"] + "\n\n" if messages[0]["role"] == "system" else ""
    text = f"<bos><start_of_turn>user\n{system}{messages[-1]['content']}<end_of_turn>\n<start_of_turn>model\n"
    ids = ours.tokenizer.encode_chat(messages)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert our_greedy(ours, ids) == reference_greedy(model, ids)


def test_prefill_logits_close_to_transformers(ours, reference):
    model, _ = reference
    ids = ours.tokenizer.encode(PROMPTS[2])
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    engine = ours.engine
    got = engine.forward(ids, 0, engine.new_cache())
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= 2e-4 * scale, np.abs(got - expected).max() / scale
