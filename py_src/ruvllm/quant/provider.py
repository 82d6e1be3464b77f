"""Kernel providers: a faster home for the matrix products of matrices.py, where the runtime has one.

NumPy multiplies through a BLAS on CPython; inside Pyodide it has neither a BLAS nor SIMD. A kernel
provider fills that gap: given a matrix, it returns the function that computes `x @ W.T` for it (or
None to leave that matrix to NumPy). The NumPy kernels stay the reference, the fallback, and what
CPython runs by default. The core never knows where a provider comes from: in Pyodide, host.py (or the
npm worker, through the bridge) builds the WebAssembly one (wasm.py) and passes it in with the load
options; on CPython, api.py builds the same kernels over wasmtime (native.py) when asked for by name.

    kernels="auto"   the provider the runtime offers, if any; NumPy otherwise
    kernels="wasm"   the WebAssembly SIMD provider; an error where the runtime has none
    kernels="numpy"  NumPy only
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from ..errors import InvalidArgumentError

KERNEL_CHOICES = ("auto", "wasm", "numpy")
ARITHMETIC = ("exact", "fast")
DEFAULT_ARITHMETIC = "fast"  # docs/kernels.md: 1.6x the decode speed of exact, +0.002% perplexity


class KernelProvider(Protocol):
    name: str  # as `kernels` names it: "wasm"
    arithmetic: str  # "exact" or "fast" (see wasm.py)

    def prepare(self, matrix: object) -> Callable[[np.ndarray], np.ndarray] | None:
        """The product x (T, K) -> x @ W.T (T, N) for this matrix, or None to leave it to NumPy."""
        ...

    # Optional: take_parts(matrix, product), called after prepare by `use_provider` when the provider
    # keeps the parts it prepared from (the kernel thread pool, pool.py): it swaps the matrix's arrays for
    # stand-ins that read the provider's copy (pool.py RemoteArray), so the weights are held once, in the
    # provider's memory.
    # Optional: transposed(matrix), for learning's backward (dx = dy @ W): a function add(dy, y, n0, n1)
    # that does y (T, K) += dy[:, n0:n1] @ W[n0:n1] (dy float32 (T, N), contiguous) reading the matrix as
    # the provider keeps it, or None (then NumPy's expanded rows go through `prepare`'s product).
    # Optional: `attention`, an AttentionProducts for attention's two products over the float32 KV cache
    # (None: NumPy's); the engine uses it with the fast arithmetic (their sums come in another order).


class AttentionProducts(Protocol):
    """Attention's products over a sequence's float32 keys and values (model/kv.py DenseSegment), for
    each key/value head: Dimension letters K key/value heads, Q query rows, S positions, E head size."""

    def scores(self, q: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """q (K, Q, E), keys (K, S, E) -> q @ keys^T (K, Q, S)."""
        ...

    def mix(self, probs: np.ndarray, values: np.ndarray) -> np.ndarray:
        """probs (K, Q, S), values (K, S, E) -> probs @ values (K, Q, E)."""
        ...


def check_arithmetic(arithmetic: str) -> str:
    """`arithmetic`, or the error naming the choices."""
    if arithmetic not in ARITHMETIC:
        raise InvalidArgumentError(f"arithmetic must be one of {', '.join(ARITHMETIC)}, got {arithmetic!r}")
    return arithmetic


def resolve_kernels(choice: str, offered: KernelProvider | None) -> KernelProvider | None:
    """The provider `choice` asks for, given the one the runtime offers (None: NumPy only)."""
    if choice not in KERNEL_CHOICES:
        raise InvalidArgumentError(f"kernels must be one of {', '.join(KERNEL_CHOICES)}, got {choice!r}")
    if choice == "numpy":
        return None
    if choice == "wasm" and offered is None:
        raise InvalidArgumentError(
            "kernels='wasm' needs the WebAssembly SIMD kernels (in Pyodide on a runtime with SIMD128, or on "
            "CPython through wasmtime: ruvllm.load(..., kernels='wasm')), and none were offered to this load: "
            "use kernels='auto' or 'numpy'"
        )
    return offered
