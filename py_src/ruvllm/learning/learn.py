"""Learning from feedback: a few optimizer steps on an adapter per (prompt, completion, reward).

Each step follows the true gradient (backprop.py) of

    -reward * mean log p(completion | prompt)  +  ewc / 2 * sum_i F_i (theta_i - anchor_i)^2

for reward > 0, so +1 makes the completion likelier; for reward < 0 the first term is unlikelihood at
one position, -|reward| * log(1 - p) (backprop.loss_and_grads says which), so the answer stops being
the greedy one without the rest of the model being pushed around. The second term is elastic weight
consolidation: F is the Fisher information (squared log-likelihood gradients) accumulated over past
lessons and `anchor` the adapter after the last one, so a new lesson moves most freely where earlier
ones did not care, and does not erase them. Updates are SGD (default) or Adam, in place, so the
adapter's arrays stay the ones the model reads.

A fresh adapter is keyed (AdaptOptions.keyed): each lesson writes into a few rows of A its own inputs
of the adapted matrices, whitened by the calibration inputs' second moment (projection.Spectrum), and
trains only B's columns of those rows. LoRA is linear, so rows that answer the lesson's inputs answer
every input pointing the same way too; whitened, they answer the directions ordinary text and chat use
most the least, and unrelated answers stay (tools/locality.py measures it).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Literal

import numpy as np

from ..errors import InvalidArgumentError
from ..model.cache import KVCache, KVOptions
from ..model.forward import embed, hidden, rms_norm
from ..runtime.engine import Engine
from .adapters import AdapterSet
from .backprop import (
    Gradients,
    Keep,
    Start,
    advance,
    bad_position,
    base_prob_units,
    drained,
    gradient_units,
    loss_and_grads,
    start_at,
)
from .lora import Adapter, Gate, linear_of
from .per_model import ModelLearning
from .projection import (
    INPUTS,
    BasesJob,
    Spectrum,
    bases_job,
    pending_job,
    project,
    ready_bases,
    ready_spectra,
    shared_bases,
)
from .projection import advance as advance_job
from .state import Memory, sgd
from .xlora import Mixture

MEMORY_LESSONS = 64  # lessons an adapter remembers for rehearsal (the oldest go first)
REHEARSAL_STEPS = 5  # steps a rehearsed lesson gets at most per round
KEPT_POSITIONS = 8  # prompt positions whose predictions a lesson keeps (AdaptOptions.keep)
TAP_TAIL = 16  # tokens a lesson feeds a generation's cache to take its hidden states (tapped_states)
# Token-layers of the forward below the adapter per unit of a lesson's work (its first unit computes the
# hidden states entering the adapter's lowest layer when no generation's cache holds them: a 200-token
# lesson through 28 layers was 4 s in one piece in Pyodide); a unit is at least one layer.
LESSON_WORK = 64
# A router's step size (RouteLesson). Measured on SmolLM2 (two experts, one fact each, mixed densely, a
# lesson on each fact three times): 0.1 reproduced both facts in 7 steps, 0.3 in 12; 0.02 and 1 (an
# adapter's) only one of them (benchmarks/RESULTS.md, "X-LoRA").
ROUTER_LR = 0.1
ROUTER_STEPS = 20  # a router's most steps (measured with ROUTER_LR)
# A router's lesson ends once greedy decoding gives the completion with this margin (log-probability
# over the next likeliest token at every position), not at the edge: lessons on one mixture pull its one
# router in turn, and one that stopped where its completion had only just become the greedy one was
# undone by the next lesson or not, by rounding (1 or 2 BLAS threads gave different answers).
ROUTER_MARGIN = 1.0
# When a bad completion's lesson ends: its likeliest position's target trails another token by this
# much (greedy decoding leaves it there), and the whole completion is this much less likely (log). Not
# a nat per token, as issue 36 proposed: measured on SmolLM2 (keyed, layers 14-15), Bad on "The capital
# of France is Paris." held to that answered "L'Étoile, le Grand Étoile, ..." (the fact was gone), where
# this answers with Paris still; on a 40-token joke it took 26 steps instead of 2 (benchmarks/RESULTS.md).
NEGATIVE_MARGIN = 0.5
NEGATIVE_DROP = float(np.log(2.0))
# A bad lesson whose last step dropped its answer more than OVERSHOOT times NEGATIVE_DROP takes back
# three quarters of that step (TAKE_BACK) and looks again, at most TAKE_BACKS times, keeping the smallest
# step that still does what it asks. Measured on Gemma 3 270M (benchmarks/RESULTS.md, "Gemma 3 learns"):
# one step of the default size made the joke 1,000x less likely and moved 30 of 40 unrelated chat
# answers (raw perplexity +18%); a sixteenth of it still made it 54x less likely and moved 3.
OVERSHOOT = 4.0
TAKE_BACK = 0.75
TAKE_BACKS = 3
# A keyed lesson (AdaptOptions.keyed) writes the inputs of the adapted matrices at the positions it must
# change, whitened by the calibration text's spectra (projection.Spectrum, this ridge), into at most
# KEY_ROWS rows of A, and trains only B's columns of those rows. Measured on SmolLM2 (benchmarks/RESULTS.md,
# "Learning that works"): the README's fact lesson learns the same with 4 rows as with its 6 inputs
# (layers 14-15), and keeps 26 of 40 unrelated chat answers where training A (projected, top layers)
# kept 18; ridges 0.0001-0.01 alike there (25-27 kept).
KEY_ROWS = 4
KEY_RIDGE = 0.01
# The positions a good lesson keys: those whose target is not yet the likeliest token by this much (log).
KEY_MARGIN = 1.0
# A keyed lesson's rows answer no input whose response to them is below this fraction of the weakest
# response among the lesson's own keyed inputs, and fully from that weakest up (lora.Gate). Measured
# (benchmarks/RESULTS.md, "Gated rows"): ungated, the rows answered unrelated chat at 5-15% of a key's
# response, and of 40 chat answers SmolLM2's fact lesson kept 26, Good 32; gated (a step) at 0.5 39 and
# 36, at 0.75 40 and 37, ramped from 0.75 to 1 (the default) 40 and 37; Gemma 3's Good 29, then 31
# and 36 with the steps, 38 with the ramp (its chat turns share the template's positions, which the
# lesson keys too).
KEY_GATE = 0.75
# A keyed bad lesson's steps are this many times lr: gated, only the one position it keys gets the
# rows' push. Measured on SmolLM2's joke (benchmarks/RESULTS.md, "Gated rows"): at lr 0.2 it took all
# 40 steps and ended 1.7x less likely; at 0.5, 6 steps, 2.0x; at 1.0, 1 step, 2.2x; all 40 chat answers
# kept each time. A step that overshoots is taken back (OVERSHOOT) as before.
BAD_STEP = 5.0


@dataclass(frozen=True)
class AdaptOptions:
    """How a lesson learns. The defaults are the measured ones (benchmarks/RESULTS.md, "MicroLoRA" and
    "Learning that works"): keyed rows of A (a fresh adapter), plain gradient steps until greedy decoding
    reproduces a good completion (at most `steps`), the base model's predictions on the prompt kept,
    then rehearsal of the earlier lessons."""

    steps: int = 40  # optimizer steps on the lesson at most
    lr: float = 0.2
    optimizer: str = "sgd"  # or "adam"
    ewc: float = 0.0  # strength of the consolidation term (0 turns it off)
    max_grad_norm: float = 1.0  # the gradient is scaled down to this global norm when longer
    fisher_decay: float = 1.0  # weight of older lessons' Fisher information when a new one is added
    until_greedy: bool = True  # a good completion's lesson ends once greedy decoding reproduces it
    rehearse: int = 3  # rounds of rehearsal of earlier lessons after this one (0: none)
    keep: float = 10.0  # weight of the KL divergence that keeps the base model's predictions on the prompt
    project: float = 0.99  # a new adapter's A stays out of the inputs' subspace holding this much energy
    # A fresh adapter's lessons write their own inputs (whitened) into rows of A and train only B's columns
    # of them (KEY_ROWS); False: A and B train, A projected (`project`), as an adapter loaded from PEFT does.
    keyed: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise InvalidArgumentError(f"steps must be an integer >= 1, got {self.steps!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < 10):
            raise InvalidArgumentError(f"lr must be a number in (0, 10), got {self.lr!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise InvalidArgumentError(f"optimizer must be adam or sgd, got {self.optimizer!r}")
        if not (isinstance(self.ewc, (int, float)) and self.ewc >= 0):
            raise InvalidArgumentError(f"ewc must be a number >= 0, got {self.ewc!r}")
        if not isinstance(self.keyed, bool):
            raise InvalidArgumentError(f"keyed must be true or false, got {self.keyed!r}")


@dataclass(frozen=True)
class AdaptReport:
    log_prob_before: float  # mean log-probability of the completion's tokens, before the first step
    log_prob_after: float  # ... after the last step
    steps: int  # optimizer steps on this lesson
    step_ms: float  # mean compute time of one pass (forward + backward through the adapted layers, update)
    rehearsal_steps: int = 0  # optimizer steps on earlier lessons, rehearsed after this one
    wall_ms: float = 0.0  # wall time from the lesson's making to its end (waiting and preparing included)
    # Why its steps ended (a lesson's `outcome`, known once they have): "already" (a good completion
    # greedy decoding gave before any step: nothing to learn), "learned" (it gives a good one now),
    # "unlearned" (it no longer gives a bad one), "most_steps" (options.steps taken, done_with not met or
    # not asked for).
    outcome: str = ""
    tokens: int = 0  # the completion's tokens (the log-probabilities above are means over them)
    reward: float = 1.0  # the lesson's (the sign says which way it should have moved)
    greedy: bool | None = None  # whether greedy decoding gives the completion at the end (None: not known)
    summary: str = ""  # what changed, in words (report_summary); made from the fields above when not given

    def __post_init__(self) -> None:
        if not self.summary:
            object.__setattr__(self, "summary", report_summary(self))

    @property
    def ratio(self) -> float:
        """How much likelier the whole completion is now than before (below 1: less likely)."""
        return float(np.exp(np.clip((self.log_prob_after - self.log_prob_before) * max(self.tokens, 1), -700, 700)))


# A lesson whose completion's likelihood moved by less than this factor (either way) had no effect worth
# a word: the panel and `ruvllm adapt` say so rather than "Learned".
NO_EFFECT_RATIO = 1.5


def _times(ratio: float) -> str:
    """A likelihood ratio in words: "3x more likely", "40x less likely", "more than 1,000x more likely"."""
    more = ratio >= 1
    factor = ratio if more else 1 / ratio
    way = "more" if more else "less"
    if factor > 1000:
        return f"more than 1,000x {way} likely"
    return f"{factor:.1f}x {way} likely" if factor < 10 else f"{factor:.0f}x {way} likely"


def report_summary(report: AdaptReport) -> str:
    """What a lesson did, in words a user understands: how much likelier (or less likely) the whole
    answer is now, whether greedy decoding gives it, in how many steps and how long; "Nothing to learn"
    and "No effect" where that is the truth (the page, `ruvllm adapt` and `feedback()` say the same)."""
    seconds = f"{report.wall_ms / 1000:.1f} s"
    steps = f"{report.steps} step{'' if report.steps == 1 else 's'}"
    means = f"mean log-probability per token {report.log_prob_before:.2f} -> {report.log_prob_after:.2f}"
    if report.outcome == "already":
        return (
            f"Nothing to learn: the model already gives this answer (greedy decoding; {means}), checked in {seconds}."
        )
    good = report.reward > 0
    moved = report.ratio if good else 1 / report.ratio  # above 1: the way the lesson asked
    if moved < NO_EFFECT_RATIO:
        return f"No effect: this answer is about as likely as before ({means}) after {steps}, {seconds}."
    change = f"this answer is now {_times(report.ratio)} ({means})"
    if report.greedy is not None:  # whether greedy decoding gives it at the end, rehearsal included
        gives = report.greedy
    else:  # (not known: what the lesson's own steps found)
        gives = report.outcome == "learned" if good else report.outcome != "unlearned"
    if gives == good:  # a good answer greedy decoding gives now, a bad one it no longer gives
        greedy = "greedy decoding gives it" if good else "greedy decoding no longer gives it"
        return f"Learned: {change}, and {greedy}; {steps}, {seconds}."
    greedy = "greedy decoding does not give it yet" if good else "greedy decoding still gives it"
    cap = ", the most asked" if report.outcome == "most_steps" else ""
    return f"Partly learned: {change}, but {greedy} ({steps}{cap}); {seconds}."


def adapter_gradients(engine: Engine, adapter: Adapter, *args, **kwargs):
    """adapter_gradient_units (its arguments) in one piece."""
    return drained(adapter_gradient_units(engine, adapter, *args, **kwargs))


def adapter_gradient_units(
    engine: Engine,
    adapter: Adapter,
    tokens: list[int],
    scored: np.ndarray,
    reward: float,
    start: Start | None = None,
    keep: Keep | None = None,
):
    """(backprop.Gradients, {key: gradient}) with `adapter` active in the engine's weights; the passes
    run from the adapter's lowest layer up, from `start` (backprop.start_at; default: computed). With
    `keep`, the gradient of its term (the predictions kept) is in `by_key(adapter, result.kept)`. In
    units of work (backprop.gradient_units): a generator that returns them (adapter_gradients drains it)."""
    first = first_layer(engine, adapter)
    result = yield from gradient_units(engine.model, tokens, scored, reward, keep, first, start)
    return result, by_key(adapter, result.by_matrix)


def by_key(adapter: Adapter, by_matrix: dict) -> dict[str, np.ndarray]:
    """Gradients by LoRAMatrix as {"<module>.lora_A" / "<module>.lora_B": gradient} of `adapter`."""
    grads = {}
    for matrix, dA, dB in by_matrix.values():
        for name, A in adapter.A.items():
            if matrix.A is A:
                grads[f"{name}.lora_A"], grads[f"{name}.lora_B"] = dA, dB
    return grads


def route_gradients(
    engine: Engine, mixture: Mixture, tokens: list[int], scored: np.ndarray, reward: float
) -> tuple[Gradients, dict[str, np.ndarray]]:
    """(backprop.Gradients, {key: gradient} of the router's parameters) with `mixture` in the engine's
    weights: the scaling pass routes the tokens, the pass from the experts' lowest layer up and back
    gives the gradient of each projection's mix, and the router's own backward the rest."""
    weights, config = engine.weights, engine.config
    T = int(scored.max()) + 1
    fed = np.asarray(tokens[:T])
    mixture.constant(T)
    side = hidden(engine.model, fed, 0, KVCache(config, T, KVOptions()))  # (T, D)
    mixture.route(rms_norm(side, weights.norm, config.rms_norm_eps))
    first = mixture.lowest_layer
    result = loss_and_grads(engine.model, tokens, scored, reward, None, first)
    layers = mixture.route_backward(result.mixes or {})  # [(dW, db)], in parameters() order
    keys = [key for key, _ in mixture.parameters()]
    return result, dict(zip(keys, [g for pair in layers for g in pair], strict=True))


def first_layer(engine: Engine, adapter: Adapter) -> int:
    """Where learning's passes start: the adapter's lowest layer (the top, for lm_head only)."""
    lowest = adapter.lowest_layer
    return engine.config.num_hidden_layers if lowest is None else lowest


def lesson_for(
    engine: Engine,
    held,
    prompt_ids,
    completion_ids,
    reward,
    options: dict,
    cache: KVCache | None = None,
    learning: ModelLearning | None = None,
):
    """The lesson that teaches `held`: a Lesson for an adapter, a RouteLesson (lr ROUTER_LR and
    ROUTER_STEPS unless given) for an X-LoRA mixture. `options`: AdaptOptions fields."""
    if isinstance(held, Mixture):
        route_options = AdaptOptions(**{"lr": ROUTER_LR, "steps": ROUTER_STEPS, **options})
        return RouteLesson(engine, held, prompt_ids, completion_ids, reward, route_options)
    return Lesson(engine, held, prompt_ids, completion_ids, reward, AdaptOptions(**options), cache, learning)


def check_reward(reward: object, name: str = "reward") -> float:
    """A lesson's reward: a non-zero number in [-1, 1] (+1 good: likelier; -1 bad: less likely; the
    magnitude scales the lesson's gradient before clipping, so more than 1 would only drown the kept
    predictions)."""
    # (NaN fails the range)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not -1 <= reward <= 1 or reward == 0:
        raise InvalidArgumentError(f"{name} must be a non-zero number in [-1, 1] (+1 good, -1 bad), got {reward!r}")
    return float(reward)


def lesson_tokens(engine: Engine, prompt_ids, completion_ids, reward) -> tuple[list[int], np.ndarray]:
    """A lesson's tokens (prompt then completion) and scored positions (P,), or the error saying why
    it cannot be learned."""
    if not prompt_ids or not completion_ids:
        raise InvalidArgumentError("adapt needs a non-empty prompt and a non-empty completion")
    check_reward(reward)
    tokens = list(prompt_ids) + list(completion_ids)
    if len(tokens) > engine.context_length:
        raise InvalidArgumentError(
            f"prompt and completion have {len(tokens)} tokens; the context window is {engine.context_length}"
        )
    return tokens, np.arange(len(prompt_ids) - 1, len(tokens) - 1)


def done_with(reward: float, result: Gradients, log_prob_before: float, scored: int, margin: float = 0.0) -> bool:
    """Whether a lesson has done what it asks, judged by `result` (its Gradients now, over `scored`
    positions): greedy decoding gives a good completion (with `margin`: by that much log-probability at
    every position); a bad one is no longer what greedy decoding gives, by NEGATIVE_MARGIN at one position
    at least, and the whole of it is NEGATIVE_DROP less likely than before (also when sampling produced
    it: then it may not have been the greedy answer to begin with)."""
    if reward > 0:
        return result.greedy and result.margin >= margin
    drop = (log_prob_before - result.log_likelihood) * scored  # of the whole completion
    return result.margin <= -NEGATIVE_MARGIN and drop >= NEGATIVE_DROP


class _Stepwise:
    """What the background loop needs of a lesson: units of work (`work()`, each bounded) until `done`
    (then `report` is set); `step()` runs the units of one whole step."""

    adapter: Adapter | Mixture  # what it teaches
    options: AdaptOptions
    report: AdaptReport | None = None
    defer_projection = False  # (Lesson: its instant step does not wait for a fresh adapter's bases)
    ended: str | None = None  # set when it leaves the background loop unfinished: "cancelled" or "dropped"
    outcome: str | None = None  # why its steps ended (AdaptReport.outcome), once known
    given: float = 0.0  # time.perf_counter() when it was made
    steps = rehearsed = 0

    def step(self) -> None:
        raise NotImplementedError

    def work(self) -> bool:
        """One unit of work; True when it ended a step. (A lesson whose steps are not cut: a whole step.)"""
        self.step()
        return True

    @property
    def done(self) -> bool:
        return self.report is not None

    @property
    def applied(self) -> bool:
        """Whether its first step is taken (or was found not to be needed): what the instant loop waits for."""
        return self.steps > 0 or self.outcome is not None or self.done

    @property
    def waiting_for(self) -> BasesJob | None:
        """The projection job its next step needs made first, if any."""
        return None

    @property
    def phase(self) -> str:
        """ "preparing" (its next step waits for a projection job), "learning", "rehearsing" (earlier
        lessons, after this one), "done", or how it left unfinished: "cancelled", "dropped"."""
        if self.ended is not None:
            return self.ended
        if self.done:
            return "done"
        if self.waiting_for is not None:
            return "preparing"
        return "rehearsing" if self.outcome is not None else "learning"

    @property
    def elapsed_ms(self) -> float:
        """Wall time since it was made (until its end, once done)."""
        return self.report.wall_ms if self.report is not None else (time.perf_counter() - self.given) * 1000

    def run(self, budget_ms: float | None = None) -> bool:
        """Units of work until the lesson is done or `budget_ms` is spent (at least one); True when done."""
        started = time.perf_counter()
        while not self.done:
            self.work()
            if budget_ms is not None and (time.perf_counter() - started) * 1000 >= budget_ms:
                break
        return self.done


class Lesson(_Stepwise):
    """One piece of feedback being learned, in units of work (`work()`: a few layers' forward below the
    adapter, a layer's pass, LOGIT_ROWS rows of the output projection, a block of its backward, an
    update) or a step at a time (`step()`) until `done`; the last step consolidates (`finish`). The
    hidden states entering the adapter's lowest layer are computed once (or taken from the cache of the
    generation that produced the text, `cache.tap`), so each step is a forward and backward through the
    adapted layers only."""

    adapter: Adapter

    def __init__(
        self,
        engine: Engine,
        adapter: Adapter,
        prompt_ids: list[int],
        completion_ids: list[int],
        reward: float = 1.0,
        options: AdaptOptions | None = None,
        cache: KVCache | None = None,
        learning: ModelLearning | None = None,
    ) -> None:
        self.given = time.perf_counter()
        self.options = options or AdaptOptions()
        self.tokens, self.scored = lesson_tokens(engine, prompt_ids, completion_ids, reward)
        self.engine, self.adapter, self.reward, self.cache = engine, adapter, float(reward), cache
        # the model's calibration and what is made from it (its Session's; None: none, nor keyed rows)
        self.learning = learning or ModelLearning(engine)
        self.start: Start | None = None  # where each step's passes start, made by the first step
        self.keep: Keep | Literal[False] | None = None  # the predictions kept (False: none), made by the first step
        self.steps = 0  # optimizer steps on this lesson so far
        self.rehearsed = 0  # optimizer steps on earlier lessons, rehearsed after this one was learned
        self.rehearsal: _Rehearsal | None = None  # once this lesson is learned
        self.log_prob_before: float | None = None
        self.report: AdaptReport | None = None  # set by finish()
        self.compute_ms = 0.0
        self.reused_states = False  # whether the entering states came from the cache's tap
        self.defer_projection = False  # the instant step does not wait for a fresh adapter's bases
        self.unprojected = False  # steps were taken before the bases were made
        self.job: BasesJob | None = None  # the job making the bases (deferred projection) or a keyed lesson's spectra
        self.spectra: dict[str, Spectrum] | None = None  # a keyed lesson's whitening, by module
        self.rows: tuple[int, int] | None = None  # a keyed lesson's rows of A (start, stop), once written
        self.last_step: dict[str, np.ndarray] | None = None  # what the last optimizer step added, by parameter
        self.taken_back = 0  # times a bad lesson took back part of its last step (OVERSHOOT)
        self._units: Iterator[bool | None] | None = (
            None  # the generator of this lesson's units (_all_units), once started
        )

    def work(self) -> bool:
        """One unit of work; True when it ended a step (an optimizer step, a check of a rehearsed lesson,
        the consolidation with the last one)."""
        if self.done:
            return True
        if self._units is None:
            self._units = self._all_units()
        started = time.perf_counter()
        with self.engine.threads.limit(len(self.tokens)):  # products over the whole sequence: prompt-sized
            ended = next(self._units, True)
        self.compute_ms += (time.perf_counter() - started) * 1000
        return bool(ended)

    def step(self) -> None:
        """One step, all of its units: an optimizer step on this lesson or, once it is learned, a check
        (and step) of a lesson learned before, rehearsed so that it stays. The last one consolidates
        (`finish`)."""
        while not self.work():
            pass

    @property
    def waiting_for(self) -> BasesJob | None:
        job = self.job
        if job is None or job.done or self.outcome is not None:
            return None  # (a lesson in rehearsal takes no step of its own)
        if not self.keyed and (not self.unprojected or not self.steps):
            return None  # (the instant step does not wait for a projection)
        return job if job in self.learning.jobs else None  # (one that failed is gone)

    def _all_units(self):
        """Every unit of the lesson, in order: a generator that yields True where a step ends."""
        while True:
            if self.rehearsal is None:
                yield from self._learn()
            else:
                yield from self._rehearse()
            if self.rehearsal is not None and self.rehearsal.finished:
                yield from self._finish()
                return
            yield True

    def _learn(self):
        options = self.options
        if self.start is None:
            yield from self._begin()
        start, keep = self.start, self._keep()
        if self.unprojected:
            self._project()

        def attempt():
            nonlocal keep
            if keep is not None and keep.probs is None and not self._still_zero():  # (no longer the base model)
                self.keep = yield from self._kept_units(start, int(self.scored[0]) + 1)
                keep = self.keep or None
            return (yield from self._gradients(self.tokens, self.scored, self.reward, start, keep))

        result, grads = yield from self._unmoved(attempt)
        if keep is not None and keep.probs is None:  # (this first pass's own, the base model's)
            self.keep = keep = replace(keep, probs=result.kept_probs)
        before = result.log_likelihood if self.log_prob_before is None else self.log_prob_before
        self.log_prob_before = before
        learned = options.until_greedy and done_with(self.reward, result, before, len(self.scored))
        if self.taken_back and not learned:  # taken back too far: the step before did what was asked
            self._scale_last_step(1 / (1 - TAKE_BACK))
            learned = True
        elif learned and self._overshot(result, before):
            self._scale_last_step(1 - TAKE_BACK)
            self.taken_back += 1
            return  # (the next step looks again)
        if not learned and self.keyed and self.rows is None:
            if self.spectra is None:  # (only now: a lesson with nothing to learn does not wait for them)
                yield from self._spectra_units()
            if self._write_keys(result):
                self._fresh_rows(result, grads)
        if not learned:
            self._update(grads, result.kept, self.rows, self.reward)
            self.steps += 1
        if learned or self.steps == options.steps:
            if learned:
                self.outcome = "unlearned" if self.reward < 0 else "learned" if self.steps else "already"
            else:
                self.outcome = "most_steps"
            memory = self.adapter.state.memory if options.rehearse else []
            earlier = [m for m in memory if m.reward > 0 and not self._same_answer(m)]
            # this lesson too, last in each round: a good one its steps did not teach gets more, and the
            # steps on earlier good lessons must not undo a bad one (measured: Bad's drop came back)
            items = [*earlier, self.memory] if earlier or self.reward > 0 else []
            self.rehearsal = _Rehearsal(items, options.rehearse if items else 0, REHEARSAL_STEPS)

    def _overshot(self, result: Gradients, before: float) -> bool:
        """Whether a bad lesson's last step dropped its answer far more than it asked (OVERSHOOT), and
        may still be taken back in part."""
        if self.reward > 0 or self.last_step is None or self.taken_back == TAKE_BACKS:
            return False
        return (before - result.log_likelihood) * len(self.scored) > OVERSHOOT * NEGATIVE_DROP

    def _scale_last_step(self, factor: float) -> None:
        """Make the last optimizer step `factor` times what it was (below 1: take part of it back)."""
        assert self.last_step is not None  # (a step was taken)
        params = dict(self.adapter.parameters())
        for key, delta in self.last_step.items():
            params[key] += (factor - 1) * delta
            delta *= factor
        self.adapter.version += 1

    def _unmoved(self, attempt):
        """What `attempt()` (a pass: a generator of units) returns, from a pass the adapter did not move
        under: another lesson may step it between the units, and the pass then runs again."""
        while True:
            version = self.adapter.version
            outcome = yield from attempt()
            if self.adapter.version == version:
                return outcome

    def _gradients(self, tokens, scored, reward, start, keep):
        """adapter_gradients in units of work (a generator)."""
        engine, adapter = self.engine, self.adapter
        return (yield from adapter_gradient_units(engine, adapter, tokens, scored, reward, start, keep))

    def _rehearse(self):
        r = self.rehearsal
        item = r.items[r.index]
        tokens, scored, start, keep = yield from self._recall(item)
        result, grads = yield from self._unmoved(partial(self._gradients, tokens, scored, item.reward, start, keep))
        if self._holds(item, result) or r.taken == r.cap:
            r.next(again=r.taken > 0)
        else:
            rows = self.adapter.state.rows.get((item.tokens, item.prompt_length))
            self._update(grads, result.kept, rows, item.reward)
            r.taken += 1
            self.rehearsed += 1

    def _holds(self, item: Memory, result: Gradients) -> bool:
        """Whether a rehearsed lesson still holds: greedy decoding gives a good one; this lesson, when bad,
        is still done (done_with)."""
        if item.reward > 0:
            return result.greedy
        assert self.log_prob_before is not None  # (only this lesson's own bad item is rehearsed)
        return done_with(item.reward, result, self.log_prob_before, len(self.scored))

    def _update(
        self, grads: dict[str, np.ndarray], kept: dict | None, rows: tuple[int, int] | None, reward: float
    ) -> None:
        """One optimizer step: the lesson's gradient clipped, plus the kept predictions' (`kept`, by
        matrix), clipped again (measured: clipping the sum alone lets a large lesson gradient drown
        the kept predictions). A keyed adapter trains B's columns of the lesson's `rows` only (None:
        of every row given so far), a bad lesson's (`reward` < 0) BAD_STEP times as far; another has
        A's gradient projected."""
        options, adapter = self.options, self.adapter
        params, state = dict(adapter.parameters()), adapter.state
        restrict = self._projected
        if state.keyed is not None:
            params = {key: array for key, array in params.items() if key.endswith(".lora_B")}
            columns = rows or (0, state.keyed)
            restrict = partial(self._columns, rows=columns)
        grads = clipped(restrict(grads), options.max_grad_norm)
        if kept is not None:
            kept = restrict(by_key(adapter, kept))
            grads = clipped({key: g + kept[key] for key, g in grads.items()}, options.max_grad_norm)
        if options.ewc:
            grads = restrict(state.ewc.pulled(grads, params, options.ewc))
        was = {key: array.copy() for key, array in params.items()}
        lr = options.lr * (BAD_STEP if reward < 0 and state.keyed is not None else 1.0)
        if options.optimizer == "sgd":
            sgd(params, grads, lr)
        else:
            state.adam.update(params, grads, lr)
        self.last_step = {key: params[key] - was[key] for key in params}
        adapter.version += 1

    @staticmethod
    def _columns(grads: dict[str, np.ndarray], rows: tuple[int, int]) -> dict[str, np.ndarray]:
        """B's gradients with only the columns of `rows` (start, stop) kept; A's left out."""
        out = {}
        for key, g in grads.items():
            if key.endswith(".lora_B"):
                out[key] = np.zeros_like(g)
                out[key][:, rows[0] : rows[1]] = g[:, rows[0] : rows[1]]
        return out

    def _projected(self, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, basis in self.adapter.state.bases.items():  # A stays out of ordinary text's input subspace
            grads[f"{name}.lora_A"] = project(grads[f"{name}.lora_A"], basis)
        return grads

    def finish(self) -> AdaptReport:
        """Consolidate what this lesson taught (its Fisher information, EWC; it joins the adapter's
        memory of lessons) and report."""
        if self.report is None:
            with self.engine.threads.limit(len(self.tokens)):
                drained(self._finish())
        assert self.report is not None  # (_finish reports)
        return self.report

    def _finish(self):
        """finish() in units of work."""
        if self.report is not None:
            return
        start = self._start()
        result, grads = yield from self._unmoved(partial(self._gradients, self.tokens, self.scored, 1.0, start, None))
        params = dict(self.adapter.parameters())
        self.adapter.state.ewc.consolidate(params, grads, self.options.fisher_decay)
        memory = self.adapter.state.memory
        # feedback on the same answer again replaces what the adapter remembers of it (a Bad on an answer
        # an earlier lesson called Good: the newest wins, and the Good one is not rehearsed back)
        memory[:] = [m for m in memory if not self._same_answer(m)]
        memory.append(self.memory)
        del memory[: max(0, len(memory) - MEMORY_LESSONS)]
        step_ms = self.compute_ms / max(self.steps + self.rehearsed + self.taken_back, 1)
        before = result.log_likelihood if self.log_prob_before is None else self.log_prob_before
        wall_ms = (time.perf_counter() - self.given) * 1000
        outcome = self.outcome or "most_steps"
        self.report = AdaptReport(
            before,
            result.log_likelihood,
            self.steps,
            step_ms,
            self.rehearsed,
            wall_ms,
            outcome,
            len(self.scored),
            self.reward,
            result.greedy,
        )

    def _same_answer(self, item: Memory) -> bool:
        """Whether a remembered lesson is about this lesson's prompt and answer (whatever its reward)."""
        return item.tokens == self.memory.tokens and item.prompt_length == self.memory.prompt_length

    @property
    def memory(self) -> Memory:
        return Memory(tuple(self.tokens), int(self.scored[0]) + 1, self.reward)

    def _recall(self, item: Memory):
        """A remembered lesson's tokens, scored positions, Start and Keep (kept with the adapter once
        made: `Adapter.starts`), in units of work (a generator that returns them)."""
        if item == self.memory:
            return self.tokens, self.scored, self._start(), self._keep()
        scored = np.arange(item.prompt_length - 1, len(item.tokens) - 1)
        starts = self.adapter.starts
        if item not in starts:
            engine, first = self.engine, first_layer(self.engine, self.adapter)
            fed = list(item.tokens[: len(item.tokens) - 1])
            entering = yield from self._entering(embed(engine.weights, engine.config, np.asarray(fed)), 0, first)
            start = start_at(engine.model, entering, first)
            yield
            starts[item] = start, (yield from self._kept_units(start, item.prompt_length))
            yield
        start, keep = starts[item]
        return list(item.tokens), scored, start, keep or None

    def _entering(self, x: np.ndarray, layer: int, first: int):
        """The hidden states entering layer `first`, from x (T, D) entering `layer`: LESSON_WORK token-layers
        a unit (a generator that returns them)."""
        engine = self.engine
        per_unit = max(1, LESSON_WORK // len(x))
        for at in range(layer, first, per_unit):
            x = advance(engine.model, x, range(at, min(at + per_unit, first)))
            yield
        return x

    def _begin(self):
        """The lesson's start in units of work: the hidden states entering the adapter's lowest layer (from
        the generation's cache, or a few layers a unit), what that layer computes the same at every step
        (backprop.start_at), the projection (or its job), the base model's predictions kept."""
        engine, first = self.engine, first_layer(self.engine, self.adapter)
        fed = self.tokens[: int(self.scored.max()) + 1]
        tapped = tapped_states(engine, self.cache, fed, first)
        self.reused_states = tapped is not None
        layer, x = tapped if tapped is not None else (0, embed(engine.weights, engine.config, np.asarray(fed)))
        yield
        entering = yield from self._entering(x, layer, first)
        self.start = start_at(engine.model, entering, first)
        self._make_keyed()
        self._grow_for_keys()
        if not self.keyed:
            self._project()
        yield
        self.keep = yield from self._kept_units(self.start, int(self.scored[0]) + 1)
        yield

    @property
    def keyed(self) -> bool:
        """Whether its adapter is keyed (its lessons write rows of A and train B's columns of them)."""
        return self.adapter.state.keyed is not None

    def _make_keyed(self) -> None:
        """A fresh adapter (nothing learned) is made keyed by its first lesson: with options.keyed, a
        calibration text and no lm_head (whose input the passes do not tape)."""
        adapter, state = self.adapter, self.adapter.state
        if state.keyed is None and self.options.keyed and not adapter.version and not state:
            if self.learning.calibration_ids and "lm_head" not in adapter.A:
                state.keyed = 0

    def _grow_for_keys(self) -> None:
        """A keyed adapter with fewer than KEY_ROWS rows left grows (Adapter.grow) for a new lesson, up
        to its matrices' smaller side: an earlier lesson's gated rows would not answer this one's inputs.
        Feedback on an answer already taught reuses its rows and grows nothing."""
        adapter, state = self.adapter, self.adapter.state
        if state.keyed is None or (self.memory.tokens, self.memory.prompt_length) in state.rows:
            return
        extra = state.keyed + KEY_ROWS - adapter.config.rank
        side = min(min(linear_of(self.engine.weights, name).matrix.shape) for name in adapter.A)
        if extra > 0 and adapter.config.rank + extra <= side:
            adapter.grow(extra)
            AdapterSet.attached(self.engine).refresh(adapter)

    def _spectra_units(self):
        """The calibration text's spectra of the adapted matrices (projection.Spectrum), made by a job
        in units of this lesson's work when not made yet (a generator)."""
        learning, modules = self.learning, list(self.adapter.A)
        ids = list(learning.calibration_ids or ())
        spectra = ready_spectra(learning, modules, ids)
        if spectra is None:
            self.job = bases_job(learning, modules, ids, self.options.project or AdaptOptions.project)
            while self.job is not None and not advance_job(learning, self.job):
                yield
            spectra = ready_spectra(learning, modules, ids)
        assert spectra is not None, "no calibration text: _make_keyed keys no adapter then"
        self.spectra = spectra

    def _write_keys(self, result: Gradients) -> bool:
        """A keyed lesson's rows of A, written once (True then: B's gradient on them is _fresh_rows').
        The adapted matrices' inputs at the positions the lesson must change (a good answer's tokens not
        yet the likeliest by KEY_MARGIN; for a bad one, the one position its unlikelihood pushes),
        whitened by the calibration's spectra, become at most KEY_ROWS orthonormal rows (their SVD),
        scaled to respond to those inputs with the inputs' own norm, and gated (lora.Gate): an input
        whose response to them is under KEY_GATE of the weakest of the lesson's gets none, one from that
        weakest up all of it. Feedback on
        the same answer again keeps its rows; with no rows left (the adapter grew to its matrices' smaller
        side: _grow_for_keys), a lesson trains the columns of every lesson's rows. (Bad keyed at every
        position, the first left out or not, moved how "What is the capital of France?" is answered:
        "L'Étoile, ...".)"""
        adapter, state = self.adapter, self.adapter.state
        if state.keyed is None or self.rows is not None:
            return False
        key = (self.memory.tokens, self.memory.prompt_length)
        if key in state.rows:
            self.rows = state.rows[key]
            return False
        assert result.margins is not None and result.tapes is not None and self.spectra is not None
        assert self.start is not None
        if self.reward > 0:
            must = result.margins < KEY_MARGIN
        else:  # where the unlikelihood pushes (backprop: the weakest position, not the first)
            must = np.zeros(len(self.scored), bool)
            must[bad_position(result.margins)] = True
        positions = self.scored[must] if must.any() else self.scored
        used = state.keyed
        count = min(KEY_ROWS, len(positions), adapter.config.rank - used)
        if count <= 0:
            self.rows = (0, used)
            return False
        for name, A in adapter.A.items():
            _, _, index, _, target = name.split(".")
            taped = getattr(result.tapes[int(index) - self.start.first], INPUTS[target])
            inputs = taped[positions].astype(np.float64)  # (n, K)
            _, _, vt = np.linalg.svd(self.spectra[name].whiten(inputs, KEY_RIDGE), full_matrices=False)
            rows = vt[:count]  # (count, K) orthonormal
            rows *= np.linalg.norm(inputs) / max(float(np.linalg.norm(inputs @ rows.T)), 1e-30)
            A[used : used + count] = rows.astype(np.float32)
            weakest = float(np.linalg.norm(taped[positions] @ A[used : used + count].T, axis=1).min())
            adapter.gates.setdefault(name, []).append(Gate(used, used + count, KEY_GATE * weakest, weakest))
        self.rows = state.rows[key] = (used, used + count)
        state.keyed = used + count  # (no version: B's columns of new rows are zero, nothing computes otherwise)
        return True

    def _fresh_rows(self, result: Gradients, grads: dict[str, np.ndarray]) -> None:
        """B's gradient on the rows _write_keys just wrote, from the same pass: their columns of B are
        zero, so the forward and the loss's gradient at each adapted output (dy) are what they were, and
        dB = scale * dy^T (x A_rows^T) needs no second pass (the kept predictions' term alike)."""
        assert self.rows is not None and self.start is not None and result.tapes is not None
        start, stop = self.rows
        for name, A in self.adapter.A.items():
            _, _, index, _, target = name.split(".")
            x = getattr(result.tapes[int(index) - self.start.first], INPUTS[target])  # (T, K)
            z = x @ A[start:stop].T  # (T, count)
            next(g for g in self.adapter.gates[name] if g.start == start).apply(z)
            for outputs, by_matrix in ((result.outputs, None), (result.kept_outputs, result.kept)):
                if outputs is None:
                    continue
                matrix = next(m for m, _, _ in (by_matrix or result.by_matrix).values() if m.A is A)
                dB = matrix.scale * (outputs[id(matrix)].T @ z)  # (N, count)
                if by_matrix is None:
                    grads[f"{name}.lora_B"][:, start:stop] = dB
                else:
                    by_matrix[id(matrix)][2][:, start:stop] = dB

    def _keep(self) -> Keep | None:
        if self.keep is None:
            self.keep = self._kept(self._start(), int(self.scored[0]) + 1)
        return self.keep or None

    def _kept(self, start: Start, prompt_length: int) -> Keep | Literal[False]:
        """The base model's predictions at up to KEPT_POSITIONS prompt positions, spread over the
        prompt (the last one predicts the completion: not kept); False when none or options.keep is 0."""
        return drained(self._kept_units(start, prompt_length))

    def _kept_units(self, start: Start, prompt_length: int):
        """_kept in units of work (a generator that returns the same). An adapter that is still zero (a
        fresh one: B is zero) computes as the base model: its first pass gives the predictions kept."""
        if not self.options.keep or prompt_length < 2:
            return False
        positions = np.unique(np.linspace(0, prompt_length - 2, min(KEPT_POSITIONS, prompt_length - 1)).astype(int))
        if self._still_zero():
            return Keep(positions, None, self.options.keep)
        engine = self.engine
        probs = yield from base_prob_units(engine.model, start, positions)
        return Keep(positions, probs, self.options.keep)

    def _still_zero(self) -> bool:
        """Whether the adapter computes as the base model (B zero: a fresh adapter, rows written or not)."""
        return not any(B.any() for B in self.adapter.B.values())

    def _start(self) -> Start:
        """Where the passes start: the hidden states entering the adapter's lowest layer at every
        position fed, and what that layer computes the same at every step (backprop.start_at)."""
        if self.start is None:
            drained(self._begin())
        assert self.start is not None  # (_begin makes it)
        return self.start

    def _project(self) -> None:
        """A fresh adapter's A out of ordinary text's input subspace (projection.py), once: the bases
        come from the engine's calibration text and stay in the adapter's learning state. A lesson's
        instant step (`defer_projection`) does not wait for bases still to be made: the background loop
        makes them (a job of small steps), and the next step projects A then."""
        adapter, learning = self.adapter, self.learning
        ids = learning.calibration_ids
        if not self.options.project or adapter.state.bases or not ids:
            return
        if adapter.version and not self.unprojected:  # it learned before, without (a loaded adapter)
            return
        modules, ids, energy = list(adapter.A), list(ids), self.options.project
        bases = ready_bases(learning, modules, ids, energy)
        if bases is None and self.defer_projection and not self.steps:
            self.job = bases_job(learning, modules, ids, energy)
            self.unprojected = True
            return
        adapter.state.bases = bases if bases is not None else shared_bases(learning, modules, ids, energy)
        for name, basis in adapter.state.bases.items():
            adapter.A[name][...] = project(adapter.A[name], basis)
        self.unprojected = False


class _Rehearsal:
    """Rounds over lessons learned before (and this one): each is checked, and stepped while greedy
    decoding does not reproduce it (at most `cap` steps per visit); a round where none needed a step
    ends the rehearsal, as does the last of `rounds`."""

    def __init__(self, items: list[Memory], rounds: int, cap: int) -> None:
        self.items, self.rounds, self.cap = items, rounds, cap
        self.round = self.index = self.taken = 0
        self.again = False  # a lesson of this round needed steps

    @property
    def finished(self) -> bool:
        return self.round >= self.rounds

    def next(self, again: bool) -> None:
        self.again |= again
        self.index, self.taken = self.index + 1, 0
        if self.index == len(self.items):
            self.round = self.round + 1 if self.again else self.rounds
            self.index, self.again = 0, False


def tapped_states(engine: Engine, cache: KVCache | None, tokens: list[int], first: int):
    """(tap layer, hidden states (T, D) entering it) for `tokens` from a cache that computed them with
    the weights below `first` as they are now, or None. A cache a few tokens short (a generation never
    feeds its last token back) is extended first, when its weights are still the active ones."""
    if cache is None or cache.tap is None or cache.tap.layer > first or cache.owner is None:
        return None
    identity = engine.weights_identity()
    if engine.kept_layers(cache.owner, identity) < cache.tap.layer:
        return None
    have = min(cache.tap.length, len(cache.tokens), len(tokens))
    if cache.tokens[:have] != list(tokens[:have]):
        return None
    if have < len(tokens):
        if len(tokens) - have > TAP_TAIL or cache.owner != identity:
            return None
        engine.forward(tokens[have:], have, cache, last_only=True, weights=identity)
    return cache.tap.layer, cache.tap.read(len(tokens)).copy()


@dataclass(frozen=True)
class LessonProgress:
    """Where one lesson stands, as the worker reports it to JavaScript (asdict of it crosses
    as it is: npm/types/index.d.ts `LearningProgress`, camel-cased by the worker)."""

    key: object  # the caller's name for the lesson
    phase: str  # the lesson's (_Stepwise.phase), or "waiting" while lessons ahead of it run
    step: int  # optimizer steps taken on it
    steps: int  # the most it takes
    rehearsed: int  # steps taken on earlier lessons, rehearsing them
    version: int  # its adapter's (bumped by every step)
    done: bool
    applied: bool  # its first step is taken (or was not needed): the next answer uses it
    cancelled: bool
    outcome: str | None  # AdaptReport.outcome, once known
    elapsed_ms: float  # wall time since it was given
    prepared: dict | None  # while it waits for a job: {"done", "total"} units of it
    ahead: int  # lessons before it in the queue
    note: str | None  # why it ended, where a user needs telling (dropped)
    report: dict | None  # dataclasses.asdict of its AdaptReport, once done


@dataclass(frozen=True)
class LearningStatus:
    """Where the background loop stands."""

    lessons: int  # waiting or under way (0: idle)
    step: int  # steps the current lesson has taken
    steps: int  # its most steps
    adapter: str | None  # the adapter it teaches
    version: int  # that adapter's version (bumped by every step)
    finished: int  # lessons finished so far
    cancelled: int  # lessons cancelled so far (Learner.cancel)
    preparing: bool = False  # a projection job is under way (a fresh adapter's bases)
    phase: str = "idle"  # the current lesson's (_Stepwise.phase), "preparing" (a job, no lesson), or "idle"
    prepared: tuple[int, int] | None = None  # the units of the job under way done, and in all
    elapsed_ms: float = 0.0  # wall time since the current lesson was made
    dropped: int = 0  # lessons dropped because their adapter was replaced meanwhile


class Learner:
    """The background loop: lessons waiting to be learned, in order, a unit of work at a time (a unit
    is bounded: Lesson.work, BasesJob.step). `run(budget_ms)` does units until the budget is spent;
    callers run it between generations (the worker in its idle time, Python code whenever it likes), so
    learning never holds a generation up by more than about a unit. A lesson's first step is taken at
    once by whoever adds it (the instant loop). A projection job comes first when the lesson at the
    front needs it for its next step, and runs when no lesson waits."""

    def __init__(self, adapters, learning: ModelLearning | None = None) -> None:
        self.adapters = adapters  # adapters.AdapterSet: the lessons' adapters by name
        self.learning = learning  # whose projection jobs (projection.bases_job) the lessons may wait for
        self.queue: deque[tuple[str, _Stepwise]] = deque()
        self.finished = 0
        self.cancelled = 0
        self.dropped = 0
        self.clock = time.perf_counter  # (seconds; tests count units with a clock of their own)

    def add(self, name: str, lesson: _Stepwise) -> None:
        self.queue.append((name, lesson))

    def run(self, budget_ms: float | None = None) -> LearningStatus:
        """Units of work of the waiting lessons (and projection jobs) until none is left or `budget_ms`
        is spent: at least one, and no more once the next one, taking as long as the last, would end
        past the budget."""
        started = last = self.clock()
        while self.queue or self.preparing:
            self._unit()
            now = self.clock()
            spent, unit, last = now - started, now - last, now
            if budget_ms is not None and (spent + unit) * 1000 > budget_ms:
                break
        return self.status()

    def first_step(self, lesson: _Stepwise, budget_ms: float | None = None) -> bool:
        """The instant loop: units of `lesson` (added) until its first step is applied (or found not to be
        needed) or `budget_ms` is spent, at least one, as `run` budgets them; True once applied."""
        name = next(each for each, held in self.queue if held is lesson)
        started = last = self.clock()
        while not lesson.applied:
            with self.adapters.lock:
                self.adapters.apply(name)
                lesson.work()
            now = self.clock()
            spent, unit, last = now - started, now - last, now
            if budget_ms is not None and (spent + unit) * 1000 > budget_ms:
                break
        if lesson.done:
            self.queue = deque(entry for entry in self.queue if entry[1] is not lesson)
            self.finished += 1
        return lesson.applied

    def _unit(self) -> None:
        """One unit of work: of the lesson at the front, or of the job it (or, with no lesson, the loop)
        waits for."""
        job = self.preparing
        if self.queue:
            name, lesson = self.queue[0]
            held = self.adapters.adapters.get(name) or self.adapters.mixtures.get(name)
            if held is not lesson.adapter:  # replaced meanwhile: what it taught went with the old one
                self.queue.popleft()
                lesson.ended = "dropped"
                self.dropped += 1
                return
            job = lesson.waiting_for
            if job is None:
                with self.adapters.lock:
                    self.adapters.apply(name)
                    lesson.work()
                if lesson.done:
                    self.queue.popleft()
                    self.finished += 1
                return
        assert job is not None and self.learning is not None  # (run calls this only with a lesson or a job)
        with self.adapters.lock:
            advance_job(self.learning, job)

    def cancel(self, lesson: _Stepwise | None = None) -> LearningStatus:
        """Drop `lesson` (None: every waiting lesson); what their steps taught so far stays."""
        for entry in self.queue:
            if lesson is None or entry[1] is lesson:
                entry[1].ended = "cancelled"
        kept = deque(entry for entry in self.queue if lesson is not None and entry[1] is not lesson)
        self.cancelled += len(self.queue) - len(kept)
        self.queue = kept
        return self.status()

    @property
    def preparing(self) -> BasesJob | None:
        """A projection job under way (its bases are made before the next lesson step), or None."""
        return None if self.learning is None else pending_job(self.learning)

    def prepare(self, modules: list[str], energy: float = AdaptOptions.project) -> bool:
        """Have the bases of `modules` (a fresh adapter's projection) made in the background; True when
        there is work to do (none without a calibration text, for a model learning does not run on, or
        once they are made)."""
        ids = None if self.learning is None else self.learning.calibration_ids
        if self.learning is None or not ids or not energy:
            return False
        with self.adapters.lock:
            return bases_job(self.learning, modules, list(ids), energy) is not None

    def progress(self, lesson: _Stepwise, key: object, adapter: str) -> LessonProgress:
        """Where `lesson` (teaching `adapter`, named `key` by the caller) stands."""
        queue = [held for _, held in self.queue]
        ahead = queue.index(lesson) if lesson in queue else 0
        phase = "waiting" if ahead and lesson.phase in ("preparing", "learning", "rehearsing") else lesson.phase
        job = lesson.waiting_for if phase == "preparing" else None
        note = None
        if phase == "dropped":
            note = f"its adapter {adapter!r} was replaced before the lesson finished (what it taught went with it)"
        return LessonProgress(
            key=key,
            phase=phase,
            step=lesson.steps,
            steps=lesson.options.steps,
            rehearsed=lesson.rehearsed,
            version=lesson.adapter.version,
            done=lesson.done,
            applied=lesson.applied,
            cancelled=phase == "cancelled",
            outcome=lesson.outcome,
            elapsed_ms=round(lesson.elapsed_ms, 1),
            prepared=None if job is None else dict(zip(("done", "total"), job.progress, strict=True)),
            ahead=ahead,
            note=note,
            report=asdict(lesson.report) if lesson.report else None,
        )

    def status(self) -> LearningStatus:
        job = self.preparing
        counts = {"finished": self.finished, "cancelled": self.cancelled, "dropped": self.dropped}
        if not self.queue:
            phase, prepared = ("idle", None) if job is None else ("preparing", job.progress)
            return LearningStatus(0, 0, 0, None, 0, preparing=job is not None, phase=phase, prepared=prepared, **counts)
        name, lesson = self.queue[0]
        waiting = lesson.waiting_for
        return LearningStatus(
            len(self.queue),
            lesson.steps,
            lesson.options.steps,
            name,
            lesson.adapter.version,
            preparing=job is not None,
            phase=lesson.phase,
            prepared=None if waiting is None else waiting.progress,
            elapsed_ms=lesson.elapsed_ms,
            **counts,
        )


def clipped(grads: dict[str, np.ndarray], max_norm: float) -> dict[str, np.ndarray]:
    """The gradients scaled down to a global norm of `max_norm` when longer (0: as they are)."""
    norm = float(np.sqrt(sum(np.sum(g * g) for g in grads.values())))
    if not max_norm or norm <= max_norm:
        return grads
    return {k: g * np.float32(max_norm / norm) for k, g in grads.items()}


class RouteLesson(_Stepwise):
    """A piece of feedback for an X-LoRA mixture: its router learns which experts to use for such text
    (the experts stay as they are), a step at a time like a Lesson: plain gradient steps (clipped)
    until greedy decoding reproduces a good completion, at most `steps` (lr: ROUTER_LR suits it)."""

    adapter: Mixture

    def __init__(
        self,
        engine: Engine,
        mixture: Mixture,
        prompt_ids: list[int],
        completion_ids: list[int],
        reward: float = 1.0,
        options: AdaptOptions | None = None,
    ) -> None:
        self.given = time.perf_counter()
        self.options = options or AdaptOptions()
        self.tokens, self.scored = lesson_tokens(engine, prompt_ids, completion_ids, reward)
        self.engine, self.adapter, self.reward = engine, mixture, float(reward)
        self.steps = 0
        self.rehearsed = 0  # (a router rehearses nothing)
        self.best: tuple = (-np.inf, None, None)  # (margin, the router's arrays, Gradients): a good lesson's best
        self.log_prob_before: float | None = None
        self.report: AdaptReport | None = None
        self.compute_ms = 0.0

    def step(self) -> None:
        if self.done:
            return
        started = time.perf_counter()
        with self.engine.threads.limit(len(self.tokens)):
            result, grads = route_gradients(self.engine, self.adapter, self.tokens, self.scored, self.reward)
        self.log_prob_before = result.log_likelihood if self.log_prob_before is None else self.log_prob_before
        before, count = self.log_prob_before, len(self.scored)
        learned = self.options.until_greedy and done_with(self.reward, result, before, count, ROUTER_MARGIN)
        if self.reward > 0 and result.margin > self.best[0]:  # the router as it stood before this step
            self.best = (result.margin, [a.copy() for _, a in self.adapter.parameters()], result)
        if not learned:
            params = dict(self.adapter.parameters())
            sgd(params, clipped(grads, self.options.max_grad_norm), self.options.lr)
            self.adapter.version += 1
            self.steps += 1
        self.compute_ms += (time.perf_counter() - started) * 1000
        if learned or self.steps == self.options.steps:
            self.outcome = "most_steps" if not learned else "unlearned" if self.reward < 0 else "learned"
            self.outcome = "already" if learned and self.reward > 0 and not self.steps else self.outcome
            self.finish(result if learned else None)

    def finish(self, last: Gradients | None = None) -> AdaptReport:
        if self.report is None:
            if last is None:  # the last step changed the router: where it stands now
                with self.engine.threads.limit(len(self.tokens)):
                    last, _ = route_gradients(self.engine, self.adapter, self.tokens, self.scored, self.reward)
            margin, kept, result = self.best
            if last.margin < margin:  # the steps went past the best router they met (top-k routing jumps)
                for (_, array), saved in zip(self.adapter.parameters(), kept, strict=True):
                    array[...] = saved
                self.adapter.version += 1
                last = result
            before = last.log_likelihood if self.log_prob_before is None else self.log_prob_before
            step_ms, wall_ms = self.compute_ms / max(self.steps, 1), (time.perf_counter() - self.given) * 1000
            outcome = self.outcome or "most_steps"
            self.report = AdaptReport(
                before,
                last.log_likelihood,
                self.steps,
                step_ms,
                0,
                wall_ms,
                outcome,
                len(self.scored),
                self.reward,
                last.greedy,
            )
        return self.report
