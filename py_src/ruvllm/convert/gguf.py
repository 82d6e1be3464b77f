"""Converting a GGUF file (llama.cpp's format) into a ruvllm model folder.

The GGUF is read as the engine reads it (files/gguf_model.py: config, Hugging Face names, un-permuted
Q/K rows, tokenizer files from the metadata). Q8_0, Q4_0 and Q4_1 blocks hold exactly our q8 / q4_0 /
q4_1 values in the same nibble order, so they are copied; every other type is dequantized and stored in
the requested format. (The engine also loads the GGUF itself, keeping every type's exact values.)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import LoadError
from ..files.formats import get_format
from ..files.gguf import GGUFFile
from ..files.gguf_model import GGUFModel
from ..model.config import ModelConfig
from . import encode, report
from .writer import ConvertedTensor, ModelFolder, write_model

# GGUF block layouts we copy: type name -> (our format, bytes per block of 32, byte ranges of the parts)
_LOSSLESS = {
    "Q8_0": ("q8", 34, {".scales": (0, 2, np.float16), "": (2, 34, np.int8)}),
    "Q4_0": ("q4_0", 18, {".scales": (0, 2, np.float16), "": (2, 18, np.uint8)}),
    "Q4_1": ("q4_1", 20, {".scales": (0, 2, np.float16), ".mins": (2, 4, np.float16), "": (4, 20, np.uint8)}),
}


def convert_gguf(src: str, out: str, weights: str | None, log: Callable[[str], None]) -> None:
    model = GGUFModel(GGUFFile.from_path(src))
    ModelConfig.from_dict(model.config, f"{src} (metadata)")  # values no model can have are refused here
    for name in model.file.tensors.keys() - set(model.names.values()):
        log(f"{name:48s} skipped (not used by the model)")
    tensors: list[ConvertedTensor] = []
    for name, fmt, shape in model.logical_tensors():
        converted = _convert_tensor(name, fmt, shape, model.get(name), weights)
        tensors.append(converted)
        log(report(converted))
    folder = ModelFolder(config=model.config)
    folder.tokenizer, folder.tokenizer_config, folder.generation_config = model.tokenizer_files()
    write_model(out, folder, tensors, log)


def _convert_tensor(name: str, fmt: str, shape: tuple[int, ...], data: np.ndarray, weights: str | None):
    type_name = fmt.removeprefix("ggml:").upper()
    if type_name in _LOSSLESS:
        ours, block_bytes, layout = _LOSSLESS[type_name]
        blocks = data.reshape(shape[0], -1, block_bytes)  # (R, B, bytes)
        parts = {
            suffix: np.ascontiguousarray(blocks[..., lo:hi]).view(dtype).reshape(shape[0], -1)
            for suffix, (lo, hi, dtype) in layout.items()
        }
        return ConvertedTensor(name, ours, shape, parts, f"{ours} (copied from GGUF {type_name}, lossless)")
    try:
        w = get_format(fmt).dequantize({"": data}, shape).reshape(shape)
    except ValueError as e:
        raise LoadError(f"tensor {name!r}: {e}") from None
    if weights is None:
        weights = "f32" if type_name == "F32" else "f16"
    converted = encode(name, np.asarray(w, dtype=np.float32), weights)
    if type_name != "F32" or converted.format != "f32":
        converted.note += f" (from GGUF {type_name})"
    return converted
