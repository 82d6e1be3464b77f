"""The instant loop of MicroLoRA on a tiny model: the cache keeps the hidden states entering the
adapted layers (its tap), a lesson starts from them instead of a forward through the layers below,
and after learning only the adapted layers' keys and values are recomputed."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from ruvllm.learning.adapters import AdapterSet
from ruvllm.learning.backprop import entering_states
from ruvllm.learning.learn import REHEARSAL_STEPS, AdaptOptions, Learner, Lesson
from ruvllm.learning.lora import Adapter, LoRAConfig
from ruvllm.learning.per_model import ModelLearning
from ruvllm.runtime.assembly import load_engine
from ruvllm.runtime.generate import GenerationOptions, Prefilling, generate_tokens

from conftest import numpy_model, tiny_model

PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 128, 20)]
GREEDY = GenerationOptions.from_kwargs(max_tokens=6, temperature=0, ignore_eos=True)


def plain(**options) -> AdaptOptions:
    """Lesson options for checking the mechanics: fixed steps, no rehearsal, kept predictions, projection
    or keyed rows (A and B train, unless asked)."""
    return AdaptOptions(
        **{"until_greedy": False, "rehearse": 0, "keep": 0.0, "project": 0.0, "keyed": False, **options}
    )


class Counting:
    """A matrix that counts the rows it multiplies (to see which layers a forward ran)."""

    def __init__(self, matrix) -> None:
        self.matrix, self.rows = matrix, 0
        self.shape, self.kernel = matrix.shape, getattr(matrix, "kernel", "blas")

    def __call__(self, x):
        self.rows += x.shape[0]
        return self.matrix(x)

    def dequantize(self):
        return self.matrix.dequantize()


@pytest.fixture
def engine(tmp_path):
    numpy_model("llama", tmp_path, num_hidden_layers=4)
    engine = load_engine(str(tmp_path))
    AdapterSet.attached(engine).tap_layer = 2
    return engine


def top_adapter(engine, name="a") -> Adapter:
    adapter = Adapter.new(engine.weights, LoRAConfig(targets=("down_proj",), layers=(-2, -1)))
    engine.wrappers.add(name, adapter)
    engine.wrappers.activate(name)
    return adapter


def run(engine, prompt, cache, **kwargs):
    steps = list(generate_tokens(engine, prompt, GREEDY, cache=cache, **kwargs))
    return [s.token_id for s in steps if not isinstance(s, Prefilling)], steps[0]


def test_the_tap_keeps_the_hidden_states_entering_its_layer(engine):
    cache = engine.new_cache()
    run(engine, PROMPT, cache)
    held = len(cache.tokens)
    assert cache.tap.layer == 2 and cache.tap.length == held == len(PROMPT) + GREEDY.max_tokens - 1
    expected = entering_states(engine.model, cache.tokens, 2)
    np.testing.assert_allclose(cache.tap.read(held), expected, rtol=1e-5, atol=1e-4)


def test_a_lesson_starts_from_the_generation_s_hidden_states(engine):
    adapter = top_adapter(engine)
    cache = engine.new_cache()
    answer, _ = run(engine, PROMPT, cache)
    twin = copy.deepcopy(adapter)
    options = plain(steps=2, lr=0.01)
    tapped = Lesson(engine, adapter, PROMPT, answer, 1.0, options, cache)
    tapped.run()
    assert tapped.reused_states and tapped.done
    engine.wrappers.add("twin", twin)
    engine.wrappers.activate("twin")
    computed = Lesson(engine, twin, PROMPT, answer, 1.0, options)  # no cache: the layers below run once
    computed.run()
    assert not computed.reused_states
    for (key, a), (_, b) in zip(adapter.parameters(), twin.parameters(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=key)
    assert tapped.report.log_prob_after == pytest.approx(computed.report.log_prob_after, abs=1e-5)
    assert tapped.report.log_prob_after > tapped.report.log_prob_before


def test_after_learning_only_the_adapted_layers_are_recomputed(engine):
    adapter = top_adapter(engine)
    cache = engine.new_cache()
    answer, _ = run(engine, PROMPT, cache)
    Lesson(engine, adapter, PROMPT, answer, 1.0, plain(steps=3, lr=0.02), cache).run()
    follow = PROMPT + answer + [5, 6, 7]
    bottom = engine.weights.layers[0].self_attn.q_proj
    top = engine.weights.layers[3].self_attn.q_proj
    bottom.matrix, top.matrix = Counting(bottom.matrix), Counting(top.matrix)
    ids, first = run(engine, follow, cache)
    reused = len(PROMPT) + len(answer) - 1  # the last answer token was sampled, never fed
    assert first.cached_tokens == reused
    assert bottom.matrix.rows == len(follow) - reused + GREEDY.max_tokens - 1  # the new tokens only
    assert top.matrix.rows == bottom.matrix.rows + reused  # and the reused ones, recomputed
    fresh = engine.new_cache()
    fresh_ids, _ = run(engine, follow, fresh)
    assert ids == fresh_ids
    for mine, theirs in zip(cache.layers, fresh.layers, strict=True):
        n = mine.hot.length  # float32 sums in another order: equal to ~1e-5 of values up to ~3
        np.testing.assert_allclose(mine.hot.k[:, :n], theirs.hot.k[:, :n], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mine.hot.v[:, :n], theirs.hot.v[:, :n], rtol=1e-5, atol=1e-5)


def test_switching_to_the_base_model_recomputes_the_same_layers(engine):
    adapter = top_adapter(engine)
    cache = engine.new_cache()
    answer, _ = run(engine, PROMPT, cache)
    Lesson(engine, adapter, PROMPT, answer, 1.0, plain(steps=3, lr=0.02), cache).run()
    run(engine, PROMPT + answer, cache)  # the adapter's cache
    engine.wrappers.activate(None)
    ids, first = run(engine, PROMPT + answer + [9], cache)
    assert first.cached_tokens == len(PROMPT) + len(answer)
    assert ids == run(engine, PROMPT + answer + [9], engine.new_cache())[0]


def test_an_interrupted_recompute_leaves_a_cache_that_starts_over(engine):
    adapter = top_adapter(engine)
    engine.prefill_chunk = 4
    cache = engine.new_cache()
    answer, _ = run(engine, PROMPT, cache)
    Lesson(engine, adapter, PROMPT, answer, 1.0, plain(steps=2, lr=0.02), cache).run()
    follow = PROMPT + answer
    steps = generate_tokens(engine, follow, GREEDY, cache=cache, report_prefill=True)
    assert isinstance(next(steps), Prefilling)  # one chunk of the recompute, then the caller leaves
    steps.close()
    ids, first = run(engine, follow, cache)
    assert first.cached_tokens == 0
    assert ids == run(engine, follow, engine.new_cache())[0]


def test_an_adapter_below_the_tap_empties_the_cache(engine):
    cache = engine.new_cache()
    run(engine, PROMPT, cache)
    adapter = Adapter.new(engine.weights, LoRAConfig(targets=("down_proj",), layers=(1,)))
    engine.wrappers.add("low", adapter)
    engine.wrappers.activate("low")
    _, first = run(engine, [*PROMPT, 4], cache)
    assert first.cached_tokens == 0


class UnitClock:
    """A clock that moves `ms` per unit of work done (Lesson.work, BasesJob.step), for a Learner: a budget
    then buys a known number of units, whatever the machine."""

    def __init__(self, monkeypatch, ms: float) -> None:
        from ruvllm.learning import projection

        self.units, self.ms = 0, ms
        for cls, name in ((Lesson, "work"), (projection.BasesJob, "step")):
            original = getattr(cls, name)
            monkeypatch.setattr(cls, name, self.counted(original))

    def counted(self, original):
        def unit(*args):
            self.units += 1
            return original(*args)

        return unit

    def __call__(self) -> float:
        return self.units * self.ms / 1000


def test_the_learner_does_units_of_work_within_a_budget_and_can_be_cancelled(engine, monkeypatch):
    clock = UnitClock(monkeypatch, ms=40)
    adapter = top_adapter(engine)
    learner = Learner(engine.wrappers)
    learner.clock = clock
    options = plain(steps=4, lr=0.01)
    first = Lesson(engine, adapter, PROMPT, [5, 6, 7], 1.0, options)
    first.step()  # the instant step, taken by whoever adds the lesson
    learner.add("a", first)
    second = Lesson(engine, adapter, PROMPT[:10], [8, 9], 1.0, options)
    learner.add("a", second)
    status = learner.status()
    assert (status.lessons, status.step, status.steps, status.adapter, status.version) == (2, 1, 4, "a", 1)
    assert (status.phase, status.prepared, status.finished, status.cancelled) == ("learning", None, 0, 0)
    for budget, units in ((0, 1), (100, 2), (120, 3)):  # at least one; none that would end past the budget
        before = clock.units
        learner.run(budget_ms=budget)
        assert clock.units - before == units, budget
    while first.steps == 1:
        learner.run(budget_ms=0)
    assert (learner.status().step, adapter.version) == (2, 2)  # a step is a few units
    status = learner.run(budget_ms=None)  # until every lesson is done
    assert first.done and second.done and status.lessons == 0 and status.finished == 2 and status.phase == "idle"
    assert (
        adapter.version == 8 and first.report.steps == 4 and first.report.log_prob_after > first.report.log_prob_before
    )
    assert first.phase == "done" and first.report.outcome == "most_steps" and first.report.wall_ms > 0

    third = Lesson(engine, adapter, PROMPT, [3], 1.0, options)
    learner.add("a", third)
    learner.run(budget_ms=0)
    kept = {k: v.copy() for k, v in adapter.parameters()}
    status = learner.cancel(third)
    assert status.lessons == 0 and status.cancelled == 1 and not third.done and third.phase == "cancelled"
    learner.run(budget_ms=None)
    for key, value in adapter.parameters():  # what the cancelled lesson taught stays; nothing more was taught
        np.testing.assert_array_equal(value, kept[key])


def test_a_lesson_whose_adapter_was_replaced_is_dropped_not_cancelled(engine):
    adapter = top_adapter(engine)
    learner = Learner(engine.wrappers)
    lesson = Lesson(engine, adapter, PROMPT, [5], 1.0, plain(steps=3))
    learner.add("a", lesson)
    top_adapter(engine)  # a new adapter under the same name
    status = learner.run(budget_ms=None)
    assert (status.dropped, status.cancelled, status.finished, adapter.version) == (1, 0, 0, 0)
    assert lesson.phase == "dropped" and not lesson.done


class Work:
    """The work each unit does, recorded: token-layers of forward (through run_layers) and rows of the
    output projection's softmax."""

    def __init__(self, monkeypatch) -> None:
        from ruvllm.learning import backprop, projection
        from ruvllm.model import forward

        self.units: list[dict] = [{"token_layers": 0, "rows": 0}]
        run_layers, softmax = forward.run_layers, backprop._softmax64

        def counted_layers(model, x, batch, layers, tape=None):
            self.units[-1]["token_layers"] += len(x) * len(layers)
            return run_layers(model, x, batch, layers, tape)

        def counted_rows(logits):
            self.units[-1]["rows"] += len(logits)
            return softmax(logits)

        for module in (backprop, projection):
            monkeypatch.setattr(module, "run_layers", counted_layers)
        monkeypatch.setattr(backprop, "_softmax64", counted_rows)

    def unit(self, work) -> object:
        """Run one unit (`work()`), its work recorded apart."""
        self.units.append({"token_layers": 0, "rows": 0})
        return work()

    def most(self, key: str) -> int:
        return max(u[key] for u in self.units[1:])


def test_each_unit_of_a_lesson_does_a_bounded_share_of_its_work(engine, monkeypatch):
    """A long lesson's work is cut into units: no unit runs more than one layer over the lesson's tokens
    (or LESSON_WORK token-layers below the adapter) or more than LOGIT_ROWS rows of the output
    projection, and its steps are the same as those of a lesson stepped whole."""
    from ruvllm.learning import backprop, learn

    options = AdaptOptions(steps=2, lr=0.01, until_greedy=False, rehearse=1, keep=10.0, project=0.0)
    completion = [int(t) for t in np.random.default_rng(8).integers(3, 128, 30)]  # 20 + 30 tokens
    twin = copy.deepcopy(top_adapter(engine, "twin"))
    monkeypatch.setattr(backprop, "LOGIT_ROWS", 10**6)
    monkeypatch.setattr(learn, "LESSON_WORK", 10**6)
    whole = Lesson(engine, twin, PROMPT, completion, 1.0, options)
    engine.wrappers.add("twin", twin)
    engine.wrappers.activate("twin")
    whole.run()  # the reference: all rows in one product, all layers below the adapter in one unit

    monkeypatch.setattr(backprop, "LOGIT_ROWS", 8)  # (as many as the kept predictions, made in a unit)
    monkeypatch.setattr(learn, "LESSON_WORK", 60)
    work = Work(monkeypatch)
    adapter = top_adapter(engine)
    lesson = Lesson(engine, adapter, PROMPT, completion, 1.0, options)
    while not lesson.done:
        work.unit(lesson.work)
    T = len(lesson.tokens) - 1  # (the last token is never fed)
    assert work.most("token_layers") <= max(60, T) and work.most("rows") <= 8 < 30 + 8  # (38 rows a pass)
    assert len(work.units) > 4 * (lesson.steps + lesson.rehearsed + 1)  # several units a pass
    assert sum(u["token_layers"] for u in work.units) >= 3 * T  # the forward below the adapter is in them
    assert lesson.report.steps == whole.report.steps == 2
    for (key, a), (_, b) in zip(adapter.parameters(), twin.parameters(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=key)


def test_a_projection_job_advances_in_units_of_bounded_work_and_reports_its_progress(engine, monkeypatch):
    from ruvllm.learning import projection

    monkeypatch.setattr(projection, "CALIBRATION_PIECE", 40)
    monkeypatch.setattr(projection, "PROJECTION_WORK", 14)  # chunks of 7 tokens: 2 layers a unit
    monkeypatch.setattr(projection, "GRAM_COLUMNS", 16)
    monkeypatch.setattr(projection, "BASIS_BLOCK", 8)
    work = Work(monkeypatch)
    ids = [int(t) for t in np.random.default_rng(3).integers(3, 128, 70)]
    modules = ["model.layers.2.mlp.down_proj", "model.layers.3.self_attn.q_proj"]
    job = projection.BasesJob(engine, modules, ids, 0.9, chunk=7)
    progress = [job.progress]
    while not work.unit(job.step):
        progress.append(job.progress)
    assert work.most("token_layers") <= 14 and job.progress == (job.total, job.total)
    assert [done for done, _ in progress] == list(range(job.total)) and {t for _, t in progress} == {job.total}
    # the Gram matrices made; 40 tokens in chunks of 7 and 30 more, each through 4 layers 2 at a time: 2
    # units; each module's Gram block of 16 columns a unit; an eigendecomposition a module, the basis of
    # the T x T one a unit per 8 of its 70 possible columns; the last unit hands the bases over
    chunks = [(at, min(at + 7, 40 if at < 40 else 70)) for at in [*range(0, 40, 7), *range(40, 70, 7)]]
    gram = sum(-(-stop // 16) + -(-64 // 16) for _, stop in chunks)
    assert job.total == 1 + 2 * len(chunks) + gram + 2 + -(-70 // 8) + 1


def test_the_status_says_what_a_lesson_waits_for_and_how_far_it_got(engine, monkeypatch):
    """A fresh adapter's lesson: its instant step runs unprojected ("learning", step 1), then it waits for
    the projection job ("preparing", with the job's units), then learns and rehearses ("learning" step
    2, "rehearsing") and is done; elapsed wall time and phase all along."""
    learning = ModelLearning(engine, PROMPT * 3)
    adapter = top_adapter(engine)
    learner = Learner(engine.wrappers, learning)
    options = plain(steps=3, project=0.99, rehearse=1)
    lesson = Lesson(engine, adapter, PROMPT, [5, 6, 7], 1.0, options, learning=learning)
    lesson.defer_projection = True
    assert lesson.phase == "learning" and not lesson.applied
    lesson.step()
    assert lesson.applied and lesson.steps == 1 and lesson.phase == "preparing"
    learner.add("a", lesson)
    seen = []
    while not lesson.done:
        status = learner.run(budget_ms=0)
        seen.append((status.phase, status.step, status.prepared and status.prepared[1]))
        assert status.elapsed_ms >= 0 and (status.phase == "preparing") == (status.prepared is not None)
    total = lesson.job.total
    phases = [phase for phase, *_ in seen]
    assert phases[0] == "preparing" and phases[-1] == "idle" and "rehearsing" in phases
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == [
        "preparing",
        "learning",
        "rehearsing",
        "idle",
    ]
    assert {t for phase, _, t in seen if phase == "preparing"} == {total}
    assert max(step for phase, step, _ in seen if phase == "preparing") == 1  # no step taken while preparing
    assert lesson.report.outcome == "most_steps" and lesson.report.wall_ms >= lesson.report.step_ms


def test_a_lesson_on_what_greedy_decoding_already_gives_says_there_was_nothing_to_learn(engine):
    adapter = top_adapter(engine)
    answer, _ = run(engine, PROMPT, engine.new_cache())
    options = AdaptOptions(keep=0.0, project=0.0)  # until greedy decoding reproduces it (the default)
    lesson = Lesson(engine, adapter, PROMPT, answer, 1.0, options)
    lesson.step()  # the instant step: the check finds nothing to learn
    assert lesson.applied and lesson.steps == 0 and lesson.outcome == "already" and lesson.phase == "rehearsing"
    lesson.run()
    assert lesson.report.steps == 0 and lesson.report.outcome == "already" and adapter.version == 0
    assert lesson.report.log_prob_after == lesson.report.log_prob_before


def test_a_lesson_rehearses_the_earlier_ones_and_the_adapter_remembers_them(engine, tmp_path):
    adapter = top_adapter(engine)
    options = plain(steps=3, lr=0.02, optimizer="sgd", until_greedy=True, rehearse=1)
    earlier = Lesson(engine, adapter, PROMPT, [5, 6, 7], 1.0, options)
    earlier.run()
    # not learned in 3 steps (a random tiny model, a random completion): rehearsal gives it its 5 more
    assert earlier.report.rehearsal_steps == REHEARSAL_STEPS and len(adapter.state.memory) == 1
    later = Lesson(engine, adapter, PROMPT[:12], [9, 8], 1.0, options)
    later.run()
    # a random tiny model does not learn a random completion in 3 steps: each lesson gets its 5 rehearsal steps
    assert later.report.steps == 3 and later.report.rehearsal_steps == 2 * REHEARSAL_STEPS
    assert [m.tokens for m in adapter.state.memory] == [(*PROMPT, 5, 6, 7), (*PROMPT[:12], 9, 8)]
    assert adapter.state.memory[1].prompt_length == 12
    adapter.save(str(tmp_path / "a"))
    back = Adapter.load(str(tmp_path / "a"), engine.weights)
    assert back.state.memory == adapter.state.memory


def test_every_step_keeps_the_base_model_s_predictions_on_the_prompt(engine, monkeypatch):
    from ruvllm.learning import learn

    seen, original = [], learn.adapter_gradient_units

    def recording(engine, adapter, tokens, scored, reward, start=None, keep=None):
        seen.append(None if keep is None else list(keep.positions))
        return original(engine, adapter, tokens, scored, reward, start, keep)

    monkeypatch.setattr(learn, "adapter_gradient_units", recording)
    adapter = top_adapter(engine)
    Lesson(engine, adapter, PROMPT, [5, 6], 1.0, plain(steps=2, lr=0.01, keep=10.0)).run()
    spread = [int(p) for p in np.linspace(0, len(PROMPT) - 2, 8).astype(int)]  # 8 of the prompt's positions
    assert seen == [spread, spread, None]  # two steps, then the consolidation (the lesson alone)


def test_a_fresh_adapter_s_first_pass_gives_the_predictions_it_keeps(engine, monkeypatch):
    """A fresh adapter (B zero) computes as the base model, so a lesson's first pass gives the base
    model's predictions at the kept positions: they take no pass of their own, and they are the ones
    the base model gives (its passes with the adapter bypassed); once the adapter has learned, the next
    lesson computes them with the adapter bypassed."""
    from ruvllm.learning import backprop, learn

    passes, original = [], learn.base_prob_units

    def counted(*args):
        passes.append(args[-1])
        return (yield from original(*args))

    monkeypatch.setattr(learn, "base_prob_units", counted)
    adapter = top_adapter(engine)
    first = Lesson(engine, adapter, PROMPT, [5, 6, 7], 1.0, plain(steps=2, lr=0.05, keep=10.0))
    first.run()
    assert passes == [] and first.keep and first.keep.probs is not None
    own = backprop.base_probs(engine.model, first.start, first.keep.positions)
    np.testing.assert_allclose(first.keep.probs, own, rtol=1e-4, atol=1e-7)
    second = Lesson(engine, adapter, PROMPT[:12], [9, 8], 1.0, plain(steps=1, lr=0.05, keep=10.0))
    second.run()
    assert len(passes) == 1 and second.keep and second.keep.probs is not None


def test_a_lesson_feeds_the_generation_s_cache_the_tokens_it_never_saw(engine):
    """A chat lesson's completion ends with the end-of-turn token, after the last generated token, and
    neither went through the model: the cache is fed them (one short forward), not the whole text."""
    adapter = top_adapter(engine)
    cache = engine.new_cache()
    answer, _ = run(engine, PROMPT, cache)
    completion = [*answer, 2]
    twin = copy.deepcopy(adapter)
    tapped = Lesson(engine, adapter, PROMPT, completion, 1.0, plain(steps=2, lr=0.01), cache)
    tapped.run()
    assert tapped.reused_states and cache.tokens == PROMPT + answer
    engine.wrappers.add("twin", twin)
    engine.wrappers.activate("twin")
    computed = Lesson(engine, twin, PROMPT, completion, 1.0, plain(steps=2, lr=0.01))
    computed.run()
    assert tapped.report.log_prob_after == pytest.approx(computed.report.log_prob_after, abs=1e-5)
    far = [*answer, *range(3, 3 + 20)]  # more than a few tokens the cache never saw: computed instead
    engine.wrappers.activate("a")
    lesson = Lesson(engine, adapter, PROMPT, far, 1.0, plain(steps=1), cache)
    lesson.step()
    assert lesson.done and not lesson.reused_states and cache.tokens == PROMPT + answer


def finished(steps):
    """What a generator of steps returns."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def svd_basis(x: np.ndarray, energy: float) -> np.ndarray:
    """The reference: the top right singular vectors of x holding `energy` of its squared norm."""
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    k = int(np.searchsorted(np.cumsum(s**2) / np.sum(s**2), energy)) + 1
    return vt[:k].T


@pytest.mark.parametrize("T", [300, 20])  # more rows than columns (K x K Gram) and fewer (T x T)
def test_the_input_basis_is_the_smallest_holding_the_energy_asked(T):
    from ruvllm.learning.projection import decomposition

    rng = np.random.default_rng(T)
    x = rng.normal(size=(T, 40)) * np.geomspace(10, 0.01, 40)  # a few strong input directions
    steps = decomposition(x.T @ x, None) if T > 40 else decomposition(x @ x.T, x)
    spectrum = finished(steps)
    basis = spectrum.basis(0.9).astype(np.float64)
    expected = svd_basis(x, 0.9)
    np.testing.assert_allclose(basis @ basis.T, expected @ expected.T, atol=1e-5)
    np.testing.assert_allclose(basis.T @ basis, np.eye(basis.shape[1]), atol=1e-5)  # orthonormal
    held = np.linalg.norm(x @ basis) ** 2 / np.linalg.norm(x) ** 2
    fewer = np.linalg.norm(x @ basis[:, :-1]) ** 2 / np.linalg.norm(x) ** 2
    assert held >= 0.9 > fewer and 1 < basis.shape[1] < 20


@pytest.mark.parametrize("T", [300, 20])
def test_whitening_is_the_ridge_inverse_of_the_gram_matrix(T):
    """Spectrum.whiten against (X^T X + ridge * mean eigenvalue * I)^-1 solved in float64, with as many
    calibration rows as inputs and more (all K eigenvalues) and fewer (T of them, the rest 0); the
    eigenvectors are float32."""
    from ruvllm.learning.projection import decomposition

    rng = np.random.default_rng(T)
    x = rng.normal(size=(T, 40)) * np.geomspace(10, 0.01, 40)
    spectrum = finished(decomposition(x.T @ x, None) if T > 40 else decomposition(x @ x.T, x))
    keys = rng.normal(size=(3, 40))
    gram = x.T @ x
    expected = np.linalg.solve(gram + 0.01 * np.trace(gram) / 40 * np.eye(40), keys.T).T
    np.testing.assert_allclose(spectrum.whiten(keys, 0.01), expected, rtol=1e-3, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize("T", [300, 20])
def test_whitening_runs_its_products_through_the_kernel_provider(T):
    """With a kernel provider (the WebAssembly kernels in Pyodide), Spectrum.whiten's products run
    through it (here a stand-in that counts them), to NumPy's numbers."""
    from ruvllm.learning.projection import DenseMatrix, decomposition

    class Provider:  # computes x @ M.T as the kernels do, for float32 matrices
        name, arithmetic, calls = "numpy-stand-in", "exact", 0

        def prepare(self, matrix):
            def product(x):
                Provider.calls += 1
                return x @ matrix.weight.T

            return product if isinstance(matrix, DenseMatrix) else None

    rng = np.random.default_rng(T)
    x = rng.normal(size=(T, 40)) * np.geomspace(10, 0.01, 40)
    spectrum = finished(decomposition(x.T @ x, None) if T > 40 else decomposition(x @ x.T, x))
    keys = rng.normal(size=(3, 40))
    expected = spectrum.whiten(keys, 0.01)
    spectrum.use_provider(Provider())
    got = spectrum.whiten(keys, 0.01)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())
    assert Provider.calls >= 2  # rows @ V, then back through V^T


def test_a_fresh_adapter_reuses_the_bases_an_earlier_one_computed(engine, monkeypatch):
    from ruvllm.learning import projection

    learning = ModelLearning(engine, PROMPT * 3)
    calls = []

    class Counted(projection.BasesJob):
        def __init__(self, engine, modules, *rest, **kw) -> None:
            calls.append(list(modules))
            super().__init__(engine, modules, *rest, **kw)

    monkeypatch.setattr(projection, "BasesJob", Counted)
    first = top_adapter(engine, "a")
    Lesson(engine, first, PROMPT, [5, 6], 1.0, plain(steps=1, project=0.99), learning=learning).run()
    second = top_adapter(engine, "b")
    Lesson(engine, second, PROMPT, [5, 6], 1.0, plain(steps=1, project=0.99), learning=learning).run()
    assert calls == [list(first.A)] and first.state.bases.keys() == second.state.bases.keys() == first.A.keys()
    for name in first.A:
        np.testing.assert_array_equal(first.state.bases[name], second.state.bases[name])
        assert np.abs(second.A[name] @ second.state.bases[name]).max() < 1e-5  # A starts out of the subspace


def test_the_bases_made_a_chunk_at_a_time_equal_those_of_whole_pieces(engine, monkeypatch):
    """BasesJob (the worker's idle time: a few tokens per step) against the inputs of one forward per
    calibration piece; a piece shorter than the text, so two pieces each start at position 0."""
    from ruvllm.learning import projection
    from ruvllm.learning.backprop import Start, run_from

    monkeypatch.setattr(projection, "CALIBRATION_PIECE", 40)
    ids = [int(t) for t in np.random.default_rng(3).integers(3, 128, 70)]
    modules = ["model.layers.2.mlp.down_proj", "model.layers.3.self_attn.q_proj"]  # K 128 > 70 rows, 64 < 70
    job = projection.BasesJob(engine, modules, ids, 0.9, chunk=7)
    steps = 1
    while not job.step():
        steps += 1
    assert steps == job.total == job.units
    inputs = {name: [] for name in modules}
    for begin in (0, 40):
        entering = entering_states(engine.model, ids[begin : begin + 40], 2)
        _, tapes = run_from(engine.model, Start(2, entering))
        inputs[modules[0]].append(tapes[0].s)
        inputs[modules[1]].append(tapes[1].a)
    for name in modules:
        expected = svd_basis(np.concatenate(inputs[name]).astype(np.float64), 0.9)
        got = job.bases[name].astype(np.float64)
        assert got.shape == expected.shape, name
        np.testing.assert_allclose(got @ got.T, expected @ expected.T, atol=1e-4, err_msg=name)


def test_an_instant_step_does_not_wait_for_a_fresh_adapter_s_projection(engine):
    """feedback's first step on a fresh adapter runs unprojected; the background loop makes the bases a
    chunk of calibration text at a time, before any further step, and the next step projects A."""
    learning = ModelLearning(engine, PROMPT * 3)
    adapter = top_adapter(engine)
    learner = Learner(engine.wrappers, learning)
    lesson = Lesson(engine, adapter, PROMPT, [5, 6, 7], 1.0, plain(steps=3, project=0.99), learning=learning)
    lesson.defer_projection = True
    lesson.step()
    assert lesson.steps == 1 and not adapter.state.bases and learner.status().preparing
    learner.add("a", lesson)
    assert learner.run(budget_ms=0).preparing and lesson.steps == 1  # one chunk, no lesson step
    learner.run(None)
    assert lesson.done and lesson.steps == 3 and not learner.status().preparing
    assert adapter.state.bases.keys() == adapter.A.keys()
    for name, basis in adapter.state.bases.items():
        assert np.abs(adapter.A[name] @ basis).max() < 1e-5, name
    again = top_adapter(engine, "b")  # the next fresh adapter finds them made
    second = Lesson(engine, again, PROMPT, [5, 6, 7], 1.0, plain(steps=1, project=0.99), learning=learning)
    second.defer_projection = True
    second.step()
    assert again.state.bases.keys() == again.A.keys() and not learner.status().preparing


def test_a_keyed_lesson_teaches_gemma_3_s_block(tmp_path):
    """Gemma 3's block (GeGLU, a norm on each sublayer's output and on every query and key head, sliding
    windows: the backward's gradients are checked against torch in tests/test_lora.py) learns as Llama's:
    the worker's preparation after a load makes its spectra, and a keyed lesson makes its answer the
    greedy one."""
    from ruvllm.learning.lora import module_names

    tiny_model("gemma3", tmp_path)
    engine = load_engine(str(tmp_path))
    learning = ModelLearning(engine, PROMPT * 3)
    learner = Learner(AdapterSet.attached(engine), learning)
    assert learner.prepare(module_names(engine.weights, ("down_proj",), [4, 5]))
    assert learner.run(None).lessons == 0 and not learner.status().preparing
    adapter = Adapter.new(engine.weights, LoRAConfig(targets=("down_proj",), layers=(4, 5)))
    engine.wrappers.add("g", adapter)
    engine.wrappers.activate("g")
    answer = [5, 6, 7, 8]
    assert run(engine, PROMPT, engine.new_cache())[0][:4] != answer
    lesson = Lesson(engine, adapter, PROMPT, answer, 1.0, AdaptOptions(rehearse=0), learning=learning)
    lesson.run()
    assert lesson.keyed and lesson.rows == (0, 4)
    assert lesson.report is not None and lesson.report.outcome == "learned", lesson.report
    assert run(engine, PROMPT, engine.new_cache())[0][:4] == answer


def test_a_bad_lesson_takes_back_the_part_of_its_step_that_overshot(engine, monkeypatch):
    """A bad lesson whose step dropped its answer far more than asked (OVERSHOOT times NEGATIVE_DROP)
    takes back three quarters of it at a time while the answer stays dropped as a bad lesson asks: the
    adapter ends a power of a quarter of the step the same lesson takes without taking back, and the
    answer is dropped by no more than OVERSHOOT times what was asked."""
    from ruvllm.learning import learn

    told = run(engine, PROMPT, engine.new_cache())[0]
    options = AdaptOptions(rehearse=0, keep=0.0, project=0.0, keyed=False, lr=9.0)
    ends = {}
    for take_backs in (0, learn.TAKE_BACKS):
        monkeypatch.setattr(learn, "TAKE_BACKS", take_backs)
        adapter = top_adapter(engine, f"b{take_backs}")
        lesson = Lesson(engine, adapter, PROMPT, told, -1.0, options)
        lesson.run()
        assert lesson.report is not None and lesson.report.outcome == "unlearned" and lesson.steps == 1
        drop = (lesson.report.log_prob_before - lesson.report.log_prob_after) * len(told)
        ends[take_backs] = (lesson.taken_back, drop, adapter.B["model.layers.3.mlp.down_proj"].copy())
    (none, overshot, whole), (taken, drop, kept) = ends[0], ends[learn.TAKE_BACKS]
    assert none == 0 and overshot > learn.OVERSHOOT * learn.NEGATIVE_DROP and taken >= 1
    assert learn.NEGATIVE_DROP <= drop <= learn.OVERSHOOT * learn.NEGATIVE_DROP or taken == learn.TAKE_BACKS
    ratio = np.linalg.norm(kept) / np.linalg.norm(whole)
    assert any(ratio == pytest.approx(0.25**k, rel=1e-5) for k in range(1, taken + 1)), ratio
    np.testing.assert_allclose(kept, ratio * whole, rtol=1e-4, atol=1e-7)


def test_a_projection_job_that_fails_is_dropped_and_its_error_reported(engine, monkeypatch):
    from ruvllm.learning import projection

    learning = ModelLearning(engine, PROMPT)
    learner = Learner(engine.wrappers, learning)
    assert learner.prepare(["model.layers.3.mlp.down_proj"])
    monkeypatch.setattr(projection.BasesJob, "step", lambda self: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        learner.run(None)
    assert not learner.status().preparing  # not retried (and failed again) by every later call


def test_a_keyed_lesson_writes_its_whitened_inputs_into_its_own_rows_and_trains_only_their_columns(engine, tmp_path):
    """A fresh adapter's lessons (keyed, the default): the first writes into rows 0..k of A (k <= 4) the down_proj
    inputs at the positions it must change, whitened by the calibration spectra: its rows span exactly those
    whitened inputs, checked against a forward of its own, and a gate opens them to inputs answering more than
    KEY_GATE of the weakest of those inputs' responses (fully from that weakest). Its steps train B's columns of
    its rows only, and A not at all; the next lesson takes the next rows (the adapter grows when fewer than
    KEY_ROWS are left, its scale kept) and leaves the first one's columns alone; the same lesson again keeps its
    rows. The adapter's file keeps which rows are whose, and its gates."""
    from ruvllm.learning import backprop
    from ruvllm.learning.learn import KEY_GATE, KEY_RIDGE, KEY_ROWS
    from ruvllm.learning.projection import ready_spectra, shared_bases

    learning = ModelLearning(engine, PROMPT * 3)
    adapter = Adapter.new(engine.weights, LoRAConfig(rank=6, targets=("down_proj",), layers=(-2, -1)))
    engine.wrappers.add("k", adapter)
    engine.wrappers.activate("k")
    options = plain(steps=2, lr=0.05, keyed=True)
    random_rows = {name: A.copy() for name, A in adapter.A.items()}
    first = Lesson(engine, adapter, PROMPT, [5, 6, 7, 8, 9], 1.0, options, learning=learning)
    first.run()
    assert first.keyed and first.rows == (0, KEY_ROWS) and adapter.state.keyed == KEY_ROWS
    modules = list(adapter.A)
    shared_bases(learning, modules, PROMPT * 3, 0.99)
    spectra = ready_spectra(learning, modules, PROMPT * 3)
    tokens = [*PROMPT, 5, 6, 7, 8, 9]
    lowest = adapter.lowest_layer
    entering = entering_states(engine.model, tokens[:-1], lowest)
    with backprop.bypassed(engine.weights):  # (B was zero where the rows were written)
        _, tapes = backprop.run_from(engine.model, backprop.Start(lowest, entering))
    for name in modules:
        A, B = adapter.A[name], adapter.B[name]
        taped = tapes[int(name.split(".")[2]) - lowest].s
        inputs = taped[first.scored].astype(np.float64)  # every position: a random model is sure of none
        white = spectra[name].whiten(inputs, KEY_RIDGE)
        rows = A[:KEY_ROWS].astype(np.float64)
        span = np.linalg.svd(white, full_matrices=False)[2][:KEY_ROWS]  # what the rows must span
        np.testing.assert_allclose(rows @ np.linalg.pinv(span) @ span, rows, atol=1e-4 * np.abs(rows).max())
        np.testing.assert_array_equal(A[KEY_ROWS:], random_rows[name][KEY_ROWS:])  # the rest untouched
        assert np.abs(B[:, :KEY_ROWS]).max() > 0 and not B[:, KEY_ROWS:].any()
        # gated from KEY_GATE of the weakest response among the inputs it keyed, open from that weakest
        (gate,) = adapter.gates[name]
        weakest = np.linalg.norm(taped[first.scored] @ A[:KEY_ROWS].T, axis=1).min()
        assert (gate.start, gate.stop) == (0, KEY_ROWS) and gate.high == pytest.approx(weakest, rel=1e-4)
        assert gate.low == pytest.approx(KEY_GATE * weakest, rel=1e-4)
    before = {name: (adapter.A[name].copy(), adapter.B[name].copy()) for name in modules}
    scale = adapter.config.scale
    second = Lesson(engine, adapter, PROMPT[:12], [9, 8], 1.0, options, learning=learning)
    second.run()  # two rows left: the adapter grows to have KEY_ROWS (the lesson, of two tokens, takes two)
    assert second.rows == (KEY_ROWS, 6) and adapter.state.keyed == 6 and adapter.config.rank == 2 * KEY_ROWS
    assert adapter.config.scale == scale
    for name in modules:
        np.testing.assert_array_equal(adapter.A[name][:KEY_ROWS], before[name][0][:KEY_ROWS])
        np.testing.assert_array_equal(adapter.B[name][:, :KEY_ROWS], before[name][1][:, :KEY_ROWS])
        assert np.abs(adapter.B[name][:, KEY_ROWS:]).max() > 0
    wrapped = engine.weights.layers[-1].mlp.down_proj.matrix  # the weights wrapped with the grown arrays
    assert wrapped.A is adapter.A[modules[-1]] and wrapped.B is adapter.B[modules[-1]]
    again = Lesson(engine, adapter, PROMPT, [5, 6, 7, 8, 9], 1.0, options, learning=learning)
    again.run()
    assert again.rows == (0, KEY_ROWS) and adapter.state.keyed == 6 and adapter.config.rank == 2 * KEY_ROWS
    third = Lesson(engine, adapter, PROMPT[:8], [3], 1.0, options, learning=learning)
    third.run()
    assert third.rows == (6, 7) and adapter.config.rank == 6 + KEY_ROWS
    gates = adapter.gates[modules[0]]  # a gate a lesson
    assert [(g.start, g.stop) for g in gates] == [(0, KEY_ROWS), (KEY_ROWS, 6), (6, 7)]
    adapter.save(str(tmp_path / "k"))
    back = Adapter.load(str(tmp_path / "k"), engine.weights)
    assert back.state.keyed == 7 and back.state.rows == adapter.state.rows and back.gates == adapter.gates
    assert back.config.rank == 6 + KEY_ROWS and back.config.scale == scale
    assert back.state.rows[(tuple(tokens), len(PROMPT))] == (0, KEY_ROWS)


def test_a_loaded_adapter_that_never_learned_here_trains_a_and_b(engine, tmp_path):
    """Keyed rows are for a fresh adapter: one loaded from a PEFT folder (its A holds what it learned
    elsewhere) learns as before, A and B, projected."""
    learning = ModelLearning(engine, PROMPT * 3)
    trained = top_adapter(engine, "t")
    trained.B["model.layers.3.mlp.down_proj"][...] = 0.01
    trained.version = 1  # as a PEFT adapter's file says it learned elsewhere
    Adapter.save(trained, str(tmp_path / "t"))
    loaded = Adapter.load(str(tmp_path / "t"), engine.weights)
    engine.wrappers.add("l", loaded)
    engine.wrappers.activate("l")
    A = {name: a.copy() for name, a in loaded.A.items()}
    options = plain(steps=2, lr=0.05, keyed=True, project=0.99)
    lesson = Lesson(engine, loaded, PROMPT, [5, 6], 1.0, options, learning=learning)
    lesson.run()
    assert not lesson.keyed and loaded.state.keyed is None
    assert any(not np.array_equal(A[name], loaded.A[name]) for name in A)


def test_a_keyed_lesson_s_first_step_takes_one_pass(engine, monkeypatch):
    """The rows a keyed lesson writes have zero columns in B, so the pass that found which positions to
    key already holds what B's gradient on them needs: the first step is that one pass, and its update
    equals the one a second pass after writing the rows gives (the kept predictions' term included)."""
    from ruvllm.learning import learn

    learning = ModelLearning(engine, PROMPT * 3)
    adapter = top_adapter(engine)
    passes, original = [], learn.adapter_gradient_units

    def counted(*args, **kwargs):
        passes.append(args[6] is not None)  # (the lesson's passes keep predictions; the consolidation's not)
        return original(*args, **kwargs)

    monkeypatch.setattr(learn, "adapter_gradient_units", counted)
    options = plain(steps=1, lr=0.05, keyed=True, keep=10.0, max_grad_norm=0.0)  # (0: no clipping)
    lesson = Lesson(engine, adapter, PROMPT, [5, 6, 7], 1.0, options, learning=learning)
    while not lesson.applied:
        lesson.work()
    assert lesson.steps == 1 and passes.count(True) == 1 and lesson.rows is not None
    start, stop = lesson.rows
    stepped = {name: B.copy() for name, B in adapter.B.items()}
    for B in adapter.B.values():
        B[:, start:stop] = 0  # (before the step, with the rows written)
    tokens, scored = lesson.tokens, lesson.scored
    result, grads = learn.adapter_gradients(engine, adapter, tokens, scored, 1.0, lesson.start, lesson.keep)
    kept = learn.by_key(adapter, result.kept)
    for name in adapter.B:
        expected = -0.05 * (grads[f"{name}.lora_B"] + kept[f"{name}.lora_B"])[:, start:stop]
        np.testing.assert_allclose(stepped[name][:, start:stop], expected, rtol=1e-4, atol=1e-7)
