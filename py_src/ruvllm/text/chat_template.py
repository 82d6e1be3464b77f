"""Chat templates: the model's own Jinja template, rendered in a sandbox with bounds.

The environment matches what Hugging Face transformers gives templates (`trim_blocks`, `lstrip_blocks`,
the `loopcontrols` extension, `tojson` without ASCII escaping, `raise_exception`, `strftime_now`), so a
rendered prompt is the same string `apply_chat_template` produces.

A template comes with a model, possibly from anywhere, so it is treated as untrusted code. The sandbox
blocks escapes; the bounds below stop the rest: compiling and rendering may take at most
`MAX_SECONDS` (checked on every line the template's code runs, so loops of any kind end), and no
string, list or output may exceed `MAX_CHARS` (checked where values grow: operators, calls, filters,
namespace assignments, and the output as it is produced). A template that breaks a bound, or fails in
any way other than rejecting the messages it was given, is a load error naming the template.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from ..errors import InvalidArgumentError, LoadError, install_advice
from .tool_calls import messages_for, reads_tools

MAX_SECONDS = 2.0  # real templates take a few milliseconds
MAX_CHARS = 1 << 22  # 4 Mi characters: far beyond any context window's worth of text
_LONG_NUMBER = re.compile(r"\d{8,}")  # a width/precision in a format string that would make a huge string


class TemplateBoundError(Exception):
    """A template went past MAX_SECONDS or MAX_CHARS."""


class _Bounds(threading.local):
    deadline = float("inf")

    def check_time(self) -> None:
        if time.perf_counter() > self.deadline:
            raise TemplateBoundError(f"took longer than {MAX_SECONDS:g} s")


def _check_size(value: object) -> object:
    if isinstance(value, (str, list, tuple, dict)) and len(value) > MAX_CHARS:
        raise TemplateBoundError(f"built a value of {len(value):,} items (the limit is {MAX_CHARS:,})")
    return value


def _check_arguments(args: tuple, kwargs: dict) -> None:
    """Refuse numbers that could only ask for a huge result (a width, a repeat count) and huge values."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and abs(value) > MAX_CHARS:
            raise TemplateBoundError(f"passed the number {value} (the limit is {MAX_CHARS:,})")
        _check_size(value)


def _make_environment(bounds: _Bounds):
    import jinja2
    from jinja2.runtime import Namespace
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedNamespace(Namespace):
        def __setitem__(self, name: str, value: object) -> None:  # `{% set ns.x = ... %}` accumulates here
            super().__setitem__(name, _check_size(value))

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context, operator: str, left: object, right: object) -> object:
            bounds.check_time()
            if operator == "*" and isinstance(left, int) and not isinstance(right, int):
                left, right = right, left  # n * "x" is "x" * n
            if operator == "*" and isinstance(right, int) and isinstance(left, (str, list, tuple)):
                if len(left) * right > MAX_CHARS:
                    raise TemplateBoundError(f"repeated a value of {len(left)} items {right} times")
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
                if right * max(1, abs(left).bit_length()) > 1 << 16:
                    raise TemplateBoundError(f"computed {left} ** {right}")
            if operator == "%" and isinstance(left, str) and _LONG_NUMBER.search(left):
                raise TemplateBoundError("formatted with a huge width or precision")
            return _check_size(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
            bounds.check_time()
            _check_arguments(args, kwargs)
            method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            receiver = getattr(method, "__self__", None)
            if isinstance(receiver, str) and getattr(method, "__name__", "") in ("format", "format_map"):
                if _LONG_NUMBER.search(receiver):
                    raise TemplateBoundError("formatted with a huge width or precision")
            return _check_size(super().call(__context, __obj, *args, **kwargs))

        def getattr(self, obj, attribute):
            bounds.check_time()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            bounds.check_time()
            return super().getitem(obj, argument)

    def bounded_filter(function):
        @functools.wraps(function)  # keeps jinja's marker of filters that take the context or environment
        def run(*args, **kwargs):
            bounds.check_time()
            _check_arguments(args, kwargs)
            return _check_size(function(*args, **kwargs))

        return run

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.filters = {name: bounded_filter(f) for name, f in env.filters.items()}
    env.globals["namespace"] = BoundedNamespace
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@contextmanager
def _bounded(bounds: _Bounds) -> Iterator[None]:
    """Run template code with a deadline: every line of the template's compiled code checks it."""
    count = 0

    def on_line(frame, event, arg):
        nonlocal count
        count += 1
        if count % 256 == 0:
            bounds.check_time()
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    bounds.deadline = time.perf_counter() + MAX_SECONDS
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)
        bounds.deadline = float("inf")


class ChatTemplate:
    def __init__(
        self, source: str, special_tokens: dict[str, str | None], where: str = "tokenizer_config.json"
    ) -> None:
        try:
            import jinja2
        except ImportError:
            raise LoadError(f"chat templates need jinja2: {install_advice(repr('ruvllm[text]'), 'jinja2')}") from None
        self.where = f"the chat_template in {where}"
        self._bounds = _Bounds()
        self._errors = jinja2.exceptions.TemplateError
        self._security = jinja2.exceptions.SecurityError
        env = _make_environment(self._bounds)
        try:
            with _bounded(self._bounds):
                self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise LoadError(f"{self.where} does not parse: {e}") from None
        except Exception as e:  # folding constants runs template code at compile time
            raise LoadError(f"{self.where} fails: {_describe(e)}") from None
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self.reads_tools = reads_tools(source)  # (calls, results) it writes itself; the rest are rewritten

    def render(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None, **extra: object
    ) -> str:
        """The prompt for `messages`. `tools` (OpenAI tool objects) reach the template as the variable `tools`,
        None when there are none, as transformers' apply_chat_template passes them."""
        check_messages(messages)
        _check_tools(tools)
        messages = messages_for(messages, *self.reads_tools)
        variables: dict[str, object] = dict(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)
        variables.update(self.special_tokens, **extra)
        parts, size = [], 0
        try:
            with _bounded(self._bounds):
                for part in self._template.generate(**variables):
                    size += len(part)
                    if size > MAX_CHARS:
                        raise TemplateBoundError(f"rendered more than {MAX_CHARS:,} characters")
                    parts.append(part)
        except self._security as e:
            raise LoadError(f"{self.where} tried an unsafe operation: {e}") from None
        except self._errors as e:  # raise_exception(...) or an undefined value: these messages are refused
            raise InvalidArgumentError(f"the chat template rejected these messages: {e}") from None
        except Exception as e:  # a bound, RecursionError, OverflowError, MemoryError, ...
            raise LoadError(f"{self.where} fails: {_describe(e)}") from None
        return "".join(parts)


def _describe(error: BaseException) -> str:
    if isinstance(error, TemplateBoundError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def check_messages(messages: object) -> None:
    """Each message has a string role and a string content, except an assistant message that makes tool calls,
    whose content may be None (OpenAI sends `"content": null` there)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {'role', 'content'} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidArgumentError(f"message {i} must have a string 'role' and a string 'content'")
        calls = m.get("tool_calls")
        if calls is not None:
            _check_tool_calls(i, calls)
        if not isinstance(m.get("content"), str) and not (calls and m.get("content") is None):
            raise InvalidArgumentError(f"message {i} must have a string 'role' and a string 'content'")
        if "tool_call_id" in m and not isinstance(m["tool_call_id"], str):
            raise InvalidArgumentError(f"message {i}: 'tool_call_id' must be a string")


def _check_tool_calls(i: int, calls: object) -> None:
    """OpenAI's form: [{"id", "type": "function", "function": {"name", "arguments"}}, ...]; arguments are a
    JSON string from OpenAI clients, or an object as transformers' own examples give them."""
    if not isinstance(calls, list):
        raise InvalidArgumentError(f"message {i}: 'tool_calls' must be a list, got {type(calls).__name__}")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidArgumentError(
                f"message {i}: tool_calls[{j}] must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}"
            )
        if not isinstance(function.get("arguments"), (str, dict)):
            raise InvalidArgumentError(
                f"message {i}: tool_calls[{j}].function.arguments must be a JSON string or an object"
            )


def _check_tools(tools: object) -> None:
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidArgumentError("tools must be a list of {'type': 'function', 'function': {...}} objects")
