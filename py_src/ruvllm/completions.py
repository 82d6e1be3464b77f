"""OpenAI's chat completion and completion shapes, for `Model.create_chat_completion` /
`Model.create_completion` (llama-cpp-python's names) and for `ruvllm serve`.

A request body is checked once (`check`): every field OpenAI defines that we honour is turned into
generation options and a grammar for the token constraint (response_format, tool calls); fields we
cannot honour are refused by name; a few that clients send by default are accepted and ignored
(IGNORED). Its prompt is then tokenized (`prepare` on CPython; the browser worker tokenizes in
JavaScript) and `finish` makes the `Prepared` request. Responses are built from the text layer's
`Chunk`s as they come (`Response`), so the solo API, the worker and the batching server shape them
with the same code.

Defaults follow OpenAI, not ruvllm's `generate`: temperature 1, top_p 1, no top-k or min-p, and no
max_tokens bound but the context window.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .errors import InvalidArgumentError
from .runtime.constrain import Grammar, Matcher, Vocabulary, json_grammar
from .runtime.generate import GenerationOptions
from .runtime.sampling import SamplingOptions
from .text.chat_template import check_messages
from .text.stream import Chunk
from .text.tokenizer import Tokenizer
from .text.tool_calls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    check_tool_choice,
    check_tools,
    parse_tool_calls,
    template_messages,
    tool_call_schema,
)

# Fields of OpenAI's request bodies that we honour (ruvllm's own sampling fields too).
SAMPLING = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed"}
COMMON = {"model", "max_tokens", "stop", "stream", "stream_options", "ignore_eos", *SAMPLING}
CHAT_FIELDS = {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    *COMMON,
}
TEXT_FIELDS = {"prompt", "logprobs", "response_format", *COMMON}
# Sent by clients and frameworks by default, with no effect on one local model: accepted, ignored.
IGNORED = {"user", "metadata", "store", "parallel_tool_calls", "service_tier", "n", "frequency_penalty",
           "presence_penalty", "logit_bias"}  # fmt: skip
MAX_TEXT_LOGPROBS = 5  # OpenAI's bound for /v1/completions


@dataclass
class Prepared:
    """A checked request: what to generate and how to answer."""

    kind: str  # "chat" or "text"
    model: str
    prompt_ids: list[int]
    options: GenerationOptions
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    grammar: Grammar | None = None  # output constrained from the first token
    tools: list[dict] = field(default_factory=list)
    tool_choice: str | dict = "none"

    @property
    def constrained(self) -> bool:
        """Whether generation needs a token constraint (and so the prepared Vocabulary)."""
        return self.grammar is not None or self.tool_choice != "none"

    def constraint(self, vocabulary: Vocabulary) -> Matcher | ToolCallTrigger | None:
        """A fresh constraint for one generation of this request (it keeps state)."""
        if self.grammar is not None:
            return Matcher(self.grammar, vocabulary)
        if self.tool_choice == "auto":
            return ToolCallTrigger(tool_call_schema(self.tools, "auto"), vocabulary)
        return None


@dataclass
class Checked:
    """A request body checked, its prompt not yet tokenized (the browser worker tokenizes in JavaScript)."""

    kind: str
    source: dict  # chat: {"messages", "tools"} as the chat template takes them; text: {"prompt": str | ids}
    generation: dict  # GenerationOptions fields but max_tokens
    max_tokens: int | None  # None: until the end of the context window
    stream: bool
    include_usage: bool
    logprobs: bool
    grammar: Grammar | None
    tools: list[dict]
    tool_choice: str | dict


def prepare(body: object, kind: str, tokenizer: Tokenizer, context: int, model_name: str) -> Prepared:
    """Check an OpenAI request body (chat: /v1/chat/completions, text: /v1/completions) and tokenize its
    prompt; `context`: the positions a sequence may have."""
    checked = check(body, kind)
    if kind == "chat":
        ids = tokenizer.encode_chat(checked.source["messages"], tools=checked.source["tools"])
    else:
        prompt = checked.source["prompt"]
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    return finish(checked, ids, context, model_name)


def finish(checked: Checked, prompt_ids: list[int], context: int, model_name: str) -> Prepared:
    """The prepared request, given its prompt's token ids."""
    max_tokens = checked.max_tokens
    if max_tokens is None:
        max_tokens = max(1, context - len(prompt_ids))  # OpenAI: until the end of the context window
    options = GenerationOptions.from_kwargs(max_tokens=max_tokens, **checked.generation)
    return Prepared(
        checked.kind,
        model_name,
        list(prompt_ids),
        options,
        checked.stream,
        checked.include_usage,
        checked.logprobs,
        checked.grammar,
        checked.tools,
        checked.tool_choice,
    )


def check(body: object, kind: str) -> Checked:
    """Every field of a request body but its prompt's tokens, checked; unsupported fields are refused."""
    if kind not in ("chat", "text"):
        raise InvalidArgumentError(f"kind must be chat or text, got {kind!r}")
    if not isinstance(body, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    allowed = CHAT_FIELDS if kind == "chat" else TEXT_FIELDS
    for name in body:
        if name not in allowed and name not in IGNORED:
            raise InvalidArgumentError(f"unsupported field {name!r}; supported: {', '.join(sorted(allowed))}")
    _check_ignored(body)
    stream = _flag(body, "stream")
    include_usage = False
    if body.get("stream_options") is not None:
        if not isinstance(body["stream_options"], dict) or set(body["stream_options"]) - {"include_usage"}:
            raise InvalidArgumentError('stream_options must be {"include_usage": true|false}')
        include_usage = bool(body["stream_options"].get("include_usage"))
    tools, tool_choice, grammar = [], "none", None
    if kind == "chat":
        messages = body.get("messages")
        tools = check_tools(body.get("tools"))
        tool_choice = check_tool_choice(body.get("tool_choice"), tools)
        messages = template_messages(messages) if isinstance(messages, list) else messages
        check_messages(messages)
        source = {"messages": messages, "tools": tools or None}
        if tool_choice not in ("none", "auto"):  # "required" or one named function: a call from the start
            grammar = json_grammar(tool_call_schema(tools, tool_choice), f"{TOOL_CALL_OPEN}\n", f"\n{TOOL_CALL_CLOSE}")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]  # clients send [text] for one prompt
        ids = (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        )
        if not isinstance(prompt, str) and not ids:
            raise InvalidArgumentError("prompt must be a string or a non-empty list of token ids (one prompt)")
        source = {"prompt": prompt}
    response_format = body.get("response_format")
    if response_format is not None:
        if grammar is not None:
            raise InvalidArgumentError("response_format cannot be combined with a required tool call")
        grammar = _response_grammar(response_format)
    logprobs, top = _logprobs(body, kind)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    stop = body.get("stop")
    generation = {
        "stop": [] if stop is None else stop,
        "ignore_eos": _flag(body, "ignore_eos"),
        "logprobs": top if logprobs else None,
        **_sampling(body),
    }
    GenerationOptions.from_kwargs(max_tokens=1 if max_tokens is None else max_tokens, **generation)  # refuse now
    return Checked(kind, source, generation, max_tokens, stream, include_usage, logprobs, grammar, tools, tool_choice)


def _check_ignored(body: dict) -> None:
    """Ignored fields are accepted only with values that change nothing."""
    if body.get("n", 1) != 1:
        raise InvalidArgumentError(f"n must be 1 (one choice per request), got {body['n']!r}")
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise InvalidArgumentError(f"{name} is not supported (use repetition_penalty), got {body[name]!r}")
    if body.get("logit_bias"):
        raise InvalidArgumentError("logit_bias is not supported")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be true or false, got {value!r}")
    return value


def _sampling(body: dict) -> dict:
    """OpenAI's defaults (temperature 1, top_p 1, no top-k/min-p) where the body says nothing."""
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "seed": None}
    values = {name: body[name] if body.get(name) is not None else defaults[name] for name in SAMPLING}
    SamplingOptions(**values)  # a bad value is refused here with its name
    return values


def _logprobs(body: dict, kind: str) -> tuple[bool, int]:
    if kind == "chat":
        wanted = _flag(body, "logprobs")
        top = body.get("top_logprobs")
        if top is None:
            return wanted, 0
        if not wanted:
            raise InvalidArgumentError("top_logprobs needs logprobs: true")
        return True, top  # GenerationOptions checks the range
    value = body.get("logprobs")  # completions: the number of alternatives, or null
    if value is None:
        return False, 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TEXT_LOGPROBS:
        raise InvalidArgumentError(f"logprobs must be an integer in [0, {MAX_TEXT_LOGPROBS}], got {value!r}")
    return True, value


def _response_grammar(response_format: object) -> Grammar | None:
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise InvalidArgumentError('response_format must be {"type": "text" | "json_object" | "json_schema", ...}')
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(None)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), (dict, bool)):
            raise InvalidArgumentError('response_format json_schema must be {"name": ..., "schema": {...}}')
        return json_grammar(spec["schema"])
    raise InvalidArgumentError(f"response_format type must be text, json_object or json_schema, got {kind!r}")


class ToolCallTrigger:
    """tool_choice "auto": the model writes freely until it opens a call (`<tool_call>`); from there the
    call must be one of the tools with arguments that fit its parameters, up to `</tool_call>`; then it
    is free again (for text, or another call)."""

    def __init__(self, schema: dict, vocabulary: Vocabulary) -> None:
        self.grammar = json_grammar(schema, "\n", f"\n{TOOL_CALL_CLOSE}")
        self.vocabulary = vocabulary
        self.free = np.ones(vocabulary.size, dtype=bool)
        self.tail = b""  # the last bytes written, to see the opening tag
        self.call: Matcher | None = None

    def allowed(self) -> np.ndarray:
        if self.call is None:
            return self.free
        if self.call.complete:  # the call is closed: free text again
            self.call = None
            return self.free
        return self.call.allowed()

    def advance(self, token_id: int) -> None:
        if self.call is not None and not self.call.complete:
            self.call.advance(token_id)
            return
        self.call = None
        self.tail = (self.tail + self.vocabulary.token_bytes[token_id])[-len(TOOL_CALL_OPEN) :]
        if self.tail.endswith(TOOL_CALL_OPEN.encode()):
            self.call, self.tail = Matcher(self.grammar, self.vocabulary), b""

    @property
    def complete(self) -> bool:
        return False  # the model ends its reply itself


class Response:
    """Builds the OpenAI answer to one prepared request from its chunks: `add` gives the stream chunks
    for one Chunk (chat.completion.chunk / text_completion objects), `result` the whole answer."""

    def __init__(self, prepared: Prepared, token_bytes: list[bytes]) -> None:
        self.prepared, self.token_bytes = prepared, token_bytes
        chat = prepared.kind == "chat"
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.object = "chat.completion" if chat else "text_completion"
        self.created = int(time.time())
        self.text: list[str] = []
        self.logprobs: list[dict] = []
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.buffer_for_tools = chat and prepared.tool_choice != "none"  # calls are parsed from the whole text
        self.sent_role = False

    def _head(self, stream: bool) -> dict:
        kind = self.object + (".chunk" if stream and self.prepared.kind == "chat" else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.prepared.model}

    def add(self, chunk: Chunk) -> list[dict]:
        """Take one chunk; the stream chunks it gives (none while text is held back)."""
        self.text.append(chunk.text)
        entry = self._logprob_entry(chunk) if self.prepared.logprobs else None
        if entry is not None:
            self.logprobs.append(entry)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            stats = chunk.stats
            self.usage = {
                "prompt_tokens": stats.prompt_tokens,
                "completion_tokens": stats.completion_tokens,
                "total_tokens": stats.prompt_tokens + stats.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
            }
        if not self.prepared.stream:
            return []
        out = []
        if self.prepared.kind == "chat":
            if not self.sent_role:
                out.append(self._chat_chunk({"role": "assistant", "content": ""}, None, None))
                self.sent_role = True
            if not self.buffer_for_tools and (chunk.text or entry is not None):
                out.append(self._chat_chunk({"content": chunk.text}, None, entry))
            if self.finish_reason is not None:
                out += self._chat_ending()
        else:
            if chunk.text or entry is not None or self.finish_reason is not None:
                choice = {"index": 0, "text": chunk.text, "logprobs": None, "finish_reason": self.finish_reason}
                if entry is not None:
                    choice["logprobs"] = _text_logprobs([entry])
                out.append({**self._head(True), "choices": [choice]})
        if self.finish_reason is not None and self.prepared.include_usage:
            out.append({**self._head(True), "choices": [], "usage": self.usage})
        return out

    def _chat_chunk(self, delta: dict, finish: str | None, entry: dict | None) -> dict:
        logprobs = {"content": [entry]} if entry is not None else None
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**self._head(True), "choices": [choice]}

    def _chat_ending(self) -> list[dict]:
        if not self.buffer_for_tools:
            return [self._chat_chunk({}, self.finish_reason, None)]
        content, calls = parse_tool_calls("".join(self.text))
        delta: dict = {"content": content}
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        finish = "tool_calls" if calls else self.finish_reason
        logprobs = {"content": self.logprobs} if self.prepared.logprobs else None
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return [{**self._head(True), "choices": [choice]}]

    def result(self) -> dict:
        """The whole answer (after the last chunk)."""
        text = "".join(self.text)
        if self.prepared.kind == "chat":
            message: dict = {"role": "assistant", "content": text}
            finish = self.finish_reason
            if self.prepared.tool_choice != "none":
                content, calls = parse_tool_calls(text)
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": calls}
                    finish = "tool_calls"
            logprobs = {"content": self.logprobs} if self.prepared.logprobs else None
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
        else:
            logprobs = _text_logprobs(self.logprobs) if self.prepared.logprobs else None
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": self.finish_reason}
        return {**self._head(False), "choices": [choice], "usage": self.usage}

    def _logprob_entry(self, chunk: Chunk) -> dict | None:
        if chunk.logprob is None:
            return None
        return {
            **self._token(chunk.token_id),
            "logprob": chunk.logprob,
            "top_logprobs": [{**self._token(t), "logprob": lp} for t, lp in chunk.top_logprobs],
        }

    def _token(self, token_id: int) -> dict:
        data = self.token_bytes[token_id] if token_id < len(self.token_bytes) else b""
        return {"token": data.decode("utf-8", errors="replace"), "bytes": list(data)}


def _text_logprobs(entries: list[dict]) -> dict:
    """The /v1/completions layout: parallel lists."""
    offsets, at = [], 0
    for entry in entries:
        offsets.append(at)
        at += len(entry["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def sse(events: Iterator[dict]) -> Iterator[str]:
    """Server-sent events as OpenAI streams them: one `data: {json}` per chunk, then `data: [DONE]`."""
    for event in events:
        yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
