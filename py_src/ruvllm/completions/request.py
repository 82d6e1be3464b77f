"""An OpenAI request body checked (`check`), its prompt tokenized (`prepare` on CPython; the browser
worker tokenizes in JavaScript), and the `Prepared` request that `finish` makes of both. See the
package's docstring for what is honoured, refused and ignored."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from ..errors import InvalidArgumentError
from ..files.json_body import FieldError, boolean, check_values, integer, number, obj, parse, shown, string
from ..runtime.constrain import MAX_DOCUMENT_BYTES, Budgeted, Grammar, Triggered, Vocabulary
from ..runtime.generate import MAX_TOP_LOGPROBS, GenerationOptions
from ..text.tokenizer import Tokenizer
from ..text.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, check_tool_choice, check_tools
from .grammars import Bound, Room, constrains, response_grammar, tool_call_grammar

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


@dataclass
class Checked:
    """A request body checked, its prompt not yet tokenized (the browser worker tokenizes in JavaScript)."""

    kind: str  # "chat" or "text"
    source: dict  # chat: {"messages", "tools"} as the chat template takes them; text: {"prompt": str | ids}
    generation: dict  # GenerationOptions fields but max_tokens
    max_tokens: int | None  # None: until the end of the context window
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    grammar: Grammar | None = None  # output constrained from the first token
    tools: list[dict] = field(default_factory=list)
    tool_choice: str | dict = "none"
    call_grammar: Grammar | None = None  # tool_choice "auto": one call, once the model opens one

    @property
    def constrained(self) -> bool:
        """Whether generation needs a token constraint (and so the prepared Vocabulary)."""
        return self.grammar is not None or self.tool_choice != "none"


@dataclass(kw_only=True)
class Prepared(Checked):
    """A checked request with its prompt tokenized (`finish`): what to generate and how to answer."""

    model: str
    prompt_ids: list[int]
    options: GenerationOptions
    budget: int  # the tokens generation may take (max_tokens, or what the context leaves)

    def constraint(self, vocabulary: Vocabulary) -> Budgeted | Triggered | None:
        """A fresh constraint for one generation of this request (it keeps state): the document (or
        call) is closed within the budget of tokens whenever its shortest closing fits (closing.py);
        when even the shortest document does not fit, it is cut (finish_reason "length"), as OpenAI's
        structured outputs are. (A schema whose shortest document cannot fit whatever the tokens was
        refused by `check`.)"""
        if self.grammar is not None:
            return Budgeted(self.grammar, vocabulary, self.budget)
        if self.call_grammar is not None:
            return Triggered(self.call_grammar, vocabulary, TOOL_CALL_OPEN, self.budget)
        return None


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
    request = {f.name: getattr(checked, f.name) for f in fields(Checked)}
    return Prepared(**request, model=model_name, prompt_ids=list(prompt_ids), options=options, budget=budget)


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
    bound = Bound(MAX_DOCUMENT_BYTES, "")
    if max_tokens is None and (constrains(body.get("response_format")) or tool_choice not in ("none", "auto")):
        max_tokens = CONSTRAINED_MAX_TOKENS
        if room is not None:
            bound = room.bound(max_tokens, defaulted=True)
    elif room is not None:
        bound = room.bound(max_tokens)
    grammar, call_grammar = response_grammar(body.get("response_format"), bound), None
    if tool_choice == "auto":
        call_grammar = tool_call_grammar(tools, tool_choice, "\n", f"\n{TOOL_CALL_CLOSE}", bound)
    elif tool_choice != "none":  # "required" or one named function: a call from the start
        if grammar is not None:
            raise FieldError("response_format cannot be combined with a required tool call", "response_format")
        grammar = tool_call_grammar(tools, tool_choice, f"{TOOL_CALL_OPEN}\n", f"\n{TOOL_CALL_CLOSE}", bound)
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
