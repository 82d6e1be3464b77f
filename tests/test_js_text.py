"""The npm package's text path (JS: @huggingface/tokenizers + @huggingface/jinja) against the CPython path,
on the tokenizer corpus: same ids, same rendered chat prompts. Generated text is made by the Python
streaming detokenizer in both runtimes (the worker forwards it), checked here on the same corpus."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ruvllm.text.tokenizer import Tokenizer

pytestmark = pytest.mark.parity

NPM = Path(__file__).resolve().parent.parent / "npm"
CORPUS = json.loads((Path(__file__).parent / "data" / "text_corpus.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def js(smollm2_dir):
    assert shutil.which("node"), "node is needed (./build.sh installs the npm package)"
    assert (NPM / "node_modules" / "@huggingface" / "tokenizers").exists(), "run ./build.sh npm first"
    request = json.dumps({"model": str(smollm2_dir), **CORPUS})
    result = subprocess.run(
        ["node", str(NPM / "test" / "support" / "text-cli.mjs")],
        input=request,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def py(smollm2_dir):
    return Tokenizer.from_folder(str(smollm2_dir))


@pytest.mark.parametrize("index", range(len(CORPUS["texts"])))
def test_same_ids_and_text(js, py, index):
    text = CORPUS["texts"][index]
    assert js["ids"][index] == py.encode(text)
    assert js["decoded"][index] == py.decode(py.encode(text)) == text
    detokenizer = py.detokenizer()
    streamed = "".join(detokenizer.add(i) for i in py.encode(text)) + detokenizer.finish()
    assert streamed == text


def test_same_chat_prompts(js, py):
    expected = []
    for messages in CORPUS["conversations"]:
        for add_generation_prompt in (True, False):
            expected.append(
                {
                    "prompt": py.apply_chat_template(messages, add_generation_prompt),
                    "ids": py.encode_chat(messages, add_generation_prompt),
                }
            )
    assert js["chats"] == expected


def test_same_end_of_sequence_ids(js, smollm2):
    assert js["eosIds"] == list(smollm2.eos_token_ids)
