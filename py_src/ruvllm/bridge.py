"""The bridge between the JavaScript worker (Pyodide) and the engine: the only module the worker calls.
A thin JSON layer over session.Session, which api.Model shares: the verbs mean the same in both.

The protocol. Requests cross as JSON strings with Python's names (npm/src/protocol.js renames them,
and JSON turns JS null into None), except the bytes of files, which cross as typed arrays. Every call
returns a JSON string, `{"ok": value}` or `{"error": {"type", "message"}}` with `type` one of the
`RuvLLMError` types, so JavaScript raises the right error without parsing tracebacks; two calls hand
over Python objects instead: `take_engine()` and `take_files()`. The calls, their arguments and the
fields of each request and answer are defined once, in npm/src/bridge-schema.js (the worker's name
table is made from it, and npm/test/bridge-schema.test.js holds this module and the worker to it); in
short:

    new_loader()                                   -> ModelLoader
    ModelLoader.offer_kernels(exports)             -> true (the WebAssembly SIMD kernels' exports, a JsProxy:
                                                      before set_options, when the worker could start them)
    ModelLoader.offer_kernel_threads(api)          -> true (the kernel thread pool, a JsProxy: before
                                                      set_options, when the worker started one; quant/pool.py)
    ModelLoader.set_config(config.json)            -> {architecture, max_position_embeddings}
    ModelLoader.set_tokenizer(tokenizer.json)      -> vocabulary size (the text of each chunk is made here)
    ModelLoader.set_options({context_length, compute, memory_budget, kernels, arithmetic,
                             kv: {hot_tokens, cold, budget_bytes, keep}}) -> true
    ModelLoader.add_header(name, size, bytes)      -> true (a weight file's first bytes: its header)
    ModelLoader.gguf_header_size(size, bytes)      -> the header's size once `bytes` (a GGUF's first bytes)
                                                      hold enough to tell, else null: the worker reads on
    ModelLoader.add_gguf_header(name, size, bytes) -> {config, tokenizer, tokenizer_config,
                                                      generation_config}: a GGUF's header stands for the
                                                      model folder's JSON files (set_config, set_tokenizer)
    ModelLoader.plan()                             -> the memory plan (a load error if it cannot fit)
    ModelLoader.begin_file({name, size, want_sha256})
    ModelLoader.write(name, bytes)                 -> bytes received so far
    ModelLoader.finish_file({name, sha256})        -> {bytes}
    ModelLoader.build()                            -> {architecture, vocab_size, context_length, ...}
    ModelLoader.take_engine()                      -> EngineHandle (the loader lets go of it)
    EngineHandle.start({prompt_ids, eos_ids, options: {max_tokens, temperature, ..., stop}})
    EngineHandle.step()                            -> {text, token_id, finish_reason, stats},
                                                      {prefilling: {done, total}}, or null when done
    EngineHandle.check_completion({kind, body})    -> {source: '{messages, tools}' or '{prompt}'}: an OpenAI
                                                      body checked, and what JavaScript tokenizes for it
    EngineHandle.start_completion({kind, body, prompt_ids, eos_ids, model})  (both: JSON made by the caller,
                                                      not renamed, since a body's schemas hold any key)
                                                   -> then each step also has "events" (the OpenAI stream
                                                      chunks, a JSON string: they cross without renaming)
                                                      and the last one "result" (the whole answer)
    EngineHandle.stop()                            -> true (an abort)
    EngineHandle.cache_stats()                     -> {hot_positions, hot_bytes, cold_positions, ...}
    EngineHandle.new_adapter({name, rank, alpha, targets, layers}), set_adapter({name}), adapter_names()
    EngineHandle.feedback({key, adapter, prompt_ids, ..., budget_ms})  -> a lesson's progress, its first step
                                                      (the instant loop) taken for about budget_ms (null: all)
    EngineHandle.first_step({key, budget_ms})      -> its progress, the first step taken further
    EngineHandle.learn({budget_ms})                -> {lessons: [progress], waiting, preparing, prepared}: the
                                                      background loop (a lesson's projection job before its
                                                      next step; with no lesson, the default adapter's)
    EngineHandle.prepare_learning()                -> {preparing}: the default adapter's projection, queued
    EngineHandle.cancel_learning({key})            -> the same, the lesson `key` (null: all) dropped
    EngineHandle.calibration_text(), calibration_chat(), set_calibration({ids, turns})  the calibration text
                                                      and chat turns, tokenized (and templated) in JavaScript
    EngineHandle.load_adapter({name}, adapter_config.json, weights bytes, state bytes or None)
    EngineHandle.load_mixture({name}, adapter_config.json, router bytes, *each expert's config and weights)
    EngineHandle.mix_adapters({name, experts, top_k, depth, size, layerwise, temperature}): X-LoRA
    EngineHandle.adapter_files({name})             -> {files: [file names]}; take_files() -> {name: bytes}

A lesson's progress: {key, phase, step, steps, rehearsed, version, done, applied, cancelled, outcome,
elapsed_ms, prepared, ahead, note, report}. phase: "waiting" (behind `ahead` other lessons), "preparing"
(its next step waits for the projection job: `prepared` {done, total} units), "learning", "rehearsing",
"done", "cancelled" (cancel_learning) or "dropped" (its adapter was replaced: `note` says so); applied:
its first step is taken (or was found not to be needed); outcome: why its steps ended (AdaptReport.outcome:
"already" is a good answer greedy decoding already gives, nothing to learn), once known.

Weight files arrive chunk by chunk: each chunk is copied once, straight into a NumPy buffer the engine
then reads without copying (`PieceBuffer`). A JS typed array arrives as a Pyodide JsProxy whose
`assign_to` does that copy; any object with the buffer protocol works too, so this module runs (and is
tested) on CPython as well.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import time
from collections.abc import Callable, Generator
from typing import Any

from .completions import Response, Room, check, finish
from .errors import DownloadError, InferenceError, InvalidArgumentError, LoadError, RuvLLMError
from .files import jsonfields as fields
from .files.gguf import GGUFFile, header_size
from .files.gguf_model import GGUFModel
from .files.store import TensorStore, count_parameters
from .files.tensorfile import PieceBuffer, SafetensorsFile
from .learning.adapters import AdapterSet
from .learning.learn import Learner, Lesson, RouteLesson
from .learning.lora import DEFAULT_LAYERS, Adapter
from .learning.projection import calibration_chat, calibration_text
from .learning.xlora import Mixture
from .model.cache import KVOptions
from .model.config import ModelConfig
from .quant.pool import OutsideFile, PoolKernels
from .quant.provider import DEFAULT_ARITHMETIC, check_arithmetic
from .quant.wasm import WasmKernels
from .runtime.engine import Engine, LoadOptions, plan_for
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


def _text(request: dict, key: str) -> str:
    """A string field of a worker request."""
    value = request.get(key)
    if not isinstance(value, str):
        raise InvalidArgumentError(f"the request's {key!r} must be a string, got {value!r}")
    return value


def _bytes(data: Any) -> bytes:
    """The bytes of a JS typed array (JsProxy) or of any buffer."""
    return bytes(data.to_py()) if hasattr(data, "to_py") else bytes(data)


class ModelLoader:
    """Receives a model's files (config first, then weights in pieces) and builds the engine."""

    def __init__(self) -> None:
        self.config: ModelConfig | None = None
        self.files: dict[str, PieceBuffer | OutsideFile] = {}
        self.hashes: dict[str, hashlib._Hash] = {}
        self.done: list = []
        self.options = LoadOptions()
        self.headers: dict[str, SafetensorsFile | GGUFModel] = {}
        self.token_bytes: tuple[list[bytes], bool] | None = None  # set_tokenizer: the detokenizer's table
        self.special_ids: frozenset[int] = frozenset()  # added tokens marked special (never constrained text)
        self.kernel_exports: object | None = None  # offer_kernels: the wasm module's exports
        self.kernel_threads: object | None = None  # offer_kernel_threads: the kernel thread pool's API
        self._engine: EngineHandle | None = None  # built, until take_engine()

    @_json_result
    def set_config(self, config_json: str) -> dict:
        raw = fields.parse_json(config_json, "config.json")
        self.config = ModelConfig.from_dict(raw)
        c = self.config
        return {"architecture": c.architecture, "max_position_embeddings": c.max_position_embeddings}

    @_json_result
    def offer_kernels(self, exports: object) -> bool:
        """The exports of the WebAssembly SIMD kernels, instantiated on Pyodide's memory (quant/wasm.py)."""
        self.kernel_exports = exports
        return True

    @_json_result
    def offer_kernel_threads(self, api: object) -> bool:
        """The kernel thread pool (quant/pool.py): the WebAssembly kernels' products run on its threads."""
        self.kernel_threads = api
        return True

    @_json_result
    def set_tokenizer(self, tokenizer_json: str) -> int:
        """The model's tokenizer.json: the bytes of every token, for the text of each chunk. Returns the
        vocabulary size it describes."""
        data = fields.obj(fields.parse_json(tokenizer_json, "tokenizer.json"), "tokenizer.json")
        self.token_bytes, self.special_ids = token_byte_table(data), special_token_ids(data)
        return len(self.token_bytes[0])

    @_json_result
    def set_options(self, options_json: str) -> bool:
        """Load options: {context_length, compute, memory_budget, kernels, arithmetic,
        kv: {hot_tokens, cold, budget_bytes, keep}}."""
        raw = _request(options_json, "load options")
        known = {"context_length", "compute", "memory_budget", "kernels", "arithmetic", "kv"}
        unknown = set(raw) - known
        if unknown:
            raise InvalidArgumentError(f"unknown load option {sorted(unknown)[0]!r}")
        kv_raw = raw.get("kv") or {}
        kv_known = {"hot_tokens", "cold", "budget_bytes", "keep"}
        if not isinstance(kv_raw, dict):
            raise InvalidArgumentError(f"kv options must be an object, got {kv_raw!r}")
        if set(kv_raw) - kv_known:
            raise InvalidArgumentError(f"unknown kv option {sorted(set(kv_raw) - kv_known)[0]!r}")
        arithmetic = check_arithmetic(raw.get("arithmetic") or DEFAULT_ARITHMETIC)
        offered: WasmKernels | PoolKernels | None = None
        if self.kernel_threads is not None and self.kernel_exports is not None:
            offered = PoolKernels(self.kernel_threads, arithmetic, WasmKernels(self.kernel_exports, arithmetic))
        elif self.kernel_exports is not None:
            offered = WasmKernels(self.kernel_exports, arithmetic)
        self.options = LoadOptions(
            context_length=raw.get("context_length"),
            compute=raw.get("compute") or "auto",
            memory_budget=raw.get("memory_budget"),
            kv=KVOptions(**kv_raw),
            kernels=raw.get("kernels") or "auto",
            provider=offered,
        )
        return True

    @_json_result
    def add_header(self, name: str, size: int, head: object) -> bool:
        """The first bytes of a weight file (its whole header), before its data: enough to plan."""
        self.headers[name] = SafetensorsFile.from_header(_bytes(head), size, name)
        return True

    @_json_result
    def gguf_header_size(self, size: int, head: object) -> int | None:
        """How many bytes the GGUF header takes, or None if `head` is too short to tell yet."""
        return header_size(_bytes(head), size, "the GGUF file")

    @_json_result
    def add_gguf_header(self, name: str, size: int, head: object) -> dict:
        """A GGUF file's header: the config, tokenizer and plan come from its metadata and tensor list."""
        model = GGUFModel(GGUFFile.from_header(_bytes(head), size, name))
        self.config = ModelConfig.from_dict(model.config, f"{name} (GGUF metadata)")
        tokenizer, tokenizer_config, generation_config = model.tokenizer_files()
        self.token_bytes, self.special_ids = token_byte_table(tokenizer), special_token_ids(tokenizer)
        self.headers[name] = model
        return {
            "config": model.config,
            "tokenizer": tokenizer,
            "tokenizer_config": tokenizer_config,
            "generation_config": generation_config,
        }

    @_json_result
    def plan(self) -> dict:
        """The memory plan for the headers given so far; a LoadError if it does not fit the budget."""
        if self.config is None:
            raise LoadError("config.json was not given before the weights")
        return plan_for(self.config, TensorStore(list(self.headers.values())), self.options).as_dict()

    @_json_result
    def begin_file(self, request_json: str) -> int:
        """request: {name, size, want_sha256}; the file's bytes follow through `write`."""
        r = _request(request_json)
        name, size = _text(r, "name"), r.get("size")
        if not isinstance(size, int) or size < 0:
            raise InvalidArgumentError(f"{name}: size must be a non-negative integer, got {size!r}")
        # with the kernel thread pool, a file arrives in JavaScript memory, outside Pyodide's heap
        pool = self.kernel_threads is not None and self.kernel_exports is not None
        if not pool and size > MAX_ARRAY_BYTES:
            raise LoadError(
                f"{name} is {size / 2**30:.1f} GiB, more than one array of Pyodide's memory holds "
                f"({(MAX_ARRAY_BYTES + 1) / 2**30:.1f} GiB), where the weight files go on one thread; load with "
                "threads: 2 or more (the files then stay outside it; a browser page must be cross-origin isolated)"
            )
        self.files[name] = OutsideFile(self.kernel_threads, size, name) if pool else PieceBuffer(size, name)
        if r.get("want_sha256"):
            self.hashes[name] = hashlib.sha256()
        return size

    @_json_result
    def write(self, name: str, chunk: Any) -> int:
        """Append one chunk (a JsProxy of a Uint8Array, or any bytes-like object); returns bytes so far."""
        piece = self.files[name]
        is_js = hasattr(chunk, "assign_to")
        length = int(chunk.length) if is_js else memoryview(chunk).nbytes
        size = piece.size
        if piece.filled + length > size:
            raise DownloadError(f"{name}: received more than the announced {size} bytes")
        if isinstance(piece, OutsideFile):
            written = piece.write(chunk, length)
            if name in self.hashes:
                self.hashes[name].update(written)
            return piece.filled
        target = piece.next_slice(length)
        if is_js:
            chunk.assign_to(target)
        else:
            target[:] = memoryview(chunk).cast("B")
        if name in self.hashes:
            self.hashes[name].update(target.data)
        return piece.filled

    @_json_result
    def finish_file(self, request_json: str) -> dict:
        """request: {name, sha256 (or null)}: every byte arrived, and they have that digest."""
        r = _request(request_json)
        name, sha256 = _text(r, "name"), r.get("sha256")
        piece = self.files[name]
        size = piece.size
        if piece.filled != size:
            raise DownloadError(f"{name}: download incomplete: received {piece.filled} of {size} bytes")
        if sha256 is not None:
            digest = self.hashes.pop(name).hexdigest()
            if digest != sha256.lower():
                raise DownloadError(f"{name}: sha256 mismatch: expected {sha256.lower()}, got {digest}")
        header = self.headers.get(name)
        if isinstance(piece, OutsideFile):  # the header read at the start describes it; tensors read from `bytes`
            file = header.file if isinstance(header, GGUFModel) else header
            assert file is not None and file.buffer is None  # (add_header or add_gguf_header came first)
            file.buffer = piece.bytes  # type: ignore[assignment]  # (read by slices, as an array is)
            self.done.append(header)
        elif isinstance(header, GGUFModel):
            piece.check_complete()
            self.done.append(GGUFModel(GGUFFile(piece.array, name)))
        else:
            self.done.append(piece.finish())
        return {"bytes": piece.filled}

    @_json_result
    def build(self) -> dict:
        if self.config is None:
            raise LoadError("config.json was not given before the weights")
        if not self.done:
            raise LoadError("no weight files were given")
        if self.token_bytes is None:
            raise LoadError("tokenizer.json was not given before the weights")
        store = TensorStore(self.done)
        engine = Engine.from_store(self.config, store, self.options)
        self.files.clear()
        self.done.clear()  # the engine holds its own compute-form weights; the file buffers can go
        self._engine = EngineHandle(engine, *self.token_bytes, self.special_ids)
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
        request = _request(request_json)
        options = request.get("options", {})
        if not isinstance(options, dict):
            raise InvalidArgumentError("options must be an object")
        options = GenerationOptions.from_kwargs(**options)
        ids = request.get("prompt_ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise InvalidArgumentError("prompt_ids must be a list of integers")
        eos = _ids(request.get("eos_ids", []), "eos_ids")
        self._end()
        self.chunks = self.session.stream(ids, options, eos, self._detokenizer(), started, report_prefill=True)
        return {"prompt_tokens": len(ids)}

    @_json_result
    def check_completion(self, request_json: str) -> dict:
        """request: {kind: "chat" | "text", body: an OpenAI request body}. Checks every field and returns
        what JavaScript tokenizes, as a JSON string (user schemas may hold any key: nothing is renamed):
        {"source": {messages, tools} (chat, for the chat template) or {prompt}}."""
        request = _request(request_json)
        checked = check(request.get("body"), request.get("kind"), room=self.room)
        source = checked.source
        if "messages" in source:
            source = {**source, "messages": messages_for(source["messages"], *self.reads_tools)}
        return {"source": json.dumps(source)}

    @_json_result
    def start_completion(self, request_json: str) -> dict:
        """request: {kind, body, prompt_ids, eos_ids, model}: an OpenAI completion. `step` then also
        gives each chunk's OpenAI events ("events") and, at the end, the whole answer ("result")."""
        started = time.perf_counter()
        request = _request(request_json)
        checked = check(request.get("body"), request.get("kind"), room=self.room)
        ids = _ids(request.get("prompt_ids"), "prompt_ids")
        eos = _ids(request.get("eos_ids", []), "eos_ids")
        prepared = finish(checked, ids, self.engine.context_length, request.get("model") or "ruvllm")
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
        r = _request(request_json)
        name = r.get("name") or "default"
        shape = (r.get("rank"), r.get("alpha"), r.get("targets") or None, r.get("layers", DEFAULT_LAYERS))
        adapter = self.session.new_adapter(name, shape)
        config = adapter.config
        return {"name": name, "rank": config.rank, "targets": list(config.targets), "layers": config.layers}

    @_json_result
    def feedback(self, request_json: str) -> dict:
        """request: {key, adapter, prompt_ids, completion_ids, reward, steps, lr, ..., budget_ms}: a lesson
        whose first step is taken now (the instant loop), for about budget_ms (null: the whole of it);
        `first_step` calls take the rest of it, `learn` calls the other steps. Returns its progress."""
        r = _request(request_json)
        key, name = r.get("key"), r.get("adapter") or "default"
        if key in self.lessons:
            raise InvalidArgumentError(f"a lesson with key {key!r} is already under way")
        lesson = self.session.feedback(*self._lesson(r), budget_ms=r.get("budget_ms"))
        self.lessons[key] = (name, lesson)
        return self._progress_of(key)

    @_json_result
    def first_step(self, request_json: str) -> dict:
        """request: {key, budget_ms}: more of lesson `key`'s first step (the instant loop). Returns its progress."""
        r = _request(request_json)
        if r.get("key") not in self.lessons:
            raise InvalidArgumentError(f"no lesson with key {r.get('key')!r} is under way")
        key = r.get("key")
        self.session.first_step(self.lessons[key][1], r.get("budget_ms"))
        return self._progress_of(key)

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
        status = self.learner.run(_request(request_json).get("budget_ms"))
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
        key = _request(request_json).get("key")
        for each, (_, lesson) in self.lessons.items():
            if key is None or each == key:
                self.session.cancel_learning(lesson)
        return {"lessons": self._report_lessons(), "waiting": self.learner.status().lessons}

    @_json_result
    def set_chat_template(self, request_json: str) -> bool:
        """request: {source}: the chat template JavaScript renders with (null: none), so that the messages
        check_completion returns are the ones it can render (tool calls and results written in the
        Hermes convention where the template does not write them itself: tool_calls.messages_for)."""
        source = _request(request_json).get("source")
        if source is not None and not isinstance(source, str):
            raise InvalidArgumentError("source must be the chat template's text or null")
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
        r = _request(request_json)
        turns = r.get("turns") or []
        if not isinstance(turns, list):
            raise InvalidArgumentError("turns must be a list of lists of integers")
        return self.session.set_calibration(_ids(r.get("ids"), "ids"), [_ids(turn, "turns") for turn in turns])

    def _lesson(self, r: dict) -> tuple[list[int], list[int], float, str, dict]:
        """A lesson request's arguments for Session.feedback."""
        names = ("steps", "lr", "optimizer", "ewc", "until_greedy", "rehearse", "keep", "project", "keyed")
        options = {k: r[k] for k in names if r.get(k) is not None}
        prompt_ids, completion_ids = (
            _ids(r.get("prompt_ids"), "prompt_ids"),
            _ids(r.get("completion_ids"), "completion_ids"),
        )
        return prompt_ids, completion_ids, r.get("reward", 1.0), r.get("adapter") or "default", options

    def _report_lessons(self) -> list[dict]:
        """The progress of every lesson held; the finished, cancelled and dropped ones are let go."""
        return [self._progress_of(key) for key in list(self.lessons)]

    @_json_result
    def load_adapter(self, request_json: str, config_json: str, weights: Any, state: Any = None) -> str:
        """request: {name}; an adapter from its files' contents (bytes, or JS Uint8Arrays)."""
        name = _text(_request(request_json), "name")
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
        name = _text(_request(request_json), "name")
        self.adapters.add(name, Mixture.from_files(config_json, router_file, held, self.engine.config.hidden_size))
        return name

    @_json_result
    def mix_adapters(self, request_json: str) -> dict:
        """request: {name, experts, top_k, depth, size, layerwise, temperature}: an X-LoRA mixture of held
        adapters with an even router, made active."""
        r = _request(request_json)
        names = ("depth", "size", "layerwise", "temperature", "top_k")
        name = r.get("name") or "mixture"
        mixture = self.session.mix_adapters(name, r.get("experts"), **{k: r[k] for k in names if r.get(k) is not None})
        return {"name": name, "experts": mixture.names, "top_k": mixture.config.top_k}

    @_json_result
    def set_adapter(self, request_json: str) -> str | None:
        """request: {name}: compute with that adapter from now on (null: the base model)."""
        name = _request(request_json).get("name")
        self.adapters.activate(name)
        return name

    @_json_result
    def adapter_files(self, request_json: str) -> dict:
        """request: {name} (null: the active adapter): its files, handed over by `take_files`."""
        self._outgoing = self.adapters.held(_request(request_json).get("name")).files()
        return {"files": list(self._outgoing)}

    def take_files(self) -> dict[str, bytes]:
        """The files `adapter_files` prepared, by file name (JavaScript gets Uint8Arrays)."""
        files, self._outgoing = self._outgoing, {}
        return files

    @_json_result
    def adapter_names(self) -> dict:
        """The adapters and mixtures held, the active one, each one's version, the lessons waiting,
        whether learning's preparation (the default adapter's spectra, begun after load) is under way, and
        each one described (`adapters`: AdapterSet.describe)."""
        adapters = self.adapters
        described = adapters.describe()
        return {
            "names": [e["name"] for e in described],
            "active": adapters.active,
            "versions": {e["name"]: e["version"] for e in described},
            "learning": self.learner.status().lessons,
            "preparing": self.learner.preparing is not None,
            "adapters": described,
        }


def _ids(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise InvalidArgumentError(f"{name} must be a list of integers")
    return value


def new_loader() -> ModelLoader:
    return ModelLoader()
