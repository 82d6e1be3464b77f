"""ggml block decoders: bit-exact with gguf-py's dequantize, and code parts that rebuild the same floats.

Dimension letters: R rows, C columns, G groups per row, g weights per group.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")

import gguf
from gguf.quants import dequantize as gguf_dequantize

from ruvllm.files.formats import pack_nibbles
from ruvllm.files.ggml import (
    CODE_FORMS,
    DECODABLE_TYPES,
    DEQUANTIZE_ONLY,
    GGML_TYPE_NAMES,
    bytes_per_weight,
    compute_parts,
    dequantize,
)
from ruvllm.files.ggml_iq_tables import (
    BYTE_SIGNS,
    EVEN_SIGNS,
    IQ1_S_GRID,
    IQ2_S_GRID,
    IQ2_XS_GRID,
    IQ2_XXS_GRID,
    IQ3_S_GRID,
    IQ3_XXS_GRID,
)

pytestmark = pytest.mark.parity

# Byte offsets of every f16 field inside one block (scales and mins); random bytes there could be NaN/inf.
F16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
QUANTIZED = tuple(F16_FIELDS)  # the types gguf-py can check
# The same for the float32-only grid i-quants: d at byte 0, but IQ1_M's is split over four nibbles (set_iq1_m_scale).
# Kept out of F16_FIELDS: test_gguf_families builds models of every type listed there; the loader cannot take these yet.
GRID_F16_FIELDS = {name: () if name == "IQ1_M" else (0,) for name in DEQUANTIZE_ONLY}
ROWS, COLUMNS = 3, 512


def finite_f16_bits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random f16 bit patterns over the whole finite range: any sign and mantissa, exponent 0..30."""
    bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16) & np.uint16(0x83FF)
    return bits | (rng.integers(0, 31, shape, dtype=np.uint16) << np.uint16(10))


def random_rows(type_name: str, rng: np.random.Generator, rows: int = ROWS, columns: int = COLUMNS) -> np.ndarray:
    """uint8 (R, row bytes) of random blocks whose f16 fields are finite."""
    t = GGML_TYPE_NAMES[type_name]
    raw = rng.integers(0, 256, (rows, t.row_bytes(columns)), dtype=np.uint8)
    blocks = raw.reshape(-1, t.type_size)  # (N, T) view
    for at in {**F16_FIELDS, **GRID_F16_FIELDS}.get(type_name, ()):
        blocks[:, at : at + 2] = finite_f16_bits(rng, (len(blocks), 1)).view(np.uint8)
    if type_name == "IQ1_M":
        set_iq1_m_scale(blocks, finite_f16_bits(rng, (len(blocks), 1)))
    return raw


def set_iq1_m_scale(blocks: np.ndarray, bits: np.ndarray) -> None:
    """Write f16 bit patterns (N, 1) as IQ1_M's d: bits 4i..4i+3 are the top nibble of the u16 at byte 48 + 2i."""
    nibbles = ((bits >> np.array([0, 4, 8, 12], dtype=np.uint16)) & np.uint16(15)).astype(np.uint8)  # (N, 4)
    blocks[:, 49:56:2] = (blocks[:, 49:56:2] & np.uint8(15)) | nibbles << np.uint8(4)


def reference(type_name: str, raw: np.ndarray, columns: int) -> np.ndarray:
    return gguf_dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(raw.shape[0], columns)


def assert_same_bits(found: np.ndarray, expected: np.ndarray) -> None:
    """Equal as float32 bit patterns (so -0.0 != 0.0 and NaNs compare by payload)."""
    assert found.dtype == np.float32 and found.shape == expected.shape
    diff = found.view(np.uint32) != expected.view(np.uint32)
    assert not diff.any(), f"{diff.sum()} of {diff.size} values differ, first at {np.argwhere(diff)[0]}"


def rebuild(parts) -> np.ndarray:
    """The contract, written out here rather than trusting CodeParts.dequantize: f32(code) * scale + min."""
    rows, groups = parts.scales.shape
    if parts.kind == "int4":
        packed = parts.codes.reshape(rows, groups, 16)  # (R, G, 16)
        codes = np.concatenate([packed & 15, packed >> 4], axis=-1).astype(np.int16) - parts.offset  # (R, G, 32)
    else:
        codes = parts.codes.reshape(rows, groups, parts.group)  # (R, G, g)
    w = codes.astype(np.float32) * parts.scales[:, :, None]  # (R, G, g)
    if parts.mins is not None:
        w = w + parts.mins[:, :, None]
    return w.reshape(rows, -1)  # (R, C)


@pytest.mark.parametrize("type_name", [*QUANTIZED, *DEQUANTIZE_ONLY, "F32", "F16", "BF16"])
def test_dequantize_matches_gguf_bit_for_bit(type_name):
    raw = random_rows(type_name, np.random.default_rng(1))
    assert_same_bits(dequantize(type_name, raw, COLUMNS), reference(type_name, raw, COLUMNS))


@pytest.mark.parametrize("type_name", QUANTIZED)
def test_code_parts_rebuild_gguf_values_bit_for_bit(type_name):
    raw = random_rows(type_name, np.random.default_rng(2))
    expected = reference(type_name, raw, COLUMNS)
    parts = compute_parts(type_name, raw, COLUMNS)
    assert_same_bits(rebuild(parts), expected)
    assert_same_bits(parts.dequantize(), expected)


@pytest.mark.parametrize("type_name", QUANTIZED)
def test_code_parts_have_the_documented_shapes_and_dtypes(type_name):
    raw = random_rows(type_name, np.random.default_rng(3))
    parts = compute_parts(type_name, raw, COLUMNS)
    kind, group, has_mins = CODE_FORMS[type_name]
    assert (parts.kind, parts.group, parts.mins is not None) == (kind, group, has_mins)
    width = COLUMNS // 2 if kind == "int4" else COLUMNS
    assert parts.codes.shape == (ROWS, width) and parts.codes.flags.c_contiguous
    assert parts.codes.dtype == (np.uint8 if kind == "int4" else np.int8)
    assert parts.scales.shape == (ROWS, COLUMNS // group) and parts.scales.dtype == np.float32
    if has_mins:
        assert parts.mins.shape == parts.scales.shape and parts.mins.dtype == np.float32
    assert parts.offset == (8 if type_name == "Q4_0" else 0)


@pytest.mark.parametrize(
    ("type_name", "low", "high"),
    [("Q5_0", -16, 15), ("Q5_1", 0, 31), ("Q2_K", 0, 3), ("Q3_K", -4, 3), ("Q5_K", 0, 31), ("Q6_K", -32, 31)],
)
def test_int8_codes_span_exactly_their_range(type_name, low, high):
    parts = compute_parts(type_name, random_rows(type_name, np.random.default_rng(4), rows=8), COLUMNS)
    assert (int(parts.codes.min()), int(parts.codes.max())) == (low, high)


def test_q8_k_is_its_f32_scale_times_the_int8_codes():
    # gguf-py has no Q8_K decoder; ggml's dequantize_row_q8_K is y = d * q.
    rng = np.random.default_rng(5)
    raw = random_rows("Q8_K", rng, rows=2, columns=512)
    blocks = raw.reshape(-1, 292)  # (N, T)
    d = rng.normal(0, 1e-2, len(blocks)).astype(np.float32)
    blocks[:, 0:4] = d.view(np.uint8).reshape(-1, 4)
    expected = (blocks[:, 4:260].view(np.int8).astype(np.float32) * d[:, None]).reshape(2, 512)
    assert_same_bits(dequantize("Q8_K", raw, 512), expected)
    parts = compute_parts("Q8_K", raw, 512)
    assert (parts.kind, parts.group, parts.scales.shape) == ("int8", 256, (2, 2))
    assert_same_bits(rebuild(parts), expected)


def test_q4_0_codes_keep_ggml_nibble_order():
    q = np.array([*range(16), *range(15, -1, -1)], dtype=np.uint8)  # weights 0..31
    qs = q[:16] | (q[16:] << 4)  # byte j = q[j] | q[j + 16] << 4
    block = np.concatenate([np.array([0.5], np.float16).view(np.uint8), qs])[None, :]  # (1, 18)
    parts = compute_parts("Q4_0", block, 32)
    assert parts.codes.tolist() == [qs.tolist()]
    assert parts.offset == 8
    assert dequantize("Q4_0", block, 32).tolist() == [(0.5 * (q.astype(np.float32) - 8)).tolist()]


def test_q4_k_codes_are_repacked_into_ruvllm_nibble_order():
    codes = (np.arange(256) * 7 % 16).astype(np.uint8)  # weight w has code 7w mod 16
    by_chunk = codes.reshape(4, 2, 32)  # (chunk, half, 32): weights 64j + 32h + i
    qs = (by_chunk[:, 0] | by_chunk[:, 1] << 4).reshape(128)  # low nibbles first half, high second
    scales = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)  # sc = 1, m = 0 for all 8 groups
    head = np.array([1.0, 0.0], np.float16).view(np.uint8)  # d = 1, dmin = 0
    block = np.concatenate([head, scales, qs])[None, :]  # (1, 144)
    parts = compute_parts("Q4_K", block, 256)
    assert parts.codes.tolist() == [pack_nibbles(codes.reshape(8, 32)).reshape(128).tolist()]
    assert parts.scales.tolist() == [[1.0] * 8]
    assert dequantize("Q4_K", block, 256).tolist() == [codes.astype(np.float32).tolist()]


# ---------------------------------------------------------------------------------------------------
# The grid i-quants: float32 only.


@pytest.mark.parametrize("type_name", DEQUANTIZE_ONLY)
def test_grid_types_decode_to_float32_rows_and_have_no_code_form(type_name):
    raw = random_rows(type_name, np.random.default_rng(7), rows=5, columns=768)
    w = dequantize(type_name, raw, 768)
    assert w.shape == (5, 768) and w.dtype == np.float32 and w.flags.c_contiguous
    assert np.isfinite(w).all()
    assert compute_parts(type_name, raw, 768) is None
    assert type_name in DECODABLE_TYPES and type_name not in CODE_FORMS


@pytest.mark.parametrize("type_name", DEQUANTIZE_ONLY)
def test_grid_types_keep_the_sign_of_zero_scales(type_name):
    # d = +0: every weight is 0.0 or -0.0 (a minus sign, or a negative grid + delta in IQ1), as in ggml.
    raw = random_rows(type_name, np.random.default_rng(8))
    blocks = raw.reshape(-1, GGML_TYPE_NAMES[type_name].type_size)  # (N, T) view
    zero = np.zeros((len(blocks), 1), np.uint16)
    for at in GRID_F16_FIELDS[type_name]:
        blocks[:, at : at + 2] = zero.view(np.uint8)
    if type_name == "IQ1_M":
        set_iq1_m_scale(blocks, zero)
    w = dequantize(type_name, raw, COLUMNS)
    assert (w == 0).all() and np.signbit(w).any() and not np.signbit(w).all()
    assert_same_bits(w, reference(type_name, raw, COLUMNS))


@pytest.mark.parametrize("type_name", DEQUANTIZE_ONLY)
def test_grid_types_decode_a_2048_square_bit_for_bit(type_name):
    # 16384 blocks reach nearly every grid row (their speed: benchmarks/gguf_bench.py)
    raw = random_rows(type_name, np.random.default_rng(9), rows=2048, columns=2048)
    w = dequantize(type_name, raw, 2048)
    assert_same_bits(w, reference(type_name, raw, 2048))


@pytest.mark.parametrize(
    ("type_name", "grid", "shape"),
    [
        ("IQ2_XXS", IQ2_XXS_GRID, (256, 8)),
        ("IQ2_XS", IQ2_XS_GRID, (512, 8)),
        ("IQ2_S", IQ2_S_GRID, (1024, 8)),
        ("IQ3_XXS", IQ3_XXS_GRID, (256, 4)),
        ("IQ3_S", IQ3_S_GRID, (512, 4)),
        ("IQ1_S", IQ1_S_GRID, (2048, 8)),
    ],
)
def test_grids_hold_every_ggml_grid_row(type_name, grid, shape):
    # Random blocks reach only some rows; gguf-py's own tables are the reference for all of them.
    quant = getattr(gguf.quants, type_name)
    quant.init_grid()
    assert grid.shape == shape and grid.dtype == np.float32 and not grid.flags.writeable
    assert_same_bits(grid, quant.grid.reshape(shape))


def test_sign_tables_are_ggml_sign_bytes():
    ksigns = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)  # ggml's ksigns_iq2xs (128,)
    assert EVEN_SIGNS.tolist() == BYTE_SIGNS[ksigns].tolist()
    assert BYTE_SIGNS[0b10000001].tolist() == [-1, 1, 1, 1, 1, 1, 1, -1]  # bit i set: weight i negative
    assert (np.sum(EVEN_SIGNS < 0, axis=1) % 2 == 0).all()


def test_iq2_xxs_block_follows_the_documented_layout():
    # d = 1, ls = 3: db = (0.5 + 3) / 4 = 0.875. Run 0 of group 0: grid row 1 (weight 0 is 43, the rest 8),
    # sign index 1 (weights 0 and 7 negative); every other run: grid row 0, no signs.
    block = np.zeros(66, np.uint8)
    block[0:2] = np.array([1.0], np.float16).view(np.uint8)
    block[2 + 8 * np.arange(8) + 7] = 3 << 4  # top nibble of each group's u32: ls = 3
    block[2] = 1  # grid index of run 0
    block[2 + 4] = 1  # sign index of run 0 (bits 0..6 of the u32)
    w = dequantize("IQ2_XXS", block[None, :], 256)
    expected = np.full(256, 8 * 0.875, np.float32)
    expected[0], expected[7] = -43 * 0.875, -8 * 0.875
    assert_same_bits(w, expected[None, :])


def test_iq1_m_reads_its_f16_scale_from_the_top_nibbles_of_the_scale_words():
    # d = 1.0 = 0x3C00: nibbles 0, 0, 0xC, 0x3 in the top of the u16s at bytes 48, 50, 52, 54. ls = 0, so
    # dl = 1; grid row 0 is all -1 and delta +0.125, so every weight is -0.875 ...
    block = np.zeros(56, np.uint8)
    block[53], block[55] = 0xC0, 0x30
    expected = np.full(256, -0.875, np.float32)
    # ... except weights 8..15, whose qh nibble (high nibble of byte 32) has the delta bit set, and 16..31,
    # whose ls (bits 3..5 of the first word) is 1: dl = 3.
    block[32] = 0x80
    block[48] = 1 << 3
    expected[8:16] = -1.125
    expected[16:32] *= 3
    assert_same_bits(dequantize("IQ1_M", block[None, :], 256), expected[None, :])


def test_float_types_have_no_code_form():
    for type_name in ("F32", "F16", "BF16"):
        raw = random_rows(type_name, np.random.default_rng(6))
        assert compute_parts(type_name, raw, COLUMNS) is None


def test_gemma_tensors_decode_bit_for_bit(gemma_gguf):
    reader = gguf.GGUFReader(gemma_gguf)
    smallest = {}
    for t in reader.tensors:
        if len(t.shape) == 2 and (
            t.tensor_type.name not in smallest or t.n_bytes < smallest[t.tensor_type.name].n_bytes
        ):
            smallest[t.tensor_type.name] = t
    assert {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"} <= set(smallest) | {"F32"}
    # Gemma's F32 tensors are 1-D norms; a vector is one row.
    norm = next(t for t in reader.tensors if t.tensor_type.name == "F32")
    for t in [norm, *(smallest[name] for name in ("Q5_0", "Q8_0", "Q4_K", "Q6_K"))]:
        name, columns = t.tensor_type.name, int(t.shape[0])  # ggml lists [in, out]
        raw = np.asarray(t.data).view(np.uint8).reshape(-1, GGML_TYPE_NAMES[name].row_bytes(columns))  # (R, bytes)
        expected = reference(name, raw, columns)
        assert_same_bits(dequantize(name, raw, columns), expected)
        if name != "F32":
            assert_same_bits(rebuild(compute_parts(name, raw, columns)), expected)


def test_unsupported_type_names_itself_and_the_supported_ones():
    raw = np.zeros((1, 66), np.uint8)
    with pytest.raises(ValueError, match=r"GGUF type TQ2_0 cannot be decoded by ruvllm; supported: F32, .*Q4_K.*IQ1_M"):
        dequantize("TQ2_0", raw, 256)
    assert compute_parts("TQ2_0", raw, 256) is None
    assert set(DECODABLE_TYPES) == {"F32", "F16", "BF16", *CODE_FORMS, *DEQUANTIZE_ONLY}
    assert not set(CODE_FORMS) & set(DEQUANTIZE_ONLY)


def test_wrong_shapes_say_what_was_expected():
    with pytest.raises(ValueError, match="a Q4_K row of 512 columns takes 288 bytes, found 144"):
        dequantize("Q4_K", np.zeros((2, 144), np.uint8), 512)
    with pytest.raises(ValueError, match="whole blocks of 256 weights; 100 columns"):
        compute_parts("Q6_K", np.zeros((2, 210), np.uint8), 100)
    with pytest.raises(ValueError, match=r"2-D uint8 array .* found float32 of shape"):
        dequantize("F32", np.zeros((2, 4), np.float32), 4)


def test_bytes_per_weight_of_each_compute_form():
    table = {name: bytes_per_weight(*form) for name, form in CODE_FORMS.items()}
    assert table == {
        "Q4_0": 0.625,
        "Q4_1": 0.75,
        "Q5_0": 1.125,
        "Q5_1": 1.25,
        "Q8_0": 1.125,
        "Q2_K": 1.5,
        "Q3_K": 1.25,
        "Q4_K": 0.75,
        "Q5_K": 1.25,
        "Q6_K": 1.25,
        "Q8_K": 1.015625,
        "IQ4_NL": 1.125,
        "IQ4_XS": 1.125,
    }
    with pytest.raises(ValueError, match="int4 only 32"):
        bytes_per_weight("int4", 16, False)
