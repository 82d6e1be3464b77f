"""`ruvllm convert`: Hugging Face folders and GGUF files into ruvllm model folders.

The converter is offline tooling and, like the engine, needs NumPy alone: safetensors and GGUF files
are read, and the folder written, with NumPy (files/); tokenizer files are copied from the HF folder or written from
the GGUF's metadata (files/gguf_vocab.py). The `convert` extra is what its tests check the result with.

- `hf.py`: a Hugging Face model folder (safetensors in f32/f16/bf16).
- `gguf.py`: a GGUF file, its Q8_0/Q4_0/Q4_1 blocks copied, every other type dequantized.
- `writer.py`: the model folder written: config and tokenizer JSON files plus one `model.safetensors`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from ..errors import InvalidArgumentError, LoadError
from ..files.formats import GROUP, get_format
from ..files.outputs import write_folder
from .writer import ConvertedTensor

WEIGHT_CHOICES = ("f32", "f16", "q8", "q4_0", "q4_1")


def convert(
    src: str,
    out: str,
    weights: str | None = None,
    log: Callable[[str], None] = lambda line: None,
    force: bool = False,
) -> None:
    """Convert `src` (an HF model folder or a .gguf file) into the ruvllm folder `out`.

    `weights` is the storage format for matrices (f32, f16, q8, q4_0, q4_1); None keeps each tensor's
    source format. GGUF tensors already in Q8_0 / Q4_0 / Q4_1 are always copied without loss.
    `out` must not exist or be empty, unless `force`: then it is replaced, whole (never when it is or
    holds `src`). The model is written into a temporary folder beside it and renamed into place once
    complete, so a failed conversion leaves no half-written model, and no file of an older one remains
    (a stale shard breaks loading): files/outputs.py.
    """
    if weights is not None and weights not in WEIGHT_CHOICES:
        raise InvalidArgumentError(f"--weights must be one of {', '.join(WEIGHT_CHOICES)}, got {weights!r}")
    if os.path.isdir(src):
        from .hf import convert_hf as run
    elif os.path.isfile(src) and src.endswith(".gguf"):
        from .gguf import convert_gguf as run
    elif not os.path.exists(src):
        raise LoadError(f"{src}: no such file or folder")
    else:
        raise LoadError(f"{src}: expected a Hugging Face model folder or a .gguf file")
    write_folder(out, force, lambda folder: run(src, folder, weights, log), inputs=(src,))


def encode(name: str, w: np.ndarray, target: str) -> ConvertedTensor:
    """Store float32 `w` in `target`, or in f32 where a quantized target cannot hold it.

    Only matrices are quantized; vectors (norms, biases) stay f32. The note gives the max abs error.
    """
    if w.ndim != 2 and target != "f32":
        return ConvertedTensor(name, "f32", w.shape, {"": w.astype(np.float32)}, "f32 (vector)")
    fmt = get_format(target)
    if fmt.quantized and w.shape[1] % GROUP:
        return ConvertedTensor(
            name, "f32", w.shape, {"": w.astype(np.float32)}, f"f32 ({w.shape[1]} columns is not a multiple of {GROUP})"
        )
    parts = fmt.quantize(w)
    if target == "f32":
        return ConvertedTensor(name, "f32", w.shape, parts, "f32")
    error = float(np.max(np.abs(fmt.dequantize(parts, w.shape) - w))) if w.size else 0.0
    return ConvertedTensor(name, target, w.shape, parts, f"{target} max |error| {error:.3g}")


def report(t: ConvertedTensor) -> str:
    return f"{t.name:48s} {list(t.shape)!s:14s} {t.note}"
