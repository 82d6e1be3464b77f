"""The NumPy safetensors reader against the safetensors library, and its refusals of bad files."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

import safetensors
import safetensors.numpy
import torch
from safetensors.torch import save as torch_save

from ruvllm.errors import LoadError
from ruvllm.files.tensorfile import PieceBuffer, SafetensorsFile, bf16_to_f32

pytestmark = pytest.mark.parity


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f64": rng.normal(size=(3, 5)),
        "f32": rng.normal(size=(7, 4, 2)).astype(np.float32),
        "f16": rng.normal(size=(9,)).astype(np.float16),
        "i64": rng.integers(-(2**40), 2**40, size=(4,)),
        "i32": rng.integers(-1000, 1000, size=(2, 3)).astype(np.int32),
        "i16": rng.integers(-1000, 1000, size=(5,)).astype(np.int16),
        "i8": rng.integers(-128, 128, size=(3, 3)).astype(np.int8),
        "u8": rng.integers(0, 256, size=(11,)).astype(np.uint8),
        "u16": rng.integers(0, 2**16, size=(3,)).astype(np.uint16),
        "bool": rng.integers(0, 2, size=(6,)).astype(bool),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def check_same(ours: SafetensorsFile, reference: dict[str, np.ndarray]) -> None:
    assert sorted(ours.keys()) == sorted(reference)
    for name, expected in reference.items():
        got = ours.get(name)
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected)


def test_matches_library_from_bytes_memoryview_and_path(tmp_path):
    tensors = sample_tensors()
    data = safetensors.numpy.save(tensors, metadata={"format": "np", "note": "héllo"})
    path = tmp_path / "t.safetensors"
    path.write_bytes(data)
    reference = safetensors.numpy.load(data)
    for source in (data, memoryview(data), bytearray(data)):
        f = SafetensorsFile(source)
        check_same(f, reference)
        assert f.metadata == {"format": "np", "note": "héllo"}
    check_same(SafetensorsFile.from_path(path), safetensors.numpy.load_file(path))


def test_tensors_are_views_into_one_buffer():
    data = bytearray(safetensors.numpy.save(sample_tensors()))
    f = SafetensorsFile(data)
    buffer = np.frombuffer(data, dtype=np.uint8)
    for name in f.keys():
        if f.get(name).size:
            assert np.shares_memory(f.get(name), buffer), name
    assert not f.get("f32").flags.writeable


def test_piece_buffer_filled_in_chunks_matches_library():
    data = safetensors.numpy.save(sample_tensors())
    stream = PieceBuffer(len(data), "stream.safetensors")
    rng = np.random.default_rng(1)
    header = None
    while stream.filled < len(data):
        step = min(int(rng.integers(1, 97)), len(data) - stream.filled)
        stream.write(memoryview(data)[stream.filled : stream.filled + step], step)
        needed = 8 + int.from_bytes(data[:8], "little")  # as runtime/assembly.py's header_size says
        if header is None and stream.filled >= needed:
            header = SafetensorsFile.from_header(stream.array[: stream.filled], len(data), "stream.safetensors")
    assert header is not None and "f32" in header.keys() and header.buffer is None
    check_same(SafetensorsFile(stream.array, source="stream.safetensors"), safetensors.numpy.load(data))


def test_piece_buffer_refuses_more_than_its_size_and_keeps_what_it_had():
    data = safetensors.numpy.save(sample_tensors())
    stream = PieceBuffer(len(data), "model.safetensors")
    stream.write(data, len(data))
    with pytest.raises(LoadError, match=rf"model.safetensors: received more than the expected {len(data)} bytes"):
        stream.write(b"x", 1)
    assert stream.filled == len(data) and stream.array.tobytes() == data


def test_bf16_matches_torch():
    t = torch.randn(4, 6).to(torch.bfloat16)
    f = SafetensorsFile(torch_save({"w": t}))
    assert f.info("w").dtype == "BF16"
    np.testing.assert_array_equal(bf16_to_f32(f.get("w")), t.float().numpy())


# --- bad files: each must be refused by us with a message naming what is wrong, and by the library too.


def build(header: dict | bytes, data: bytes = b"", header_len: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data


GOOD = {
    "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "b": {"dtype": "I8", "shape": [4], "data_offsets": [16, 20]},
}

BAD_FILES = {
    "truncated": (
        build(GOOD, bytes(20))[:-3],
        r"tensor 'b' ends at byte 20 of the data section, which has only 17 bytes: the file is truncated",
    ),
    "header past end": (
        build(GOOD, bytes(20), header_len=10_000),
        r"header length 10000 runs past the end of the file",
    ),
    "header too large": (build(GOOD, bytes(20), header_len=200_000_000), r"header length 200000000 exceeds the limit"),
    "too short": (b"\x01\x02", r"2 bytes is too short for a safetensors file"),
    "not json": (build(b"{not json at all}", bytes(20)), r"the header is not valid JSON"),
    "not utf8": (build(b'{"\xff": 1}', bytes(20)), r"the header is not valid JSON"),
    "shape disagrees": (
        build({**GOOD, "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}, bytes(20)),
        r"tensor 'a': shape \[2, 3\] of F32 needs 24 bytes but data_offsets \[0, 16\] span 16",
    ),
    "overlap": (
        build(
            {
                "a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]},
            },
            bytes(12),
        ),
        r"tensor 'b' overlaps the tensor before it",
    ),
    "hole": (
        build(
            {
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]},
            },
            bytes(12),
        ),
        r"4 unused bytes before tensor 'b'",
    ),
    "trailing bytes": (build(GOOD, bytes(24)), r"4 bytes after the last tensor"),
    "unknown dtype": (
        build({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}, bytes(2)),
        r"tensor 'a': unknown dtype 'Q4'",
    ),
    "negative offsets": (
        build({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}}, bytes(2)),
        r"tensor 'a': data_offsets must be \[begin, end\] with 0 <= begin <= end",
    ),
    "duplicate name": (
        build(
            b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
            b'"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}',
            bytes(2),
        ),
        r"the header is not valid JSON \(duplicate key 'a'\)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_are_refused_with_a_clear_message(case, tmp_path):
    data, message = BAD_FILES[case]
    with pytest.raises(LoadError, match=message):
        SafetensorsFile(data, source="bad.safetensors")
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(LoadError, match="bad.safetensors: " + message):
        SafetensorsFile.from_path(path)
    if case != "duplicate name":  # serde_json keeps the last duplicate; the spec leaves it open
        with pytest.raises(Exception):  # noqa: B017 - the library raises its own SafetensorError
            safetensors.numpy.load(data)


def test_our_writer_is_read_by_the_library():
    from ruvllm.files.tensorfile import serialize

    tensors = {
        "b": np.arange(6, dtype=np.float32).reshape(2, 3),
        "a": np.array([[1, -2]], dtype=np.int8),
        "c": np.zeros((0,), dtype=np.float16),
        "d": np.arange(5, dtype=np.uint8),
    }
    data = serialize(tensors, {"format": "pt"})
    back = safetensors.numpy.load(data)
    assert sorted(back) == sorted(tensors)
    for name, array in tensors.items():
        np.testing.assert_array_equal(back[name], array)
        assert back[name].dtype == array.dtype
    assert SafetensorsFile(data).metadata == {"format": "pt"}
    with pytest.raises(ValueError, match="tensor 'x': dtype int64 cannot be written"):
        serialize({"x": np.zeros(2, np.int64)})


def test_our_writer_writes_bf16_to_a_path_as_torch_reads_it(tmp_path):
    import torch
    from safetensors.torch import load_file

    from ruvllm.files.formats import get_format
    from ruvllm.files.tensorfile import bf16_to_f32, write

    w = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    raw = get_format("bf16").quantize(w)[""]  # uint16
    write(tmp_path / "m.safetensors", {"w": raw, "n": np.ones(3, np.float32)}, {"k": "v"}, dtypes={"w": "BF16"})
    back = load_file(tmp_path / "m.safetensors")
    assert back["w"].dtype == torch.bfloat16
    np.testing.assert_array_equal(back["w"].float().numpy(), bf16_to_f32(raw))
    np.testing.assert_array_equal(back["n"].numpy(), np.ones(3, np.float32))
