"""BLAS threads, chosen per forward call: one for decoding, the available cores for prompt processing.

NumPy on CPython multiplies through OpenBLAS, which by default runs every product on as many threads as
the machine has cores. Its threads spin while they wait for each other, so when another program keeps
a core busy, every product stalls. Measured on a 2-core machine (SmolLM2-135M, f32, a 128-token
prefill then greedy decoding, medians of 3, the same run; benchmarks/threads_bench.py, and
docs/performance.md):

    other busy processes   threads   prefill     decode
    none                   1         304 ms      46 tok/s
    none                   2         171 ms      56 tok/s   (q8: 27 -> 26 tok/s)
    one                    1         315 ms      43 tok/s
    one                    2         569 ms      18 tok/s
    two                    1         511 ms      30 tok/s
    two                    2         828 ms      15 tok/s

Decoding multiplies one row at a time and is bound by memory bandwidth: extra threads gain little even
on a quiet machine and lose most of the speed on a busy one, so it gets one thread. Prompt processing
multiplies many rows and gains from every free core on a quiet machine, and loses several times over on
a busy one (a shared machine: TTFT 14.8 s with every core, 1.4 s with one). So by default a prompt's
thread count is chosen by measurement, as it runs (`Adaptive`): the first prompt-sized call of a size
runs on one thread, the next on every core, and from then on the faster of the two per row, measured
again now and then (after 4 calls, then 8, 16 ... up to 256 while the choice holds) so the choice
follows the machine's load. At worst a prompt of a new size runs at one thread's speed, and one call in
`interval` at the slower count. `threads` given by the user is used as it is, every time.

Sums taken on one or on two BLAS threads differ in their last bits (OpenBLAS splits the work by the
thread count), so with the default, which follows the load, logits may differ in the last bits between
runs; `threads` fixed (1 for instance) makes a run reproducible bit for bit. The library's setting is
restored after each call, so other NumPy code in the process keeps its own.

Without threadpoolctl, or without a BLAS (Pyodide), nothing is set.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import InvalidArgumentError

DECODE_ROWS = 4  # a forward call over at most this many tokens is decoding (matrices.py's threshold too)


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@functools.cache
def _blas_libraries() -> tuple:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return ()
    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


class BlasThreads:
    """The thread policy of one engine. `threads`: the count for prompt-sized calls, fixed; None: chosen
    between one and the CPUs available by measurement (Adaptive)."""

    def __init__(self, threads: int | None = None, clock=time.perf_counter) -> None:
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise InvalidArgumentError(f"threads must be an integer >= 1, got {threads!r}")
        self.prefill = threads or available_cpus()
        self.adaptive = Adaptive(self.prefill, clock) if threads is None and self.prefill > 1 else None
        self._depth = threading.local()  # calls inside a call keep its count and are not measured apart

    def for_rows(self, rows: int) -> int:
        if rows <= DECODE_ROWS:
            return 1
        return self.prefill if self.adaptive is None else self.adaptive.choose(rows)

    @contextmanager
    def limit(self, rows: int) -> Iterator[None]:
        """Run the products of a forward call over `rows` tokens with the threads this policy gives them."""
        depth = getattr(self._depth, "value", 0)
        libraries = _blas_libraries()
        if depth or not libraries:
            self._depth.value = depth + 1
            try:
                yield
            finally:
                self._depth.value = depth
            return
        count = self.for_rows(rows)
        before = [lib.num_threads for lib in libraries]
        for lib in libraries:
            lib.set_num_threads(count)
        self._depth.value = 1
        started = self.adaptive.clock() if self.adaptive is not None else 0.0
        try:
            yield
        finally:
            self._depth.value = 0
            if self.adaptive is not None and rows > DECODE_ROWS:
                self.adaptive.record(rows, count, self.adaptive.clock() - started)
            for lib, n in zip(libraries, before, strict=True):
                lib.set_num_threads(n)


class Adaptive:
    """One thread or `most` for prompt-sized calls, whichever measured faster per row for calls of a size
    (sizes grouped by powers of two): each count is tried once, then the faster kept, the slower tried
    again after `interval` calls (4, doubling to 256 while the choice holds, 4 again when it changes)."""

    FIRST_INTERVAL, MOST_INTERVAL = 4, 256

    def __init__(self, most: int, clock=time.perf_counter) -> None:
        self.most, self.clock = most, clock
        self.lock = threading.Lock()
        self.sizes: dict[int, _Size] = {}

    def choose(self, rows: int) -> int:
        with self.lock:
            size = self.sizes.setdefault(rows.bit_length(), _Size())
            for count in (1, self.most):  # each count measured once, one thread first (the safe one)
                if count not in size.per_row:
                    return count
            best = size.best()
            if size.calls >= size.next_probe:
                return self.most if best == 1 else 1
            return best

    def record(self, rows: int, count: int, seconds: float) -> None:
        with self.lock:
            size = self.sizes.setdefault(rows.bit_length(), _Size())
            before = size.best() if len(size.per_row) == 2 else None
            probe = before is not None and count != before
            old = size.per_row.get(count)
            per_row = seconds / rows
            size.per_row[count] = per_row if old is None or probe else 0.5 * (old + per_row)
            size.calls += 1
            if probe:  # the other count, measured again: the choice holds (longer until the next) or changes
                held = size.best() == before
                size.interval = min(2 * size.interval, self.MOST_INTERVAL) if held else self.FIRST_INTERVAL
                size.next_probe = size.calls + size.interval
            elif before is None and len(size.per_row) == 2:
                size.next_probe = size.calls + size.interval


class _Size:
    """What Adaptive knows of calls of one size: seconds per row by thread count, calls so far, when the
    other count is tried next."""

    def __init__(self) -> None:
        self.per_row: dict[int, float] = {}
        self.calls = 0
        self.interval = Adaptive.FIRST_INTERVAL
        self.next_probe = 0

    def best(self) -> int:
        return min(self.per_row, key=lambda threads: self.per_row[threads])
