"""What ruvllm writes: no name from outside becomes a path outside its folder, an output never replaces an
input or (without --force) anything that exists, and absurd numbers never become adapters (issue #23)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ruvllm import cli
from ruvllm.errors import InvalidArgumentError, LoadError
from ruvllm.files.outputs import check_output, plain_name, write_files
from ruvllm.files.tensorfile import serialize
from ruvllm.learning.lora import Adapter, LoRAConfig
from ruvllm.learning.xlora import RouterConfig
from ruvllm.runtime.assembly import load_engine

from conftest import byte_tokenizer_json, numpy_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny") / "m"
    numpy_model("llama", folder)
    (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    return folder


def run(capsys, *args: str) -> tuple[int, str]:
    """`ruvllm ARGS` in this process: (exit code, stderr)."""
    code = cli.main([str(a) for a in args])
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def adapter_folder(tiny: Path, folder: Path, seed: int = 0) -> Path:
    engine = load_engine(str(tiny))
    Adapter.new(engine.weights, LoRAConfig(rank=2), seed=seed).save(str(folder))
    return folder


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "a/b", "..", ".", "", "a\\b", "C:x", "x\0y", "n" * 256, 7, None])
def test_a_name_that_is_not_one_plain_folder_name_is_refused(name):
    with pytest.raises(InvalidArgumentError, match="expert"):
        plain_name(name, "expert")


def test_plain_names_pass():
    for name in ("blue", "e0", "my adapter", "é", ".hidden", "n" * 255):
        assert plain_name(name, "expert") == name


@pytest.mark.parametrize("expert", ["../../escaped", "/tmp/ruvllm-escaped-expert"])
def test_an_x_lora_config_naming_an_expert_outside_its_folder_is_refused(tiny, tmp_path, capsys, expert):
    """A crafted adapter_config.json whose expert names are paths: `adapt --adapter EVIL --out O` used
    to write the experts' files outside O (exit 0)."""
    pytest.importorskip("tokenizers")  # the model is loaded, text and all
    good = adapter_folder(tiny, tmp_path / "good")
    evil = tmp_path / "deep" / "evil"
    evil.mkdir(parents=True)
    (evil / "adapter_config.json").write_text(json.dumps({"peft_type": "XLORA", "adapters": {expert: str(good)}}))
    (evil / "adapter_model.safetensors").write_bytes(serialize({}))
    code, err = run(
        capsys, "adapt", tiny, "--adapter", evil, "--prompt", "a", "--completion", "b", "--out", tmp_path / "o"
    )
    assert code == 1
    assert f"expert {expert!r} is not a plain folder name" in one_line(err)
    assert not (tmp_path / "o").exists() and not (tmp_path / "escaped").exists()
    assert not Path("/tmp/ruvllm-escaped-expert").exists()


def test_saving_never_writes_outside_the_folder(tmp_path):
    with pytest.raises(InvalidArgumentError, match="not a plain folder name"):
        write_files(str(tmp_path / "out"), {"../x/adapter_config.json": b"{}"})
    assert os.listdir(tmp_path) == []


def test_outputs_that_exist_are_refused_unless_forced_and_inputs_never_replaced(tiny, tmp_path, capsys):
    pytest.importorskip("tokenizers")  # the model is loaded, text and all
    a, b = adapter_folder(tiny, tmp_path / "a"), adapter_folder(tiny, tmp_path / "b", seed=1)
    before = {p.name: p.read_bytes() for p in a.iterdir()}

    # mix --out one of its experts: that would replace an input, --force or not
    for force in ([], ["--force"]):
        code, err = run(capsys, "mix", tiny, a, b, "--out", a, *force)
        assert code == 1
        assert f"--out {a} is {a}, an input of this command" in one_line(err)
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before

    # adapt --out an existing adapter: refused, then with --force replaced whole
    lesson = ["--prompt", "ab", "--completion", "cd", "--steps", "1"]
    code, err = run(capsys, "adapt", tiny, *lesson, "--out", b)
    assert code == 1 and f"--out {b} is not empty" in one_line(err) and "--force replaces it" in err
    (b / "stray.txt").write_text("from before")
    code, err = run(capsys, "adapt", tiny, *lesson, "--out", b, "--force")
    assert code == 0, err
    assert "stray.txt" not in os.listdir(b) and (b / "adapter_config.json").exists()  # replaced whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left

    # adapt --out the model folder, or the adapter it continues from
    code, err = run(capsys, "adapt", tiny, *lesson, "--out", tiny, "--force")
    assert code == 1 and f"--out {tiny} is {tiny}, an input" in one_line(err)
    code, err = run(capsys, "adapt", tiny, *lesson, "--adapter", a, "--out", a, "--force")
    assert code == 1 and "an input of this command" in one_line(err)

    # merge --out a folder holding the adapter
    code, err = run(capsys, "merge", tiny, a, "--out", tmp_path, "--force")
    assert code == 1 and f"{tmp_path} holds {a}, an input" in one_line(err)


def test_convert_never_deletes_its_own_input(smollm2_gguf, tmp_path, capsys):
    """`convert DIR/x.gguf DIR --force` used to replace DIR, whole, input included."""
    folder = tmp_path / "dir"
    folder.mkdir()
    gguf = folder / "x.gguf"
    os.symlink(smollm2_gguf, gguf)
    code, err = run(capsys, "convert", gguf, folder, "--force")
    assert code == 1 and f"{folder} holds {gguf}, an input of this command" in one_line(err)
    assert gguf.exists()


def test_the_python_api_refuses_to_save_over_what_exists(tiny, tmp_path):
    pytest.importorskip("tokenizers")  # the model is loaded, text and all
    import ruvllm

    model = ruvllm.load(str(tiny))
    model.new_adapter("x")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match="is not empty"):
        model.save_adapter(str(tmp_path / "taken"), "x")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    model.save_adapter(str(tmp_path / "taken"), "x", force=True)
    assert sorted(os.listdir(tmp_path / "taken")) == ["adapter_config.json", "adapter_model.safetensors"]
    with pytest.raises(InvalidArgumentError, match="an input of this command"):
        model.save_adapter(str(tiny), "x", force=True)
    with pytest.raises(InvalidArgumentError, match="must name a folder"):
        check_output("", False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "nan"], "alpha must be a finite number, got nan"),
        (["--alpha", "inf"], "alpha must be a finite number, got inf"),
        (["--alpha", "1e38"], "alpha / rank (the update's scale) must be in (0, 10000], got 1e+38 / 32"),
        (["--alpha", "-1"], "alpha / rank (the update's scale) must be in (0, 10000]"),
        (["--reward", "1e30"], "--reward must be a non-zero number in [-1, 1] (+1 good, -1 bad), got 1e+30"),
        (["--reward", "nan"], "--reward must be a non-zero number in [-1, 1]"),
        (["--rank", "1000000000"], "rank must be an integer in [1, 65536], got 1000000000"),
    ],
)
def test_absurd_numbers_never_become_adapters(tiny, tmp_path, capsys, args, message):
    code, err = run(capsys, "adapt", tiny, "--prompt", "a", "--completion", "b", "--out", tmp_path / "o", *args)
    assert code == 1 and message in one_line(err)
    assert not (tmp_path / "o").exists()


def test_a_rank_past_the_matrices_is_refused_before_anything_is_allocated(tiny, tmp_path, capsys):
    pytest.importorskip("tokenizers")  # the model is loaded, text and all
    code, err = run(
        capsys, "adapt", tiny, "--prompt", "a", "--completion", "b", "--rank", "4096", "--out", tmp_path / "o"
    )
    assert code == 1
    assert "rank 4096 is larger than the adapted matrices allow (at most 64, their smaller side)" in one_line(err)


def test_a_router_too_large_to_hold_is_refused(tiny, tmp_path, capsys):
    pytest.importorskip("tokenizers")  # the model is loaded, text and all
    a, b = adapter_folder(tiny, tmp_path / "a"), adapter_folder(tiny, tmp_path / "b", seed=1)
    code, err = run(capsys, "mix", tiny, a, b, "--depth", "3", "--size", "65536", "--out", tmp_path / "m")
    assert code == 1 and "would hold 4,299,423,746 parameters (16.0 GiB)" in one_line(err)
    code, err = run(capsys, "mix", tiny, a, b, "--size", "1000000000", "--out", tmp_path / "m")
    assert code == 1 and "router size must be an integer in [1, 65536], got 1000000000" in one_line(err)
    with pytest.raises(InvalidArgumentError, match="global_scaling_weight must be a finite number, got nan"):
        RouterConfig(global_scaling_weight=float("nan"))


def rewrite(folder: Path, config: dict | None = None, tensors=None) -> None:
    if config is not None:
        raw = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**raw, **config}))
    if tensors is not None:
        (folder / "adapter_model.safetensors").write_bytes(serialize(tensors, {"format": "pt"}))


def test_adapter_files_with_absurd_numbers_are_refused(tiny, tmp_path, capsys):
    engine = load_engine(str(tiny))
    folder = adapter_folder(tiny, tmp_path / "a")
    good = Adapter.load(str(folder), engine.weights)
    tensors = {
        f"base_model.model.{n}.lora_{p}.weight": a for n in good.A for p, a in (("A", good.A[n]), ("B", good.B[n]))
    }
    first = next(iter(tensors))

    rewrite(folder, {"lora_alpha": 1e38})
    with pytest.raises(LoadError, match=r"adapter_config.json: alpha / rank \(the update's scale\) must be in"):
        Adapter.load(str(folder), engine.weights)
    rewrite(folder, {"lora_alpha": 4})

    with_bool = serialize({**tensors, first: tensors[first] > 0}, {"format": "pt"}, {first: "BOOL"})
    (folder / "adapter_model.safetensors").write_bytes(with_bool)
    with pytest.raises(LoadError, match=f"{first} is BOOL; adapter tensors must be F32, F16, BF16"):
        Adapter.load(str(folder), engine.weights)

    poisoned = tensors[first].copy()
    poisoned[0, 0] = np.nan
    rewrite(folder, tensors={**tensors, first: poisoned})
    code, err = run(capsys, "merge", tiny, folder, "--out", tmp_path / "merged")
    assert code == 1 and f"{first} holds non-finite values (NaN or infinity)" in one_line(err)
    assert not (tmp_path / "merged").exists()


LOOK_ALIKES = {  # what a user may keep beside an output called "out", in the shapes ruvllm's own files take
    ".out.settings": "folder",
    ".out.backup_1": "folder",
    ".out.12345678": "folder",
    ".out.k1l2e3d_": "folder",
    ".out.old.defaults": "folder",
    ".out.old.12345678": "folder",
    ".out.ruvllm-12345678": "folder",  # ruvllm's name, but not its marker inside: a user's
    ".out.lock": "file",
    ".out.12345678.part": "file",
}


def make_look_alikes(parent: Path) -> dict[str, bytes]:
    kept = {}
    for name, kind in LOOK_ALIKES.items():
        if kind == "folder":
            (parent / name).mkdir()
            (parent / name / "notes.txt").write_text(f"the user's {name}")
            kept[f"{name}/notes.txt"] = (parent / name / "notes.txt").read_bytes()
        else:
            (parent / name).write_text(f"the user's {name}")
            kept[name] = (parent / name).read_bytes()
    return kept


@pytest.mark.parametrize("command", ["merge", "mix", "adapt", "convert", "adapt --force over an output"])
def test_nothing_a_user_keeps_beside_out_is_touched_whatever_its_name(tiny, tmp_path, capsys, command):
    """Each of these commands used to delete .out.settings/, .out.backup_1/, .out.12345678/,
    .out.old.defaults/ and .out.lock beside --out, before writing and without --force (issue 35)."""
    pytest.importorskip("tokenizers")  # the model is loaded, text and all
    a, b = adapter_folder(tiny, tmp_path / "a"), adapter_folder(tiny, tmp_path / "b", seed=1)
    parent = tmp_path / "outputs"
    parent.mkdir()
    kept = make_look_alikes(parent)
    out = parent / "out"
    lesson = ["--prompt", "ab", "--completion", "cd", "--steps", "1"]
    args = {
        "merge": ["merge", tiny, a, "--out", out],
        "mix": ["mix", tiny, a, b, "--out", out],
        "adapt": ["adapt", tiny, *lesson, "--out", out],
        "convert": ["convert", tiny, out],
        "adapt --force over an output": ["adapt", tiny, *lesson, "--out", out, "--force"],
    }[command]
    if command.endswith("over an output"):
        out.mkdir()
        (out / "old.txt").write_text("replaced, as --force says")
    code, err = run(capsys, *args)
    assert code == 0, err
    assert {path: (parent / path).read_bytes() for path in kept} == kept
    assert sorted(p.name for p in parent.iterdir()) == sorted([*LOOK_ALIKES, "out"])  # nothing added either
    assert not (out / "old.txt").exists()


def deep_header(depth: int) -> bytes:
    """A safetensors file whose header is JSON nested `depth` levels deep."""
    header = b'{"__metadata__": {"x": ' + b"[" * depth + b"]" * depth + b"}}"
    return len(header).to_bytes(8, "little") + header


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: (f / "adapter_config.json").write_bytes(b'{"r": 2, "x": "\xff\xfe"}'),
         "adapter_config.json is not valid JSON (not UTF-8: byte 0xff at 15)"),
        (lambda f: (f / "adapter_config.json").write_text("[" * 100_000 + "]" * 100_000),
         "adapter_config.json is not valid JSON (nested 100,000 levels deep; at most 100)"),
        (lambda f: (f / "adapter_model.safetensors").write_bytes(deep_header(100_000)),
         "adapter_model.safetensors: the header is not valid JSON (nested 100,002 levels deep; at most 100)"),
        (lambda f: rewrite(f, {"layers_to_transform": [-1]}),
         "adapter_config.json: layers_to_transform must be a layer index in [0, 2) or a non-empty list of them "
         "(this model has 2 layers), got [-1]"),
        (lambda f: rewrite(f, {"layers_to_transform": [0, 7]}), "got [0, 7]"),
        (lambda f: rewrite(f, {"layers_to_transform": []}), "got []"),
    ],
    ids=["not utf-8", "deep config", "deep header", "negative layer", "layer past the model", "no layer"],
)  # fmt: skip
def test_a_broken_adapter_folder_is_a_one_line_error(tiny, tmp_path, capsys, change, message):
    """Each was a traceback (UnicodeDecodeError, RecursionError) or, for [-1], accepted silently."""
    pytest.importorskip("tokenizers")  # the model is loaded, text and all
    folder = adapter_folder(tiny, tmp_path / "a")
    change(folder)
    for args in (["generate", tiny, "--prompt", "ab", "--max-tokens", "1"], ["merge", tiny, folder]):
        code, err = run(capsys, *args, *(["--adapter", folder] if args[0] == "generate" else []),
                        *(["--out", tmp_path / "merged"] if args[0] == "merge" else []))  # fmt: skip
        assert code == 1 and message in one_line(err), err
    assert not (tmp_path / "merged").exists()


def test_an_adapter_whose_values_would_swamp_the_model_is_refused(tiny, tmp_path, capsys):
    """A LoRA tensor of 1e30 used to load, generate past an overflow warning, and merge into a model."""
    engine = load_engine(str(tiny))
    folder = adapter_folder(tiny, tmp_path / "a")
    good = Adapter.load(str(folder), engine.weights)
    name = next(iter(good.A))
    tensors = {
        f"base_model.model.{n}.lora_{p}.weight": a for n in good.A for p, a in (("A", good.A[n]), ("B", good.B[n]))
    }
    tensors[f"base_model.model.{name}.lora_A.weight"] = np.full_like(good.A[name], 1e30)
    rewrite(folder, tensors=tensors)
    with pytest.raises(LoadError, match=rf"{name}'s lora_A holds 1e\+30 \(at most 10000\): not an adapter's"):
        Adapter.load(str(folder), engine.weights)
    code, err = run(capsys, "merge", tiny, folder, "--out", tmp_path / "merged")
    assert code == 1 and f"{name}'s lora_A holds 1e+30" in one_line(err)
    assert not (tmp_path / "merged").exists()
    # each value within bounds, their product not: 2 (scale) x 2 (rank) x 100 x 100
    tensors[f"base_model.model.{name}.lora_A.weight"] = np.full_like(good.A[name], 100)
    tensors[f"base_model.model.{name}.lora_B.weight"] = np.full_like(good.B[name], 100)
    rewrite(folder, tensors=tensors)
    with pytest.raises(LoadError, match=rf"the update of {name} could reach 4e\+04 in one weight"):
        Adapter.load(str(folder), engine.weights)


def test_a_killed_writer_s_work_folder_is_removed_by_the_next_and_two_writers_do_not_mix(tmp_path):
    """A merge or conversion killed outright (SIGKILL: no cleanup runs) leaves its work folder, marked as
    ruvllm's; the next write of the same output removes it, and only it."""
    import fcntl

    from ruvllm.files.outputs import WORK_MARK, WORK_TEXT

    kept = make_look_alikes(tmp_path)
    stale = tmp_path / ".out.ruvllm-k1l2e3d_"
    (stale / "new").mkdir(parents=True)
    (stale / "new" / "model.safetensors").write_bytes(b"half")
    (stale / WORK_MARK).write_text(WORK_TEXT)
    other = tmp_path / ".other.ruvllm-abcdefgh"  # another output's: not this write's to remove
    other.mkdir()
    (other / WORK_MARK).write_text(WORK_TEXT)
    write_files(str(tmp_path / "out"), {"config.json": b"{}"})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*LOOK_ALIKES, "out", other.name])
    assert {path: (tmp_path / path).read_bytes() for path in kept} == kept
    assert os.listdir(tmp_path / "out") == ["config.json"]

    with open(tmp_path / ".other.ruvllm-lock", "w") as held:  # another process writing the same output
        held.write("ruvllm holds this file while it writes the folder beside it\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(InvalidArgumentError, match=r"other is being written by another process"):
            write_files(str(tmp_path / "other"), {"config.json": b"{}"})
        assert (tmp_path / ".other.ruvllm-lock").exists() and other.exists()  # the other writer's stay
    assert not (tmp_path / "other").exists()


def test_a_file_named_as_ruvllm_s_lock_but_not_its_own_is_left_alone_and_the_write_refused(tmp_path):
    (tmp_path / ".out.ruvllm-lock").write_text("my notes")
    with pytest.raises(InvalidArgumentError, match=r"\.out\.ruvllm-lock is there and is not ruvllm's lock file"):
        write_files(str(tmp_path / "out"), {"config.json": b"{}"})
    assert (tmp_path / ".out.ruvllm-lock").read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.ruvllm-lock"]
