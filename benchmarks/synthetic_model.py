"""A synthetic Llama with the layer shapes of a 1B or a 3B model, random weights stored as q4_1, for the
browser benchmark:

    .venv/bin/python benchmarks/synthetic_model.py [--shape 1b|3b] [--layers N] [--out models/synthetic-1b-q4]
    .venv/bin/python benchmarks/browser_bench.py --model /models/synthetic-1b-q4/ --configs q4:wasm:fast --no-peer

1b: Llama 3.2 1B's layers (16 layers, hidden 2048, MLP 8192, 32 query and 8 key/value heads of 64);
3b: Llama 3.2 3B's (28 layers, hidden 3072, MLP 8192, 24 query and 8 key/value heads of 128).
The vocabulary and tokenizer are SmolLM2's (49152 tokens, so the text tools work): the embedding is
49152 x hidden instead of Llama's 128256 x hidden (1.07B and 2.97B parameters in all). The text it
writes is noise; speed and memory are what it measures. --layers N stacks N layers of the shape: 3b with
52 layers has 5.39B parameters (the largest model that loads, issue 25).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "py_src"))

from ruvllm.files.formats import get_format  # noqa: E402
from ruvllm.files.tensorfile import write  # noqa: E402

SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
VOCAB = 49152
SHAPES = {  # hidden D, MLP F, layers, query heads, key/value heads, head size
    "1b": (2048, 8192, 16, 32, 8, 64),
    "3b": (3072, 8192, 28, 24, 8, 128),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the shape's); more: a larger model")
    parser.add_argument("--out", help="the model folder to write (default: models/synthetic-SHAPE[-LAYERSl]-q4)")
    parser.add_argument("--force", action="store_true", help="write into --out even if it exists")
    args = parser.parse_args()
    D, F, LAYERS, HEADS, KV_HEADS, HEAD_DIM = SHAPES[args.shape]
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be >= 1, got {args.layers}")
    name = f"synthetic-{args.shape}-q4" if args.layers is None else f"synthetic-{args.shape}-{args.layers}l-q4"
    LAYERS = args.layers or LAYERS
    out = Path(args.out or ROOT / "models" / name)
    if out.exists() and not args.force:
        parser.error(f"{out} exists (--force to write into it)")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    q4 = get_format("q4_1")
    tensors, table = {}, {}

    def matrix(name: str, rows: int, cols: int) -> None:
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        for suffix, part in q4.quantize(w).items():
            tensors[name + suffix] = part
        table[name] = {"format": "q4_1", "shape": [rows, cols], "group_size": 32}

    def vector(name: str, size: int) -> None:
        tensors[name] = np.ones(size, dtype=np.float32)
        table[name] = {"format": "f32", "shape": [size]}

    matrix("model.embed_tokens.weight", VOCAB, D)
    vector("model.norm.weight", D)
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        vector(f"{p}.input_layernorm.weight", D)
        vector(f"{p}.post_attention_layernorm.weight", D)
        matrix(f"{p}.self_attn.q_proj.weight", HEADS * HEAD_DIM, D)
        matrix(f"{p}.self_attn.k_proj.weight", KV_HEADS * HEAD_DIM, D)
        matrix(f"{p}.self_attn.v_proj.weight", KV_HEADS * HEAD_DIM, D)
        matrix(f"{p}.self_attn.o_proj.weight", D, HEADS * HEAD_DIM)
        matrix(f"{p}.mlp.gate_proj.weight", F, D)
        matrix(f"{p}.mlp.up_proj.weight", F, D)
        matrix(f"{p}.mlp.down_proj.weight", D, F)
    metadata = {"format": "ruvllm", "format_version": "1", "tensors": json.dumps(table)}
    write(out / "model.safetensors", tensors, metadata)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": D,
        "intermediate_size": F,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SMOLLM2 / name, out / name)
    print(f"{out}: {sum(a.nbytes for a in tensors.values()) / 2**20:.0f} MiB of weights")


if __name__ == "__main__":
    main()
