"""The converter: HF folders and GGUF files in, ruvllm folders out, checked against transformers.

The GGUF tests write small GGUF files the way llama.cpp's converter does (Q/K rows permuted for
ggml's RoPE, shapes in ggml order, a mix of quantization types, SmolLM2's vocabulary), then compare
our converted model with transformers' own reading of the same file.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import gguf
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM, AutoTokenizer

from ruvllm.convert import convert
from ruvllm.errors import InvalidArgumentError, LoadError
from ruvllm.runtime.assembly import load_engine, open_store
from ruvllm.text.tokenizer import Tokenizer

from conftest import tiny_model

pytestmark = pytest.mark.parity

TOLERANCE = 1e-4
IDS = np.random.default_rng(3).integers(0, 128, 24)


def logits_of(folder, ids=IDS) -> np.ndarray:
    engine = load_engine(str(folder))
    return engine.forward(ids, 0, engine.new_cache())


def reference_logits(model, ids=IDS) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids[None])).logits[0].numpy()


def dequantized_reference(model, folder):
    """The HF model with every weight replaced by what our converted folder stores, dequantized."""
    store = open_store(str(folder))
    state = {name: torch.from_numpy(store.load_f32(name)) for name in store.names()}
    model.load_state_dict(state, strict=False)
    return model


# --- Hugging Face folders


@pytest.mark.parametrize("weights", [None, "f32", "f16", "q8", "q4_0", "q4_1"])
def test_hf_folder_converts_to_every_format(weights, tmp_path):
    model = tiny_model("qwen2", tmp_path / "hf", tie_word_embeddings=True)
    lines = []
    convert(str(tmp_path / "hf"), str(tmp_path / "out"), weights, lines.append)
    formats = {t.name: t.format for t in open_store(str(tmp_path / "out")).tensors.values()}
    assert formats["model.layers.0.mlp.up_proj.weight"] == (weights or "f32")
    assert formats["model.norm.weight"] == "f32" and formats["model.layers.1.self_attn.q_proj.bias"] == "f32"
    got = logits_of(tmp_path / "out")
    if weights in (None, "f32"):
        assert np.abs(got - reference_logits(model)).max() <= TOLERANCE
    else:
        assert any("max |error|" in line for line in lines)
        assert np.abs(got - reference_logits(dequantized_reference(model, tmp_path / "out"))).max() <= TOLERANCE


def test_hf_bf16_checkpoint(tmp_path):
    def rounded_model():
        model = tiny_model("llama", None)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        return model

    rounded_model().to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    reference = rounded_model()  # the same bf16 values in f32, its RoPE buffers untouched by the cast
    convert(str(tmp_path / "hf"), str(tmp_path / "out"), None)
    formats = {t.name: t.format for t in open_store(str(tmp_path / "out")).tensors.values()}
    assert formats["model.layers.0.self_attn.q_proj.weight"] == "bf16"
    assert np.abs(logits_of(tmp_path / "out") - reference_logits(reference)).max() <= TOLERANCE


def test_bad_sources_are_refused(tmp_path):
    with pytest.raises(LoadError, match="no such file or folder"):
        convert(str(tmp_path / "missing"), str(tmp_path / "out"))
    (tmp_path / "weird.bin").write_bytes(b"1234")
    with pytest.raises(LoadError, match=r"expected a Hugging Face model folder or a \.gguf file"):
        convert(str(tmp_path / "weird.bin"), str(tmp_path / "out"))
    with pytest.raises(InvalidArgumentError, match="--weights must be one of f32, f16, q8, q4_0, q4_1, got 'q2'"):
        convert(str(tmp_path), str(tmp_path / "out"), "q2")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(
        LoadError,
        match="unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM, MistralForCausalLM, "
        "Qwen2ForCausalLM",
    ):
        convert(str(tmp_path / "gpt2"), str(tmp_path / "out"))
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + bytes(10))
    with pytest.raises(LoadError, match=r"broken\.gguf: 14 bytes is too short for a GGUF file"):
        convert(str(tmp_path / "broken.gguf"), str(tmp_path / "out"))


# --- GGUF files


@pytest.fixture(scope="module")
def smol_vocab(smollm2_gguf):
    reader = gguf.GGUFReader(str(smollm2_gguf))
    field = lambda name: reader.fields[f"tokenizer.ggml.{name}"].contents()  # noqa: E731
    return {"tokens": field("tokens"), "types": field("token_type"), "merges": field("merges")}


LLAMA_TYPES = {
    "token_embd": Q.Q8_0,
    "attn_q": Q.Q4_0,
    "attn_k": Q.Q4_1,
    "attn_v": Q.Q8_0,
    "attn_output": Q.F16,
    "ffn_gate": Q.Q4_1,
    "ffn_up": Q.Q4_0,
    "ffn_down": Q.Q5_0,  # not one of ours: dequantized, then stored as --weights says
    "output": Q.Q8_0,
}

GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def ggml_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Wq/Wk rows of `llama` models."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, arch: str, vocab: dict, pre: str = "smollm") -> None:
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )

    for name, tensor in model.state_dict().items():
        w = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            key, kind = "token_embd.weight", "token_embd"
        elif name == "lm_head.weight":
            key, kind = "output.weight", "output"
        elif name == "model.norm.weight":
            key, kind = "output_norm.weight", None
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            module, leaf = rest.rsplit(".", 1)
            kind = GGUF_NAMES[module]
            key = f"blk.{layer}.{kind}.{leaf}"
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            w = ggml_permute(w, cfg.num_attention_heads if kind == "attn_q" else cfg.num_key_value_heads)
        qtype = LLAMA_TYPES.get(kind, Q.F32) if w.ndim == 2 else Q.F32
        writer.add_tensor(key, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch, kind", [("llama", "llama"), ("qwen2", "qwen2")])
def test_gguf_matches_transformers_reading_the_same_file(arch, kind, tmp_path, smol_vocab):
    model = tiny_model(kind, None, vocab_size=len(smol_vocab["tokens"]), num_key_value_heads=2)
    write_gguf(tmp_path / "tiny.gguf", model, arch, smol_vocab)
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32).eval()

    lines = []
    convert(str(tmp_path / "tiny.gguf"), str(tmp_path / "out"), "f32", lines.append)
    store = open_store(str(tmp_path / "out"))
    formats = {t.name: t.format for t in store.tensors.values()}
    assert formats["model.embed_tokens.weight"] == "q8" and formats["lm_head.weight"] == "q8"
    assert formats["model.layers.0.self_attn.q_proj.weight"] == "q4_0"
    assert formats["model.layers.0.self_attn.k_proj.weight"] == "q4_1"
    assert formats["model.layers.0.mlp.down_proj.weight"] == "f32"  # Q5_0 dequantized
    for name, tensor in reference.state_dict().items():  # un-permuted and dequantized exactly alike
        np.testing.assert_array_equal(store.load_f32(name), tensor.numpy(), err_msg=name)
    ids = np.random.default_rng(4).integers(0, 49152, 24)
    assert np.abs(logits_of(tmp_path / "out", ids) - reference_logits(reference, ids)).max() <= TOLERANCE


def test_gguf_keeps_lossless_types_and_quantizes_the_rest(tmp_path, smol_vocab):
    model = tiny_model("llama", None, vocab_size=len(smol_vocab["tokens"]))
    write_gguf(tmp_path / "tiny.gguf", model, "llama", smol_vocab)
    lines = []
    convert(str(tmp_path / "tiny.gguf"), str(tmp_path / "out"), "q4_1", lines.append)
    formats = {t.name: t.format for t in open_store(str(tmp_path / "out")).tensors.values()}
    assert formats["model.embed_tokens.weight"] == "q8"  # Q8_0 stays q8 even with --weights q4_1
    assert formats["model.layers.0.self_attn.q_proj.weight"] == "q4_0"
    assert formats["model.layers.0.mlp.down_proj.weight"] == "q4_1"  # Q5_0 requantized
    assert formats["model.layers.0.self_attn.o_proj.weight"] == "q4_1"  # F16 quantized
    report = "\n".join(lines)
    assert "model.embed_tokens.weight" in report and "(copied from GGUF Q8_0, lossless)" in report
    assert any(
        "mlp.down_proj.weight" in line and "q4_1 max |error|" in line and "from GGUF Q5_0" in line for line in lines
    )
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["num_key_value_heads"] == 2


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt2"])
def test_gguf_pre_tokenizers_match_transformers(pre, tmp_path, smol_vocab):
    """For pre-tokenizer types transformers knows, our tokenizer.json must agree with it."""
    model = tiny_model("llama", None, vocab_size=len(smol_vocab["tokens"]), num_hidden_layers=1)
    write_gguf(tmp_path / "tiny.gguf", model, "llama", smol_vocab, pre=pre)
    convert(str(tmp_path / "tiny.gguf"), str(tmp_path / "out"), "f32")
    ours = Tokenizer.from_folder(str(tmp_path / "out"))
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
    for text in ["Hello world 12345 and 3.14!", "  spaces\n\n\tand tabs  ", "I'M HERE, you'll see", "日本語 ٣٤ ½"]:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False), text


def test_unknown_pre_tokenizer_is_refused(tmp_path, smol_vocab):
    model = tiny_model("llama", None, vocab_size=len(smol_vocab["tokens"]), num_hidden_layers=1)
    write_gguf(tmp_path / "tiny.gguf", model, "llama", smol_vocab, pre="chameleon")
    with pytest.raises(LoadError, match=r"tokenizer\.ggml\.pre 'chameleon' is not supported; supported: default"):
        convert(str(tmp_path / "tiny.gguf"), str(tmp_path / "out"))
