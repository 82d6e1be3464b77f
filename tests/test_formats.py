"""Storage formats: quantizers byte-identical to ggml's reference (via gguf-py), exact dequantization."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")

import torch
from gguf import GGMLQuantizationType, quants

from ruvllm.errors import LoadError
from ruvllm.files.formats import FORMATS, get_format

pytestmark = pytest.mark.parity

GGML = {"q8": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1}
# Bytes of each part inside one ggml block of 32 weights: suffix -> (start, end, dtype)
BLOCK_PARTS = {
    "q8": (34, {".scales": (0, 2, np.float16), "": (2, 34, np.int8)}),
    "q4_0": (18, {".scales": (0, 2, np.float16), "": (2, 18, np.uint8)}),
    "q4_1": (20, {".scales": (0, 2, np.float16), ".mins": (2, 4, np.float16), "": (4, 20, np.uint8)}),
}


def weights(rows: int = 48, cols: int = 160) -> np.ndarray:
    rng = np.random.default_rng(42)
    w = rng.normal(0, 0.05, size=(rows, cols)).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block (scale 0)
    w[1, :32] = 0.25  # a constant block
    w[2, 5] = 3.0  # an outlier
    w[3, 32:64] = np.linspace(-1, 1, 32)  # values that land exactly on rounding ties
    return w


@pytest.mark.parametrize("name", ["q8", "q4_0", "q4_1"])
def test_quantize_is_byte_identical_to_ggml(name):
    w = weights()
    ours = get_format(name).quantize(w)
    reference = quants.quantize(w, GGML[name])  # (R, B * block_bytes) uint8
    block_bytes, layout = BLOCK_PARTS[name]
    blocks = reference.reshape(w.shape[0], -1, block_bytes)
    for suffix, (lo, hi, dtype) in layout.items():
        expected = np.ascontiguousarray(blocks[..., lo:hi]).view(dtype).reshape(w.shape[0], -1)
        np.testing.assert_array_equal(ours[suffix], expected, err_msg=f"{name}{suffix}")


@pytest.mark.parametrize("name", ["q8", "q4_0", "q4_1"])
def test_dequantize_matches_ggml(name):
    w = weights()
    reference_blocks = quants.quantize(w, GGML[name])
    expected = quants.dequantize(reference_blocks, GGML[name])
    got = get_format(name).dequantize(get_format(name).quantize(w), w.shape)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", ["q8", "q4_0", "q4_1"])
def test_quantization_error_is_about_half_a_step(name):
    w = weights()
    fmt = get_format(name)
    blocks = w.reshape(w.shape[0], -1, 32)
    error = np.abs(fmt.dequantize(fmt.quantize(w), w.shape) - w).reshape(blocks.shape).max(axis=-1)
    amax = np.abs(blocks).max(axis=-1)
    # Step sizes as ggml picks them; codes are rounded with the f32 scale but stored with an f16 one,
    # which adds at most (largest code) * 2^-11 relative error on top of half a step.
    if name == "q8":
        step, slack = amax / 127, 127 * amax / 127 * 2.0**-11
    elif name == "q4_0":  # the extreme sits on code 0; the other side can lose one full step at code 15
        step, slack = 2 * amax / 8, 8 * amax / 8 * 2.0**-11
    else:
        spread = blocks.max(axis=-1) - blocks.min(axis=-1)
        step, slack = spread / 15, 15 * spread / 15 * 2.0**-11 + amax * 2.0**-11
    assert np.all(error <= step / 2 + slack + 1e-7)


def test_float_formats():
    w = weights()
    np.testing.assert_array_equal(FORMATS["f32"].dequantize(FORMATS["f32"].quantize(w), w.shape), w)
    np.testing.assert_array_equal(
        FORMATS["f16"].dequantize(FORMATS["f16"].quantize(w), w.shape), w.astype(np.float16).astype(np.float32)
    )
    bf16 = FORMATS["bf16"].dequantize(FORMATS["bf16"].quantize(w), w.shape)
    np.testing.assert_array_equal(bf16, torch.from_numpy(w).to(torch.bfloat16).float().numpy())


def test_sizes_and_errors():
    assert get_format("q4_1").nbytes((64, 128)) == 64 * 64 + 2 * (64 * 4 * 2)
    assert get_format("q8").nbytes((64, 128)) == 64 * 128 + 64 * 4 * 2
    with pytest.raises(
        ValueError, match=r"format q4_0 needs a 2-D tensor with a multiple of 32 columns, got shape \(4, 20\)"
    ):
        get_format("q4_0").quantize(np.zeros((4, 20), np.float32))
    with pytest.raises(LoadError, match="unknown storage format 'q3'; expected one of f32, f16, bf16, q8, q4_0, q4_1"):
        get_format("q3")
