"""The `ruvllm` command: output shapes, streaming, chat, and one-line errors for bad input."""

from __future__ import annotations

import importlib
import io
import json
import re
import shutil
import subprocess
import sys

import pytest

from ruvllm import __version__ as ruvllm_version
from ruvllm import cli

from conftest import byte_tokenizer_json, numpy_model


def ruvllm(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruvllm", *args], capture_output=True, text=True, input=stdin, timeout=600
    )


def assert_one_line_error(result: subprocess.CompletedProcess, message: str, code: int = 1) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0], lines[0]


def test_generate_json_has_the_documented_shape(smollm2_dir, smollm2):
    result = ruvllm(
        "generate",
        str(smollm2_dir),
        "--prompt",
        "What is 2+2?",
        "--chat",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) == {"text", "token_ids", "prompt_token_ids", "finish_reason", "stats"}
    assert set(data["stats"]) == {"prompt_tokens", "completion_tokens", "prefill_ms", "ttft_ms", "decode_tok_s"}
    expected_prompt = smollm2.tokenizer.encode_chat([{"role": "user", "content": "What is 2+2?"}])
    assert data["prompt_token_ids"] == expected_prompt
    expected = list(smollm2.generate(expected_prompt, max_tokens=24, temperature=0))
    assert data["token_ids"] == [c.token_id for c in expected]
    assert data["text"] == "".join(c.text for c in expected)
    assert data["finish_reason"] == expected[-1].finish_reason
    assert data["stats"]["prompt_tokens"] == len(expected_prompt)
    assert data["stats"]["completion_tokens"] == len(data["token_ids"])


def test_generate_streams_the_same_text(smollm2_dir):
    args = ["generate", str(smollm2_dir), "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens", "20"]
    streamed = ruvllm(*args)
    as_json = json.loads(ruvllm(*args, "--json").stdout)
    assert streamed.returncode == 0
    assert streamed.stdout == as_json["text"] + "\n"


def test_kernels_and_arithmetic_choose_what_computes(smollm2_dir):
    """--kernels wasm on CPython runs the WebAssembly kernels through wasmtime (the same greedy text here);
    numpy with either arithmetic computes NumPy's exact products (the same text)."""
    args = ["generate", str(smollm2_dir), "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens", "6"]
    texts = {ruvllm(*args, "--kernels", "numpy", "--arithmetic", a).stdout for a in ("exact", "fast")}
    assert texts == {ruvllm(*args).stdout} == {ruvllm(*args, "--kernels", "wasm").stdout}
    bad = ruvllm(*args, "--kernels", "gpu")
    assert bad.returncode == 2 and "argument --kernels: invalid choice: 'gpu'" in bad.stderr


def test_no_plan_turns_the_decode_plan_off():
    """--no-plan reaches the load options (default: the plan runs where the kernels offer a memory)."""
    from ruvllm.cli.common import Parser, add_load_options, load_options

    parser = Parser(prog="ruvllm generate")
    add_load_options(parser)
    assert load_options(parser.parse_args([])).plan is True
    assert load_options(parser.parse_args(["--no-plan"])).plan is False


def test_generate_with_system_prompt_and_sampling_options(smollm2_dir, smollm2):
    args = ["generate", str(smollm2_dir), "--prompt", "Hi", "--chat", "--system", "You are a pirate.", "--json"]
    sampled = [
        "--temperature",
        "0.9",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--min-p",
        "0.1",
        "--repetition-penalty",
        "1.1",
        "--seed",
        "5",
    ]
    first = json.loads(ruvllm(*args, *sampled, "--max-tokens", "16").stdout)
    second = json.loads(ruvllm(*args, *sampled, "--max-tokens", "16").stdout)
    assert first["token_ids"] == second["token_ids"]
    messages = [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Hi"}]
    assert first["prompt_token_ids"] == smollm2.tokenizer.encode_chat(messages)


def test_info(smollm2_dir):
    result = ruvllm("info", str(smollm2_dir))
    assert result.returncode == 0
    for expected in (
        "LlamaForCausalLM",
        "134.5M",
        "30 layers",
        "9 heads (3 key/value)",
        "8192 positions",
        "q4_1",
        "q8",
        "tied",
    ):
        assert expected in result.stdout


def test_chat_keeps_history_and_obeys_commands(smollm2_dir, monkeypatch, capsys):
    seen = []
    from ruvllm.api import Model

    real_chat = Model.chat

    def recording_chat(self, messages, **options):
        seen.append((messages, options["temperature"]))
        return real_chat(self, messages, **options)

    monkeypatch.setattr(Model, "chat", recording_chat)
    lines = ["/temp 0", "What is the capital of France?", "And of Italy?", "/system You are terse.", "/clear", "Hi"]
    script = "\n".join([*lines, "/bogus", "/quit", "never read", ""])
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    assert cli.main(["chat", str(smollm2_dir), "--max-tokens", "24"]) == 0
    out, err = capsys.readouterr()
    assert "Paris" in out
    assert [temperature for _, temperature in seen] == [0.0, 0.0, 0.0]
    first, second, third = (messages for messages, _ in seen)
    assert first == [{"role": "user", "content": "What is the capital of France?"}]
    assert second[0] == first[0] and second[1]["role"] == "assistant" and second[2]["content"] == "And of Italy?"
    assert third == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    assert "(conversation cleared)" in err and "unknown command /bogus" in err


def test_ctrl_c_stops_an_answer_and_the_chat_goes_on(smollm2_dir, monkeypatch, capsys):
    """Ctrl+C while an answer is written stops that answer (its text stays in the conversation), not the
    chat; /stats shows the speed after each answer; Ctrl+C at the prompt says how to leave (it left
    silently), and a second one in a row leaves."""
    from ruvllm.api import Model

    real_chat, seen, closed = Model.chat, [], []

    def interrupted_chat(self, messages, **options):
        seen.append(messages)
        chunks = real_chat(self, messages, **options)
        if len(seen) > 1:
            return chunks

        def three_then_ctrl_c():
            try:
                for i, chunk in enumerate(chunks):
                    if i == 3:
                        raise KeyboardInterrupt  # what Ctrl+C raises in the main thread
                    yield chunk
            finally:
                closed.append(True)

        return three_then_ctrl_c()

    monkeypatch.setattr(Model, "chat", interrupted_chat)
    script = "\n".join(["Tell me a long story.", "/stats", "Hi", ""])
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    code = cli.main(["chat", str(smollm2_dir), "--max-tokens", "8", "--temperature", "0"])
    out, err = capsys.readouterr()
    assert code == 0 and closed == [True]
    assert "(stopped)" in err and "(speed after each answer on)" in err
    assert re.search(r"\(\d+ tokens, [\d.]+ tok/s; prompt \d+ tokens, first token after \d+ ms\)", err), err
    stopped = seen[1][1]  # the stopped answer, as it was shown, is part of the conversation
    assert stopped["role"] == "assistant" and stopped["content"] and stopped["content"] in out

    answers = iter([KeyboardInterrupt, "/help", KeyboardInterrupt, KeyboardInterrupt, "never read"])

    def typed(prompt=""):
        answer = next(answers)
        if answer is KeyboardInterrupt:
            raise KeyboardInterrupt
        return answer

    monkeypatch.setattr("builtins.input", typed)
    assert cli.main(["chat", str(smollm2_dir)]) == 0
    err = capsys.readouterr().err
    leave = "(to leave: Ctrl+C again, Ctrl+D or /quit)"
    assert err.count(leave) == 2 and err.rstrip().endswith("(bye)")  # the /help between reset the count
    assert "(commands: /help, /clear (forget the conversation)" in err and next(answers) == "never read"


def test_version():
    result = ruvllm("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"ruvllm {ruvllm_version}"


def help_of(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 0
    return capsys.readouterr().out


def test_every_command_is_a_module_whose_main_is_that_command(capsys):
    """Each command `python -m ruvllm --help` lists is ruvllm.cli.NAME, and its main(argv) is
    `ruvllm NAME ARGV...`: the same help, the same one-line errors and exit codes."""
    listed = ruvllm("--help")
    assert listed.returncode == 0, listed.stderr
    names = re.search(r"^usage: ruvllm .*?\{([a-z,]+)\}", listed.stdout, re.S).group(1).split(",")
    assert names == list(cli.COMMANDS) and len(names) == 13
    # the listing under "positional arguments": a command's line, then its help's wrapped continuation lines
    listing = listed.stdout.split("positional arguments:")[1].split("\n\n")[0].splitlines()[2:]
    helps: dict[str, str] = {}
    for line in listing:
        if re.match(r"^ {4}[a-z]", line):
            name, _, text = line.strip().partition(" ")
            helps[name] = text.strip()
        else:
            helps[name] += " " + line.strip()
    assert list(helps) == names
    for name in names:
        module = importlib.import_module(f"ruvllm.cli.{name}")
        assert module.__file__.endswith(f"cli/{name}.py")
        assert helps[name] == module.HELP  # its help line is its module's
        text = help_of(cli.main, [name, "--help"], capsys)
        assert text.startswith(f"usage: ruvllm {name} [-h]")
        assert help_of(module.main, ["--help"], capsys) == text

    bench = importlib.import_module("ruvllm.cli.bench")
    assert bench.main(["no-such-model", "--prompt-length", "0"]) == 1
    assert capsys.readouterr().err == "ruvllm bench: error: --prompt-length and --gen-length must be >= 1\n"
    with pytest.raises(SystemExit) as exit:
        importlib.import_module("ruvllm.cli.info").main([])
    assert exit.value.code == 2
    expected = "ruvllm info: error: the following arguments are required: model (see --help)\n"
    assert capsys.readouterr().err == expected


# --- bad input: exit code 1 (2 for a malformed command line), one line on stderr, no traceback


def test_missing_model_folder(tmp_path):
    assert_one_line_error(
        ruvllm("generate", str(tmp_path / "nope"), "--prompt", "x"), f"{tmp_path / 'nope'}: model folder not found"
    )


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    result = ruvllm("generate", str(tmp_path), "--prompt", "x")
    assert_one_line_error(
        result,
        "unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM",
    )


def test_truncated_weight_file(tmp_path, smollm2_dir):
    numpy_model("llama", tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_dir / name, tmp_path / name)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    result = ruvllm("generate", str(tmp_path), "--prompt", "x")
    assert_one_line_error(result, "model.safetensors: tensor")
    assert "the file is truncated" in result.stderr


def test_prompt_longer_than_the_context(smollm2_dir):
    result = ruvllm("generate", str(smollm2_dir), "--prompt", "word " * 39 + "word", "--context-length", "16")
    assert_one_line_error(result, "the prompt has 40 tokens but the context window is 16")


@pytest.mark.parametrize(
    "option, message",
    [
        (["--temperature", "-1"], "temperature must be >= 0, got -1.0"),
        (["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--max-tokens", "0"], "max_tokens must be an integer >= 1, got 0"),
        (["--context-length", "100000"], "context_length must be an integer in [1, 8192], got 100000"),
    ],
)
def test_invalid_option_values(smollm2_dir, option, message):
    assert_one_line_error(ruvllm("generate", str(smollm2_dir), "--prompt", "x", *option), message)


def test_malformed_command_line_is_one_line_too(smollm2_dir):
    result = ruvllm("generate", str(smollm2_dir), "--prompt", "x", "--max-tokens", "many")
    assert_one_line_error(result, "argument --max-tokens: invalid int value: 'many'", code=2)
    assert_one_line_error(
        ruvllm("generate", str(smollm2_dir)), "the following arguments are required: --prompt", code=2
    )


def test_verbose_shows_the_traceback(tmp_path):
    result = ruvllm("--verbose", "generate", str(tmp_path / "nope"), "--prompt", "x")
    assert result.returncode == 1 and "Traceback" in result.stderr and "model folder not found" in result.stderr


def test_convert_prints_quantization_errors(tmp_path):
    numpy_model("llama", tmp_path / "hf")
    result = ruvllm("convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--weights", "q4_0")
    assert result.returncode == 0, result.stderr
    assert "model.layers.0.mlp.up_proj.weight" in result.stdout and "q4_0 max |error|" in result.stdout
    assert "model.norm.weight" in result.stdout and "f32 (vector)" in result.stdout
    shutil.rmtree(tmp_path / "out")


def test_bench_prints_the_figures_in_each_format(smollm2_dir):
    args = ("bench", str(smollm2_dir), "--prompt-length", "8", "--gen-length", "4", "--context-length", "64")
    data = json.loads(ruvllm(*args, "--format", "json", "--hot-tokens", "4", "--cold", "int4").stdout)
    for key in ("prefill_ms", "ttft_ms", "decode_tok_s", "peak_rss_bytes", "weight_bytes", "kv_hot_bytes"):
        assert data[key] > 0, key
    assert data["prompt_tokens"] == 8 and data["generated_tokens"] == 4
    assert data["kv_cold_bytes"] == 0 and data["kv_cold_format"] is None  # 11 positions: none went cold yet
    csv = ruvllm(*args, "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("compute,prompt_tokens,generated_tokens,prefill_ms") and csv[1].startswith("f32,8,4,")
    table = ruvllm(*args, "--compute", "q8").stdout
    assert "decode_tok_s" in table and "q8" in table and "MiB" in table


def test_info_states_the_memory_plan(smollm2_dir):
    out = ruvllm("info", str(smollm2_dir), "--compute", "q4", "--context-length", "1024").stdout
    assert "memory plan    compute q4: weights 106.4 MiB (q4 75.9, q8 30.4) + KV cache 45.0 MiB" in out
    assert "in memory      weights 106.4 MiB for 92.1 MiB stored: the compute forms keep each group's scale" in out
    refused = ruvllm("info", str(smollm2_dir), "--memory-budget", "50M")
    assert_one_line_error(refused, "the model does not fit the memory budget of 50 MiB")
    assert_one_line_error(ruvllm("info", str(smollm2_dir), "--memory-budget", "lots"), "not a size: 'lots'", code=2)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "a", "completion": "b"', "line 2: not JSON"),
        (
            '{"prompt": "a", "completion": "b", "reward": 0}',
            "line 2: reward must be a non-zero number in [-1, 1] (+1 good, -1 bad), got 0",
        ),
        ('{"prompt": "a", "messages": [], "completion": "b"}', "line 2: give either prompt or messages"),
        ('{"prompt": "a", "answer": "b"}', "line 2: unknown field 'answer'"),
        ('{"prompt": "a", "completion": ""}', "line 2: completion must be a non-empty string"),
    ],
)
def test_a_bad_feedback_file_is_refused_naming_the_line(tmp_path, line, message):
    numpy_model("llama", tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    feedback = tmp_path / "feedback.jsonl"
    feedback.write_text('{"prompt": "a", "completion": "b"}\n' + line + "\n")
    result = ruvllm("adapt", str(tmp_path / "m"), "--from-file", str(feedback), "--out", str(tmp_path / "a"))
    assert_one_line_error(result, f"{feedback} {message}")
    both = ruvllm("adapt", str(tmp_path / "m"), "--from-file", str(feedback), "--prompt", "x", "--out", "o")
    assert_one_line_error(both, "give --from-file or --prompt and --completion, not both")
    neither = ruvllm("adapt", str(tmp_path / "m"), "--out", "o")
    assert_one_line_error(neither, "adapt needs --prompt and --completion, or --from-file")
