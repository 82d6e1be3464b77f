"""Damaged model folders: a seeded fuzzer over the JSON of every file a model folder holds.

Each case changes one value of config.json, tokenizer_config.json, generation_config.json or the
safetensors header (its tensor table, or the ruvllm format table inside `__metadata__`) to a value of
another type, an impossible number, or removes it. Loading the folder and generating from it must then
either work or raise a RuvLLMError whose message names the damaged file: never an uncaught
AttributeError / TypeError / ValueError. A few hundred cases run in CI (seconds);
RUVLLM_FUZZ_CASES=N runs N per file, RUVLLM_FUZZ_SEED=S other ones.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
from pathlib import Path

import numpy as np
import pytest

import ruvllm
from ruvllm.errors import RuvLLMError
from ruvllm.files.formats import get_format
from ruvllm.files.tensorfile import serialize

from conftest import byte_tokenizer_json

CASES = int(os.environ.get("RUVLLM_FUZZ_CASES", "120"))
SEED = os.environ.get("RUVLLM_FUZZ_SEED", "")
VALUES = [None, True, False, 0, -1, 1, 3.0, 2**40, 1e308, math.nan, math.inf, -math.inf]
VALUES += ["", "x", "3", [], [1], {}, {"a": 1}]

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 260,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "tie_word_embeddings": True,
    "bos_token_id": 256,
    "eos_token_id": [256, 257],
}
TOKENIZER_CONFIG = {
    "bos_token": "<s>",
    "eos_token": {"content": "</s>", "__type": "AddedToken"},
    "chat_template": "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}",
}
GENERATION_CONFIG = {"eos_token_id": [257], "bos_token_id": 256}


def weights_header_and_data() -> tuple[dict, bytes]:
    """The ruvllm weight file of CONFIG (q8 projections, f32 vectors), as (header JSON, data bytes)."""
    rng = np.random.default_rng(0)
    c = CONFIG
    D, F, V, E = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    shapes = {
        "model.embed_tokens.weight": (V, D),
        "model.norm.weight": (D,),
        "model.layers.0.input_layernorm.weight": (D,),
        "model.layers.0.post_attention_layernorm.weight": (D,),
        "model.layers.0.self_attn.q_proj.weight": (2 * E, D),
        "model.layers.0.self_attn.k_proj.weight": (E, D),
        "model.layers.0.self_attn.v_proj.weight": (E, D),
        "model.layers.0.self_attn.o_proj.weight": (D, 2 * E),
        "model.layers.0.mlp.gate_proj.weight": (F, D),
        "model.layers.0.mlp.up_proj.weight": (F, D),
        "model.layers.0.mlp.down_proj.weight": (D, F),
    }
    table, parts = {}, {}
    for name, shape in shapes.items():
        fmt = "q8" if len(shape) == 2 else "f32"
        w = rng.normal(0, 0.3, shape).astype(np.float32)
        for suffix, array in get_format(fmt).quantize(w).items():
            parts[name + suffix] = array
        table[name] = {"format": fmt, "shape": list(shape), **({"group_size": 32} if fmt == "q8" else {})}
    metadata = {"format": "ruvllm", "format_version": "1", "tensors": json.dumps(table)}
    blob = serialize(parts, metadata)
    length = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def write_folder(folder: Path, files: dict[str, object], weights: tuple[dict, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in files.items():
        (folder / name).write_text(json.dumps(doc, allow_nan=True))
    header, data = weights
    text = json.dumps(header, allow_nan=True).encode()
    (folder / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + data)


def paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON document (keys and list indexes)."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += paths(value, (*prefix, i))
    return found


def mutate(doc: object, rng: random.Random) -> object:
    """`doc` with one value replaced by another of any type, or removed."""
    doc = copy.deepcopy(doc)
    path = rng.choice(paths(doc))
    if not path:
        return rng.choice(VALUES)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(VALUES)
    return doc


def mutate_weights(header: dict, rng: random.Random) -> dict:
    """A header with one value changed: in the tensor entries, or in the format table in __metadata__."""
    header = copy.deepcopy(header)
    if rng.random() < 0.5:
        table = json.loads(header["__metadata__"]["tensors"])
        header["__metadata__"]["tensors"] = json.dumps(mutate(table, rng), allow_nan=True)
        return header
    return mutate(header, rng)


def outcome(folder: Path) -> RuvLLMError | None:
    """Load the folder and generate from it (raw and chat): None if it worked, else the RuvLLMError."""
    try:
        model = ruvllm.load(str(folder))
    except RuvLLMError as e:
        return e
    try:
        list(model.generate("hi", max_tokens=2, temperature=0))
        list(model.chat([{"role": "user", "content": "hi"}], max_tokens=2, temperature=0))
    except RuvLLMError as e:
        return e  # raised by a loaded model: it may name no file (e.g. non-finite logits)
    return None


DAMAGED = ["config.json", "tokenizer_config.json", "generation_config.json", "model.safetensors"]


@pytest.mark.parametrize("damaged", DAMAGED)
def test_damaged_json_is_a_clear_error_naming_the_file(damaged, tmp_path):
    pytest.importorskip("tokenizers")  # the intact folder must load, text included
    files = {
        "config.json": CONFIG,
        "tokenizer.json": byte_tokenizer_json(),
        "tokenizer_config.json": TOKENIZER_CONFIG,
        "generation_config.json": GENERATION_CONFIG,
    }
    weights = weights_header_and_data()
    write_folder(tmp_path / "intact", files, weights)
    assert outcome(tmp_path / "intact") is None
    rng = random.Random(f"ruvllm-{damaged}{SEED}")
    refused = 0
    for case in range(CASES):
        folder = tmp_path / str(case)
        if damaged == "model.safetensors":
            write_folder(folder, files, (mutate_weights(weights[0], rng), weights[1]))
        else:
            write_folder(folder, {**files, damaged: mutate(files[damaged], rng)}, weights)
        try:
            error = outcome(folder)
        except Exception as e:
            document = (folder / damaged).read_bytes()[:2000] if damaged != "model.safetensors" else b""
            raise AssertionError(f"case {case}: {type(e).__name__}: {e}\n{document.decode(errors='replace')}") from e
        if error is not None and error.type == "load":
            refused += 1
            assert damaged in error.message, f"case {case}: the error does not name {damaged}: {error.message}"
    assert refused > CASES // 10  # the fuzzer does reach the checks
