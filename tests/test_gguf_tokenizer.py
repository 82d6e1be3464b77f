"""Tokenizer files written from GGUF metadata in plain Python (files/gguf_vocab.py), against the references.

- Gemma 3 (SentencePiece BPE, merges recovered from the vocabulary): the same tokenizer.json document
  transformers 5.23 builds from the GGUF, the same ids and text on the shared corpus, the same ids in the
  npm package's text path (@huggingface/tokenizers), and the streaming detokenizer gives the decoded text.
- SmolLM2 (byte-level BPE): the same documents the converter writes with the `tokenizers` library.
- Llama-style and Phi-3 SentencePiece vocabularies: small GGUFs written here, against transformers.
- The built-in Gemma chat template renders what Gemma 3's published template renders.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

import gguf
from transformers import AutoTokenizer

from ruvllm.errors import InvalidArgumentError, LoadError
from ruvllm.files.gguf_vocab import GEMMA_CHAT_TEMPLATE, merges_by_position, tokenizer_files
from ruvllm.text.chat_template import ChatTemplate
from ruvllm.text.tokenizer import Tokenizer

pytestmark = pytest.mark.parity

NPM = Path(__file__).resolve().parent.parent / "npm"
_DATA = json.loads((Path(__file__).parent / "data" / "text_corpus.json").read_text(encoding="utf-8"))
CONVERSATIONS: list[list[dict]] = _DATA["conversations"]
# The shared corpus, plus what only Gemma's vocabulary has: its turn markers, user-defined HTML tags and runs
# of newlines/tabs/spaces, unused control tokens, a word longer than any cache, the `▁` it uses for spaces.
TEXTS: list[str] = [
    *_DATA["texts"],
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<table><tr><td>x</td></tr></table> <h1>Title</h1>",
    "a\n\n\n\tb  c     d\t\t\te",
    "<bos>text<eos><mask>[multimodal]<unused5><pad>",
    "a ▁ b ▁▁c",
    "x" * 300,
]

# Gemma 3's chat template as published with the model (google/gemma-3-*-it, tokenizer_config.json).
OFFICIAL_GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


def read_metadata(path: Path) -> dict[str, object]:
    return {name: field.contents() for name, field in gguf.GGUFReader(path).fields.items()}


@pytest.fixture(scope="module")
def gemma_metadata(gemma_gguf) -> dict[str, object]:
    return read_metadata(gemma_gguf)


@pytest.fixture(scope="module")
def gemma_files(gemma_metadata):
    start = time.perf_counter()
    files = tokenizer_files(gemma_metadata, "gemma.gguf")
    return files, time.perf_counter() - start


@pytest.fixture(scope="module")
def gemma(gemma_files) -> Tokenizer:
    (tokenizer_json, tokenizer_config, _), _ = gemma_files
    return Tokenizer(json.dumps(tokenizer_json), tokenizer_config)


@pytest.fixture(scope="module")
def gemma_reference(gemma_transformers_tokenizer):
    return gemma_transformers_tokenizer


@pytest.fixture(scope="module")
def gemma_js(gemma_files, tmp_path_factory):
    assert shutil.which("node"), "node is needed (./build.sh installs the npm package)"
    assert (NPM / "node_modules" / "@huggingface" / "tokenizers").exists(), "run ./build.sh npm first"
    (tokenizer_json, tokenizer_config, generation_config), _ = gemma_files
    path = tmp_path_factory.mktemp("gemma") / "tokenizer.json"
    path.write_text(json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8")
    request = {
        "tokenizerPath": str(path),
        "tokenizerConfig": tokenizer_config,
        "generationConfig": generation_config,
        "texts": TEXTS,
        "conversations": CONVERSATIONS,
    }
    result = subprocess.run(
        ["node", str(NPM / "test" / "support" / "text-cli.mjs")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


# --- Gemma 3 against transformers ------------------------------------------------------------------------


def test_gemma_tokenizer_json_is_the_document_transformers_builds(gemma_files, gemma_reference):
    (tokenizer_json, _, _), _ = gemma_files
    assert tokenizer_json == json.loads(gemma_reference.backend_tokenizer.to_str())


@pytest.mark.parametrize("text", TEXTS)
def test_gemma_ids_and_text_match_transformers(gemma, gemma_reference, text):
    ids = gemma.encode(text)
    assert ids == gemma_reference.encode(text)
    assert gemma.encode(text, add_special_tokens=False) == gemma_reference.encode(text, add_special_tokens=False)
    assert gemma.decode(ids) == gemma_reference.decode(ids)


@pytest.mark.parametrize("text", TEXTS)
def test_gemma_streamed_text_is_the_decoded_text(gemma, text):
    ids = gemma.encode(text, add_special_tokens=False)
    detokenizer = gemma.detokenizer()
    streamed = "".join(detokenizer.add(i) for i in ids) + detokenizer.finish()
    assert streamed == gemma.decode(ids)
    # SentencePiece spells a space `▁`, so a `▁` in the text comes back as a space (in transformers too).
    assert streamed == text.replace("\u2581", " ")


def test_gemma_config_files(gemma_files, gemma):
    (_, tokenizer_config, generation_config), _ = gemma_files
    assert generation_config == {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}
    assert gemma.special_tokens == {
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
    }
    assert tokenizer_config["add_bos_token"] is True and tokenizer_config["add_eos_token"] is False
    # This GGUF carries no template: the built-in one, marked as such.
    assert tokenizer_config["chat_template"] == GEMMA_CHAT_TEMPLATE
    assert tokenizer_config["chat_template_source"] == "built-in gemma"
    assert gemma.token_id("<end_of_turn>") == 106


def test_gemma_merges_are_derived(gemma_metadata, gemma_files):
    tokens = gemma_metadata["tokenizer.ggml.tokens"]
    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = merges_by_position(tokens, vocab)
    assert len(merges) == 514_906  # (their time: benchmarks/gguf_bench.py)


# --- Gemma 3 in JavaScript -------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(TEXTS)))
def test_gemma_js_library_gives_the_same_ids(gemma_js, gemma, index):
    text = TEXTS[index]
    assert gemma_js["libraryIds"][index] == gemma.encode(text)
    assert gemma_js["plainIds"][index] == gemma.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("index", [i for i, text in enumerate(TEXTS) if text])
def test_gemma_js_text_path_gives_the_same_ids_and_text(gemma_js, gemma, index):
    ids = gemma.encode(TEXTS[index])
    assert gemma_js["ids"][index] == ids
    assert gemma_js["decoded"][index] == gemma.decode(ids)


def test_gemma_js_text_path_adds_bos_to_an_empty_text(gemma_js, gemma):
    # @huggingface/tokenizers itself gives [2] (test_gemma_js_library_gives_the_same_ids); createText does not ask it.
    assert gemma_js["ids"][TEXTS.index("")] == gemma.encode("") == [2]


def test_gemma_js_chat_prompts_and_end_ids(gemma_js, gemma):
    expected = [
        {"prompt": gemma.apply_chat_template(messages, add), "ids": gemma.encode_chat(messages, add)}
        for messages in CONVERSATIONS
        for add in (True, False)
    ]
    assert gemma_js["chats"] == expected
    assert gemma_js["eosIds"] == [1, 106]


# --- the built-in Gemma chat template --------------------------------------------------------------------

GEMMA_CONVERSATIONS = [
    *CONVERSATIONS,
    [
        {"role": "system", "content": "  Answer in French.\n"},
        {"role": "user", "content": "\n Hello  "},
        {"role": "assistant", "content": "Bonjour !\n\n"},
        {"role": "user", "content": "Thanks"},
    ],
    [{"role": "system", "content": "Only a system message."}],
]


@pytest.mark.parametrize("messages", GEMMA_CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_builtin_gemma_template_renders_what_the_published_one_does(messages, add_generation_prompt):
    special = {"bos_token": "<bos>", "eos_token": "<eos>"}
    ours = ChatTemplate(GEMMA_CHAT_TEMPLATE, special).render(messages, add_generation_prompt)
    official = ChatTemplate(OFFICIAL_GEMMA3_TEMPLATE, special).render(messages, add_generation_prompt)
    assert ours == official


def test_builtin_gemma_template_writes_gemma_turns(gemma):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert gemma.apply_chat_template(messages) == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert gemma.encode_chat(messages)[:3] == [2, 105, gemma.token_id("user")]


@pytest.mark.parametrize("template", [GEMMA_CHAT_TEMPLATE, OFFICIAL_GEMMA3_TEMPLATE])
def test_gemma_templates_refuse_turns_out_of_order(template):
    messages = [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Hello"}]
    with pytest.raises(InvalidArgumentError, match="alternate"):
        ChatTemplate(template, {"bos_token": "<bos>"}).render(messages)


# --- SmolLM2 against the converter -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_metadata(smollm2_gguf) -> dict[str, object]:
    return read_metadata(smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_files(smollm2_metadata):
    return tokenizer_files(smollm2_metadata, "smollm2.gguf")


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_files, smollm2_dir) -> tuple[Tokenizer, Tokenizer]:
    """(ours, the converted folder's)"""
    tokenizer_json, tokenizer_config, _ = smollm2_files
    return Tokenizer(json.dumps(tokenizer_json), tokenizer_config), Tokenizer.from_folder(str(smollm2_dir))


def test_smollm2_documents_are_the_converters(smollm2_files, smollm2_dir):
    tokenizer_json, tokenizer_config, generation_config = smollm2_files
    converted = {
        name: json.loads((smollm2_dir / f"{name}.json").read_text(encoding="utf-8"))
        for name in ("tokenizer", "tokenizer_config", "generation_config")
    }
    assert tokenizer_json == converted["tokenizer"]
    assert tokenizer_config == {k: v for k, v in converted["tokenizer_config"].items() if k != "model_max_length"}
    assert generation_config == converted["generation_config"]


@pytest.mark.parametrize(
    ("pre", "add_bos", "add_eos"),
    [("smollm", True, False), ("llama-bpe", False, True), ("qwen2", True, True), ("default", None, None)],
)
def test_byte_level_bos_and_eos_flags_are_applied_for_each_split(smollm2_metadata, pre, add_bos, add_eos):
    flags = {
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.ggml.add_eos_token": add_eos,
    }
    metadata = {k: v for k, v in {**smollm2_metadata, **flags}.items() if v is not None}
    tokenizer_json, tokenizer_config, _ = tokenizer_files(metadata, "smollm2.gguf")
    ours = Tokenizer(json.dumps(tokenizer_json), tokenizer_config)
    plain = ours.encode("Hello world 12", add_special_tokens=False)
    bos, eos = metadata["tokenizer.ggml.bos_token_id"], metadata["tokenizer.ggml.eos_token_id"]
    assert ours.encode("Hello world 12") == [bos] * bool(add_bos) + plain + [eos] * bool(add_eos)
    assert (tokenizer_config["add_bos_token"], tokenizer_config["add_eos_token"]) == (bool(add_bos), bool(add_eos))


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_ids_are_the_converted_folders(smollm2_pair, text):
    ours, folder = smollm2_pair
    assert ours.encode(text) == folder.encode(text)
    assert ours.decode(ours.encode(text)) == text


# --- other SentencePiece vocabularies, against transformers ----------------------------------------------


def write_sentencepiece_gguf(path: Path, architecture: str, metadata: dict, size: int, add_bos: bool | None) -> None:
    """A GGUF holding the first `size` tokens of Gemma's vocabulary (real SentencePiece pieces and scores),
    with `<s>`/`</s>` spelled at ids 2/1 as Llama does -- Gemma has those texts again at 203/212, so a
    repeated spelling is covered too -- and the smallest model metadata transformers reads."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(8)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    tokens = metadata["tokenizer.ggml.tokens"][:size]
    tokens[1], tokens[2] = "</s>", "<s>"
    writer.add_token_list(tokens)
    writer.add_token_scores(metadata["tokenizer.ggml.scores"][:size])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"][:size])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_tensor("token_embd.weight", np.zeros((size, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(("architecture", "add_bos"), [("llama", None), ("phi3", True), ("mistral", False)])
def test_sentencepiece_tokenizer_json_is_the_document_transformers_builds(
    gemma_metadata, tmp_path, architecture, add_bos
):
    path = tmp_path / f"{architecture}.gguf"
    write_sentencepiece_gguf(path, architecture, gemma_metadata, 12_000, add_bos)
    tokenizer_json, tokenizer_config, _ = tokenizer_files(read_metadata(path), str(path))
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert tokenizer_json == json.loads(reference.backend_tokenizer.to_str())
    assert tokenizer_config["add_bos_token"] is (add_bos is not False)
    ours = Tokenizer(json.dumps(tokenizer_json), tokenizer_config)
    for text in ("  Hello world", "<s>two <unk> words</s>", "naïve\tcafé"):
        assert ours.encode(text) == reference.encode(text)


# --- metadata that cannot be used ------------------------------------------------------------------------


def small_metadata(**tokenizer: object) -> dict[str, object]:
    keys = {"model": "gpt2", "tokens": ["a", "b", "ab"], "merges": ["a b"], "bos_token_id": 0, **tokenizer}
    return {"general.architecture": "llama", **{f"tokenizer.ggml.{k}": v for k, v in keys.items() if v is not None}}


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        ({"model": "t5"}, r"tokenizer.ggml.model 't5' is not supported; supported: gpt2 .*llama"),
        ({"model": "rwkv"}, r"tokenizer.ggml.model 'rwkv' is not supported"),
        ({"model": None}, r"tokenizer.ggml.model must be a string"),
        ({"tokens": []}, r"tokenizer.ggml.tokens must be a non-empty list of strings"),
        ({"tokens": ["a", 2]}, r"tokenizer.ggml.tokens must be a non-empty list of strings"),
        ({"token_type": [1, 1]}, r"tokenizer.ggml.token_type has 2 entries, tokenizer.ggml.tokens has 3"),
        ({"bos_token_id": 3}, r"tokenizer.ggml.bos_token_id must be a token id \(an integer from 0 to 2\)"),
        ({"eos_token_id": True}, r"tokenizer.ggml.eos_token_id must be a token id"),
        ({"add_bos_token": 1}, r"tokenizer.ggml.add_bos_token must be true or false"),
        ({"pre": "tekken"}, r"tokenizer.ggml.pre 'tekken' is not supported; supported: default"),
        ({"merges": None}, r"no tokenizer.ggml.merges"),
        ({"merges": ["ab"]}, r"tokenizer.ggml.merges\[0\] 'ab' is not 'left right'"),
        ({"merges": ["b a"]}, r"tokenizer.ggml.merges\[0\] 'b a' names 'ba', which is not in tokenizer.ggml.tokens"),
        ({"model": "llama", "merges": None}, r"neither tokenizer.ggml.merges nor tokenizer.ggml.scores"),
        ({"model": "llama", "pre": "llama-bpe"}, r"tokenizer.ggml.pre 'llama-bpe' .* does not go with"),
    ],
)
def test_unusable_metadata_is_a_load_error_naming_file_and_key(tokenizer, message):
    with pytest.raises(LoadError, match=rf"^model\.gguf: .*{message}"):
        tokenizer_files(small_metadata(**tokenizer), "model.gguf")
