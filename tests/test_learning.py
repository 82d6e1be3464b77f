"""Proof that MicroLoRA learns on the real model: a new fact in a few steps, without breaking the model,
and a second fact later without erasing the first. Also the `ruvllm adapt` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ruvllm
from ruvllm.errors import InvalidArgumentError
from ruvllm.learning.learn import NEGATIVE_DROP, AdaptOptions
from ruvllm.tools.perplexity import perplexity

EVAL = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "eval.txt"
FACT_1 = ("The secret code is", " BLUE-42.")
FACT_2 = ("The capital of Zorbia is", " Quillon.")
# What greedy decoding must give after learning: the fact itself (whether the sentence then ends with a
# period or goes on is left to the model; measured, the defaults sometimes stop a step short of it)
KNOWS_1, KNOWS_2 = " BLUE-42", " Quillon"


def greedy(model, prompt: str, n: int = 6) -> str:
    return "".join(c.text for c in model.generate(prompt, max_tokens=n, temperature=0))


@pytest.fixture(scope="module")
def model(smollm2_dir):
    return ruvllm.load(str(smollm2_dir))  # its own copy: the adapters stay out of other tests


@pytest.fixture(scope="module")
def held_out(model) -> tuple[list[int], float]:
    """The held-out text's ids and the base model's perplexity on them, measured once for the tests
    below (a pass over some 3,000 tokens; no adapter active)."""
    model.set_adapter(None)
    eval_ids = model.tokenizer.encode(EVAL.read_text())
    return eval_ids, perplexity(model.engine, eval_ids, 1024).perplexity


@pytest.fixture(scope="module")
def base_answers(model):
    """The base model's greedy answers to the locality prompts (tools/locality.py), computed once for the
    tests that compare against them (~75 s on SmolLM2): `compare` reads them and changes nothing."""
    from ruvllm.tools.locality import Answers

    model.set_adapter(None)
    return Answers.of(model)


def test_a_new_fact_is_learned_with_the_defaults_without_breaking_the_model(model, held_out):
    eval_ids, base_ppl = held_out
    assert not greedy(model, FACT_1[0]).startswith(FACT_1[1])
    model.new_adapter("facts")  # the default adapter, the default lesson
    report = model.adapt(*FACT_1, adapter="facts")
    assert report.log_prob_after - report.log_prob_before > 3.0  # the stated margin: 3 nats per token
    assert greedy(model, FACT_1[0]).startswith(KNOWS_1)
    assert greedy(model, "The capital of France is").startswith(" Paris")
    ppl = perplexity(model.engine, eval_ids, 1024).perplexity
    assert abs(ppl / base_ppl - 1) <= 0.05, (base_ppl, ppl)

    # a second fact, later: the first one stays
    second = model.adapt(*FACT_2, adapter="facts")
    assert second.log_prob_after - second.log_prob_before > 3.0
    assert greedy(model, FACT_2[0]).startswith(KNOWS_2)
    assert greedy(model, FACT_1[0]).startswith(KNOWS_1)

    # the base model is one switch away, and unchanged
    model.set_adapter(None)
    assert not greedy(model, FACT_1[0]).startswith(KNOWS_1)
    assert perplexity(model.engine, eval_ids, 1024).perplexity == pytest.approx(base_ppl, rel=1e-6)


def test_negative_feedback_makes_a_completion_less_likely(model):
    """A completion greedy decoding does not give (as sampling may): Bad makes the whole of it at least
    half as likely, and stops there."""
    model.new_adapter("manners")
    report = model.adapt("The weather today is", " terrible.", reward=-1.0, adapter="manners")
    completion_tokens = 2  # " terrible", "."
    assert (report.log_prob_before - report.log_prob_after) * completion_tokens >= NEGATIVE_DROP
    assert report.steps < AdaptOptions.steps  # it ended because it was done, not at the cap
    model.set_adapter(None)


def test_bad_feedback_changes_the_answer_and_keeps_the_model(model, held_out):
    """Bad on a greedy chat answer: the next greedy answer differs, the held-out perplexity moves 5% at
    most, and what the model knows elsewhere stays (" Paris" after raw text, Berlin in another chat).
    The lesson used to push the answer's log-likelihood down without a floor: the model then answered
    "La femme au chocolat, la femme au chocolat..." (issue #23)."""
    eval_ids, base_ppl = held_out
    france = [{"role": "user", "content": "What is the capital of France?"}]
    germany = [{"role": "user", "content": "What is the capital of Germany?"}]

    def answer(messages) -> str:
        return "".join(c.text for c in model.chat(messages, max_tokens=24, temperature=0))

    model.set_adapter(None)
    before = answer(france)
    assert "Paris" in before and "Berlin" in answer(germany)
    report = model.adapt(france, before, reward=-1.0, adapter="bad", chat=True)
    assert report.steps < AdaptOptions.steps
    after = answer(france)
    assert after != before
    assert "Paris" in after  # a different answer, not a broken one: the fact stays
    assert "Berlin" in answer(germany)
    assert greedy(model, "The capital of France is").startswith(" Paris")
    ppl = perplexity(model.engine, eval_ids, 1024).perplexity
    assert abs(ppl / base_ppl - 1) <= 0.05, (base_ppl, ppl)
    model.set_adapter(None)


def test_a_bad_lesson_after_a_good_one_stays_after_rehearsal(model):
    """Rehearsing an earlier Good lesson after a Bad one must not undo the Bad one: in the page, Bad
    reported "-1.25 -> -1.24" once the Good lesson before it was rehearsed (issue 36). The sharpest case:
    Bad on the very answer an earlier lesson called Good (the user changed their mind): the newest
    lesson wins, and the adapter forgets the Good one (rehearsing it undid the Bad one again: with keyed
    rows both train the same columns). Measured apart from the lesson's report, the answer ends at least
    NEGATIVE_DROP less likely and greedy decoding no longer gives it; one lesson is remembered."""
    model.new_adapter("both")
    question, reply = "What is the secret code?", "The secret code is BLUE-42."
    good = model.adapt(question, reply, adapter="both", chat=True)
    assert good.outcome == "learned" and model.reproduces(question, reply, chat=True)
    prompt_ids, completion_ids = model.feedback_ids(question, reply, True)
    before = model.completion_log_prob(prompt_ids, completion_ids)
    report = model.adapt(question, reply, reward=-1.0, adapter="both", chat=True)
    after = model.completion_log_prob(prompt_ids, completion_ids)
    assert report.outcome == "unlearned", report
    assert (before - after) * len(completion_ids) >= NEGATIVE_DROP, (before, after, report)
    assert report.log_prob_after == pytest.approx(after, abs=1e-3)  # the report says what a measure finds
    assert not model.reproduces(question, reply, chat=True)
    assert [m.reward for m in model.adapters.adapters["both"].state.memory] == [-1.0]
    model.set_adapter(None)


def test_a_lessons_report_says_what_changed_in_words():
    """AdaptReport.summary, which the page, `ruvllm adapt` and feedback() show: the whole answer's
    likelihood ratio, the per-token means named as such, "No effect" below NO_EFFECT_RATIO, never
    "Learned" then; "Nothing to learn" when greedy decoding already gave the answer."""
    from ruvllm.learning.learn import AdaptReport

    learned = AdaptReport(-2.0, -1.0, 3, 10.0, 0, 2500.0, "learned", tokens=2, reward=1.0)
    assert learned.summary == (
        "Learned: this answer is now 7.4x more likely (mean log-probability per token -2.00 -> -1.00), "
        "and greedy decoding gives it; 3 steps, 2.5 s."
    )
    bad = AdaptReport(-1.0, -1.5, 1, 10.0, 2, 1000.0, "unlearned", tokens=40, reward=-1.0)
    assert bad.summary.startswith("Learned: this answer is now more than 1,000x less likely (mean log-probability ")
    assert bad.summary.endswith("and greedy decoding no longer gives it; 1 step, 1.0 s.")
    # the page's case: -1.25 -> -1.24 on a bad answer of 10 tokens went the wrong way: no effect
    wrong_way = AdaptReport(-1.25, -1.24, 1, 10.0, 15, 91800.0, "unlearned", tokens=10, reward=-1.0)
    assert wrong_way.summary == (
        "No effect: this answer is about as likely as before (mean log-probability per token -1.25 -> -1.24) "
        "after 1 step, 91.8 s."
    )
    partly = AdaptReport(-3.0, -2.5, 20, 10.0, 0, 5000.0, "most_steps", tokens=4, reward=1.0)
    assert partly.summary.startswith("Partly learned: this answer is now 7.4x more likely")
    assert partly.summary.endswith("but greedy decoding does not give it yet (20 steps, the most asked); 5.0 s.")
    # the steps ended at the cap, but greedy decoding gives it after rehearsal: the end state is what counts
    after_rehearsal = AdaptReport(-3.0, -0.5, 20, 10.0, 4, 5000.0, "most_steps", tokens=4, reward=1.0, greedy=True)
    assert after_rehearsal.summary.startswith("Learned: this answer is now more than 1,000x more likely")
    still = AdaptReport(-1.0, -1.5, 20, 10.0, 0, 1000.0, "most_steps", tokens=4, reward=-1.0, greedy=True)
    assert still.summary.endswith("but greedy decoding still gives it (20 steps, the most asked); 1.0 s.")
    already = AdaptReport(-0.5, -0.5, 0, 0.0, 0, 300.0, "already", tokens=4, reward=1.0)
    assert already.summary.startswith("Nothing to learn: the model already gives this answer")


def test_bad_feedback_is_refused(model):
    with pytest.raises(InvalidArgumentError, match=r"reward must be a non-zero number in \[-1, 1\] .*, got 0"):
        model.adapt("a", "b", reward=0)
    with pytest.raises(InvalidArgumentError, match="adapt needs a non-empty prompt and a non-empty completion"):
        model.adapters.activate(None)
        from ruvllm.learning.learn import Lesson

        Lesson(model.engine, model.adapters.adapters["default"], [1, 2], [])
    with pytest.raises(InvalidArgumentError, match="steps must be an integer >= 1, got 0"):
        model.adapt("a", "b", steps=0)
    model.set_adapter(None)


def test_adapt_command_writes_an_adapter_that_generate_uses(smollm2_dir, tmp_path):
    out = tmp_path / "adapter"
    args = [sys.executable, "-m", "ruvllm", "adapt", str(smollm2_dir), "--prompt", FACT_1[0], "--completion", FACT_1[1]]
    result = subprocess.run([*args, "--out", str(out), "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["log_prob_after"] > report["log_prob_before"] + 3.0 and 1 <= report["steps"] <= AdaptOptions.steps
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["target_modules"] == ["down_proj"] and config["r"] == 32
    assert config["layers_to_transform"] == [20, 21]  # two-thirds (DEFAULT_LAYERS) of SmolLM2's 30
    generate = [
        sys.executable,
        "-m",
        "ruvllm",
        "generate",
        str(smollm2_dir),
        "--prompt",
        FACT_1[0],
        "--temperature",
        "0",
    ]
    with_adapter = subprocess.run(
        [*generate, "--max-tokens", "6", "--adapter", str(out)], capture_output=True, text=True
    )
    assert with_adapter.stdout.startswith(FACT_1[1]), with_adapter.stderr
    more = subprocess.run(
        [*args, "--adapter", str(out), "--out", str(tmp_path / "more"), "--json"], capture_output=True, text=True
    )
    assert json.loads(more.stdout)["log_prob_before"] == pytest.approx(report["log_prob_after"], abs=1e-3)
    bad = subprocess.run([*args, "--targets", "wq", "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert bad.returncode == 1 and "targets must be among q_proj" in bad.stderr and "Traceback" not in bad.stderr


def test_locality_compares_greedy_answers_before_and_after_a_lesson(model):
    """tools/locality.py: with the model unchanged every answer is kept and their perplexity ratio is
    1; after a lesson, each answer it calls moved is what greedy decoding now gives, and the others are
    token for token the same."""
    from ruvllm.tools.locality import Answers, locality_prompts

    prompts = locality_prompts()
    assert len(prompts["chat"]) == 40 and len(prompts["raw"]) == 8
    few = {"chat": prompts["chat"][:3], "raw": prompts["raw"][:1]}
    model.set_adapter(None)
    answers = Answers.of(model, few, tokens=12)
    same = answers.compare()
    assert (same.kept, same.same_start, same.total, same.chat_total) == (4, 4, 4, 3)
    assert same.answers_perplexity_ratio == pytest.approx(1.0, abs=1e-6) and same.moved == ()
    assert same.kept_but_ties == 4
    for prompt in answers.prompts:  # greedy answers: each token led the next one at its position
        assert len(prompt.leads) == len(prompt.answer) and min(prompt.leads) >= 0
    model.new_adapter("locality")
    model.adapt(*FACT_1, adapter="locality")
    after = answers.compare()
    assert after.kept + len(after.moved) == 4 and after.kept <= after.kept_but_ties <= 4
    moved = {text: now for text, _, now in after.moved}
    for prompt in answers.prompts:  # greedy decoding now: what a moved answer says, a kept one token for token
        again = [c.token_id for c in model.generate(prompt.ids, max_tokens=len(prompt.answer), temperature=0)]
        if prompt.text in moved:
            assert model.tokenizer.decode(again) == moved[prompt.text]
        else:
            assert again == prompt.answer
    model.set_adapter(None)


def test_a_lesson_leaves_unrelated_answers_alone(model, base_answers):
    """Issue 36's measure (tools/locality.py: the greedy answers, 24 tokens, of 40 chat questions in the
    model's template and 8 raw texts, before and after), each lesson on a fresh default adapter: of the
    40 chat answers, those kept but for near-ties, and of all 48 those with the same first five words,
    a few below what was measured (benchmarks/RESULTS.md, "Gated rows"): the README's fact 40 and 48
    (ungated: 31 and 43; with A trained in the top layers: 21 and 41), Good on a chat answer 38 and 47
    (38, 45; 22, 40), Bad on one 40 and 48 (40, 48; 39, 48); the answers' perplexity moves less than 1%
    (measured within 0.1%)."""
    lessons = [("fact", 38, 46), ("good", 36, 45), ("bad", 38, 46)]
    assert_local(model, base_answers, lessons, perplexity=0.01)


def test_ten_facts_in_a_row_stay_learned_and_leave_most_answers_alone(model, base_answers):
    """docs/learning.md's scenario: the ten facts of benchmarks/data/facts.jsonl, one lesson each on one
    default adapter, every one still given by greedy decoding at the end; then the 40 chat answers, a few
    below what was measured (all 40 kept, all 48 with the same first five words; ungated, 27 but for
    near-ties and 40: benchmarks/RESULTS.md, "Gated rows"), their perplexity within 1% (measured
    -0.0%)."""
    facts = [json.loads(line) for line in (EVAL.parent / "facts.jsonl").read_text().splitlines()]
    assert len(facts) == 10
    for fact in facts:
        model.adapt(fact["prompt"], fact["completion"], reward=fact["reward"], adapter="ten facts")
    model.set_adapter("ten facts")
    for fact in facts:
        assert greedy(model, fact["prompt"], 8).startswith(fact["completion"].rstrip(".")), fact
    after = base_answers.compare()
    model.set_adapter(None)
    assert after.chat_kept_but_ties >= 38 and after.same_start >= 46, after.summary()
    assert abs(after.answers_perplexity_ratio - 1) < 0.01, after.summary()


def test_a_lesson_on_gemma_3_leaves_unrelated_answers_alone(gemma_gguf):
    """The same on Gemma 3 270M (a base model: its chat answers repeat the question, then a turn of its
    own), a few below what was measured: the fact 40 and 48, Good 38 and 47 (ungated: 31 and 42, the
    answers' perplexity -1.2%: it learned to answer, not repeat, everywhere), Bad 40 and 48 (one step,
    taken back to a sixteenth: the step of the default size kept 10 and 30); the answers' perplexity
    within 1% (measured within 0.1%)."""
    from ruvllm.tools.locality import Answers

    gemma = ruvllm.load(str(gemma_gguf), context_length=512)
    lessons = [("fact", 38, 46), ("good", 35, 43), ("bad", 38, 46)]
    assert_local(gemma, Answers.of(gemma), lessons, perplexity=0.01)


def assert_local(model, answers, expected: list[tuple[str, int, int]], perplexity: float) -> None:
    """Each lesson of `expected` (name, chat answers kept but for near-ties, answers with the same first
    five words at least) on a fresh default adapter, against the base model's `answers` (Answers), its
    answers' perplexity within `perplexity`."""
    model.set_adapter(None)
    joke = [{"role": "user", "content": "Tell me a joke."}]
    told = "".join(c.text for c in model.chat(joke, max_tokens=40, temperature=0))
    lessons = {
        "fact": (*FACT_1, 1.0, False),
        "good": ("What is the secret code?", "The secret code is BLUE-42.", 1.0, True),
        "bad": (joke, told, -1.0, True),
    }
    for name, kept, same in expected:
        prompt, completion, reward, chat = lessons[name]
        model.set_adapter(None)
        report = model.adapt(prompt, completion, reward=reward, adapter=f"locality {name}", chat=chat)
        assert report.outcome == ("learned" if reward > 0 else "unlearned"), report.summary
        after = answers.compare()
        assert after.chat_kept_but_ties >= kept and after.same_start >= same, (name, after.summary())
        assert abs(after.answers_perplexity_ratio - 1) < perplexity, (name, after.summary())
    model.set_adapter(None)
