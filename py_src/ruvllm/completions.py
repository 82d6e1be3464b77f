"""OpenAI's chat completion and completion shapes, for `Model.create_chat_completion` /
`Model.create_completion` (llama-cpp-python's names) and for `ruvllm serve`.

A request body is checked once (`check`), every field by its type, each error naming the field: `null`
is the same as absent, as in OpenAI's API; a boolean is never a number; no number may be one a double
cannot hold, and nothing may be nested deeper than json_body.MAX_DEPTH. Every field OpenAI defines that
we honour is turned into generation options and grammars for the token constraint (response_format,
tool calls: compiled here, so a schema we cannot follow is refused before any answer starts). Fields
OpenAI defines that we cannot honour are refused by name unless they hold the value that changes
nothing (n: 1, echo: false, ...); a few that clients send by default are type-checked and ignored
(IGNORED). Names OpenAI does not define are refused (a misspelt keyword of the Python API) or, for the
HTTP server, ignored as vLLM's and llama.cpp's servers do (`unknown_fields`).

The prompt is then tokenized (`prepare` on CPython; the browser worker tokenizes in JavaScript) and
`finish` makes the `Prepared` request. Responses are built from the text layer's `Chunk`s as they come
(`Response`), so the solo API, the worker and the batching server shape them with the same code.

Defaults follow OpenAI, not ruvllm's `generate`: temperature 1, top_p 1, no top-k or min-p, and no
max_tokens bound but the context window, except for constrained output (response_format json_object or
json_schema, a required tool call): without max_tokens it takes at most CONSTRAINED_MAX_TOKENS, within
which the document is always closed. A json_schema writes an object's declared properties only, unless
the schema allows others explicitly (`additionalProperties` true or a schema, `patternProperties`), as
OpenAI's structured outputs and XGrammar's strict mode do: JSON Schema's open objects, read literally,
let a small model add keys until the context is full.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from .errors import InvalidArgumentError
from .files.json_body import FieldError, boolean, check_values, integer, number, obj, parse, shown, string
from .runtime.constrain import MAX_DOCUMENT_BYTES, Budgeted, DocumentTooLongError, Grammar, Vocabulary, json_grammar
from .runtime.constrain.closing import closing_tokens
from .runtime.generate import MAX_TOP_LOGPROBS, GenerationOptions
from .text.stream import Chunk
from .text.tokenizer import Tokenizer
from .text.tool_calls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    check_tool_choice,
    check_tools,
    parse_tool_calls,
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
# Sent by clients and frameworks by default, with no effect on one local model: type-checked, ignored.
IGNORED = {"user", "metadata", "store", "parallel_tool_calls", "service_tier"}
# OpenAI's fields that we cannot honour: accepted only with the value that changes nothing (_check_defaults).
DEFAULT_ONLY = {"n", "best_of", "echo", "suffix", "frequency_penalty", "presence_penalty", "logit_bias", "audio",
                "modalities"}  # fmt: skip
ENDPOINTS = {"chat": "/v1/chat/completions", "text": "/v1/completions"}
MAX_TEXT_LOGPROBS = 5  # OpenAI's bound for /v1/completions
# max_tokens of constrained output when a request gives none: documents end well within it (the closing
# is kept within the budget), and a model that rambles inside a string cannot run for the whole context
CONSTRAINED_MAX_TOKENS = 512
UNKNOWN_FIELDS = ("refuse", "ignore")


@dataclass(frozen=True)
class Room:
    """What an answer can hold, for the bounds of its schemas: `context` positions (the prompt's among
    them) of tokens of at most `token_bytes` bytes. A schema whose shortest document is longer than
    max_tokens (else the context) times `token_bytes` is refused before it is compiled further."""

    context: int
    token_bytes: int

    @classmethod
    def of(cls, context: int, token_bytes: list[bytes]) -> Room:
        return cls(context, max(map(len, token_bytes), default=1))

    def max_bytes(self, max_tokens: int | None) -> int:
        return max(2, min(max_tokens or self.context, self.context) * self.token_bytes)

    def why(self, max_tokens: int | None, defaulted: bool = False) -> str:
        if max_tokens is not None and max_tokens < self.context:
            which = "max_tokens" if not defaulted else "the default max_tokens of constrained output,"
            return f"{which} {max_tokens:,} of at most {self.token_bytes} bytes each"
        return f"the context's {self.context:,} tokens of at most {self.token_bytes} bytes each"


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
    call_grammar: Grammar | None = None  # tool_choice "auto": one call, once the model opens one
    budget: int | None = None  # the tokens generation may take (max_tokens, or what the context leaves)

    @property
    def constrained(self) -> bool:
        """Whether generation needs a token constraint (and so the prepared Vocabulary)."""
        return self.grammar is not None or self.tool_choice != "none"

    def constraint(self, vocabulary: Vocabulary) -> Budgeted | ToolCallTrigger | None:
        """A fresh constraint for one generation of this request (it keeps state): the document (or
        call) is closed within the budget of tokens whenever its shortest closing fits (closing.py);
        when even the shortest document does not fit, it is cut (finish_reason "length"), as OpenAI's
        structured outputs are. (A schema whose shortest document cannot fit whatever the tokens was
        refused by `check`.)"""
        budget = self.options.max_tokens if self.budget is None else self.budget
        if self.grammar is not None:
            return Budgeted(self.grammar, vocabulary, budget)
        if self.call_grammar is not None:
            return ToolCallTrigger(self.call_grammar, vocabulary, budget)
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
    call_grammar: Grammar | None = None


def prepare(
    body: object, kind: str, tokenizer: Tokenizer, context: int, model_name: str, unknown_fields: str = "refuse"
) -> Prepared:
    """Check an OpenAI request body (chat: /v1/chat/completions, text: /v1/completions) and tokenize its
    prompt; `context`: the positions a sequence may have; `unknown_fields`: see `check`."""
    checked = check(body, kind, unknown_fields, Room.of(context, tokenizer.token_bytes))
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
    budget = min(max_tokens, max(1, context - len(prompt_ids)))  # the context window may end first
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
        checked.call_grammar,
        budget,
    )


def check(body: object, kind: object, unknown_fields: str = "refuse", room: Room | None = None) -> Checked:
    """Every field of a request body but its prompt's tokens, checked. unknown_fields: "refuse" names
    OpenAI does not define (the library API: a misspelt keyword), or "ignore" them (the HTTP server).
    room: what the answer can hold (None: schemas are bounded by MAX_DOCUMENT_BYTES alone)."""
    if not isinstance(kind, str) or kind not in ENDPOINTS:
        raise InvalidArgumentError(f"kind must be chat or text, got {kind!r}")
    if unknown_fields not in UNKNOWN_FIELDS:
        raise InvalidArgumentError(f"unknown_fields must be refuse or ignore, got {unknown_fields!r}")
    if not isinstance(body, dict):
        raise InvalidArgumentError(f"the request body must be a JSON object, got {shown(body)}")
    check_values(body)  # nesting and numbers, everywhere (schemas and tool arguments too)
    _check_names(body, kind, unknown_fields == "refuse")
    _check_defaults(body)
    string(body.get("model"), "model")
    stream = boolean(body.get("stream"), "stream")
    options = obj(body.get("stream_options"), "stream_options") or {}  # other keys: OpenAI's later ones, ignored
    include_usage = boolean(options.get("include_usage"), "stream_options.include_usage")
    tools, tool_choice = [], "none"
    if kind == "chat":
        tools = _field(check_tools, "tools", body.get("tools"))
        tool_choice = _field(check_tool_choice, "tool_choice", body.get("tool_choice"), tools)
        source = {"messages": _messages(body.get("messages")), "tools": tools or None}
    else:
        source = {"prompt": _prompt(body.get("prompt"))}
    logprobs, top = _logprobs(body, kind)
    max_tokens = integer(body.get("max_tokens"), "max_tokens", None, low=1)
    max_tokens = integer(body.get("max_completion_tokens"), "max_completion_tokens", max_tokens, low=1)
    generation = {
        "stop": _stop(body.get("stop")),
        "ignore_eos": boolean(body.get("ignore_eos"), "ignore_eos"),
        "logprobs": top if logprobs else None,
        **_sampling(body),
    }
    GenerationOptions.from_kwargs(max_tokens=1 if max_tokens is None else max_tokens, **generation)  # refuse now
    # The grammars last (the costliest checks), compiled now: a schema we cannot follow is refused before
    # the answer starts, not in the middle of it.
    bound = _Bound(MAX_DOCUMENT_BYTES, "")
    if max_tokens is None and (_constrains(body.get("response_format")) or tool_choice not in ("none", "auto")):
        max_tokens = CONSTRAINED_MAX_TOKENS
        if room is not None:
            bound = _Bound(room.max_bytes(max_tokens), room.why(max_tokens, defaulted=True))
    elif room is not None:
        bound = _Bound(room.max_bytes(max_tokens), room.why(max_tokens))
    grammar, call_grammar = _response_grammar(body.get("response_format"), bound), None
    if tool_choice == "auto":
        call_grammar = _call_grammar(tools, tool_choice, "\n", f"\n{TOOL_CALL_CLOSE}", bound)
    elif tool_choice != "none":  # "required" or one named function: a call from the start
        if grammar is not None:
            raise FieldError("response_format cannot be combined with a required tool call", "response_format")
        grammar = _call_grammar(tools, tool_choice, f"{TOOL_CALL_OPEN}\n", f"\n{TOOL_CALL_CLOSE}", bound)
    return Checked(
        kind, source, generation, max_tokens, stream, include_usage, logprobs, grammar, tools, tool_choice, call_grammar
    )


def _field(checker, name: str, *args):
    """A check of text/tool_calls.py, its error tagged with the field for OpenAI's error object."""
    try:
        return checker(*args)
    except InvalidArgumentError as e:
        raise FieldError(str(e), name) from None


def _check_names(body: dict, kind: str, refuse_unknown: bool) -> None:
    """A field of the other endpoint is refused; one OpenAI does not define, refused or ignored."""
    own = CHAT_FIELDS if kind == "chat" else TEXT_FIELDS
    other = "text" if kind == "chat" else "chat"
    for name in body:
        if name in own or name in IGNORED or name in DEFAULT_ONLY:
            continue
        if name in CHAT_FIELDS | TEXT_FIELDS:
            raise FieldError(f"{name} is a field of {ENDPOINTS[other]}, not of {ENDPOINTS[kind]}", name)
        if refuse_unknown:
            raise FieldError(f"unsupported field {name!r}; supported: {', '.join(sorted(own))}", name)


def _check_defaults(body: dict) -> None:
    """Fields we cannot honour, with the value that changes nothing; those sent by default, type-checked."""
    if integer(body.get("n"), "n", 1, low=1) != 1:
        raise FieldError(f"n must be 1 (one choice per request), got {shown(body['n'])}", "n")
    if integer(body.get("best_of"), "best_of", 1, low=1) != 1:
        raise FieldError(f"unsupported field 'best_of': only 1 is accepted, got {shown(body['best_of'])}", "best_of")
    if boolean(body.get("echo"), "echo"):
        raise FieldError("unsupported field 'echo': only false is accepted, got true", "echo")
    if string(body.get("suffix"), "suffix"):
        raise FieldError(f"unsupported field 'suffix' (no fill-in-the-middle), got {shown(body['suffix'])}", "suffix")
    for name in ("frequency_penalty", "presence_penalty"):
        if number(body.get(name), name, 0.0, -2.0, 2.0) != 0:
            raise FieldError(
                f"{name} is not supported (use repetition_penalty): only 0 is accepted, got {shown(body[name])}", name
            )
    if obj(body.get("logit_bias"), "logit_bias"):
        found = json.dumps(body["logit_bias"])
        found = found if len(found) <= 40 else found[:37] + "..."
        raise FieldError(f"logit_bias is not supported: only {{}} is accepted, got {found}", "logit_bias")
    if body.get("audio") is not None:
        raise FieldError(f"unsupported field 'audio' (the answer is text), got {shown(body['audio'])}", "audio")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise FieldError(
            f'modalities must be ["text"] (the answer is text), got {json.dumps(modalities)}', "modalities"
        )
    for name in ("user", "service_tier"):
        string(body.get(name), name)
    for name in ("store", "parallel_tool_calls"):
        boolean(body.get(name), name)
    obj(body.get("metadata"), "metadata")


def _messages(messages: object) -> list[dict]:
    """The chat's messages as chat templates take them: content as one string (text parts joined with
    "\\n", as vLLM and llama.cpp's server do), optional fields that are null left out, and each tool
    call's arguments as an object (OpenAI clients send a JSON string; templates such as Qwen2.5's write
    `arguments | tojson`, which would quote it again). The caller's messages are not changed."""
    if not isinstance(messages, list) or not messages:
        raise FieldError(f"messages must be a non-empty list of message objects, got {shown(messages)}", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise FieldError(f"{where} must be an object with a role and a content, got {shown(message)}", where)
        role = string(message.get("role"), f"{where}.role")
        if role is None:
            raise FieldError(f"{where}.role is missing (a string: system, user, assistant, tool, ...)", where)
        checked = {key: value for key, value in message.items() if value is not None}
        calls = _tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
        if calls:
            checked["tool_calls"] = calls
        else:
            checked.pop("tool_calls", None)
        content = message.get("content")
        if content is None and not calls:
            raise FieldError(f"{where}.content is missing (null only for an assistant message with tool_calls)", where)
        checked["content"] = None if content is None else _content(content, f"{where}.content")
        for name in ("name", "tool_call_id"):
            string(message.get(name), f"{where}.{name}")
        out.append(checked)
    return out


def _content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise FieldError(f"{where} must be a string or a non-empty list of text parts, got {shown(content)}", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            found = f"a part of type {kind!r}" if isinstance(kind, str) else shown(part)
            raise FieldError(f'{where}[{j}] must be a text part {{"type": "text", "text": ...}}, got {found}', where)
        text = part.get("text")
        if not isinstance(text, str):
            raise FieldError(f"{where}[{j}].text must be a string, got {shown(text)}", where)
        texts.append(text)
    return "\n".join(texts)


def _tool_calls(calls: object, where: str) -> list[dict]:
    """An assistant message's tool calls: [{"id", "type": "function", "function": {"name", "arguments"}}]."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise FieldError(f"{where} must be a list of tool calls, got {shown(calls)}", where)
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise FieldError(f'{where}[{j}] must be {{"type": "function", "function": {{"name", "arguments"}}}}', where)
        string(call.get("id"), f"{where}[{j}].id")
        arguments = function.get("arguments")
        if isinstance(arguments, str):  # as OpenAI clients send them
            arguments = parse(arguments, f"{where}[{j}].function.arguments")
            check_values(arguments, f"{where}[{j}].function.arguments")
        if not isinstance(arguments, dict):
            raise FieldError(
                f"{where}[{j}].function.arguments must be a JSON object (or its text), got {shown(arguments)}", where
            )
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


def _prompt(prompt: object) -> str | list[int]:
    """One prompt: text, or token ids; clients send either in a list of one."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise FieldError(f"prompt holds {len(prompt)} prompts; one per request is accepted", "prompt")
    if not isinstance(prompt, list) or not prompt:
        raise FieldError(f"prompt must be a string or a non-empty list of token ids, got {shown(prompt)}", "prompt")
    for i, token in enumerate(prompt):
        integer(token, f"prompt[{i}]", None, low=0)  # the vocabulary's size is checked once the ids are used
    return prompt


def _stop(stop: object) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list):
        raise FieldError(f"stop must be a string or a list of strings, got {shown(stop)}", "stop")
    for i, text in enumerate(stops):
        if not isinstance(text, str) or not text:
            where = "stop" if isinstance(stop, str) else f"stop[{i}]"
            raise FieldError(f"{where} must be a non-empty string, got {shown(text)}", where)
    return stops


def _sampling(body: dict) -> dict:
    """OpenAI's defaults (temperature 1, top_p 1, no top-k/min-p) where the body says nothing."""
    return {
        "temperature": number(body.get("temperature"), "temperature", 1.0, low=0),
        "top_p": number(body.get("top_p"), "top_p", 1.0, 0, 1, open_low=True),
        "top_k": integer(body.get("top_k"), "top_k", 0, low=0),
        "min_p": number(body.get("min_p"), "min_p", 0.0, 0, 1),
        "repetition_penalty": number(body.get("repetition_penalty"), "repetition_penalty", 1.0, low=0, open_low=True),
        "seed": integer(body.get("seed"), "seed", None, low=0),
    }


def _logprobs(body: dict, kind: str) -> tuple[bool, int]:
    if kind == "chat":
        wanted = boolean(body.get("logprobs"), "logprobs")
        top = integer(body.get("top_logprobs"), "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
        if top is None:
            return wanted, 0
        if not wanted:
            raise FieldError("top_logprobs needs logprobs: true", "top_logprobs")
        return True, top
    value = integer(body.get("logprobs"), "logprobs", None, 0, MAX_TEXT_LOGPROBS)  # the number of alternatives
    return value is not None, value or 0


@dataclass(frozen=True)
class _Bound:
    """The longest document a request's grammars are compiled for, and why (for the messages)."""

    max_bytes: int
    why: str

    def explain(self, error: InvalidArgumentError) -> str:
        if isinstance(error, DocumentTooLongError) and self.why:
            return f"{error} ({self.why})"
        return str(error)


def _constrains(response_format: object) -> bool:
    return isinstance(response_format, dict) and response_format.get("type") in ("json_object", "json_schema")


def _response_grammar(response_format: object, bound: _Bound) -> Grammar | None:
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise FieldError(
            'response_format must be {"type": "text" | "json_object" | "json_schema", ...}, '
            f"got {shown(response_format)}",
            "response_format",
        )
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(None)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), (dict, bool)):
            raise FieldError('response_format json_schema must be {"name": ..., "schema": {...}}', "response_format")
        string(spec.get("name"), "response_format.json_schema.name")
        boolean(spec.get("strict"), "response_format.json_schema.strict")
        try:
            return json_grammar(spec["schema"], extra_properties="explicit", max_bytes=bound.max_bytes)
        except InvalidArgumentError as e:
            raise FieldError(f"response_format.json_schema.schema: {bound.explain(e)}", "response_format") from None
    raise FieldError(
        f"response_format type must be text, json_object or json_schema, got {shown(kind)}", "response_format"
    )


def _call_grammar(tools: list[dict], tool_choice: str | dict, prefix: str, suffix: str, bound: _Bound) -> Grammar:
    """The grammar of one call (see tool_call_schema) between `prefix` and `suffix`. A tool whose
    parameters we cannot follow is named: its parameters are compiled alone (errors say where in them),
    then its call (a `$ref` into the parameters' own `$defs` points to nothing from there)."""
    for i, tool in enumerate(tools):
        function = tool["function"]
        for schema in (function["parameters"], tool_call_schema([tool], "required")):
            try:
                json_grammar(schema, max_bytes=bound.max_bytes)
            except InvalidArgumentError as e:
                where = f"tools[{i}].function.parameters"
                message = f"{where} ({function['name']}) cannot constrain a call: {bound.explain(e)}"
                raise FieldError(message, where) from None
    try:  # only the declared arguments: a call is written to be run, in few tokens
        schema = tool_call_schema(tools, tool_choice)
        return json_grammar(schema, prefix, suffix, extra_properties=False, max_bytes=bound.max_bytes)
    except InvalidArgumentError as e:
        raise FieldError(f"tools: a call cannot be constrained: {bound.explain(e)}", "tools") from None


class ToolCallTrigger:
    """tool_choice "auto": the model writes freely until it opens a call (`<tool_call>`); from there the
    call must be one of the tools with arguments that fit its parameters, up to `</tool_call>`; then it
    is free again (for text, or another call). `grammar`: the call's, from "\n" to "\n</tool_call>"
    (Prepared.call_grammar). `budget`: the tokens generation may take (default: no bound); a call is
    closed within it, and none is opened (no `<` is written) when the tokens left cannot hold the opening
    tag and the shortest call."""

    def __init__(self, grammar: Grammar, vocabulary: Vocabulary, budget: int = 1 << 30) -> None:
        self.grammar = grammar
        self.vocabulary = vocabulary
        self.free = np.ones(vocabulary.size, dtype=bool)
        self.tail = b""  # the last bytes written, to see the opening tag
        self.call: Budgeted | None = None
        self.left = budget
        self.shortest_call: int | None = None  # tokens: the opening tag, the shortest call, EOS

    def allowed(self) -> np.ndarray:
        if self.call is not None and self.call.complete:  # the call is closed: free text again
            self.call = None
        if self.call is not None:
            return self.call.allowed()
        if self.shortest_call is None:
            call = Budgeted(self.grammar, self.vocabulary, self.left)
            self.shortest_call = closing_tokens(self.vocabulary, TOOL_CALL_OPEN.encode())[0] + call.reserve(call.state)
            self.no_tag = np.zeros(self.vocabulary.size, bool)  # (V,) tokens without "<"
            self.no_tag[: len(self.vocabulary.token_bytes)] = [b"<" not in t for t in self.vocabulary.token_bytes]
        if self.left - 1 < self.shortest_call and not self.tail:
            return self.free & self.no_tag
        return self.free

    def advance(self, token_id: int) -> None:
        self.left -= 1
        if self.call is not None and not self.call.complete:
            self.call.advance(token_id)
            return
        self.call = None
        self.tail = (self.tail + self.vocabulary.token_bytes[token_id])[-len(TOOL_CALL_OPEN) :]
        if self.tail.endswith(TOOL_CALL_OPEN.encode()):
            self.call, self.tail = Budgeted(self.grammar, self.vocabulary, self.left), b""
        elif not any(self.tail.endswith(TOOL_CALL_OPEN[:k].encode()) for k in range(1, len(TOOL_CALL_OPEN))):
            self.tail = b""  # no part of the tag is open

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

    @property
    def completion_tokens(self) -> int:
        """Tokens generated so far (a chunk each)."""
        return len(self.text)

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
