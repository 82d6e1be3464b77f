"""Weight matrices in their compute form: how a matrix lives in memory while the model runs.

Three forms, one interface (`matrix(x)` for x @ W.T, `matrix.rows(ids)` for embedding lookups):

    DenseMatrix  float32 (N, K)                      4 bytes/weight; the fastest everywhere
    Int8Matrix   int8 codes (N, K) + f32 scales/mins  ~1.1 bytes/weight; exact for every quantized format
    Int4Matrix   packed nibbles (N, K/2) + scales     ~0.6 bytes/weight; exact for 4-bit ones (Q4_K too)

Quantized forms store w[n, k] = scale[n, g] * code[n, k] + min[n, g] (g = k // group; no min for
symmetric formats), so every storage format maps onto them without loss (formats.py; GGUF's K-quants
in files/ggml.py). The group is a property of the matrix: 32 for most formats, 16 for Q6_K, Q3_K and
Q2_K (an Int4Matrix always packs groups of 32).

Dimension letters: T rows of x, N output features, K input features, G = K / group groups.

A kernel provider (provider.py; the WebAssembly SIMD one inside Pyodide) may take over a matrix's
product with `use_provider`. Otherwise NumPy computes it, with one of two kernels picked per runtime at
load: "blas" (`x @ W.T`, fastest where NumPy has a BLAS, i.e. CPython) and "einsum"
(`np.einsum("tk,nk->tn")`: NumPy inside Pyodide has no BLAS and no SIMD, and there einsum runs 1.5-2x
faster than `@`; measured, see docs/performance.md).

With "blas", a quantized matrix is multiplied tile by tile: a block of rows is cast to float32 into a
buffer small enough to stay in the core's L2 cache, and BLAS multiplies it there. Memory traffic is
then the 1 (or 1/2) byte per weight of the codes instead of the 4 of a float32 matrix, which is what
bounds decoding on a CPU, so q8 decodes faster than f32 on CPython.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from ..files import ggml
from ..files.formats import GROUP, GGMLBlocks, code_layout, get_format, packs_nibbles
from .provider import KernelProvider

KERNELS = ("blas", "einsum")
# Above this many rows of x, a quantized matrix is expanded to float32 for the product (one
# expansion serves all rows); at or below it, codes are contracted group by group without expanding.
_EXPAND_ABOVE_ROWS = 4
# Float32 elements of one tile in the tiled "blas" product: 1 MiB, inside a core's L2 cache.
TILE_ELEMENTS = 1 << 18


class MatrixLike(Protocol):
    """The one interface: what the model asks of a matrix, met by the three forms here and by the
    wrappers that behave like their base matrix (a LoRA or X-LoRA adapter's)."""

    @property
    def shape(self) -> tuple[int, ...]: ...  # (N, K)

    @property
    def kernel(self) -> str: ...

    @property
    def nbytes(self) -> int: ...

    def __call__(self, x: np.ndarray) -> np.ndarray: ...  # (T, K) -> (T, N)

    def rows(self, ids: np.ndarray) -> np.ndarray: ...  # (T,) -> (T, K)

    def dequantize(self) -> np.ndarray: ...  # (N, K) float32


class ProviderSlot:
    """Where a kernel provider (provider.py) puts a matrix's product; None: NumPy computes it."""

    provider: KernelProvider | None = None
    _product: Callable[[np.ndarray], np.ndarray] | None = None

    def use_provider(self, provider: KernelProvider | None) -> None:
        self.provider = provider
        self._product = None if provider is None else provider.prepare(self)
        take_parts = getattr(provider, "take_parts", None)
        if take_parts is not None and self._product is not None:
            take_parts(self, self._product)  # the provider's memory becomes the home of the arrays


def dense_product(x: np.ndarray, w: np.ndarray, kernel: str) -> np.ndarray:
    if kernel == "einsum":
        return np.einsum("tk,nk->tn", x, w)  # (T, N)
    return x @ w.T  # (T, N)


class DenseMatrix(ProviderSlot):
    form = "f32"

    def __init__(self, weight: np.ndarray, kernel: str = "blas") -> None:
        self.weight = np.ascontiguousarray(weight, dtype=np.float32)  # (N, K)
        self.kernel = kernel
        self.shape = self.weight.shape

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self._product is not None:
            return self._product(x)  # (T, N)
        return dense_product(x, self.weight, self.kernel)  # (T, N)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.weight[ids]  # (T, K)

    def dequantize(self) -> np.ndarray:
        return np.asarray(self.weight)  # (a provider's stand-in for the array: a copy)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes

    @staticmethod
    def planned_nbytes(shape: tuple[int, ...], fmt: str) -> int:
        return shape[0] * shape[1] * 4


class Int8Matrix(ProviderSlot):
    """w = scales * codes (+ mins), codes int8, one scale (and min) per group of `group` along K."""

    form = "q8"
    PARTS = 1  # a decoding tile holds each group's codes in this many contiguous parts (see Int4Matrix)
    offset: int | np.int8 = 0  # subtracted from every code (Int4Matrix: 8 for q4_0)
    group = GROUP

    def __init__(
        self,
        codes: np.ndarray,
        scales: np.ndarray,
        mins: np.ndarray | None = None,
        kernel: str = "blas",
        group: int = GROUP,
    ) -> None:
        N, K = codes.shape
        self.codes = np.ascontiguousarray(codes, dtype=np.int8)  # (N, K)
        self.scales = np.ascontiguousarray(scales, dtype=np.float32)  # (N, G)
        self.mins = None if mins is None else np.ascontiguousarray(mins, dtype=np.float32)  # (N, G)
        self.kernel = kernel
        self.group = group
        self.shape = (N, K)
        assert self.scales.shape == (N, K // group), (self.scales.shape, N, K, group)

    @classmethod
    def from_parts(cls, fmt: str, parts: dict[str, np.ndarray], kernel: str = "blas") -> Int8Matrix:
        """A q8 tensor's codes as they are; 4-bit codes (q4_0, q4_1, GGUF Q4_K ...) unpacked into int8;
        GGUF blocks decoded into codes, scales and mins (files/ggml.py): all exact."""
        if fmt == "q8":
            return cls(parts[""], parts[".scales"].astype(np.float32), None, kernel)
        if packs_nibbles(fmt):
            packed = Int4Matrix.from_parts(fmt, parts, kernel)
            return cls(packed._codes(), packed.scales, packed.mins, kernel)
        code = _ggml_codes(fmt, parts)
        return cls(code.codes, code.scales, code.mins, kernel, code.group)

    @staticmethod
    def planned_nbytes(shape: tuple[int, ...], fmt: str) -> int:
        """Bytes of an (N, K) matrix of storage format `fmt` in this form: codes, scales (and mins)."""
        return shape[0] * shape[1] + group_bytes(shape, fmt)

    def _codes(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        return self.codes[rows]  # (n, K) int8

    def dequantize(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        K, g = self.shape[1], self.group
        codes = self._codes(rows)  # (n, K)
        w = codes.reshape(-1, K // g, g) * self.scales[rows][..., None]  # (n, G, group) f32
        if self.mins is not None:
            w += self.mins[rows][..., None]
        return w.reshape(-1, K)  # (n, K)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self._product is not None:
            return self._product(x)  # (T, N)
        T = x.shape[0]
        if self.kernel == "blas":
            return self._tiled(x) if T > _EXPAND_ABOVE_ROWS else self._tiled_grouped(x)
        if T > _EXPAND_ABOVE_ROWS:
            return dense_product(x, self.dequantize(), self.kernel)  # (T, N)
        (N, K), g = self.shape, self.group
        xg = x.reshape(T, K // g, g)  # (T, G, group)
        per_group = np.einsum("tgk,ngk->tng", xg, self._codes().reshape(N, K // g, g))  # (T, N, G)
        y = np.einsum("tng,ng->tn", per_group, self.scales)  # (T, N)
        if self.mins is not None:
            y += xg.sum(axis=-1) @ self.mins.T  # (T, G) @ (G, N)
        return y

    def _tile_rows(self) -> int:
        return max(1, min(self.shape[0], TILE_ELEMENTS // self.shape[1]))

    def _tiled(self, x: np.ndarray) -> np.ndarray:
        """x @ W.T for many rows of x: each tile of W dequantized in cache, then one BLAS product."""
        N, step = self.shape[0], self._tile_rows()
        y = np.empty((x.shape[0], N), dtype=np.float32)  # (T, N)
        for r0 in range(0, N, step):
            rows = slice(r0, min(N, r0 + step))
            np.matmul(x, self.dequantize(rows).T, out=y[:, rows])
        return y

    def _cast_codes(self, rows: slice, out: np.ndarray) -> None:
        """The codes of `rows` as float32 into `out` (PARTS, n, K / PARTS)."""
        np.copyto(out[0], self.codes[rows])

    def _tiled_grouped(self, x: np.ndarray) -> np.ndarray:
        """x @ W.T for a few rows of x (decoding): codes cast to float32 one tile at a time, products per
        group by BLAS (a stack of (n, group / PARTS) @ (group / PARTS, T) products), then scaled and summed."""
        T = x.shape[0]
        (N, K), step, P = self.shape, self._tile_rows(), self.PARTS
        G, H = K // self.group, self.group // P
        xp = np.ascontiguousarray(x.reshape(T, G, P, H).transpose(2, 1, 3, 0))  # (P, G, H, T)
        tile = np.empty((P, step, K // P), dtype=np.float32)  # (P, n, K/P)
        per_group = np.empty((P, G, step, T), dtype=np.float32)  # (P, G, n, T)
        y = np.empty((T, N), dtype=np.float32)  # (T, N)
        for r0 in range(0, N, step):
            rows = slice(r0, min(N, r0 + step))
            n = rows.stop - r0
            self._cast_codes(rows, tile[:, :n])  # in cache
            w = tile[:, :n].reshape(P, n, G, H).transpose(0, 2, 1, 3)  # (P, G, n, H)
            p = per_group[:, :, :n]
            np.matmul(w, xp, out=p)  # (P, G, n, T)
            y[:, rows] = np.einsum("pgnt,ng->tn", p, self.scales[rows])
        xsum = xp.sum(axis=(0, 2)).T  # (T, G)
        if self.mins is not None:
            y += xsum @ self.mins.T  # (T, G) @ (G, N)
        if self.offset:  # codes stored + offset: take offset * scale * sum(x) per group back out
            y -= float(self.offset) * (xsum @ self.scales.T)
        return y

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.dequantize(ids)  # (T, K)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes + (0 if self.mins is None else self.mins.nbytes)


class Int4Matrix(Int8Matrix):
    """Packed 4-bit codes (ggml nibble order, see formats.py), unpacked to int8 on every use.

    `offset` is subtracted from each code (8 for q4_0, whose codes are centred; 0 for q4_1).
    """

    form = "q4"
    PARTS = 2  # low nibbles, then high nibbles

    def __init__(
        self, packed: np.ndarray, scales: np.ndarray, mins: np.ndarray | None, offset: int, kernel: str = "blas"
    ) -> None:
        N, half = packed.shape
        self.packed = np.ascontiguousarray(packed, dtype=np.uint8)  # (N, K/2)
        self.offset = np.int8(offset)
        self.scales = np.ascontiguousarray(scales, dtype=np.float32)  # (N, G)
        self.mins = None if mins is None else np.ascontiguousarray(mins, dtype=np.float32)  # (N, G)
        self.kernel = kernel
        self.shape = (N, half * 2)

    def _codes(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        K = self.shape[1]
        packed = self.packed[rows]  # (n, K/2)
        n = packed.shape[0]
        blocks = packed.reshape(n, K // GROUP, GROUP // 2)  # (n, G, 16)
        codes = np.empty((n, K // GROUP, GROUP), dtype=np.uint8)  # (n, G, 32)
        np.bitwise_and(blocks, np.uint8(15), out=codes[..., : GROUP // 2])
        np.right_shift(blocks, np.uint8(4), out=codes[..., GROUP // 2 :])
        codes = codes.view(np.int8).reshape(n, K)  # (n, K), values 0..15
        if self.offset:
            codes -= self.offset
        return codes

    def _cast_codes(self, rows: slice, out: np.ndarray) -> None:
        """Low nibbles (weights 0-15 of each group of 32) into out[0], high nibbles (16-31) into out[1]:
        two contiguous casts, no 16-wide interleaving loop."""
        packed = self.packed[rows]  # (n, K/2)
        nibbles = np.bitwise_and(packed, np.uint8(15))
        np.copyto(out[0], nibbles)
        np.right_shift(packed, np.uint8(4), out=nibbles)
        np.copyto(out[1], nibbles)

    @classmethod
    def from_parts(cls, fmt: str, parts: dict[str, np.ndarray], kernel: str = "blas") -> Int4Matrix:
        """A q4_0 or q4_1 tensor as it is stored (q4_0's codes are centred: offset 8); GGUF 4-bit blocks
        (Q4_0, Q4_1, Q4_K) repacked into the same nibble order."""
        if fmt.startswith("ggml:"):
            code = _ggml_codes(fmt, parts)
            return cls(code.codes, code.scales, code.mins, offset=code.offset, kernel=kernel)
        mins = parts[".mins"].astype(np.float32) if fmt == "q4_1" else None
        offset = 8 if fmt == "q4_0" else 0
        return cls(parts[""], parts[".scales"].astype(np.float32), mins, offset=offset, kernel=kernel)

    @staticmethod
    def planned_nbytes(shape: tuple[int, ...], fmt: str) -> int:
        return shape[0] * shape[1] // 2 + group_bytes(shape, fmt)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes + (0 if self.mins is None else self.mins.nbytes)


def _ggml_codes(fmt: str, parts: dict[str, np.ndarray]):
    """The codes, scales and mins of a GGUF tensor's blocks (files/ggml.py)."""
    f = get_format(fmt)
    assert isinstance(f, GGMLBlocks), f"{fmt} is not a format of GGUF blocks"
    t = f.type
    blocks = parts[""]  # (N, bytes per row)
    return ggml.compute_parts(t.name, blocks, blocks.shape[1] // t.type_size * t.block_size)


def group_bytes(shape: tuple[int, ...], fmt: str) -> int:
    """float32 scales, and mins for the formats that have them, one per group."""
    group, has_mins = code_layout(fmt)
    return shape[0] * (shape[1] // group) * 4 * (2 if has_mins else 1)
