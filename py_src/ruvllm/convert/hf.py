"""Converting a Hugging Face model folder (safetensors in f32/f16/bf16)."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..files import layout
from ..files.store import sanitize
from ..runtime.assembly import local_assembly
from . import encode, report
from .writer import ModelFolder, write_model

_COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")


def companion_files(folder: str) -> dict[str, bytes]:
    """The tokenizer and generation files of a model folder that a converted copy keeps, by name."""
    found = {}
    for name in _COPIED:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                found[name] = f.read()
    return found


def convert_hf(src: str, out: str, weights: str | None, log: Callable[[str], None]) -> None:
    assembly = local_assembly(
        src, needs_tokenizer=False
    )  # refuses unsupported models (and damaged configs) before any work
    config, store = assembly.document(layout.CONFIG), assembly.store()

    tensors = []
    for name, stored in sanitize(store.names()).items():
        source_format = store.tensors[stored].format
        converted = encode(name, store.load_f32(stored), weights or source_format)
        tensors.append(converted)
        log(report(converted))

    folder = ModelFolder(config=config)
    folder.extra_files.update(companion_files(src))
    write_model(out, folder, tensors, log)
