"""Integer codes of the KV cache's cold positions: the one quantizer both caches use (the solo cache's
cold tier, model/cache.py, and the paged pool's cold blocks, model/blocks.py).

Each row of E values (one head at one position) gets one float32 scale: x = scale * code, the code
symmetric (files/formats.py's `quantize_symmetric`, ggml's Q8_0 rounding, the same rule as the q8
weights). The rounding rule stays in files/ because the q8 storage format is made of it and files/ sits
below quant/ (tests/test_layers.py); what is the cache's own, the code widths and the int4 packing,
lives here.

Dimension letters: E head size; `...` any leading axes (heads, positions, blocks).
"""

from __future__ import annotations

import numpy as np

from ..files.formats import quantize_symmetric
from ..files.ggml import pack_nibbles, unpack_nibbles


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """(..., E) codes in [-8, 7] -> (..., E/2) bytes: stored + 8, in the weights' nibble order."""
    return pack_nibbles((codes + np.int8(8)).view(np.uint8))


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_int4: int8 codes (..., E)."""
    return unpack_nibbles(packed).view(np.int8) - np.int8(8)


class KVCodes:
    """Symmetric codes of `bits` (8 or 4) per value with one float32 scale per row.

    int8: codes (..., E)    int8, one per byte, in [-127, 127]
    int4: codes (..., E/2)  uint8, two per byte: byte j = (q[j] + 8) | (q[j + E/2] + 8) << 4, q in [-7, 7]
          scales (...)      float32, x = scale * q
    """

    def __init__(self, bits: int) -> None:
        assert bits in (4, 8), bits
        self.bits = bits
        self.dtype = np.dtype(np.int8 if bits == 8 else np.uint8)

    def width(self, head_dim: int) -> int:
        """Stored bytes per row of `head_dim` values."""
        return head_dim if self.bits == 8 else head_dim // 2

    def quantize(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x (..., E) float32 -> stored codes (..., width) and scales (...)."""
        codes, scales = quantize_symmetric(x, self.bits)  # (..., E) int8, (...)
        return (pack_int4(codes) if self.bits == 4 else codes), scales

    def unpack(self, stored: np.ndarray) -> np.ndarray:
        """Stored codes (..., width) -> int8 codes (..., E)."""
        return unpack_int4(stored) if self.bits == 4 else stored

    def dequantize(self, stored: np.ndarray, scales: np.ndarray) -> np.ndarray:
        """Stored codes (..., width) and scales (...) -> float32 (..., E)."""
        return self.unpack(stored) * scales[..., None]  # (..., E)
