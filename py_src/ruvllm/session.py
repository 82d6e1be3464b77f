"""What every front end shares: a loaded engine, its adapters, its learning and the KV cache it lends.

`api.Model` (Python, which tokenizes with its own tokenizer) and `bridge.EngineHandle` (the npm worker's
JSON calls, whose token ids come from JavaScript) are thin layers over one `Session`, so a verb means
the same in both and an option has one default:

    generate / stream  the generation of prompt ids, with the idle cache lent to it (a chat's next
                       turn reuses the prefix it holds)
    new_adapter        a fresh adapter (LoRAConfig's defaults: rank 32, down_proj of 2 layers at 2/3 depth)
    adapt              a whole lesson now, in the caller; its AdaptReport
    feedback           a lesson's first step now (the next answer already differs), its other steps by
                       `learn` calls in idle time; the Lesson. (The npm package's `llm.adapt` is this,
                       awaited to the lesson's end: the worker answers other requests in between.)
    learn              units of work of the waiting lessons, for about a budget
    cancel_learning    drop waiting lessons; what their steps taught stays
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Any, Final

from .learning.adapters import AdapterSet
from .learning.learn import AdaptOptions, AdaptReport, Learner, LearningStatus, Lesson, RouteLesson, lesson_for
from .learning.lora import DEFAULT_TARGETS, Adapter, LoRAConfig, module_names
from .learning.per_model import ModelLearning
from .learning.projection import calibration_ids
from .learning.xlora import Mixture, RouterConfig
from .model.cache import KVCache
from .runtime.constrain import Vocabulary
from .runtime.engine import Engine
from .runtime.generate import Constraint, GenerationOptions, Prefilling, generate_tokens
from .text.detokenizer import StreamingDetokenizer
from .text.stream import Chunk, generate_text


class AdapterChoice(enum.Enum):
    KEEP = "keep"  # a generation's adapter option when none is given: the active adapter stays


KEEP: Final = AdapterChoice.KEEP


# A new adapter's rank, alpha, targets and layers, as a front end takes them (see Session.new_adapter).
AdapterShape = tuple[int | None, float | None, Sequence[str] | None, Sequence[int] | str | None]


class Session:
    """An engine with its adapters (held, active, learning) and its idle KV cache. `token_bytes` is
    each token's bytes (for constrained output), `special_ids` the added tokens marked special."""

    def __init__(self, engine: Engine, token_bytes: Sequence[bytes], special_ids: frozenset[int] = frozenset()) -> None:
        self.engine = engine
        self.token_bytes, self.special_ids = token_bytes, special_ids
        self.adapters = AdapterSet.attached(engine)
        self.learning = ModelLearning(engine)  # the calibration, and the spectra and bases made from it
        self.learner = Learner(self.adapters, self.learning)  # lessons learned in the background (feedback, learn)
        self.idle_cache: KVCache | None = engine.new_cache()  # no generation holds it
        self.last_cache: KVCache = self.idle_cache  # the cache of the latest generation (cache_stats)
        self._cache_lock = threading.Lock()
        self._vocabularies: dict[tuple[int, ...], Vocabulary] = {}

    # --- generation -----------------------------------------------------------------------------

    def stream(
        self,
        ids: list[int],
        options: GenerationOptions,
        eos_ids: Sequence[int],
        detokenizer: StreamingDetokenizer,
        started: float | None = None,
        adapter: str | AdapterChoice | None = KEEP,
        constraint: Constraint | None = None,
        report_prefill: bool = False,
    ) -> Generator[Chunk | Prefilling, None, None]:
        """The chunks of a generation after `ids` (with report_prefill, Prefilling markers between a long
        prompt's forward calls). `adapter`: a held adapter's name, None (the base model) or KEEP; it is
        also active for later calls. The idle cache is lent to it until it ends (finished, failed,
        closed, or collected after being abandoned)."""
        started = time.perf_counter() if started is None else started
        cache = self._borrow_cache()
        try:
            with self.engine.lock:  # the adapter chosen here is the one the generation pins
                if adapter is not KEEP:
                    self.adapters.activate(adapter)
                steps = generate_tokens(
                    self.engine, ids, options, eos_ids, cache, report_prefill=report_prefill, constraint=constraint
                )
        except BaseException:
            self._return_cache(cache)
            raise
        chunks = generate_text(steps, detokenizer, len(ids), options.stop, eos_ids, started)
        return self._returning_cache(chunks, cache)

    def vocabulary(self, eos_ids: Sequence[int]) -> Vocabulary:
        """The tokens as bytes, prepared for constrained decoding with these end-of-sequence ids (built
        once per set: about a second for 50k tokens)."""
        key = tuple(sorted(eos_ids))
        if key not in self._vocabularies:
            size = self.engine.config.vocab_size
            self._vocabularies[key] = Vocabulary(self.token_bytes, size, self.special_ids, key)
        return self._vocabularies[key]

    def _borrow_cache(self) -> KVCache:
        """The idle cache (it may hold a prefix of the next prompt), or a new one if a generation has it."""
        with self._cache_lock:
            cache, self.idle_cache = self.idle_cache, None
        self.last_cache = cache if cache is not None else self.engine.new_cache()
        return self.last_cache

    def _return_cache(self, cache: KVCache) -> None:
        with self._cache_lock:
            self.idle_cache = cache  # the newest finished conversation: the likeliest to continue

    def _returning_cache(
        self, chunks: Iterator[Chunk | Prefilling], cache: KVCache
    ) -> Generator[Chunk | Prefilling, None, None]:
        try:
            yield from chunks
        finally:
            self._return_cache(cache)

    # --- adapters -------------------------------------------------------------------------------

    def new_adapter(self, name: str, shape: AdapterShape) -> Adapter:
        """A fresh adapter (it changes nothing until it learns), held under `name` and made active.
        shape: (rank, alpha, targets, layers); rank, alpha and targets: LoRAConfig's defaults when None;
        layers: the decoder layers it adapts (negative counts from the top; None: all)."""
        rank, alpha, targets, layers = shape
        given: dict[str, Any] = {"rank": rank, "alpha": alpha, "targets": None if targets is None else tuple(targets)}
        config = LoRAConfig(**{k: v for k, v in given.items() if v is not None}, layers=_layers(layers))
        return self.adapters.create(name, config)

    def mix_adapters(self, name: str, experts: object, **router: Any) -> Mixture:
        """An X-LoRA mixture of held adapters (copies of them as they are now) with a new router that
        starts out giving every expert the same weight (RouterConfig's fields: top_k, depth, size,
        layerwise, temperature, global_scaling_weight); held under `name` and made active."""
        return self.adapters.mix(name, experts, RouterConfig(**router))

    # --- learning -------------------------------------------------------------------------------

    def set_calibration(self, ids: Sequence[int], turns: Sequence[Sequence[int]] = ()) -> int:
        """The calibration text's token ids and the calibration chat's turns (each in the model's
        template): what learning keeps its adapters' inputs away from (projection.calibration_ids)."""
        ids = self.learning.calibration_ids = calibration_ids(list(ids), [list(turn) for turn in turns])
        return len(ids)

    def lesson(
        self, prompt_ids: list[int], completion_ids: list[int], reward: float, adapter: str, options: dict
    ) -> Lesson | RouteLesson:
        """A lesson on adapter `adapter` (made with the default config if none is held; an X-LoRA
        mixture's lesson teaches its router). Bad options are refused before an adapter is made."""
        AdaptOptions(**options)
        with self.engine.lock:
            held = self.adapters.learner(adapter)
            cache, learning = self.idle_cache, self.learning
            return lesson_for(self.engine, held, prompt_ids, completion_ids, reward, options, cache, learning)

    def adapt(
        self, prompt_ids: list[int], completion_ids: list[int], reward: float, adapter: str, options: dict
    ) -> AdaptReport:
        """A whole lesson now, in the caller; its report."""
        lesson = self.lesson(prompt_ids, completion_ids, reward, adapter, options)
        with self.engine.lock:  # no generation step in between may wrap the weights with another adapter
            lesson.run()
        assert lesson.report is not None  # (run without a budget ends when the lesson is done)
        return lesson.report

    def feedback(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        reward: float,
        adapter: str,
        options: dict,
        budget_ms: float | None = None,
    ) -> Lesson | RouteLesson:
        """A lesson whose first step is taken now (the instant loop; with `budget_ms`, as much of it as
        fits: `first_step` takes the rest), the other steps and the consolidation by `learn` calls. A
        fresh adapter's projection is made in idle time too."""
        lesson = self.lesson(prompt_ids, completion_ids, reward, adapter, options)
        lesson.defer_projection = True
        self.learner.add(adapter, lesson)
        self.learner.first_step(lesson, budget_ms)
        return lesson

    def first_step(self, lesson: Lesson | RouteLesson, budget_ms: float | None = None) -> bool:
        """More of `lesson`'s first step (unless it left the loop); True once it is applied."""
        if lesson.ended is not None or lesson.done:  # (no longer in the loop's queue)
            return lesson.applied
        return self.learner.first_step(lesson, budget_ms)

    def learn(self, budget_ms: float | None = 100.0) -> LearningStatus:
        """Units of work of the waiting lessons for about `budget_ms` (at least one; None: until all are
        done)."""
        return self.learner.run(budget_ms)

    def cancel_learning(self, lesson: Lesson | RouteLesson | None = None) -> LearningStatus:
        """Drop `lesson` (None: every waiting lesson); what their steps taught so far stays."""
        return self.learner.cancel(lesson)

    def prepare_learning(self) -> bool:
        """Have the default adapter's projection made in idle time (`learn`), so that its first lesson
        starts projected; whether there is work to do."""
        layers = LoRAConfig().layer_indexes(len(self.engine.weights.layers))
        return self.learner.prepare(module_names(self.engine.weights, DEFAULT_TARGETS, layers))


def _layers(layers: Sequence[int] | str | None) -> tuple[int, ...] | str | None:
    return layers if layers is None or isinstance(layers, str) else tuple(layers)
