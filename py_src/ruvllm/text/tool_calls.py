"""OpenAI tool calls: checking `tools` and `tool_choice`, the schema of one call, and parsing calls out of text.

Supported convention: Hermes-style calls, as written by Qwen2.5 and Qwen3, Hermes 2 Pro and SmolLM3. Their
chat templates list the tools (OpenAI objects, as JSON) in the system turn and ask for each call as

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

one block per call, possibly several in a reply. The template itself is the model's own: it receives the
variable `tools` exactly as transformers' `apply_chat_template(messages, tools=...)` passes it (the list of
`{"type": "function", "function": {name, description, parameters}}` objects, None when there are none), and
prior calls as the assistant message's `tool_calls`. Templates of other conventions (Llama 3's bare JSON,
Mistral's [TOOL_CALLS]) render the same way, but their output is not parsed here.
"""

from __future__ import annotations

import json
import re
import secrets

from ..errors import InvalidArgumentError
from ..files.json_body import PARSE_DEPTH, nesting_depth

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
# One call: the text between the tags, or to the end when the reply stopped before the close tag.
_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.DOTALL)
_NO_PARAMETERS = {"type": "object", "properties": {}}
_CHOICES = ("none", "auto", "required")


def check_tools(tools: object) -> list[dict]:
    """The OpenAI `tools` list, checked and normalized: each `{"type": "function", "function": {"name",
    "description" (if given), "parameters", "strict" (if given)}}`, parameters defaulting to an object without
    properties. None means no tools. Other keys are dropped."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidArgumentError(f"tools must be a list of tool objects, got {type(tools).__name__}")
    checked: list[dict] = []
    seen: dict[str, int] = {}  # tool name -> its index
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidArgumentError(f"{where} must be an object, got {type(tool).__name__}")
        if tool.get("type") != "function":
            raise InvalidArgumentError(f'{where}.type must be "function", got {tool.get("type")!r}')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidArgumentError(f"{where}.function must be an object, got {type(function).__name__}")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidArgumentError(
                f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}"
            )
        if name in seen:
            raise InvalidArgumentError(f"{where}.function.name {name!r} is already the name of tools[{seen[name]}]")
        seen[name] = i
        out: dict[str, object] = {"name": name}
        description = function.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise InvalidArgumentError(
                    f"{where}.function.description must be a string, got {type(description).__name__}"
                )
            out["description"] = description
        out["parameters"] = _check_parameters(function.get("parameters"), f"{where}.function.parameters")
        if function.get("strict") is not None:
            if not isinstance(function["strict"], bool):
                raise InvalidArgumentError(f"{where}.function.strict must be true or false, got {function['strict']!r}")
            out["strict"] = function["strict"]
        checked.append({"type": "function", "function": out})
    return checked


def _check_parameters(parameters: object, where: str) -> dict:
    """A JSON Schema of the arguments object: an object schema, or absent (no arguments)."""
    if parameters is None:
        return dict(_NO_PARAMETERS)
    if not isinstance(parameters, dict):
        raise InvalidArgumentError(f"{where} must be a JSON Schema object, got {type(parameters).__name__}")
    if parameters.get("type", "object") != "object":
        raise InvalidArgumentError(
            f'{where}.type must be "object" (arguments are an object), got {parameters["type"]!r}'
        )
    if not isinstance(parameters.get("properties", {}), dict):
        raise InvalidArgumentError(f"{where}.properties must be an object, got {parameters['properties']!r}")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InvalidArgumentError(f"{where}.required must be a list of property names, got {required!r}")
    return parameters


def check_tool_choice(tool_choice: object, tools: list[dict]) -> str | dict:
    """`tool_choice` normalized: "none", "auto", "required" or {"type": "function", "function": {"name"}}.

    `tools` is the list `check_tools` returned. As in OpenAI's API, no choice means "auto" with tools and "none"
    without; "auto" without tools is "none"; "required" and a named function need tools.
    """
    names = [t["function"]["name"] for t in tools]
    if tool_choice is None:
        return "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in _CHOICES:
            raise InvalidArgumentError(
                f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": {{"name"}}}}, '
                f"got {tool_choice!r}"
            )
        if tool_choice == "required" and not tools:
            raise InvalidArgumentError('tool_choice "required" needs tools, and tools is empty')
        return "none" if tool_choice == "auto" and not tools else tool_choice
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not isinstance(function, dict):
        raise InvalidArgumentError(
            f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": {{"name"}}}}, '
            f"got {tool_choice!r}"
        )
    name = function.get("name")
    if name not in names:
        raise InvalidArgumentError(f"tool_choice.function.name {name!r} is not one of the tools: {names}")
    return {"type": "function", "function": {"name": name}}


def tool_call_schema(tools: list[dict], tool_choice: str | dict) -> dict:
    """The JSON Schema of one call, `{"name": ..., "arguments": {...}}` in that order: for a named choice
    that tool's call, else any of the tools' calls (anyOf; the call itself when there is one tool).

    `tools` and `tool_choice` are what `check_tools` and `check_tool_choice` returned. The text of a call is
    this JSON between TOOL_CALL_OPEN + "\\n" and "\\n" + TOOL_CALL_CLOSE.
    """
    if tool_choice == "none" or not tools:
        raise InvalidArgumentError('there is no tool call to constrain: tool_choice is "none" or there are no tools')
    if isinstance(tool_choice, dict):
        tools = [t for t in tools if t["function"]["name"] == tool_choice["function"]["name"]]
    calls = [_call_schema(t["function"]) for t in tools]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def _call_schema(function: dict) -> dict:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "const": function["name"]},
            "arguments": function.get("parameters", _NO_PARAMETERS),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """Split a reply into its content and its OpenAI `tool_calls`.

    Every `<tool_call>{json}</tool_call>` block (the last may lack its close tag) whose JSON is an object
    with a string "name" and an object "arguments" (or "parameters", as some models write; absent means no
    arguments) becomes `{"id": "call_<24 hex>", "type": "function", "function": {"name", "arguments"}}`,
    arguments as a JSON string. A block that is not such JSON stays in the content as it was written.
    Text without calls is returned unchanged; otherwise the content is the rest, stripped, or None if empty.
    """
    calls, kept, start = [], [], 0
    for match in _CALL.finditer(text):
        call = _parse_call(match.group(1))
        if call is None:
            continue
        kept.append(text[start : match.start()])
        start = match.end()
        calls.append(call)
    if not calls:
        return text, []
    kept.append(text[start:])
    content = "".join(kept).strip()
    return content or None, calls


def _parse_call(body: str) -> dict | None:
    if nesting_depth(body.encode("utf-8", "surrogatepass")) > PARSE_DEPTH:  # json.loads would recurse too deep
        return None
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI returns them
        if nesting_depth(arguments.encode("utf-8", "surrogatepass")) > PARSE_DEPTH:
            return None
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {
        "id": "call_" + secrets.token_hex(12),
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates expect them: each tool call's arguments as an object, not a string.

    OpenAI clients send `arguments` as a JSON string; templates such as Qwen2.5's write `arguments | tojson`,
    which would quote that string again. Like vLLM, decode it before rendering. The caller's messages are
    not changed.
    """
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list):
            out.append(message)
            continue
        decoded = []
        for j, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(function, dict) and isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError as e:
                    raise InvalidArgumentError(
                        f"message {i}: tool_calls[{j}].function.arguments is not valid JSON ({e})"
                    ) from None
                call = {**call, "function": {**function, "arguments": arguments}}
            decoded.append(call)
        out.append({**message, "tool_calls": decoded})
    return out


_TOOL_ROLE = re.compile(r"""(['"])tool\1""")  # a template that names the role 'tool' writes results itself


def reads_tools(template: str) -> tuple[bool, bool]:
    """(calls, results): whether a chat template writes an assistant message's `tool_calls`, and role "tool"
    messages, itself (Qwen2.5's does both; SmolLM2's and Gemma 3's do neither)."""
    return "tool_calls" in template, _TOOL_ROLE.search(template) is not None


def messages_for(messages: list[dict], calls: bool, results: bool) -> list[dict]:
    """OpenAI messages as a template that does not write tool calls (`calls` False) or their results
    (`results` False) itself can take them, in the Hermes convention the calls are parsed in (as Qwen2.5's
    template writes them): each call becomes its <tool_call> block in the assistant's text; results
    become a user turn of <tool_response> blocks, consecutive ones and the user text that follows them in
    one turn (templates such as Gemma's want user and assistant to alternate). Without this, a call's
    `content: null` failed in SmolLM2's template and a "tool" message was refused by Gemma's. A content
    of null becomes "" for such templates. The caller's messages are not changed."""
    out: list[dict] = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if not calls and message.get("tool_calls"):
            blocks = [_call_block(call) for call in message["tool_calls"]]
            text = "\n".join([content, *blocks] if content else blocks)
            message = {k: v for k, v in message.items() if k != "tool_calls"} | {"content": text}
        elif not results and role == "tool":
            block = f"<tool_response>\n{content or ''}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_results"):
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{block}"}
            else:
                out.append({"role": "user", "content": block, "_results": True})
            continue
        elif (not results) and role == "user" and out and out[-1].get("_results"):
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{content}", "_results": False}
            continue
        if message.get("content") is None and not calls:
            message = {**message, "content": ""}
        out.append(message)
    return [{k: v for k, v in m.items() if k != "_results"} for m in out]


def _call_block(call: dict) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass  # written as it came (check_messages let it through as a string)
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"
