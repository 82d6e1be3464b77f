"""The NumPy GGUF reader against the `gguf` package, and its refusals of bad files."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest

pytest.importorskip("gguf")

import gguf

from ruvllm.errors import LoadError
from ruvllm.files import gguf as gguf_module
from ruvllm.files.gguf import GGUFFile, header_size
from ruvllm.files.tensorfile import PieceBuffer

pytestmark = pytest.mark.parity

# --- the two real files, each read once by the reference (GGUFReader takes ~8 s on Gemma's header).


@pytest.fixture(scope="module", params=["smollm2_gguf", "gemma_gguf"])
def real(request):
    """(path, metadata, tensors, data offset) as the gguf package reads them."""
    path = request.getfixturevalue(request.param)
    reader = gguf.GGUFReader(path)
    # GGUFReader lists the preamble as pseudo-fields "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count".
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return path, metadata, reader.tensors, reader.data_offset


def check_layout(ours: GGUFFile, metadata: dict, tensors: list, data_offset: int) -> None:
    assert list(ours.metadata) == list(metadata)
    for key, value in metadata.items():
        assert ours.metadata[key] == value, key
        assert type(ours.metadata[key]) is type(value), key
    assert list(ours.tensors) == [t.name for t in tensors]
    for t in tensors:
        info = ours.tensors[t.name]
        assert (info.type.name, list(info.shape)) == (t.tensor_type.name, [int(d) for d in t.shape]), t.name
        assert (info.begin, info.nbytes) == (t.data_offset, t.n_bytes), t.name
    assert ours.data_offset == ours.header_bytes == data_offset


def test_real_files_match_the_gguf_package(real):
    path, metadata, tensors, data_offset = real
    started = time.perf_counter()
    ours = GGUFFile.from_path(path)
    print(f"\n{path.name}: header parsed in {time.perf_counter() - started:.3f} s (memory-mapped)")
    check_layout(ours, metadata, tensors, data_offset)
    for t in tensors:
        raw = ours.raw(t.name)
        info = ours.tensors[t.name]
        assert raw.shape == (info.rows, info.row_bytes) and raw.dtype == np.uint8, t.name
        assert not raw.flags.writeable and isinstance(raw.base, np.ndarray), t.name
        expected = np.asarray(t.data).reshape(-1).view(np.uint8)
        assert np.array_equal(raw.reshape(-1), expected), t.name


def test_real_headers_from_their_first_bytes(real):
    path, metadata, tensors, data_offset = real
    data = np.memmap(path, dtype=np.uint8, mode="r")
    size = header_size(data, data.size, path.name)
    assert size == data_offset
    prefix = bytes(data[:size])
    started = time.perf_counter()
    ours = GGUFFile.from_header(prefix, data.size, path.name)
    print(f"\n{path.name}: {size}-byte header parsed from bytes in {time.perf_counter() - started:.3f} s")
    check_layout(ours, metadata, tensors, data_offset)
    # The padding after the tensor infos is less than one alignment: a prefix that stops before it is short.
    for length in (0, 3, 24, size // 2, size - ours.alignment):
        assert header_size(prefix[:length], data.size, path.name) is None, length
    with pytest.raises(LoadError, match="tensor data not loaded"):
        ours.raw(tensors[0].name)


# --- small files written by the gguf package.


def write_sample(path, alignment: int | None = None) -> dict[str, np.ndarray]:
    """A file with every value type and tensors of several ggml types; returns the tensors' bytes."""
    writer = gguf.GGUFWriter(path, "test")
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("v.u8", 200)
    writer.add_int8("v.i8", -100)
    writer.add_uint16("v.u16", 60000)
    writer.add_int16("v.i16", -30000)
    writer.add_uint32("v.u32", 4_000_000_000)
    writer.add_int32("v.i32", -2_000_000_000)
    writer.add_float32("v.f32", 0.1)
    writer.add_uint64("v.u64", 2**64 - 1)
    writer.add_int64("v.i64", -(2**63))
    writer.add_float64("v.f64", 0.1)
    writer.add_bool("v.bool", True)
    writer.add_string("v.str", "héllo, wörld ✓")
    writer.add_array("a.str", ["", "a", "ü", "<0x0A>", "日本"])
    writer.add_array("a.i32", [1, -2, 3])
    writer.add_array("a.f32", [0.5, 0.1, -3.25])
    writer.add_array("a.bool", [True, False, True])
    writer.add_key_value("a.u8", [1, 2, 255], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8)
    writer.add_array("a.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    f32 = rng.normal(size=(3, 64)).astype(np.float32)
    f16 = rng.normal(size=(5,)).astype(np.float16)
    i8 = rng.integers(-128, 128, size=(2, 3, 4), dtype=np.int8)
    q4_0 = rng.integers(0, 256, size=(2, 2, 2 * 18), dtype=np.uint8)  # 2x2 rows of 64 weights
    q4_k = rng.integers(0, 256, size=(3, 144), dtype=np.uint8)  # 3 rows of 256 weights
    writer.add_tensor("f32", f32)
    writer.add_tensor("f16", f16)
    writer.add_tensor("i8", i8)
    writer.add_tensor("q4_0", q4_0, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.add_tensor("q4_k", q4_k, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"f32": f32, "f16": f16, "i8": i8, "q4_0": q4_0, "q4_k": q4_k}


EXPECTED_METADATA = {
    "general.architecture": "test",
    "v.u8": 200,
    "v.i8": -100,
    "v.u16": 60000,
    "v.i16": -30000,
    "v.u32": 4_000_000_000,
    "v.i32": -2_000_000_000,
    "v.f32": float(np.float32(0.1)),
    "v.u64": 2**64 - 1,
    "v.i64": -(2**63),
    "v.f64": 0.1,
    "v.bool": True,
    "v.str": "héllo, wörld ✓",
    "a.str": ["", "a", "ü", "<0x0A>", "日本"],
    "a.i32": [1, -2, 3],
    "a.f32": [0.5, float(np.float32(0.1)), -3.25],
    "a.bool": [True, False, True],
    "a.u8": [1, 2, 255],
    "a.nested": [[1, 2], [3]],
}


@pytest.mark.parametrize("alignment", [None, 64])
def test_written_files_round_trip_from_every_kind_of_source(tmp_path, alignment):
    path = tmp_path / "sample.gguf"
    arrays = write_sample(path, alignment)
    data = path.read_bytes()
    reader = gguf.GGUFReader(path)
    expected_metadata = {**EXPECTED_METADATA, **({"general.alignment": alignment} if alignment else {})}
    for source in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8), path):
        f = GGUFFile.from_path(source) if source is path else GGUFFile(source)
        assert f.version == 3 and f.alignment == (alignment or 32)
        assert f.metadata == expected_metadata
        assert f.data_offset == reader.data_offset
        for name, array in arrays.items():
            info = f.tensors[name]
            assert list(info.shape) == [int(d) for d in reader.get_tensor(list(arrays).index(name)).shape]
            assert info.begin % f.alignment == 0
            assert f.raw(name).tobytes() == array.tobytes(), name
    assert f.tensors["f32"].shape == (64, 3) and f.raw("f32").shape == (3, 256)
    assert f.raw("f16").shape == (1, 10)
    assert f.tensors["i8"].shape == (4, 3, 2) and f.raw("i8").shape == (6, 4)
    assert (f.tensors["q4_0"].type.name, f.tensors["q4_0"].shape, f.raw("q4_0").shape) == ("Q4_0", (64, 2, 2), (4, 36))
    assert (f.tensors["q4_k"].type.name, f.raw("q4_k").shape) == ("Q4_K", (3, 144))
    # The same key-values as the reference, but for the nested array it cannot read.
    reference = {k: v.contents() for k, v in reader.fields.items() if not k.startswith("GGUF.") and k != "a.nested"}
    assert {k: v for k, v in f.metadata.items() if k != "a.nested"} == reference


def test_raw_is_a_read_only_view_into_the_buffer(tmp_path):
    path = tmp_path / "sample.gguf"
    write_sample(path)
    data = bytearray(path.read_bytes())
    f = GGUFFile(data, source="sample.gguf")
    for name in f.keys():
        assert np.shares_memory(f.raw(name), np.frombuffer(data, np.uint8)), name
    assert not f.raw("f32").flags.writeable
    assert "f32" in f and "nope" not in f
    with pytest.raises(LoadError, match=r"sample.gguf: no tensor named 'nope'"):
        f.raw("nope")


def test_header_size_is_none_until_the_tensor_infos_have_arrived(tmp_path):
    path = tmp_path / "sample.gguf"
    write_sample(path)
    data = path.read_bytes()
    size = header_size(data, len(data), "sample.gguf")
    assert size == GGUFFile(data).data_offset
    known = [header_size(data[:n], len(data), "sample.gguf") for n in range(size + 1)]
    first = known.index(size)
    assert size - first < 32 and all(k is None for k in known[:first]) and all(k == size for k in known[first:])
    assert GGUFFile.from_header(data[:first], len(data), "sample.gguf").metadata == EXPECTED_METADATA
    with pytest.raises(LoadError, match=r"sample.gguf: the first 100 bytes do not hold the whole header"):
        GGUFFile.from_header(data[:100], len(data), "sample.gguf")
    with pytest.raises(LoadError, match=r"x.gguf: not a GGUF file"):
        header_size(b"GX", 1000, "x.gguf")  # refused as soon as the bad byte is in


def test_a_file_written_into_a_piece_buffer_in_chunks_reads_its_header_early_and_whole_at_the_end(tmp_path):
    path = tmp_path / "sample.gguf"
    arrays = write_sample(path)
    data = path.read_bytes()
    pieces = PieceBuffer(len(data), "stream.gguf")
    rng = np.random.default_rng(1)
    header = None
    while pieces.filled < len(data):
        step = min(int(rng.integers(1, 97)), len(data) - pieces.filled)
        written = pieces.write(memoryview(data)[pieces.filled : pieces.filled + step], step)
        assert written.tobytes() == data[pieces.filled - step : pieces.filled]
        prefix = pieces.array[: pieces.filled]  # as runtime/assembly.py reads a header while it streams
        if header is None and header_size(prefix, len(data), "stream.gguf") is not None:
            header = GGUFFile.from_header(prefix, len(data), "stream.gguf")
            assert pieces.filled >= 200
    assert header is not None and header.buffer is None and header.metadata == EXPECTED_METADATA
    f = GGUFFile(pieces.array, "stream.gguf")
    assert all(f.raw(name).tobytes() == array.tobytes() for name, array in arrays.items())
    with pytest.raises(LoadError, match=rf"stream.gguf: received more than the expected {len(data)} bytes"):
        pieces.write(b"x", 1)


# --- bad files, built byte by byte: each refused with a message naming the key or tensor at fault.


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return string(key) + struct.pack("<I", vtype) + payload


def u32_kv(key: str, value: int) -> bytes:
    return kv(key, 4, struct.pack("<I", value))


def info(name: str | bytes, dims: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    return string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


def build(
    kvs: list[bytes],
    infos: list[bytes],
    data: bytes | int = 0,
    version: bytes = b"\x03\0\0\0",
    counts: tuple[int, int] | None = None,
    alignment: int = 32,
) -> bytes:
    """Preamble, key-values, tensor infos, padding to `alignment`, then `data` (bytes, or a count of zeros)."""
    n_tensors, n_kvs = counts or (len(infos), len(kvs))
    head = b"GGUF" + version + struct.pack("<QQ", n_tensors, n_kvs) + b"".join(kvs) + b"".join(infos)
    head += bytes(-len(head) % alignment)
    return head + (bytes(data) if isinstance(data, int) else data)


W = [info("w", (4, 2))]  # one F32 tensor of 32 bytes

BAD_FILES = {
    "bad magic": (b"GGML" + bytes(60), r"not a GGUF file \(it begins b'GGML', a GGUF file begins b'GGUF'\)"),
    "too short": (b"GGUF\x03\0\0\0", r"8 bytes is too short for a GGUF file"),
    "version 1": (build([], W, 32, version=b"\x01\0\0\0"), r"GGUF version 1 \(32-bit counts, 2023\) is not supported"),
    "version 4": (build([], W, 32, version=b"\x04\0\0\0"), r"GGUF version 4 is not supported; this reader knows"),
    "big-endian": (build([], W, 32, version=b"\0\0\0\x03"), r"a big-endian GGUF file \(version 3\); only little"),
    "kv_count too large": (
        build([], W, 32, counts=(1, 10**15)),
        r"kv_count is 1000000000000000, which cannot fit: each entry takes at least 13 bytes and only \d+ bytes",
    ),
    "tensor_count too large": (
        build([], W, 32, counts=(10**6, 0)),
        r"tensor_count is 1000000, which cannot fit: each entry takes at least 32 bytes",
    ),
    "key past end": (
        b"GGUF\x03\0\0\0" + struct.pack("<QQ", 0, 1) + struct.pack("<Q", 1000) + bytes(20),
        r"the key of key-value pair #0 runs past the end of the file \(it needs bytes up to 1032, the file has 52\)",
    ),
    "string past end": (
        build([kv("a", 8, struct.pack("<Q", 500) + b"abc")], []),
        r"key 'a' runs past the end of the file",
    ),
    "string too long": (
        build([kv("a", 8, struct.pack("<Q", 2**40))], []),
        r"key 'a' is a string of 1099511627776 bytes, over the limit of 67108864 bytes",
    ),
    "array past end": (
        build([kv("a", 9, struct.pack("<IQ", 4, 1000) + bytes(12))], []),
        r"key 'a' is an array of 1000 items, which need at least 4000 bytes, but only \d+ bytes of the file remain",
    ),
    "string in array past end": (
        build([kv("a", 9, struct.pack("<IQ", 8, 2) + string("ok") + struct.pack("<Q", 10**6))], [], 64),
        r"key 'a'\[1\] runs past the end of the file",
    ),
    "nested array past end": (
        build([kv("a", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 6, 500))], [], 64),
        r"key 'a'\[0\] is an array of 500 items",
    ),
    "arrays nested too deep": (  # 3000 deep would exhaust the interpreter's stack
        build([kv("a", 9, struct.pack("<IQ", 9, 1) * 3000 + struct.pack("<IQ", 4, 0))], []),
        r"key 'a'\[0\]\[0\]\[0\]\[0\]\[0\]\[0\]\[0\] holds arrays nested more than 8 deep",
    ),
    "array too long": (  # fits the file (a hole reads as zeros) but would be billions of Python objects
        build([kv("a", 9, struct.pack("<IQ", 0, 2**23))], [], 2**23),
        r"key 'a' is an array of 8388608 items, over the limit of 4194304",
    ),
    "empty tensor name": (build([], [info("", ())], 32), r"tensor #0 \(named ''\) has 0 dimensions"),
    "key not utf-8": (build([kv(b"\xff\xfe", 4, bytes(4))], []), r"the key of key-value pair #0 is not valid UTF-8"),
    "name not utf-8": (build([], [info(b"w\xc3", (4, 2))], 32), r"the name of tensor #0 is not valid UTF-8"),
    "token not utf-8": (
        build([kv("tokens", 9, struct.pack("<IQ", 8, 2) + string("a") + string(b"\xc0\x80"))], []),
        r"key 'tokens'\[1\] is not valid UTF-8 \(invalid start byte at byte 0; it begins b'\\xc0\\x80'\)",
    ),
    "unknown value type": (build([kv("a", 13, bytes(8))], []), r"key 'a' has value type 13, which is not a GGUF value"),
    "unknown element type": (
        build([kv("a", 9, struct.pack("<IQ", 99, 1) + bytes(8))], []),
        r"key 'a' is an array of value type 99, which is not a GGUF value type",
    ),
    "duplicate key": (build([u32_kv("a", 1), u32_kv("a", 2)], []), r"key 'a' appears twice"),
    "duplicate tensor": (build([], [info("w", (4,)), info("w", (4,), offset=32)], 64), r"tensor 'w' appears twice"),
    "no dims": (build([], [info("w", ())], 32), r"tensor 'w' has 0 dimensions; a GGUF tensor has 1 to 4"),
    "five dims": (build([], [info("w", (1, 1, 1, 1, 1))], 32), r"tensor 'w' has 5 dimensions"),
    "zero dim": (build([], [info("w", (4, 0))], 32), r"tensor 'w' has shape \(4, 0\) with a zero dimension"),
    "absurd dim": (
        build([], [info("w", (2**64 - 1,))], 32),
        r"tensor 'w' has dimension 18446744073709551615 in shape \(18446744073709551615,\), beyond ggml's limit",
    ),
    "element overflow": (
        build([], [info("w", (2**32, 2**32))], 32),
        r"tensor 'w' with shape \(4294967296, 4294967296\) has 18446744073709551616 elements, beyond ggml's limit",
    ),
    "unknown ggml type": (
        build([], [info("blk.0.attn_q.weight", (32, 2), ggml_type=31)], 64),
        r"tensor 'blk.0.attn_q.weight' has ggml type 31, which this reader does not know",
    ),
    "partial block": (
        build([], [info("w", (48, 2), ggml_type=2)], 64),
        r"tensor 'w' of type Q4_0 has rows of 48 weights, not a multiple of its block size 32",
    ),
    "unaligned offset": (
        build([], [info("w", (4,), offset=8)], 64),
        r"tensor 'w' starts at offset 8 of the data section, not a multiple of the alignment 32",
    ),
    "data past end": (
        build([], W, 31),
        r"tensor 'w' \(F32, shape \(4, 2\)\) needs bytes 96..128 of the file, which has only 127 bytes: "
        "the file is truncated",
    ),
    "overlap": (
        build([], [info("a", (16,)), info("b", (8,), offset=32)], 96),
        r"tensor 'b' \(bytes 32..64 of the data section\) overlaps tensor 'a' \(bytes 0..64\)",
    ),
    "alignment type": (
        build([kv("general.alignment", 5, struct.pack("<i", 32))], []),
        r"general.alignment must be a u32, found a value of type i32",
    ),
    "alignment not a power of two": (
        build([u32_kv("general.alignment", 48)], []),
        r"general.alignment is 48; it must be a nonzero power of two",
    ),
    "alignment zero": (build([u32_kv("general.alignment", 0)], []), r"general.alignment is 0; it must be a nonzero"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_are_refused_with_a_clear_message(case, tmp_path):
    data, message = BAD_FILES[case]
    with pytest.raises(LoadError, match="bad.gguf: " + message):
        GGUFFile(data, source="bad.gguf")
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(LoadError, match="bad.gguf: " + message):
        GGUFFile.from_path(path)
    # The header alone, with the file's size known, is refused the same way (tensors past the end too).
    with pytest.raises(LoadError, match="bad.gguf: " + message):
        GGUFFile.from_header(data, len(data), "bad.gguf")
    if case == "token not utf-8":  # header_size skips over values without decoding them
        assert header_size(data, len(data), "bad.gguf") == len(data)
        return
    with pytest.raises(LoadError, match="bad.gguf: " + message):
        header_size(data, len(data), "bad.gguf")


def test_a_header_over_the_cap_is_refused(monkeypatch):
    token = "a token of 20 bytes."
    data = build([kv("a", 9, struct.pack("<IQ", 8, 10) + string(token) * 10)], [], 32)
    assert GGUFFile(data).metadata["a"] == [token] * 10
    monkeypatch.setattr(gguf_module, "MAX_HEADER_BYTES", 200)
    with pytest.raises(LoadError, match=r"big.gguf: key 'a'\[\d+\] ends at byte \d+, past the limit of 200 bytes"):
        GGUFFile(data, source="big.gguf")
    with pytest.raises(LoadError, match=r"past the limit of 200 bytes for a GGUF header"):
        header_size(data, 10**9, "big.gguf")
