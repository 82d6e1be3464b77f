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

__version__ = "0.1.0"

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
