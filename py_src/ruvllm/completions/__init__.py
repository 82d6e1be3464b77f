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

request.py checks a body and prepares it; grammars.py compiles its output's grammars (response_format,
tool calls) within what the answer can hold; response.py builds the answer. tool_choice "auto"'s
constraint is runtime.constrain.Triggered.

Defaults follow OpenAI, not ruvllm's `generate`: temperature 1, top_p 1, no top-k or min-p, and no
max_tokens bound but the context window, except for constrained output (response_format json_object or
json_schema, a required tool call): without max_tokens it takes at most CONSTRAINED_MAX_TOKENS, within
which the document is always closed. A json_schema writes an object's declared properties only, unless
the schema allows others explicitly (`additionalProperties` true or a schema, `patternProperties`), as
OpenAI's structured outputs and XGrammar's strict mode do: JSON Schema's open objects, read literally,
let a small model add keys until the context is full.
"""

from .grammars import Room
from .request import CONSTRAINED_MAX_TOKENS, Checked, Prepared, check, finish, prepare
from .response import Response

__all__ = ["CONSTRAINED_MAX_TOKENS", "Checked", "Prepared", "Response", "Room", "check", "finish", "prepare"]
