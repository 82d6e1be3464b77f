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
multiplies many rows and gains from every free core: it gets the cores available to the process, or
`threads` when the user caps it (`--threads 1` on a busy machine). The library's setting is restored
after each call, so other NumPy code in the process keeps its own.

Without threadpoolctl, or without a BLAS (Pyodide), nothing is set.
"""

from __future__ import annotations

import functools
import os
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
    """The thread policy of one engine. `threads`: the most a product may use (default: the CPUs
    available to the process)."""

    def __init__(self, threads: int | None = None) -> None:
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise InvalidArgumentError(f"threads must be an integer >= 1, got {threads!r}")
        self.prefill = threads or available_cpus()

    def for_rows(self, rows: int) -> int:
        return 1 if rows <= DECODE_ROWS else self.prefill

    @contextmanager
    def limit(self, rows: int) -> Iterator[None]:
        """Run the products of a forward call over `rows` tokens with the threads this policy gives them."""
        libraries = _blas_libraries()
        before = [lib.num_threads for lib in libraries]
        for lib in libraries:
            lib.set_num_threads(self.for_rows(rows))
        try:
            yield
        finally:
            for lib, count in zip(libraries, before, strict=True):
                lib.set_num_threads(count)
