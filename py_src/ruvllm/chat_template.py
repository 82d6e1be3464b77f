"""Chat templates: the model's own Jinja template, rendered in a sandbox.

The environment matches what Hugging Face transformers gives templates (`trim_blocks`, `lstrip_blocks`,
the `loopcontrols` extension, `tojson` without ASCII escaping, `raise_exception`, `strftime_now`), so a
rendered prompt is the same string `apply_chat_template` produces.
"""

from __future__ import annotations

import json
from datetime import datetime

from .errors import InvalidArgumentError, LoadError


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str | None]) -> None:
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise LoadError("chat templates need jinja2: pip install 'ruvllm[text]'") from None

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(
                value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
            )

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise LoadError(f"chat_template in tokenizer_config.json does not parse: {e}") from None
        self._errors = jinja2.exceptions.TemplateError
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra: object) -> str:
        _check_messages(messages)
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens, **extra
            )
        except self._errors as e:
            raise InvalidArgumentError(f"the chat template rejected these messages: {e}") from None


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {'role', 'content'} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidArgumentError(f"message {i} must have a string 'role' and a string 'content'")
