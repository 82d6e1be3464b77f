"""Our WebAssembly kernels (kernels/kernels.c) on CPython for the tests: ruvllm.quant.native's NativeHost
(a wasmtime instance whose memory holds NumPy arrays), over the builds ./build.sh kernels writes to
npm/wasm/ (the package carries copies of them once ./build.sh wheel ran)."""

from __future__ import annotations

from pathlib import Path

from ruvllm.quant.native import BUILDS, INITIAL_PAGES, PAGE
from ruvllm.quant.native import NativeHost as KernelHost

from conftest import ROOT

__all__ = ["INITIAL_PAGES", "PAGE", "KernelHost", "kernel_wasm_paths"]


def kernel_wasm_paths() -> list[Path]:
    """The builds of the kernels that exist (./build.sh kernels makes them): plain first, then relaxed."""
    return [path for name in BUILDS if (path := ROOT / "npm" / "wasm" / name).exists()]
