"""The plain-Python tokenizer (text/pure_tokenizer.py: what runs where `tokenizers` has no build, as in
Pyodide) against Hugging Face `tokenizers` on the same tokenizer.json, id for id, for every family we run:

- SmolLM2's own tokenizer.json (byte-level BPE, its digits split first) and the one written from its GGUF;
- the byte-level splits a GGUF may name (Llama 3's, Qwen2's, GPT-2's) over SmolLM2's vocabulary;
- Gemma 3's (SentencePiece BPE with byte fallback, 262k tokens, ~6k added tokens) from its GGUF;
- Llama-, Mistral- and Phi-3-style SentencePiece documents (Metaspace / Prepend) from a slice of Gemma's vocabulary.

Texts: the shared corpus, Gemma's extras and adversarial ones (numerals of other scripts, combining marks,
emoji sequences, CJK, runs of whitespace, \\r\\n, tabs, look-alikes of special tokens, long words).
Then generation and chat end to end with `tokenizers` made unimportable.
"""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ruvllm.errors import LoadError
from ruvllm.files.gguf_vocab import _BYTE_LEVEL_PRE, tokenizer_files
from ruvllm.runtime.assembly import open_gguf
from ruvllm.text import pretokenize
from ruvllm.text.pure_tokenizer import PureTokenizer
from ruvllm.text.tokenizer import Tokenizer

from conftest import numpy_model

tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.parity

ROOT = Path(__file__).resolve().parent.parent
_DATA = json.loads((Path(__file__).parent / "data" / "text_corpus.json").read_text(encoding="utf-8"))
ADVERSARIAL = [
    # Gemma's own: turn markers, user-defined HTML tags and whitespace runs, control tokens, its `▁`.
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<table><tr><td>x</td></tr></table> <h1>Title</h1>",
    "a\n\n\n\tb  c     d\t\t\te",
    "<bos>text<eos><mask>[multimodal]<unused5><pad>",
    "a ▁ b ▁▁c",
    "▁▁▁hello▁▁world ▁",
    ">▁</x>▁<0x41> >\u2581",
    # numerals of other scripts, one by one and in runs
    "१२३ ٣٤٥ ০১ 𝟙𝟚𝟛 ⅷ Ⅻ ① ² ³ ½ 〇 一二三 12३4",
    # combining marks, precomposed and not; zero-width joiners and spaces
    "e\u0301\u0302 ã̀ 한\u1100\u1161 Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ x\u200dy\u200bz",
    "👍🏽👩‍👩‍👧‍👦🏳️‍🌈🇫🇷🇯🇵 ✈️ ☕ 🫠",
    "漢字かなカナ한국어 中文，标点！「引用」 ｆｕｌｌｗｉｄｔｈ",
    "   \r\n\r\n \t\n  x  \n\n\n",
    "tabs\t\t\tand\u3000ideographic\u2028line\u2029para\x0b\x0c\x1c\x1f\x85 end",
    "<|im_start|><|im_start|>|im_end|><<|im_end|>> <|im_start <|endoftext|x <unused99999> <start_of_turn",
    "don't can't WON'T y'all I'd 'ſ 'S 'LL 'Ve it's' ''s",
    "snake_case __dunder__ a_1 _",
    "a" * 1000 + " " + "ab" * 500,
    "你好" * 200,
    "x" * 300,
    "supercalifragilisticexpialidocious-antidisestablishmentarianism_" * 8,
    "\ufffd\U0010ffff\ue000 \u00ad soft\u00adhyphen",
]
TEXTS: list[str] = [*_DATA["texts"], *ADVERSARIAL]


def assert_same_ids(document: dict, texts: list[str] = TEXTS, reference_document: dict | None = None) -> None:
    reference = tokenizers.Tokenizer.from_str(json.dumps(reference_document or document))
    ours = PureTokenizer(document)
    for text in texts:
        for add_special_tokens in (True, False):
            expected = reference.encode(text, add_special_tokens=add_special_tokens).ids
            assert ours.encode(text, add_special_tokens) == expected, (text, add_special_tokens)


@pytest.fixture(scope="module")
def smollm2_document(smollm2_dir) -> dict:
    return json.loads((smollm2_dir / "tokenizer.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def smollm2_gguf_document(smollm2_gguf) -> dict:
    return open_gguf(str(smollm2_gguf)).tokenizer_files()[0]


@pytest.fixture(scope="module")
def gemma_metadata(gemma_gguf) -> dict:
    return open_gguf(str(gemma_gguf)).metadata


def test_smollm2_folder_gives_the_ids_of_tokenizers(smollm2_document):
    assert_same_ids(smollm2_document)


def test_smollm2_gguf_gives_the_ids_of_tokenizers(smollm2_gguf_document):
    assert_same_ids(smollm2_gguf_document)


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt2"])
def test_byte_level_splits_give_the_ids_of_tokenizers(smollm2_gguf_document, pre):
    assert_same_ids({**smollm2_gguf_document, "pre_tokenizer": _BYTE_LEVEL_PRE[pre]})


@pytest.fixture(scope="module")
def gemma_document(gemma_metadata) -> dict:
    return tokenizer_files(gemma_metadata, "gemma.gguf")[0]


def test_gemma_gives_the_ids_of_tokenizers(gemma_document):
    assert_same_ids(gemma_document)


def test_gemma_without_its_merges_list_gives_the_same_ids(gemma_metadata, gemma_document):
    """Gemma's merges ranked by position as BPE asks for them, never listed (the load without `tokenizers`)."""
    document = tokenizer_files(gemma_metadata, "gemma.gguf", merges=False)[0]
    assert document["model"]["merges"] == [] and document["model"]["merges_by_position"] is True
    assert {k: v for k, v in document["model"].items() if k not in ("merges", "merges_by_position")} == {
        k: v for k, v in gemma_document["model"].items() if k != "merges"
    }
    assert_same_ids(document, reference_document=gemma_document)
    # `tokenizers` cannot read it (no merges): Tokenizer runs it in plain Python even where `tokenizers` is installed.
    tokenizer, with_it = Tokenizer(document, {}), Tokenizer(gemma_document, {})
    assert tokenizer._pure is not None and with_it._pure is None and tokenizer.encode("Hello") == [2, 9259]
    for text in TEXTS:
        ids = with_it.encode(text)
        assert tokenizer.decode(ids) == with_it.decode(ids), text


@pytest.mark.parametrize("architecture", ["llama", "mistral", "phi3"])
def test_sentencepiece_styles_give_the_ids_of_tokenizers(gemma_metadata, architecture):
    """Metaspace with prepend_scheme "first" (Llama, Mistral) and the Prepend normalizer (Phi-3), on the first
    12,000 tokens of Gemma's vocabulary with `<s>`/`</s>` at 2/1, as Llama spells them."""
    size = 12_000
    tokens = list(gemma_metadata["tokenizer.ggml.tokens"][:size])
    tokens[1], tokens[2] = "</s>", "<s>"
    metadata = {
        "general.architecture": architecture,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": list(gemma_metadata["tokenizer.ggml.scores"][:size]),
        "tokenizer.ggml.token_type": list(gemma_metadata["tokenizer.ggml.token_type"][:size]),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
    }
    document = tokenizer_files(metadata, f"{architecture}.gguf")[0]
    assert_same_ids(document, [*TEXTS, "  Hello world", "<s>two <unk> words</s>", "</s> x", "naïve\tcafé"])


def random_texts(count: int, seed: int) -> list[str]:
    """Texts made of what tokenizers trip on: apostrophes and contraction letters, whitespace of every kind,
    numerals, marks, special-token look-alikes, and characters from many blocks (astral ones too)."""
    rng = random.Random(seed)
    pool = [*" \t\n\r\x0b\x0c\x85\xa0\u2028\u3000aAsStTeErRvVmMlLdD'’ſ_-.,!?0123456789½²٣१①Ⅻ▁"]
    pool += ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<eos>", "'s", "'LL", "\r\n", "<0x41>", "<unk>", "\n\n\n"]
    blocks = [(0x20, 0x7F), (0xA0, 0x250), (0x300, 0x370), (0x370, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F)]
    blocks += [(0x1100, 0x11FF), (0x2000, 0x206F), (0x2150, 0x24FF), (0x3000, 0x30FF), (0x4E00, 0x4FFF)]
    blocks += [(0xAC00, 0xACFF), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF), (0x1D400, 0x1D7FF)]

    def one() -> str:
        if rng.random() < 0.5:
            return rng.choice(pool)
        low, high = rng.choice(blocks)
        return chr(rng.randrange(low, high))

    return ["".join(one() for _ in range(rng.randint(1, 40))) for _ in range(count)]


@pytest.mark.parametrize("family", ["smollm2", "llama-bpe", "qwen2", "gpt2", "gemma3"])
def test_random_texts_give_the_ids_of_tokenizers(family, request):
    if family == "smollm2":
        document = request.getfixturevalue("smollm2_document")
    elif family == "gemma3":
        document = request.getfixturevalue("gemma_document")
    else:
        document = {**request.getfixturevalue("smollm2_gguf_document"), "pre_tokenizer": _BYTE_LEVEL_PRE[family]}
    assert_same_ids(document, random_texts(300, seed=len(family)))


def _added(index: int, content: str, **flags: bool) -> dict:
    token = {"id": index, "content": content, "single_word": False, "lstrip": False, "rstrip": False}
    return {**token, "normalized": False, "special": False, **flags}


def _byte_level(prefix: bool, regex: bool = True) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": prefix, "use_regex": regex, "trim_offsets": True}


def _split(pattern: dict, behavior: str, invert: bool = False) -> dict:
    split = {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}
    return {"type": "Sequence", "pretokenizers": [split, _byte_level(False, regex=False)]}


# Components our families do not use, on SmolLM2's vocabulary: (normalizer, pre-tokenizer or None for
# SmolLM2's, added tokens beyond id 49151).
OTHER_COMPONENTS = {
    "lowercase, a normalized added token": (
        {"type": "Lowercase"},
        None,
        [_added(49152, "Qqzhello", normalized=True), _added(49153, "WORLDQQ")],
    ),
    "NFKC": ({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "NFC"}]}, None, []),
    "lstrip, rstrip, single_word": (
        None,
        None,
        [_added(49152, "<mark>", lstrip=True, rstrip=True, special=True), _added(49153, "qqz", single_word=True)],
    ),
    "Strip and Prepend": (
        {
            "type": "Sequence",
            "normalizers": [
                {"type": "Strip", "strip_left": True, "strip_right": False},
                {"type": "Prepend", "prepend": "Ġ"},
            ],
        },
        None,
        [],
    ),
    "Replace by regex": ({"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "}, None, []),
    "Metaspace always, split": (None, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}, []),
    "Digits in runs, ByteLevel prefix": (
        None,
        {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": False}, _byte_level(True)]},
        [],
    ),
    "Split removed, inverted": (None, _split({"Regex": r"\s+"}, "Removed", invert=True), []),
    "Split contiguous": (None, _split({"String": "a"}, "Contiguous"), []),
    "Split merged with next": (None, _split({"Regex": "[.,!?]"}, "MergedWithNext"), []),
    "Split merged with previous": (None, _split({"Regex": r"\p{N}"}, "MergedWithPrevious"), []),
}
OTHER_TEXTS = [
    *TEXTS,
    "QqzHello qqzhello WORLDQQ worldqq",
    "  <mark>  x <mark>y",
    "a qqz b. qqz, qqzqqz xqqz qqz_ qqz1 (qqz)",
    "ﬁne ﬁ ＡＢＣ ① x²",
    "aaa baaa ab a",
]


@pytest.mark.parametrize("name", OTHER_COMPONENTS)
def test_other_components_give_the_ids_of_tokenizers(smollm2_document, name):
    normalizer, pre_tokenizer, added = OTHER_COMPONENTS[name]
    vocab = {**smollm2_document["model"]["vocab"], **{t["content"]: t["id"] for t in added}}
    document = {
        **smollm2_document,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer or smollm2_document["pre_tokenizer"],
        "added_tokens": [*smollm2_document["added_tokens"], *added],
        "model": {**smollm2_document["model"], "vocab": vocab},
    }
    assert_same_ids(document, OTHER_TEXTS)


PROCESSORS = {
    "Llama 3's": {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
            },
        ],
    },
    "BOS and EOS": {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
            "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]},
        },
    },
    "Roberta": {"type": "RobertaProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1]},
}


@pytest.mark.parametrize("name", PROCESSORS)
@pytest.mark.parametrize("ignore_merges", [False, True])
def test_post_processors_and_ignore_merges_give_the_ids_of_tokenizers(smollm2_document, name, ignore_merges):
    model = {**smollm2_document["model"], "ignore_merges": ignore_merges}
    document = {**smollm2_document, "post_processor": PROCESSORS[name], "model": model}
    assert_same_ids(document, _DATA["texts"])


def _truncation(direction: str) -> dict:
    return {"direction": direction, "max_length": 7, "strategy": "LongestFirst", "stride": 0}


def _padding(strategy: object, direction: str, multiple: int | None) -> dict:
    padding = {"strategy": strategy, "direction": direction, "pad_to_multiple_of": multiple, "pad_id": 0}
    return {**padding, "pad_type_id": 0, "pad_token": "<|endoftext|>"}


@pytest.mark.parametrize(
    ("truncation", "padding"),
    [
        (_truncation("Right"), None),
        (_truncation("Left"), None),
        (None, _padding({"Fixed": 40}, "Right", None)),
        (None, _padding("BatchLongest", "Left", 8)),
        (_truncation("Left"), _padding({"Fixed": 9}, "Left", 4)),
    ],
)
def test_truncation_and_padding_give_the_ids_of_tokenizers(smollm2_document, truncation, padding):
    post_processor = PROCESSORS["BOS and EOS"]
    document = {**smollm2_document, "truncation": truncation, "padding": padding, "post_processor": post_processor}
    assert_same_ids(document, _DATA["texts"])


def test_tokenizer_without_tokenizers_is_the_tokenizer_with_it(smollm2_dir, monkeypatch):
    """Tokenizer itself, `tokenizers` unimportable: ids, decoded text, token ids, chat ids as with it."""
    with_it = Tokenizer.from_folder(str(smollm2_dir))
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` fails
    without = Tokenizer.from_folder(str(smollm2_dir))
    assert with_it._pure is None and without._pure is not None
    for text in TEXTS:
        ids = with_it.encode(text)
        assert without.encode(text) == ids and without.decode(ids) == with_it.decode(ids)
    for name in ("<|im_start|>", "<|im_end|>", "hello", "Ġworld", "not a token"):
        assert without.token_id(name) == with_it.token_id(name)
    for messages in _DATA["conversations"]:
        assert without.encode_chat(messages) == with_it.encode_chat(messages)


def test_the_regex_module_gives_the_same_ids(smollm2_gguf_document, monkeypatch):
    """Where a pattern cannot run on the stand-in, the `regex` module runs it on the text: same ids."""
    pytest.importorskip("regex")
    monkeypatch.setattr(pretokenize, "translate_pattern", lambda pattern: None)
    for pre in ("smollm", "llama-bpe", "qwen2"):
        assert_same_ids({**smollm2_gguf_document, "pre_tokenizer": _BYTE_LEVEL_PRE[pre]}, _DATA["texts"][:12])


def test_our_families_patterns_need_only_the_standard_library():
    for pattern in (pretokenize.GPT2_PATTERN, *(p for p in _split_patterns())):
        assert pretokenize.translate_pattern(pattern) is not None, pattern


def _split_patterns() -> list[str]:
    found = []
    for spec in _BYTE_LEVEL_PRE.values():
        for step in spec.get("pretokenizers", []):
            if step["type"] == "Split":
                found.append(step["pattern"]["Regex"])
    return found


def test_the_stand_in_keeps_letters_and_classes_the_rest():
    assert pretokenize.stand_in("Aé 3½_\u3000\x1c,\n") == "Aé 00\x00\t\x00,\n"


# --- documents that cannot run without `tokenizers` ----------------------------------------------------


def small_document(**changes: object) -> dict:
    document = {
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
    }
    for key, value in changes.items():
        if key in ("vocab", "merges", "type", "unk_token", "continuing_subword_prefix"):
            document["model"][key] = value  # type: ignore[index]
        else:
            document[key] = value
    return document


def test_a_small_document_merges():
    assert PureTokenizer(small_document()).encode("abab ba") == [2, 2, 1, 0]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"type": "WordPiece"}, r"model type 'WordPiece' needs the `tokenizers` package \(only BPE"),
        ({"type": "Unigram"}, r"model type 'Unigram' needs the `tokenizers` package"),
        ({"vocab": ["a"]}, r"model.vocab must be an object of token -> id"),
        ({"merges": {"a": "b"}}, r"model.merges must be a list"),
        ({"merges": ["a b c"]}, r"model.merges: 'a b c' is not a pair of tokens"),
        ({"merges": [3]}, r"model.merges must hold 'left right' strings or \[left, right\] pairs"),
        ({"merges": ["a b", ["a", "b"]]}, r"model.merges must hold 'left right' strings or \[left, right\] pairs"),
        ({"unk_token": "<unk>"}, r"model.unk_token '<unk>' is not in model.vocab"),
        ({"continuing_subword_prefix": "##"}, r"model.continuing_subword_prefix is not supported without"),
        ({"pre_tokenizer": {"type": "Whitespace"}}, r"pre_tokenizer: type 'Whitespace' is not supported without"),
        ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Around"}}, r"behavior must be"),
        ({"pre_tokenizer": {"type": "Split", "pattern": "x", "behavior": "Isolated"}}, r'pattern must be \{"String"'),
        ({"normalizer": {"type": "BertNormalizer"}}, r"normalizer: 'BertNormalizer' is not supported without"),
        ({"normalizer": "NFC"}, r"normalizer must be an object with a type, found 'NFC'"),
        ({"post_processor": {"type": "Custom"}}, r"post_processor: type 'Custom' is not supported without"),
        (
            {"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}]}},
            r"the template names '<s>', which special_tokens does not give ids for",
        ),
        ({"added_tokens": [{"id": "1", "content": "a"}]}, r"added_tokens must be a list of \{id, content, ...\}"),
        ({"truncation": {"max_length": -1}}, r'truncation must be null or \{"max_length": a count, "direction"'),
        ({"padding": {"strategy": "Longest"}}, r'padding must be null or \{"strategy": "BatchLongest" or'),
    ],
)
def test_a_document_it_cannot_run_is_a_load_error(changes, message):
    with pytest.raises(LoadError, match=rf"^model.json: .*{message}"):
        PureTokenizer(small_document(**changes), "model.json")


def test_a_pattern_beyond_the_stand_in_needs_the_regex_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "regex", None)  # `import regex` fails
    split = {"type": "Split", "pattern": {"Regex": r"\p{Lu}+"}, "behavior": "Isolated", "invert": False}
    with pytest.raises(LoadError, match=r"split pattern '\\\\p\{Lu\}\+' needs the `regex` package"):
        PureTokenizer(small_document(pre_tokenizer=split), "model.json")


def test_a_merge_outside_the_vocabulary_is_a_load_error():
    ours = PureTokenizer(small_document(merges=[["b", "a"]]), "model.json")
    with pytest.raises(LoadError, match=r"model.json: a merge makes 'ba', which is not in model.vocab"):
        ours.encode("ba")


# --- the whole stack with `tokenizers` unimportable ----------------------------------------------------


# The start of a script run by another Python: `tokenizers` cannot be imported there.
BLOCK_TOKENIZERS = """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "tokenizers":
                    raise ImportError("blocked: " + name)

        sys.meta_path.insert(0, Block())
"""


def test_generation_and_chat_run_without_tokenizers(tmp_path, smollm2_dir, smollm2_document):
    """A tiny model with SmolLM2's tokenizer, loaded and chatted with in an interpreter that cannot import
    `tokenizers`: the same prompt ids as `tokenizers` gives, text streamed back."""
    folder = numpy_model("llama", tmp_path / "m", vocab_size=len(smollm2_document["model"]["vocab"]))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((smollm2_dir / name).read_bytes())
    messages = [{"role": "user", "content": "What is 2+2? Answer in 12 words, ½ a line."}]
    reference = Tokenizer.from_folder(str(folder))
    expected = {"chat": reference.encode_chat(messages), "text": reference.encode("Hello, world! 12345")}
    script = (
        BLOCK_TOKENIZERS
        + f"""
        import json, ruvllm

        model = ruvllm.load({str(folder)!r})
        assert model.tokenizer._pure is not None
        chunks = list(model.chat({messages!r}, max_tokens=5, seed=1))
        assert chunks[-1].finish_reason == "length" and all(isinstance(c.text, str) for c in chunks)
        completion = model.create_completion("Hello, world! 12345", max_tokens=3, seed=1)
        assert completion["usage"]["completion_tokens"] == 3
        text_ids = model.tokenizer.encode("Hello, world! 12345")
        ids = {{"chat": model.tokenizer.encode_chat({messages!r}), "text": text_ids}}
        assert "tokenizers" not in sys.modules
        print(json.dumps(ids))
        """
    )
    command = [sys.executable, "-c", textwrap.dedent(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)  # (a hang guard)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected


def test_a_gemma_gguf_loads_and_chats_without_tokenizers(gemma_gguf):
    """ruvllm.load of Gemma's GGUF with `tokenizers` unimportable: its merges are never listed, and the chat
    prompt has the ids `tokenizers` gives."""
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word, 1 2 3."}]
    reference = Tokenizer(*open_gguf(str(gemma_gguf)).tokenizer_files()[:2])
    script = (
        BLOCK_TOKENIZERS
        + f"""
        import json, ruvllm

        model = ruvllm.load({str(gemma_gguf)!r})
        assert model.tokenizer._pure is not None and model.tokenizer._pure.model._rank.__name__ == "_rank_by_position"
        chunks = list(model.chat({messages!r}, max_tokens=2, temperature=0))
        assert chunks[-1].finish_reason == "length"
        print(json.dumps(model.tokenizer.encode_chat({messages!r})))
        """
    )
    command = [sys.executable, "-c", textwrap.dedent(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)  # (a hang guard)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == reference.encode_chat(messages)


# --- in Pyodide ------------------------------------------------------------------------------------------

_spec = importlib.util.spec_from_file_location("demo_serve", ROOT / "web" / "serve.py")
serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve)
DIST = serve.local_pyodide()


@pytest.mark.pyodide
@pytest.mark.skipif(DIST is None, reason="no local Pyodide distribution (RUVLLM_PYODIDE_DIST; docs/pyodide.md)")
def test_pyodide_gives_the_ids_of_tokenizers(tmp_path, smollm2_document, smollm2_gguf_document, gemma_metadata):
    """Python 3.14 in WebAssembly, its own Unicode tables: the ids `tokenizers` gives on CPython."""
    assert shutil.which("node"), "node is needed"
    documents = {
        "smollm2": smollm2_document,
        "qwen2": {**smollm2_gguf_document, "pre_tokenizer": _BYTE_LEVEL_PRE["qwen2"]},
        "llama3": {**smollm2_gguf_document, "pre_tokenizer": _BYTE_LEVEL_PRE["llama-bpe"]},
        "gemma3": tokenizer_files(gemma_metadata, "gemma.gguf", merges=False)[0],
    }
    texts = [*TEXTS, *random_texts(300, seed=1)]
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"documents": documents, "texts": texts}), encoding="utf-8")
    command = ["node", str(ROOT / "benchmarks" / "tokenizer_node.mjs"), str(DIST), "ids", str(inputs)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)  # (a hang guard)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    references = {**documents, "gemma3": tokenizer_files(gemma_metadata, "gemma.gguf")[0]}
    for name, document in references.items():
        reference = tokenizers.Tokenizer.from_str(json.dumps(document))
        expected = [reference.encode(t, add_special_tokens=add).ids for t in texts for add in (True, False)]
        assert found[name] == expected, name
