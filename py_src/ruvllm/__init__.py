"""ruvllm: a small language model engine in pure NumPy, for CPython and Pyodide."""

from .api import Model, load
from .errors import (
    ContextFullError,
    DownloadError,
    InferenceError,
    InvalidArgumentError,
    LoadError,
    RuvLLMError,
)
from .generate import Chunk, GenerationOptions, Stats
from .sampling import SamplingOptions

__version__ = "3.0.0"  # as pyproject.toml and npm/package.json (tests/test_versions.py)

__all__ = [
    "Chunk",
    "ContextFullError",
    "DownloadError",
    "GenerationOptions",
    "InferenceError",
    "InvalidArgumentError",
    "LoadError",
    "Model",
    "RuvLLMError",
    "SamplingOptions",
    "Stats",
    "load",
]
