"""Assembling a model from its files: the one way an Engine is made from them, whatever reads the bytes
(`read_local`: a folder or a GGUF file on disk, for api.load; host.py: over fetch in Pyodide, for
api.load_async; bridge.ModelLoader: for the npm worker, which only moves bytes).

An Assembly asks for the files it needs, one at a time (`next()`), in the order

    config -> tokenizer -> headers -> plan -> pieces -> build

A folder's JSON documents come first, whole (files/layout.py lists them; the index, if any, names the
weight files); then each weight file's header, its first bytes (a GGUF's header stands for the
documents: it holds the config and the tokenizer); once every header is in, the memory plan is made and
checked, so a model that cannot fit is refused before its tensor data is read; then each file's bytes,
copied once into a buffer Python owns (`begin`, `write`, `finish`) or handed over whole (`give_file`:
a file mapped from disk is its header and its data at once); then `build()`. Front ends differ only in
how the bytes arrive; what the files mean, and in what order they are needed, is decided here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np

from ..errors import DownloadError, InvalidArgumentError, LoadError
from ..files import jsonfields as fields
from ..files import layout
from ..files.gguf import GGUFFile, header_size
from ..files.gguf_model import GGUFModel
from ..files.store import TensorStore
from ..files.tensorfile import PieceBuffer, SafetensorsFile
from ..model.cache import KVOptions
from ..model.config import ModelConfig
from ..model.weights import ComputeOptions
from .engine import Engine, LoadOptions, plan_for
from .planner import MemoryPlan

WeightFile = SafetensorsFile | GGUFModel


class Arriving(Protocol):
    """Where a weight file's bytes go as they arrive (files/tensorfile.PieceBuffer, quant/pool.OutsideFile)."""

    @property
    def size(self) -> int: ...

    @property
    def filled(self) -> int: ...

    @property
    def bytes(self) -> Any:
        """The file's bytes: an array, or an object read by slices as one (quant/pool.RemoteArray)."""
        ...

    def write(self, chunk: Any, length: int) -> memoryview:
        """Append `length` bytes (a JsProxy of a Uint8Array, or a bytes-like object); what was written."""
        ...


Buffers = Callable[[int, str], Arriving]  # (size, name) -> where a weight file's bytes go


class Arrived(NamedTuple):
    """A weight file that `Assembly.finish`ed: its size, and its bytes when they are in an array of the
    heap (what a cache may store; None when they went outside it, to the pool's memory)."""

    size: int
    array: np.ndarray | None


@dataclass(frozen=True)
class Want:
    """What an Assembly needs next: file `name` of the model, as a whole JSON document (`optional`: it may
    be missing), as its header (its first bytes, until `Assembly.header_size` says they hold it), or as
    its data (the whole file from its first byte)."""

    name: str
    part: Literal["document", "header", "data"]
    optional: bool = False


class Assembly:
    """A model being assembled from its files (the module's docstring says in what order).

    options: how the engine is to be loaded (None: the files are only read, no plan is made); gguf: the
    name of the model's GGUF file, or None for a folder; where: the folder or URL the files come from, for
    messages; buffers: where arriving weight files go (a PieceBuffer each by default); sha256: the hex
    digests some weight files must have (checked as they arrive; a name the model lacks is refused as soon
    as the weight files are known, before their bytes); needs_tokenizer: False makes a folder's
    tokenizer.json optional (an engine alone maps ids to logits: tests and tools load folders without one)."""

    def __init__(
        self,
        options: LoadOptions | None = None,
        gguf: str | None = None,
        where: str = "",
        buffers: Buffers = PieceBuffer,
        sha256: dict[str, str] | None = None,
        needs_tokenizer: bool = True,
    ) -> None:
        self.options, self.needs_tokenizer = options, needs_tokenizer
        self.gguf, self.where, self.buffers = gguf, where, buffers
        self.sha256 = {name: digest.lower() for name, digest in (sha256 or {}).items()}
        self.documents: dict[str, bytes | None] = {}  # a folder's JSON files as they came (None: missing)
        self.config: ModelConfig | None = None
        self.weights: list[str] | None = None  # the weight files, once known
        if gguf is not None:
            self._set_weights([gguf])
        self.headers: dict[str, WeightFile] = {}  # each weight file's layout (its data may not be in)
        self.plan: MemoryPlan | None = None  # made once every header is in
        self.arriving: dict[str, Arriving] = {}
        self.hashes: dict[str, Any] = {}
        self.complete: dict[str, WeightFile] = {}

    def source(self, name: str) -> str:
        """Where file `name` comes from, for messages."""
        if self.gguf is not None:
            return self.where or name
        return os.path.join(self.where, name) if self.where and "://" not in self.where else self.where + name

    def next(self) -> Want | None:
        """What to give next, or None once every file is in (then `build`)."""
        if self.gguf is None:
            for name, optional in layout.DOCUMENTS:
                if name not in self.documents:
                    return Want(name, "document", optional or (name == layout.TOKENIZER and not self.needs_tokenizer))
        assert self.weights is not None  # (set by the index's document, or by the GGUF's name)
        for name in self.weights:
            if name not in self.headers:
                return Want(name, "header")
        for name in self.weights:
            if name not in self.complete:
                return Want(name, "data")
        return None

    def _expect(self, name: str, *parts: str) -> Want:
        want = self.next()
        if want is None or want.name != name or want.part not in parts:
            wanted = "nothing more" if want is None else f"{want.part} of {want.name}"
            raise LoadError(f"{self.source(name)} came out of turn: the model's assembly wanted the {wanted}")
        return want

    # --- config -> tokenizer: a folder's documents ---------------------------------------------------

    def give_document(self, name: str, data: bytes | bytearray | memoryview | None) -> None:
        """A folder's JSON file, whole (None: it is not there). The config is read at once: a model
        ruvllm cannot run is refused before its weights are asked for."""
        want = self._expect(name, "document")
        where = self.source(name)
        if data is None and not want.optional:
            hint = " (is this a model folder?)" if name == layout.CONFIG else ""
            raise LoadError(f"{self.where}: no {name}{hint}" if self.where else f"the model has no {name}{hint}")
        self.documents[name] = None if data is None else bytes(data)
        if name == layout.CONFIG:
            self.config = ModelConfig.from_dict(self.document(name), where)
        elif name == layout.WEIGHTS_INDEX:
            self._set_weights(layout.weight_files(None if data is None else self.document(name), where))

    def _set_weights(self, names: list[str]) -> None:
        unknown = [name for name in self.sha256 if name not in names]
        if unknown:
            raise InvalidArgumentError(
                f"options.sha256 names {', '.join(json.dumps(n) for n in unknown)}, which this model does not "
                f"have; its weight files are: {', '.join(names)}"
            )
        self.weights = names

    def document(self, name: str) -> dict:
        """A folder's JSON document, parsed ({} for an optional one that is missing)."""
        data = self.documents.get(name)
        return {} if data is None else fields.obj(fields.parse_json(data, self.source(name)), self.source(name))

    def text(self, name: str) -> str | None:
        """A folder's document as text (what `tokenizers` reads without a second parse), None if missing."""
        data = self.documents.get(name)
        return None if data is None else fields.utf8_text(data, self.source(name))

    # --- headers -> plan ----------------------------------------------------------------------------

    def header_size(self, name: str, size: int, head: Any) -> int | None:
        """How many first bytes of weight file `name` (`size` bytes) hold its header, or None while
        `head`, its first bytes so far, is too short to tell."""
        head = memoryview(head).cast("B")
        if name == self.gguf:
            return header_size(head, size, self.source(name))
        if len(head) < 8:
            return None
        return min(size, 8 + int.from_bytes(head[:8], "little"))

    def give_header(self, name: str, size: int, head: Any) -> MemoryPlan | None:
        """The first bytes of weight file `name` (at least its header); after the last header, the plan
        made and checked (a LoadError when the model cannot fit)."""
        self._expect(name, "header")
        where = self.source(name)
        if name == self.gguf:
            self._add_header(name, GGUFModel(GGUFFile.from_header(head, size, where)))
        else:
            self._add_header(name, SafetensorsFile.from_header(head, size, where))
        return self.plan

    def _add_header(self, name: str, file: WeightFile) -> None:
        if isinstance(file, GGUFModel):
            self.config = ModelConfig.from_dict(file.config, f"{self.source(name)} (GGUF metadata)")
        self.headers[name] = file
        assert self.weights is not None and self.config is not None
        if self.options is not None and all(n in self.headers for n in self.weights):
            self.plan = plan_for(self.config, TensorStore([self.headers[n] for n in self.weights]), self.options)

    def tokenizer_files(self, merges: bool = True) -> tuple[str | dict, dict, dict]:
        """(tokenizer.json, tokenizer_config.json, generation_config.json): a folder's documents (the first
        as its text, what `tokenizers` reads without a second parse), or a GGUF's, made from its header's
        metadata (merges: list the BPE merges; without them only the plain-Python tokenizer reads it)."""
        if self.gguf is None:
            tokenizer = self.text(layout.TOKENIZER)
            if tokenizer is None:  # (an assembly that does not need it)
                raise LoadError(f"{self.where or '.'}: no {layout.TOKENIZER}")
            return tokenizer, self.document(layout.TOKENIZER_CONFIG), self.document(layout.GENERATION_CONFIG)
        model = self.headers[self.gguf]
        assert isinstance(model, GGUFModel)
        return model.tokenizer_files(merges=merges)

    def tokenizer_sources(self) -> tuple[str, str]:
        """Where the tokenizer and its config come from, for messages."""
        if self.gguf is not None:
            return f"{self.source(self.gguf)} (GGUF tokenizer)", f"{self.source(self.gguf)} (GGUF metadata)"
        return self.source(layout.TOKENIZER), self.source(layout.TOKENIZER_CONFIG)

    # --- pieces -------------------------------------------------------------------------------------

    def begin(self, name: str, size: int) -> None:
        """Weight file `name`'s bytes follow (`write`), from its first byte; `size` as its header said."""
        self._expect(name, "data")
        self.arriving[name] = self.buffers(size, self.source(name))
        if name in self.sha256:
            self.hashes[name] = hashlib.sha256()

    def write(self, name: str, chunk: Any) -> int:
        """Append a piece (a JsProxy of a Uint8Array, or any bytes-like object); the bytes so far."""
        arriving = self.arriving.get(name)
        if arriving is None:
            raise LoadError(f"{self.source(name)}: bytes came before the file was begun")
        length = int(chunk.length) if hasattr(chunk, "assign_to") else memoryview(chunk).nbytes
        if arriving.filled + length > arriving.size:
            raise DownloadError(f"{name}: received more than the announced {arriving.size} bytes")
        written = arriving.write(chunk, length)
        if name in self.hashes:
            self.hashes[name].update(written)
        return arriving.filled

    def finish(self, name: str) -> Arrived:
        """Every byte of file `name` arrived (with the digest `sha256` names for it, if any)."""
        arriving = self.arriving.pop(name, None)
        if arriving is None:
            raise LoadError(f"{self.source(name)}: finished before it was begun")
        if arriving.filled != arriving.size:
            raise DownloadError(f"{name}: download incomplete: received {arriving.filled} of {arriving.size} bytes")
        if name in self.hashes:
            digest, expected = self.hashes.pop(name).hexdigest(), self.sha256[name]
            if digest != expected:
                raise DownloadError(f"{name}: sha256 mismatch: expected {expected}, got {digest}")
        header = self.headers[name]
        if isinstance(arriving, PieceBuffer):  # the file parsed again, whole: its data now checked too
            array, where = arriving.array, self.source(name)
            self.complete[name] = (
                GGUFModel(GGUFFile(array, where)) if name == self.gguf else SafetensorsFile(array, where)
            )
            return Arrived(arriving.size, array)
        file = header.file if isinstance(header, GGUFModel) else header  # bytes outside the heap, which
        assert file.buffer is None  # the header read at the start describes
        file.buffer = arriving.bytes
        self.complete[name] = header
        return Arrived(arriving.size, None)

    def give_file(self, name: str, file: WeightFile) -> MemoryPlan | None:
        """Weight file `name` whole (mapped from disk): its header and its data at once."""
        self._expect(name, "header", "data")
        if name not in self.headers:
            self._add_header(name, file)
        self.complete[name] = file
        return self.plan

    # --- build --------------------------------------------------------------------------------------

    def store(self) -> TensorStore:
        """The weights given, as one store (the files in the layout's order)."""
        assert self.weights is not None
        missing = [n for n in self.weights if n not in self.complete]
        if missing:
            raise LoadError(f"{self.source(missing[0])} was not given")
        return TensorStore([self.complete[n] for n in self.weights])

    def build(self) -> Engine:
        """The engine, from every file given; the assembly lets go of their buffers."""
        if self.config is None:
            raise LoadError("the model's config was not given")
        engine = Engine.from_store(self.config, self.store(), self.options or LoadOptions(), self.plan)
        self.complete.clear()
        return engine


def read_local(assembly: Assembly, path: str, header_only: bool = False) -> Assembly:
    """Give `assembly` the files of the model at `path` (a folder, or the GGUF file `assembly.gguf`),
    each weight file mapped into memory (header only: its layout, no data), in the order it asks."""
    while (want := assembly.next()) is not None:
        if want.part == "document":
            assembly.give_document(want.name, _read(os.path.join(path, want.name)))
        elif assembly.gguf is not None:
            if not os.path.isfile(path):
                raise LoadError(f"{path}: GGUF file not found")
            assembly.give_file(want.name, GGUFModel(GGUFFile.from_path(path)))
        else:
            file = os.path.join(path, want.name)
            if not os.path.isfile(file):
                raise LoadError(f"{path}: no {want.name} (its weights)")
            assembly.give_file(want.name, SafetensorsFile.from_path(file, header_only))
    return assembly


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LoadError(f"cannot read {path}: {e.strerror or e}") from None


def is_gguf(path: str) -> bool:
    return layout.is_gguf_name(path) and not os.path.isdir(path)


def local_assembly(
    path: str, options: LoadOptions | None = None, header_only: bool = False, needs_tokenizer: bool = True
) -> Assembly:
    """The model at `path` (a folder or a GGUF file on disk), assembled from its files."""
    if not is_gguf(path) and not os.path.isdir(path):
        raise LoadError(f"{path}: model folder not found")
    gguf = os.path.basename(path) if is_gguf(path) else None
    return read_local(Assembly(options, gguf, path, needs_tokenizer=needs_tokenizer), path, header_only)


def open_gguf(path: str) -> GGUFModel:
    """The model in a GGUF file, mapped into memory: tensor data is read when it is used."""
    if not os.path.isfile(path):
        raise LoadError(f"{path}: GGUF file not found")
    return GGUFModel(GGUFFile.from_path(path))


def open_model(path: str, header_only: bool = False) -> tuple[ModelConfig, TensorStore]:
    """The config and the tensors of a model folder or a GGUF file (header only: layout, no data)."""
    assembly = local_assembly(path, header_only=header_only, needs_tokenizer=False)
    assert assembly.config is not None
    return assembly.config, assembly.store()


def open_store(folder: str, header_only: bool = False) -> TensorStore:
    """The weights of a model folder (the files its index names, or model.safetensors)."""
    return open_model(folder, header_only)[1]


def load_engine(
    path: str,
    context_length: int | None = None,
    compute: str | ComputeOptions = "auto",
    kv: KVOptions | None = None,
    memory_budget: int | None = None,
    numpy_kernel: str | None = None,
    isq: str = "rtn",
    calibration_ids: list[int] | None = None,
    isq_format: str = "q4_1",
    threads: int | None = None,
    kernels: str = "auto",
) -> Engine:
    """The engine of a model folder or a GGUF file on disk. See LoadOptions for the arguments."""
    options = LoadOptions(
        context_length=context_length,
        compute=compute,
        memory_budget=memory_budget,
        numpy_kernel=numpy_kernel,
        kv=kv or KVOptions(),
        isq=isq,
        isq_format=isq_format,
        calibration_ids=tuple(calibration_ids) if calibration_ids else None,
        threads=threads,
        kernels=kernels,
    )
    return local_assembly(path, options, needs_tokenizer=False).build()
