"""The stored tensors of a model folder, seen as logical tensors with a storage format.

`TensorStore` reads one or more safetensors files, or one GGUF file (gguf_model.py). Each logical
tensor has a storage format (`formats.py`) taken from the file's own metadata: ruvllm files say it in
`__metadata__`; plain Hugging Face checkpoints (f32/f16/bf16 only) are read by dtype; a GGUF's tensors
keep their GGUF types. Names are Hugging Face names; `sanitize` holds every key fix-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import LoadError
from . import jsonfields as fields
from .formats import GROUP, get_format
from .gguf_model import GGUFModel
from .tensorfile import SafetensorsFile

FORMAT_NAME = "ruvllm"
FORMAT_VERSION = "1"
_DTYPE_FORMATS = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


@dataclass(frozen=True)
class StoredTensor:
    name: str
    format: str
    shape: tuple[int, ...]
    file: SafetensorsFile | GGUFModel


class TensorStore:
    """Logical tensors over a set of safetensors files (a model may be split into shards) or a GGUF."""

    def __init__(self, files: list[SafetensorsFile | GGUFModel]) -> None:
        self.tensors: dict[str, StoredTensor] = {}
        for f in files:
            listed = f.logical_tensors() if isinstance(f, GGUFModel) else _logical_tensors(f)
            for name, fmt, shape in listed:
                if name in self.tensors:
                    raise LoadError(f"tensor {name!r} appears in both {self.tensors[name].file.source} and {f.source}")
                self.tensors[name] = StoredTensor(name, fmt, shape, f)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def names(self) -> list[str]:
        return list(self.tensors)

    def parts(self, name: str) -> dict[str, np.ndarray]:
        """The stored entries of one tensor (views into the file), keyed by suffix."""
        t = self._get(name)
        if isinstance(t.file, GGUFModel):
            return {"": t.file.get(name)}
        return {suffix: t.file.get(name + suffix) for suffix in get_format(t.format).part_specs(t.shape)}

    def load_f32(self, name: str) -> np.ndarray:
        """The tensor dequantized to a new float32 array."""
        t = self._get(name)
        return get_format(t.format).dequantize(self.parts(name), t.shape)

    def _get(self, name: str) -> StoredTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise LoadError(f"the model has no tensor {name!r}") from None


def _logical_tensors(f: SafetensorsFile) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, format, shape) of each logical tensor in one file, checked against the stored entries."""
    if f.metadata.get("format") != FORMAT_NAME:
        result = []
        for name, info in f.tensors.items():
            if info.dtype not in _DTYPE_FORMATS:
                raise LoadError(
                    f"{f.source}: tensor {name!r} has dtype {info.dtype}; a plain safetensors checkpoint must hold "
                    "F32, F16 or BF16 (convert it with `ruvllm convert`)"
                )
            result.append((name, _DTYPE_FORMATS[info.dtype], info.shape))
        return result

    version = f.metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise LoadError(
            f"{f.source}: ruvllm format version {version!r} is not supported (this build reads {FORMAT_VERSION})"
        )
    if "tensors" not in f.metadata:
        raise LoadError(f"{f.source}: __metadata__ 'tensors' is missing")
    table = fields.parse_json(f.metadata["tensors"], f"{f.source}: __metadata__ 'tensors'")
    table = fields.obj(table, f.source, "__metadata__ 'tensors'")
    result, claimed = [], set()
    for name, entry in table.items():
        where = f"{f.source}: tensor {name!r}"
        fields.obj(entry, where, "its __metadata__ entry")
        fmt = get_format(fields.string(entry, "format", where), where)
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(fields.is_int(d) and d >= 0 for d in shape):
            raise fields.fail(where, "shape", "a list of integers >= 0", shape)
        shape = tuple(shape)
        if fmt.quantized and entry.get("group_size") != GROUP:
            raise LoadError(f"{where}: group_size {entry.get('group_size')!r} is not supported (only {GROUP})")
        try:
            specs = fmt.part_specs(shape)
        except ValueError as e:
            raise LoadError(f"{where}: {e}") from None
        for suffix, (dtype, part_shape) in specs.items():
            stored = f.tensors.get(name + suffix)
            if stored is None:
                raise LoadError(f"{f.source}: tensor {name!r} ({fmt.name}) has no entry {name + suffix!r}")
            if stored.shape != part_shape or stored.dtype != dtype:
                raise LoadError(
                    f"{f.source}: entry {name + suffix!r} of {fmt.name} tensor {name!r} {list(shape)} should be "
                    f"{dtype} {list(part_shape)}, found {stored.dtype} {list(stored.shape)}"
                )
            claimed.add(name + suffix)
        result.append((name, fmt.name, shape))
    stray = set(f.tensors) - claimed
    if stray:
        raise LoadError(f"{f.source}: entries not described by the metadata: {', '.join(sorted(stray)[:5])}")
    return result


# ---------------------------------------------------------------------------------------------------
# Compute-side containers. Field names are the Hugging Face names.


def sanitize(names: list[str]) -> dict[str, str]:
    """HF name -> stored name. Every key fix-up lives here.

    Checkpoints saved from some trainers drop the `model.` prefix; old Llama checkpoints carry
    `rotary_emb.inv_freq` buffers, which are recomputed from the config instead.
    """
    mapping = {}
    for stored in names:
        if stored.endswith("rotary_emb.inv_freq"):
            continue
        name = stored
        if not name.startswith(("model.", "lm_head.")):
            name = "model." + name
        mapping[name] = stored
    return mapping


def count_parameters(store: TensorStore, is_counted: Callable[[str], bool] = lambda name: True) -> int:
    return sum(int(np.prod(t.shape)) for t in store.tensors.values() if is_counted(t.name))
