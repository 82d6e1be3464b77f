"""Chat templates are untrusted code: hostile ones end, within bounds, in an error naming the template.

The cases (tests/data/hostile_templates.json) are shared with the JavaScript test
(npm/test/chat-template.test.js). They run in a child process with a timeout, so a template that
hangs fails this test instead of hanging the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jinja2")  # the `text` extra: every test here renders a template

from ruvllm.errors import InvalidArgumentError, LoadError
from ruvllm.text.chat_template import ChatTemplate

CASES = json.loads((Path(__file__).parent / "data" / "hostile_templates.json").read_text())["cases"]
MESSAGES = [{"role": "user", "content": "hi"}]
RENDER_ALL = """
import json, sys
from ruvllm.text.chat_template import ChatTemplate
from ruvllm.errors import RuvLLMError
results = []
for case in json.load(sys.stdin):
    try:
        ChatTemplate(case["template"], {}, "models/x/tokenizer_config.json").render([{"role": "user", "content": "hi"}])
        results.append({"type": None, "message": "rendered"})
    except RuvLLMError as e:
        results.append({"type": e.type, "message": e.message})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict]:
    """Every hostile case rendered in one child process (a hang would fail here, after 120 s)."""
    done = subprocess.run(
        [sys.executable, "-c", RENDER_ALL], input=json.dumps(CASES), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return {case["name"]: result for case, result in zip(CASES, json.loads(done.stdout), strict=True)}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_hostile_template_fails_cleanly_naming_the_template(case, outcomes):
    result = outcomes[case["name"]]
    assert result["type"] == case["type"], result
    assert case["python"] in result["message"], result["message"]
    if case["type"] == "load":
        assert result["message"].startswith("the chat_template in models/x/tokenizer_config.json fails: ")


def test_a_template_that_does_not_parse_is_a_load_error():
    with pytest.raises(LoadError, match=r"^the chat_template in t/tokenizer_config.json does not parse: "):
        ChatTemplate("{% for %}", {}, "t/tokenizer_config.json")


def test_bounds_leave_ordinary_templates_alone():
    template = ChatTemplate(
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ '%s: %s' % (m['role'], m['content']) }}|{{ m | tojson }}{% endfor %}{{ ns.n }}{{ '{:>4}'.format(7) }}",
        {},
    )
    assert template.render(MESSAGES) == 'user: hi|{"role": "user", "content": "hi"}1   7'


def test_a_chat_with_a_hostile_template_is_a_load_error_naming_the_file(smollm2_dir, tmp_path):
    import ruvllm

    for name in ("config.json", "tokenizer.json", "model.safetensors", "generation_config.json"):
        (tmp_path / name).symlink_to(smollm2_dir / name)
    config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ 'x' * 10**9 }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    model = ruvllm.load(str(tmp_path))
    with pytest.raises(LoadError, match=r"tokenizer_config.json fails: repeated a value of 1 items 1000000000 times"):
        model.chat(MESSAGES)
    with pytest.raises(InvalidArgumentError, match="messages must be a non-empty list"):
        model.chat([])
