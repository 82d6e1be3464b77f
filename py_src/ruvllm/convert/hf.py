"""Converting a Hugging Face model folder (safetensors in f32/f16/bf16)."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable

from ..errors import LoadError
from ..files import jsonfields as fields
from ..files.store import TensorStore, sanitize
from ..files.tensorfile import SafetensorsFile
from ..model.config import ModelConfig
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
    config_path = os.path.join(src, "config.json")
    config = fields.obj(fields.read_json(config_path), config_path)
    ModelConfig.from_dict(config, config_path)  # refuse unsupported models (and damaged configs) before any work
    files = sorted(glob.glob(os.path.join(src, "*.safetensors")))
    if not files:
        raise LoadError(f"{src}: no .safetensors files (PyTorch .bin checkpoints are not read)")
    store = TensorStore([SafetensorsFile.from_path(p) for p in files])

    tensors = []
    for name, stored in sanitize(store.names()).items():
        source_format = store.tensors[stored].format
        converted = encode(name, store.load_f32(stored), weights or source_format)
        tensors.append(converted)
        log(report(converted))

    folder = ModelFolder(config=config)
    folder.extra_files.update(companion_files(src))
    write_model(out, folder, tensors, log)
