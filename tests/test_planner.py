"""The memory plan: weights and KV bytes predicted before loading equal what loading then takes, and
`auto` picks the fastest compute form that fits the budget."""

from __future__ import annotations

import numpy as np
import pytest

from ruvllm.errors import InvalidArgumentError, LoadError
from ruvllm.model.cache import KVOptions
from ruvllm.runtime.assembly import load_engine, open_model
from ruvllm.runtime.engine import Engine, LoadOptions, plan_for
from ruvllm.runtime.generate import GenerationOptions, generate_tokens

from conftest import numpy_model


@pytest.mark.parametrize("form", ["f32", "q8", "q4", "q4 as q4_0"])
def test_planned_weight_bytes_are_what_loading_takes(smollm2_dir, tmp_path, form):
    numpy_model("qwen2", tmp_path)  # float storage: q8/q4 mean quantizing at load
    form, _, isq_format = form.partition(" as ")
    for folder in (smollm2_dir, tmp_path):
        engine = load_engine(str(folder), compute=form, isq_format=isq_format or "q4_1")
        assert engine.plan.compute == form
        assert engine.plan.weight_bytes == engine.weights.nbytes


def test_planned_kv_bytes_are_what_a_full_cache_takes(tmp_path):
    numpy_model("llama", tmp_path, max_position_embeddings=1024)
    engine = load_engine(str(tmp_path), context_length=600)
    cache = engine.new_cache()
    cache.reserve(600)
    assert engine.plan.kv_bytes == cache.nbytes


def test_auto_picks_the_fastest_form_that_fits(smollm2_dir):
    config, store = open_model(str(smollm2_dir), header_only=True)
    plans = {form: plan_for(config, store, LoadOptions(compute=form)) for form in ("f32", "q8", "q4")}
    assert plans["f32"].total_bytes > plans["q8"].total_bytes > plans["q4"].total_bytes
    assert plans["f32"].weight_bytes_by_form == {"f32": plans["f32"].weight_bytes - 576 * 61 * 4}
    assert set(plans["q4"].weight_bytes_by_form) == {"q8", "q4"}  # the q8 embedding stays int8
    assert plan_for(config, store, LoadOptions()).compute == "f32"  # no budget: the fastest
    budget = plans["f32"].total_bytes - 1
    assert plan_for(config, store, LoadOptions(memory_budget=budget)).compute == "q8"
    assert plan_for(config, store, LoadOptions(memory_budget=plans["q4"].total_bytes)).compute == "q4"
    smaller_cache = LoadOptions(memory_budget=budget, context_length=512, kv=KVOptions(hot_tokens=64, cold="int4"))
    assert plan_for(config, store, smaller_cache).compute == "f32"  # a smaller cache leaves room for f32


def test_a_plan_that_cannot_fit_is_refused_before_loading(smollm2_dir):
    with pytest.raises(
        LoadError, match=r"the model does not fit the memory budget of 64 MiB: in its smallest form \(q4\)"
    ):
        load_engine(str(smollm2_dir), memory_budget=64 * 2**20)
    with pytest.raises(LoadError, match=r"try compute='auto', q8 or q4, or a smaller context_length"):
        load_engine(str(smollm2_dir), compute="f32", memory_budget=300 * 2**20)


def test_a_two_tier_cache_stays_within_its_planned_bytes(tmp_path):
    """Prefill in several chunks, then decoding to the end of the context: the hot tier never grows
    past hot_tokens + migrate_batch + one chunk, so the cache holds to the plan."""
    numpy_model("llama", tmp_path, max_position_embeddings=1024)
    kv = KVOptions(hot_tokens=32, cold="int8")
    engine = load_engine(str(tmp_path), context_length=600, kv=kv)
    cache = engine.new_cache()
    prompt = [i % 100 + 3 for i in range(300)]  # two prefill chunks
    options = GenerationOptions.from_kwargs(max_tokens=300, temperature=0, ignore_eos=True)
    steps = list(generate_tokens(engine, prompt, options, cache=cache))
    assert steps[-1].finish_reason == "length", cache.length
    assert cache.nbytes <= engine.plan.kv_bytes


class CountingProvider:
    """A kernel provider that computes with NumPy and counts what it was given (quant/provider.py)."""

    name, arithmetic = "counting", "exact"

    def __init__(self) -> None:
        self.prepared, self.calls = [], 0

    def prepare(self, matrix):
        self.prepared.append(matrix)
        w = matrix.dequantize().astype(np.float32)

        def product(x):
            self.calls += 1
            return x @ w.T

        return product


def test_with_a_kernel_provider_auto_keeps_a_quantized_model_in_its_own_form(smollm2_dir, tmp_path):
    config, store = open_model(str(smollm2_dir), header_only=True)
    provider = CountingProvider()
    assert plan_for(config, store, LoadOptions(provider=provider)).compute == "q4"  # q4_1 layers, q8 embedding
    assert plan_for(config, store, LoadOptions(provider=provider, kernels="numpy")).compute == "f32"
    numpy_model("llama", tmp_path)  # float32 weights: not quantized unless asked
    tiny_config, tiny_store = open_model(str(tmp_path), header_only=True)
    assert plan_for(tiny_config, tiny_store, LoadOptions(provider=provider)).compute == "f32"


def test_the_engine_computes_every_product_through_the_provider(tmp_path):
    numpy_model("llama", tmp_path)
    provider = CountingProvider()
    engine = Engine.from_store(*open_model(str(tmp_path)), LoadOptions(provider=provider))
    reference = load_engine(str(tmp_path), kernels="numpy")
    assert engine.kernels == "counting" and reference.kernels == "numpy"
    assert {id(m) for m in provider.prepared} == {id(m) for m in engine.weights.matrices()}
    options = GenerationOptions.from_kwargs(max_tokens=8, temperature=0, ignore_eos=True)
    ids = [s.token_id for s in generate_tokens(engine, [1, 2, 3], options)]
    assert ids == [s.token_id for s in generate_tokens(reference, [1, 2, 3], options)]
    assert provider.calls >= 8 * (7 * engine.config.num_hidden_layers + 1)  # every projection of every step


def test_kernels_must_be_a_known_choice_and_wasm_needs_a_runtime_that_offers_it(tmp_path):
    numpy_model("llama", tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"kernels must be one of auto, wasm, numpy, got 'simd'"):
        load_engine(str(tmp_path), kernels="simd")
    with pytest.raises(InvalidArgumentError, match=r"kernels='wasm' needs the WebAssembly SIMD kernels \(in Pyodide"):
        load_engine(str(tmp_path), kernels="wasm")
