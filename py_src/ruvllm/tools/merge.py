"""`ruvllm merge`: a LoRA adapter added into a model's weights for good, written as a new model folder.

Every adapted matrix becomes W + scale * B @ A, stored in float32 (a quantized copy would round most of
the update away); every other tensor keeps its stored format. An adapter on the output projection of a
model that ties it to the embedding gets its own `lm_head.weight` (the embedding stays as it was).
The folder's config, tokenizer and generation files are copied.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from ..convert import WEIGHT_CHOICES, encode, report
from ..convert.hf import companion_files
from ..convert.writer import ModelFolder, write_model
from ..errors import InvalidArgumentError
from ..files import jsonfields as fields
from ..files.outputs import check_output, write_folder
from ..files.store import sanitize
from ..learning.lora import Adapter
from ..runtime.assembly import is_gguf, load_engine, open_model


def merge_adapter(
    model: str,
    adapter_folder: str,
    out: str,
    force: bool = False,
    log: Callable[[str], None] = lambda line: None,
    ungated: bool = False,
) -> None:
    """Write `out`: the model folder `model` with the adapter in `adapter_folder` merged into its weights
    (a gated adapter's gates dropped only with `ungated`: lora.Gate)."""
    if is_gguf(model):
        raise InvalidArgumentError(
            f"{model}: merge writes a model folder; convert the GGUF file into one first (ruvllm convert)"
        )
    check_output(out, force, (model, adapter_folder))  # before the slow load
    engine = load_engine(model, compute="f32")  # the adapter is checked against these shapes
    adapter = Adapter.load(adapter_folder, engine.weights)
    if not ungated:
        adapter.ungated(f"merging {adapter_folder} into a model", "; --ungated merges it so")
    del engine
    config_path = os.path.join(model, "config.json")
    _, store = open_model(model)
    raw_config = fields.obj(fields.read_json(config_path), config_path)  # (open_model checked it)
    deltas = {f"{name}.weight": adapter.config.scale * (adapter.B[name] @ adapter.A[name]) for name in adapter.A}
    names = sanitize(store.names())
    if "lm_head.weight" in deltas and "lm_head.weight" not in names:  # tied to the embedding: untie
        names["lm_head.weight"] = names["model.embed_tokens.weight"]
        raw_config["tie_word_embeddings"] = False

    def write(folder: str) -> None:
        tensors = []
        for name, stored in names.items():
            w = store.load_f32(stored)
            if name in deltas:
                converted = encode(name, (w + deltas[name]).astype(np.float32), "f32")
            else:
                fmt = store.tensors[stored].format
                converted = encode(name, w, fmt if fmt in WEIGHT_CHOICES else "f32")
            tensors.append(converted)
            log(report(converted))
        files = ModelFolder(config=raw_config)
        files.extra_files.update(companion_files(model))
        write_model(folder, files, tensors, log)

    write_folder(out, force, write, inputs=(model, adapter_folder))
