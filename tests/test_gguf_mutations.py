"""Mutants of the real SmolLM2 GGUF: `ruvllm info` (the header-only path) and a load that generates one
token either both succeed or both raise a RuvLLMError whose message names a key or a tensor.

A seeded generator rewrites the file's header (metadata values, their types and counts, tensor names,
shapes, types and offsets, the preamble) or cuts the file short. Only the header is written: the data
section is left as a hole of the original size (a sparse file reads as zeros), so a mutant of the 94 MB
file costs a few milliseconds to make. RUVLLM_GGUF_MUTANTS sets how many run (default 40: about twenty
seconds), RUVLLM_GGUF_MUTANT_SEED which ones.
"""

from __future__ import annotations

import math
import os
import random
import re
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

import ruvllm
from ruvllm.cli import build_parser, info
from ruvllm.errors import LoadError, RuvLLMError
from ruvllm.files.gguf_vocab import GGUFWarning

MUTANTS = int(os.environ.get("RUVLLM_GGUF_MUTANTS", "40"))
SEED = int(os.environ.get("RUVLLM_GGUF_MUTANT_SEED", "0"))

# GGUF value types: scalar id -> struct format; 8 string, 9 array.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
INTEGER_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)
RANGES = {t: (0, 2 ** (8 * struct.calcsize(SCALARS[t])) - 1) for t in (0, 2, 4, 10)} | {
    t: (-(2 ** (8 * struct.calcsize(SCALARS[t]) - 1)), 2 ** (8 * struct.calcsize(SCALARS[t]) - 1) - 1)
    for t in (1, 3, 5, 11)
}


def encode(vtype: int, value) -> bytes:
    """One value: a scalar, a string (str or raw bytes), or an array given as (element type, items)."""
    if vtype in SCALARS:
        return struct.pack(SCALARS[vtype], value)
    if vtype == STRING:
        raw = value.encode() if isinstance(value, str) else value
        return struct.pack("<Q", len(raw)) + raw
    etype, items = value
    return struct.pack("<IQ", etype, len(items)) + b"".join(encode(etype, item) for item in items)


def skip(data: bytes, pos: int, vtype: int) -> int:
    """The position after one value of type `vtype` at `pos`."""
    if vtype in SCALARS:
        return pos + struct.calcsize(SCALARS[vtype])
    if vtype == STRING:
        return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
    etype, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if etype in SCALARS:
        return pos + count * struct.calcsize(SCALARS[etype])
    for _ in range(count):
        pos = skip(data, pos, etype)
    return pos


def decode(vtype: int, raw: bytes):
    """The value `encode(vtype, value)` wrote (arrays as (element type, items))."""
    if vtype in SCALARS:
        return struct.unpack(SCALARS[vtype], raw)[0]
    if vtype == STRING:
        return raw[8:]
    etype, count = struct.unpack_from("<IQ", raw)
    items, pos = [], 12
    for _ in range(count):
        end = skip(raw, pos, etype)
        items.append(decode(etype, raw[pos:end]))
        pos = end
    return etype, items


@dataclass
class Header:
    """A GGUF header as editable parts; `kvs` hold each value's encoded bytes."""

    version: int
    kvs: list[tuple[bytes, int, bytes]]  # (key, value type, encoded value)
    tensors: list[tuple[bytes, tuple[int, ...], int, int]]  # (name, dims, ggml type, offset)
    data_size: int
    counts: tuple[int | None, int | None] = (None, None)  # (tensor_count, kv_count) when not the list lengths
    notes: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, data: bytes, size: int) -> Header:
        version, n_tensors, n_kvs = struct.unpack_from("<IQQ", data, 4)
        pos, kvs, tensors = 24, [], []
        for _ in range(n_kvs):
            (n,) = struct.unpack_from("<Q", data, pos)
            key, pos = data[pos + 8 : pos + 8 + n], pos + 8 + n
            (vtype,) = struct.unpack_from("<I", data, pos)
            end = skip(data, pos + 4, vtype)
            kvs.append((key, vtype, data[pos + 4 : end]))
            pos = end
        for _ in range(n_tensors):
            (n,) = struct.unpack_from("<Q", data, pos)
            name, pos = data[pos + 8 : pos + 8 + n], pos + 8 + n
            (n_dims,) = struct.unpack_from("<I", data, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * n_dims)
            tensors.append((name, dims, ggml_type, offset))
            pos += 4 + 8 * n_dims + 12
        data_offset = -(-pos // 32) * 32
        return cls(version, kvs, tensors, size - data_offset)

    def bytes(self) -> bytes:
        n_tensors = len(self.tensors) if self.counts[0] is None else self.counts[0]
        n_kvs = len(self.kvs) if self.counts[1] is None else self.counts[1]
        parts = [b"GGUF", struct.pack("<IQQ", self.version, n_tensors, n_kvs)]
        for key, vtype, raw in self.kvs:
            parts += [encode(STRING, key), struct.pack("<I", vtype), raw]
        for name, dims, ggml_type, offset in self.tensors:
            parts += [encode(STRING, name), struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)]
        head = b"".join(parts)
        return head + bytes(-len(head) % 32)

    def write(self, path: Path, cut: int | None = None) -> None:
        """The header, then a hole as long as the data section (cut short at `cut` bytes if given)."""
        head = self.bytes()
        size = len(head) + self.data_size if cut is None else cut
        with open(path, "wb") as f:
            f.write(head[:size])
            f.truncate(size)

    # --- edits

    def index(self, key: str) -> int | None:
        return next((i for i, (k, _, _) in enumerate(self.kvs) if k == key.encode()), None)

    def value(self, key: str):
        i = self.index(key)
        return None if i is None else decode(self.kvs[i][1], self.kvs[i][2])

    def set(self, key: str, vtype: int, value) -> None:
        entry = (key.encode(), vtype, encode(vtype, value))
        i = self.index(key)
        if i is None:
            self.kvs.append(entry)
        else:
            self.kvs[i] = entry
        self.notes.append(f"{key} = {_shown(vtype, value)}")


def _shown(vtype: int, value) -> str:
    if vtype == ARRAY:
        etype, items = value
        return f"array of {len(items)} type-{etype} values {items[:3]!r}..."
    return f"{value!r} (type {vtype})"


# --- the mutations: each edits a copy of the real header (or cuts the file) and says what it did.

INT_KEYS = (
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.vocab_size",
    "llama.rope.dimension_count",
    "llama.attention.key_length",
    "llama.attention.value_length",
    "general.alignment",
    "general.file_type",
)
FLOAT_KEYS = ("llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon", "llama.rope.scaling.factor")
TOKEN_ID_KEYS = tuple(
    f"tokenizer.ggml.{name}_token_id"
    for name in ("bos", "eos", "unknown", "padding", "eot", "eom", "seperator", "cls", "mask")
)
ARRAY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "general.languages")
STRING_KEYS = ("general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre", "llama.rope.scaling.type")
ODD_TENSOR_NAMES = (
    "blk.x.attn_q.weight",
    "blk.-1.ffn_up.weight",
    "blk.99999999999999999999.ffn_up.weight",
    "blk.30.attn_q.weight",
    "blk.attn_q",
    "blk.",
    "blk.07.ffn_up.weight",
    "blk.1.1.attn_q.weight",
    "",
    "output.weight",
    "rope_freqs.weight",
    "token_embd",
)


def int_value(rng: random.Random, h: Header) -> None:
    key = rng.choice(INT_KEYS)
    old = h.value(key)
    old = old if isinstance(old, int) else 30
    new = rng.choice([0, 1, 2, 7, 29, 31, old - 1, old + 1, old * 2, old // 2, 64, 2**31 - 1, 2**32 - 1])
    h.set(key, 4, max(0, min(new, 2**32 - 1)))


def retype(rng: random.Random, h: Header) -> None:
    key = rng.choice([*INT_KEYS[:8], *FLOAT_KEYS[:2], *TOKEN_ID_KEYS[:4], *STRING_KEYS[:3], ARRAY_KEYS[0]])
    old = h.value(key)
    number = old if isinstance(old, int | float) else 30
    vtype, value = rng.choice(
        [
            (6, float("nan")),
            (6, float("inf")),
            (6, 1.5),
            (12, float(number)),
            (12, -float(number)),
            (STRING, str(number)),
            (7, True),
            (5, -1),
            (11, -(2**63)),
            (10, 2**64 - 1),
            (1, -7),
            (ARRAY, (4, [int(number) if number == number else 0])),
            (ARRAY, (ARRAY, [(4, [1])])),
            (ARRAY, (STRING, [])),
        ]
    )
    h.set(key, vtype, value)


def float_value(rng: random.Random, h: Header) -> None:
    key = rng.choice(FLOAT_KEYS)
    value = rng.choice([float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e-30, 1e30, 2.0, 0.5, 1.0])
    if key == "llama.rope.scaling.factor":
        h.set("llama.rope.scaling.type", STRING, rng.choice(["linear", "yarn", "none"]))
    h.set(key, rng.choice([6, 12]), value)


def token_id(rng: random.Random, h: Header) -> None:
    key = rng.choice(TOKEN_ID_KEYS)
    value = rng.choice([49152, 49153, 99999, 2**31, 2**32 - 1, 49151, 0])
    h.set(key, rng.choice([4, 4, 5, 10]) if value < 2**31 else 4, value)


def array_value(rng: random.Random, h: Header) -> None:
    key = rng.choice(ARRAY_KEYS)
    etype, items = h.value(key)
    how = rng.choice(["drop last", "empty", "half", "append", "element type", "nested", "bad item", "repeat"])
    if how == "drop last":
        items = items[:-1]
    elif how == "empty":
        items = []
    elif how == "half":
        items = items[: len(items) // 2]
    elif how == "append":
        items = items + items[-3:]
    elif how == "element type":
        etype, items = rng.choice([(4, list(range(len(items)))), (6, [float("nan")] * len(items)), (7, [True])])
    elif how == "nested":
        etype, items = ARRAY, [(etype, items[:2])] * 3
    elif how == "bad item":
        i = rng.randrange(len(items))
        items = list(items)
        items[i] = {STRING: b"\xff\xfe not utf-8", 5: 2**31 - 1}.get(etype, items[i])
        if etype == STRING and rng.random() < 0.5:
            items[i] = b"nospace"
    elif len(items) > 1:  # a repeated token
        items = list(items)
        items[rng.randrange(1, len(items))] = items[0]
    h.notes.append(f"{key}: {how}")
    h.set(key, ARRAY, (etype, items))


def nested(rng: random.Random, h: Header) -> None:
    """An array of one array of one array ... of [7], `depth` arrays deep (written flat: no recursion)."""
    depth = rng.choice([3, 20, 200, 3000])
    key = rng.choice(["general.nested", "tokenizer.ggml.tokens"])
    raw = struct.pack("<IQ", ARRAY, 1) * (depth - 1) + encode(ARRAY, (4, [7]))
    h.kvs = [entry for entry in h.kvs if entry[0] != key.encode()] + [(key.encode(), ARRAY, raw)]
    h.notes.append(f"{key} = [7] in arrays {depth} deep")


def string_value(rng: random.Random, h: Header) -> None:
    key = rng.choice(STRING_KEYS)
    h.set(key, STRING, rng.choice(["", "llama2", "gpt2", "gemma3", "bert", "none", "linear", b"\xc3\x28", "x" * 300]))


def drop_key(rng: random.Random, h: Header) -> None:
    i = rng.randrange(len(h.kvs))
    h.notes.append(f"no {h.kvs[i][0]!r}")
    del h.kvs[i]


def repeat_key(rng: random.Random, h: Header) -> None:
    i = rng.randrange(len(h.kvs))
    h.notes.append(f"{h.kvs[i][0]!r} twice")
    h.kvs.insert(rng.randrange(len(h.kvs)), h.kvs[i])


def rename_tensor(rng: random.Random, h: Header) -> None:
    i = rng.randrange(len(h.tensors))
    name, dims, t, offset = h.tensors[i]
    if rng.random() < 0.3:  # swap two names
        j = rng.randrange(len(h.tensors))
        h.tensors[j], h.tensors[i] = (name, *h.tensors[j][1:]), (h.tensors[j][0], dims, t, offset)
        h.notes.append(f"tensors {name!r} and {h.tensors[i][0]!r} swap names")
        return
    new = rng.choice(ODD_TENSOR_NAMES).encode()
    h.tensors[i] = (new, dims, t, offset)
    h.notes.append(f"tensor {name!r} renamed {new!r}")


def reshape_tensor(rng: random.Random, h: Header) -> None:
    i = rng.randrange(len(h.tensors))
    name, dims, t, offset = h.tensors[i]
    d = rng.randrange(len(dims))
    new = list(dims)
    how = rng.choice(["double", "half", "plus block", "one", "zero", "huge", "swap", "extra dim", "drop dim"])
    if how == "double":
        new[d] *= 2
    elif how == "half":
        new[d] //= 2
    elif how == "plus block":
        new[d] += 32
    elif how == "one":
        new[d] = 1
    elif how == "zero":
        new[d] = 0
    elif how == "huge":
        new[d] = rng.choice([2**40, 2**63, 2**64 - 1])
    elif how == "swap":
        new.reverse()
    elif how == "extra dim":
        new.append(rng.choice([1, 2]))
    elif len(new) > 1:
        new.pop()
    h.tensors[i] = (name, tuple(new), t, offset)
    h.notes.append(f"tensor {name!r} shape {dims} -> {tuple(new)}")


def retype_tensor(rng: random.Random, h: Header) -> None:
    i = rng.randrange(len(h.tensors))
    name, dims, t, offset = h.tensors[i]
    new = rng.choice([0, 1, 2, 3, 6, 8, 12, 14, 16, 24, 30, 39, 1000])
    h.tensors[i] = (name, dims, new, offset)
    h.notes.append(f"tensor {name!r} type {t} -> {new}")


def move_tensor(rng: random.Random, h: Header) -> None:
    i = rng.randrange(len(h.tensors))
    name, dims, t, offset = h.tensors[i]
    new = rng.choice([offset + 1, offset + 32, h.data_size, h.data_size + 32, 2**40, h.tensors[0][3]])
    h.tensors[i] = (name, dims, t, new)
    h.notes.append(f"tensor {name!r} offset {offset} -> {new}")


def drop_tensor(rng: random.Random, h: Header) -> None:
    i = rng.randrange(len(h.tensors))
    h.notes.append(f"no tensor {h.tensors[i][0]!r}")
    del h.tensors[i]


def drop_blocks(rng: random.Random, h: Header) -> None:
    """Blocks taken out: from the top with block_count to match (a smaller model that works), or one in
    the middle."""
    blocks = h.value("llama.block_count")
    if not isinstance(blocks, int) or blocks < 2:
        return
    if rng.random() < 0.5:
        keep = rng.randrange(1, blocks)
        h.tensors = [t for t in h.tensors if not t[0].startswith(b"blk.") or int(t[0].split(b".")[1]) < keep]
        h.set("llama.block_count", 4, keep)
    else:
        gone = rng.randrange(blocks)
        h.tensors = [t for t in h.tensors if not t[0].startswith(b"blk.%d." % gone)]
        h.notes.append(f"no tensors for block {gone}")


def miscount(rng: random.Random, h: Header) -> None:
    which = rng.randrange(2)
    n = (len(h.tensors), len(h.kvs))[which] + rng.choice([-1, 1, 2**32, 2**63])
    h.counts = (n, None) if which == 0 else (None, n)
    h.notes.append(f"{('tensor_count', 'kv_count')[which]} {n}")


def version(rng: random.Random, h: Header) -> None:
    h.version = rng.choice([0, 1, 2, 4, 3 << 24])
    h.notes.append(f"version {h.version}")


MUTATIONS = [
    int_value,
    int_value,
    retype,
    float_value,
    token_id,
    array_value,
    nested,
    string_value,
    drop_key,
    repeat_key,
    rename_tensor,
    reshape_tensor,
    retype_tensor,
    move_tensor,
    drop_tensor,
    drop_blocks,
    miscount,
    version,
]


@pytest.fixture(scope="module")
def original(smollm2_gguf) -> Header:
    size = os.path.getsize(smollm2_gguf)
    with open(smollm2_gguf, "rb") as f:
        head = f.read(4 * 2**20)
    return Header.read(head, size)


def mutant(original: Header, index: int, path: Path) -> Header:
    """Write mutant `index` to `path`; returns its header (`notes` say what was changed)."""
    rng = random.Random(SEED * 1_000_003 + index)
    h = replace(original, kvs=list(original.kvs), tensors=list(original.tensors), notes=[])
    if rng.random() < 0.06:
        size = len(h.bytes()) + h.data_size
        cut = rng.choice([rng.randrange(24, len(h.bytes())), rng.randrange(len(h.bytes()), size)])
        h.write(path, cut)
        h.notes.append(f"cut to {cut} of {size} bytes")
        return h
    for _ in range(1 if rng.random() < 0.8 else 2):
        rng.choice(MUTATIONS)(rng, h)
    h.write(path)
    return h


def run_info(path: Path) -> None:
    info.run(build_parser().parse_args(["info", str(path), "--compute", "q8"]))


def run_generate(path: Path) -> None:
    model = ruvllm.load(str(path), compute="q8")
    assert len(list(model.generate(model.tokenizer.encode("Hi"), max_tokens=1, temperature=0))) == 1


def outcome(run, path: Path) -> str | None:
    """None when `run` succeeds, the message of the RuvLLMError it raises; any other exception fails the test."""
    try:
        run(path)
    except RuvLLMError as e:
        assert "\n" not in e.message, e.message
        return e.message
    return None


def names_what(message: str, path: Path, *headers: Header) -> bool:
    """Whether the message names a metadata key (of the file, or one it lacks), a tensor, or the preamble
    field at fault."""
    message = message.replace(str(path), "").replace(path.name, "")
    named = {k.decode(errors="replace") for h in headers for k, _, _ in h.kvs}
    named |= {t[0].decode(errors="replace") for h in headers for t in h.tensors}
    if any(re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", message) for n in named if n):
        return True
    keys = r"\b(general|tokenizer|llama|gemma3|qwen2|qwen3|phi3)\.\w"
    return bool(re.search(rf"{keys}|kv_count|tensor_count|version|GGUF file|key-value pair #|tensor #", message))


@pytest.mark.filterwarnings("ignore::ruvllm.files.gguf_vocab.GGUFWarning")
@pytest.mark.parametrize("index", range(MUTANTS))
def test_info_and_generate_agree_on_a_mutant(index, original, tmp_path, capsys):
    path = tmp_path / "mutant.gguf"
    h = mutant(original, index, path)
    what = "; ".join(h.notes)
    info_error = outcome(run_info, path)
    generate_error = outcome(run_generate, path)
    capsys.readouterr()
    print(f"mutant {index}: {what}\n  info: {info_error}\n  generate: {generate_error}")
    assert (info_error is None) == (generate_error is None), (what, info_error, generate_error)
    for message in (info_error, generate_error):
        if message is not None:
            assert names_what(message, path, h, original), (what, message)


# --- hand-made mutants: each refused by `info` and by a load with the same message, naming key and tensor


def edited(original: Header, edit) -> Header:
    h = replace(original, kvs=list(original.kvs), tensors=list(original.tensors), notes=[])
    edit(h)
    return h


def rename(old: str, new: str):
    def edit(h: Header) -> None:
        h.tensors = [(new.encode() if t[0] == old.encode() else t[0], *t[1:]) for t in h.tensors]

    return edit


def keys(*changes: tuple[str, int, object]):
    def edit(h: Header) -> None:
        for key, vtype, value in changes:
            if vtype is None:
                h.kvs = [entry for entry in h.kvs if entry[0] != key.encode()]
            else:
                h.set(key, vtype, value)

    return edit


def extra_tensor(name: str):
    """A copy of blk.0.attn_norm.weight named `name`, its data after all the others'."""

    def edit(h: Header) -> None:
        _, dims, ggml_type, _ = next(t for t in h.tensors if t[0] == b"blk.0.attn_norm.weight")
        h.tensors.append((name.encode(), dims, ggml_type, h.data_size))
        h.data_size += 576 * 4

    return edit


def one_more_token(h: Header) -> None:
    for key, extra in (("tokenizer.ggml.tokens", b"<extra>"), ("tokenizer.ggml.token_type", 1)):
        etype, items = h.value(key)
        h.set(key, ARRAY, (etype, [*items, extra]))
    keys(("llama.vocab_size", None, None))(h)


def no_block(index: int):
    def edit(h: Header) -> None:
        h.tensors = [t for t in h.tensors if not t[0].startswith(b"blk.%d." % index)]

    return edit


def no_tensor(name: str):
    def edit(h: Header) -> None:
        h.tensors = [t for t in h.tensors if t[0] != name.encode()]

    return edit


def nested_key(h: Header) -> None:
    h.kvs.append((b"general.nested", ARRAY, struct.pack("<IQ", ARRAY, 1) * 2999 + encode(ARRAY, (4, [7]))))


NAN, F32, F64, U32 = float("nan"), 6, 12, 4
HAND_MADE = {
    **{
        f"block_count {count}": (
            keys(("llama.block_count", U32, count)),
            f"llama.block_count is {count} but the file has tensors for 30 blocks (blk.0 .. blk.29)",
        )
        for count in (7, 1, 31)
    },
    "a block missing": (no_block(15), "llama.block_count is 30 but the file has no tensors for block 15 (blk.15.*)"),
    "an extra block": (
        extra_tensor("blk.30.attn_norm.weight"),
        "llama.block_count is 30 but the file has tensors for 31 blocks (blk.0 .. blk.30)",
    ),
    "a block past the others": (
        extra_tensor("blk.40.attn_norm.weight"),
        "llama.block_count is 30 (blocks blk.0 .. blk.29) but the file has tensor 'blk.40.attn_norm.weight'",
    ),
    "a block number of 20 digits": (
        rename("blk.29.ffn_up.weight", "blk.99999999999999999999.ffn_up.weight"),
        "llama.block_count is 30 (blocks blk.0 .. blk.29) but the file has tensor "
        "'blk.99999999999999999999.ffn_up.weight'",
    ),
    **{
        what: (
            rename(old, new),
            f"tensor '{new}' is not named blk.<block number>.<part> (as blk.0.attn_q.weight)",
        )
        for what, old, new in (
            ("a block that is not a number", "blk.3.attn_q.weight", "blk.x.attn_q.weight"),
            ("a negative block", "blk.3.ffn_up.weight", "blk.-1.ffn_up.weight"),
            ("blk without a part", "blk.3.attn_q.weight", "blk.attn_q"),
        )
    },
    "a tensor missing": (
        no_tensor("blk.4.attn_v.weight"),
        "the file has no tensor 'blk.4.attn_v.weight' (every block of a llama model has attn_norm.weight, "
        "attn_q.weight, attn_k.weight, attn_v.weight, ffn_gate.weight, ffn_up.weight, attn_output.weight, "
        "ffn_norm.weight, ffn_down.weight)",
    ),
    "embedding_length 1152": (
        keys(("llama.embedding_length", U32, 1152), ("llama.rope.dimension_count", U32, 128)),
        "tensor 'token_embd.weight' has shape [576, 49152] but the metadata calls for [1152, 49152] "
        "(llama.embedding_length 1152)",
    ),
    **{  # one key of the SmolLM2 file changed
        f"{key.split('.')[-1]} {value}": (keys((f"llama.{key}", U32, value)), message)
        for key, value, message in (
            (
                "embedding_length",
                577,
                "llama.embedding_length 577 is not a multiple of llama.attention.head_count 9, and there is no "
                "llama.attention.key_length to give the head size",
            ),
            (
                "feed_forward_length",
                1537,
                "tensor 'blk.0.ffn_gate.weight' has shape [576, 1536] but the metadata calls for [576, 1537] "
                "(llama.feed_forward_length 1537)",
            ),
            (
                "attention.head_count_kv",
                1,
                "tensor 'blk.0.attn_k.weight' has shape [576, 192] but the metadata calls for [576, 64] "
                "(llama.attention.head_count_kv 1 x head size 64, the head size being llama.embedding_length "
                "576 / llama.attention.head_count 9)",
            ),
            (
                "attention.head_count_kv",
                2,
                "llama.attention.head_count 9 is not a multiple of llama.attention.head_count_kv 2",
            ),
            (
                "attention.head_count",
                18,
                "llama.rope.dimension_count is 64, not the head size 32: partial RoPE is not supported",
            ),
            (
                "attention.value_length",
                32,
                "llama.attention.value_length is 32, not the head size 64: value heads of another size are not "
                "supported",
            ),
            ("vocab_size", 49153, "llama.vocab_size is 49153 but tokenizer.ggml.tokens lists 49152 tokens"),
        )
    },
    "key_length 32": (
        keys(("llama.attention.key_length", U32, 32), ("llama.rope.dimension_count", U32, 32)),
        "tensor 'blk.0.attn_q.weight' has shape [576, 576] but the metadata calls for [576, 288] "
        "(llama.attention.head_count 9 x head size 32, the head size being llama.attention.key_length)",
    ),
    "a token more than token_embd has rows": (
        one_more_token,
        "tensor 'token_embd.weight' has shape [576, 49152] but the metadata calls for [576, 49153] "
        "(the 49153 tokens of tokenizer.ggml.tokens)",
    ),
    **{
        f"{key} {found}": (
            keys((f"llama.{key}", vtype, value)),
            f"GGUF metadata llama.{key} must be {rule}, found {found}",
        )
        for key, vtype, value, found, rule in (
            ("context_length", U32, 0, "0", "an integer from 1 to 16777216"),
            ("context_length", U32, 2**31, "2147483648", "an integer from 1 to 16777216"),
            ("block_count", F32, NAN, "nan", "an integer from 1 to 2147483647"),
            ("block_count", F64, 30.0, "30.0", "an integer from 1 to 2147483647"),
            ("vocab_size", F32, NAN, "nan", "an integer from 1 to 2147483647"),
            ("attention.head_count", STRING, "9", "'9'", "an integer from 1 to 2147483647"),
            ("rope.freq_base", F32, NAN, "nan", "a finite number > 0"),
            ("rope.freq_base", F64, 1e39, "1e+39", "a finite number > 0"),
            ("attention.layer_norm_rms_epsilon", F32, 0.0, "0.0", "a number in (0, 1)"),
            ("attention.layer_norm_rms_epsilon", F32, -float("inf"), "-inf", "a number in (0, 1)"),
        )
    },
    "rope scaling yarn": (
        keys(("llama.rope.scaling.type", STRING, "yarn")),
        "llama.rope.scaling.type 'yarn' is not supported; supported: none, linear",
    ),
    "arrays nested 3000 deep": (
        nested_key,
        "key 'general.nested'[0][0][0][0][0][0][0] holds arrays nested more than 8 deep; GGUF metadata nests "
        "arrays once or twice at most",
    ),
    **{
        f"{name} id {value}": (
            keys((f"tokenizer.ggml.{name}_token_id", U32, value)),
            f"GGUF metadata tokenizer.ggml.{name}_token_id must be a token id (an integer from 0 to 49151), "
            f"found {value}: the vocabulary (tokenizer.ggml.tokens) has 49152 tokens",
        )
        for name, value in (("bos", 49152), ("eos", 2**32 - 1), ("eot", 49152), ("unknown", 99999), ("eom", 50000))
    },
}


@pytest.mark.parametrize("case", list(HAND_MADE))
def test_metadata_that_contradicts_the_file_is_refused_by_info_and_by_a_load(case, original, tmp_path, capsys):
    edit, message = HAND_MADE[case]
    path = tmp_path / "bad.gguf"
    edited(original, edit).write(path)
    for run in (run_info, run_generate):
        with pytest.raises(RuvLLMError) as refused:
            run(path)
        assert refused.value.message == f"bad.gguf: {message}", run.__name__
    assert capsys.readouterr().out == ""


def test_the_header_rewritten_unchanged_loads(original, tmp_path, capsys):
    """The generator's own check: the real header, written back with a hole for its data, passes both."""
    path = tmp_path / "same.gguf"
    original.write(path)
    run_info(path)
    run_generate(path)
    assert "architecture   LlamaForCausalLM" in capsys.readouterr().out


UNUSED_IDS = ("padding", "seperator", "cls", "mask")


@pytest.mark.parametrize("name", UNUSED_IDS)
def test_an_unused_special_id_outside_the_vocabulary_is_ignored_with_a_warning(name, original, tmp_path, capsys):
    """As llama.cpp does (llama-vocab.cpp warns about a bad special id and falls back to none): these ids
    change nothing ruvllm computes, and real files carry such ids (a padding id equal to the vocabulary size)."""
    path = tmp_path / "odd.gguf"
    edited(original, keys((f"tokenizer.ggml.{name}_token_id", U32, 49152))).write(path)
    warning = (
        f"odd.gguf: GGUF metadata tokenizer.ggml.{name}_token_id 49152 is ignored: the vocabulary "
        "(tokenizer.ggml.tokens) has 49152 tokens"
    )
    run_info(path)
    assert f"warning        {warning}\n" in capsys.readouterr().out
    with pytest.warns(GGUFWarning, match=re.escape(warning)):
        model = ruvllm.load(str(path), compute="q8")
    assert model.engine.config.vocab_size == 49152
    assert len(list(model.generate(model.tokenizer.encode("Hi"), max_tokens=1))) == 1


def test_a_file_claiming_more_memory_than_the_machine_has_is_refused_before_allocating(original, tmp_path, monkeypatch):
    """A sparse file whose header is consistent but claims ~90 GiB of weights: the plan refuses it with the
    figures before any weight is read (it used to end in a MemoryError after allocating 6.6 GiB)."""
    from ruvllm.files.ggml import GGML_TYPES
    from ruvllm.runtime import planner

    monkeypatch.setattr(planner, "machine_memory", lambda: 8 * 2**30)
    F = 3_000_000  # feed_forward_length, from 1536: each FFN matrix ~1 GiB in Q4_1
    h = edited(original, keys(("llama.feed_forward_length", U32, F)))
    tensors, offset = [], 0
    for name, dims, ggml_type, _ in h.tensors:
        if b".ffn_" in name and b"norm" not in name:
            dims = (576, F) if dims[1] == 1536 else (F, 576)
        tensors.append((name, dims, ggml_type, offset))
        nbytes = GGML_TYPES[ggml_type].row_bytes(dims[0]) * math.prod(dims[1:])
        offset += -(-nbytes // 32) * 32
    h.tensors, h.data_size = tensors, offset
    path = tmp_path / "huge.gguf"
    h.write(path)
    assert os.path.getsize(path) > 90 * 2**30
    message = (
        r"the model does not fit this machine's memory \(8\.0 GiB\): in its smallest form \(q4\) it needs "
        r"\d+\.\d GiB: weights .* MiB; try a smaller model \(its weights alone do not fit\)"
    )
    for run in (lambda p: info.run(build_parser().parse_args(["info", str(p)])), lambda p: ruvllm.load(str(p))):
        with pytest.raises(LoadError, match=message):
            run(path)
    with pytest.raises(
        LoadError, match=r"does not fit this machine's memory \(8\.0 GiB\): in its smallest form \(f32\)"
    ):
        ruvllm.load(str(path), compute="f32")
