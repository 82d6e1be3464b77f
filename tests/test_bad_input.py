"""Input a user can get wrong: each case is a one-line error that names what was wrong (exit code 1, no
traceback) or an exception of the public API with that message; never silently wrong output."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ruvllm
from ruvllm.errors import InferenceError, InvalidArgumentError, LoadError
from ruvllm.files.tensorfile import SafetensorsFile, serialize
from ruvllm.model.config import ModelConfig
from ruvllm.runtime.assembly import load_engine

from conftest import byte_tokenizer_json, numpy_model

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def ruvllm_cli(*args: str | bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruvllm", *args], capture_output=True, timeout=600)


def assert_one_line_error(result: subprocess.CompletedProcess, message: str, code: int = 1) -> None:
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == code, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], stderr


IN_VOCABULARY = "a token id of the vocabulary, in [0, 128)"


# --- config.json values no model can have: refused at load, naming the field


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rms_norm_eps": math.nan}, "'rms_norm_eps' must be a number in (0, 1), found nan"),
        ({"rms_norm_eps": -1}, "'rms_norm_eps' must be a number in (0, 1), found -1"),
        ({"rope_theta": 0}, "'rope_theta' must be a finite number > 0, found 0"),
        ({"rope_theta": -5}, "'rope_theta' must be a finite number > 0, found -5"),
        ({"rope_theta": math.nan}, "'rope_theta' must be a finite number > 0, found nan"),
        ({"rope_theta": "x"}, "'rope_theta' must be a finite number > 0, found 'x'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "'factor' must be a finite number > 0, found 0"),
        ({"rope_scaling": [1, 2]}, "'rope_scaling' must be a JSON object, found list"),
        ({"architectures": 5}, "'architectures' must be a list of strings, found 5"),
        ({"num_key_value_heads": "3"}, "'num_key_value_heads' must be an integer in [1, 2147483647], found '3'"),
        ({"num_key_value_heads": 3.0}, "'num_key_value_heads' must be an integer in [1, 2147483647], found 3.0"),
        ({"eos_token_id": ["2"]}, "'eos_token_id' must be a token id (an integer >= 0) or a list of them, found ['2']"),
        ({"num_hidden_layers": 2**40}, "'num_hidden_layers' must be an integer in [1, 4096], found 1099511627776"),
        # an end token outside the vocabulary never ends a generation (issue 35: it loaded, silently)
        ({"eos_token_id": 10**12}, f"'eos_token_id' must be {IN_VOCABULARY}, found 1000000000000"),
        ({"eos_token_id": [2, 128]}, f"'eos_token_id' must be {IN_VOCABULARY}, found [2, 128]"),
        ({"bos_token_id": 500}, f"'bos_token_id' must be {IN_VOCABULARY}, found 500"),
    ],
)
def test_impossible_config_values_are_refused_naming_the_field(change, message):
    with pytest.raises(LoadError) as error:
        ModelConfig.from_dict({**BASE, **change}, "m/config.json")
    assert error.value.message == f"m/config.json: {message}"


def test_a_config_that_is_not_an_object_is_refused():
    with pytest.raises(LoadError, match=r"^m/config.json: the file must be a JSON object, found list$"):
        ModelConfig.from_dict([BASE], "m/config.json")


@pytest.fixture
def tiny_folder(tmp_path, smollm2_dir):
    """A tiny random Llama with SmolLM2's tokenizer files (its ids fit the tiny vocabulary only for
    short ASCII prompts, enough here)."""
    numpy_model("llama", tmp_path, vocab_size=49152)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_dir / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("file", ["config.json", "generation_config.json"])
def test_a_model_folder_whose_end_token_is_outside_the_vocabulary_is_refused(tmp_path, file, capsys):
    from ruvllm import cli

    folder = numpy_model("llama", tmp_path / "m")
    (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    config = json.loads((folder / file).read_text())
    (folder / file).write_text(json.dumps({**config, "eos_token_id": 10**12}))
    code = cli.main(["generate", str(folder), "--prompt", "ab", "--max-tokens", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.endswith(
        f"{file}: 'eos_token_id' must be a token id of the vocabulary, in [0, 128), found 1000000000000"
    ), err


@pytest.mark.parametrize("file", ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_json_files_nested_past_the_bound_are_one_line_errors(tmp_path, file, capsys):
    """Python's parser recurses once per level: 100,000 levels were a RecursionError (a fatal stack
    overflow in Pyodide). Every JSON file is read by one reader that measures the nesting first."""
    from ruvllm import cli

    folder = numpy_model("llama", tmp_path / "m")
    (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    (folder / file).write_text("[" * 100_000 + "]" * 100_000)
    code = cli.main(["generate", str(folder), "--prompt", "ab", "--max-tokens", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.endswith(f"{file} is not valid JSON (nested 100,000 levels deep; at most 100)"), err


def test_nan_weights_stop_generation_with_an_inference_error(tiny_folder):
    path = tiny_folder / "model.safetensors"
    f = SafetensorsFile.from_path(path)
    tensors = {name: np.array(f.get(name)) for name in f.keys()}
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = np.nan
    path.write_bytes(serialize(tensors, f.metadata))
    model = ruvllm.load(str(tiny_folder))
    with pytest.raises(InferenceError, match=r"^the model computed non-finite logits at position 0 "):
        list(model.generate("Hi", max_tokens=8, temperature=0))


# --- the command line


def test_a_prompt_that_is_not_utf8_is_refused(smollm2_dir):
    result = ruvllm_cli("generate", str(smollm2_dir), "--prompt", b"caf\xe9", "--max-tokens", "2")
    assert_one_line_error(result, "the text is not valid Unicode: character 3 is '\\udce9'")


@pytest.mark.parametrize("prompt, kind", [(None, "NoneType"), (3.5, "float"), (["a"], "list"), ([True], "list")])
def test_a_prompt_must_be_text_or_token_ids(smollm2, prompt, kind):
    """(JavaScript's null reaching Model.generate from a PyScript page was a TypeError traceback.)"""
    with pytest.raises(InvalidArgumentError, match=f"prompt must be a string or a list of token ids, got {kind}$"):
        smollm2.generate(prompt)


def test_a_memory_budget_must_be_a_finite_size(smollm2_dir):
    for value in ("inf", "nan", "-1G"):
        result = ruvllm_cli("info", str(smollm2_dir), f"--memory-budget={value}")
        assert_one_line_error(result, f"a size must be a positive number of bytes, got '{value}'", code=2)


def test_a_thread_count_must_be_positive(smollm2_dir):
    result = ruvllm_cli("generate", str(smollm2_dir), "--prompt", "x", "--threads", "0")
    assert_one_line_error(result, "threads must be an integer >= 1, got 0")


def test_a_perplexity_window_must_be_positive(smollm2_dir, tmp_path):
    (tmp_path / "t.txt").write_text("Some text to measure.")
    result = ruvllm_cli("perplexity", str(smollm2_dir), "--text-file", str(tmp_path / "t.txt"), "--window", "-3")
    assert_one_line_error(result, "window must be an integer >= 1 (tokens per evaluation window), got -3")


def test_damaged_adapter_config_is_a_load_error(tmp_path, smollm2):
    model = smollm2
    adapter = model.new_adapter("x")
    adapter.save(str(tmp_path))
    model.set_adapter(None)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "r": "2"}))
    with pytest.raises(
        LoadError, match=r"^adapter_config.json: 'r' must be an integer in \[1, 2147483647\], found '2'$"
    ):
        model.load_adapter(str(tmp_path))


# --- GGUF files and the converter


def gguf_copy(smollm2_gguf, tmp_path, edit) -> str:
    """A copy of the SmolLM2 GGUF with `edit(data, reader)` applied to its bytes."""
    import gguf

    data = bytearray(smollm2_gguf.read_bytes())
    edit(data, gguf.GGUFReader(str(smollm2_gguf)))
    path = tmp_path / "damaged.gguf"
    path.write_bytes(bytes(data))
    return str(path)


def first_tensor_field(reader, part: int) -> int:
    """Byte offset of one part of the first tensor's info: 2 = n_dims, 5 = its data offset."""
    field = reader.tensors[0].field
    return field.offset + sum(p.nbytes for p in field.parts[:part])


GGUF_DAMAGE = {
    "truncated to 1000 bytes": (
        lambda data, reader: data.__delitem__(slice(1000, None)),
        "tensor_count is 272, which cannot fit: each entry takes at least 32 bytes and only 976 bytes follow",
    ),
    "n_dims 99": (
        lambda data, reader: data.__setitem__(
            slice(o := first_tensor_field(reader, 2), o + 4), (99).to_bytes(4, "little")
        ),
        "tensor 'token_embd.weight' has 99 dimensions; a GGUF tensor has 1 to 4",
    ),
    "tensor_count 2^40": (
        lambda data, reader: data.__setitem__(slice(8, 16), (2**40).to_bytes(8, "little")),
        "tensor_count is 1099511627776, which cannot fit",
    ),
    "a misaligned tensor": (
        lambda data, reader: data.__setitem__(
            slice(o := first_tensor_field(reader, 5), o + 8),
            (int.from_bytes(data[o : o + 8], "little") + 1).to_bytes(8, "little"),
        ),
        "tensor 'token_embd.weight' starts at offset 1 of the data section, not a multiple of the alignment 32",
    ),
}


@pytest.mark.parametrize("damage", list(GGUF_DAMAGE))
def test_a_damaged_gguf_is_a_one_line_error(damage, smollm2_gguf, tmp_path):
    edit, message = GGUF_DAMAGE[damage]
    path = gguf_copy(smollm2_gguf, tmp_path, edit)
    assert_one_line_error(ruvllm_cli("convert", path, str(tmp_path / "out")), message)
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert_one_line_error(ruvllm_cli("generate", path, "--prompt", "Hi"), message)  # loaded as it is


def test_convert_refuses_a_folder_that_is_not_empty_unless_forced(tmp_path):
    numpy_model("llama", tmp_path / "hf")
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-00002-of-00002.safetensors").write_bytes(b"a stale shard of another model")
    result = ruvllm_cli("convert", str(tmp_path / "hf"), str(out))
    assert_one_line_error(result, f"{out} is not empty: writing into it would mix old files with new ones (--force")
    assert (out / "model-00002-of-00002.safetensors").exists()

    result = ruvllm_cli("convert", str(tmp_path / "hf"), str(out), "--force")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left
    load_engine(str(out))  # loads: the stale shard is gone


def test_convert_makes_the_folders_above_its_target(tmp_path):
    numpy_model("llama", tmp_path / "hf")
    result = ruvllm_cli("convert", str(tmp_path / "hf"), str(tmp_path / "models" / "tiny"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny"]


# --- files and numbers the CLI reads before loading: bounded, refused in one line before any model loads


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if a command gets as far as loading the model."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad option was refused")

    monkeypatch.setattr(ruvllm.api, "load", load)


def cli_error(capsys, *args: str) -> str:
    from ruvllm.cli import main

    assert main(list(args)) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


@pytest.fixture
def odd_files(tmp_path) -> dict[str, str]:
    (tmp_path / "nul.txt").write_bytes(b"abc\0def")
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    return {"nul": str(tmp_path / "nul.txt"), "latin1": str(tmp_path / "latin1.txt")}


def test_a_chat_template_file_is_read_bounded_and_must_be_text(smollm2_gguf, odd_files, no_load, capsys):
    generate = ("generate", str(smollm2_gguf), "--prompt", "Hi", "--chat-template")
    assert cli_error(capsys, *generate, "/dev/zero") == (
        "ruvllm generate: error: --chat-template /dev/zero: the file is larger than 1 MiB, the most it may be"
    )
    assert cli_error(capsys, *generate, odd_files["nul"]).endswith(
        f"--chat-template {odd_files['nul']}: not a text file (byte 3 is a NUL)"
    )
    assert cli_error(capsys, *generate, odd_files["latin1"]).endswith(
        f"--chat-template {odd_files['latin1']}: not UTF-8 text (invalid continuation byte at byte 3)"
    )
    assert cli_error(capsys, *generate, "/no/such/template").endswith(
        "--chat-template /no/such/template: cannot read it (No such file or directory)"
    )


def test_a_perplexity_text_file_is_read_bounded_and_must_be_text(smollm2_gguf, odd_files, no_load, capsys):
    perplexity = ("perplexity", str(smollm2_gguf), "--text-file")
    assert cli_error(capsys, *perplexity, "/dev/zero") == (
        "ruvllm perplexity: error: --text-file /dev/zero: the file is larger than 64 MiB, the most it may be"
    )
    assert cli_error(capsys, *perplexity, odd_files["nul"]).endswith("not a text file (byte 3 is a NUL)")
    assert cli_error(capsys, *perplexity, odd_files["latin1"]).endswith(
        "not UTF-8 text (invalid continuation byte at byte 3)"
    )


def test_a_bench_longer_than_the_context_is_refused_before_loading(smollm2_gguf, no_load, capsys):
    bench = ("bench", str(smollm2_gguf))
    assert cli_error(capsys, *bench, "--prompt-length", "1000000000") == (
        "ruvllm bench: error: --prompt-length 1000000000 + --gen-length 64 need 1000000064 positions, more than "
        "the default context (--context-length) of 4096; this model takes at most 8192"
    )
    assert cli_error(capsys, *bench, "--prompt-length", "60", "--context-length", "100").endswith(
        "--prompt-length 60 + --gen-length 64 need 124 positions, more than --context-length of 100; "
        "this model takes at most 8192"
    )
    assert cli_error(capsys, *bench, "--prompt-length", "60", "--context-length", "9000").endswith(
        "context_length must be an integer in [1, 8192], got 9000"
    )
