"""`ruvllm serve` against bad bodies: every field type-checked with a 400 that names it (OpenAI's error
object, `param` set), null taken as absent, booleans never numbers, nesting and numbers bounded before
anything recurses or overflows, tool schemas compiled on arrival, strict JSON out whatever the
temperature; one access-log line per request; `ruvllm serve`'s own options checked before the model
loads."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from ruvllm.cli import main
from ruvllm.files.json_body import MAX_DEPTH, FieldError, check_values, nesting_depth, parse
from ruvllm.runtime.generate import Decoder, GenerationOptions
from ruvllm.server import Service, create_app

CONTEXT = 128
HI = [{"role": "user", "content": "Hi"}]
ACCESS_LOG: list[str] = []  # the server's access log lines (create_app's log)
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def base(smollm2):
    """The server on a free port of 127.0.0.1, in a thread, with a short context (answers stay short)."""
    uvicorn = pytest.importorskip("uvicorn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = Service(smollm2, max_concurrent=2, max_context=CONTEXT)
    app = create_app(service, log=ACCESS_LOG.append)  # (to stderr it would print between the tests)
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=30)
            break
        except OSError:
            time.sleep(0.05)
    yield url
    uv.should_exit = True
    thread.join(timeout=10)


def post(base: str, path: str, body: dict | bytes) -> tuple[int, str]:
    """(status, body text) of a POST; the body is sent as it is when bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def strict(text: str) -> object:
    """JSON as a strict peer (JavaScript's JSON.parse) reads it: NaN and Infinity are errors."""

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def chat(**fields) -> dict:
    return {"messages": HI, "max_tokens": 2, **fields}


def text(**fields) -> dict:
    return {"prompt": "Once upon a time", "max_tokens": 2, **fields}


DEEP_SCHEMA: dict = {"type": "integer"}
for _ in range(MAX_DEPTH):
    DEEP_SCHEMA = {"type": "array", "items": DEEP_SCHEMA}
DEEP_FORMAT = {"type": "json_schema", "json_schema": {"name": "deep", "schema": DEEP_SCHEMA}}
DEEP_ARGUMENTS = "[" * 5000 + "]" * 5000
DEEP_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": DEEP_ARGUMENTS}}],
}
HUGE = 10**400  # an integer JSON can write and no double can hold
HUGE_FORMAT = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": HUGE}}}
HUGE_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer", "maximum": HUGE}}},
    },
}
BROKEN_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "not": {"maxLength": 1}}}},
    },
}
DEFS_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/x"}},
            "$defs": {"x": {"type": "integer"}},
        },
    },
}
SUPPORTED = (
    "type, properties, required, additionalProperties, items, prefixItems, minItems, maxItems, enum, const, "
    "anyOf, oneOf, allOf, $ref (with $id, $anchor), dependentRequired (and draft-04 dependencies lists), "
    "minProperties, maxProperties, multipleOf (integers), minLength, maxLength, pattern, format (date, time, "
    "date-time, uuid, email, ipv4, ipv6, uri), minimum, maximum, exclusiveMinimum, exclusiveMaximum, and annotations"
)
BROKEN = (
    f"tools[0].function.parameters (lookup) cannot constrain a call: json_schema: 'not' at properties.q is "
    f"not supported (supported: {SUPPORTED})"
)
IMAGE = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
NOT_FINITE = "must be a finite number (at most ±1.8e308), got"

# (path, body, param, message): every one a 400 whose message is exactly this.
REFUSED = [
    # wrong JSON types, one field after another
    (CHAT, chat(stop=0), "stop", "stop must be a string or a list of strings, got 0"),
    (CHAT, chat(stop={"a": 1}), "stop", "stop must be a string or a list of strings, got an object"),
    (CHAT, chat(stop=["a", 3]), "stop", "stop[1] must be a non-empty string, got 3"),
    (CHAT, chat(stop=""), "stop", 'stop must be a non-empty string, got ""'),
    (CHAT, chat(max_tokens="5"), "max_tokens", 'max_tokens must be an integer >= 1, got "5"'),
    (CHAT, chat(max_tokens=2.5), "max_tokens", "max_tokens must be an integer >= 1, got 2.5"),
    (CHAT, chat(max_completion_tokens=0), "max_completion_tokens",
     "max_completion_tokens must be an integer >= 1, got 0"),
    (CHAT, chat(temperature="hot"), "temperature", 'temperature must be a number >= 0, got "hot"'),
    (CHAT, chat(top_p=0), "top_p", "top_p must be a number in (0, 1], got 0"),
    (CHAT, chat(top_k=1.5), "top_k", "top_k must be an integer >= 0, got 1.5"),
    (CHAT, chat(min_p=[]), "min_p", "min_p must be a number in [0, 1], got a list of 0 items"),
    (CHAT, chat(repetition_penalty=0), "repetition_penalty", "repetition_penalty must be a number > 0, got 0"),
    (CHAT, chat(seed=-1), "seed", "seed must be an integer >= 0, got -1"),
    (CHAT, chat(n=2), "n", "n must be 1 (one choice per request), got 2"),
    (CHAT, chat(stream="yes"), "stream", 'stream must be true or false, got "yes"'),
    (CHAT, chat(stream_options={"include_usage": 1}), "stream_options",
     "stream_options.include_usage must be true or false, got 1"),
    (CHAT, chat(stream_options=[]), "stream_options", "stream_options must be an object, got a list of 0 items"),
    (CHAT, chat(logprobs=1), "logprobs", "logprobs must be true or false, got 1"),
    (CHAT, chat(logprobs=True, top_logprobs=21), "top_logprobs", "top_logprobs must be an integer in [0, 20], got 21"),
    (CHAT, chat(top_logprobs=2), "top_logprobs", "top_logprobs needs logprobs: true"),
    (CHAT, chat(ignore_eos="no"), "ignore_eos", 'ignore_eos must be true or false, got "no"'),
    (CHAT, chat(presence_penalty="0"), "presence_penalty", 'presence_penalty must be a number in [-2, 2], got "0"'),
    (CHAT, chat(frequency_penalty=0.5), "frequency_penalty",
     "frequency_penalty is not supported (use repetition_penalty): only 0 is accepted, got 0.5"),
    (CHAT, chat(logit_bias=[]), "logit_bias", "logit_bias must be an object, got a list of 0 items"),
    (CHAT, chat(logit_bias={"1": 5}), "logit_bias", 'logit_bias is not supported: only {} is accepted, got {"1": 5}'),
    (CHAT, chat(user=5), "user", "user must be a string, got 5"),
    (CHAT, chat(model=["x"]), "model", "model must be a string, got a list of 1 item"),
    (CHAT, chat(store="yes"), "store", 'store must be true or false, got "yes"'),
    (CHAT, chat(messages="Hi"), "messages", 'messages must be a non-empty list of message objects, got "Hi"'),
    (CHAT, chat(messages=[]), "messages",
     "messages must be a non-empty list of message objects, got a list of 0 items"),
    (CHAT, chat(messages=[{"role": 1, "content": "Hi"}]), "messages", "messages[0].role must be a string, got 1"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), "messages",
     "messages[0].content must be a string or a non-empty list of text parts, got 5"),
    (CHAT, chat(messages=[{"role": "user", "content": None}]), "messages",
     "messages[0].content is missing (null only for an assistant message with tool_calls)"),
    (CHAT, chat(messages=IMAGE), "messages",
     """messages[0].content[0] must be a text part {"type": "text", "text": ...}, got a part of type 'image_url'"""),
    (CHAT, chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), "messages",
     "messages[0].content[0].text must be a string, got 5"),
    (CHAT, chat(messages=[{"role": "tool", "content": "x", "tool_call_id": 7}]), "messages",
     "messages[0].tool_call_id must be a string, got 7"),
    (CHAT, chat(response_format="json"), "response_format",
     'response_format must be {"type": "text" | "json_object" | "json_schema", ...}, got "json"'),
    (CHAT, chat(tools={}), "tools", "tools must be a list of tool objects, got dict"),
    (CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice=5), "tool_choice",
     'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name"}}, got 5'),
    (TEXT, text(prompt=5), "prompt", "prompt must be a string or a non-empty list of token ids, got 5"),
    (TEXT, text(prompt=[]), "prompt",
     "prompt must be a string or a non-empty list of token ids, got a list of 0 items"),
    (TEXT, text(prompt=["a", "b"]), "prompt", "prompt holds 2 prompts; one per request is accepted"),
    (TEXT, text(prompt=[1, -2]), "prompt", "prompt[1] must be an integer >= 0, got -2"),
    (TEXT, text(prompt=[1, 99999999]), "prompt", "prompt: token id 99999999 is outside the vocabulary [0, 49152)"),
    (TEXT, text(logprobs=True), "logprobs", "logprobs must be an integer in [0, 5], got true"),
    (TEXT, text(echo=True), "echo", "unsupported field 'echo': only false is accepted, got true"),
    (TEXT, text(best_of=2), "best_of", "unsupported field 'best_of': only 1 is accepted, got 2"),
    (TEXT, text(suffix="end"), "suffix", 'unsupported field \'suffix\' (no fill-in-the-middle), got "end"'),
    (TEXT, text(tools=[]), "tools", "tools is a field of /v1/chat/completions, not of /v1/completions"),
    (CHAT, chat(prompt="x"), "prompt", "prompt is a field of /v1/completions, not of /v1/chat/completions"),
    # a boolean is not a number
    (CHAT, chat(seed=True), "seed", "seed must be an integer >= 0, got true"),
    (CHAT, chat(max_tokens=True), "max_tokens", "max_tokens must be an integer >= 1, got true"),
    (CHAT, chat(n=True), "n", "n must be an integer >= 1, got true"),
    (CHAT, chat(temperature=False), "temperature", "temperature must be a number >= 0, got false"),
    (CHAT, chat(presence_penalty=False), "presence_penalty", "presence_penalty must be a number in [-2, 2], got false"),
    (TEXT, text(prompt=[1, True]), "prompt", "prompt[1] must be an integer >= 0, got true"),
    # nesting: far too deep is refused before parsing; past the limit and parseable, naming the field
    (CHAT, b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None,
     "the request body is nested 100001 levels deep (the limit is 64)"),
    (CHAT, chat(messages=[DEEP_CALL, *HI]), "messages",
     "messages[0].tool_calls[0].function.arguments is nested 5000 levels deep (the limit is 64)"),
    (CHAT, chat(messages=[{**DEEP_CALL, "tool_calls": [{"function": {"name": "f", "arguments": "5"}}]}, *HI]),
     "messages", "messages[0].tool_calls[0].function.arguments must be a JSON object (or its text), got 5"),
    (CHAT, chat(response_format=DEEP_FORMAT), "response_format",
     "response_format.json_schema.schema.items.items.items.items.items.items.items.items.items.items.it... "
     "is nested deeper than 64 levels (the limit)"),
    # numbers JSON can write and a double cannot hold; NaN and Infinity, which Python's parser accepts
    (CHAT, b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}', "temperature",
     f"temperature {NOT_FINITE} NaN"),
    (CHAT, b'{"messages": [{"role": "user", "content": "Hi"}], "top_p": -Infinity}', "top_p",
     f"top_p {NOT_FINITE} -Infinity"),
    (CHAT, b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": 1e400}', "temperature",
     f"temperature {NOT_FINITE} 1e400"),
    (CHAT, chat(response_format=HUGE_FORMAT), "response_format",
     f"response_format.json_schema.schema.minimum {NOT_FINITE} 100000000000...(401 characters)"),
    (CHAT, chat(tools=[HUGE_TOOL]), "tools",
     f"tools[0].function.parameters.properties.n.maximum {NOT_FINITE} 100000000000...(401 characters)"),
    # a tool schema we cannot follow, under "auto" (the default with tools): refused on arrival
    (CHAT, chat(tools=[BROKEN_TOOL]), "tools", BROKEN),
    (CHAT, chat(tools=[BROKEN_TOOL], tool_choice="auto", stream=True), "tools", BROKEN),
    (CHAT, chat(tools=[{"type": "function", "function": {"name": "ok"}}, DEFS_TOOL]), "tools",
     "tools[1].function.parameters (f) cannot constrain a call: json_schema: '$ref' '#/$defs/x' points to nothing "
     "at properties.arguments.properties.a"),
]  # fmt: skip


def schema_format(schema: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


# Schemas that cost the server gigabytes or minutes, or stopped it, before issue 35: each refused at once,
# naming the keyword and where it is. chat() asks for max_tokens 2: 162 bytes (SmolLM2's longest token
# has 81); without max_tokens, the context's 128 tokens: 10,368 bytes.
SCHEMA = "response_format.json_schema.schema: json_schema: "
ROOM = "bytes a document may have (max_tokens 2 of at most 81 bytes each)"
BIG = 5_000_000
HOSTILE = [
    ({"type": "string", "minLength": 10**9}, f"'minLength' 1,000,000,000 at the root needs more than the 162 {ROOM}"),
    ({"type": "array", "minItems": 10**18},
     f"'minItems' 1,000,000,000,000,000,000 at the root needs more than the 162 {ROOM}"),
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 10**6}}},  # an optional one: a dead end
     f"'minLength' 1,000,000 at properties.a needs more than the 162 {ROOM}"),
    ({"type": "array", "minItems": 40, "items": {"type": "string", "minLength": 40}},
     f"the shortest document valid under the schema needs more than the 162 {ROOM}"),
    ({"type": "object", "properties": {f"p{i}_{'x' * 70}": {"type": "string"} for i in range(60_000)}},
     "the schema is larger than 2,097,152 bytes of JSON (the most one request may compile)"),
    ({"type": "object", "properties": {"n" * BIG: {}}, "required": ["n" * BIG]},
     "the schema is larger than 2,097,152 bytes of JSON (the most one request may compile)"),
    ({"enum": ["e" * BIG]}, "the schema is larger than 2,097,152 bytes of JSON (the most one request may compile)"),
    ({"type": "object", "properties": {"n" * 5000: {}}},
     "a property name of 5,000 characters (at most 4,096 bytes) at the root"),
    ({"const": "e" * 5000}, "a value of 'enum'/'const' is 5,002 bytes of JSON (at most 4,096) at the root"),
    ({"enum": list(range(20_001))}, "'enum' has 20,001 values (at most 20,000) at the root"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(2001)}},
     "'properties' declares 2,001 (at most 2,000) at the root"),
    ({"type": "string", "pattern": "(" * 5000 + "a" + ")" * 5000},
     f"'pattern' {('(' * 5000)[:80]!r}: groups nest deeper than 32 levels at the root"),
]  # fmt: skip
REFUSED += [(CHAT, chat(response_format=schema_format(schema)), "response_format", SCHEMA + why)
            for schema, why in HOSTILE]  # fmt: skip
REFUSED.append((CHAT, {"messages": HI, "response_format": schema_format({"type": "string", "minLength": 10**6})},
                "response_format", SCHEMA + "'minLength' 1,000,000 at the root needs more than the 10,368 bytes a "
                "document may have (the context's 128 tokens of at most 81 bytes each)"))  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param", "message"), REFUSED, ids=[m[:60] for *_, m in REFUSED])
def test_a_bad_field_is_a_400_that_names_it(base, path, body, param, message):
    status, answer = post(base, path, body)
    assert status == 400, answer
    assert strict(answer) == {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    }


def test_after_a_depth_bomb_the_server_still_answers(base, smollm2):
    assert post(base, CHAT, b"[" * 1_000_000)[0] == 400
    status, answer = post(base, CHAT, chat(temperature=0))
    expected = smollm2.create_chat_completion(HI, max_tokens=2, temperature=0)["choices"][0]["message"]["content"]
    assert status == 200 and strict(answer)["choices"][0]["message"]["content"] == expected


def test_after_the_hostile_schemas_the_server_answers_a_schema_with_large_bounds(base):
    """maxLength 10^9 bounds nothing a request can write: it is answered like any string."""
    body = chat(max_tokens=8, temperature=0, response_format=schema_format({"type": "string", "maxLength": 10**9}))
    status, answer = post(base, CHAT, body)
    assert status == 200 and isinstance(json.loads(strict(answer)["choices"][0]["message"]["content"]), str)
    assert json.loads(urllib.request.urlopen(f"{base}/health", timeout=30).read())["status"] == "ok"


def test_health_is_answered_while_a_schema_compiles(base, monkeypatch):
    """Schemas are compiled off the event loop: one that takes long holds neither /health nor the others.
    (Here the compile waits until /health has answered: on the event loop, that could never happen.)"""
    import ruvllm.completions.grammars

    real, started, answered = ruvllm.completions.grammars.json_grammar, threading.Event(), threading.Event()

    def slow(*args, **kwargs):
        started.set()
        answered.wait(timeout=60)
        return real(*args, **kwargs)

    monkeypatch.setattr(ruvllm.completions.grammars, "json_grammar", slow)
    results: list = []
    body = chat(temperature=0, response_format=schema_format({"type": "integer"}))
    request = threading.Thread(target=lambda: results.append(post(base, CHAT, body)))
    request.start()
    assert started.wait(timeout=60)
    health = urllib.request.urlopen(f"{base}/health", timeout=30)
    answered.set()
    request.join(timeout=60)
    assert health.status == 200 and results and results[0][0] == 200


def test_a_body_past_the_bound_is_a_413_before_it_is_read_whole(base, monkeypatch):
    import ruvllm.server

    monkeypatch.setattr(ruvllm.server, "MAX_BODY_BYTES", 1000)
    status, answer = post(base, CHAT, chat(stop=["x" * 2000]))
    assert status == 413
    error = strict(answer)["error"]
    assert error["message"] == "the request body is larger than 1,000 bytes" and error["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("POST", "/v1/embeddings", 404, "Invalid URL (POST /v1/embeddings): ruvllm serves "),
        ("GET", "/nothing/here", 404, "Invalid URL (GET /nothing/here): ruvllm serves "),
        ("GET", "/v1/chat/completions", 405, "/v1/chat/completions does not take GET: ruvllm serves "),
    ],
)
def test_unknown_paths_get_openai_s_error_object(base, method, path, status, message):
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(base + path, data=data, method=method)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == status
    error = strict(caught.value.read().decode())["error"]
    assert error["message"].startswith(message) and "POST /v1/chat/completions" in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == "unknown_url"


OPTIONAL = ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop", "stream",
            "stream_options", "logprobs", "ignore_eos", "response_format", "user", "metadata", "store",
            "service_tier", "logit_bias", "presence_penalty", "frequency_penalty", "model", "echo", "best_of",
            "suffix", "audio", "modalities")  # fmt: skip


def test_null_is_the_same_as_absent(base, smollm2):
    nulls = {name: None for name in OPTIONAL}
    status, answer = post(base, CHAT, {**nulls, "messages": HI, "max_tokens": None, "max_completion_tokens": 2,
                                       "top_logprobs": None, "tools": None, "tool_choice": None,
                                       "parallel_tool_calls": None, "temperature": 0})  # fmt: skip
    expected = smollm2.create_chat_completion(HI, max_tokens=2, temperature=0)["choices"][0]["message"]["content"]
    assert status == 200 and strict(answer)["choices"][0]["message"]["content"] == expected
    # max_tokens null: until the end of the context window, as with no max_tokens at all
    prompt = list(range(100, 200))
    status, answer = post(base, TEXT, {**nulls, "prompt": prompt, "max_tokens": None, "ignore_eos": True})
    usage = strict(answer)["usage"]
    assert status == 200 and usage["completion_tokens"] == CONTEXT - len(prompt)


def test_fields_nobody_defined_are_ignored_and_text_parts_are_joined(base, smollm2):
    body = chat(temperature=0, cache_prompt=True, chat_template_kwargs={"x": 1})
    body["messages"] = [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}
    ]
    status, answer = post(base, CHAT, body)
    joined = [{"role": "user", "content": "Hi\nthere"}]
    expected = smollm2.create_chat_completion(joined, max_tokens=2, temperature=0)["choices"][0]["message"]["content"]
    assert status == 200 and strict(answer)["choices"][0]["message"]["content"] == expected


def test_a_tool_we_can_follow_under_auto_is_answered(base):
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 12}}}}}  # fmt: skip
    status, answer = post(base, CHAT, chat(tools=[tool], tool_choice="auto", temperature=0))
    assert status == 200 and strict(answer)["usage"]["completion_tokens"] == 2


def test_a_tiny_temperature_is_greedy_and_every_event_strict_json(base, smollm2):
    """1e-320 (subnormal) used to overflow logits / temperature to inf: token 0 and "logprob": NaN."""
    greedy = smollm2.create_chat_completion(HI, max_tokens=4, temperature=0)["choices"][0]["message"]["content"]
    body = chat(max_tokens=4, temperature=1e-320, logprobs=True, top_logprobs=3, stream=True)
    status, answer = post(base, CHAT, body)
    events = [line.removeprefix("data: ") for line in answer.splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [strict(event) for event in events[:-1]]
    deltas = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert "".join(d["delta"]["content"] for d in deltas) == greedy
    for delta in deltas:
        assert [entry["logprob"] for entry in delta["logprobs"]["content"]] == [0.0]
    status, answer = post(base, CHAT, {**body, "stream": False})
    assert status == 200 and strict(answer)["choices"][0]["message"]["content"] == greedy


@pytest.mark.parametrize("temperature", [1e-320, 1e-310, 1e-300, 1e-5, 0.7])
@pytest.mark.parametrize("penalty", [1.0, 1e-320, 1e300])
def test_log_probabilities_are_never_nan_however_small_the_temperature(temperature, penalty):
    logits = (np.random.default_rng(0).normal(size=64) * 8).astype(np.float32)  # (V,)
    options = GenerationOptions.from_kwargs(
        max_tokens=8, temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, logprobs=5, repetition_penalty=penalty
    )
    decoder = Decoder([int(np.argmax(logits))], options, set(), None)  # the best token is penalized
    step = decoder.choose(logits)
    assert np.isfinite(step.logprob) and all(np.isfinite(lp) for _, lp in step.top_logprobs)
    json.dumps({"logprob": step.logprob, "top": step.top_logprobs}, allow_nan=False)
    if temperature < 1e-300:  # all the mass on the best token after the penalty
        assert step.logprob == 0.0


def test_the_access_log_has_a_line_per_request_with_its_tokens(base):
    ACCESS_LOG.clear()
    assert post(base, TEXT, text(temperature=0))[0] == 200
    assert post(base, TEXT, text(temperature="x"))[0] == 400
    deadline = time.time() + 30
    while time.time() < deadline and sum(f"POST {TEXT}" in line for line in ACCESS_LOG) < 2:  # written just after
        time.sleep(0.02)
    lines = [line for line in ACCESS_LOG if f"POST {TEXT}" in line]
    assert len(lines) == 2
    client, method, path, status, prompt, completion, ms, unit = lines[0].split(" ")
    assert client.startswith("127.0.0.1:") and (method, path, status) == ("POST", TEXT, "200")
    assert (prompt, completion, unit) == ("prompt_tokens=4", "completion_tokens=2", "ms") and int(ms) >= 0
    assert lines[1].split(" ")[1:4] == ["POST", TEXT, "400"] and "tokens" not in lines[1]


def test_a_number_alone_is_checked_as_a_value_not_walked_as_a_container():
    check_values(5, "arguments")  # (it was walked for children: a TypeError)
    with pytest.raises(FieldError, match=r"^arguments must be a finite number \(at most ±1.8e308\), got NaN$"):
        check_values(float("nan"), "arguments")


def test_nesting_is_measured_without_parsing():
    assert nesting_depth(b'{"a": [1, {"b": "[[[{"}], "c": "\\"]]"}') == 3
    assert nesting_depth(b"7") == 0 and nesting_depth(b"[" * 10) == 10
    with pytest.raises(FieldError, match="is nested 300 levels deep"):
        parse("[" * 300 + "]" * 300)
    loop: list = []
    loop.append(loop)  # a list that holds itself, as only the Python API can give
    with pytest.raises(FieldError, match=r"^stop\[0\]\[0\]\[0\].* is nested deeper than 64 levels"):
        check_values({"stop": loop})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-concurrent", "1000000000"], "--max-concurrent must be in [1, 256], got 1000000000"),
        (["--port", "70000"], "--port must be an integer in [1, 65535], got 70000"),
        (["--host", "256.0.0.1"], "--host '256.0.0.1' is not an IP address"),
        (["--max-context", "0"], "--max-context must be >= 1, got 0"),
    ],
)
def test_serve_options_are_checked_before_the_model_loads(options, message, capsys):
    pytest.importorskip("starlette")  # without the serve extra, that is the first error
    pytest.importorskip("uvicorn")
    assert main(["serve", "no-such-model-folder", *options]) == 1  # the folder would be the next error
    assert capsys.readouterr().err == f"ruvllm serve: error: {message}\n"


def test_a_host_name_idna_cannot_encode_is_refused_by_name(capsys):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    host = "a" * 64 + ".example"  # a label longer than IDNA allows: a UnicodeError, which has no strerror
    assert main(["serve", "no-such-model-folder", "--host", host]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"ruvllm serve: error: --host '{host}' is not an IP address or a name this machine resolves ("
    )
    assert "idna" in err and err.count("\n") == 1  # (Python's own words for the label follow)


def test_a_port_in_use_is_reported_before_the_model_loads(capsys):
    pytest.importorskip("starlette")  # without the serve extra, that is the first error
    pytest.importorskip("uvicorn")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "no-such-model-folder", "--port", str(port)]) == 1
    assert capsys.readouterr().err == (
        f"ruvllm serve: error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use)\n"
    )
