"""`ruvllm serve` (server.py): the official `openai` client drives it unchanged, streaming and not; its
answers are the engine's own; a client that goes away frees its sequence; /metrics reports the load."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("jsonschema")
pytest.importorskip("openai")
pytest.importorskip("uvicorn")

import jsonschema
import openai
import uvicorn

from ruvllm.server import Service, create_app

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "London", "Rome"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(smollm2):
    """The server on a free port of 127.0.0.1, in a thread, for the module's tests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = Service(smollm2, max_concurrent=4, max_context=512)
    app = create_app(service, log=lambda line: None)  # (the access log is tested in test_serve_bad_input)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if get(f"{base}/health").status == 200:
                break
        except OSError:
            time.sleep(0.05)
    yield base, service
    uv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0)


def get(url: str):
    return urllib.request.urlopen(url, timeout=30)


def chat(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def test_a_chat_completion_is_the_engines_own_answer(client, smollm2):
    messages = chat("What is the capital of France?")
    answer = client.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0)
    expected = smollm2.create_chat_completion(messages, max_tokens=16, temperature=0)
    assert answer.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert answer.choices[0].message.content.strip()
    assert answer.choices[0].finish_reason == expected["choices"][0]["finish_reason"]
    assert answer.usage.completion_tokens == expected["usage"]["completion_tokens"]
    assert answer.model == "smollm2-135m-instruct" and answer.object == "chat.completion"


def test_streamed_deltas_add_up_to_the_answer_and_end_with_usage(client, smollm2):
    messages = chat("Name three fruits.")
    usage = {"include_usage": True}
    stream = client.chat.completions.create(
        model="any", messages=messages, max_tokens=20, temperature=0, stream=True, stream_options=usage
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected = smollm2.create_chat_completion(messages, max_tokens=20, temperature=0)
    assert text == expected["choices"][0]["message"]["content"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected["usage"]["completion_tokens"]


def test_text_completions_streaming_and_not(client, smollm2):
    whole = client.completions.create(model="any", prompt="Once upon a time", max_tokens=8, temperature=0)
    expected = "".join(c.text for c in smollm2.generate("Once upon a time", max_tokens=8, temperature=0))
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "length"
    parts = client.completions.create(model="any", prompt="Once upon a time", max_tokens=8, temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in parts) == expected


def test_json_schema_output_from_the_server_validates(client):
    answer = client.chat.completions.create(
        model="any",
        messages=chat("Describe a person as JSON."),
        max_tokens=80,
        temperature=1,
        seed=11,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)


def test_logprobs_come_in_openais_layout(client):
    answer = client.chat.completions.create(
        model="any", messages=chat("Hi"), max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens
    for entry in content:  # greedy: the chosen token is the likeliest one
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob) and entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list()] == ["smollm2-135m-instruct"]
    assert json.load(get(f"{server[0]}/health"))["status"] == "ok"


def test_bad_requests_are_refused_with_the_reason(client, server):
    with pytest.raises(openai.BadRequestError, match="unsupported field 'best_of'"):
        client.completions.create(model="any", prompt="x", extra_body={"best_of": 2})
    with pytest.raises(openai.BadRequestError, match="temperature must be a number >= 0, got -1"):
        client.chat.completions.create(model="any", messages=chat("x"), temperature=-1)
    with pytest.raises(openai.BadRequestError, match="context window is 512") as caught:
        client.completions.create(model="any", prompt=list(range(1, 600)), max_tokens=1)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{server[0]}/v1/chat/completions", data=b"{not json", timeout=30)
    assert caught.value.code == 400 and "not JSON" in json.load(caught.value)["error"]["message"]


def test_concurrent_clients_each_get_their_own_answer(client, smollm2):
    prompts = [f"Tell me one fact about the number {n}." for n in range(8)]

    def ask(prompt: str) -> str:
        answer = client.chat.completions.create(model="any", messages=chat(prompt), max_tokens=12, temperature=0)
        return answer.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, prompts))
    for prompt, answer in zip(prompts, answers, strict=True):
        expected = smollm2.create_chat_completion(chat(prompt), max_tokens=12, temperature=0)
        assert answer == expected["choices"][0]["message"]["content"]


def metrics(base: str) -> dict[str, float]:
    values = {}
    for line in get(f"{base}/metrics").read().decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_a_client_that_disconnects_frees_its_sequence(server):
    base = server[0]
    before = metrics(base)
    body = {"messages": chat("Write a long story."), "max_tokens": 400, "ignore_eos": True, "stream": True}
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    received = [response.readline() for _ in range(6)]  # three events: "data: {...}" and a blank line each
    assert sum(line.startswith(b"data: {") for line in received) == 3
    assert metrics(base)["ruvllm_running_sequences"] == 1
    connection.close()  # the client goes away mid-stream
    deadline = time.time() + 10
    while time.time() < deadline and metrics(base)["ruvllm_running_sequences"] > 0:
        time.sleep(0.05)
    after = metrics(base)
    assert after["ruvllm_running_sequences"] == 0 and after["ruvllm_kv_blocks_used"] == 0
    # counted as cancelled, and not as finished too (it was both before issue 35)
    assert after["ruvllm_requests_cancelled_total"] == before["ruvllm_requests_cancelled_total"] + 1
    assert after["ruvllm_requests_finished_total"] == before["ruvllm_requests_finished_total"]
    assert after["ruvllm_generated_tokens_total"] < after["ruvllm_requests_total"] * 400  # it stopped early
    assert 'ruvllm_http_requests_total{path="/v1/chat/completions",status="200"}' in after


def test_a_generation_that_fails_gives_the_client_the_reason_and_the_server_goes_on(client, smollm2, monkeypatch):
    engine = smollm2.engine
    real = engine.forward_batch

    def broken(*args, **kwargs):
        raise RuntimeError("the kernel fell over")

    monkeypatch.setattr(engine, "forward_batch", broken)
    with pytest.raises(openai.InternalServerError, match="internal error: RuntimeError: the kernel fell over"):
        client.chat.completions.create(model="any", messages=chat("Hi"), max_tokens=4)
    stream = client.chat.completions.create(model="any", messages=chat("Hi"), max_tokens=4, stream=True)
    with pytest.raises(openai.APIError, match="the kernel fell over"):
        list(stream)
    monkeypatch.setattr(engine, "forward_batch", real)
    answer = client.chat.completions.create(model="any", messages=chat("Hi"), max_tokens=4, temperature=0)
    expected = smollm2.create_chat_completion(chat("Hi"), max_tokens=4, temperature=0)
    assert answer.choices[0].message.content == expected["choices"][0]["message"]["content"]


def test_a_tool_round_trip_with_the_openai_client(client, smollm2):
    """Call, result, final answer, as the openai client's docs do it: the assistant's message (content null,
    tool_calls) goes back as it came, then a 'tool' message. This was a 400 ("the chat_template in
    tokenizer_config.json fails: TypeError ...") for SmolLM2's template, which writes no tools itself."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    messages: list = chat("What is the weather in Paris?")
    first = client.chat.completions.create(
        model="any", messages=messages, tools=[tool], tool_choice="required", temperature=0, max_tokens=60
    )
    call = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and call.content is None
    assert call.tool_calls[0].function.name == "get_weather"
    messages += [call, {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "Sunny, 21 C"}]
    final = client.chat.completions.create(model="any", messages=messages, tools=[tool], temperature=0, max_tokens=24)
    sent = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in messages]
    expected = smollm2.create_chat_completion(sent, tools=[tool], temperature=0, max_tokens=24)
    assert final.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert final.choices[0].message.content.strip()  # an answer, in words
