"""The bridge between the JavaScript worker (Pyodide) and the engine: the only module the worker calls.
A thin JSON layer over session.Session, which api.Model shares: the verbs mean the same in both.

The protocol. Requests cross as JSON strings with Python's names (npm/src/protocol.js renames them,
and JSON turns JS null into None), except the bytes of files, which cross as typed arrays. Every call
returns a JSON string, `{"ok": value}` or `{"error": {"type", "message"}}` with `type` one of the
`RuvLLMError` types, so JavaScript raises the right error without parsing tracebacks; two calls hand
over Python objects instead: `take_engine()` and `take_files()`. The calls, their arguments and the
fields of each request and answer are defined once, in npm/src/bridge-schema.js (the worker's name
table is made from it, and npm/test/bridge-schema.test.js holds this module and the worker to it).

Loading: `new_loader()`, then the loader starts the kernels (`start_kernels`), takes the thread pool's
API if the worker started one, and the options; then the worker asks `next()` what file to hand over
and hands it over (`give_document`; `header_size`/`give_header`; `begin_file`/`write`/`finish_file`)
until it answers null, then `build()` and `take_engine()` (runtime/assembly.py says in what order).

Requests are read into the dataclasses below (`_read`: unknown fields refused, each field checked against
its type); bridge-schema.js names each shape's dataclass, and its test holds the two to the same fields.
A lesson's progress is the schema's LessonProgress (learning.learn.Learner.progress makes it).

Weight files arrive chunk by chunk: each chunk is copied once, straight into a NumPy buffer the engine
then reads without copying (runtime/assembly.py). A JS typed array arrives as a Pyodide JsProxy whose
`assign_to` does that copy; any object with the buffer protocol works too, so this module runs (and is
tested) on CPython as well.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
import types
import typing
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from .completions import Response, Room, check, finish
from .errors import InferenceError, InvalidArgumentError, LoadError, RuvLLMError
from .files import jsonfields as fields
from .files.gguf_model import GGUFModel
from .files.json_body import shown
from .files.store import count_parameters
from .files.tensorfile import PieceBuffer, SafetensorsFile
from .learning.adapters import AdapterSet
from .learning.learn import Learner, Lesson, RouteLesson
from .learning.lora import DEFAULT_LAYERS, Adapter
from .learning.projection import calibration_chat, calibration_text
from .learning.xlora import Mixture
from .model.cache import KVOptions
from .quant.pool import OutsideFile, PoolKernels
from .quant.provider import DEFAULT_ARITHMETIC, KERNEL_CHOICES, check_arithmetic
from .quant.wasm import WasmKernels
from .runtime.assembly import Arriving, Assembly
from .runtime.device import DEVICE_CHOICES, gpu_memory, use_gpu
from .runtime.engine import Engine, LoadOptions
from .runtime.generate import GenerationOptions, Prefilling
from .session import Session
from .text.detokenizer import StreamingDetokenizer, special_token_ids, token_byte_table
from .text.stream import Chunk
from .text.tool_calls import messages_for, reads_tools

# The most bytes one array may hold: 2 GiB - 1 in Pyodide (wasm32). A weight file held in Pyodide's memory
# (one thread) must fit in one.
MAX_ARRAY_BYTES = sys.maxsize


def _json_result(fn: Callable) -> Callable[..., str]:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> str:
        try:
            return json.dumps({"ok": fn(*args, **kwargs)})
        except RuvLLMError as e:
            return json.dumps({"error": {"type": e.type, "message": e.message}})
        except MemoryError:
            message = (
                "out of memory: the model does not fit in Pyodide's WebAssembly memory (4 GiB at most); with "
                "threads: 2 or more its weights live outside it"
            )
            return json.dumps({"error": {"type": "load", "message": message}})
        except Exception as e:  # anything else is our bug; keep the worker alive and say what happened
            return json.dumps({"error": {"type": "inference", "message": f"internal error: {type(e).__name__}: {e}"}})

    return wrapper


def _request(text: str, what: str = "request") -> dict:
    """A JSON object from the worker."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"the {what} must be JSON text, got {type(text).__name__}")
    try:
        value = fields.parse_json(text, f"the {what}")
    except LoadError as e:  # from the worker, not a file: an argument
        raise InvalidArgumentError(str(e)) from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"the {what} must be a JSON object")
    return value


# --- the requests: each a shape of npm/src/bridge-schema.js (its `dataclass`), whose test holds these
# classes to the shapes' fields. A field JSON gives as null, or leaves out, takes its default; where the
# type admits None, null is that None.


@dataclass(frozen=True)
class LoadRequest:
    context_length: int | None = None
    compute: str = "auto"
    memory_budget: int | None = None
    kernels: str = "auto"
    arithmetic: str = DEFAULT_ARITHMETIC
    plan: bool = True
    kv: dict | None = None
    sha256: dict[str, str] | None = None
    device: str = "auto"


@dataclass(frozen=True)
class FileStart:
    name: str
    size: int


@dataclass(frozen=True)
class FileEnd:
    name: str


@dataclass(frozen=True)
class StartRequest:
    prompt_ids: list[int]
    eos_ids: list[int] = dataclasses.field(default_factory=list)
    options: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class CompletionCheck:
    kind: object
    body: object


@dataclass(frozen=True)
class CompletionStart:
    kind: object
    body: object
    prompt_ids: list[int]
    eos_ids: list[int] = dataclasses.field(default_factory=list)
    model: str = "ruvllm"


@dataclass(frozen=True)
class AdapterConfig:
    name: str = "default"
    rank: int | None = None
    alpha: float | None = None
    targets: list[str] | None = None
    layers: list[int] | str | None = DEFAULT_LAYERS  # (None: every layer)


@dataclass(frozen=True)
class MixConfig:
    name: str = "mixture"
    experts: list[str] | None = None
    top_k: int | None = None
    depth: int | None = None
    size: int | None = None
    layerwise: bool | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class AdapterName:
    name: str | None = None


@dataclass(frozen=True)
class LessonRequest:
    key: int
    adapter: str = "default"
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    completion_ids: list[int] = dataclasses.field(default_factory=list)
    reward: float = 1.0
    steps: int | None = None
    lr: float | None = None
    optimizer: str | None = None
    ewc: float | None = None
    until_greedy: bool | None = None
    rehearse: int | None = None
    keep: float | None = None
    project: float | None = None
    keyed: bool | None = None
    budget_ms: float | None = None

    def options(self) -> dict:
        """The lesson's options that were given (Session.feedback's keywords)."""
        names = ("steps", "lr", "optimizer", "ewc", "until_greedy", "rehearse", "keep", "project", "keyed")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dataclass(frozen=True)
class LessonKey:
    key: int | None = None
    budget_ms: float | None = None


@dataclass(frozen=True)
class Budget:
    budget_ms: float | None = None


@dataclass(frozen=True)
class Calibration:
    ids: list[int]
    turns: list[list[int]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class ChatTemplateSource:
    source: str | None = None


Request = TypeVar("Request")


def _read(kind: type[Request], text: str, what: str = "request") -> Request:
    """The request `kind` (one of the dataclasses above) from the worker's JSON text: unknown fields
    refused, each field checked against its type, naming it."""
    raw = _request(text, what)
    known = {f.name: f for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise InvalidArgumentError(f"unknown field {unknown[0]!r} in the {what}")
    hints = typing.get_type_hints(kind)
    given = {}
    for name, field in known.items():
        value = raw.get(name)
        if value is None and not _admits(hints[name], None):
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise InvalidArgumentError(f"{name} in the {what} must be {_described(hints[name])}, got null")
            continue  # (its default)
        if name not in raw:
            continue
        if not _admits(hints[name], value):
            raise InvalidArgumentError(f"{name} in the {what} must be {_described(hints[name])}, got {shown(value)}")
        given[name] = value
    return kind(**given)


def _admits(hint: object, value: object) -> bool:
    """Whether `value` (as JSON gives it) is of the type `hint`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_admits(arg, value) for arg in args)
    if hint is type(None) or hint is None:
        return value is None
    if hint is object:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is dict:
        return isinstance(value, dict)
    if origin is dict:
        return isinstance(value, dict) and all(_admits(args[1], v) for v in value.values())
    if origin is list:
        return isinstance(value, list) and all(_admits(args[0], v) for v in value)
    raise TypeError(f"no check for {hint!r}")  # (a new field's type: add it here)


def _described(hint: object) -> str:
    """The type `hint` in words, for an error message."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_described(arg) for arg in args)
    if origin is list:
        return "a list of " + _plural(_described(args[0]))
    if origin is dict:
        return "an object of " + _plural(_described(args[1]))
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}
    return words.get(hint, "an object")  # type: ignore[call-overload]


def _plural(words: str) -> str:
    if words.startswith("a list of "):
        return "lists of " + words.removeprefix("a list of ")
    return {"an integer": "integers", "a number": "numbers", "a string": "strings"}.get(words, words)


def _bytes(data: Any) -> bytes:
    """The bytes of a JS typed array (JsProxy) or of any buffer."""
    return bytes(data.to_py()) if hasattr(data, "to_py") else bytes(data)


class ModelLoader:
    """Builds the engine from a model's files, which the worker reads and hands over as they are asked for
    (runtime/assembly.py decides which, in what order, and what they mean: the worker only moves bytes)."""

    def __init__(self) -> None:
        self.kernel_exports: object | None = None  # start_kernels: the wasm module's exports
        self.kernel_threads: object | None = None  # offer_kernel_threads: the kernel thread pool's API
        self.gpu: object | None = None  # offer_gpu: the GPU worker's memory API (npm/src/worker/gpu/)
        self.device = "auto"  # set_options: where the decode plan may run (runtime/device.py DEVICE_CHOICES)
        self.assembly: Assembly | None = None  # set_options
        self._engine: EngineHandle | None = None  # built, until take_engine()

    @_json_result
    def start_kernels(self, choice: str) -> dict:
        """Start the WebAssembly SIMD kernels (host.py compiles the wheel's own, checks a known answer and
        instantiates them on Pyodide's memory) unless `choice` is "numpy"; "auto" runs without them where
        they cannot run (`reason` says why), "wasm" refuses to. relaxed: the relaxed SIMD build runs."""
        if choice not in KERNEL_CHOICES:
            raise InvalidArgumentError(f"options.kernels must be {', '.join(KERNEL_CHOICES)}, got {json.dumps(choice)}")
        if choice == "numpy":
            return {"running": False, "reason": None, "relaxed": False}
        from . import host

        exports, reason = host.kernel_exports()
        if exports is None:
            if choice == "wasm":
                raise LoadError(f"cannot use the WebAssembly kernels: {reason}")
            return {"running": False, "reason": reason, "relaxed": False}
        self.kernel_exports = exports
        return {"running": True, "reason": None, "relaxed": int(exports.relaxed_simd()) == 1}

    @_json_result
    def offer_kernel_threads(self, api: object) -> bool:
        """The kernel thread pool (quant/pool.py): the WebAssembly kernels' products run on its threads."""
        self.kernel_threads = api
        return True

    @_json_result
    def offer_gpu(self, api: object) -> bool:
        """A WebGPU device (the worker's GPU worker, npm/src/worker/gpu/): the decode plan may run there
        once built, if it passes the check against the CPU (runtime/device.py)."""
        self.gpu = api
        return True

    @_json_result
    def set_options(self, options_json: str, gguf: str | None) -> bool:
        """Load options (the LoadOptions shape of npm/src/bridge-schema.js); gguf: the model's GGUF file
        name (null: a folder)."""
        r = _read(LoadRequest, options_json, "load options")
        kv_raw = r.kv or {}
        kv_known = {"hot_tokens", "cold", "budget_bytes", "keep"}
        if set(kv_raw) - kv_known:
            raise InvalidArgumentError(f"unknown kv option {sorted(set(kv_raw) - kv_known)[0]!r}")
        arithmetic = check_arithmetic(r.arithmetic)
        if r.device not in DEVICE_CHOICES:
            choices = ", ".join(DEVICE_CHOICES)
            raise InvalidArgumentError(f"options.device must be {choices}, got {json.dumps(r.device)}")
        self.device = r.device
        offered: WasmKernels | PoolKernels | None = None
        if self.kernel_threads is not None and self.kernel_exports is not None:
            offered = PoolKernels(self.kernel_threads, arithmetic, WasmKernels(self.kernel_exports, arithmetic))
        elif self.kernel_exports is not None:
            offered = WasmKernels(self.kernel_exports, arithmetic)
        options = LoadOptions(
            context_length=r.context_length,
            compute=r.compute,
            memory_budget=r.memory_budget,
            kv=KVOptions(**kv_raw),
            kernels=r.kernels,
            provider=offered,
            plan=r.plan,
        )
        if gguf is not None and not isinstance(gguf, str):
            raise InvalidArgumentError(f"gguf must be a file name or null, got {gguf!r}")
        self.assembly = Assembly(options, gguf, buffers=self._buffers, sha256=r.sha256)
        return True

    def _buffers(self, size: int, name: str) -> Arriving:
        """Where weight file `name` arrives: JavaScript memory with the kernel thread pool (outside Pyodide's
        heap), else one array of Pyodide's memory, which holds at most MAX_ARRAY_BYTES."""
        if self.kernel_threads is not None and self.kernel_exports is not None:
            return OutsideFile(self.kernel_threads, size, name)
        if size > MAX_ARRAY_BYTES:
            raise LoadError(
                f"{name} is {size / 2**30:.1f} GiB, more than one array of Pyodide's memory holds "
                f"({(MAX_ARRAY_BYTES + 1) / 2**30:.1f} GiB), where the weight files go on one thread; load with "
                "threads: 2 or more (the files then stay outside it; a browser page must be cross-origin isolated)"
            )
        return PieceBuffer(size, name)

    def _assembly(self) -> Assembly:
        if self.assembly is None:
            raise LoadError("set_options was not called before the model's files")
        return self.assembly

    @_json_result
    def next(self) -> dict | None:
        """What file the assembly wants next ({name, part: document | header | data, optional}), or null:
        every file is in, build."""
        want = self._assembly().next()
        return None if want is None else dataclasses.asdict(want)

    @_json_result
    def give_document(self, name: str, data: object) -> bool:
        """A folder's JSON file, whole (null: an optional one is missing)."""
        self._assembly().give_document(name, None if data is None else _bytes(data))
        return True

    @_json_result
    def header_size(self, name: str, size: int, head: object) -> int | None:
        """How many first bytes of weight file `name` hold its header, or null while `head` is too short."""
        return self._assembly().header_size(name, size, _bytes(head))

    @_json_result
    def give_header(self, name: str, size: int, head: object) -> dict | None:
        """A weight file's first bytes (its whole header); after the last one, the memory plan (a load
        error if the model cannot fit), else null."""
        plan = self._assembly().give_header(name, size, _bytes(head))
        return None if plan is None else plan.as_dict()

    @_json_result
    def gguf_documents(self) -> dict:
        """A GGUF's header stands for the model folder's JSON files: {config, tokenizer, tokenizer_config,
        generation_config}, as its metadata gives them."""
        assembly = self._assembly()
        tokenizer, tokenizer_config, generation_config = assembly.tokenizer_files()
        assert assembly.gguf is not None
        header = assembly.headers[assembly.gguf]
        assert isinstance(header, GGUFModel)
        return {
            "config": header.config,
            "tokenizer": tokenizer,
            "tokenizer_config": tokenizer_config,
            "generation_config": generation_config,
        }

    @_json_result
    def begin_file(self, request_json: str) -> int:
        """request: {name, size}; the file's bytes follow through `write`."""
        r = _read(FileStart, request_json)
        if r.size < 0:
            raise InvalidArgumentError(f"{r.name}: size must be a non-negative integer, got {r.size}")
        self._assembly().begin(r.name, r.size)
        return r.size

    @_json_result
    def write(self, name: str, chunk: Any) -> int:
        """Append one chunk (a JsProxy of a Uint8Array, or any bytes-like object); returns bytes so far."""
        return self._assembly().write(name, chunk)

    @_json_result
    def finish_file(self, request_json: str) -> dict:
        """request: {name}: every byte arrived (with the digest the options' sha256 gives it, if any)."""
        name = _read(FileEnd, request_json).name
        return {"bytes": self._assembly().finish(name).size}

    @_json_result
    def build(self) -> dict:
        assembly = self._assembly()
        tokenizer = assembly.tokenizer_files(merges=False)[0]  # (the bytes of every token: each chunk's text)
        where = assembly.tokenizer_sources()[0]
        data = fields.obj(fields.parse_json(tokenizer, where) if isinstance(tokenizer, str) else tokenizer, where)
        store = assembly.store()
        engine = assembly.build()  # the engine holds its own compute-form weights; the file buffers can go
        self.assembly = None
        device = None  # (no GPU offered: the worker says why)
        if self.gpu is not None and self.device != "cpu":
            device = use_gpu(engine, gpu_memory(self.gpu), self.device)
        self._engine = EngineHandle(engine, *token_byte_table(data), special_token_ids(data))
        plan = engine.plan
        assert plan is not None  # from_store plans every engine it builds
        c = engine.config
        return {
            "architecture": c.architecture,
            "vocab_size": c.vocab_size,
            "context_length": engine.context_length,
            "parameters": count_parameters(store),
            "weight_bytes": engine.weights.nbytes,
            "plan": plan.as_dict(),
            "kernels": engine.kernels,
            "arithmetic": engine.arithmetic,
            "decode_plan": engine.decode_plan is not None,  # ("plan" is the memory plan above)
            "plan_note": engine.plan_note,
            "device": device,
        }

    def take_engine(self) -> EngineHandle:
        """The engine `build` made; the loader keeps no reference to it."""
        engine, self._engine = self._engine, None
        if engine is None:
            raise LoadError("no engine was built")
        return engine


class EngineHandle:
    """A loaded engine; one generation at a time, advanced one chunk per `step` call. The text of each
    chunk is made here (detokenization, stop strings, timings), as on CPython: the worker only forwards."""

    def __init__(
        self,
        engine: Engine,
        token_bytes: list[bytes],
        strip_leading_space: bool,
        special_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.session = Session(engine, token_bytes, special_ids)  # what api.Model shares
        self.token_bytes, self.strip_leading_space = token_bytes, strip_leading_space
        self.room = Room.of(engine.context_length, token_bytes)  # what an answer can hold, for schemas
        self.reads_tools = (True, True)  # what JavaScript's chat template writes itself (set_chat_template)
        self.chunks: Generator[Chunk | Prefilling, None, None] | None = None
        self.response: Response | None = None  # with start_completion: the OpenAI answer being built
        self._outgoing: dict[str, bytes] = {}  # adapter_files, until take_files()
        # under way, by the key JavaScript gave (its request id): (the adapter's name, the lesson)
        self.lessons: dict[object, tuple[str, Lesson | RouteLesson]] = {}

    @property
    def engine(self) -> Engine:
        return self.session.engine

    @property
    def adapters(self) -> AdapterSet:
        return self.session.adapters

    @property
    def learner(self) -> Learner:
        return self.session.learner

    @_json_result
    def start(self, request_json: str) -> dict:
        """request: {"prompt_ids": [...], "eos_ids": [...], "options": {max_tokens, temperature, stop, ...}}"""
        started = time.perf_counter()
        r = _read(StartRequest, request_json)
        options = GenerationOptions.from_kwargs(**r.options)
        self._end()
        self.chunks = self.session.stream(
            r.prompt_ids, options, r.eos_ids, self._detokenizer(), started, report_prefill=True
        )
        return {"prompt_tokens": len(r.prompt_ids)}

    @_json_result
    def check_completion(self, request_json: str) -> dict:
        """request: {kind: "chat" | "text", body: an OpenAI request body}. Checks every field and returns
        what JavaScript tokenizes, as a JSON string (user schemas may hold any key: nothing is renamed):
        {"source": {messages, tools} (chat, for the chat template) or {prompt}}."""
        r = _read(CompletionCheck, request_json)
        source = check(r.body, r.kind, room=self.room).source
        if "messages" in source:
            source = {**source, "messages": messages_for(source["messages"], *self.reads_tools)}
        return {"source": json.dumps(source)}

    @_json_result
    def start_completion(self, request_json: str) -> dict:
        """request: {kind, body, prompt_ids, eos_ids, model}: an OpenAI completion. `step` then also
        gives each chunk's OpenAI events ("events") and, at the end, the whole answer ("result")."""
        started = time.perf_counter()
        r = _read(CompletionStart, request_json)
        checked = check(r.body, r.kind, room=self.room)
        ids, eos = r.prompt_ids, r.eos_ids
        prepared = finish(checked, ids, self.engine.context_length, r.model)
        constraint = prepared.constraint(self.session.vocabulary(eos)) if prepared.constrained else None
        self._end()
        self.chunks = self.session.stream(
            ids, prepared.options, eos, self._detokenizer(), started, constraint=constraint, report_prefill=True
        )
        self.response = Response(prepared, self.token_bytes)
        return {"prompt_tokens": len(ids)}

    @_json_result
    def step(self) -> dict | None:
        """The next chunk as {"text", "token_id", "finish_reason", "stats"}; {"prefilling": {"done",
        "total"}} between the forward calls of a long prompt (the worker takes aborts there); None when
        finished."""
        if self.chunks is None:
            return None
        try:
            chunk: Chunk | Prefilling = next(self.chunks)
        except StopIteration:
            self.chunks = None
            return None
        except RuvLLMError:
            self.chunks = None
            raise
        except Exception as e:
            self.chunks = None
            raise InferenceError(f"generation failed: {type(e).__name__}: {e}") from e
        if isinstance(chunk, Prefilling):
            return {"prefilling": {"done": chunk.done, "total": chunk.total}}
        answer = {
            "text": chunk.text,
            "token_id": chunk.token_id,
            "finish_reason": chunk.finish_reason,
            "stats": dataclasses.asdict(chunk.stats),
        }
        if self.response is not None:  # an OpenAI completion: its events, as they are (no renaming)
            answer["events"] = json.dumps(self.response.add(chunk))
            if chunk.finish_reason is not None:
                answer["result"] = json.dumps(self.response.result())
        if chunk.finish_reason is not None:
            self._end()
        return answer

    @_json_result
    def stop(self) -> bool:
        """End the current generation (an abort from JavaScript)."""
        self._end()
        return True

    def _end(self) -> None:
        if self.chunks is not None:
            self.chunks.close()  # (the cache goes back to the session)
        self.chunks = self.response = None

    def _detokenizer(self) -> StreamingDetokenizer:
        return StreamingDetokenizer(self.token_bytes, self.strip_leading_space)

    @_json_result
    def cache_stats(self) -> dict:
        """Positions and bytes of the KV cache per tier."""
        return self.session.last_cache.stats()

    # --- MicroLoRA ------------------------------------------------------------------------------

    @_json_result
    def new_adapter(self, request_json: str) -> dict:
        """request: {name, rank, alpha, targets, layers}; the new adapter becomes the active one."""
        r = _read(AdapterConfig, request_json)
        adapter = self.session.new_adapter(r.name, (r.rank, r.alpha, r.targets or None, r.layers))
        config = adapter.config
        return {"name": r.name, "rank": config.rank, "targets": list(config.targets), "layers": config.layers}

    @_json_result
    def feedback(self, request_json: str) -> dict:
        """request: {key, adapter, prompt_ids, completion_ids, reward, steps, lr, ..., budget_ms}: a lesson
        whose first step is taken now (the instant loop), for about budget_ms (null: the whole of it);
        `first_step` calls take the rest of it, `learn` calls the other steps. Returns its progress."""
        r = _read(LessonRequest, request_json)
        if r.key in self.lessons:
            raise InvalidArgumentError(f"a lesson with key {r.key!r} is already under way")
        lesson = self.session.feedback(
            r.prompt_ids, r.completion_ids, r.reward, r.adapter, r.options(), budget_ms=r.budget_ms
        )
        self.lessons[r.key] = (r.adapter, lesson)
        return self._progress_of(r.key)

    @_json_result
    def first_step(self, request_json: str) -> dict:
        """request: {key, budget_ms}: more of lesson `key`'s first step (the instant loop). Returns its progress."""
        r = _read(LessonKey, request_json)
        if r.key not in self.lessons:
            raise InvalidArgumentError(f"no lesson with key {r.key!r} is under way")
        self.session.first_step(self.lessons[r.key][1], r.budget_ms)
        return self._progress_of(r.key)

    def _progress_of(self, key: object) -> dict:
        """Lesson `key`'s progress; one that is done or left the loop is let go (the one place a lesson
        leaves the worker's hands)."""
        name, lesson = self.lessons[key]
        progress = dataclasses.asdict(self.learner.progress(lesson, key, name))
        if lesson.done or lesson.ended is not None:
            del self.lessons[key]
        return progress

    @_json_result
    def learn(self, request_json: str) -> dict:
        """request: {budget_ms}: units of work of the waiting lessons for about that long (at least one).
        Returns {"lessons": the progress of each lesson under way, finished, cancelled or dropped since,
        "waiting", "preparing", "prepared": the job's units done and in all, or null}."""
        status = self.learner.run(_read(Budget, request_json).budget_ms)
        job = self.learner.preparing
        prepared = None if job is None else dict(zip(("done", "total"), job.progress, strict=True))
        lessons = self._report_lessons()
        return {"lessons": lessons, "waiting": status.lessons, "preparing": status.preparing, "prepared": prepared}

    @_json_result
    def prepare_learning(self) -> dict:
        """Have the default adapter's projection made in idle time (`learn` calls), so that its first
        lesson starts projected. Returns {"preparing"}: whether there is work to do."""
        return {"preparing": self.session.prepare_learning()}

    @_json_result
    def cancel_learning(self, request_json: str) -> dict:
        """request: {key}: drop that lesson (null: all of them). Returns the progress of those dropped."""
        key = _read(LessonKey, request_json).key
        for each, (_, lesson) in self.lessons.items():
            if key is None or each == key:
                self.session.cancel_learning(lesson)
        return {"lessons": self._report_lessons(), "waiting": self.learner.status().lessons}

    @_json_result
    def set_chat_template(self, request_json: str) -> bool:
        """request: {source}: the chat template JavaScript renders with (null: none), so that the messages
        check_completion returns are the ones it can render (tool calls and results written in the
        Hermes convention where the template does not write them itself: tool_calls.messages_for)."""
        source = _read(ChatTemplateSource, request_json).source
        self.reads_tools = reads_tools(source) if source else (True, True)
        return True

    @_json_result
    def calibration_text(self) -> str:
        """The built-in calibration text: JavaScript tokenizes it for `set_calibration`."""
        return calibration_text()

    @_json_result
    def calibration_chat(self) -> list[list[str]]:
        """The built-in calibration chat, [user message, answer] pairs: JavaScript renders each as a turn
        in the model's template for `set_calibration`."""
        return [[user, answer] for user, answer in calibration_chat()]

    @_json_result
    def set_calibration(self, request_json: str) -> int:
        """request: {ids, turns}: the calibration text's token ids and the calibration chat's turns, each
        its ids (none without a chat template): what learning's projection and whitening start from."""
        r = _read(Calibration, request_json)
        return self.session.set_calibration(r.ids, r.turns)

    def _report_lessons(self) -> list[dict]:
        """The progress of every lesson held; the finished, cancelled and dropped ones are let go."""
        return [self._progress_of(key) for key in list(self.lessons)]

    @_json_result
    def load_adapter(self, request_json: str, config_json: str, weights: Any, state: Any = None) -> str:
        """request: {name}; an adapter from its files' contents (bytes, or JS Uint8Arrays)."""
        name = self._adapter_name(request_json)
        state_file = SafetensorsFile(_bytes(state), "learning_state.safetensors") if state is not None else None
        weights_file = SafetensorsFile(_bytes(weights), "adapter_model.safetensors")
        self.adapters.add(name, Adapter.from_files(config_json, weights_file, self.engine.weights, state_file))
        return name

    @_json_result
    def load_mixture(self, request_json: str, config_json: str, router: Any, *experts: Any) -> str:
        """request: {name}; an X-LoRA mixture from its files' contents: adapter_config.json, the router's
        adapter_model.safetensors, then each expert's adapter_config.json and adapter_model.safetensors,
        in the order of the config's `adapters`."""
        raw = fields.parse_json(config_json, "adapter_config.json")
        names = list(raw.get("adapters") or {}) if isinstance(raw, dict) else []
        if len(experts) != 2 * len(names):
            raise LoadError(f"an X-LoRA mixture of {len(names)} experts needs two files each, got {len(experts)}")
        held = {}
        for i, expert in enumerate(names):
            weights_file = SafetensorsFile(_bytes(experts[2 * i + 1]), f"{expert}/adapter_model.safetensors")
            held[expert] = Adapter.from_files(experts[2 * i], weights_file, self.engine.weights)
        router_file = SafetensorsFile(_bytes(router), "adapter_model.safetensors")
        name = self._adapter_name(request_json)
        self.adapters.add(name, Mixture.from_files(config_json, router_file, held, self.engine.config.hidden_size))
        return name

    @staticmethod
    def _adapter_name(request_json: str) -> str:
        name = _read(AdapterName, request_json).name
        if name is None:
            raise InvalidArgumentError("name in the request must be a string, got null")
        return name

    @_json_result
    def mix_adapters(self, request_json: str) -> dict:
        """request: {name, experts, top_k, depth, size, layerwise, temperature}: an X-LoRA mixture of held
        adapters with an even router, made active."""
        r = _read(MixConfig, request_json)
        names = ("depth", "size", "layerwise", "temperature", "top_k")
        given = {k: getattr(r, k) for k in names if getattr(r, k) is not None}
        mixture = self.session.mix_adapters(r.name, r.experts, **given)
        return {"name": r.name, "experts": mixture.names, "top_k": mixture.config.top_k}

    @_json_result
    def set_adapter(self, request_json: str) -> str | None:
        """request: {name}: compute with that adapter from now on (null: the base model)."""
        name = _read(AdapterName, request_json).name
        self.adapters.activate(name)
        return name

    @_json_result
    def adapter_files(self, request_json: str) -> dict:
        """request: {name} (null: the active adapter): its files, handed over by `take_files`."""
        self._outgoing = self.adapters.held(_read(AdapterName, request_json).name).files()
        return {"files": list(self._outgoing)}

    def take_files(self) -> dict[str, bytes]:
        """The files `adapter_files` prepared, by file name (JavaScript gets Uint8Arrays)."""
        files, self._outgoing = self._outgoing, {}
        return files

    @_json_result
    def adapter_names(self) -> dict:
        """The adapters and mixtures held, the active one, each one's version, the lessons waiting,
        whether learning's preparation (the default adapter's spectra, begun after load) is under way,
        each one described (`adapters`: AdapterSet.describe), and whether forwards with the active one run
        through the decode plan (an X-LoRA mixture does not), or why not."""
        adapters = self.adapters
        described = adapters.describe()
        note = self.engine.plan_now()
        return {
            "names": [e["name"] for e in described],
            "active": adapters.active,
            "versions": {e["name"]: e["version"] for e in described},
            "learning": self.learner.status().lessons,
            "preparing": self.learner.preparing is not None,
            "adapters": described,
            "decode_plan": note is None,  # whether a forward with the active one runs through the plan
            "plan_note": note,
        }


def new_loader() -> ModelLoader:
    return ModelLoader()
