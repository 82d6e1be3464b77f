"""The Pyodide bridge, driven from CPython the way the worker drives it: JSON in and out, weights
streamed in chunks into Python-owned buffers, one token per step."""

from __future__ import annotations

import hashlib
import json

import pytest

from ruvllm.bridge import ModelLoader
from ruvllm.errors import LoadError
from ruvllm.runtime.assembly import load_engine
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


def give_documents(loader: ModelLoader, folder) -> dict:
    """Hand over the folder's JSON files as the loader asks for them (the byte tokenizer for tokenizer.json);
    what it wants after them."""
    while (want := ok(loader.next()))["part"] == "document":
        path = folder / want["name"]
        data = path.read_bytes() if path.exists() else None
        if want["name"] == "tokenizer.json":
            data = json.dumps(byte_tokenizer_json()).encode()
        ok(loader.give_document(want["name"], data))
    return want


def give_header(loader: ModelLoader, data: bytes, name: str = "model.safetensors") -> str:
    """Hand over a weight file's first bytes, as many as the loader says hold its header; its answer."""
    at = ok(loader.header_size(name, len(data), data[:8]))
    return loader.give_header(name, len(data), data[:at])


def stream_model(
    folder, chunk: int = 4096, sha256: str | None = None, cut: int = 0, options: dict | None = None
) -> tuple[ModelLoader, str]:
    loader = ModelLoader()
    options = (options or {}) | ({"sha256": {"model.safetensors": sha256}} if sha256 else {})
    ok(loader.set_options(json.dumps(options), None))
    assert give_documents(loader, folder) == {"name": "model.safetensors", "part": "header", "optional": False}
    data = (folder / "model.safetensors").read_bytes()
    ok(give_header(loader, data))
    assert ok(loader.next()) == {"name": "model.safetensors", "part": "data", "optional": False}
    ok(loader.begin_file(json.dumps({"name": "model.safetensors", "size": len(data)})))
    body = data[: len(data) - cut]
    for start in range(0, len(body), chunk):
        ok(loader.write("model.safetensors", body[start : start + chunk]))
    return loader, loader.finish_file(json.dumps({"name": "model.safetensors"}))


def test_streamed_model_generates_like_the_folder(folder):
    data = (folder / "model.safetensors").read_bytes()
    loader, finished = stream_model(folder, sha256=hashlib.sha256(data).hexdigest(), options={"context_length": 64})
    assert ok(finished) == {"bytes": len(data)}
    assert ok(loader.next()) is None
    info = ok(loader.build())
    assert info["plan"]["compute"] == "f32"
    assert info["architecture"] == "LlamaForCausalLM" and info["context_length"] == 64
    # CPython's NumPy kernels offer no memory to run the decode plan in: the info says why not
    assert info["decode_plan"] is False and info["plan_note"].startswith("no kernel memory to run it in")
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


def test_requests_are_read_by_their_shape_each_field_checked_and_named():
    loader = ModelLoader()
    assert error(loader.set_options(json.dumps({"contextLength": 64}), None)) == {
        "type": "invalid_argument",
        "message": "unknown field 'contextLength' in the load options",
    }
    assert error(loader.set_options(json.dumps({"context_length": "64"}), None)) == {
        "type": "invalid_argument",
        "message": 'context_length in the load options must be an integer or null, got "64"',
    }
    assert error(loader.set_options(json.dumps({"sha256": {"m.gguf": 5}}), "m.gguf"))["message"] == (
        "sha256 in the load options must be an object of strings or null, got an object"
    )
    assert error(loader.set_options(json.dumps({"plan": "no"}), None)) == {
        "type": "invalid_argument",
        "message": 'plan in the load options must be true or false, got "no"',
    }
    ok(loader.set_options(json.dumps({"plan": False}), None))
    assert loader.assembly is not None and loader.assembly.options.plan is False
    ok(loader.set_options(json.dumps({"compute": None, "kv": None}), None))  # null: the default
    assert loader.assembly is not None and loader.assembly.options.compute == "auto"


def test_a_digest_for_a_file_the_model_lacks_is_refused_before_its_weights(folder):
    loader = ModelLoader()
    ok(loader.set_options(json.dumps({"sha256": {"model.safetensor": "ab" * 32}}), None))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert ok(loader.next())["name"] == name
        data = (folder / name).read_bytes() if (folder / name).exists() else None
        ok(loader.give_document(name, json.dumps(byte_tokenizer_json()).encode() if name == "tokenizer.json" else data))
    assert error(loader.give_document("model.safetensors.index.json", None)) == {
        "type": "invalid_argument",
        "message": 'options.sha256 names "model.safetensor", which this model does not have; its weight files '
        "are: model.safetensors",
    }
    gguf = ModelLoader().set_options(json.dumps({"sha256": {"model.safetensors": "ab" * 32}}), "m.gguf")
    assert error(gguf)["message"].endswith("which this model does not have; its weight files are: m.gguf")


def test_more_bytes_than_announced_is_a_download_error(folder):
    loader = ModelLoader()
    ok(loader.set_options("{}", None))
    give_documents(loader, folder)
    data = (folder / "model.safetensors").read_bytes()
    ok(give_header(loader, data))
    ok(loader.begin_file(json.dumps({"name": "model.safetensors", "size": len(data)})))
    ok(loader.write("model.safetensors", data))
    assert error(loader.write("model.safetensors", b"abc")) == {
        "type": "download",
        "message": f"model.safetensors: received more than the announced {len(data)} bytes",
    }


def test_files_out_of_turn_are_refused_naming_what_was_wanted(folder):
    loader = ModelLoader()
    assert error(loader.next()) == {"type": "load", "message": "set_options was not called before the model's files"}
    ok(loader.set_options("{}", None))
    data = (folder / "model.safetensors").read_bytes()
    assert error(give_header(loader, data)) == {
        "type": "load",
        "message": "model.safetensors came out of turn: the model's assembly wanted the document of config.json",
    }


@pytest.mark.parametrize("name", [None, 7])
def test_a_file_without_a_string_name_is_refused_before_any_byte(name):
    request = {"size": 10} if name is None else {"name": name, "size": 10}
    assert error(ModelLoader().begin_file(json.dumps(request))) == {
        "type": "invalid_argument",
        "message": f"name in the request must be a string, got {json.dumps(name)}",
    }


def test_corrupt_weights_and_bad_config_are_load_errors(folder):
    loader = ModelLoader()
    ok(loader.set_options("{}", None))
    assert error(loader.give_document("config.json", b'{"architectures": ["BertModel"]}'))["message"].startswith(
        "config.json: unsupported architecture BertModel"
    )
    assert error(loader.give_document("config.json", b"{nope"))["type"] == "load"
    give_documents(loader, folder)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:30] = b"!" * 22
    got = error(give_header(loader, bytes(data)))
    assert got["type"] == "load" and got["message"].startswith("model.safetensors: the header is not valid JSON")


def test_generation_errors_keep_their_type(folder):
    loader, finished = stream_model(folder, options={"context_length": 16})
    ok(finished)
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
    data = (folder / "model.safetensors").read_bytes()

    def plan(options: dict) -> str:
        loader = ModelLoader()
        ok(loader.set_options(json.dumps(options), None))
        give_documents(loader, folder)
        return give_header(loader, data)

    dense = ok(plan({}))
    assert (
        dense["compute"] == "f32"
        and dense["total_bytes"] == dense["weight_bytes"] + dense["kv_bytes"] + dense["workspace_bytes"]
    )
    refused = error(plan({"memory_budget": 100_000, "compute": "auto"}))
    assert refused["type"] == "load" and refused["message"].startswith(
        "the model does not fit the memory budget of 0 MiB"
    )
    small = ok(plan({"compute": "q4", "kv": {"hot_tokens": 16, "cold": "int4"}}))
    assert small["compute"] == "q4" and small["weight_bytes"] < dense["weight_bytes"] / 4
    assert (
        error(ModelLoader().set_options(json.dumps({"kv": {"hot": 3}}), None))["message"] == "unknown kv option 'hot'"
    )


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
    # (CPython has no kernels, so no decode plan: the note says why, as info's plan_note does)
    assert names.pop("plan_note") == handle.engine.plan_note and names.pop("decode_plan") is False
    assert names == {"names": ["a"], "active": "a", "versions": {"a": 3}, "learning": 0, "preparing": False}
    idle = {"lessons": [], "waiting": 0, "preparing": False, "prepared": None}
    assert ok(handle.learn(json.dumps({"budget_ms": 10}))) == idle

    # the default adapter's projection, made in idle time before any lesson needs it
    # (the text's ids, then whole chat turns while they fit)
    assert ok(handle.set_calibration(json.dumps({"ids": list(range(3, 50)), "turns": [list(range(50, 60))]}))) == 57
    refused = json.loads(handle.set_calibration(json.dumps({"ids": [3], "turns": [["a"]]})))
    assert (
        refused["error"]["message"] == "turns in the request must be a list of lists of integers, got a list of 1 item"
    )
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
    message = 'completion_ids in the request must be a list of integers, got "x"'
    assert bad == {"type": "invalid_argument", "message": message}


def test_a_file_larger_than_one_array_on_one_thread_says_to_load_with_threads(monkeypatch):
    """In Pyodide (wasm32) one array holds at most 2 GiB: a larger weight file cannot be held in its memory
    on one thread (NumPy's own error was "Maximum allowed dimension exceeded"); with threads it stays outside."""
    import ruvllm.bridge

    monkeypatch.setattr(ruvllm.bridge, "MAX_ARRAY_BYTES", 2**31 - 1)
    with pytest.raises(LoadError) as refused:
        ModelLoader()._buffers(3 * 2**30, "model.safetensors")  # where a weight file of that size would go
    assert str(refused.value) == (
        "model.safetensors is 3.0 GiB, more than one array of Pyodide's memory holds (2.0 GiB), where "
        "the weight files go on one thread; load with threads: 2 or more (the files then stay outside it; a "
        "browser page must be cross-origin isolated)"
    )
    assert ModelLoader()._buffers(2**31 - 1, "model.safetensors").size == 2**31 - 1  # the largest that fits
