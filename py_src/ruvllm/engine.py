"""The engine: a loaded model that maps token ids to logits. NumPy only, no text, no I/O beyond reading
the weight files it is given; the Pyodide worker and the CPython API both drive it through token ids.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np

from .cache import KVCache, KVOptions
from .config import ModelConfig
from .errors import InvalidArgumentError, LoadError
from .model import forward
from .rope import inverse_frequencies
from .store import TensorStore
from .tensorfile import SafetensorsFile
from .weights import ComputeOptions, Weights, load_weights

DEFAULT_MAX_CONTEXT = 4096  # cache positions reserved at most by default (memory grows with it)


def default_kernel() -> str:
    """The matrix kernel for this runtime: NumPy in Pyodide (emscripten) has no BLAS, einsum wins there."""
    return "einsum" if sys.platform == "emscripten" else "blas"


class Engine:
    def __init__(
        self, config: ModelConfig, weights: Weights, context_length: int | None = None, kv: KVOptions | None = None
    ) -> None:
        limit = config.max_position_embeddings
        if context_length is None:
            context_length = min(limit, DEFAULT_MAX_CONTEXT)
        if not isinstance(context_length, int) or isinstance(context_length, bool) or not 1 <= context_length <= limit:
            raise InvalidArgumentError(f"context_length must be an integer in [1, {limit}], got {context_length!r}")
        self.config = config
        self.weights = weights
        self.context_length = context_length
        self.kv = kv or KVOptions()
        self.inv_freq = inverse_frequencies(config)  # (E/2,)

    @classmethod
    def from_store(
        cls,
        config: ModelConfig,
        store: TensorStore,
        context_length: int | None = None,
        compute: ComputeOptions | None = None,
        kv: KVOptions | None = None,
    ) -> Engine:
        weights = load_weights(config, store, compute or ComputeOptions(kernel=default_kernel()))
        return cls(config, weights, context_length, kv)

    def new_cache(self) -> KVCache:
        """An empty cache: at most `context_length` positions, or a byte budget (KVOptions)."""
        return KVCache(self.config, self.context_length, self.kv)

    def forward(
        self, tokens: list[int] | np.ndarray, start: int, cache: KVCache, last_only: bool = False
    ) -> np.ndarray:
        """Logits (T, V) for tokens at positions start.. (or (1, V) for the last one)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise InvalidArgumentError("tokens must be a non-empty 1-D sequence of ids")
        if tokens.min() < 0 or tokens.max() >= self.config.vocab_size:
            bad = int(tokens[(tokens < 0) | (tokens >= self.config.vocab_size)][0])
            raise InvalidArgumentError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        return forward(self.weights, self.config, self.inv_freq, tokens, start, cache, last_only)


def read_config(folder: str) -> ModelConfig:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise LoadError(f"{folder}: no config.json (is this a model folder?)") from None
    except json.JSONDecodeError as e:
        raise LoadError(f"{path}: not valid JSON ({e})") from None
    return ModelConfig.from_dict(raw, path)


def open_store(folder: str, header_only: bool = False) -> TensorStore:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise LoadError(f"{folder}: no .safetensors weight files")
    return TensorStore([SafetensorsFile.from_path(p, header_only) for p in files])


def load_engine(
    folder: str,
    context_length: int | None = None,
    compute: ComputeOptions | None = None,
    kv: KVOptions | None = None,
) -> Engine:
    if not os.path.isdir(folder):
        raise LoadError(f"{folder}: model folder not found")
    return Engine.from_store(read_config(folder), open_store(folder), context_length, compute, kv)
