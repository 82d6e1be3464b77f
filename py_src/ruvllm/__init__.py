"""ruvllm: a small language model engine in pure NumPy, for CPython and Pyodide.

The package is built in layers; a module imports only from its own layer and the ones below it
(tests/test_layers.py checks it):

    errors      the error types every layer raises
    files/      safetensors, GGUF and JSON files, storage formats, a model folder's tensors, hub downloads
    quant/      compute forms of matrices and their products, the KV cache's int8/int4 codes
    model/      config, weights, RoPE, KV caches (one interface: one sequence's, the paged one of
                batching), the forward
    runtime/    engine, memory plan, runtime quantization, token generation, sampling, BLAS threads,
                continuous batching, JSON-schema constraints
    text/ | learning/ | convert/
                three branches, none imports another: tokenizer and chat templates and the text layer of
                generation | MicroLoRA adapters and their backward pass | offline conversion of HF
                folders and GGUF files
    tools/      perplexity, benchmarks, lessons from a feedback file, adapters merged into weights
    session     what every front end shares: an engine, its adapters, learning, the cache it lends
    entry points: api (Python API), completions (OpenAI bodies and answers), server (ruvllm serve),
                bridge (the Pyodide worker's), host (the WebAssembly kernels in any Pyodide), cli/ (the
                command, a module per command), __main__

Adapters reach the engine as what wraps its weights (`Engine.attach`), so the runtime never imports
learning.
"""

from .api import Model, load, load_async
from .errors import (
    ContextFullError,
    DownloadError,
    InferenceError,
    InvalidArgumentError,
    LoadError,
    RuvLLMError,
)
from .runtime.generate import GenerationOptions
from .runtime.sampling import SamplingOptions
from .text.stream import Chunk, Stats

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
    "load_async",
]
