"""The decode plan's WebGPU executor (npm/src/worker/gpu/executor.js) from CPython: a Node process
(npm/test/support/gpu-host.js, Dawn through the `webgpu` package) that CPython talks to over pipes.

GpuHost offers the calls quant/pool.py's PoolMemory makes of a kernel memory's API (region, free, fetch,
write, plan), with CPython's own addresses: the bytes they name are copied through the pipes. So the
decode plan runs on the GPU exactly as the npm package's worker runs it, and its tests need no Pyodide.
Without a GPU, Dawn runs on Chromium's SwiftShader (its Vulkan driver, through VK_ICD_FILENAMES).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ruvllm.quant.pool import PoolMemory

from conftest import ROOT

HOST = ROOT / "npm" / "test" / "support" / "gpu-host.js"
SWIFTSHADER = Path("/usr/lib/chromium/vk_swiftshader_icd.json")


def gpu_environment(broken: str | None = None, max_binding: int | None = None) -> dict[str, str]:
    """The host's environment: a software Vulkan (SwiftShader) unless one is named already; a shader
    broken on purpose; a largest binding below the device's (matrices split in parts)."""
    env = dict(os.environ)
    if "VK_ICD_FILENAMES" not in env and SWIFTSHADER.exists():
        env["VK_ICD_FILENAMES"] = str(SWIFTSHADER)
    env.pop("RUVLLM_GPU_BREAK", None)
    env.pop("RUVLLM_GPU_MAX_BINDING", None)
    if broken:
        env["RUVLLM_GPU_BREAK"] = broken
    if max_binding:
        env["RUVLLM_GPU_MAX_BINDING"] = str(max_binding)
    return env


def gpu_missing() -> str | None:
    """Why the host cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (ROOT / "npm" / "node_modules" / "webgpu").exists():
        return "npm/node_modules has no 'webgpu' package (cd npm && npm ci)"
    return None


class GpuHost:
    """The Node process and its calls (PoolMemory's api)."""

    threads = 1

    def __init__(self, broken: str | None = None, max_binding: int | None = None) -> None:
        self.process = subprocess.Popen(
            ["node", str(HOST)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=gpu_environment(broken, max_binding),
            cwd=ROOT / "npm",
        )
        info = self.call({"op": "info"})[0]
        self.adapter, self.reason = info["adapter"], info["reason"]
        self.last: dict = {}  # what the last plan call did (dispatches, submits, bytes read back)
        self.written = 0  # bytes written to the GPU by `write` (a plan's inputs not counted)

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(30)

    def call(self, request: dict, payload: bytes = b"") -> tuple[dict, bytes]:
        head = json.dumps(request).encode()
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(struct.pack("<I", len(head)) + head + struct.pack("<I", len(payload)) + payload)
        self.process.stdin.flush()
        out = self.process.stdout
        (n,) = struct.unpack("<I", self._read(out, 4))
        answer = json.loads(self._read(out, n))
        (size,) = struct.unpack("<I", self._read(out, 4))
        data = self._read(out, size)
        if "error" in answer:
            raise RuntimeError(f"the GPU host: {answer['error']}")
        return answer, data

    @staticmethod
    def _read(stream: Any, n: int) -> bytes:
        data = stream.read(n)
        if len(data) != n:
            raise RuntimeError("the GPU host ended")
        return data

    # ---- PoolMemory's api ----

    def region(self, nbytes: int, row: int = 0) -> int:
        return int(self.call({"op": "region", "bytes": int(nbytes), "row": int(row)})[0]["at"])

    def free(self, at: int) -> None:
        if self.process.poll() is None:
            self.call({"op": "free", "at": int(at)})

    def fetch(self, at: int, nbytes: int, to: int) -> None:
        _, data = self.call({"op": "fetch", "at": int(at), "bytes": int(nbytes)})
        ctypes.memmove(to, data, nbytes)

    def write(self, source: int, nbytes: int, at: int) -> None:
        self.written += nbytes
        self.call({"op": "write", "at": int(at)}, ctypes.string_at(source, nbytes))

    def plan(self, program: int, state: int, T: int, copies: int, count: int, pick: int = 0) -> None:
        rows = np.frombuffer(ctypes.string_at(copies, 32 * count), np.uint64).reshape(count, 4)
        inputs = [(int(h), int(at), int(n)) for d, h, at, n in rows if d == 0]
        outputs = [(int(h), int(at), int(n)) for d, h, at, n in rows if d == 1]
        payload = b"".join(ctypes.string_at(h, n) for h, _, n in inputs)
        request = {
            "op": "plan",
            "program": int(program),
            "state": int(state),
            "T": int(T),
            "inputs": [{"at": at, "bytes": n} for _, at, n in inputs],
            "outputs": [{"at": at, "bytes": n} for _, at, n in outputs],
            "pick": int(pick),
        }
        answer, data = self.call(request, payload)
        self.last = answer["last"]
        offset = 0
        for h, _, n in outputs:
            ctypes.memmove(h, data[offset : offset + n], n)
            offset += n


class HostMemory(PoolMemory):
    """PoolMemory over the GPU host: CPython's addresses are 64-bit, so its table of copies is too."""

    TABLE_DTYPE = np.uint64

    def __init__(self, host: GpuHost, half_scales: bool = True, picks: bool = True) -> None:
        super().__init__(SimpleNamespace(api=host, threads=1))  # type: ignore[arg-type]
        self.host = host
        self.half_scales, self.picks = half_scales, picks  # (as runtime/device.gpu_memory sets them)
