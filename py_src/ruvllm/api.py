"""The Python API: a model folder loaded with its tokenizer, generating streamed text.

import ruvllm
model = ruvllm.load("models/smollm2-135m-instruct")
for chunk in model.generate("Once upon a time", max_tokens=32, temperature=0):
    print(chunk.text, end="", flush=True)
for chunk in model.chat([{"role": "user", "content": "Hi!"}], temperature=0.7, seed=1):
    ...
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from . import host
from .completions import Response, prepare
from .errors import InvalidArgumentError, LoadError
from .files import jsonfields as fields
from .learning.learn import AdaptReport, LearningStatus, Lesson, RouteLesson
from .learning.lora import DEFAULT_LAYERS, Adapter
from .learning.projection import calibration_chat, calibration_text
from .learning.xlora import Mixture, is_xlora
from .model.cache import KVOptions
from .model.weights import ComputeOptions
from .quant.provider import DEFAULT_ARITHMETIC, KernelProvider, check_arithmetic
from .runtime.assembly import Assembly, local_assembly
from .runtime.constrain import Vocabulary
from .runtime.engine import Engine, LoadOptions
from .runtime.generate import Constraint, GenerationOptions
from .session import KEEP, AdapterChoice, Session
from .text.stream import Chunk
from .text.tokenizer import Tokenizer, tokenizers_installed
from .tools.perplexity import token_nll


class Model:
    """A model and its tokenizer. Generations may run from several threads, or be stepped in turn from
    one: each owns a KV cache while it runs (they compute one step at a time). The cache of the last
    generation that finished is lent to the next one, so a chat's next turn reuses what it holds.
    """

    def __init__(
        self, engine: Engine, tokenizer: Tokenizer, eos_token_ids: Sequence[int], name: str = "ruvllm"
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.name = name  # the model's name in OpenAI answers (the file or folder name)
        self.session = Session(engine, tokenizer.token_bytes, tokenizer.special_ids)  # what the bridge shares
        self.adapters = self.session.adapters  # MicroLoRA: held, selected, learning
        # what learning keeps its adapters' inputs away from
        self.session.set_calibration(tokenizer.encode(calibration_text()), self._calibration_turns())
        self._read_folders: list[str] = []  # the model and the adapters loaded: never written over

    def _calibration_turns(self) -> list[list[int]]:
        """The calibration chat's turns in this model's template (none without a template, or with one
        that refuses them: the model still loads, and learning whitens with the raw text alone)."""
        if self.tokenizer.chat_template is None:
            return []
        turns = []
        for user, answer in calibration_chat():
            messages = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            try:
                turns.append(self.tokenizer.encode_chat(messages, add_generation_prompt=False))
            except (InvalidArgumentError, LoadError):
                return []
        return turns

    @classmethod
    def of(cls, assembly: Assembly, tokenizer: Tokenizer, generation_config: object, name: str) -> Model:
        """The model of an assembly's files (built with its options) and this tokenizer."""
        engine = assembly.build()
        return cls(engine, tokenizer, eos_token_ids(generation_config, engine, tokenizer), name)

    @property
    def config(self):
        return self.engine.config

    def generate(self, prompt: str | Sequence[int], **options: object) -> Iterator[Chunk]:
        """Stream the continuation of raw text (or of token ids).

        Options: max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed, stop, ignore_eos,
        and adapter (a loaded adapter's name, or None for the base model; default: whichever is set).
        """
        started = time.perf_counter()
        adapter = self._adapter_option(options)
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (Sequence, np.ndarray)) and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt
        ):
            ids = [int(t) for t in prompt]
        else:
            raise InvalidArgumentError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        return self._stream(ids, GenerationOptions.from_kwargs(**options), started, adapter)

    def chat(self, messages: list[dict], **options: object) -> Iterator[Chunk]:
        """Stream the assistant's reply to `messages`, rendered with the model's chat template."""
        started = time.perf_counter()
        adapter = self._adapter_option(options)
        opts = GenerationOptions.from_kwargs(**options)
        return self._stream(self.tokenizer.encode_chat(messages), opts, started, adapter)

    # --- OpenAI shapes (llama-cpp-python's names) ------------------------------------------------

    def create_chat_completion(self, messages: list[dict], **body: object) -> dict | Iterator[dict]:
        """An OpenAI chat completion: `body` holds the request's other fields (max_tokens, temperature,
        top_p, stop, seed, logprobs, top_logprobs, response_format, tools, tool_choice, stream, ...; see
        completions/). Returns the `chat.completion` dict, or with stream=True an iterator of
        `chat.completion.chunk` dicts."""
        return self._complete({"messages": messages, **body}, "chat")

    def create_completion(self, prompt: str | list[int], **body: object) -> dict | Iterator[dict]:
        """An OpenAI (text) completion of raw text: a `text_completion` dict, or an iterator of them
        with stream=True."""
        return self._complete({"prompt": prompt, **body}, "text")

    @property
    def vocabulary(self) -> Vocabulary:
        """The tokens as bytes, prepared for constrained decoding (built on first use)."""
        return self.session.vocabulary(self.eos_token_ids)

    def _complete(self, body: dict, kind: str) -> dict | Iterator[dict]:
        started = time.perf_counter()
        prepared = prepare(body, kind, self.tokenizer, self.engine.context_length, self.name)
        constraint = (
            prepared.constraint(self.vocabulary) if prepared.tool_choice != "none" or prepared.grammar else None
        )
        chunks = self._stream(prepared.prompt_ids, prepared.options, started, KEEP, constraint)
        response = Response(prepared, self.tokenizer.token_bytes)
        if prepared.stream:
            return (event for chunk in chunks for event in response.add(chunk))
        for chunk in chunks:
            response.add(chunk)
        return response.result()

    # --- MicroLoRA ------------------------------------------------------------------------------

    def new_adapter(
        self,
        name: str = "default",
        rank: int | None = None,
        alpha: float | None = None,
        targets: Sequence[str] | None = None,
        layers: Sequence[int] | str | None = DEFAULT_LAYERS,
    ) -> Adapter:
        """A fresh adapter (it changes nothing until it learns), held under `name` and made active.
        rank, alpha, targets: LoRAConfig's defaults when None (rank 32, alpha 2 x rank, down_proj);
        layers: the decoder layers it adapts (negative counts from the top; None: all; "two-thirds", the
        default: the two from two thirds of the depth)."""
        return self.session.new_adapter(name, (rank, alpha, targets, layers))

    def load_adapter(self, path: str, name: str | None = None) -> str:
        """Load an adapter folder (ours, a Hugging Face PEFT LoRA, or a PEFT X-LoRA mixture with its
        experts) without reloading the model; returns the name it is held under."""
        name = name or os.path.basename(os.path.normpath(path))
        xlora = is_xlora(os.path.join(path, "adapter_config.json"))
        loaded = Mixture.load(path, self.engine.weights) if xlora else Adapter.load(path, self.engine.weights)
        self.adapters.add(name, loaded)
        self._read_folders.append(path)
        return name

    def save_adapter(self, path: str, name: str | None = None, force: bool = False, inputs: Sequence[str] = ()) -> None:
        """Write adapter `name` (default: the active one) as a PEFT folder (an X-LoRA mixture with its
        experts in subfolders), whole or not at all. `path` must not exist or be empty, unless `force`
        (then it is replaced); it may never be, or hold, a folder this model read (the model, an adapter
        loaded) or one of `inputs`."""
        held = self.adapters.held(name)
        held.save(path, force=force, inputs=[*self._read_folders, *inputs])

    def mix_adapters(
        self,
        name: str,
        experts: Sequence[str],
        top_k: int | None = None,
        depth: int = 1,
        size: int = 2048,
        layerwise: bool = False,
        temperature: float = 1.0,
        global_scaling_weight: float = 1.0,
    ) -> Mixture:
        """An X-LoRA mixture of held adapters (copies of them as they are now), routed per token by a new
        router that starts out giving every expert the same weight; held under `name` and made active.
        Feedback on it (`adapt`, `feedback` with adapter=name) teaches its router."""
        return self.session.mix_adapters(
            name,
            experts,
            depth=depth,
            size=size,
            layerwise=layerwise,
            temperature=temperature,
            top_k=top_k,
            global_scaling_weight=global_scaling_weight,
        )

    def list_adapters(self) -> list[dict]:
        """Every adapter and mixture held: name, kind ("lora" or "xlora"), version, whether active, and
        rank/targets/layers (LoRA) or experts/top_k (X-LoRA)."""
        return self.adapters.describe()

    def set_adapter(self, name: str | None) -> None:
        """Compute with adapter `name` from now on (None: the base model)."""
        self.adapters.activate(name)

    def adapt(
        self,
        prompt: str | list[dict],
        completion: str,
        reward: float = 1.0,
        adapter: str = "default",
        chat: bool = False,
        **options: object,
    ) -> AdaptReport:
        """Learn from feedback, the whole lesson in this call (the npm package's `llm.adapt` is the same
        lesson, its steps run between the worker's requests): make `completion` likelier after `prompt`
        (reward > 0) or less likely (< 0). Returns its report.

        chat: `prompt` is a user message (or a list of messages), rendered with the chat template, and
        the completion is the assistant's answer, ending with the end-of-turn token. Options: steps,
        lr, optimizer, ewc, until_greedy, rehearse, keep, project, keyed (AdaptOptions). An adapter
        called `adapter` is made (the default config) if none is held yet. When the text is what the
        last generation produced, the hidden states it computed are reused (no forward through the
        layers below the adapter).
        """
        prompt_ids, completion_ids = self.feedback_ids(prompt, completion, chat)
        return self.session.adapt(prompt_ids, completion_ids, reward, adapter, options)

    def feedback(
        self,
        prompt: str | list[dict],
        completion: str,
        reward: float = 1.0,
        adapter: str = "default",
        chat: bool = False,
        **options: object,
    ) -> Lesson | RouteLesson:
        """Learn from feedback in the background (arguments as `adapt`): the first step is taken now, so
        the next answer already differs; the other steps and the consolidation wait for `learn()` calls
        (between generations, each as long as you allow). Returns the lesson (`done`, `steps`, `report`)."""
        prompt_ids, completion_ids = self.feedback_ids(prompt, completion, chat)
        return self.session.feedback(prompt_ids, completion_ids, reward, adapter, options)

    def learn(self, budget_ms: float | None = 100.0) -> LearningStatus:
        """Steps of the waiting lessons (`feedback`) for about `budget_ms` (at least one step; None: until
        all are done). Each step is a forward and backward through the adapted layers only."""
        return self.session.learn(budget_ms)

    def cancel_learning(self) -> LearningStatus:
        """Drop the lessons still waiting; what their steps taught so far stays."""
        return self.session.cancel_learning()

    @property
    def learning(self) -> LearningStatus:
        """Lessons waiting, the current one's step, its adapter and that adapter's version."""
        return self.session.learner.status()

    def completion_log_prob(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        """Mean log-probability of `completion_ids` after `prompt_ids`, with the active adapter."""
        tokens = [*prompt_ids, *completion_ids]
        logits = self.engine.forward(tokens[:-1], 0, self.engine.new_cache())[len(prompt_ids) - 1 :]  # (C, V)
        return -float(token_nll(logits, np.asarray(completion_ids)).mean())

    def reproduces(self, prompt: str | list[dict], completion: str, chat: bool = False) -> bool:
        """Whether greedy decoding after `prompt` (as `adapt` takes it) starts with `completion`."""
        prompt_ids, completion_ids = self.feedback_ids(prompt, completion, chat)
        chunks = self.generate(prompt_ids, max_tokens=len(completion_ids), temperature=0)
        return "".join(c.text for c in chunks).startswith(completion)

    def feedback_ids(self, prompt: str | list[dict], completion: str, chat: bool) -> tuple[list[int], list[int]]:
        """Token ids of a prompt and its completion, tokenized as they would be generated."""
        if chat or not isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            prompt_ids = self.tokenizer.encode_chat(messages)
            end = [self.eos_token_ids[0]] if self.eos_token_ids else []
            return prompt_ids, self.tokenizer.encode(completion, add_special_tokens=False) + end
        prompt_ids = self.tokenizer.encode(prompt)
        whole = self.tokenizer.encode(prompt + completion)
        if whole[: len(prompt_ids)] == prompt_ids and len(whole) > len(prompt_ids):
            return prompt_ids, whole[len(prompt_ids) :]
        return prompt_ids, self.tokenizer.encode(completion, add_special_tokens=False)

    def _adapter_option(self, options: dict) -> str | AdapterChoice | None:
        return options.pop("adapter") if "adapter" in options else KEEP

    def _stream(
        self,
        ids: list[int],
        options: GenerationOptions,
        started: float,
        adapter: str | AdapterChoice | None,
        constraint: Constraint | None = None,
    ) -> Iterator[Chunk]:
        detokenizer = self.tokenizer.detokenizer()
        # (without report_prefill, no Prefilling marker comes)
        return self.session.stream(  # type: ignore[return-value]
            ids, options, self.eos_token_ids, detokenizer, started, adapter, constraint
        )


def load(
    path: str | os.PathLike,
    context_length: int | None = None,
    compute: str | ComputeOptions = "auto",
    memory_budget: int | None = None,
    kv: KVOptions | None = None,
    isq: str = "rtn",
    isq_format: str = "q4_1",
    threads: int | None = None,
    kernels: str = "auto",
    chat_template: str | None = None,
    arithmetic: str = DEFAULT_ARITHMETIC,
    plan: bool = True,
) -> Model:
    """Load a model: a GGUF file (`x.gguf`), a ruvllm or plain Hugging Face safetensors model folder, or
    a hub name (`hf:OWNER/REPO/FILE.gguf`, `hf:OWNER/REPO`: downloaded once into the cache root's hub
    folder, files/hub.py).

    compute: how weights live in memory ("f32", "q8", "q4"; "auto": the fastest that fits
    `memory_budget` bytes, f32 without a budget). kv: the two-tier KV cache (KVOptions).
    isq: how a float model is quantized at load when compute asks for q8/q4: "rtn" (round to
    nearest) or "awq" (activation-aware, calibrated on a short built-in text). isq_format: the 4-bit
    format ("q4_1" or "q4_0") float matrices get under compute "q4". threads: the BLAS threads a prompt's
    products use (default: one or the CPUs available, whichever measures faster as it runs; decoding
    always uses one; see runtime/threads.py).
    kernels: what computes the matrix products: "auto" (a faster kernel provider where the runtime
    offers one, NumPy otherwise; on CPython, NumPy and its BLAS for now), "wasm" (the WebAssembly SIMD
    kernels: in any Pyodide on a runtime with SIMD128, host.py; on CPython the same binary through
    wasmtime, `pip install 'ruvllm[kernels]'`, quant/native.py, with the decode plan on one thread) or
    "numpy".
    chat_template: a Jinja chat template to use instead of the model's own (or for a model without one).
    arithmetic: the WebAssembly kernels' ("fast": int16 products when decoding; "exact": NumPy's values
    summed in another order; docs/kernels.md). NumPy's is exact.
    plan: run each forward as one call of the kernels' decode plan (docs/kernels.md; where the kernels
    offer a memory for it: the WebAssembly kernels on one thread); False: Python drives each product.
    """
    from .files.hub import ensure_local, is_hub_name  # (here: the Pyodide worker never imports it)

    path = os.fspath(path)
    name = model_name(path)
    if is_hub_name(path):
        path = ensure_local(path)
    assembly = local_assembly(path)  # an unsupported architecture is the first thing to report
    # Without `tokenizers`, Gemma's half a million merges are ranked as BPE needs them, never listed.
    tokenizer_json, tokenizer_config, generation_config = assembly.tokenizer_files(merges=tokenizers_installed())
    tokenizer = Tokenizer(tokenizer_json, tokenizer_config, *assembly.tokenizer_sources())
    if chat_template is not None:
        tokenizer.set_chat_template(chat_template)
    calibration = tuple(tokenizer.encode(calibration_text())) if isq == "awq" else None
    more = {"threads": threads, "isq": isq, "isq_format": isq_format, "calibration_ids": calibration}
    assembly.options = load_options(context_length, compute, memory_budget, kv, kernels, arithmetic, plan, **more)
    model = Model.of(assembly, tokenizer, generation_config, name)
    model._read_folders.append(path)
    return model


async def load_async(
    source: str,
    on_progress: Callable[[dict], None] | None = None,
    *,
    context_length: int | None = None,
    compute: str | ComputeOptions = "auto",
    memory_budget: int | None = None,
    kv: KVOptions | None = None,
    kernels: str = "auto",
    arithmetic: str = DEFAULT_ARITHMETIC,
    plan: bool = True,
    chat_template: str | None = None,
) -> Model:
    """Load a model over fetch, inside Pyodide (a notebook, a PyScript page, a console; browsers and
    Node): a GGUF file's URL, a model folder's URL (config.json, tokenizer.json, model.safetensors or
    its shards), or a hub name as `load` takes (from $RUVLLM_HF_ENDPOINT or the hub).

        model = await ruvllm.load_async("hf:OWNER/REPO/FILE.gguf", on_progress=print)

    The files are read as runtime/assembly.py asks for them: every weight file's header before any
    tensor data, so a model the memory plan refuses fails before its weights download. Each piece is
    copied once into memory Python owns; where the page has the Cache API, files read to their end are
    kept there (the npm package's store) and read from it next time. on_progress gets
    {"file", "loaded", "total"} (bytes) after each piece of the weights. The options are `load`'s.
    """
    options = load_options(context_length, compute, memory_budget, kv, kernels, arithmetic, plan)
    assembly = await host.fetch_model(source, options, on_progress)
    tokenizer_json, tokenizer_config, generation_config = assembly.tokenizer_files(merges=tokenizers_installed())
    tokenizer = Tokenizer(tokenizer_json, tokenizer_config, *assembly.tokenizer_sources())
    if chat_template is not None:
        tokenizer.set_chat_template(chat_template)
    return Model.of(assembly, tokenizer, generation_config, model_name(source))


def load_options(
    context_length: int | None,
    compute: str | ComputeOptions,
    memory_budget: int | None,
    kv: KVOptions | None,
    kernels: str,
    arithmetic: str,
    plan: bool = True,
    **more: Any,
) -> LoadOptions:
    """`load`'s options as the engine takes them, with the kernel provider this runtime offers (more:
    LoadOptions' other fields)."""
    if not isinstance(plan, bool):
        raise InvalidArgumentError(f"plan must be True or False, got {plan!r}")
    provider, kv = host_kernels(kernels, arithmetic), kv or KVOptions()
    return LoadOptions(
        context_length=context_length,
        compute=compute,
        memory_budget=memory_budget,
        kv=kv,
        kernels=kernels,
        provider=provider,
        plan=plan,
        **more,
    )


def host_kernels(kernels: str, arithmetic: str) -> KernelProvider | None:
    """The kernel provider this runtime offers for `kernels` (host.py: the WebAssembly kernels in
    Pyodide; on CPython, the same kernels through wasmtime, quant/native.py, when asked for by name:
    "auto" keeps NumPy's BLAS there); with kernels="wasm", an error saying why when they cannot run."""
    check_arithmetic(arithmetic)
    if kernels == "numpy" or (kernels == "auto" and not host.IN_PYODIDE):
        return None
    if host.IN_PYODIDE:
        provider, reason = host.wasm_kernels(arithmetic)
    else:
        from .quant.native import native_kernels

        provider, reason = native_kernels(arithmetic)
    if provider is None and kernels == "wasm":
        raise InvalidArgumentError(f"kernels='wasm' cannot run here: {reason}")
    return provider


def model_name(path: str) -> str:
    """The model's name in OpenAI answers, as the npm package gives it (hub.js modelName): the file or
    folder name without `.gguf`; for a hub name, its GGUF file's name or else the repo's."""
    from .files.hub import is_hub_name, parse

    if is_hub_name(path):
        hub = parse(path)
        path = hub.file or hub.repo
    last = os.path.basename(os.path.normpath(path))
    return (last[: -len(".gguf")] if last.lower().endswith(".gguf") else last) or "ruvllm"


def eos_token_ids(generation_config: object, engine: Engine, tokenizer: Tokenizer) -> list[int]:
    """End-of-sequence ids from generation_config.json, config.json and the tokenizer's eos_token."""
    ids = list(engine.config.eos_token_ids)
    source = "generation_config.json"
    vocab = engine.config.vocab_size
    ids += fields.token_ids(fields.obj(generation_config, source), "eos_token_id", source, vocab)
    token = tokenizer.token_id(tokenizer.special_tokens.get("eos_token"))
    if token is not None:
        ids.append(token)
    return sorted(set(ids))
