"""Reading safetensors files with NumPy: every tensor is a view into one buffer, nothing is copied.

The format (https://github.com/huggingface/safetensors):

    [8 bytes: N, little-endian u64][N bytes: JSON header][data section]

The header maps each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}`, offsets relative
to the start of the data section, plus an optional `"__metadata__"` of string to string. The spec asks
that the tensors cover the data section exactly: no overlaps, no holes, nothing after the last one.

Sources: a path, or any object with the buffer protocol (`bytes`, `bytearray`, `memoryview`, a NumPy
array, such as a `PieceBuffer`'s, preallocated and filled in pieces as a download streams in). Every check
that can fail names the file and the tensor. `write` and `serialize` write the same format, with NumPy
alone (the converter, adapter files, and Pyodide use them).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Generic, Protocol, TypeVar

import numpy as np

from ..errors import LoadError
from .jsonfields import parse_json

# The safetensors library refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100_000_000
BytesLike = bytes | bytearray | memoryview | np.ndarray  # a file's bytes as the readers take them (no copy)

# BF16 has no NumPy dtype: its tensors are returned as raw uint16 views (see `bf16_to_f32`).
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: `begin`/`end` are absolute byte offsets in the file's buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bits (uint16) to float32: bf16 is the top half of an f32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def parse_header(
    prefix: bytes | memoryview | np.ndarray, total_size: int, source: str
) -> tuple[dict[str, str], dict[str, TensorInfo]]:
    """Validate the header against a file of `total_size` bytes; `prefix` holds at least the header.

    Returns `(metadata, tensors)`. Raises `LoadError` naming `source` and the tensor at fault.
    """
    # (ndarray.data is its memoryview: NumPy declares the buffer protocol to type checkers from Python 3.12 on)
    prefix = (prefix.data if isinstance(prefix, np.ndarray) else memoryview(prefix)).cast("B")
    if total_size < 8:
        raise LoadError(
            f"{source}: {total_size} bytes is too short for a safetensors file (need 8 for the header length)"
        )
    header_len = int.from_bytes(prefix[:8], "little")
    if header_len > MAX_HEADER_BYTES:
        raise LoadError(f"{source}: header length {header_len} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if 8 + header_len > total_size:
        raise LoadError(
            f"{source}: header length {header_len} runs past the end of the file ({total_size} bytes); "
            "the file is truncated or not a safetensors file"
        )
    if len(prefix) < 8 + header_len:
        raise LoadError(f"{source}: only {len(prefix)} bytes given, the header needs {8 + header_len}")
    header = parse_json(bytes(prefix[8 : 8 + header_len]), f"{source}: the header", _no_duplicates)
    if not isinstance(header, dict):
        raise LoadError(f"{source}: the header must be a JSON object, found {type(header).__name__}")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise LoadError(f"{source}: __metadata__ must map strings to strings")

    data_start = 8 + header_len
    data_size = total_size - data_start
    tensors = {name: _tensor_info(source, name, entry, data_start) for name, entry in header.items()}
    _check_coverage(source, tensors, data_start, data_size)
    return metadata, tensors


def _tensor_info(source: str, name: str, entry: object, data_start: int) -> TensorInfo:
    where = f"{source}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise LoadError(f"{where}: entry must be an object with dtype, shape and data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise LoadError(f"{where}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise LoadError(f"{where}: shape must be a list of non-negative integers, found {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise LoadError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, found {offsets!r}")
    expected = int(np.prod(shape, dtype=object)) * DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != expected:
        raise LoadError(
            f"{where}: shape {shape} of {dtype} needs {expected} bytes but data_offsets {offsets} "
            f"span {offsets[1] - offsets[0]}"
        )
    return TensorInfo(name, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1])


def _check_coverage(source: str, tensors: dict[str, TensorInfo], data_start: int, data_size: int) -> None:
    """Tensors must tile the data section exactly, in offset order (the spec forbids holes and overlaps)."""
    position = data_start
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.end - data_start > data_size:
            raise LoadError(
                f"{source}: tensor {info.name!r} ends at byte {info.end - data_start} of the data section, "
                f"which has only {data_size} bytes: the file is truncated"
            )
        if info.begin < position:
            raise LoadError(f"{source}: tensor {info.name!r} overlaps the tensor before it (data_offsets)")
        if info.begin > position:
            raise LoadError(
                f"{source}: {info.begin - position} unused bytes before tensor {info.name!r} "
                "(the data section must have no holes)"
            )
        position = info.end
    if position != data_start + data_size:
        raise LoadError(
            f"{source}: {data_start + data_size - position} bytes after the last tensor; "
            "the header does not describe the whole file"
        )


class _DuplicateKeyError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    result = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(f"duplicate key {key!r}")
        result[key] = value
    return result


class _Located(Protocol):
    @property
    def begin(self) -> int: ...  # the tensor's first byte in the file's buffer

    @property
    def end(self) -> int: ...


Info = TypeVar("Info", bound=_Located)


class TensorFile(Generic[Info]):
    """What a file of named tensors is, whatever its format (SafetensorsFile, gguf.GGUFFile): where it
    came from, its bytes (None: opened from its header only, its layout known, its data not), and each
    tensor's layout by name."""

    source: str
    buffer: np.ndarray | None
    tensors: dict[str, Info]

    def keys(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> Info:
        try:
            return self.tensors[name]
        except KeyError:
            raise LoadError(f"{self.source}: no tensor named {name!r}") from None

    def _data(self, name: str) -> tuple[Info, np.ndarray]:
        """The tensor's layout and its bytes, a view of the buffer."""
        info = self.info(name)
        if self.buffer is None:
            raise LoadError(f"{self.source}: opened from its header only; tensor data not loaded ({name!r})")
        return info, self.buffer[info.begin : info.end]


class SafetensorsFile(TensorFile[TensorInfo]):
    """A parsed, validated safetensors file; `get(name)` returns a view into the file's buffer.

    A file opened with `header_only` has `buffer = None`: its layout is known, its data is not.
    """

    def __init__(self, buffer: BytesLike, source: str = "<buffer>") -> None:
        data = np.frombuffer(buffer, dtype=np.uint8) if not isinstance(buffer, np.ndarray) else buffer.reshape(-1)
        if data.dtype != np.uint8:
            data = data.view(np.uint8)
        self.source = source
        self.buffer: np.ndarray | None = data
        self.metadata, self.tensors = parse_header(data, data.size, source)

    @classmethod
    def from_path(cls, path: str | os.PathLike, header_only: bool = False) -> SafetensorsFile:
        """Read a whole file into one buffer (a single read, no intermediate copies), or just its header."""
        path = os.fspath(path)
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                if header_only:
                    return cls._header_only(f, size, os.path.basename(path))
                buffer = np.empty(size, dtype=np.uint8)
                got = f.readinto(buffer.data)
        except OSError as e:
            raise LoadError(f"cannot read {path}: {e.strerror or e}") from None
        if got != size:
            raise LoadError(f"{path}: read {got} of {size} bytes")
        return cls(buffer, source=os.path.basename(path))

    @classmethod
    def _header_only(cls, f, size: int, source: str) -> SafetensorsFile:
        head = f.read(8)
        if len(head) == 8:
            head += f.read(min(int.from_bytes(head, "little"), MAX_HEADER_BYTES + 1))
        return cls.from_header(head, size, source)

    @classmethod
    def from_header(cls, prefix: bytes | memoryview, total_size: int, source: str) -> SafetensorsFile:
        """The layout of a file of `total_size` bytes from its first bytes (at least the whole header)."""
        file = cls.__new__(cls)
        file.source, file.buffer = source, None
        file.metadata, file.tensors = parse_header(prefix, total_size, source)
        return file

    def get(self, name: str) -> np.ndarray:
        """The tensor as a read-only view (BF16 as raw uint16; see `bf16_to_f32`)."""
        info, data = self._data(name)
        view = data.view(DTYPES[info.dtype]).reshape(info.shape)
        view.flags.writeable = False
        return view


_WRITABLE = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("i1"): "I8", np.dtype("u1"): "U8"}


def write(
    target: str | os.PathLike | BinaryIO,
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str] | None = None,
    dtypes: dict[str, str] | None = None,
) -> None:
    """Write `tensors` as a safetensors file to a path or a binary stream: the header, then each
    tensor's bytes, one at a time (a model is never held twice). F32, F16, I8 and U8 arrays; `dtypes`
    names the safetensors dtype of an entry where the array alone cannot say it (BF16 held as raw
    uint16). Tensors are laid out in name order, the header padded to 8 bytes."""
    dtypes = dtypes or {}
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    arrays, offset = [], 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        dtype = dtypes.get(name) or _WRITABLE.get(array.dtype)
        if dtype not in DTYPES or DTYPES[dtype].itemsize != array.dtype.itemsize:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} cannot be written")
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if isinstance(target, (str, os.PathLike)):
        with open(target, "wb") as f:
            _write_parts(f, text, arrays)
    else:
        _write_parts(target, text, arrays)


def _write_parts(f: BinaryIO, header: bytes, arrays: list[np.ndarray]) -> None:
    f.write(len(header).to_bytes(8, "little"))
    f.write(header)
    for array in arrays:
        f.write(array.reshape(-1).data.cast("B"))


def serialize(
    tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None, dtypes: dict[str, str] | None = None
) -> bytes:
    """A safetensors file in memory (see `write`)."""
    out = io.BytesIO()
    write(out, tensors, metadata, dtypes)
    return out.getvalue()


class PieceBuffer:
    """A preallocated buffer for one file that arrives in pieces (a streamed download).

    Owns one uint8 array of the file's full size; `write` copies each piece into its place, so the file is
    never held twice. Whoever feeds it (runtime/assembly.py) parses the header from the first bytes and the
    whole file from `array` once `filled` reaches `size`.
    """

    def __init__(self, size: int, source: str = "<stream>") -> None:
        if size < 0:
            raise LoadError(f"{source}: negative size {size}")
        self.array = np.empty(size, dtype=np.uint8)
        self.filled = 0
        self.source = source

    @property
    def size(self) -> int:
        """The file's size in bytes (as OutsideFile's, quant/pool.py)."""
        return self.array.size

    @property
    def bytes(self) -> np.ndarray:
        return self.array

    def write(self, chunk: Any, length: int) -> memoryview:
        """Copy `length` bytes into place: a JS typed array (a JsProxy in Pyodide, copied straight into the
        array) or anything with the buffer protocol. Returns the bytes written, as they now are here."""
        if self.filled + length > self.array.size:
            raise LoadError(
                f"{self.source}: received more than the expected {self.array.size} bytes "
                f"({self.filled + length} so far)"
            )
        target = self.array[self.filled : self.filled + length]
        if hasattr(chunk, "assign_to"):
            chunk.assign_to(target)
        else:
            target[:] = memoryview(chunk).cast("B")
        self.filled += length
        return target.data
