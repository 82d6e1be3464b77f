"""Errors that cross the public boundary.

Every error a user can cause is a `RuvLLMError` with a `type` from a small fixed set. The set is the
same one the JavaScript package exposes, so an error raised in Python inside Pyodide keeps its type all
the way to the caller.
"""

from __future__ import annotations

import sys


class RuvLLMError(Exception):
    """Base class. `type` is one of: download, load, inference, context_full, invalid_argument."""

    type = "inference"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LoadError(RuvLLMError):
    """A model folder, weight file, config or tokenizer that cannot be used."""

    type = "load"


class DownloadError(RuvLLMError):
    """A file that could not be fetched, or arrived incomplete."""

    type = "download"


class InvalidArgumentError(RuvLLMError, ValueError):
    """An option or argument outside its allowed range."""

    type = "invalid_argument"


class ContextFullError(RuvLLMError):
    """The prompt (plus what must be generated) does not fit the context window."""

    type = "context_full"


class InferenceError(RuvLLMError):
    """Something went wrong while running the model."""

    type = "inference"


def install_advice(pip: str, micropip: str) -> str:
    """How to install a missing package where this runs: micropip inside Pyodide (no pip there), pip elsewhere."""
    if sys.platform == "emscripten":
        return f"in Pyodide: import micropip; await micropip.install({micropip!r})"
    return f"pip install {pip}"
