"""Compute forms (matrices.py): int8 and packed int4 in memory give the same logits as float32 for the
same stored values; float models are quantized at load (runtime quantization); both kernels agree."""

from __future__ import annotations

import numpy as np
import pytest

from ruvllm.errors import InvalidArgumentError
from ruvllm.files.formats import get_format
from ruvllm.model.weights import ComputeOptions, prepare_matrix
from ruvllm.quant import matrices
from ruvllm.quant.matrices import DenseMatrix, Int4Matrix, Int8Matrix
from ruvllm.runtime.assembly import load_engine, open_store

from conftest import numpy_model

IDS = np.random.default_rng(5).integers(0, 128, 24)


@pytest.mark.parametrize("fmt", ["q8", "q4_0", "q4_1"])
@pytest.mark.parametrize("form", ["q8", "q4"])
@pytest.mark.parametrize("kernel", ["blas", "einsum", "blas-small-tiles"])
def test_quantized_matrices_compute_their_exact_values(fmt, form, kernel, monkeypatch):
    if kernel == "blas-small-tiles":  # 7 rows per tile: 14 tiles, the last one partial
        monkeypatch.setattr(matrices, "TILE_ELEMENTS", 7 * 160)
        kernel = "blas"
    w = np.random.default_rng(0).normal(0, 0.1, (96, 160)).astype(np.float32)
    parts = get_format(fmt).quantize(w)
    exact = get_format(fmt).dequantize(parts, w.shape)
    matrix = prepare_matrix(fmt, parts, w.shape, ComputeOptions(form=form, numpy_kernel=kernel))
    expected_type = Int8Matrix if form == "q8" or fmt == "q8" else Int4Matrix
    assert type(matrix) is expected_type
    np.testing.assert_array_equal(matrix.dequantize(), exact)
    np.testing.assert_array_equal(matrix.rows(np.array([3, 0, 95])), exact[[3, 0, 95]])
    for rows in (1, 3, 9):  # grouped contraction and expanded product
        x = np.random.default_rng(rows).normal(size=(rows, 160)).astype(np.float32)
        np.testing.assert_allclose(matrix(x), x @ exact.T, rtol=2e-5, atol=2e-5)
    assert matrix.nbytes < w.nbytes / (2.5 if form == "q8" or fmt == "q8" else 5)


def test_float_tensors_are_quantized_at_load(tmp_path):
    numpy_model("llama", tmp_path)
    store = open_store(str(tmp_path))
    name = "model.layers.0.mlp.up_proj.weight"
    w = store.load_f32(name)
    for form, fmt in (("q8", "q8"), ("q4", "q4_1")):
        matrix = prepare_matrix("f32", store.parts(name), w.shape, ComputeOptions(form=form))
        fmt_ = get_format(fmt)
        np.testing.assert_array_equal(matrix.dequantize(), fmt_.dequantize(fmt_.quantize(w), w.shape))
    q4_0 = prepare_matrix("f32", store.parts(name), w.shape, ComputeOptions(form="q4", isq_format="q4_0"))
    assert q4_0.offset == 8


def run(engine, ids=IDS) -> np.ndarray:
    cache = engine.new_cache()
    out = [engine.forward(ids[:16], 0, cache)]  # a prefill (expanded product) ...
    for i in range(16, len(ids)):  # ... and decode steps (grouped product)
        out.append(engine.forward(ids[i : i + 1], i, cache))
    return np.concatenate(out)


def test_kernels_agree(tmp_path):
    numpy_model("qwen2", tmp_path)
    blas = run(load_engine(str(tmp_path), compute=ComputeOptions(numpy_kernel="blas")))
    np.testing.assert_allclose(
        run(load_engine(str(tmp_path), compute=ComputeOptions(numpy_kernel="einsum"))), blas, atol=1e-5
    )


@pytest.mark.parametrize("form", ["q8", "q4"])
def test_a_quantized_form_computes_the_model_it_holds(tmp_path, form):
    """Logits of the q8/q4 engine equal a float32 engine holding the same (quantized) values."""
    numpy_model("qwen2", tmp_path)
    quantized = load_engine(str(tmp_path), compute=ComputeOptions(form=form))
    dense = load_engine(str(tmp_path))
    for q_layer, d_layer in zip(quantized.weights.layers, dense.weights.layers, strict=True):
        for group in ("self_attn", "mlp"):
            for name, lin in getattr(q_layer, group).projections().items():
                getattr(getattr(d_layer, group), name).matrix = DenseMatrix(lin.matrix.dequantize())
    dense.weights.embed_tokens = DenseMatrix(quantized.weights.embed_tokens.dequantize())
    dense.weights.lm_head.matrix = DenseMatrix(quantized.weights.lm_head.matrix.dequantize())
    np.testing.assert_allclose(run(quantized), run(dense), atol=1e-4)
    assert quantized.weights.nbytes < dense.weights.nbytes / (3 if form == "q8" else 5)


def test_smollm2_in_every_form_gives_the_same_tokens(smollm2_dir, smollm2):
    """SmolLM2 is stored q4_1 (embedding q8): every form holds exactly those values."""
    prompt = smollm2.tokenizer.encode("The three primary colors are")
    expected = [c.token_id for c in smollm2.generate(prompt, max_tokens=16, temperature=0, ignore_eos=True)]
    from ruvllm.runtime.generate import GenerationOptions, generate_tokens

    for form in ("q8", "q4"):
        engine = load_engine(str(smollm2_dir), compute=ComputeOptions(form=form))
        assert type(engine.weights.embed_tokens) is Int8Matrix  # q8 storage stays int8 even under q4
        kinds = {type(engine.weights.layers[0].mlp.up_proj.matrix)}
        assert kinds == ({Int8Matrix} if form == "q8" else {Int4Matrix})
        options = GenerationOptions.from_kwargs(max_tokens=16, temperature=0, ignore_eos=True)
        assert [s.token_id for s in generate_tokens(engine, prompt, options)] == expected
        assert engine.weights.nbytes < (170e6 if form == "q8" else 120e6)  # f32: 538 MB
    assert type(smollm2.engine.weights.embed_tokens) is DenseMatrix


def test_bad_compute_options_are_refused():
    with pytest.raises(InvalidArgumentError, match="compute must be one of f32, q8, q4, got 'q2'"):
        ComputeOptions(form="q2")
    with pytest.raises(InvalidArgumentError, match="numpy_kernel must be one of blas, einsum, got 'gpu'"):
        ComputeOptions(numpy_kernel="gpu")
