"""ggml's tensor types, and NumPy decoders of their blocks, bit-exact with ggml.

A GGUF tensor of type t with rows of C weights stores each row as C / block_size blocks of type_size
bytes (ggml.c's type traits; the same table as the `gguf` package's GGML_QUANT_SIZES). Rows are whole
blocks, so a row-major (R, C) tensor is an (R, C / block_size * type_size) array of bytes.

Two ways to read such rows:
- `dequantize(type, raw, C)`: float32 (R, C), bit-identical to ggml's (and gguf-py's) dequantization.
- `compute_parts(type, raw, C)`: the same values kept as integer codes with a float32 scale (and
  min) per group, `w = scale * code + min`; nothing is requantized, and `CodeParts.dequantize()`
  computes exactly the floats above. Every product of an f16 and a small integer that ggml forms
  (d * sc, d * q) fits in float32's 24-bit significand, and ggml's `a * q - b` is `a * q + (-b)`
  in IEEE arithmetic, so regrouping the scale into one f32 per group changes no bit.
  The grid i-quants (DEQUANTIZE_ONLY) have no compute form: they decode to float32 only, which is
  lossy if the model is then requantized for q8/q4 compute.

    GGUF type  file bytes/w  compute form          compute bytes/w
    Q4_0       0.5625        int4 g32, offset 8    0.625
    Q4_1       0.625         int4 g32 + mins       0.75
    Q5_0       0.6875        int8 g32 (q - 16)     1.125
    Q5_1       0.75          int8 g32 + mins       1.25
    Q8_0       1.0625        int8 g32              1.125
    Q2_K       0.328125      int8 g16 + mins       1.5
    Q3_K       0.4296875     int8 g16 (-4..3)      1.25
    Q4_K       0.5625        int4 g32 + mins       0.75
    Q5_K       0.6875        int8 g32 + mins       1.25
    Q6_K       0.8203125     int8 g16 (q - 32)     1.25
    Q8_K       1.140625      int8 g256             1.015625
    IQ4_NL     0.5625        int8 g32 (levels)     1.125
    IQ4_XS     0.53125       int8 g32 (levels)     1.125
    IQ2_XXS    0.2578125     none: float32 only    4
    IQ2_XS     0.2890625     none: float32 only    4
    IQ2_S      0.3203125     none: float32 only    4
    IQ3_XXS    0.3828125     none: float32 only    4
    IQ3_S      0.4296875     none: float32 only    4
    IQ1_S      0.1953125     none: float32 only    4
    IQ1_M      0.21875       none: float32 only    4
    F32/F16/BF16             none: dequantize only

Dimension letters: R rows (output features), C columns, N blocks in the tensor (R * C / K),
K weights and T bytes per block, G groups per row (C / g), g weights per group, S scales per block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .ggml_iq_tables import (
    BYTE_SIGNS,
    EVEN_SIGNS,
    IQ1_S_GRID,
    IQ2_S_GRID,
    IQ2_XS_GRID,
    IQ2_XXS_GRID,
    IQ3_S_GRID,
    IQ3_XXS_GRID,
)
from .tensorfile import bf16_to_f32


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block_size: int  # weights per block
    type_size: int  # bytes per block

    def row_bytes(self, columns: int) -> int:
        """Bytes of one row of `columns` weights (which must be whole blocks)."""
        return columns // self.block_size * self.type_size


GGML_TYPES: dict[int, GGMLType] = {
    t.id: t
    for t in (
        GGMLType(0, "F32", 1, 4),
        GGMLType(1, "F16", 1, 2),
        GGMLType(2, "Q4_0", 32, 18),
        GGMLType(3, "Q4_1", 32, 20),
        GGMLType(6, "Q5_0", 32, 22),
        GGMLType(7, "Q5_1", 32, 24),
        GGMLType(8, "Q8_0", 32, 34),
        GGMLType(9, "Q8_1", 32, 40),
        GGMLType(10, "Q2_K", 256, 84),
        GGMLType(11, "Q3_K", 256, 110),
        GGMLType(12, "Q4_K", 256, 144),
        GGMLType(13, "Q5_K", 256, 176),
        GGMLType(14, "Q6_K", 256, 210),
        GGMLType(15, "Q8_K", 256, 292),
        GGMLType(16, "IQ2_XXS", 256, 66),
        GGMLType(17, "IQ2_XS", 256, 74),
        GGMLType(18, "IQ3_XXS", 256, 98),
        GGMLType(19, "IQ1_S", 256, 50),
        GGMLType(20, "IQ4_NL", 32, 18),
        GGMLType(21, "IQ3_S", 256, 110),
        GGMLType(22, "IQ2_S", 256, 82),
        GGMLType(23, "IQ4_XS", 256, 136),
        GGMLType(24, "I8", 1, 1),
        GGMLType(25, "I16", 1, 2),
        GGMLType(26, "I32", 1, 4),
        GGMLType(27, "I64", 1, 8),
        GGMLType(28, "F64", 1, 8),
        GGMLType(29, "IQ1_M", 256, 56),
        GGMLType(30, "BF16", 1, 2),
        GGMLType(34, "TQ1_0", 256, 54),
        GGMLType(35, "TQ2_0", 256, 66),
        GGMLType(39, "MXFP4", 32, 17),
    )
}
GGML_TYPE_NAMES: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}


# ---------------------------------------------------------------------------------------------------
# The compute form: integer codes with a float32 scale (and maybe a minimum) per group of weights.


@dataclass(frozen=True, eq=False)
class CodeParts:
    """A quantized matrix as integer codes and per-group float32 scales (and mins): the stored values, exactly.

        w[r, c] = scales[r, c // group] * (code[r, c] - offset) + mins[r, c // group]   (no min term if mins is None)

    computed in float32 in that order: the code (an integer) cast to f32, times the scale, plus the min.

    kind "int8": codes int8 (R, C), offset 0.
    kind "int4": codes uint8 (R, C/2), group 32; within each group of 32 weights
        byte j (0..15) = code[j] | code[j + 16] << 4     (ggml's Q4_0 order, as pack_nibbles)
        with codes 0..15 and `offset` (8 for Q4_0, else 0) subtracted after unpacking.
    scales, mins: float32 (R, C/group); mins is None for the symmetric types.

    `compute_parts` gives these with R rows of the tensor; the decoders below build them with one row per
    block, and `dequantize` works on either.
    """

    kind: str  # "int4" | "int8"
    group: int  # weights per scale
    codes: np.ndarray  # (R, C) int8 | (R, C/2) uint8
    scales: np.ndarray  # (R, G) f32
    mins: np.ndarray | None  # (R, G) f32
    offset: int = 0

    def __post_init__(self) -> None:
        width = self.scales.shape[-1] * self.group // (2 if self.kind == "int4" else 1)
        assert self.kind in ("int4", "int8") and (self.kind == "int8" or self.group == 32), (self.kind, self.group)
        assert self.codes.dtype == (np.uint8 if self.kind == "int4" else np.int8), self.codes.dtype
        assert self.codes.shape == (*self.scales.shape[:-1], width), (self.codes.shape, self.scales.shape)
        assert self.scales.dtype == np.float32 and (self.mins is None or self.mins.shape == self.scales.shape)

    def int8_codes(self) -> np.ndarray:
        """The codes minus the offset, one int8 per weight: (R, C)."""
        if self.kind == "int8":
            return self.codes
        rows, packed = self.codes.shape
        q = unpack_nibbles(self.codes.reshape(rows, packed // 16, 16))  # (R, G, 32) uint8 in 0..15
        if self.offset:
            q -= np.uint8(self.offset)  # wraps below zero; read as int8 it is the signed code
        return q.view(np.int8).reshape(rows, packed * 2)  # (R, C)

    def dequantize(self) -> np.ndarray:
        """float32 (R, C): exactly the values ggml (and gguf-py) decode from the blocks."""
        rows, groups = self.scales.shape
        q = self.int8_codes().reshape(rows, groups, self.group)  # (R, G, g) int8
        w = np.multiply(q, self.scales[:, :, None], dtype=np.float32)  # (R, G, g)
        if self.mins is not None:
            np.add(w, self.mins[:, :, None], out=w)
        return w.reshape(rows, groups * self.group)  # (R, C)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(..., n) codes in [0, 15] -> (..., n/2) bytes, byte j = q[j] | q[j + n/2] << 4 (ggml's Q4_0 order)."""
    half = q.shape[-1] // 2
    return q[..., :half] | (q[..., half:] << np.uint8(4))


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """(..., m) bytes -> (..., 2m) codes: the low nibbles, then the high nibbles (inverse of pack_nibbles)."""
    return np.concatenate([packed & np.uint8(15), packed >> np.uint8(4)], axis=-1)


def bytes_per_weight(kind: str, group: int, has_mins: bool) -> float:
    """Memory of the compute form per weight: the code, plus its share of the f32 scale (and min)."""
    if kind not in ("int4", "int8") or group <= 0 or (kind == "int4" and group != 32):
        raise ValueError(f"no compute form {kind} with group {group}; int8 takes any group, int4 only 32")
    code = 0.5 if kind == "int4" else 1.0
    return code + 4 / group * (2 if has_mins else 1)


# ---------------------------------------------------------------------------------------------------
# One decoder per ggml block type: (N, T) bytes -> CodeParts of N rows of one block each.
# Byte offsets in the layouts are within a block; f16 and u16/u32 fields are little-endian.


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 field at byte `at` of every block, as float32 (N, 1)."""
    return np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16).astype(np.float32)


def _fields(x: np.ndarray, width: int) -> np.ndarray:
    """(..., L) bytes -> (..., 8 / width, L): plane p holds bits [p*width, (p+1)*width) of every byte."""
    shifts = np.arange(0, 8, width, dtype=np.uint8)[:, None]  # (P, 1)
    planes = x[..., None, :] >> shifts  # (..., P, L)
    planes &= np.uint8((1 << width) - 1)
    return planes


def _q8_0(b: np.ndarray) -> CodeParts:
    """Q8_0, 34 bytes per 32 weights:  0 d f16 | 2 q[0..31] int8;  w = d * q."""
    return CodeParts("int8", 32, b[:, 2:34].view(np.int8), _f16(b, 0), None)


def _q4_0(b: np.ndarray) -> CodeParts:
    """Q4_0, 18 bytes per 32 weights:  0 d f16 | 2 qs[16];  qs[j] = q[j] | q[j+16] << 4;  w = d * (q - 8)."""
    return CodeParts("int4", 32, b[:, 2:18], _f16(b, 0), None, offset=8)


def _q4_1(b: np.ndarray) -> CodeParts:
    """Q4_1, 20 bytes per 32 weights:  0 d f16 | 2 m f16 | 4 qs[16] as Q4_0;  w = d * q + m."""
    return CodeParts("int4", 32, b[:, 4:20], _f16(b, 0), _f16(b, 2))


def _five_bits(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 codes 0..31 (N, 32): low 4 bits from qs as Q4_0, bit 4 of weight i = bit i of u32 qh."""
    low = _fields(qs, 4).reshape(-1, 32)  # (N, 32): low nibbles are weights 0..15, high ones 16..31
    high = np.unpackbits(qh, axis=1, bitorder="little")  # (N, 32): bit i of the little-endian u32
    return (low | high << np.uint8(4)).view(np.int8)


def _q5_0(b: np.ndarray) -> CodeParts:
    """Q5_0, 22 bytes per 32 weights:  0 d f16 | 2 qh u32 | 6 qs[16];  w = d * (q - 16)."""
    q = _five_bits(b[:, 2:6], b[:, 6:22])  # (N, 32)
    q -= np.int8(16)
    return CodeParts("int8", 32, q, _f16(b, 0), None)


def _q5_1(b: np.ndarray) -> CodeParts:
    """Q5_1, 24 bytes per 32 weights:  0 d f16 | 2 m f16 | 4 qh u32 | 8 qs[16];  w = d * q + m."""
    return CodeParts("int8", 32, _five_bits(b[:, 4:8], b[:, 8:24]), _f16(b, 0), _f16(b, 2))


def _q2_k(b: np.ndarray) -> CodeParts:
    """Q2_K, 84 bytes per 256 weights in 16 groups of 16:

    0 scales[16]  byte k = mmmm ssss: group k's 4-bit scale s (low) and min m (high)
    16 qs[64]     2-bit codes: weight 128h + 32p + i is bits 2p..2p+1 of qs[32h + i]  (h 0..1, p 0..3)
    80 d f16, 82 dmin f16
    w = (d * s) * q - (dmin * m)
    """
    sc = b[:, 0:16]  # (N, 16)
    q = _fields(b[:, 16:80].reshape(-1, 2, 32), 2).reshape(-1, 256).view(np.int8)  # (N, 256) in 0..3
    scales = _f16(b, 80) * (sc & np.uint8(15))  # (N, 16)
    mins = -(_f16(b, 82) * (sc >> np.uint8(4)))  # (N, 16)
    return CodeParts("int8", 16, q, scales, mins)


def _q3_k(b: np.ndarray) -> CodeParts:
    """Q3_K, 110 bytes per 256 weights in 16 groups of 16:

    0 hmask[32]   bit p of hmask[i] is the high bit of weight 32p + i; a 0 bit means "minus 4"
    32 qs[64]     low 2 bits, placed as in Q2_K
    96 scales[12] 16 6-bit scales s, stored + 32:
                  bytes 0..7  = hhhh llll   low 4 bits of s[k] (low nibble) and s[k + 8] (high nibble)
                  bytes 8..11 = 2-bit fields: bits 2p..2p+1 of byte 8 + j are the top bits of s[4p + j]
    108 d f16
    w = (d * (s - 32)) * q,  q = low2 - 4 * (1 - hbit) in -4..3
    """
    low = b[:, 96:104]  # (N, 8)
    top = _fields(b[:, 104:108], 2).reshape(-1, 16)  # (N, 16)
    s = np.concatenate((low & np.uint8(15), low >> np.uint8(4)), axis=1) | top << np.uint8(4)  # (N, 16) 0..63
    scales = _f16(b, 108) * (s.view(np.int8) - np.int8(32))  # (N, 16)
    q = _fields(b[:, 32:96].reshape(-1, 2, 32), 2).reshape(-1, 256)  # (N, 256) low 2 bits
    q |= _fields(b[:, 0:32], 1).reshape(-1, 256) << np.uint8(2)
    q = q.view(np.int8)
    q -= np.int8(4)
    return CodeParts("int8", 16, q, scales, None)


def _k_scales(s: np.ndarray, d: np.ndarray, dmin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> (d * sc, -(dmin * m)), each (N, 8) f32, sc and m 6-bit:

    bytes 0..3   MMssssss  s = sc[j] (6 bits), MM = top 2 bits of sc[j + 4]
    bytes 4..7   MMmmmmmm  m = m[j],           MM = top 2 bits of m[j + 4]
    bytes 8..11  mmmmssss  low 4 bits of m[j + 4] (high nibble) and sc[j + 4] (low nibble)
    """
    a, m, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]  # (N, 4) each
    sc = np.concatenate((a & np.uint8(63), (c & np.uint8(15)) | (a >> np.uint8(6)) << np.uint8(4)), axis=1)
    mn = np.concatenate((m & np.uint8(63), (c >> np.uint8(4)) | (m >> np.uint8(6)) << np.uint8(4)), axis=1)
    return d * sc, -(dmin * mn)  # (N, 8) each; f16 times a 6-bit integer is exact in f32


def _q4_k(b: np.ndarray) -> CodeParts:
    """Q4_K, 144 bytes per 256 weights in 8 groups of 32:

    0 d f16, 2 dmin f16, 4 scales[12] (see _k_scales)
    16 qs[128]   for chunk j (0..3) of 64 weights: the low nibbles of qs[32j .. 32j+31] are weights
                 64j + 0..31 (group 2j), the high nibbles weights 64j + 32..63 (group 2j + 1)
    w = (d * sc) * q - (dmin * m)

    The codes are repacked into ruvllm's order: byte i of group 2j     = lo(qs[32j+i]) | lo(qs[32j+16+i]) << 4,
                                                byte i of group 2j + 1 = hi(qs[32j+i]) | hi(qs[32j+16+i]) << 4.
    """
    qs = b[:, 16:144].reshape(-1, 4, 2, 16)  # (N, chunk, half, 16)
    first, second = qs[:, :, 0], qs[:, :, 1]  # (N, 4, 16): weights i and 16 + i of both groups of a chunk
    packed = np.empty_like(qs)  # (N, 4, group in chunk, 16)
    packed[:, :, 0] = (first & np.uint8(15)) | second << np.uint8(4)
    packed[:, :, 1] = first >> np.uint8(4) | (second & np.uint8(0xF0))
    scales, mins = _k_scales(b[:, 4:16], _f16(b, 0), _f16(b, 2))
    return CodeParts("int4", 32, packed.reshape(-1, 128), scales, mins)


def _q5_k(b: np.ndarray) -> CodeParts:
    """Q5_K, 176 bytes per 256 weights in 8 groups of 32:

    0 d f16, 2 dmin f16, 4 scales[12] (see _k_scales)
    16 qh[32]    bit p of qh[i] is bit 4 of weight 32p + i
    48 qs[128]   low 4 bits, placed as in Q4_K
    w = (d * sc) * q - (dmin * m),  q in 0..31
    """
    q = _fields(b[:, 48:176].reshape(-1, 4, 32), 4).reshape(-1, 256)  # (N, 256)
    q |= _fields(b[:, 16:48], 1).reshape(-1, 256) << np.uint8(4)
    scales, mins = _k_scales(b[:, 4:16], _f16(b, 0), _f16(b, 2))
    return CodeParts("int8", 32, q.view(np.int8), scales, mins)


def _q6_k(b: np.ndarray) -> CodeParts:
    """Q6_K, 210 bytes per 256 weights in 16 groups of 16:

    0 ql[128]     low 4 bits: weight 128h + 64p + i is nibble p of ql[64h + i]   (h, p 0..1, i 0..63)
    128 qh[64]    top 2 bits: weight 128h + 32p + i is bits 2p..2p+1 of qh[32h + i]   (p 0..3)
    192 scales[16] int8
    208 d f16
    w = (d * scale) * (q - 32)
    """
    q = _fields(b[:, 0:128].reshape(-1, 2, 64), 4).reshape(-1, 256)  # (N, 256)
    q |= _fields(b[:, 128:192].reshape(-1, 2, 32), 2).reshape(-1, 256) << np.uint8(4)
    q = q.view(np.int8)
    q -= np.int8(32)
    return CodeParts("int8", 16, q, _f16(b, 208) * b[:, 192:208].view(np.int8), None)


def _q8_k(b: np.ndarray) -> CodeParts:
    """Q8_K, 292 bytes per 256 weights:  0 d f32 | 4 q[256] int8 | 260 bsums[16] i16 (unused);  w = d * q."""
    d = np.ascontiguousarray(b[:, 0:4]).view(np.float32)  # (N, 1); ggml stores it as float, not half
    return CodeParts("int8", 256, b[:, 4:260].view(np.int8), d, None)


# ggml's kvalues_iq4nl: the 16 non-uniform levels of IQ4_NL and IQ4_XS.
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def _iq4_nl(b: np.ndarray) -> CodeParts:
    """IQ4_NL, 18 bytes per 32 weights:  0 d f16 | 2 qs[16] as Q4_0;  w = d * IQ4_LEVELS[q]."""
    q = IQ4_LEVELS[_fields(b[:, 2:18], 4).reshape(-1, 32)]  # (N, 32)
    return CodeParts("int8", 32, q, _f16(b, 0), None)


def _iq4_xs(b: np.ndarray) -> CodeParts:
    """IQ4_XS, 136 bytes per 256 weights in 8 groups of 32:

    0 d f16
    2 scales_h u16   bits 2k..2k+1: top 2 bits of group k's 6-bit scale ls
    4 scales_l[4]    byte j = hhhh llll: low 4 bits of ls[2j] (low nibble) and ls[2j + 1] (high nibble)
    8 qs[128]        16 bytes per group, as Q4_0 (byte i = q[i] | q[i + 16] << 4)
    w = (d * (ls - 32)) * IQ4_LEVELS[q]
    """
    low = _fields(b[:, 4:8], 4).transpose(0, 2, 1).reshape(-1, 8)  # (N, 8): byte j's nibbles are 2j, 2j+1
    high = _fields(b[:, 2:4], 2).transpose(0, 2, 1).reshape(-1, 8)  # (N, 8): u16 bits 2k..2k+1
    ls = (low | high << np.uint8(4)).view(np.int8) - np.int8(32)  # (N, 8) in -32..31
    q = IQ4_LEVELS[_fields(b[:, 8:136].reshape(-1, 8, 16), 4).reshape(-1, 256)]  # (N, 256)
    return CodeParts("int8", 32, q, _f16(b, 0) * ls, None)


# ---------------------------------------------------------------------------------------------------
# The grid i-quants: (N, T) bytes -> float32 (N, 256), no code form. Each run of 8 weights (4 for IQ3)
# is a row of a lookup grid (ggml_iq_tables) times a scale per S-th of the block, with signs or a shift.
# The arithmetic is ggml's (dequantize_row_iq*), left to right; every product is exact in float32 anyway.

IQ1_DELTA = np.float32(0.125)  # ggml's IQ1S_DELTA and IQ1M_DELTA
_SEVEN_BIT_FIELDS = np.array([0, 7, 14, 21], dtype=np.uint32)  # the four 7-bit sign indices of a u32
_THREE_BIT_FIELDS = np.array([0, 3, 6, 9], dtype=np.uint16)  # the four 3-bit fields of an IQ1 u16


def _words(x: np.ndarray, dtype: str) -> np.ndarray:
    """(N, L) bytes -> (N, L / size) little-endian words of `dtype` ("<u2" or "<u4")."""
    return np.ascontiguousarray(x).view(dtype)


def _nibbles(x: np.ndarray) -> np.ndarray:
    """(N, L) bytes -> (N, 2L) uint8: nibble 2j is the low one of byte j, nibble 2j + 1 the high one."""
    return _fields(x, 4).transpose(0, 2, 1).reshape(len(x), -1)


def _signed(db: np.ndarray, grid: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """w = db * grid * sign: db (N, S) a scale per S-th of the block, grid and signs (N, ...) of K values each."""
    n, s = db.shape
    w = db[:, :, None] * grid.reshape(n, s, -1)  # (N, S, K / S)
    w *= signs.reshape(n, s, -1)
    return w.reshape(n, -1)  # (N, K)


def _iq2_xxs(b: np.ndarray) -> np.ndarray:
    """IQ2_XXS, 66 bytes per 256 weights in 8 groups of 32:

    0 d f16
    2 + 8k   group k: bytes 0..3  grid index (IQ2_XXS_GRID, 256 x 8) of weights 32k + 8l .. 32k + 8l + 7 (l 0..3)
                      bytes 4..7  u32: bits 7l..7l+6 sign index (EVEN_SIGNS) of the same 8 weights; bits 28..31 ls
    w = d * (0.5 + ls) * 0.25 * grid * sign
    """
    groups = b[:, 2:66].reshape(-1, 8, 8)  # (N, 8, 8 bytes)
    aux = _words(groups[:, :, 4:8], "<u4")[:, :, 0]  # (N, 8)
    db = _f16(b, 0) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.25)  # (N, 8)
    signs = EVEN_SIGNS[(aux[:, :, None] >> _SEVEN_BIT_FIELDS) & np.uint32(127)]  # (N, 8, 4, 8)
    return _signed(db, IQ2_XXS_GRID[groups[:, :, 0:4]], signs)  # grid (N, 8, 4, 8)


def _iq2_xs(b: np.ndarray) -> np.ndarray:
    """IQ2_XS, 74 bytes per 256 weights in 16 groups of 16:

    0 d f16
    2 qs[32] u16  weights 8j .. 8j + 7: bits 0..8 grid index (IQ2_XS_GRID, 512 x 8), bits 9..15 sign index (EVEN_SIGNS)
    66 scales[8]  byte k = hhhh llll: ls of group 2k (low nibble) and group 2k + 1 (high nibble)
    w = d * (0.5 + ls) * 0.25 * grid * sign
    """
    qs = _words(b[:, 2:66], "<u2")  # (N, 32)
    db = _f16(b, 0) * (np.float32(0.5) + _nibbles(b[:, 66:74]).astype(np.float32)) * np.float32(0.25)  # (N, 16)
    return _signed(db, IQ2_XS_GRID[qs & np.uint16(511)], EVEN_SIGNS[qs >> np.uint16(9)])  # (N, 32, 8) each


def _iq2_s(b: np.ndarray) -> np.ndarray:
    """IQ2_S, 82 bytes per 256 weights in 16 groups of 16:

    0 d f16
    2 qs[32]      low 8 bits of the grid index (IQ2_S_GRID, 1024 x 8) of weights 8j .. 8j + 7
    34 signs[32]  bit i of byte j set: weight 8j + i is negative
    66 qh[8]      bits 2l..2l+1 of byte k: bits 8..9 of the grid index of weights 8(4k + l) ..
    74 scales[8]  as IQ2_XS
    w = d * (0.5 + ls) * 0.25 * grid * sign
    """
    high = _fields(b[:, 66:74], 2).transpose(0, 2, 1).reshape(-1, 32)  # (N, 32): field l of byte k is 4k + l
    index = b[:, 2:34].astype(np.uint16) | high.astype(np.uint16) << np.uint16(8)  # (N, 32)
    db = _f16(b, 0) * (np.float32(0.5) + _nibbles(b[:, 74:82]).astype(np.float32)) * np.float32(0.25)  # (N, 16)
    return _signed(db, IQ2_S_GRID[index], BYTE_SIGNS[b[:, 34:66]])  # (N, 32, 8) each


def _iq3_xxs(b: np.ndarray) -> np.ndarray:
    """IQ3_XXS, 98 bytes per 256 weights in 8 groups of 32:

    0 d f16
    2 qs[64]      grid index (IQ3_XXS_GRID, 256 x 4) of weights 4j .. 4j + 3
    66 u32[8]     group k: bits 7l..7l+6 sign index (EVEN_SIGNS) of weights 32k + 8l .. + 7; bits 28..31 ls
    w = d * (0.5 + ls) * 0.5 * grid * sign
    """
    aux = _words(b[:, 66:98], "<u4")  # (N, 8)
    db = _f16(b, 0) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5)  # (N, 8)
    signs = EVEN_SIGNS[(aux[:, :, None] >> _SEVEN_BIT_FIELDS) & np.uint32(127)]  # (N, 8, 4, 8)
    return _signed(db, IQ3_XXS_GRID[b[:, 2:66]], signs)  # grid (N, 64, 4)


def _iq3_s(b: np.ndarray) -> np.ndarray:
    """IQ3_S, 110 bytes per 256 weights in 8 groups of 32:

    0 d f16
    2 qs[64]      low 8 bits of the grid index (IQ3_S_GRID, 512 x 4) of weights 4j .. 4j + 3
    66 qh[8]      bit j % 8 of byte j / 8: bit 8 of that index
    74 signs[32]  as IQ2_S
    106 scales[4] byte k = hhhh llll: ls of group 2k (low nibble) and group 2k + 1 (high nibble)
    w = d * (1 + 2 * ls) * grid * sign
    """
    high = np.unpackbits(b[:, 66:74], axis=1, bitorder="little")  # (N, 64)
    index = b[:, 2:66].astype(np.uint16) | high.astype(np.uint16) << np.uint16(8)  # (N, 64)
    db = _f16(b, 0) * (1 + 2 * _nibbles(b[:, 106:110])).astype(np.float32)  # (N, 8)
    return _signed(db, IQ3_S_GRID[index], BYTE_SIGNS[b[:, 74:106]])  # (N, 64, 4), (N, 32, 8)


def _iq1_s(b: np.ndarray) -> np.ndarray:
    """IQ1_S, 50 bytes per 256 weights in 8 groups of 32:

    0 d f16
    2 qs[32]      low 8 bits of the grid index (IQ1_S_GRID, 2048 x 8, values -1, 0, 1) of weights 8j .. 8j + 7
    34 qh[8] u16  group k: bits 3l..3l+2 are bits 8..10 of the index of weights 32k + 8l .. 32k + 8l + 7;
                  bits 12..14 ls; bit 15 set: the group's delta is negative
    w = d * (2 * ls + 1) * (grid + delta),  delta = ±IQ1_DELTA
    """
    qh = _words(b[:, 34:50], "<u2")  # (N, 8)
    dl = _f16(b, 0) * (2 * ((qh >> 12) & np.uint16(7)) + 1).astype(np.float32)  # (N, 8)
    delta = np.where(qh & np.uint16(0x8000), -IQ1_DELTA, IQ1_DELTA)  # (N, 8)
    high = (qh[:, :, None] >> _THREE_BIT_FIELDS) & np.uint16(7)  # (N, 8, 4)
    index = b[:, 2:34].astype(np.uint16) | high.reshape(-1, 32) << np.uint16(8)  # (N, 32)
    grid = IQ1_S_GRID[index].reshape(-1, 8, 32)  # (N, 8 groups, 32)
    return (dl[:, :, None] * (grid + delta[:, :, None])).reshape(-1, 256)


def _iq1_m(b: np.ndarray) -> np.ndarray:
    """IQ1_M, 56 bytes per 256 weights in 16 groups of 16; the block's f16 d is split over the scale words:

    0 qs[32]      low 8 bits of the grid index (IQ1_S_GRID) of weights 8j .. 8j + 7
    32 qh[16]     nibble j (see _nibbles): bits 0..2 are bits 8..10 of that index; bit 3 set: its delta is negative
    48 sc[4] u16  word i: bits 3l..3l+2 ls of group 4i + l; bits 12..15 are bits 4i..4i+3 of d
    w = d * (2 * ls + 1) * (grid + delta),  delta = ±IQ1_DELTA
    """
    sc = _words(b[:, 48:56], "<u2")  # (N, 4)
    d_parts = (sc >> 12) << np.array([0, 4, 8, 12], dtype=np.uint16)  # (N, 4): nibble i of d's 16 bits
    d_bits = np.bitwise_or.reduce(d_parts, axis=1, keepdims=True)  # (N, 1) u16
    ls = (sc[:, :, None] >> _THREE_BIT_FIELDS) & np.uint16(7)  # (N, 4, 4)
    dl = d_bits.view(np.float16).astype(np.float32) * (2 * ls.reshape(-1, 16) + 1).astype(np.float32)  # (N, 16)
    qh = _nibbles(b[:, 32:48])  # (N, 32)
    index = b[:, 0:32].astype(np.uint16) | (qh & np.uint8(7)).astype(np.uint16) << np.uint16(8)  # (N, 32)
    delta = np.where(qh & np.uint8(8), -IQ1_DELTA, IQ1_DELTA)  # (N, 32)
    grid = IQ1_S_GRID[index].reshape(-1, 16, 2, 8)  # (N, 16 groups, 2 runs, 8)
    return (dl[:, :, None, None] * (grid + delta.reshape(-1, 16, 2, 1))).reshape(-1, 256)


_DECODERS: dict[str, Callable[[np.ndarray], CodeParts]] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "Q8_K": _q8_k,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
}
_GRID_DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "IQ2_XXS": _iq2_xxs,
    "IQ2_XS": _iq2_xs,
    "IQ2_S": _iq2_s,
    "IQ3_XXS": _iq3_xxs,
    "IQ3_S": _iq3_s,
    "IQ1_S": _iq1_s,
    "IQ1_M": _iq1_m,
}
_FLOATS = ("F32", "F16", "BF16")
# Quantized types with no code form: the loader takes them as float matrices (f32, or requantized at load).
DEQUANTIZE_ONLY: tuple[str, ...] = tuple(_GRID_DECODERS)
DECODABLE_TYPES: tuple[str, ...] = (*_FLOATS, *_DECODERS, *DEQUANTIZE_ONLY)

# type -> (kind, group, has_mins) of its compute form; None for the float types.
CODE_FORMS: dict[str, tuple[str, int, bool]] = {
    "Q4_0": ("int4", 32, False),
    "Q4_1": ("int4", 32, True),
    "Q5_0": ("int8", 32, False),
    "Q5_1": ("int8", 32, True),
    "Q8_0": ("int8", 32, False),
    "Q2_K": ("int8", 16, True),
    "Q3_K": ("int8", 16, False),
    "Q4_K": ("int4", 32, True),
    "Q5_K": ("int8", 32, True),
    "Q6_K": ("int8", 16, False),
    "Q8_K": ("int8", 256, False),
    "IQ4_NL": ("int8", 32, False),
    "IQ4_XS": ("int8", 32, False),
}


# ---------------------------------------------------------------------------------------------------
# The two entry points.


def dequantize(type_name: str, raw: np.ndarray, columns: int) -> np.ndarray:
    """float32 (R, C) of a GGUF tensor's rows `raw` (uint8 (R, row bytes)), bit-exact with ggml.

    F32 comes back as a view of `raw` when it can. Types not in DECODABLE_TYPES raise ValueError.
    """
    blocks = _blocks(type_name, raw, columns)  # (N, T) uint8
    rows = raw.shape[0]
    if type_name == "F32":
        return blocks.view(np.float32).reshape(rows, columns)
    if type_name == "F16":
        return blocks.view(np.float16).astype(np.float32).reshape(rows, columns)
    if type_name == "BF16":
        return bf16_to_f32(blocks.view(np.uint16)).reshape(rows, columns)
    if type_name in _GRID_DECODERS:
        return _GRID_DECODERS[type_name](blocks).reshape(rows, columns)  # (N, K) -> (R, C)
    return _DECODERS[type_name](blocks).dequantize().reshape(rows, columns)  # (N, K) -> (R, C)


def compute_parts(type_name: str, raw: np.ndarray, columns: int) -> CodeParts | None:
    """The rows `raw` (uint8 (R, row bytes)) of a GGUF tensor as codes and scales, without requantizing.

    None for the float types and for the types without a code form (DEQUANTIZE_ONLY; see CODE_FORMS).
    `compute_parts(...).dequantize()` is bit-identical to `dequantize(...)`.
    """
    if type_name not in _DECODERS:
        return None
    p = _DECODERS[type_name](_blocks(type_name, raw, columns))  # N = R * C / K rows of one block each
    rows = raw.shape[0]

    def by_row(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.reshape(rows, -1))

    mins = None if p.mins is None else by_row(p.mins)
    return CodeParts(p.kind, p.group, by_row(p.codes), by_row(p.scales), mins, p.offset)


def _blocks(type_name: str, raw: np.ndarray, columns: int) -> np.ndarray:
    """Check `raw` against the type and the column count; the bytes as (N, T) blocks."""
    if type_name not in DECODABLE_TYPES:
        raise ValueError(f"GGUF type {type_name} cannot be decoded by ruvllm; supported: {', '.join(DECODABLE_TYPES)}")
    t = GGML_TYPE_NAMES[type_name]
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 2:
        found = f"{raw.dtype} of shape {raw.shape}" if isinstance(raw, np.ndarray) else type(raw).__name__
        raise ValueError(f"{type_name} data must be a 2-D uint8 array (rows, row bytes), found {found}")
    if columns <= 0 or columns % t.block_size:
        raise ValueError(f"{type_name} rows are whole blocks of {t.block_size} weights; {columns} columns are not")
    if raw.shape[1] != t.row_bytes(columns):
        raise ValueError(
            f"a {type_name} row of {columns} columns takes {t.row_bytes(columns)} bytes, found {raw.shape[1]}"
        )
    return np.ascontiguousarray(raw).reshape(-1, t.type_size)  # (N, T)
