"""OpenAI shapes in the Python API (completions/): create_chat_completion / create_completion, their
log-probabilities against the model's own logits, schema-constrained output, and tool calls."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ruvllm
from ruvllm.cli import main
from ruvllm.errors import InvalidArgumentError
from ruvllm.runtime.constrain import Triggered, json_grammar

TEMPLATES = Path(__file__).parent / "data" / "tool_templates"
ORDER = json.loads((Path(__file__).parent / "data" / "schemas.json").read_text(encoding="utf-8"))["schemas"]["order"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}}},
    },
}


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def reference_logprobs(model, prompt_ids: list[int], token_ids: list[int], temperature: float) -> np.ndarray:
    """log-softmax(logits / temperature) of every generated position, from one forward over the whole text."""
    engine = model.engine
    logits = engine.forward(prompt_ids + token_ids[:-1], 0, engine.new_cache())[len(prompt_ids) - 1 :]  # (n, V)
    scaled = logits.astype(np.float64) / temperature
    top = scaled.max(-1, keepdims=True)
    return scaled - top - np.log(np.exp(scaled - top).sum(-1, keepdims=True))


@pytest.mark.parametrize("temperature", [0, 0.7])
def test_chat_logprobs_are_the_models_after_temperature(smollm2, temperature):
    messages = user("Name a color.")
    answer = smollm2.create_chat_completion(
        messages, max_tokens=8, temperature=temperature, seed=3, logprobs=True, top_logprobs=4
    )
    entries = answer["choices"][0]["logprobs"]["content"]
    prompt = smollm2.tokenizer.encode_chat(messages)
    token_ids = [s.token_id for s in smollm2.generate(prompt, max_tokens=8, temperature=temperature, seed=3)]
    assert len(token_ids) == len(entries) == answer["usage"]["completion_tokens"]
    reference = reference_logprobs(smollm2, prompt, token_ids, temperature or 1.0)  # (n, V)
    for entry, token, row in zip(entries, token_ids, reference, strict=True):
        assert bytes(entry["bytes"]) == smollm2.tokenizer.token_bytes[token]
        assert entry["logprob"] == pytest.approx(row[token], abs=2e-4)
        best = np.argsort(-row)[:4]
        assert [bytes(t["bytes"]) for t in entry["top_logprobs"]] == [smollm2.tokenizer.token_bytes[i] for i in best]
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(row[best], abs=2e-4)


def test_text_completion_logprobs_use_the_legacy_layout(smollm2):
    answer = smollm2.create_completion("The capital of France is", max_tokens=3, temperature=0, logprobs=2)
    logprobs = answer["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 3
    assert "".join(logprobs["tokens"]) == answer["choices"][0]["text"]
    assert logprobs["text_offset"][0] == 0 and all(len(top) <= 2 for top in logprobs["top_logprobs"])
    assert answer["choices"][0]["text"].startswith(" Paris")


def test_five_schema_constrained_generations_at_temperature_one_all_validate(smollm2):
    """The schema reaches the real model's sampling through response_format, and the documents end.

    Five seeds, not more: that the constraint admits only valid documents is proven on many more samples
    (200 a schema) by tests/test_constrain.py's random-logits walks; here each seed is a different
    temperature-1 path through a real model, which is what this end-to-end test adds."""
    jsonschema = pytest.importorskip("jsonschema")
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER}}
    messages = user("Write a grocery order as JSON.")
    for seed in range(5):
        answer = smollm2.create_chat_completion(messages, max_tokens=300, temperature=1, seed=seed, response_format=fmt)
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), ORDER)


def test_json_object_mode_gives_an_object(smollm2):
    for seed in range(3):
        answer = smollm2.create_completion(
            "A JSON object describing a cat:", max_tokens=200, temperature=0.8, seed=seed,
            response_format={"type": "json_object"},
        )  # fmt: skip
        text = answer["choices"][0]["text"]
        if answer["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
        else:  # cut by max_tokens: still the start of an object
            assert text.lstrip().startswith("{")


def test_streamed_chat_chunks_and_stop_strings(smollm2):
    messages = user("Count from one to ten in words.")
    whole = smollm2.create_chat_completion(messages, max_tokens=30, temperature=0)["choices"][0]["message"]["content"]
    assert "\n" in whole
    cut = whole.index("\n")
    chunks = list(smollm2.create_chat_completion(messages, max_tokens=30, temperature=0, stop=["\n"], stream=True))
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == whole[:cut] and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_fields_openai_defines_but_we_cannot_honour_are_refused_by_name(smollm2):
    with pytest.raises(InvalidArgumentError, match="unsupported field 'best_of'"):
        smollm2.create_completion("x", best_of=2)
    with pytest.raises(InvalidArgumentError, match="n must be 1"):
        smollm2.create_chat_completion(user("x"), n=2)
    with pytest.raises(InvalidArgumentError, match="top_logprobs needs logprobs: true"):
        smollm2.create_chat_completion(user("x"), top_logprobs=2)
    schema = {"type": "object", "properties": {"a": {"type": "string", "not": {"maxLength": 1}}}}
    with pytest.raises(InvalidArgumentError, match=r"'not' at properties\.a"):
        smollm2.create_chat_completion(
            user("x"), response_format={"type": "json_schema", "json_schema": {"schema": schema}}
        )
    with pytest.raises(InvalidArgumentError, match="response_format type must be"):
        smollm2.create_chat_completion(user("x"), response_format={"type": "yaml"})
    # sent by clients by default, with no effect here: accepted
    answer = smollm2.create_chat_completion(user("x"), max_tokens=1, user="me", n=1, presence_penalty=0)
    assert answer["usage"]["completion_tokens"] == 1


@pytest.fixture(scope="module")
def qwen_templated(smollm2_dir):
    """The demo model with Qwen2.5's tool-calling chat template."""
    return ruvllm.load(smollm2_dir, chat_template=(TEMPLATES / "qwen2_5.jinja").read_text())


def test_a_required_tool_call_is_parsed_into_openai_tool_calls_with_valid_arguments(qwen_templated):
    jsonschema = pytest.importorskip("jsonschema")
    messages = user("What is the weather in Paris?")
    for seed in range(5):
        answer = qwen_templated.create_chat_completion(
            messages, tools=[WEATHER, TIME], tool_choice="required", temperature=1, seed=seed, max_tokens=120
        )
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        tool = {"get_weather": WEATHER, "get_time": TIME}[call["function"]["name"]]
        jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])
        assert call["type"] == "function" and call["id"].startswith("call_")
    named = {"type": "function", "function": {"name": "get_time"}}
    answer = qwen_templated.create_chat_completion(messages, tools=[WEATHER, TIME], tool_choice=named, max_tokens=60)
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"


def test_small_max_tokens_still_give_a_whole_document_or_call(qwen_templated):
    # json_object at temperature 0 used to run to max_tokens in the middle of a value; a required call
    # with max_tokens 60 ended at "</tool_call" (issue 27): the closing is now kept within the budget
    for max_tokens in (3, 12, 40):
        answer = qwen_templated.create_completion(
            "A JSON object describing a cat:", max_tokens=max_tokens, temperature=0,
            response_format={"type": "json_object"},
        )  # fmt: skip
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] <= max_tokens, choice
        assert isinstance(json.loads(choice["text"]), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER}}
    for seed in range(3):
        answer = qwen_templated.create_chat_completion(
            user("An order"), max_tokens=26, temperature=1, seed=seed, response_format=fmt
        )
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema_validate(json.loads(choice["message"]["content"]), ORDER)
    messages = user("What is the weather in Paris?")
    for seed, max_tokens in ((0, 26), (1, 30), (2, 60)):
        answer = qwen_templated.create_chat_completion(
            messages, tools=[WEATHER, TIME], tool_choice="required", temperature=1, seed=seed, max_tokens=max_tokens
        )
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        tool = {"get_weather": WEATHER, "get_time": TIME}[call["function"]["name"]]
        jsonschema_validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])
    # below the shortest call (24 tokens of this tokenizer): cut, as finish_reason "length" says
    answer = qwen_templated.create_chat_completion(messages, tools=[WEATHER], tool_choice="required", max_tokens=10)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"], choice


def jsonschema_validate(document: object, schema: dict) -> None:
    pytest.importorskip("jsonschema").validate(document, schema)


def test_streamed_tool_calls_arrive_as_one_delta_at_the_end(qwen_templated):
    chunks = list(
        qwen_templated.create_chat_completion(
            user("Weather in Rome?"), tools=[WEATHER], tool_choice="required", stream=True, max_tokens=80, temperature=0
        )
    )
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["delta"]["tool_calls"][0]["index"] == 0
    assert last["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_the_prompt_lists_the_tools_through_the_template(qwen_templated):
    prompt = qwen_templated.tokenizer.apply_chat_template(user("Hi"), tools=[WEATHER])
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt


def test_auto_tool_choice_constrains_a_call_once_the_model_opens_one(qwen_templated):
    """With tool_choice auto the model writes freely; after `<tool_call>` only a valid call may follow,
    then writing is free again. Random logits stand in for a model that chose to call."""
    jsonschema = pytest.importorskip("jsonschema")
    tokenizer = qwen_templated.tokenizer
    grammar = json_grammar({"anyOf": [_call_schema(WEATHER)]}, "\n", "\n</tool_call>")
    trigger = Triggered(grammar, qwen_templated.vocabulary, "<tool_call>")
    for token in tokenizer.encode("Let me check. <tool_call>", add_special_tokens=False):
        assert trigger.allowed()[token]
        trigger.advance(token)
    rng, written = np.random.default_rng(0), []
    for _ in range(200):
        allowed = trigger.allowed()
        if allowed.all():  # the call is closed: free again
            break
        token = int(rng.choice(np.flatnonzero(allowed)))
        written.append(token)
        trigger.advance(token)
    text = tokenizer.decode(written)
    assert text.endswith("</tool_call>") and trigger.allowed().all()
    call = json.loads(text.removesuffix("</tool_call>"))
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], WEATHER["function"]["parameters"])
    # with fewer tokens left than the opening tag and the shortest call take, no call is opened
    short = Triggered(grammar, qwen_templated.vocabulary, "<tool_call>", budget=8)
    (open_angle,) = tokenizer.encode("<", add_special_tokens=False)
    (word,) = tokenizer.encode("Sure", add_special_tokens=False)
    assert not short.allowed()[open_angle] and short.allowed()[word]
    assert Triggered(grammar, qwen_templated.vocabulary, "<tool_call>", budget=60).allowed()[open_angle]


def _call_schema(tool: dict) -> dict:
    function = tool["function"]
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": function["parameters"]},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def test_cli_generate_json_carries_logprobs(smollm2_dir, capsys):
    argv = ["generate", str(smollm2_dir), "--prompt", "The capital of France is", "--json"]
    assert main([*argv, "--max-tokens", "2", "--temperature", "0", "--logprobs", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    content = result["logprobs"]["content"]
    assert [c["id"] for c in content] == result["token_ids"]
    assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["id"] == c["id"] for c in content)
    assert main([*argv[:-1], "--logprobs", "2"]) == 1
    assert "--logprobs needs --json" in capsys.readouterr().err


def test_constrained_output_without_max_tokens_takes_at_most_the_documented_default():
    """A json_schema answer without max_tokens ran until the context was full (issue 35); now 512 tokens
    at most, for json_object and required tool calls too; free text still runs to the context's end."""
    from ruvllm.completions import CONSTRAINED_MAX_TOKENS, check

    hi = [{"role": "user", "content": "Hi"}]
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert CONSTRAINED_MAX_TOKENS == 512
    for body in ({"response_format": schema}, {"response_format": {"type": "json_object"}},
                 {"tools": [tool], "tool_choice": "required"}):  # fmt: skip
        assert check({"messages": hi, **body}, "chat").max_tokens == 512
        assert check({"messages": hi, **body, "max_tokens": 2000}, "chat").max_tokens == 2000
    assert check({"messages": hi}, "chat").max_tokens is None
    assert check({"messages": hi, "tools": [tool]}, "chat").max_tokens is None  # "auto": text, maybe a call
