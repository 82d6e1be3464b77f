"""Continuous batching: one loop steps every live sequence together.

Each `Scheduler.step`:
1. drops cancelled sequences (their blocks go back at once) and admits waiting requests, oldest first,
   while fewer than `max_concurrent` run and the KV blocks they may need (prompt + max_tokens) are
   free; a request waits otherwise, and one that could never fit is refused when it is submitted;
2. gathers one row per decoding sequence (its last token) and a chunk of the prompt of sequences still
   reading theirs (at most `prefill_tokens` positions per step in all, so running streams keep flowing
   while a long prompt is read);
3. runs them through the model as one batch (forward.hidden_batch: one matrix product per projection
   for all rows), each sequence attending over its own paged KV blocks;
4. chooses each sequence's next token with its own `Decoder` (sampler, constraint, log-probabilities:
   the same code a solo generation uses) and hands the `Step` to the request's callback; finished
   sequences leave and free their blocks.

Prompts that start alike share KV blocks (blocks.BlockPool): a system prompt common to many requests is
computed once. With the engine's KVOptions `hot_tokens` and `cold`, blocks older than each sequence's
newest `hot_tokens` positions are kept as int8/int4 codes (the byte budget and attention sinks of the
solo cache do not apply: admission reserves every block a request may need). A sequence decodes the
same tokens batched as alone (tests/test_batching.py).

The scheduler is not thread-safe by itself beyond `submit`/`cancel`: one thread runs `step` (or
`run`), any thread may submit and cancel.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ContextFullError, InvalidArgumentError
from ..model.blocks import BlockPool
from ..model.paged import PagedSequence
from .engine import Engine
from .generate import Constraint, Decoder, GenerationOptions, Step

BLOCK_SIZE = 16  # positions per KV block
PREFILL_TOKENS = 64  # prompt positions per step, over every sequence still reading its prompt

OnStep = Callable[[Step | BaseException], object]  # (what it returns is ignored)


@dataclass(eq=False)
class Request:
    """A submitted generation. `on_step` receives each Step (from the scheduler's thread), or the
    exception that ended the request."""

    prompt: list[int]
    options: GenerationOptions
    eos: set[int]
    on_step: OnStep
    constraint: Constraint | None = None
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    finished: bool = False


@dataclass(eq=False)
class Running:
    request: Request
    cache: PagedSequence
    decoder: Decoder
    computed: int  # prompt positions whose keys/values are in the cache
    cached: int  # of those, positions shared from other sequences' blocks
    started: float  # when the prompt's first chunk went in


@dataclass
class Metrics:
    requests: int = 0  # submitted
    finished: int = 0
    cancelled: int = 0
    refused: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    last_batch_rows: int = 0  # rows of the latest forward (decode tokens + prompt positions)
    last_batch_sequences: int = 0


class Scheduler:
    """Continuous batching over `engine`: at most `max_concurrent` sequences of at most `max_context`
    positions each, their keys and values in `blocks` blocks of `block_size` positions (default: enough
    for every sequence to reach max_context)."""

    def __init__(
        self,
        engine: Engine,
        max_concurrent: int = 8,
        max_context: int | None = None,
        blocks: int | None = None,
        block_size: int = BLOCK_SIZE,
        prefill_tokens: int = PREFILL_TOKENS,
    ) -> None:
        for name, value in (("max_concurrent", max_concurrent), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        self.engine = engine
        self.max_concurrent = max_concurrent
        self.max_context = engine.context_length if max_context is None else max_context
        if not isinstance(self.max_context, int) or not 1 <= self.max_context <= engine.config.max_position_embeddings:
            raise InvalidArgumentError(
                f"max_context must be an integer in [1, {engine.config.max_position_embeddings}], got {max_context!r}"
            )
        per_sequence = -(-self.max_context // block_size)
        kv = engine.kv  # hot_tokens and cold: blocks older than the newest hot_tokens positions are quantized
        self.hot_tokens = kv.hot_tokens
        cold = kv.cold if kv.hot_tokens is not None else None
        self.pool = BlockPool(engine.config, blocks or max_concurrent * per_sequence, block_size, cold)
        self.prefill_tokens = max(1, prefill_tokens)
        self.waiting: deque[Request] = deque()
        self.running: list[Running] = []
        self.metrics = Metrics()
        self.changed = threading.Condition()  # notified on submit and cancel
        self.identity = engine.weights_identity()
        self._stop = False

    # --- any thread -----------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: Sequence[int],
        options: GenerationOptions,
        on_step: OnStep,
        eos_ids: Iterable[int] = (),
        constraint: Constraint | None = None,
    ) -> Request:
        """Queue a generation; its Steps go to `on_step`. Raises at once for a prompt that can never run."""
        prompt = [int(t) for t in prompt_ids]
        self.check(prompt)
        eos = set() if options.ignore_eos else set(eos_ids)
        request = Request(prompt, options, eos, on_step, constraint)
        with self.changed:
            self.waiting.append(request)
            self.metrics.requests += 1
            self.changed.notify()
        return request

    def check(self, prompt: list[int]) -> None:
        """Refuse a prompt that can never run: empty, with ids outside the vocabulary, or too long."""
        if not prompt:
            raise InvalidArgumentError("the prompt is empty: give at least one token")
        self.engine.check_ids(prompt)
        if len(prompt) >= self.max_context:
            self.metrics.refused += 1
            raise ContextFullError(
                f"the prompt has {len(prompt)} tokens but the context window is {self.max_context} "
                "(room is needed for at least one generated token)"
            )

    def cancel(self, request: Request) -> None:
        """Stop a request (a client went away): its blocks are freed before the next step."""
        with self.changed:
            request.cancelled = True
            self.changed.notify()

    def stats(self) -> dict:
        pool = self.pool
        return {
            "waiting": len(self.waiting),
            "running": len(self.running),
            "kv_blocks_total": pool.count,
            "kv_blocks_used": pool.in_use,
            "kv_blocks_reserved": pool.reserved,
            "kv_blocks_cold": pool.cold_blocks,
            "kv_hot_slots": pool.hot_slots,
            "kv_block_size": pool.size,
            **vars(self.metrics),
        }

    # --- the scheduler's thread -----------------------------------------------------------------

    def run(self) -> None:
        """Step while there is work, sleep while there is none, until `close`."""
        while True:
            with self.changed:
                while not self._stop and not self.waiting and not self.running:
                    self.changed.wait()
                if self._stop:
                    break
            self.step()
        for request in [*self.waiting, *(r.request for r in self.running)]:
            self._fail(request, InvalidArgumentError("the server is shutting down"))

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="ruvllm-scheduler", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        with self.changed:
            self._stop = True
            self.changed.notify()

    def step(self) -> int:
        """One batched forward over every live sequence; returns the tokens it generated."""
        self._admit()
        entries, sampled = self._gather()
        if not entries:
            return 0
        try:
            logits = self.engine.forward_batch(
                entries, [r is not None for r in sampled], weights=self.identity
            )  # (R, V)
        except Exception as error:  # a failed forward ends the sequences in it, never the loop
            for running in list(self.running):
                self._finish(running, error)
            return 0
        self.metrics.steps += 1
        self.metrics.last_batch_rows = sum(len(tokens) for tokens, _, _ in entries)
        self.metrics.last_batch_sequences = len(entries)
        now, made = time.perf_counter(), 0
        for row, running in zip(logits, [r for r in sampled if r is not None], strict=True):
            first = None
            if running.decoder.count == 0:
                first = {"prefill_ms": (now - running.started) * 1000, "cached_tokens": running.cached}
            try:
                step = running.decoder.choose(row, first)
            except Exception as error:
                self._finish(running, error)
                continue
            made += 1
            self.metrics.generated_tokens += 1
            if not self._deliver(running.request, step):
                self._finish(running, cancelled=True)
            elif step.finish_reason is not None:
                self._finish(running)
        return made

    def _admit(self) -> None:
        with self.changed:
            for running in [r for r in self.running if r.request.cancelled]:
                self._finish(running, cancelled=True)
            for request in [r for r in self.waiting if r.cancelled]:
                self.waiting.remove(request)
                request.finished = True
                self.metrics.cancelled += 1
            identity = self.engine.weights_identity()
            if identity != self.identity:  # other weights (an adapter): no cached prefix is valid any more
                self.pool.clear_registry()
                self.identity = identity
            while self.waiting and len(self.running) < self.max_concurrent:
                if not self._start(self.waiting[0]):
                    break  # first come, first served: later requests wait behind it
                self.waiting.popleft()

    def _start(self, request: Request) -> bool:
        pool, prompt = self.pool, request.prompt
        root = ("weights", self.identity)
        shared = pool.find_prefix(prompt, root)
        positions = min(len(prompt) + request.options.max_tokens, self.max_context)
        fresh = -(-positions // pool.size) - len(shared)
        needed = fresh + pool.prefix_cost(shared)
        if needed > pool.count:
            request.finished = True
            self.metrics.refused += 1
            self._deliver(request, ContextFullError(f"the request needs {needed} KV blocks; there are {pool.count}"))
            return True  # leaves the queue
        if not pool.reserve(needed):
            return False
        cache = PagedSequence(pool, self.engine.config, self.max_context, fresh, self.hot_tokens)
        cached = cache.share_prefix(prompt, shared, root)
        decoder = Decoder(prompt, request.options, request.eos, self.max_context, request.constraint)
        self.running.append(Running(request, cache, decoder, cached, cached, time.perf_counter()))
        self.metrics.prompt_tokens += len(prompt)
        self.metrics.cached_prompt_tokens += cached
        return True

    def _gather(self) -> tuple[list[tuple[np.ndarray, int, PagedSequence]], list[Running | None]]:
        """(tokens, start, cache) per sequence in this step, and for each the sequence whose next token
        its last row gives (None while the prompt is still being read)."""
        entries, sampled, budget = [], [], self.prefill_tokens
        for running in self.running:
            prompt = running.request.prompt
            if running.computed < len(prompt):
                count = min(len(prompt) - running.computed, budget)
                if count == 0:
                    continue  # this step's prompt budget went to sequences that came first
                tokens, start = prompt[running.computed : running.computed + count], running.computed
                budget -= count
            else:
                tokens, start = [running.decoder.history[-1]], len(running.decoder.history) - 1
            running.cache.reserve(len(tokens))
            entries.append((np.asarray(tokens, dtype=np.int64), start, running.cache))
            if running.computed < len(prompt):
                running.computed += len(tokens)
            sampled.append(running if running.computed == len(prompt) else None)
        return entries, sampled

    def _finish(self, running: Running, error: BaseException | None = None, cancelled: bool = False) -> None:
        """End a sequence: run to its end, failed (`error`, handed to its request), or `cancelled`
        (counted as that alone, not as finished too)."""
        running.cache.release()
        self.running.remove(running)
        running.request.finished = True
        if cancelled:
            self.metrics.cancelled += 1
        elif error is None:
            self.metrics.finished += 1
        else:
            self._deliver(running.request, error)

    def _fail(self, request: Request, error: BaseException) -> None:
        request.finished = True
        self._deliver(request, error)

    @staticmethod
    def _deliver(request: Request, item: Step | BaseException) -> bool:
        """Hand `item` to the request's callback; False if the callback failed (its receiver is gone: an
        event loop that closed), which ends the request, never the scheduler."""
        try:
            request.on_step(item)
        except Exception:  # whatever the receiver raised, the other sequences go on
            request.cancelled = True
            return False
        return True
