"""Text: the model's own `tokenizer.json` run by Hugging Face `tokenizers` (or, where that package is not
installed, as in Pyodide, by the same steps in plain Python: `pure_tokenizer.py`), its chat template, and
the streaming detokenizer.

In the npm package's worker the same files are read by HF's JavaScript libraries instead; the engine
itself only ever sees token ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError, LoadError
from ..files import jsonfields as fields
from .chat_template import ChatTemplate
from .detokenizer import StreamingDetokenizer, special_token_ids, token_byte_table
from .pure_tokenizer import PureTokenizer, decode


class Tokenizer:
    def __init__(
        self,
        tokenizer_json: str | dict,
        tokenizer_config: object,
        source: str = "tokenizer.json",
        config_source: str = "tokenizer_config.json",
    ) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer

            from_str: Callable[[str], Any] | None = HFTokenizer.from_str
        except ImportError:
            from_str = None  # the same ids in plain Python
        data = fields.obj(
            fields.parse_json(tokenizer_json, source) if isinstance(tokenizer_json, str) else tokenizer_json, source
        )
        try:
            model = data.get("model") if isinstance(data, dict) else None
            if isinstance(model, dict) and model.get("merges_by_position"):
                from_str = None  # a GGUF document without its merges list: only the plain-Python BPE reads it
            text = tokenizer_json if isinstance(tokenizer_json, str) else None
            self._tokenizer: Any = None if from_str is None else from_str(text or json.dumps(data))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise LoadError(f"{source}: cannot be read ({e})") from None
        self._pure = PureTokenizer(data, source) if self._tokenizer is None else None
        self.config = fields.obj(tokenizer_config, config_source)
        self.token_bytes, self._strip_space = token_byte_table(data)
        self.special_ids = special_token_ids(data)  # control tokens, never text (constrained output)
        self.special_tokens = {
            name: _token_text(self.config, name, config_source)
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        template = _chat_template(self.config, config_source)
        self.chat_template = ChatTemplate(template, self.special_tokens, config_source) if template else None

    def set_chat_template(self, source: str, where: str = "chat_template") -> None:
        """Use this Jinja chat template instead of the model's own (or for a model without one)."""
        if not isinstance(source, str) or not source.strip():
            raise InvalidArgumentError(f"{where}: a chat template must be a non-empty string")
        self.chat_template = ChatTemplate(source, self.special_tokens, where)

    @classmethod
    def from_folder(cls, folder: str) -> Tokenizer:
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.exists(path):
            raise LoadError(f"{folder}: no tokenizer.json")
        config_path = os.path.join(folder, "tokenizer_config.json")
        config = fields.read_json(config_path) if os.path.exists(config_path) else {}
        with open(path, "rb") as f:
            return cls(fields.utf8_text(f.read(), path), config, path, config_path)

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def token_id(self, text: str | None) -> int | None:
        if text is None:
            return None
        return self._pure.token_to_id(text) if self._pure else self._tokenizer.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of raw text, with the model's default handling (BOS if the tokenizer adds one;
        special tokens written in the text are recognised)."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"prompt must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate, e.g. an undecodable byte of a command line
            raise InvalidArgumentError(
                f"the text is not valid Unicode: character {e.start} is {text[e.start]!r} "
                "(a byte that is not UTF-8, or a lone surrogate)"
            ) from None
        if self._pure:
            return self._pure.encode(text, add_special_tokens)
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        if self._pure:
            return decode(self.token_bytes, self._strip_space, ids)
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """The prompt for `messages`; `tools` (OpenAI tool objects) go to the template as transformers passes them."""
        if self.chat_template is None:
            raise InvalidArgumentError(
                "this model has no chat template (its tokenizer_config.json or GGUF metadata has none): "
                "give one with --chat-template FILE (CLI) or chat_template= (ruvllm.load)"
            )
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> list[int]:
        # The template writes any BOS itself; adding special tokens again would double it.
        prompt = self.apply_chat_template(messages, add_generation_prompt, tools)
        return self.encode(prompt, add_special_tokens=False)

    def detokenizer(self) -> StreamingDetokenizer:
        return StreamingDetokenizer(self.token_bytes, self._strip_space)


def tokenizers_installed() -> bool:
    """Whether Hugging Face `tokenizers` can be imported (Tokenizer then runs it; not in Pyodide)."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def _token_text(config: dict, name: str, source: str) -> str | None:
    """A special token's text: a string, {"content": "<s>", "__type": "AddedToken", ...}, or absent."""
    value = config.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise fields.fail(source, name, 'a string or {"content": string}', config[name])
    return value


def _chat_template(config: dict, source: str) -> str | None:
    """The template source: a string, or the one named "default" in a list of {"name", "template"}."""
    value = config.get("chat_template")
    if isinstance(value, list):  # several named templates: use the default one
        named = [t for t in value if isinstance(t, dict) and isinstance(t.get("template"), str)]
        if len(named) != len(value):
            raise fields.fail(source, "chat_template", 'a string or a list of {"name", "template"} objects', value)
        value = next((t["template"] for t in named if t.get("name") == "default"), None)
    if value is not None and not isinstance(value, str):
        raise fields.fail(source, "chat_template", "a string", value)
    return value
