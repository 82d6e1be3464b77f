"""Writing a ruvllm model folder: config and tokenizer JSON files plus one `model.safetensors`.

The weights file's `__metadata__` carries `format` = "ruvllm", `format_version`, and `tensors`: a JSON
table of every logical tensor's storage format, shape and group size (see docs/format.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..files.formats import GROUP, get_format
from ..files.store import FORMAT_NAME, FORMAT_VERSION
from ..files.tensorfile import write


@dataclass
class ConvertedTensor:
    name: str  # Hugging Face name
    format: str
    shape: tuple[int, ...]
    parts: dict[str, np.ndarray]  # suffix -> stored array
    note: str = ""  # what the converter did, for the report


@dataclass
class ModelFolder:
    config: dict
    tokenizer: dict | None = None  # tokenizer.json contents
    tokenizer_config: dict | None = None
    generation_config: dict | None = None
    extra_files: dict[str, bytes] = field(default_factory=dict)


def write_model(out_dir: str, folder: ModelFolder, tensors: list[ConvertedTensor], log: Callable[[str], None]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    _write_json(os.path.join(out_dir, "config.json"), folder.config)
    if folder.tokenizer is not None:
        _write_json(os.path.join(out_dir, "tokenizer.json"), folder.tokenizer)
    if folder.tokenizer_config is not None:
        _write_json(os.path.join(out_dir, "tokenizer_config.json"), folder.tokenizer_config)
    if folder.generation_config is not None:
        _write_json(os.path.join(out_dir, "generation_config.json"), folder.generation_config)
    for name, data in folder.extra_files.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
    path = os.path.join(out_dir, "model.safetensors")
    write_safetensors(path, tensors)
    log(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB)")


def write_safetensors(path: str, tensors: list[ConvertedTensor]) -> None:
    """One file holding every part of every tensor, with the format table in its metadata."""
    table, parts, dtypes = {}, {}, {}
    for t in tensors:
        fmt = get_format(t.format)
        entry: dict[str, object] = {"format": fmt.name, "shape": list(t.shape)}
        if fmt.quantized:
            entry["group_size"] = GROUP
        table[t.name] = entry
        for suffix, (st_dtype, part_shape) in fmt.part_specs(t.shape).items():
            array = t.parts[suffix]
            assert array.shape == part_shape, (t.name, suffix, array.shape, part_shape)
            parts[t.name + suffix], dtypes[t.name + suffix] = array, st_dtype
    metadata = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "tensors": json.dumps(table)}
    write(path, parts, metadata, dtypes)


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")
