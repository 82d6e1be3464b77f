"""OpenAI tool calls: tools rendered through a real chat template, calls parsed out of model text.

Reference for rendering: transformers' `apply_chat_template(messages, tools=...)` with the same template
(tests/data/tool_templates/qwen2_5.jinja, Qwen2.5-Instruct's published template: Hermes-style calls).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ruvllm.errors import InvalidArgumentError
from ruvllm.text.chat_template import ChatTemplate
from ruvllm.text.tokenizer import Tokenizer
from ruvllm.text.tool_calls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    check_tool_choice,
    check_tools,
    parse_tool_calls,
    template_messages,
    tool_call_schema,
)

QWEN2_5 = (Path(__file__).parent / "data" / "tool_templates" / "qwen2_5.jinja").read_text()
CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get-time",
        "description": "The time now in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
TOOLS = [WEATHER, TIME]

ASK = [{"role": "user", "content": "What's the weather in Zürich?"}]
WITH_SYSTEM = [{"role": "system", "content": "You are terse."}, *ASK]
# An OpenAI conversation after one round of calls: content null, arguments as JSON strings, two tool results.
AFTER_CALLS = [
    *WITH_SYSTEM,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "celsius"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "get-time", "arguments": '{"zone": "CET"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
]
AFTER_CALL_WITH_TEXT = [
    *ASK,
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get-time", "arguments": {"zone": "UTC"}}}],
    },
    {"role": "tool", "tool_call_id": "c", "content": "12:05"},
    {"role": "assistant", "content": "It is 12:05 UTC."},
    {"role": "user", "content": "Thanks"},
]


@pytest.fixture(scope="module")
def reference():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(Path(__file__).parent.parent / "models/smollm2-135m-instruct/tokenizer.json")
    )
    tokenizer.chat_template = QWEN2_5
    return tokenizer


@pytest.fixture(scope="module")
def ours(smollm2_dir) -> Tokenizer:
    tokenizer = Tokenizer.from_folder(str(smollm2_dir))
    tokenizer.set_chat_template(QWEN2_5, "tests/data/tool_templates/qwen2_5.jinja")
    return tokenizer


# ---- rendering ----


@pytest.mark.parametrize(
    "messages",
    [ASK, WITH_SYSTEM, template_messages(AFTER_CALLS), AFTER_CALLS, AFTER_CALL_WITH_TEXT],
    ids=["user", "system", "after-calls", "after-calls-string-arguments", "after-call-with-text"],
)
@pytest.mark.parametrize("tools", [TOOLS, [WEATHER], None], ids=["two-tools", "one-tool", "no-tools"])
def test_tools_render_as_transformers_renders_them(ours, reference, messages, tools):
    expected = reference.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(messages, True, tools) == expected
    expected_ids = reference.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)
    if isinstance(expected_ids, dict) or hasattr(expected_ids, "input_ids"):
        expected_ids = expected_ids["input_ids"]
    assert ours.encode_chat(messages, True, tools) == list(expected_ids)


def test_the_system_turn_lists_the_tools_and_past_calls_become_tool_call_blocks(ours):
    prompt = ours.apply_chat_template(template_messages(AFTER_CALLS), True, TOOLS)
    assert prompt.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER, ensure_ascii=False) + "\n" + json.dumps(TIME) + "\n</tools>" in prompt
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get-time", "arguments": {"zone": "CET"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temperature": 21}\n</tool_response>\n'
        "<tool_response>\n14:05\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in prompt


def test_template_messages_decode_arguments_without_touching_the_callers_messages():
    decoded = template_messages(AFTER_CALLS)
    assert decoded[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Zürich", "unit": "celsius"}
    assert AFTER_CALLS[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Zürich", "unit": "celsius"}'
    assert decoded[3] is AFTER_CALLS[3]
    bad = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]
    with pytest.raises(
        InvalidArgumentError, match=r"message 0: tool_calls\[0\]\.function\.arguments is not valid JSON"
    ):
        template_messages(bad)


def test_a_template_sees_tools_as_none_when_there_are_none():
    pytest.importorskip("jinja2")
    template = ChatTemplate("{{ tools is none }}|{{ tools | tojson }}", {})
    assert template.render(ASK) == "True|null"
    assert template.render(ASK, tools=[WEATHER]) == "False|" + json.dumps([WEATHER], ensure_ascii=False)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([{"role": "assistant", "content": None}], "message 0 must have a string 'role' and a string 'content'"),
        ([{"role": "assistant", "content": None, "tool_calls": []}], "message 0 must have a string 'role'"),
        ([*ASK, {"role": "assistant", "content": None, "tool_calls": {}}], "message 1: 'tool_calls' must be a list"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}], r"message 0: tool_calls\[0\] must be"),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}],
            r"message 0: tool_calls\[0\]\.function\.arguments must be a JSON string or an object",
        ),
        ([*ASK, {"role": "tool", "tool_call_id": 7, "content": "x"}], "message 1: 'tool_call_id' must be a string"),
        ([*ASK, {"role": "tool", "tool_call_id": "c", "content": None}], "message 1 must have a string 'role'"),
    ],
)
def test_malformed_tool_messages_are_refused_naming_the_message(ours, messages, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ours.apply_chat_template(messages)


def test_tools_that_are_not_a_list_of_objects_are_refused(ours):
    with pytest.raises(InvalidArgumentError, match="tools must be a list of"):
        ours.apply_chat_template(ASK, True, WEATHER)


# ---- parsing ----


def arguments(call: dict) -> dict:
    assert CALL_ID.match(call["id"]) and call["type"] == "function"
    assert isinstance(call["function"]["arguments"], str)
    return json.loads(call["function"]["arguments"])


def test_one_call_is_parsed_and_there_is_no_content():
    content, calls = parse_tool_calls(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
    )
    assert content is None and len(calls) == 1
    assert calls[0]["function"]["name"] == "get_weather"
    assert arguments(calls[0]) == {"city": "Zürich"}
    assert "Zürich" in calls[0]["function"]["arguments"]  # not escaped to \u00fc


def test_two_calls_are_parsed_in_order_with_distinct_ids():
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern", "unit": "celsius"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get-time", "arguments": {"zone": "CET"}}\n</tool_call>\n'
    )
    content, calls = parse_tool_calls(text)
    assert content is None
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get-time"]
    assert [arguments(c) for c in calls] == [{"city": "Bern", "unit": "celsius"}, {"zone": "CET"}]
    assert calls[0]["id"] != calls[1]["id"]


def test_text_before_a_call_is_the_content():
    text = (
        'I will check the weather.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content == "I will check the weather."
    assert arguments(calls[0]) == {"city": "Oslo"}


def test_a_missing_close_tag_at_the_end_is_tolerated():
    content, calls = parse_tool_calls('<tool_call>\n{"name": "get-time", "arguments": {"zone": "UTC"}}\n')
    assert content is None and arguments(calls[0]) == {"zone": "UTC"}


def test_malformed_json_stays_in_the_content():
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"\n</tool_call>'
    assert parse_tool_calls(broken) == (broken, [])
    not_a_call = '<tool_call>\n["get_weather"]\n</tool_call>'
    assert parse_tool_calls(not_a_call) == (not_a_call, [])
    good = '<tool_call>\n{"name": "get-time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    content, calls = parse_tool_calls(broken + "\n" + good)
    assert content == broken and [c["function"]["name"] for c in calls] == ["get-time"]


def test_parameters_is_an_alias_of_arguments():
    content, calls = parse_tool_calls('<tool_call>\n{"name": "get-time", "parameters": {"zone": "PST"}}\n</tool_call>')
    assert content is None and arguments(calls[0]) == {"zone": "PST"}


def test_arguments_written_as_a_json_string_or_left_out_are_accepted():
    _, calls = parse_tool_calls(
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call><tool_call>{"name": "g"}'
    )
    assert [arguments(c) for c in calls] == [{"a": 1}, {}]


def test_text_without_calls_is_returned_unchanged():
    assert parse_tool_calls("  The weather is fine.\n") == ("  The weather is fine.\n", [])
    assert parse_tool_calls("") == ("", [])


# ---- validation ----


def test_check_tools_normalizes_and_fills_in_missing_parameters():
    bare = {"type": "function", "function": {"name": "ping", "extra": 1}}
    assert check_tools([WEATHER, bare]) == [
        WEATHER,
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    ]
    assert check_tools(None) == []


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        (WEATHER, "tools must be a list of tool objects, got dict"),
        (["get_weather"], r"tools\[0\] must be an object, got str"),
        ([{"type": "code_interpreter"}], r'tools\[0\]\.type must be "function", got \'code_interpreter\''),
        ([{"type": "function"}], r"tools\[0\]\.function must be an object, got NoneType"),
        ([WEATHER, {"type": "function", "function": {"name": "get weather"}}], r"tools\[1\]\.function\.name must be"),
        ([{"type": "function", "function": {"name": "x" * 65}}], r"tools\[0\]\.function\.name must be 1 to 64"),
        ([TIME, TIME], r"tools\[1\]\.function\.name 'get-time' is already the name of tools\[0\]"),
        ([{"type": "function", "function": {"name": "f", "description": 3}}], r"description must be a string"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], r"parameters must be a JSON Schema"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            r'tools\[0\]\.function\.parameters\.type must be "object"',
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"properties": []}}}],
            r"parameters\.properties must be an object",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"required": "a"}}}],
            r"parameters\.required must be a list of property names",
        ),
    ],
)
def test_bad_tools_are_refused_naming_the_tool_and_field(tools, message):
    with pytest.raises(InvalidArgumentError, match=message):
        check_tools(tools)


def test_tool_choice_is_normalized():
    tools = check_tools(TOOLS)
    assert check_tool_choice(None, tools) == "auto"
    assert check_tool_choice(None, []) == "none"
    assert check_tool_choice("auto", []) == "none"
    assert check_tool_choice("required", tools) == "required"
    assert check_tool_choice("none", tools) == "none"
    named = {"type": "function", "function": {"name": "get-time", "description": "ignored"}}
    assert check_tool_choice(named, tools) == {"type": "function", "function": {"name": "get-time"}}


@pytest.mark.parametrize(
    ("choice", "tools", "message"),
    [
        ("any", TOOLS, 'tool_choice must be "none", "auto", "required" or .* got \'any\''),
        ("required", [], 'tool_choice "required" needs tools'),
        ({"type": "function", "function": {"name": "nope"}}, TOOLS, r"'nope' is not one of the tools: \['get_weather'"),
        ({"type": "function"}, TOOLS, "tool_choice must be"),
        ({"function": {"name": "get-time"}}, TOOLS, "tool_choice must be"),
    ],
)
def test_bad_tool_choices_are_refused(choice, tools, message):
    with pytest.raises(InvalidArgumentError, match=message):
        check_tool_choice(choice, check_tools(tools))


# ---- the schema of one call ----


def parsed_call(text: str) -> dict:
    """The JSON object of the one call in `text`, as the model wrote it."""
    _, calls = parse_tool_calls(text)
    return {"name": calls[0]["function"]["name"], "arguments": json.loads(calls[0]["function"]["arguments"])}


def test_the_call_schema_accepts_real_calls_and_rejects_wrong_names():
    jsonschema = pytest.importorskip("jsonschema")
    tools = check_tools(TOOLS)
    schema = tool_call_schema(tools, check_tool_choice("required", tools))
    jsonschema.Draft202012Validator.check_schema(schema)
    weather = parsed_call('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    time = parsed_call('<tool_call>\n{"name": "get-time", "arguments": {"zone": "UTC"}}\n</tool_call>')
    jsonschema.validate(weather, schema)
    jsonschema.validate(time, schema)
    for wrong in (
        {"name": "get_wether", "arguments": {"city": "Oslo"}},  # no such tool
        {"name": "get-time", "arguments": {"city": "Oslo"}},  # another tool's arguments
        {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}},
        {"name": "get_weather"},
        {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "x"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


def test_a_named_choice_allows_only_that_tool():
    jsonschema = pytest.importorskip("jsonschema")
    tools = check_tools(TOOLS)
    schema = tool_call_schema(tools, check_tool_choice({"type": "function", "function": {"name": "get-time"}}, tools))
    assert list(schema["properties"]) == ["name", "arguments"] and schema["required"] == ["name", "arguments"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["arguments"] == TIME["function"]["parameters"]
    jsonschema.validate({"name": "get-time", "arguments": {"zone": "UTC"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, schema)


def test_the_schema_describes_the_text_between_the_tags():
    jsonschema = pytest.importorskip("jsonschema")
    assert (TOOL_CALL_OPEN, TOOL_CALL_CLOSE) == ("<tool_call>", "</tool_call>")
    tools = check_tools([WEATHER])
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    jsonschema.validate(call, tool_call_schema(tools, "auto"))
    content, calls = parse_tool_calls(TOOL_CALL_OPEN + "\n" + json.dumps(call) + "\n" + TOOL_CALL_CLOSE)
    assert content is None and arguments(calls[0]) == call["arguments"]


def test_there_is_no_call_schema_without_a_call_to_make():
    with pytest.raises(InvalidArgumentError, match='tool_choice is "none"'):
        tool_call_schema(check_tools(TOOLS), "none")


# Chat templates of the families, as published (SmolLM2's and Gemma 3's come from their files here);
# none but Qwen2.5's writes tool calls or results itself.
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
ROUND_TRIP = [
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get-time", "arguments": '{"zone": "CET"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
]  # fmt: skip


def family_templates(smollm2_dir: Path, gemma_gguf: Path) -> dict[str, str]:
    from ruvllm.runtime.assembly import open_gguf

    smollm2 = json.loads((smollm2_dir / "tokenizer_config.json").read_text())["chat_template"]
    gemma = open_gguf(str(gemma_gguf)).tokenizer_files(merges=False)[1]["chat_template"]
    return {"smollm2": smollm2, "gemma3": gemma, "qwen2.5": QWEN2_5, "phi3": PHI3, "mistral": MISTRAL}


def test_a_tool_round_trip_renders_in_every_family_s_template(smollm2_dir, gemma_gguf):
    """A call (content null) and its results, as the openai client sends them back: SmolLM2's template
    failed (None + str), Gemma's and Mistral's refused the 'tool' role, Phi-3's dropped it silently.
    A template that does not write them itself gets them in the Hermes convention the calls are parsed in."""
    calls = [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"name": "get-time", "arguments": {"zone": "CET"}}\n</tool_call>',
    ]
    results = "<tool_response>\nSunny, 21 C\n</tool_response>\n<tool_response>\n14:05\n</tool_response>"
    for family, source in family_templates(smollm2_dir, gemma_gguf).items():
        template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
        prompt = template.render(template_messages(ROUND_TRIP), True, TOOLS if family == "qwen2.5" else None)
        assert template.reads_tools == ((True, True) if family == "qwen2.5" else (False, False)), family
        assert "\n".join(calls) in prompt, (family, prompt)  # Qwen2.5's own rendering is the same text
        assert results in prompt, (family, prompt)
        assert prompt.index(calls[0]) < prompt.index(results), family


def test_a_gguf_s_template_is_named_by_its_file_not_a_tokenizer_config_json_it_does_not_have(smollm2_gguf):
    import ruvllm

    model = ruvllm.load(str(smollm2_gguf))
    assert model.tokenizer.chat_template.where == f"the chat_template in {smollm2_gguf} (GGUF metadata)"
