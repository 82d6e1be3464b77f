"""Tiny GGUF files of every family we run, loaded straight from the file, against transformers reading the
same file (it dequantizes every tensor to float32; we keep the exact values as integer codes).

The files are written the way llama.cpp lays them out (names, fused Phi-3 projections, Gemma's 1 + w
norms), with random blocks of every GGUF type we decode, so each type goes through a real load.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import gguf
import torch
from transformers import AutoModelForCausalLM

from ruvllm.errors import LoadError
from ruvllm.files.ggml import GGML_TYPE_NAMES
from ruvllm.runtime.assembly import load_engine
from test_ggml_blocks import F16_FIELDS, GRID_F16_FIELDS  # where each block type keeps its f16 scales

pytestmark = pytest.mark.parity

D, F, LAYERS = 256, 512, 2  # K-quants need rows of 256
# Heads (query, key/value) of size D / query heads: 128, which transformers takes for Qwen3 from its
# config default, not from the file; 256 for Gemma 3, whose query scale transformers fixes at 256^-1/2
# where llama.cpp (and we) take head_dim^-1/2: equal for every released Gemma 3 but the 27B.
HEADS = {"gemma3": (1, 1)}
TYPES = list(F16_FIELDS)  # kept as exact integer codes
GRID_TYPES = [name for name, fields in GRID_F16_FIELDS.items() if fields]  # float32 only (IQ1_M: no f16 scale)


def random_blocks(type_name: str, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    t = GGML_TYPE_NAMES[type_name]
    raw = rng.integers(0, 256, (rows, t.row_bytes(columns)), dtype=np.uint8)
    blocks = raw.reshape(-1, t.type_size)
    for at in {**F16_FIELDS, **GRID_F16_FIELDS}[type_name]:
        scale = rng.uniform(0.002, 0.02, (len(blocks), 1)).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8)
    return raw


def write_tiny_gguf(path, arch: str, vocab: dict, seed: int = 0, types: list[str] = TYPES) -> None:
    """A 2-layer model of `arch`; its matrices cycle through `types` (default: every type with a code form)."""
    rng = np.random.default_rng(seed)
    H, K = HEADS.get(arch, (2, 1))
    E = D // H
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(F)
    writer.add_head_count(H)
    writer.add_head_count_kv(K)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(E)
    if arch == "gemma3":
        writer.add_key_length(E)
        writer.add_value_length(E)
        writer.add_sliding_window(8)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    V = len(vocab["tokens"])
    kinds = iter(types * 16)

    def matrix(name: str, rows: int, columns: int) -> None:
        kind = next(kinds)
        writer.add_tensor(name, random_blocks(kind, rows, columns, rng), raw_dtype=gguf.GGMLQuantizationType[kind])

    def norm(name: str, size: int) -> None:
        w = rng.uniform(0.5, 1.5, size).astype(np.float32)  # Gemma's files store 1 + w: the same range
        writer.add_tensor(name, w)

    matrix("token_embd.weight", V, D)
    norm("output_norm.weight", D)
    for i in range(LAYERS):
        p = f"blk.{i}"
        norm(f"{p}.attn_norm.weight", D)
        norm(f"{p}.ffn_norm.weight", D)
        if arch == "phi3":
            matrix(f"{p}.attn_qkv.weight", (H + 2 * K) * E, D)
            matrix(f"{p}.ffn_up.weight", 2 * F, D)
        else:
            matrix(f"{p}.attn_q.weight", H * E, D)
            matrix(f"{p}.attn_k.weight", K * E, D)
            matrix(f"{p}.attn_v.weight", K * E, D)
            if arch == "qwen2":  # Qwen2 always has q/k/v biases
                for name, size in (("attn_q", H * E), ("attn_k", K * E), ("attn_v", K * E)):
                    writer.add_tensor(f"{p}.{name}.bias", rng.normal(0, 0.1, size).astype(np.float32))
            matrix(f"{p}.ffn_gate.weight", F, D)
            matrix(f"{p}.ffn_up.weight", F, D)
        matrix(f"{p}.attn_output.weight", D, H * E)
        matrix(f"{p}.ffn_down.weight", D, F)
        if arch in ("qwen3", "gemma3"):
            norm(f"{p}.attn_q_norm.weight", E)
            norm(f"{p}.attn_k_norm.weight", E)
        if arch == "gemma3":
            norm(f"{p}.post_attention_norm.weight", D)
            norm(f"{p}.post_ffw_norm.weight", D)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def smol_vocab(smollm2_gguf):
    reader = gguf.GGUFReader(str(smollm2_gguf))
    field = lambda name: reader.fields[f"tokenizer.ggml.{name}"].contents()  # noqa: E731
    return {"tokens": field("tokens"), "types": field("token_type"), "merges": field("merges")}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3", "gemma3"])
@pytest.mark.parametrize("compute", ["q4", "f32"])
def test_a_tiny_gguf_computes_what_transformers_computes(arch, compute, tmp_path, smol_vocab):
    write_tiny_gguf(tmp_path / "tiny.gguf", arch, smol_vocab)
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32).eval()
    ids = np.random.default_rng(4).integers(0, len(smol_vocab["tokens"]), 24)
    with torch.no_grad():
        expected = reference(torch.tensor(ids[None])).logits[0].numpy()

    engine = load_engine(str(tmp_path / "tiny.gguf"), compute=compute)
    cache = engine.new_cache()
    got = np.concatenate(
        [engine.forward(ids[:16], 0, cache), *(engine.forward(ids[i : i + 1], i, cache) for i in range(16, 24))]
    )
    scale = np.abs(expected).max()
    assert scale > 0.5
    assert np.abs(got - expected).max() <= 2e-4 * scale


def test_every_decoded_type_went_through_the_load(tmp_path, smol_vocab):
    write_tiny_gguf(tmp_path / "tiny.gguf", "llama", smol_vocab)
    engine = load_engine(str(tmp_path / "tiny.gguf"), compute="q4")
    forms = {(type(m).__name__, m.group) for m in engine.weights.matrices()}
    assert forms == {("Int4Matrix", 32), ("Int8Matrix", 32), ("Int8Matrix", 16)}
    types = {t.type.name for t in gguf_tensors(tmp_path / "tiny.gguf")}
    assert set(TYPES) <= types


def gguf_tensors(path):
    from ruvllm.files.gguf import GGUFFile

    return GGUFFile.from_path(str(path)).tensors.values()


def test_an_architecture_we_do_not_run_is_named(tmp_path, smol_vocab):
    write_tiny_gguf(tmp_path / "tiny.gguf", "llama", smol_vocab)
    data = (tmp_path / "tiny.gguf").read_bytes().replace(b"llama", b"bloom", 1)  # general.architecture
    (tmp_path / "bloom.gguf").write_bytes(data)
    with pytest.raises(LoadError, match=r"GGUF architecture 'bloom' is not supported; supported: llama, qwen2"):
        load_engine(str(tmp_path / "bloom.gguf"))


def test_a_type_we_cannot_decode_names_the_tensor_and_its_type(tmp_path, smol_vocab):
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(tmp_path / "iq.gguf"), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(F)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_token_list(smol_vocab["tokens"][:256])
    raw = rng.integers(0, 256, (256, GGML_TYPE_NAMES["TQ2_0"].row_bytes(D)), dtype=np.uint8)
    writer.add_tensor("token_embd.weight", raw, raw_dtype=gguf.GGMLQuantizationType.TQ2_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(LoadError, match=r"tensor 'token_embd\.weight' has GGUF type TQ2_0, which ruvllm cannot decode"):
        load_engine(str(tmp_path / "iq.gguf"))


def test_grid_i_quants_load_as_float_matrices(tmp_path, smol_vocab):
    """IQ2/IQ3/IQ1_S decode to float32 only: exact under f32 compute, quantized again under q4."""
    write_tiny_gguf(tmp_path / "iq.gguf", "llama", smol_vocab, types=GRID_TYPES)
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="iq.gguf", dtype=torch.float32).eval()
    ids = np.random.default_rng(4).integers(0, len(smol_vocab["tokens"]), 12)
    with torch.no_grad():
        expected = reference(torch.tensor(ids[None])).logits[0].numpy()
    engine = load_engine(str(tmp_path / "iq.gguf"), compute="f32")
    got = engine.forward(ids, 0, engine.new_cache())
    assert np.abs(got - expected).max() <= 2e-4 * np.abs(expected).max()
    quantized = load_engine(str(tmp_path / "iq.gguf"), compute="q4")
    assert {type(m).__name__ for m in quantized.weights.matrices()} == {"Int4Matrix"}  # requantized at load
