"""Shared fixtures: the demo model (built on demand), its GGUF, and tiny seeded HF reference models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "models" / "smollm2-135m-instruct"
GGUF_PATH = ROOT / "build" / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_GGUF = ROOT / "build" / "downloads" / "gemma-3-270m-q4_k_m.gguf"
MODEL_FIXTURES = {"smollm2_dir", "smollm2_gguf", "smollm2", "gemma_gguf"}  # the demo models (a download)
NOT_UNIT = ("parity", "model", "e2e", "pyodide")  # the markers of pyproject.toml other than `unit`


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`model` on every test that uses a demo model, `unit` on every test marked nothing else: a new
    test is a unit test unless its file says otherwise (pytestmark) or it takes a model."""
    for item in items:
        if MODEL_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.model)
        if not any(item.get_closest_marker(name) for name in NOT_UNIT):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct folder; `./build.sh model` makes it if it is missing."""
    if not (MODEL_DIR / ".complete").exists() or not GGUF_PATH.exists():
        env = {**os.environ, "RUVLLM_VENV": str(Path(sys.executable).parent.parent)}
        subprocess.run(["bash", str(ROOT / "build.sh"), "model"], check=True, env=env)
    return MODEL_DIR


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_dir: Path) -> Path:
    return GGUF_PATH


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Gemma 3 270M in Q4_K_M (F32, Q5_0, Q8_0, Q4_K, Q6_K tensors); `./build.sh gemma` fetches it."""
    if not GEMMA_GGUF.exists():
        env = {**os.environ, "RUVLLM_VENV": str(Path(sys.executable).parent.parent)}
        subprocess.run(["bash", str(ROOT / "build.sh"), "gemma"], check=True, env=env)
    return GEMMA_GGUF


@pytest.fixture(scope="session")
def gemma_transformers_tokenizer(gemma_gguf: Path):
    """transformers' tokenizer of the Gemma GGUF, the reference of test_gemma3 and test_gguf_tokenizer:
    built once, as building it from the GGUF's 262k-token vocabulary takes about half a minute."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gemma_gguf.parent), gguf_file=gemma_gguf.name)


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path):
    """The demo model loaded once for the whole session (calls on it must not leak into each other)."""
    import ruvllm

    return ruvllm.load(str(smollm2_dir))


def randomize(model) -> None:
    """Give every parameter a visible random value (HF inits biases to 0 and norms to 1)."""
    torch = pytest.importorskip("torch")

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.2)


def tiny_config(kind: str, **overrides):
    """A small config of `kind` (llama, qwen2, mistral, qwen3, phi3, gemma3) for parity tests."""
    pytest.importorskip("transformers")
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

    base = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        attn_implementation="eager",
    )
    if kind in ("qwen3", "gemma3"):
        base["head_dim"] = 16
    if kind == "gemma3":  # 6 layers: one global (full attention) layer after five sliding-window ones
        base.update(num_hidden_layers=6, sliding_window=8, rms_norm_eps=1e-6, query_pre_attn_scalar=24)
    if kind == "phi3":
        base.update(pad_token_id=0, eos_token_id=1, bos_token_id=2)
    base.update(overrides)
    classes = {
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "mistral": MistralConfig,
        "qwen3": Qwen3Config,
        "phi3": Phi3Config,
        "gemma3": Gemma3TextConfig,
    }
    return classes[kind](**base)


def tiny_model(kind: str, folder: Path | None = None, seed: int = 0, **overrides):
    """A seeded random HF model (eval mode), saved as safetensors to `folder` when given (torch and
    transformers: the test is skipped without them)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(seed)
    classes = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "phi3": "Phi3ForCausalLM",
        "gemma3": "Gemma3ForCausalLM",
    }
    cls = getattr(transformers, classes[kind])
    model = cls(tiny_config(kind, **overrides)).eval()
    randomize(model)
    if folder is not None:
        model.save_pretrained(folder)
    return model


# Qwen2 has biases on q/k/v, Mistral a sliding window; the rest as transformers writes a Llama.
NUMPY_KINDS = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False},
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "bos_token_id": 1, "eos_token_id": 2},
}


def numpy_model(kind: str, folder: Path, seed: int = 0, shard_bytes: int | None = None, **overrides) -> Path:
    """A seeded random model of `kind` (llama, qwen2, mistral) written with NumPy alone (config.json,
    generation_config.json and model.safetensors, as `tiny_model` writes them; values drawn as `randomize`
    draws them), for the tests that need a model folder and no reference to compare it with. With
    `shard_bytes`, the weights are shards of at most that many bytes of tensors, and their index."""
    from ruvllm.files.tensorfile import serialize

    config = {
        **NUMPY_KINDS[kind],
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        **overrides,
    }
    hidden, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim", hidden // config["num_attention_heads"])
    q_rows, kv_rows = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,),
            layer + "self_attn.q_proj.weight": (q_rows, hidden),
            layer + "self_attn.k_proj.weight": (kv_rows, hidden),
            layer + "self_attn.v_proj.weight": (kv_rows, hidden),
            layer + "self_attn.o_proj.weight": (hidden, q_rows),
            layer + "mlp.gate_proj.weight": (ff, hidden),
            layer + "mlp.up_proj.weight": (ff, hidden),
            layer + "mlp.down_proj.weight": (hidden, ff),
        }
        if kind == "qwen2":
            biases = {"q": q_rows, "k": kv_rows, "v": kv_rows}
            shapes |= {layer + f"self_attn.{x}_proj.bias": (rows,) for x, rows in biases.items()}
    rng = np.random.default_rng(seed)
    tensors = {
        name: (rng.uniform(0.5, 1.5, shape) if name.endswith("norm.weight") else rng.normal(0.0, 0.2, shape))
        for name, shape in shapes.items()
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {key: config[key] for key in ("bos_token_id", "eos_token_id") if key in config}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    shards = [{}]
    for name, t in tensors.items():
        if shard_bytes and shards[-1] and sum(x.nbytes for x in shards[-1].values()) + t.size * 4 > shard_bytes:
            shards.append({})
        shards[-1][name] = t.astype(np.float32)
    if len(shards) == 1:
        (folder / "model.safetensors").write_bytes(serialize(shards[0], metadata={"format": "pt"}))
        return folder
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        (folder / file).write_bytes(serialize(shard, metadata={"format": "pt"}))
        weight_map |= dict.fromkeys(shard, file)
    total = sum(t.nbytes for shard in shards for t in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return folder


def byte_tokenizer_json() -> dict:
    """A byte-level BPE tokenizer.json with one token per byte and no merges, plus <s> (256), </s> (257)."""
    from ruvllm.text.detokenizer import byte_level_alphabet

    vocab = {char: byte for char, byte in byte_level_alphabet().items()}
    added = [
        {
            "id": 256 + i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, text in enumerate(("<s>", "</s>"))
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "vocab": vocab,
        "merges": [],
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": model,
    }


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium (never Playwright's own), with web/serve.py's flags."""
    from playwright.sync_api import sync_playwright

    from e2e_support import CHROMIUM, serve

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: ./build.sh test installs it (apt-get chromium)"
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=serve.CHROMIUM_ARGS)
        yield launched
        launched.close()
