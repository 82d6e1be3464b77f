"""The grammars of a request's output: its response_format's document and its tool calls, compiled when
the request is checked (so a schema we cannot follow is refused before any answer starts), for the
longest document the answer can hold (`Room`, `Bound`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..files.json_body import FieldError, boolean, shown, string
from ..runtime.constrain import DocumentTooLongError, Grammar, json_grammar
from ..text.tool_calls import tool_call_schema


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

    def bound(self, max_tokens: int | None, defaulted: bool = False) -> Bound:
        """The Bound of a request's grammars: `max_tokens` (None: the context), defaulted or asked."""
        return Bound(self.max_bytes(max_tokens), self.why(max_tokens, defaulted))


@dataclass(frozen=True)
class Bound:
    """The longest document a request's grammars are compiled for, and why (for the messages)."""

    max_bytes: int
    why: str

    def explain(self, error: InvalidArgumentError) -> str:
        if isinstance(error, DocumentTooLongError) and self.why:
            return f"{error} ({self.why})"
        return str(error)


def constrains(response_format: object) -> bool:
    return isinstance(response_format, dict) and response_format.get("type") in ("json_object", "json_schema")


def response_grammar(response_format: object, bound: Bound) -> Grammar | None:
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


def tool_call_grammar(tools: list[dict], tool_choice: str | dict, prefix: str, suffix: str, bound: Bound) -> Grammar:
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
