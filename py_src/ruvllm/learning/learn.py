"""Learning from feedback: a few optimizer steps on an adapter per (prompt, completion, reward).

Each step follows the true gradient (backprop.py) of

    -reward * mean log p(completion | prompt)  +  ewc / 2 * sum_i F_i (theta_i - anchor_i)^2

so reward +1 makes the completion likelier, -1 less likely. The second term is elastic weight
consolidation: F is the Fisher information (squared log-likelihood gradients) accumulated over past
lessons and `anchor` the adapter after the last one, so a new lesson moves most freely where earlier
ones did not care, and does not erase them. Updates are Adam (default) or SGD, in place, so the
adapter's arrays stay the ones the model reads.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError
from ..model.cache import KVCache, KVOptions
from ..model.forward import hidden, rms_norm
from ..runtime.engine import Engine
from .backprop import Gradients, Keep, Start, advance, base_probs, entering_states, loss_and_grads, start_at
from .lora import Adapter
from .projection import advance as advance_job
from .projection import bases_job, pending_job, project, ready_bases, shared_bases
from .state import Memory, sgd
from .xlora import Mixture

MEMORY_LESSONS = 64  # lessons an adapter remembers for rehearsal (the oldest go first)
REHEARSAL_STEPS = 5  # steps a rehearsed lesson gets at most per round
KEPT_POSITIONS = 8  # prompt positions whose predictions a lesson keeps (AdaptOptions.keep)
TAP_TAIL = 16  # tokens a lesson feeds a generation's cache to take its hidden states (tapped_states)
# A router's step size (RouteLesson). Measured on SmolLM2 (two experts, one fact each, mixed densely, a
# lesson on each fact three times): 0.1 reproduced both facts in 7 steps, 0.3 in 12; 0.02 and 1 (an
# adapter's) only one of them (benchmarks/RESULTS.md, "X-LoRA").
ROUTER_LR = 0.1
# A router's lesson ends once greedy decoding gives the completion with this margin (log-probability
# over the next likeliest token at every position), not at the edge: lessons on one mixture pull its one
# router in turn, and one that stopped where its completion had only just become the greedy one was
# undone by the next lesson or not, by rounding (1 or 2 BLAS threads gave different answers).
ROUTER_MARGIN = 1.0
# When a bad completion's lesson ends: its likeliest position's target trails another token by this
# much (greedy decoding leaves it there), and the whole completion is this much less likely (log).
NEGATIVE_MARGIN = 0.5
NEGATIVE_DROP = float(np.log(2.0))


@dataclass(frozen=True)
class AdaptOptions:
    """How a lesson learns. The defaults are the measured ones (benchmarks/RESULTS.md, "MicroLoRA"):
    plain gradient steps until greedy decoding reproduces a good completion (at most `steps`), the
    base model's predictions on the prompt kept, then rehearsal of the earlier lessons."""

    steps: int = 20  # optimizer steps on the lesson at most
    lr: float = 1.0
    optimizer: str = "sgd"  # or "adam"
    ewc: float = 0.0  # strength of the consolidation term (0 turns it off)
    max_grad_norm: float = 1.0  # the gradient is scaled down to this global norm when longer
    fisher_decay: float = 1.0  # weight of older lessons' Fisher information when a new one is added
    until_greedy: bool = True  # a good completion's lesson ends once greedy decoding reproduces it
    rehearse: int = 3  # rounds of rehearsal of earlier lessons after this one (0: none)
    keep: float = 10.0  # weight of the KL divergence that keeps the base model's predictions on the prompt
    project: float = 0.99  # a new adapter's A stays out of the inputs' subspace holding this much energy

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise InvalidArgumentError(f"steps must be an integer >= 1, got {self.steps!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < 10):
            raise InvalidArgumentError(f"lr must be a number in (0, 10), got {self.lr!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise InvalidArgumentError(f"optimizer must be adam or sgd, got {self.optimizer!r}")
        if not (isinstance(self.ewc, (int, float)) and self.ewc >= 0):
            raise InvalidArgumentError(f"ewc must be a number >= 0, got {self.ewc!r}")


@dataclass(frozen=True)
class AdaptReport:
    log_prob_before: float  # mean log-probability of the completion's tokens, before the first step
    log_prob_after: float  # ... after the last step
    steps: int  # optimizer steps on this lesson
    step_ms: float  # mean time of one pass (forward + backward through the adapted layers, update)
    rehearsal_steps: int = 0  # optimizer steps on earlier lessons, rehearsed after this one


def adapter_gradients(
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
    `keep`, the gradient of its term (the predictions kept) is in `keyed(adapter, result.kept)`."""
    first = first_layer(engine, adapter)
    weights, config = engine.weights, engine.config
    result = loss_and_grads(weights, config, engine.inv_freq, tokens, scored, reward, keep, first, start)
    return result, keyed(adapter, result.by_matrix)


def keyed(adapter: Adapter, by_matrix: dict) -> dict[str, np.ndarray]:
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
    weights, config, inv_freq = engine.weights, engine.config, engine.inv_freq
    T = int(scored.max()) + 1
    fed = np.asarray(tokens[:T])
    mixture.constant(T)
    side = hidden(weights, config, inv_freq, fed, 0, KVCache(config, T, KVOptions()))  # (T, D)
    mixture.route(rms_norm(side, weights.norm, config.rms_norm_eps))
    first = mixture.lowest_layer
    result = loss_and_grads(weights, config, inv_freq, tokens, scored, reward, None, first)
    layers = mixture.route_backward(result.mixes or {})  # [(dW, db)], in parameters() order
    keys = [key for key, _ in mixture.parameters()]
    return result, dict(zip(keys, [g for pair in layers for g in pair], strict=True))


def first_layer(engine: Engine, adapter: Adapter) -> int:
    """Where learning's passes start: the adapter's lowest layer (the top, for lm_head only)."""
    lowest = adapter.lowest_layer
    return engine.config.num_hidden_layers if lowest is None else lowest


def lesson_for(engine: Engine, held, prompt_ids, completion_ids, reward, options: dict, cache: KVCache | None = None):
    """The lesson that teaches `held`: a Lesson for an adapter, a RouteLesson (lr ROUTER_LR unless
    given) for an X-LoRA mixture. `options`: AdaptOptions fields."""
    if isinstance(held, Mixture):
        options = AdaptOptions(**{"lr": ROUTER_LR, **options})
        return RouteLesson(engine, held, prompt_ids, completion_ids, reward, options)
    return Lesson(engine, held, prompt_ids, completion_ids, reward, AdaptOptions(**options), cache)


def check_reward(reward: object, name: str = "reward") -> float:
    """A lesson's reward: a non-zero number in [-1, 1] (+1 good: likelier; -1 bad: less likely; the
    magnitude scales the lesson's gradient before clipping, so more than 1 would only drown the kept
    predictions)."""
    number = isinstance(reward, (int, float)) and not isinstance(reward, bool)
    if not number or not -1 <= reward <= 1 or reward == 0:  # (NaN fails the range)
        raise InvalidArgumentError(f"{name} must be a non-zero number in [-1, 1] (+1 good, -1 bad), got {reward!r}")
    return float(reward)


def lesson_tokens(engine: Engine, prompt_ids, completion_ids, reward) -> tuple[list[int], np.ndarray]:
    """A lesson's tokens (prompt then completion) and scored positions (P,), or the error saying why
    it cannot be learned."""
    if not engine.config.llama_block:
        raise InvalidArgumentError(
            f"adapt (MicroLoRA learning) runs on Llama-style blocks (Llama, Mistral, Qwen2, Phi-3); "
            f"{engine.config.architecture} is not supported yet (applying a trained adapter is)"
        )
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
    """What the background loop needs of a lesson: `step()` until `done` (then `report` is set)."""

    report: AdaptReport | None = None
    defer_projection = False  # (Lesson: its instant step does not wait for a fresh adapter's bases)

    def step(self) -> None:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        return self.report is not None

    def run(self, budget_ms: float | None = None) -> bool:
        """Steps until the lesson is done or `budget_ms` is spent (at least one step); True when done."""
        started = time.perf_counter()
        while not self.done:
            self.step()
            if budget_ms is not None and (time.perf_counter() - started) * 1000 >= budget_ms:
                break
        return self.done


class Lesson(_Stepwise):
    """One piece of feedback being learned, a step at a time: `step()` until `done`, then `finish()`
    (which the last step does). The hidden states entering the adapter's lowest layer are computed once
    (or taken from the cache of the generation that produced the text, `cache.tap`), so each step is a
    forward and backward through the adapted layers only."""

    def __init__(
        self,
        engine: Engine,
        adapter: Adapter,
        prompt_ids: list[int],
        completion_ids: list[int],
        reward: float = 1.0,
        options: AdaptOptions | None = None,
        cache: KVCache | None = None,
    ) -> None:
        self.options = options or AdaptOptions()
        self.tokens, self.scored = lesson_tokens(engine, prompt_ids, completion_ids, reward)
        self.engine, self.adapter, self.reward, self.cache = engine, adapter, float(reward), cache
        self.start: Start | None = None  # where each step's passes start, made by the first step
        self.keep: Keep | bool | None = None  # the predictions kept (False: none), made by the first step
        self.steps = 0  # optimizer steps on this lesson so far
        self.rehearsed = 0  # optimizer steps on earlier lessons, rehearsed after this one was learned
        self.rehearsal: _Rehearsal | None = None  # once this lesson is learned
        self.log_prob_before: float | None = None
        self.report: AdaptReport | None = None  # set by finish()
        self.compute_ms = 0.0
        self.reused_states = False  # whether the entering states came from the cache's tap
        self.defer_projection = False  # the instant step does not wait for a fresh adapter's bases
        self.unprojected = False  # steps were taken before the bases were made

    def step(self) -> None:
        """One unit of work, a forward and backward pass: an optimizer step on this lesson or, once it
        is learned, a check (and step) of a lesson learned before, rehearsed so that it stays. The last
        one consolidates (`finish`)."""
        if self.done:
            return
        started = time.perf_counter()
        with self.engine.threads.limit(len(self.tokens)):  # products over the whole sequence: prompt-sized
            if self.rehearsal is None:
                self._learn()
            else:
                self._rehearse()
        self.compute_ms += (time.perf_counter() - started) * 1000
        if self.rehearsal is not None and self.rehearsal.finished:
            self.finish()

    def _learn(self) -> None:
        options = self.options
        start, keep = self._start(), self._keep()
        if self.unprojected:
            self._project()
        result, grads = adapter_gradients(self.engine, self.adapter, self.tokens, self.scored, self.reward, start, keep)
        self.log_prob_before = result.log_likelihood if self.log_prob_before is None else self.log_prob_before
        learned = options.until_greedy and done_with(self.reward, result, self.log_prob_before, len(self.scored))
        if not learned:
            self._update(grads, result.kept)
            self.steps += 1
        if learned or self.steps == options.steps:
            memory = self.adapter.state.memory if options.rehearse else []
            earlier = [m for m in memory if m.reward > 0]
            # this lesson too: one that its steps did not teach gets more, with the earlier ones beside it
            items = [*earlier, self.memory] if self.reward > 0 else earlier
            self.rehearsal = _Rehearsal(items, options.rehearse if items else 0, REHEARSAL_STEPS)

    def _rehearse(self) -> None:
        r = self.rehearsal
        item = r.items[r.index]
        tokens, scored, start, keep = self._recall(item)
        result, grads = adapter_gradients(self.engine, self.adapter, tokens, scored, item.reward, start, keep)
        if result.greedy or r.taken == r.cap:
            r.next(again=r.taken > 0)
        else:
            self._update(grads, result.kept)
            r.taken += 1
            self.rehearsed += 1

    def _update(self, grads: dict[str, np.ndarray], kept: dict | None) -> None:
        """One optimizer step: the lesson's gradient clipped, plus the kept predictions' (`kept`, by
        matrix), clipped again (measured: clipping the sum alone lets a large lesson gradient drown
        the kept predictions)."""
        options, adapter = self.options, self.adapter
        params, state = dict(adapter.parameters()), adapter.state
        grads = clipped(self._projected(grads), options.max_grad_norm)
        if kept is not None:
            kept = self._projected(keyed(adapter, kept))
            grads = clipped({key: g + kept[key] for key, g in grads.items()}, options.max_grad_norm)
        if options.ewc:
            grads = state.ewc.pulled(grads, params, options.ewc)
        if options.optimizer == "sgd":
            sgd(params, grads, options.lr)
        else:
            state.adam.update(params, grads, options.lr)
        adapter.version += 1

    def _projected(self, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, basis in self.adapter.state.bases.items():  # A stays out of ordinary text's input subspace
            grads[f"{name}.lora_A"] = project(grads[f"{name}.lora_A"], basis)
        return grads

    def finish(self) -> AdaptReport:
        """Consolidate what this lesson taught (its Fisher information, EWC; it joins the adapter's
        memory of lessons) and report."""
        if self.report is None:
            with self.engine.threads.limit(len(self.tokens)):
                result, grads = adapter_gradients(
                    self.engine, self.adapter, self.tokens, self.scored, 1.0, self._start()
                )
            params = dict(self.adapter.parameters())
            self.adapter.state.ewc.consolidate(params, grads, self.options.fisher_decay)
            memory = self.adapter.state.memory
            if self.memory in memory:  # the same lesson again: it moves to the end
                memory.remove(self.memory)
            memory.append(self.memory)
            del memory[: max(0, len(memory) - MEMORY_LESSONS)]
            step_ms = self.compute_ms / max(self.steps + self.rehearsed, 1)
            before = result.log_likelihood if self.log_prob_before is None else self.log_prob_before
            self.report = AdaptReport(before, result.log_likelihood, self.steps, step_ms, self.rehearsed)
        return self.report

    @property
    def memory(self) -> Memory:
        return Memory(tuple(self.tokens), int(self.scored[0]) + 1, self.reward)

    def _recall(self, item: Memory) -> tuple[list[int], np.ndarray, Start, Keep | None]:
        """A remembered lesson's tokens, scored positions, Start and Keep (kept with the adapter once
        made: `Adapter.starts`)."""
        if item == self.memory:
            return self.tokens, self.scored, self._start(), self._keep()
        scored = np.arange(item.prompt_length - 1, len(item.tokens) - 1)
        starts = self.adapter.starts
        if item not in starts:
            engine, first = self.engine, first_layer(self.engine, self.adapter)
            fed = list(item.tokens[: len(item.tokens) - 1])
            entering = entering_states(engine.weights, engine.config, engine.inv_freq, fed, first)
            start = start_at(engine.weights, engine.config, engine.inv_freq, entering, first)
            starts[item] = start, self._kept(start, item.prompt_length)
        start, keep = starts[item]
        return list(item.tokens), scored, start, keep or None

    def _keep(self) -> Keep | None:
        if self.keep is None:
            self.keep = self._kept(self._start(), int(self.scored[0]) + 1)
        return self.keep or None

    def _kept(self, start: Start, prompt_length: int) -> Keep | bool:
        """The base model's predictions at up to KEPT_POSITIONS prompt positions, spread over the
        prompt (the last one predicts the completion: not kept); False when none or options.keep is 0."""
        if not self.options.keep or prompt_length < 2:
            return False
        positions = np.unique(np.linspace(0, prompt_length - 2, min(KEPT_POSITIONS, prompt_length - 1)).astype(int))
        engine = self.engine
        probs = base_probs(engine.weights, engine.config, engine.inv_freq, start, positions)
        return Keep(positions, probs, self.options.keep)

    def _start(self) -> Start:
        """Where the passes start: the hidden states entering the adapter's lowest layer at every
        position fed, and what that layer computes the same at every step (backprop.start_at)."""
        if self.start is None:
            engine, first = self.engine, first_layer(self.engine, self.adapter)
            weights, config, inv_freq = engine.weights, engine.config, engine.inv_freq
            fed = self.tokens[: int(self.scored.max()) + 1]
            tapped = tapped_states(engine, self.cache, fed, first)
            self.reused_states = tapped is not None
            if tapped is not None:
                tap_layer, x = tapped
                entering = advance(weights, config, inv_freq, x, range(tap_layer, first))
            else:
                entering = entering_states(weights, config, inv_freq, fed, first)
            self.start = start_at(weights, config, inv_freq, entering, first)
            self._project()
        return self.start

    def _project(self) -> None:
        """A fresh adapter's A out of ordinary text's input subspace (projection.py), once: the bases
        come from the engine's calibration text and stay in the adapter's learning state. A lesson's
        instant step (`defer_projection`) does not wait for bases still to be made: the background loop
        makes them (a job of small steps), and the next step projects A then."""
        adapter, engine = self.adapter, self.engine
        ids = getattr(engine, "calibration_ids", None)
        if not self.options.project or adapter.state.bases or not ids:
            return
        if adapter.version and not self.unprojected:  # it learned before, without (a loaded adapter)
            return
        modules, ids, energy = list(adapter.A), list(ids), self.options.project
        bases = ready_bases(engine, modules, ids, energy)
        if bases is None and self.defer_projection and not self.steps:
            bases_job(engine, modules, ids, energy)
            self.unprojected = True
            return
        adapter.state.bases = bases if bases is not None else shared_bases(engine, modules, ids, energy)
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
class LearningStatus:
    """Where the background loop stands."""

    lessons: int  # waiting or under way (0: idle)
    step: int  # steps the current lesson has taken
    steps: int  # its most steps
    adapter: str | None  # the adapter it teaches
    version: int  # that adapter's version (bumped by every step)
    finished: int  # lessons finished so far
    cancelled: int  # lessons cancelled so far
    preparing: bool = False  # a fresh adapter's projection is being made (before the next lesson step)


class Learner:
    """The background loop: lessons waiting to be learned, in order, a step at a time. `run(budget_ms)`
    takes steps until the budget is spent; callers run it between generations (the worker in its idle
    time, Python code whenever it likes), so learning never holds a generation up by more than a step.
    A lesson's first step is taken at once by whoever adds it (the instant loop)."""

    def __init__(self, adapters, engine: Engine | None = None) -> None:
        self.adapters = adapters  # lora.AdapterSet: the lessons' adapters by name
        self.engine = engine  # whose projection jobs (projection.bases_job) come before the lessons
        self.queue: deque[tuple[str, Lesson]] = deque()
        self.finished = 0
        self.cancelled = 0

    def add(self, name: str, lesson: Lesson) -> None:
        self.queue.append((name, lesson))

    def run(self, budget_ms: float | None = None) -> LearningStatus:
        """Steps of the waiting lessons until none is left or `budget_ms` is spent (at least one step)."""
        started = time.perf_counter()
        while self.queue or self.preparing:
            job = self.preparing
            if job is not None:  # the bases the lessons project with come first
                with self.adapters.lock:
                    advance_job(self.engine, job)
                if budget_ms is not None and (time.perf_counter() - started) * 1000 >= budget_ms:
                    break
                continue
            name, lesson = self.queue[0]
            held = self.adapters.adapters.get(name) or self.adapters.mixtures.get(name)
            if held is not lesson.adapter:  # replaced or removed meanwhile
                self.queue.popleft()
                self.cancelled += 1
                continue
            with self.adapters.lock:
                self.adapters.apply(name)
                lesson.step()
            if lesson.done:
                self.queue.popleft()
                self.finished += 1
            if budget_ms is not None and (time.perf_counter() - started) * 1000 >= budget_ms:
                break
        return self.status()

    def cancel(self, lesson: Lesson | None = None) -> LearningStatus:
        """Drop `lesson` (None: every waiting lesson); what their steps taught so far stays."""
        kept = deque(entry for entry in self.queue if lesson is not None and entry[1] is not lesson)
        self.cancelled += len(self.queue) - len(kept)
        self.queue = kept
        return self.status()

    @property
    def preparing(self):
        """A projection job under way (its bases are made before the next lesson step), or None."""
        return None if self.engine is None else pending_job(self.engine)

    def prepare(self, modules: list[str], energy: float = AdaptOptions.project) -> bool:
        """Have the bases of `modules` (a fresh adapter's projection) made in the background; True when
        there is work to do (none without a calibration text, for a model learning does not run on, or
        once they are made)."""
        ids = None if self.engine is None else self.engine.calibration_ids
        if not ids or not energy or not self.engine.config.llama_block:  # (learning runs on Llama blocks)
            return False
        with self.adapters.lock:
            return bases_job(self.engine, modules, list(ids), energy) is not None

    def status(self) -> LearningStatus:
        preparing = self.preparing is not None
        if not self.queue:
            return LearningStatus(0, 0, 0, None, 0, self.finished, self.cancelled, preparing)
        name, lesson = self.queue[0]
        version = lesson.adapter.version
        return LearningStatus(
            len(self.queue), lesson.steps, lesson.options.steps, name, version, self.finished, self.cancelled, preparing
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

    def __init__(
        self,
        engine: Engine,
        mixture: Mixture,
        prompt_ids: list[int],
        completion_ids: list[int],
        reward: float = 1.0,
        options: AdaptOptions | None = None,
    ) -> None:
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
            self.report = AdaptReport(before, last.log_likelihood, self.steps, self.compute_ms / max(self.steps, 1))
        return self.report
