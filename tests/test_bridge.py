"""The Pyodide bridge, driven from CPython the way the worker drives it: JSON in and out, weights
streamed in chunks into Python-owned buffers, one token per step."""

from __future__ import annotations

import hashlib
import json

import pytest

from ruvllm.bridge import ModelLoader
from ruvllm.runtime.engine import load_engine
from ruvllm.runtime.generate import GenerationOptions, generate_tokens

from conftest import byte_tokenizer_json, numpy_model


def ok(answer: str):
    data = json.loads(answer)
    assert "error" not in data, data
    return data["ok"]


def error(answer: str) -> dict:
    return json.loads(answer)["error"]


@pytest.fixture()
def folder(tmp_path):
    numpy_model("llama", tmp_path)
    return tmp_path


def stream_model(folder, chunk: int = 4096, sha256: str | None = None, cut: int = 0) -> tuple[ModelLoader, str]:
    loader = ModelLoader()
    ok(loader.set_config((folder / "config.json").read_text()))
    ok(loader.set_tokenizer(json.dumps(byte_tokenizer_json())))
    data = (folder / "model.safetensors").read_bytes()
    request = {"name": "model.safetensors", "size": len(data), "want_sha256": sha256 is not None}
    ok(loader.begin_file(json.dumps(request)))
    body = data[: len(data) - cut]
    for start in range(0, len(body), chunk):
        ok(loader.write("model.safetensors", body[start : start + chunk]))
    return loader, loader.finish_file(json.dumps({"name": "model.safetensors", "sha256": sha256}))


def test_streamed_model_generates_like_the_folder(folder):
    data = (folder / "model.safetensors").read_bytes()
    loader, finished = stream_model(folder, sha256=hashlib.sha256(data).hexdigest())
    assert ok(finished) == {"bytes": len(data)}
    ok(loader.set_options(json.dumps({"context_length": 64})))
    info = ok(loader.build())
    assert info["plan"]["compute"] == "f32"
    assert info["architecture"] == "LlamaForCausalLM" and info["context_length"] == 64
    handle = loader.take_engine()
    request = {"prompt_ids": [1, 2, 3], "eos_ids": [], "options": {"max_tokens": 6, "temperature": 0}}
    assert ok(handle.start(json.dumps(request))) == {"prompt_tokens": 3}
    steps = []
    while (step := ok(handle.step())) is not None:
        steps.append(step)
    expected = list(
        generate_tokens(load_engine(str(folder)), [1, 2, 3], GenerationOptions.from_kwargs(max_tokens=6, temperature=0))
    )
    assert [s["token_id"] for s in steps] == [s.token_id for s in expected]
    assert [s["finish_reason"] for s in steps] == [None] * 5 + ["length"]
    assert steps[0]["stats"]["prefill_ms"] > 0 and steps[-1]["stats"]["completion_tokens"] == 6
    assert "".join(s["text"] for s in steps) == bytes(s.token_id for s in expected).decode(errors="replace")


def test_incomplete_download_is_a_download_error(folder):
    _, finished = stream_model(folder, cut=100)
    size = (folder / "model.safetensors").stat().st_size
    assert error(finished) == {
        "type": "download",
        "message": f"model.safetensors: download incomplete: received {size - 100} of {size} bytes",
    }


def test_sha256_mismatch_is_a_download_error(folder):
    _, finished = stream_model(folder, sha256="ab" * 32)
    got = error(finished)
    assert got["type"] == "download"
    assert got["message"].startswith(f"model.safetensors: sha256 mismatch: expected {'ab' * 32}, got ")


def test_more_bytes_than_announced_is_a_download_error(folder):
    loader = ModelLoader()
    ok(loader.begin_file(json.dumps({"name": "model.safetensors", "size": 10})))
    ok(loader.write("model.safetensors", b"12345678"))
    assert error(loader.write("model.safetensors", b"abc")) == {
        "type": "download",
        "message": "model.safetensors: received more than the announced 10 bytes",
    }


@pytest.mark.parametrize("name", [None, 7])
def test_a_file_without_a_string_name_is_refused_before_any_byte(name):
    request = {"size": 10} if name is None else {"name": name, "size": 10}
    assert error(ModelLoader().begin_file(json.dumps(request))) == {
        "type": "invalid_argument",
        "message": f"the request's 'name' must be a string, got {name!r}",
    }


def test_corrupt_weights_and_bad_config_are_load_errors(folder):
    loader = ModelLoader()
    assert error(loader.set_config('{"architectures": ["BertModel"]}'))["message"].startswith(
        "config.json: unsupported architecture BertModel"
    )
    assert error(loader.set_config("{nope"))["type"] == "load"
    ok(loader.set_config((folder / "config.json").read_text()))
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:30] = b"!" * 22
    ok(loader.begin_file(json.dumps({"name": "model.safetensors", "size": len(data)})))
    ok(loader.write("model.safetensors", bytes(data)))
    got = error(loader.finish_file(json.dumps({"name": "model.safetensors"})))
    assert got["type"] == "load" and got["message"].startswith("model.safetensors: the header is not valid JSON")


def test_generation_errors_keep_their_type(folder):
    loader, finished = stream_model(folder)
    ok(finished)
    ok(loader.set_options(json.dumps({"context_length": 16})))
    ok(loader.build())
    handle = loader.take_engine()
    too_long = {"prompt_ids": list(range(20)), "options": {}}
    assert error(handle.start(json.dumps(too_long))) == {
        "type": "context_full",
        "message": "the prompt has 20 tokens but the context window is 16",
    }
    bad_option = {"prompt_ids": [1], "options": {"top_p": 2}}
    assert error(handle.start(json.dumps(bad_option))) == {
        "type": "invalid_argument",
        "message": "top_p must be in (0, 1], got 2",
    }
    bad_token = {"prompt_ids": [1, 100000], "options": {}}
    assert error(handle.start(json.dumps(bad_token))) == {
        "type": "invalid_argument",
        "message": "token id 100000 is outside the vocabulary [0, 128)",
    }
    assert ok(handle.step()) is None  # nothing started


def test_stop_abandons_a_generation(folder):
    loader, finished = stream_model(folder)
    ok(finished)
    ok(loader.build())
    handle = loader.take_engine()
    ok(handle.start(json.dumps({"prompt_ids": [1, 2], "options": {"max_tokens": 50}})))
    ok(handle.step())
    assert ok(handle.stop()) is True
    assert ok(handle.step()) is None


def test_the_plan_comes_from_headers_before_any_data(folder):
    loader = ModelLoader()
    ok(loader.set_config((folder / "config.json").read_text()))
    ok(loader.set_tokenizer(json.dumps(byte_tokenizer_json())))
    data = (folder / "model.safetensors").read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    ok(loader.add_header("model.safetensors", len(data), data[:header_end]))
    plan = ok(loader.plan())
    assert (
        plan["compute"] == "f32"
        and plan["total_bytes"] == plan["weight_bytes"] + plan["kv_bytes"] + plan["workspace_bytes"]
    )
    ok(loader.set_options(json.dumps({"memory_budget": 100_000, "compute": "auto"})))
    refused = error(loader.plan())
    assert refused["type"] == "load" and refused["message"].startswith(
        "the model does not fit the memory budget of 0 MiB"
    )
    ok(loader.set_options(json.dumps({"compute": "q4", "kv": {"hot_tokens": 16, "cold": "int4"}})))
    small = ok(loader.plan())
    assert small["compute"] == "q4" and small["weight_bytes"] < plan["weight_bytes"] / 4
    assert error(loader.set_options(json.dumps({"kv": {"hot": 3}})))["message"] == "unknown kv option 'hot'"


def test_a_long_prompt_comes_back_between_its_forward_calls_so_an_abort_can_get_in(folder):
    loader, finished = stream_model(folder)
    ok(finished)
    ok(loader.build())
    handle = loader.take_engine()
    handle.engine.prefill_chunk = 8  # as Pyodide's 32, on a tiny prompt
    prompt = list(range(1, 21))
    ok(handle.start(json.dumps({"prompt_ids": prompt, "options": {"max_tokens": 3, "temperature": 0}})))
    assert ok(handle.step()) == {"prefilling": {"done": 8, "total": 20}}
    assert ok(handle.step()) == {"prefilling": {"done": 16, "total": 20}}
    tokens = [ok(handle.step())["token_id"] for _ in range(3)]
    assert ok(handle.step()) is None
    options = GenerationOptions.from_kwargs(max_tokens=3, temperature=0)
    assert tokens == [s.token_id for s in generate_tokens(load_engine(str(folder)), prompt, options)]
    ok(handle.start(json.dumps({"prompt_ids": prompt, "options": {"max_tokens": 3}})))
    ok(handle.step())
    assert ok(handle.stop()) is True  # an abort while the prompt is read
    assert ok(handle.step()) is None


def test_lessons_take_their_first_step_at_once_then_learn_in_slices(folder):
    loader, finished = stream_model(folder)
    ok(finished)
    ok(loader.build())
    handle = loader.take_engine()
    made = ok(handle.new_adapter(json.dumps({"name": "a", "targets": ["down_proj"], "layers": [-1]})))
    assert made == {"name": "a", "rank": 32, "targets": ["down_proj"], "layers": [1]}
    request = {"key": 7, "adapter": "a", "prompt_ids": [1, 2, 3], "completion_ids": [4, 5], "steps": 3}
    request |= {"until_greedy": False, "rehearse": 0, "keep": 0}  # three plain steps
    first = ok(handle.feedback(json.dumps(request)))
    assert first.pop("elapsed_ms") >= 0
    assert first == {
        "key": 7,
        "phase": "learning",
        "step": 1,
        "steps": 3,
        "rehearsed": 0,
        "version": 1,
        "done": False,
        "applied": True,
        "cancelled": False,
        "outcome": None,
        "prepared": None,
        "ahead": 0,
        "note": None,
        "report": None,
    }
    sliced = ok(handle.learn(json.dumps({"budget_ms": 0})))  # one unit of work: the step is not taken yet
    assert [(p["key"], p["step"], p["done"]) for p in sliced["lessons"]] == [(7, 1, False)] and sliced["waiting"] == 1
    last = ok(handle.learn(json.dumps({"budget_ms": None})))
    (done,) = last["lessons"]
    assert done["done"] and done["phase"] == "done" and done["report"]["steps"] == 3
    assert done["outcome"] == done["report"]["outcome"] == "most_steps"
    assert done["elapsed_ms"] == round(done["report"]["wall_ms"], 1) > 0
    assert last == {"lessons": [done], "waiting": 0, "preparing": False, "prepared": None}
    names = ok(handle.adapter_names())
    assert names.pop("adapters") == [
        {"name": "a", "kind": "lora", "version": 3, "rank": 32, "alpha": 64.0, "targets": ["down_proj"], "layers": [1]}
        | {"active": True}
    ]
    assert names == {"names": ["a"], "active": "a", "versions": {"a": 3}, "learning": 0, "preparing": False}
    idle = {"lessons": [], "waiting": 0, "preparing": False, "prepared": None}
    assert ok(handle.learn(json.dumps({"budget_ms": 10}))) == idle

    # the default adapter's projection, made in idle time before any lesson needs it
    # (the text's ids, then whole chat turns while they fit)
    assert ok(handle.set_calibration(json.dumps({"ids": list(range(3, 50)), "turns": [list(range(50, 60))]}))) == 57
    refused = json.loads(handle.set_calibration(json.dumps({"ids": [3], "turns": [["a"]]})))
    assert refused["error"]["message"] == "turns must be a list of integers"
    assert ok(handle.prepare_learning()) == {"preparing": True} and ok(handle.adapter_names())["preparing"]
    one = ok(handle.learn(json.dumps({"budget_ms": 0})))  # one unit: a chunk of the calibration text, 2 layers
    assert one["preparing"] and one["prepared"]["done"] == 1 < one["prepared"]["total"]
    assert ok(handle.learn(json.dumps({"budget_ms": None}))) == idle
    assert not ok(handle.adapter_names())["preparing"]
    assert ok(handle.prepare_learning()) == {"preparing": False}  # made: nothing left to do

    # the instant loop a unit at a time: the lesson's first step, then its progress in the background
    partial = ok(handle.feedback(json.dumps({**request, "key": 8, "budget_ms": 0})))
    assert (partial["phase"], partial["step"], partial["applied"], partial["version"]) == ("learning", 0, False, 3)
    assert "already under way" in error(handle.feedback(json.dumps({**request, "key": 8})))["message"]
    while not partial["applied"]:
        partial = ok(handle.first_step(json.dumps({"key": 8, "budget_ms": 0})))
    assert (partial["step"], partial["version"]) == (1, 4)
    unknown = error(handle.first_step(json.dumps({"key": 99, "budget_ms": 0})))
    assert unknown == {"type": "invalid_argument", "message": "no lesson with key 99 is under way"}
    behind = ok(handle.feedback(json.dumps({**request, "key": 10})))
    assert (behind["phase"], behind["ahead"], behind["step"]) == ("waiting", 1, 1)
    (cancelled, waiting) = ok(handle.cancel_learning(json.dumps({"key": 8})))["lessons"]
    assert (cancelled["key"], cancelled["step"], cancelled["cancelled"], cancelled["done"]) == (8, 1, True, False)
    assert cancelled["phase"] == "cancelled" and (waiting["key"], waiting["phase"], waiting["ahead"]) == (
        10,
        "learning",
        0,
    )
    assert ok(handle.adapter_names())["versions"] == {"a": 5}  # their first steps stay

    # a lesson whose adapter is replaced is dropped, and says so: it was not cancelled
    ok(handle.new_adapter(json.dumps({"name": "a", "targets": ["down_proj"], "layers": [-1]})))
    (dropped,) = ok(handle.learn(json.dumps({"budget_ms": None})))["lessons"]
    assert (dropped["key"], dropped["phase"], dropped["cancelled"], dropped["done"]) == (10, "dropped", False, False)
    assert dropped["note"] == "its adapter 'a' was replaced before the lesson finished (what it taught went with it)"
    bad = error(handle.feedback(json.dumps({**request, "key": 9, "completion_ids": "x"})))
    assert bad == {"type": "invalid_argument", "message": "completion_ids must be a list of integers"}


def test_a_file_larger_than_one_array_on_one_thread_says_to_load_with_threads(monkeypatch):
    """In Pyodide (wasm32) one array holds at most 2 GiB: a larger weight file cannot be held in its memory
    on one thread (NumPy's own error was "Maximum allowed dimension exceeded"); with threads it stays outside."""
    import ruvllm.bridge

    monkeypatch.setattr(ruvllm.bridge, "MAX_ARRAY_BYTES", 2**31 - 1)
    request = {"name": "model.safetensors", "size": 3 * 2**30}
    assert error(ModelLoader().begin_file(json.dumps(request))) == {
        "type": "load",
        "message": "model.safetensors is 3.0 GiB, more than one array of Pyodide's memory holds (2.0 GiB), where "
        "the weight files go on one thread; load with threads: 2 or more (the files then stay outside it; a "
        "browser page must be cross-origin isolated)",
    }
    request["size"] = 2**31 - 1  # the largest that fits is taken (CPython allocates it lazily)
    assert ok(ModelLoader().begin_file(json.dumps(request))) == 2**31 - 1
