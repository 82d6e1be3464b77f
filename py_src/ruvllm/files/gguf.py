"""Reading GGUF files with NumPy and the standard library: every tensor is a view into one buffer.

The format (ggml's docs/gguf.md), versions 2 and 3, little-endian:

    "GGUF"  u32 version  u64 tensor_count  u64 kv_count           the 24-byte preamble
    kv_count x    [string key][u32 value type][value]             the metadata
    tensor_count x  [string name][u32 n_dims][n_dims x u64 dims][u32 ggml type][u64 offset]
    padding to `general.alignment` (a u32 key, default 32)
    the data section: each tensor at `offset` from its start, offsets aligned

A string is a u64 byte count and UTF-8 bytes; an array is a u32 element type, a u64 count and the
elements (arrays of arrays allowed). Dims are in ggml order: dims[0] is the row length (the columns),
so a tensor of dims (C, R) is R rows of C weights, each stored as whole blocks of its ggml type (ggml.py).
Version 1 (u32 counts) and big-endian files are refused.

Sources: a whole file (bytes, memoryview, a NumPy array, a finished `PieceBuffer`), a path (memory-mapped:
parsing the header touches only the header's pages), or just the first bytes of a file whose data is
still downloading (`from_header`, with `header_size` telling when enough has arrived). Every check that
can fail raises `LoadError` naming the source and the key or tensor at fault.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np

from ..errors import LoadError
from .ggml import GGML_TYPES, GGMLType
from .tensorfile import BytesLike, TensorFile

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
PREAMBLE_BYTES = 24  # magic, version, tensor_count, kv_count

# Caps that turn a corrupt length into a clear error instead of a huge allocation or a long wait. Real
# headers are a few MB (Gemma 3's 262k-token vocabulary: 6.5 MB); the longest strings are chat templates
# and, in some files, a whole tokenizer.json (tens of MB).
MAX_HEADER_BYTES = 256 * 2**20
MAX_STRING_BYTES = 64 * 2**20
MAX_DIMS = 4  # GGML_MAX_DIMS
# Arrays: the longest in released models are vocabularies and merge lists (Gemma 3: 262k tokens, Qwen:
# 151k merges); no model nests arrays more than once or twice. Past these a header is damaged, and would
# cost gigabytes of Python lists (or the interpreter's stack) to read.
MAX_ARRAY_ITEMS = 2**22
MAX_ARRAY_DEPTH = 8
MAX_ELEMENTS = 2**63 - 1  # ggml counts elements in int64

# The smallest encoding of one key-value pair (empty key, u8 value) and of one tensor info (empty name,
# one dim): a count that cannot fit in the file at these sizes is corrupt.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8

# Value types: id -> (name, struct format) for the fixed-size ones.
STRING, ARRAY = 8, 9
SCALARS: dict[int, tuple[str, str]] = {
    0: ("u8", "<B"),
    1: ("i8", "<b"),
    2: ("u16", "<H"),
    3: ("i16", "<h"),
    4: ("u32", "<I"),
    5: ("i32", "<i"),
    6: ("f32", "<f"),
    7: ("bool", "<B"),
    10: ("u64", "<Q"),
    11: ("i64", "<q"),
    12: ("f64", "<d"),
}
VALUE_TYPE_NAMES = {**{k: name for k, (name, _) in SCALARS.items()}, STRING: "string", ARRAY: "array"}
_STRUCTS = {k: struct.Struct(fmt) for k, (_, fmt) in SCALARS.items()}
_U32, _U64 = _STRUCTS[4], _STRUCTS[10]


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor lives. `shape` is in ggml order, as stored: shape[0] is the row length.
    `begin` is the absolute byte offset in the file."""

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    begin: int
    nbytes: int

    @property
    def columns(self) -> int:
        """Weights per row (ggml's ne[0])."""
        return self.shape[0]

    @property
    def rows(self) -> int:
        """The product of the other dims (1 for a 1-D tensor)."""
        return math.prod(self.shape[1:])

    @property
    def row_bytes(self) -> int:
        return self.type.row_bytes(self.columns)

    @property
    def end(self) -> int:
        return self.begin + self.nbytes


@dataclass(frozen=True)
class _Header:
    version: int
    metadata: dict[str, object]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int


class _IncompleteError(Exception):
    """The prefix ends before the header does (the file itself is longer): wait for more bytes."""


class _Cursor:
    """A position in the first bytes of a file of `total_size` bytes; every read is bounds-checked."""

    __slots__ = ("limit", "pos", "source", "total_size", "view")

    def __init__(self, view: memoryview, total_size: int, source: str) -> None:
        self.view = view
        self.total_size = total_size
        self.source = source
        self.pos = 0
        # A read ending past `limit` is a truncated file, a header over the cap, or a prefix too short.
        self.limit = min(len(view), total_size, MAX_HEADER_BYTES)

    def take(self, n: int, what: str) -> int:
        """Claim the next `n` bytes; returns where they start."""
        start = self.pos
        if start + n > self.limit:
            self.fail_past(start + n, what)
        self.pos = start + n
        return start

    def fail_past(self, end: int, what: str) -> None:
        """Explain why the bytes up to `end` cannot be read."""
        if end > self.total_size:
            raise LoadError(
                f"{self.source}: {what} runs past the end of the file (it needs bytes up to {end}, "
                f"the file has {self.total_size}): the file is truncated or corrupt"
            )
        if end > MAX_HEADER_BYTES:
            raise LoadError(
                f"{self.source}: {what} ends at byte {end}, past the limit of {MAX_HEADER_BYTES} bytes "
                "for a GGUF header"
            )
        raise _IncompleteError

    def room(self, count: int, min_bytes: int, what: str) -> None:
        """Refuse a count of items that cannot fit in what is left of the file (nor under the header cap)."""
        needed = count * min_bytes
        if self.pos + needed > self.total_size:
            raise LoadError(
                f"{self.source}: {what} is an array of {count} items, which need at least {needed} bytes, "
                f"but only {self.total_size - self.pos} bytes of the file remain"
            )
        if self.pos + needed > MAX_HEADER_BYTES:
            raise LoadError(
                f"{self.source}: {what} is an array of {count} items, which need at least {needed} bytes, "
                f"past the limit of {MAX_HEADER_BYTES} bytes for a GGUF header"
            )

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.view, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.view, self.take(8, what))[0]

    @overload
    def string(self, what: str, decode: Literal[True] = True) -> str: ...

    @overload
    def string(self, what: str, decode: bool) -> str | None: ...

    def string(self, what: str, decode: bool = True) -> str | None:
        n = self.u64(f"the length of {what}")
        self.check_length(n, what)
        start = self.take(n, what)
        return _decode(self, start, self.pos, what) if decode else None

    def check_length(self, n: int, what: str) -> None:
        if n > MAX_STRING_BYTES:
            raise LoadError(
                f"{self.source}: {what} is a string of {n} bytes, over the limit of {MAX_STRING_BYTES} bytes"
            )


def _decode(cur: _Cursor, start: int, end: int, what: str) -> str:
    try:
        return str(cur.view[start:end], "utf-8")
    except UnicodeDecodeError as e:
        shown = bytes(cur.view[start : min(end, start + 40)])
        raise LoadError(
            f"{cur.source}: {what} is not valid UTF-8 ({e.reason} at byte {e.start}; it begins {shown!r})"
        ) from None


def _value(cur: _Cursor, vtype: int, what: str, decode: bool) -> object:
    """One value of type `vtype`; strings and arrays are skipped (None) unless `decode`."""
    if vtype in _STRUCTS:
        value = _STRUCTS[vtype].unpack_from(cur.view, cur.take(_STRUCTS[vtype].size, what))[0]
        return bool(value) if vtype == 7 else value
    if vtype == STRING:
        return cur.string(what, decode)
    if vtype == ARRAY:
        return _array(cur, what, decode, 1)
    raise LoadError(
        f"{cur.source}: {what} has value type {vtype}, which is not a GGUF value type "
        f"(expected one of {', '.join(f'{k} {n}' for k, n in sorted(VALUE_TYPE_NAMES.items()))})"
    )


def _array(cur: _Cursor, what: str, decode: bool, depth: int) -> list | None:
    """An array nested `depth` arrays deep (1 for a key's own value)."""
    etype = cur.u32(f"the element type of {what}")
    count = cur.u64(f"the length of {what}")
    if count > MAX_ARRAY_ITEMS:
        raise LoadError(
            f"{cur.source}: {what} is an array of {count} items, over the limit of {MAX_ARRAY_ITEMS} "
            "(the longest arrays of real models, vocabularies, have a few hundred thousand)"
        )
    if etype in _STRUCTS:
        dtype = np.dtype(_STRUCTS[etype].format)
        cur.room(count, dtype.itemsize, what)
        start = cur.take(count * dtype.itemsize, f"{what} ({count} {VALUE_TYPE_NAMES[etype]} values)")
        if not decode:
            return None
        values = np.frombuffer(cur.view, dtype=dtype, count=count, offset=start)
        return (values != 0).tolist() if etype == 7 else values.tolist()
    if etype == STRING:
        cur.room(count, 8, what)
        return _strings(cur, count, what, decode)
    if etype == ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise LoadError(
                f"{cur.source}: {what} holds arrays nested more than {MAX_ARRAY_DEPTH} deep; "
                "GGUF metadata nests arrays once or twice at most"
            )
        cur.room(count, 12, what)
        items = [_array(cur, f"{what}[{i}]", decode, depth + 1) for i in range(count)]
        return items if decode else None
    raise LoadError(
        f"{cur.source}: {what} is an array of value type {etype}, which is not a GGUF value type "
        f"(expected one of {', '.join(f'{k} {n}' for k, n in sorted(VALUE_TYPE_NAMES.items()))})"
    )


def _strings(cur: _Cursor, count: int, what: str, decode: bool) -> list[str] | None:
    """An array of `count` strings: the hot loop of a header (262k tokens, 500k merges), kept to one
    struct unpack and one decode per string; the error paths rebuild their messages only when taken."""
    view, pos, limit = cur.view, cur.pos, cur.limit
    unpack = _U64.unpack_from
    out: list[str] = []
    append = out.append
    for i in range(count):
        if pos + 8 > limit:
            cur.pos = pos
            cur.take(8, f"the length of {what}[{i}]")
        (n,) = unpack(view, pos)
        start = pos + 8
        pos = start + n
        if pos > limit or n > MAX_STRING_BYTES:
            cur.pos = start
            cur.check_length(n, f"{what}[{i}]")
            cur.take(n, f"{what}[{i}]")
        if decode:
            try:
                append(str(view[start:pos], "utf-8"))
            except UnicodeDecodeError:
                _decode(cur, start, pos, f"{what}[{i}]")
    cur.pos = pos
    return out if decode else None


def _preamble(cur: _Cursor) -> tuple[int, int, int]:
    """Magic, version and the two counts, each checked as soon as its bytes are there."""
    source, head = cur.source, bytes(cur.view[:4])
    if head != MAGIC[: len(head)]:
        raise LoadError(f"{source}: not a GGUF file (it begins {head!r}, a GGUF file begins {MAGIC!r})")
    if cur.total_size < PREAMBLE_BYTES:
        raise LoadError(f"{source}: {cur.total_size} bytes is too short for a GGUF file (the preamble alone takes 24)")
    cur.take(4, "the magic")
    version = cur.u32("the version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in (1, 2, 3):
            raise LoadError(
                f"{source}: a big-endian GGUF file (version {swapped}); only little-endian files are supported"
            )
        if version == 1:
            raise LoadError(
                f"{source}: GGUF version 1 (32-bit counts, 2023) is not supported; re-convert it to version 3"
            )
        raise LoadError(f"{source}: GGUF version {version} is not supported; this reader knows versions 2 and 3")
    tensor_count = cur.u64("the tensor count")
    kv_count = cur.u64("the key-value count")
    left = cur.total_size - PREAMBLE_BYTES
    for count, size, what in (
        (kv_count, MIN_KV_BYTES, "kv_count"),
        (tensor_count, MIN_TENSOR_INFO_BYTES, "tensor_count"),
    ):
        if count * size > left:
            raise LoadError(
                f"{source}: {what} is {count}, which cannot fit: each entry takes at least {size} bytes "
                f"and only {left} bytes follow the preamble"
            )
    if kv_count * MIN_KV_BYTES + tensor_count * MIN_TENSOR_INFO_BYTES > left:
        raise LoadError(
            f"{source}: kv_count {kv_count} and tensor_count {tensor_count} cannot both fit in the "
            f"{left} bytes that follow the preamble"
        )
    return version, tensor_count, kv_count


def _parse(view: memoryview, total_size: int, source: str, decode: bool = True) -> _Header:
    """Walk and check the header of a file of `total_size` bytes whose first bytes are `view`.

    Raises `_IncompleteError` when `view` ends before the tensor infos do; `decode=False` skips over string
    and array values (their structure is still checked) for `header_size`.
    """
    cur = _Cursor(view, total_size, source)
    version, tensor_count, kv_count = _preamble(cur)

    metadata: dict[str, object] = {}
    alignment = DEFAULT_ALIGNMENT
    for index in range(kv_count):
        key = cur.string(f"the key of key-value pair #{index}")
        where = f"key {key!r}"
        if key in metadata:
            raise LoadError(f"{source}: {where} appears twice (key-value pair #{index} repeats it)")
        vtype = cur.u32(f"the value type of {where}")
        metadata[key] = _value(cur, vtype, where, decode)
        if key == ALIGNMENT_KEY:
            alignment = _alignment(source, vtype, metadata[key])

    infos = []
    for index in range(tensor_count):
        name = cur.string(f"the name of tensor #{index}")
        where = f"tensor {name!r}" if name else f"tensor #{index} (named '')"
        n_dims = cur.u32(f"the number of dimensions of {where}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise LoadError(f"{source}: {where} has {n_dims} dimensions; a GGUF tensor has 1 to {MAX_DIMS}")
        dims = struct.unpack_from(f"<{n_dims}Q", view, cur.take(8 * n_dims, f"the shape of {where}"))
        type_id = cur.u32(f"the ggml type of {where}")
        offset = cur.u64(f"the data offset of {where}")
        infos.append((index, name, dims, type_id, offset))

    data_offset = -(-cur.pos // alignment) * alignment
    tensors: dict[str, GGUFTensor] = {}
    for index, name, dims, type_id, offset in infos:
        if name in tensors:
            raise LoadError(f"{source}: tensor {name!r} appears twice (tensor info #{index} repeats it)")
        tensors[name] = _tensor(source, name, dims, type_id, offset, alignment, data_offset, total_size)
    _check_overlaps(source, tensors, data_offset)
    return _Header(version, metadata, tensors, alignment, data_offset)


def _alignment(source: str, vtype: int, value: object) -> int:
    if vtype != 4:
        raise LoadError(
            f"{source}: {ALIGNMENT_KEY} must be a u32, found a value of type {VALUE_TYPE_NAMES.get(vtype, vtype)}"
        )
    assert isinstance(value, int)
    if value == 0 or value & (value - 1):
        raise LoadError(f"{source}: {ALIGNMENT_KEY} is {value}; it must be a nonzero power of two")
    return value


def _tensor(
    source: str,
    name: str,
    dims: tuple[int, ...],
    type_id: int,
    offset: int,
    alignment: int,
    data_offset: int,
    total_size: int,
) -> GGUFTensor:
    where = f"{source}: tensor {name!r}"
    if 0 in dims:
        raise LoadError(f"{where} has shape {dims} with a zero dimension; every dimension must be at least 1")
    for d in dims:
        if d > MAX_ELEMENTS:
            raise LoadError(f"{where} has dimension {d} in shape {dims}, beyond ggml's limit of 2**63 - 1")
    elements = math.prod(dims)
    if elements > MAX_ELEMENTS:
        raise LoadError(f"{where} with shape {dims} has {elements} elements, beyond ggml's limit of 2**63 - 1")
    ggml_type = GGML_TYPES.get(type_id)
    if ggml_type is None:
        raise LoadError(f"{where} has ggml type {type_id}, which this reader does not know")
    if dims[0] % ggml_type.block_size:
        raise LoadError(
            f"{where} of type {ggml_type.name} has rows of {dims[0]} weights, not a multiple of its block "
            f"size {ggml_type.block_size}"
        )
    if offset % alignment:
        raise LoadError(
            f"{where} starts at offset {offset} of the data section, not a multiple of the alignment {alignment}"
        )
    nbytes = math.prod(dims[1:]) * ggml_type.row_bytes(dims[0])
    begin = data_offset + offset
    if begin + nbytes > total_size:
        raise LoadError(
            f"{where} ({ggml_type.name}, shape {dims}) needs bytes {begin}..{begin + nbytes} of the file, "
            f"which has only {total_size} bytes: the file is truncated"
        )
    return GGUFTensor(name, ggml_type, tuple(dims), begin, nbytes)


def _check_overlaps(source: str, tensors: dict[str, GGUFTensor], data_offset: int) -> None:
    """Tensors may leave gaps (alignment padding) but never share bytes."""
    previous = None
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if previous is not None and t.begin < previous.end:
            raise LoadError(
                f"{source}: tensor {t.name!r} (bytes {t.begin - data_offset}..{t.end - data_offset} of the data "
                f"section) overlaps tensor {previous.name!r} (bytes {previous.begin - data_offset}.."
                f"{previous.end - data_offset})"
            )
        previous = t


def _as_bytes(buffer: BytesLike) -> np.ndarray:
    """Any buffer as a flat uint8 array, without a copy when it is contiguous."""
    data = buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, dtype=np.uint8)
    data = np.ascontiguousarray(data).reshape(-1)
    return data if data.dtype == np.uint8 else data.view(np.uint8)


def header_size(prefix: bytes | memoryview | np.ndarray, total_size: int, source: str) -> int | None:
    """Bytes the header takes (the data section's start), or None when `prefix` is too short to tell yet.

    Known as soon as `prefix` holds the tensor infos (the alignment padding after them need not have
    arrived), so `from_header` accepts any prefix for which this is not None. String and array values
    are skipped, not decoded, which keeps a call on a growing prefix cheap; everything else is checked as
    `GGUFFile` checks it, so a malformed header raises `LoadError` (the UTF-8 of string values is checked
    only when they are decoded, by `from_header`).
    """
    try:
        return _parse(_as_bytes(prefix).data, total_size, source, decode=False).data_offset
    except _IncompleteError:
        return None


class GGUFFile(TensorFile[GGUFTensor]):
    """A parsed, validated GGUF file; `raw(name)` returns a tensor's bytes as a view into the file's buffer.

    `metadata` holds the key-values in file order: integers as int, floats as float, bools, strings, and
    arrays as lists (nested arrays as lists of lists). A file made `from_header` has `buffer = None`: its
    layout is known, its data is not.
    """

    source: str
    buffer: np.ndarray | None
    version: int
    metadata: dict[str, object]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int

    def __init__(self, buffer: BytesLike, source: str = "<buffer>") -> None:
        """A whole file in memory: bytes, bytearray, memoryview, a NumPy array, a finished `PieceBuffer`'s array."""
        data = _as_bytes(buffer)
        self._set(source, data, _parse(data.data, data.size, source))

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> GGUFFile:
        """Memory-map a file read-only: the header parse reads its pages only, tensors are read on use."""
        path = os.fspath(path)
        source = os.path.basename(path)
        try:
            size = os.path.getsize(path)
            data = np.memmap(path, dtype=np.uint8, mode="r") if size else np.empty(0, np.uint8)
        except OSError as e:
            raise LoadError(f"cannot read {path}: {e.strerror or e}") from None
        file = cls.__new__(cls)
        file._set(source, data, _parse(data.data, size, source))
        return file

    @classmethod
    def from_header(cls, prefix: bytes | memoryview | np.ndarray, total_size: int, source: str) -> GGUFFile:
        """The layout of a file of `total_size` bytes from its first bytes (see `header_size`)."""
        view = _as_bytes(prefix).data
        try:
            header = _parse(view, total_size, source)
        except _IncompleteError:
            raise LoadError(
                f"{source}: the first {len(view)} bytes do not hold the whole header; "
                "pass at least the bytes header_size() asks for"
            ) from None
        file = cls.__new__(cls)
        file._set(source, None, header)
        return file

    def _set(self, source: str, buffer: np.ndarray | None, header: _Header) -> None:
        self.source, self.buffer = source, buffer
        self.version, self.metadata, self.tensors = header.version, header.metadata, header.tensors
        self.alignment, self.data_offset = header.alignment, header.data_offset

    @property
    def header_bytes(self) -> int:
        """The header's size with its padding: where the data section starts."""
        return self.data_offset

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only (rows, row_bytes) uint8 view, (1, nbytes) for a 1-D tensor."""
        info, data = self._data(name)
        view = data.reshape(info.rows, info.row_bytes)
        view.flags.writeable = False
        return view
