"""Storage formats of weight tensors: how a matrix sits in a file, and how to get it back as float32.

One small class per format. A logical tensor `name` of shape (R, C) is stored as one or more
safetensors entries, `name` plus `name.scales` / `name.mins` for the quantized formats. Quantized
formats group each row into blocks of 32 consecutive columns (C must be a multiple of 32).

Dimension letters: R rows (output features), C columns (input features), B = C // 32 blocks per row.

The quantizers follow ggml's reference rounding (ggml-quants.c), so a tensor quantized here has the
same bytes as one quantized by llama.cpp, and GGUF Q8_0 / Q4_0 / Q4_1 blocks convert without loss.
"""

from __future__ import annotations

import numpy as np

from ..errors import LoadError
from . import ggml
from .ggml import pack_nibbles, unpack_nibbles  # ggml's nibble order, shared by every 4-bit layout
from .tensorfile import DTYPES, bf16_to_f32

GROUP = 32


class StorageFormat:
    """Base: `quantize` (offline, f32 -> stored parts) and `dequantize` (stored parts -> f32)."""

    name: str = ""
    quantized: bool = False

    def part_specs(self, shape: tuple[int, ...]) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Suffix -> (safetensors dtype, shape) of every stored entry."""
        raise NotImplementedError

    def quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def dequantize(self, parts: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def nbytes(self, shape: tuple[int, ...]) -> int:
        return sum(DTYPES[dt].itemsize * int(np.prod(s)) for dt, s in self.part_specs(shape).values())


class IEEEFloat(StorageFormat):
    """IEEE float32 or float16, any shape."""

    def __init__(self, name: str, st_dtype: str, dtype: type) -> None:
        self.name, self.st_dtype, self.dtype = name, st_dtype, dtype

    def part_specs(self, shape):
        return {"": (self.st_dtype, tuple(shape))}

    def quantize(self, w):
        return {"": np.ascontiguousarray(w, dtype=self.dtype)}

    def dequantize(self, parts, shape):
        return parts[""].astype(np.float32)


class BF16(StorageFormat):
    """bfloat16 (the top 16 bits of a float32), held in NumPy as raw uint16; any shape.

    bit 15: sign | bits 14-7: exponent | bits 6-0: mantissa
    """

    name = "bf16"

    def part_specs(self, shape):
        return {"": ("BF16", tuple(shape))}

    def quantize(self, w):
        bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
        # Round to nearest, ties to even, on the 16 bits that are dropped.
        rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        return {"": (rounded >> np.uint32(16)).astype(np.uint16)}

    def dequantize(self, parts, shape):
        return bf16_to_f32(parts[""])


class Q8(StorageFormat):
    """Symmetric int8 in blocks of 32 along each row, one f16 scale per block (ggml Q8_0 values).

    name         int8 (R, C)      code q in [-127, 127]
    name.scales  f16  (R, C/32)   d
    weight[r, c] = d[r, c // 32] * q[r, c]
    """

    name = "q8"
    quantized = True

    def part_specs(self, shape):
        rows, cols = _matrix_shape(self.name, shape)
        return {"": ("I8", (rows, cols)), ".scales": ("F16", (rows, cols // GROUP))}

    def quantize(self, w):
        rows, cols = _matrix_shape(self.name, w.shape)
        blocks = np.asarray(w, dtype=np.float32).reshape(rows, cols // GROUP, GROUP)  # (R, B, 32)
        q, d = quantize_symmetric(blocks, 8)  # (R, B, 32) int8, (R, B)
        return {"": q.reshape(rows, cols), ".scales": d.astype(np.float16)}

    def dequantize(self, parts, shape):
        rows, cols = _matrix_shape(self.name, shape)
        q = parts[""].reshape(rows, cols // GROUP, GROUP)  # (R, B, 32)
        d = parts[".scales"].astype(np.float32)[..., None]  # (R, B, 1)
        return (q * d).reshape(rows, cols)  # (R, C) f32


class Q4_0(StorageFormat):
    """4-bit codes in blocks of 32 along each row, one f16 scale per block (ggml Q4_0 values and order).

    name         uint8 (R, C/2)   16 bytes per block: byte j = q[j] | q[j + 16] << 4
    name.scales  f16   (R, C/32)  d
    weight = d * (q - 8),  q in [0, 15]
    """

    name = "q4_0"
    quantized = True
    has_min = False

    def part_specs(self, shape):
        rows, cols = _matrix_shape(self.name, shape)
        specs = {"": ("U8", (rows, cols // 2)), ".scales": ("F16", (rows, cols // GROUP))}
        if self.has_min:
            specs[".mins"] = ("F16", (rows, cols // GROUP))
        return specs

    def quantize(self, w):
        rows, cols = _matrix_shape(self.name, w.shape)
        blocks = np.asarray(w, dtype=np.float32).reshape(rows, cols // GROUP, GROUP)  # (R, B, 32)
        # The value of largest magnitude, with its sign, maps to code 0 (ggml: d = max / -8).
        extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)  # (R, B, 1)
        d = extreme / np.float32(-8)  # (R, B, 1)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)  # (R, B, 1)
        q = np.clip(np.trunc(blocks * inv + np.float32(8.5)), 0, 15).astype(np.uint8)  # (R, B, 32)
        return {"": pack_nibbles(q).reshape(rows, cols // 2), ".scales": d[..., 0].astype(np.float16)}

    def dequantize(self, parts, shape):
        rows, cols = _matrix_shape(self.name, shape)
        q = unpack_nibbles(parts[""].reshape(rows, cols // GROUP, GROUP // 2))  # (R, B, 32) uint8
        d = parts[".scales"].astype(np.float32)[..., None]  # (R, B, 1)
        if self.has_min:
            m = parts[".mins"].astype(np.float32)[..., None]  # (R, B, 1)
            return (q * d + m).reshape(rows, cols)  # (R, C)
        return ((q.astype(np.int8) - np.int8(8)) * d).reshape(rows, cols)  # (R, C)


class Q4_1(Q4_0):
    """4-bit codes in blocks of 32 with an f16 scale and an f16 minimum per block (ggml Q4_1 values).

    name         uint8 (R, C/2)   16 bytes per block: byte j = q[j] | q[j + 16] << 4
    name.scales  f16   (R, C/32)  d
    name.mins    f16   (R, C/32)  m
    weight = d * q + m,  q in [0, 15]
    """

    name = "q4_1"
    has_min = True

    def quantize(self, w):
        rows, cols = _matrix_shape(self.name, w.shape)
        blocks = np.asarray(w, dtype=np.float32).reshape(rows, cols // GROUP, GROUP)  # (R, B, 32)
        lo = blocks.min(axis=-1, keepdims=True)  # (R, B, 1)
        d = (blocks.max(axis=-1, keepdims=True) - lo) / np.float32(15)  # (R, B, 1)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)  # (R, B, 1)
        q = np.clip(np.trunc((blocks - lo) * inv + np.float32(0.5)), 0, 15).astype(np.uint8)  # (R, B, 32)
        return {
            "": pack_nibbles(q).reshape(rows, cols // 2),
            ".scales": d[..., 0].astype(np.float16),
            ".mins": lo[..., 0].astype(np.float16),
        }


class GGMLBlocks(StorageFormat):
    """A GGUF tensor type kept as the file stores it: each row a run of ggml blocks (files/ggml.py reads
    them). Named "ggml:<TYPE>", e.g. "ggml:Q4_K"; only GGUF files have them, and nothing writes them.

    name   uint8 (R, C / block_size * type_size)   the blocks of each row, as in the file
    """

    quantized = True

    def __init__(self, kind: ggml.GGMLType) -> None:
        self.type = kind
        self.name = f"ggml:{kind.name}"

    def part_specs(self, shape):
        if len(shape) != 2 or shape[1] % self.type.block_size:
            raise ValueError(
                f"format {self.name} needs a 2-D tensor with a multiple of {self.type.block_size} columns, "
                f"got shape {tuple(shape)}"
            )
        return {"": ("U8", (int(shape[0]), self.type.row_bytes(int(shape[1]))))}

    def quantize(self, w):
        raise NotImplementedError(f"{self.name} tensors are read from GGUF files, never written")

    def dequantize(self, parts, shape):
        return ggml.dequantize(self.type.name, parts[""], int(shape[1]))


FORMATS: dict[str, StorageFormat] = {
    f.name: f
    for f in (
        IEEEFloat("f32", "F32", np.float32),
        IEEEFloat("f16", "F16", np.float16),
        BF16(),
        Q8(),
        Q4_0(),
        Q4_1(),
        *(GGMLBlocks(t) for t in ggml.GGML_TYPES.values() if t.name in ggml.CODE_FORMS),
        *(GGMLBlocks(t) for t in ggml.GGML_TYPES.values() if t.name in ggml.DEQUANTIZE_ONLY),
    )
}
# GGUF types decoded to float32 only (the grid i-quants): loaded as a float matrix would be.
DEQUANTIZED_FORMATS = frozenset(f"ggml:{name}" for name in ggml.DEQUANTIZE_ONLY)


def code_layout(fmt: str) -> tuple[int, bool]:
    """(group size, whether there are mins) of the integer codes a quantized format's values become."""
    if fmt.startswith("ggml:"):
        _, group, has_mins = ggml.CODE_FORMS[fmt[5:]]
        return group, has_mins
    return GROUP, fmt == "q4_1"


def packs_nibbles(fmt: str) -> bool:
    """True when a format's codes are 4-bit (they fit the packed Int4Matrix form)."""
    return fmt in ("q4_0", "q4_1") or (fmt.startswith("ggml:") and ggml.CODE_FORMS[fmt[5:]][0] == "int4")


def get_format(name: str, where: str = "") -> StorageFormat:
    try:
        return FORMATS[name]
    except KeyError:
        prefix = f"{where}: " if where else ""
        raise LoadError(f"{prefix}unknown storage format {name!r}; expected one of {', '.join(FORMATS)}") from None


def _matrix_shape(fmt: str, shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) != 2 or shape[1] % GROUP:
        raise ValueError(
            f"format {fmt} needs a 2-D tensor with a multiple of {GROUP} columns, got shape {tuple(shape)}"
        )
    return int(shape[0]), int(shape[1])


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves go away from zero (np.round would go to even); exact, no `+ 0.5` rounding."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + np.floor(2 * (a - whole)))


# ---------------------------------------------------------------------------------------------------
# The two primitives every quantized layout here is made of (weights, and the KV cache's cold tier).


def quantize_symmetric(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantization along the last axis: (codes int8 (..., n), scales float32 (...)).

    scale = max|x| / (2^(bits-1) - 1), code = x / scale rounded half away from zero, as ggml's Q8_0
    (roundf; multiplied by the inverse scale, as ggml does). A block of zeros gets scale 0, codes 0.
    """
    top = np.float32((1 << (bits - 1)) - 1)  # 127 or 7
    scales = np.abs(x).max(axis=-1) / top  # (...)
    inv = np.divide(np.float32(1), scales, out=np.zeros_like(scales), where=scales != 0)[..., None]  # (..., 1)
    return _round_half_away(x * inv).astype(np.int8), scales.astype(np.float32)
