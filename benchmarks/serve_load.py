"""Serving load benchmark: the same streaming chat load against `ruvllm serve` and llama-cpp-python's
OpenAI-compatible server, on the same GGUF file, in one run.

Each server is started once (its own process group, a free port), waited for until healthy, warmed up
with one request, then loaded at each concurrency level in turn: that many concurrent clients, each
sending streaming chat completions (its own short prompt, temperature 0, --max-tokens) one after the
other until it has sent --requests-per-client requests or --seconds have passed since the level began
(requests in flight at that moment are finished; after a further --grace seconds they are aborted).
Servers run one at a time, never side by side.

Per server and level: aggregate decode tokens/s (completion tokens received by all clients / the level's
wall time), TTFT p50/p95 (request sent -> first content chunk; includes queueing), inter-token latency
p50/p95 (between successive content chunks of one response), requests done, errors, and the server's
memory (resident set of its process tree sampled every 0.2 s during the level, and VmHWM, the kernel's
high-water mark since the server started). Completion tokens are the server's `usage.completion_tokens`
when it sends usage (`stream_options.include_usage`), else the number of content chunks (llama-cpp-python
ignores include_usage and sends one chunk per token). End-of-sequence cannot be ignored in llama.cpp's
server, so the tokens actually received are what counts.

Threads: llama.cpp gets `--n_threads T --n_threads_batch T`; ruvllm gets OPENBLAS_NUM_THREADS=T (and
OMP/MKL alike) and `--threads T`. `--threads 1,2` runs the whole load once per setting, reported apart.
llama-cpp-python's server runs with `--interrupt_requests false`: by default it ends a stream early
whenever another request is waiting, which would cut every response short under concurrent load; with
it off, requests are served one at a time, in full. If `ruvllm serve` has no --threads option, pass
--no-ruvllm-threads-flag (the environment still caps OpenBLAS).

The machine is shared: each row also gives the CPU cores kept busy during the level by the server, by
this load generator and by everything else (from /proc); a row where "other" is high was measured while
other programs competed for the cores. A server that fails to start within --startup-timeout, fails its
warm-up or dies is reported with the tail of its stderr; the other servers still run, and the exit status
is 1. Servers are stopped (SIGTERM, then SIGKILL to their process group) on every exit path.

    .venv/bin/pip install -r benchmarks/requirements.txt   # llama-cpp-python and its [server] deps
    .venv/bin/python benchmarks/serve_load.py [--servers ruvllm,llama] [--clients 1,4,16,32]
        [--requests-per-client 2] [--seconds 120] [--max-tokens 64] [--threads 1] [--compute F]
        [--ruvllm-model PATH] [--max-concurrent N] [--endpoint chat|completions] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import importlib.util
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / "build" / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
HOST = "127.0.0.1"
_TOPICS = """
    a lighthouse keeper; a lost robot; a dragon who hates fire; a haunted library; a time-travelling cat;
    the last tree on Mars; a baker in Paris; a submarine crew; a talking violin; a desert caravan;
    a chess prodigy; a forgotten moon base; a village of clockmakers; a whale who sings opera;
    a detective in Venice; a snowstorm in July; an old map; a garden on a rooftop; a shy ghost;
    a pirate who cannot swim; a glass city; a runaway balloon; an inventor's apprentice;
    a train that never stops; a fox and a crow; a mountain rescue; a painter who lost colour;
    the first day of school; a market under the sea; a broken compass; a storm chaser; a library of smells;
    a kite festival; a knight afraid of the dark; a museum at night; a letter from the future; a beekeeper;
    an island of mirrors; a tiny giant; a comet's tail
"""
TOPICS = tuple(" ".join(t.split()) for t in _TOPICS.split(";"))  # one per client (and request)
LLAMA_SERVER_DEPS = ("fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings", "yaml")


# ---------------------------------------------------------------------------------------------------------
# A minimal HTTP/1.1 client on asyncio streams (no dependency; timestamps taken as bytes arrive)


class HTTPError(Exception):
    pass


class ServerError(Exception):
    """A server that did not start, failed its warm-up, or died: its run is skipped, the others go on."""


async def _read(coro, timeout: float):
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        raise HTTPError(f"no data from the server for {timeout:g} s") from None


class Response:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> None:
        self.reader, self.writer, self.timeout = reader, writer, timeout
        self.status = 0
        self.headers: dict[str, str] = {}

    async def start(self) -> None:
        line = await _read(self.reader.readline(), self.timeout)
        parts = line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise HTTPError(f"bad status line {line!r}")
        self.status = int(parts[1])
        while True:
            line = await _read(self.reader.readline(), self.timeout)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()

    async def chunks(self):
        """The body, piece by piece as it arrives (chunked, Content-Length or until the connection closes)."""
        read, timeout = self.reader, self.timeout
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                line = await _read(read.readline(), timeout)
                if not line:
                    raise HTTPError("connection closed inside a chunked body")
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await _read(read.readline(), timeout)) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                data = await _read(read.readexactly(size), timeout)
                await _read(read.readexactly(2), timeout)
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await _read(read.read(min(left, 65536)), timeout)
                if not data:
                    raise HTTPError("connection closed before the end of the body")
                left -= len(data)
                yield data
        else:
            while data := await _read(read.read(65536), timeout):
                yield data

    async def body(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


@contextlib.asynccontextmanager
async def request(port: int, method: str, path: str, payload: dict | None = None, timeout: float = 300.0):
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
    body = json.dumps(payload).encode() if payload is not None else b""
    head = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "Connection: close", "Accept: */*"]
    if payload is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    response = Response(reader, writer, timeout)
    try:
        await writer.drain()
        await response.start()
        yield response
    finally:
        response.close()


async def get_status(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    async with request(port, "GET", path, timeout=timeout) as r:
        return r.status, await r.body()


async def sse_events(response: Response):
    """(arrival time, data) of each server-sent event."""
    buffer, data = b"", []
    async for piece in response.chunks():
        now = time.perf_counter()
        buffer += piece
        while (cut := buffer.find(b"\n")) >= 0:
            line, buffer = buffer[:cut].rstrip(b"\r"), buffer[cut + 1 :]
            if not line:
                if data:
                    yield now, b"\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            # comments (": ping"), event:, id: and retry: lines are ignored
    if data:
        yield time.perf_counter(), b"\n".join(data)


# ---------------------------------------------------------------------------------------------------------
# One streaming request


@dataclass
class Result:
    client: int
    index: int
    sent: float  # seconds since the level began
    done: float = 0.0
    ttft: float | None = None  # seconds, request sent -> first content chunk
    chunks: int = 0  # content chunks received
    usage_tokens: int | None = None  # usage.completion_tokens, when the server sent it
    finish_reason: str | None = None
    error: str | None = None
    aborted: bool = False
    gaps: list[float] = field(default_factory=list)  # seconds between successive content chunks

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks


def build_payload(args, model_id: str, prompt: str) -> tuple[str, dict]:
    common = {
        "model": model_id,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.endpoint == "completions":
        return "/v1/completions", {**common, "prompt": prompt}
    return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}]}


async def stream_one(args, port: int, model_id: str, prompt: str, result: Result, origin: float) -> None:
    path, payload = build_payload(args, model_id, prompt)
    started = time.perf_counter()
    result.sent = started - origin
    last = None
    finished = False
    try:
        async with request(port, "POST", path, payload, timeout=args.request_timeout) as response:
            if response.status != 200:
                text = (await response.body())[:300].decode("utf-8", "replace")
                raise HTTPError(f"HTTP {response.status}: {text}")
            async for at, data in sse_events(response):
                if data.strip() == b"[DONE]":
                    finished = True
                    break
                event = json.loads(data)
                if event.get("error"):
                    raise HTTPError(f"error event: {str(event['error'])[:300]}")
                if event.get("usage"):
                    result.usage_tokens = event["usage"].get("completion_tokens", result.usage_tokens)
                for choice in event.get("choices") or ():
                    text = (
                        choice.get("text")
                        if args.endpoint == "completions"
                        else (choice.get("delta") or {}).get("content")
                    )
                    if text:
                        result.chunks += 1
                        if last is None:
                            result.ttft = at - started
                        else:
                            result.gaps.append(at - last)
                        last = at
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
            if not finished and result.finish_reason is None:
                raise HTTPError("stream ended without [DONE] or a finish_reason")
    except asyncio.CancelledError:
        result.aborted = True
        raise
    except (HTTPError, OSError, ValueError, asyncio.IncompleteReadError) as e:
        result.error = f"{type(e).__name__}: {e}"[:400]
    finally:
        result.done = time.perf_counter() - origin


# ---------------------------------------------------------------------------------------------------------
# Server processes


LIVE: list[subprocess.Popen] = []


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 10 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, even if the leader is gone
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    if proc in LIVE:
        LIVE.remove(proc)


def stop_all() -> None:
    for proc in list(LIVE):
        stop(proc)


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty)"


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_kb(pid: int, key: str) -> int:
    return sum(status_kb(p, key) for p in process_tree(pid))


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy since boot (not idle, not waiting on I/O)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS


class CPUMeter:
    """Cores kept busy during a level: by the server's process tree, by this load generator, by the rest of
    the machine (other programs: noise)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.server = {p: process_cpu_s(p) for p in process_tree(pid)}
        self.client, self.machine = time.process_time(), machine_busy_s()

    def cores(self, wall: float) -> dict[str, float]:
        server = sum(process_cpu_s(p) - self.server.get(p, 0.0) for p in process_tree(self.pid))
        client = time.process_time() - self.client
        machine = machine_busy_s() - self.machine
        wall = max(wall, 1e-9)
        return {
            "server_cores": server / wall,
            "client_cores": client / wall,
            "other_cores": max(machine - server - client, 0.0) / wall,
        }


class RSSSampler:
    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.pid, self.every, self.peak_kb = pid, every, 0

    async def run(self) -> None:
        while True:
            self.peak_kb = max(self.peak_kb, tree_kb(self.pid, "VmRSS"))
            await asyncio.sleep(self.every)


@dataclass
class Server:
    name: str
    threads: int
    cmd: list[str]
    env: dict[str, str]
    port: int
    log_dir: Path
    proc: subprocess.Popen | None = None
    model_id: str = ""
    startup_s: float = 0.0

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"{self.name}-t{self.threads}.stderr.log"

    def start(self) -> None:
        out = open(self.log_dir / f"{self.name}-t{self.threads}.stdout.log", "wb")
        err = open(self.stderr_path, "wb")
        with out, err:
            self.proc = subprocess.Popen(
                self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=self.env, start_new_session=True
            )
        LIVE.append(self.proc)

    def fail(self, why: str) -> ServerError:
        return ServerError(
            f"error: {self.name} server {why}\n  command: {' '.join(self.cmd)}\n"
            f"  stderr ({self.stderr_path}), last lines:\n{tail(self.stderr_path)}"
        )

    async def wait_healthy(self, timeout: float) -> None:
        """/health 200; a server without /health (404, as llama-cpp-python's) is ready when /v1/models is 200."""
        began = time.perf_counter()
        while True:
            if self.proc.poll() is not None:
                raise self.fail(f"exited with code {self.proc.returncode} before becoming healthy")
            with contextlib.suppress(OSError, HTTPError, TimeoutError, ValueError):
                status, _ = await get_status(self.port, "/health")
                if status == 404:
                    status, _ = await get_status(self.port, "/v1/models")
                if status == 200:
                    status, body = await get_status(self.port, "/v1/models")
                    if status == 200:
                        models = json.loads(body).get("data") or []
                        self.model_id = models[0]["id"] if models else ""
                        self.startup_s = time.perf_counter() - began
                        return
            if time.perf_counter() - began > timeout:
                raise self.fail(f"did not become healthy within {timeout:g} s on port {self.port}")
            await asyncio.sleep(0.25)


def thread_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[key] = str(threads)
    return env


def make_server(name: str, threads: int, args, log_dir: Path) -> Server:
    port = free_port()
    if name == "llama":
        cmd = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(args.gguf), "--host", HOST, "--port", str(port),
            "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(args.n_ctx),
            "--interrupt_requests", "false", "--verbose", "false",
        ]  # fmt: skip
        return Server(name, threads, cmd, dict(os.environ), port, log_dir)
    exe = ROOT / ".venv" / "bin" / "ruvllm"
    if args.ruvllm_cmd:
        base = shlex.split(args.ruvllm_cmd)
    else:
        base = [str(exe)] if exe.exists() else [sys.executable, "-m", "ruvllm"]
    cmd = [
        *base, "serve", str(args.ruvllm_model or args.gguf), "--host", HOST, "--port", str(port),
        "--max-concurrent", str(args.max_concurrent or max(args.clients)),
    ]  # fmt: skip
    if args.ruvllm_threads_flag:
        cmd += ["--threads", str(threads)]
    if args.compute:
        cmd += ["--compute", args.compute]
    cmd += args.ruvllm_arg
    return Server(name, threads, cmd, thread_env(threads), port, log_dir)


# ---------------------------------------------------------------------------------------------------------
# Load


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    pos = (len(values) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (pos - low)


def prompt_for(endpoint: str, client: int, index: int, clients: int) -> str:
    """A different prompt per client (and per request). /v1/completions gets text to continue: a raw
    instruction without the chat template makes the instruct model stop at once."""
    return prompt_text(endpoint, TOPICS[(client + index * clients) % len(TOPICS)])


def prompt_text(endpoint: str, topic: str) -> str:
    if endpoint == "completions":
        return f"Here is a short story about {topic}.\n\nOnce upon a time,"
    return f"Write a short story about {topic}."


async def run_level(args, server: Server, clients: int) -> dict:
    results: list[Result] = []
    sampler = RSSSampler(server.proc.pid)
    sampling = asyncio.ensure_future(sampler.run())
    cpu = CPUMeter(server.proc.pid)
    origin = time.perf_counter()
    deadline = origin + args.seconds

    async def client(k: int) -> None:
        for i in range(args.requests_per_client):
            if time.perf_counter() >= deadline:
                return
            result = Result(client=k, index=i, sent=0.0)
            results.append(result)
            await stream_one(
                args, server.port, server.model_id, prompt_for(args.endpoint, k, i, clients), result, origin
            )

    tasks = [asyncio.ensure_future(client(k)) for k in range(clients)]
    _, pending = await asyncio.wait(tasks, timeout=args.seconds + args.grace)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.perf_counter() - origin
    cores = cpu.cores(wall)
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    sampler.peak_kb = max(sampler.peak_kb, tree_kb(server.proc.pid, "VmRSS"))
    if server.proc.poll() is not None:
        raise server.fail(f"exited with code {server.proc.returncode} during the {clients}-client level")

    ok = [r for r in results if r.error is None and not r.aborted]
    tokens = sum(r.tokens for r in results if r.error is None)
    ttfts = [r.ttft for r in results if r.ttft is not None and r.error is None]
    gaps = [g for r in results if r.error is None for g in r.gaps]
    sources = {("usage" if r.usage_tokens is not None else "chunks") for r in results if r.error is None}
    return {
        "server": server.name,
        "threads": server.threads,
        "clients": clients,
        "requests": len(ok),
        "errors": sum(r.error is not None for r in results),
        "aborted": sum(r.aborted for r in results),
        "tokens": tokens,
        "token_count_from": "+".join(sorted(sources)) or "-",
        "tokens_per_request": tokens / len(ok) if ok else None,
        "wall_s": wall,
        "tok_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_ms": _ms(percentile(ttfts, 50)),
        "ttft_p95_ms": _ms(percentile(ttfts, 95)),
        "itl_p50_ms": _ms(percentile(gaps, 50)),
        "itl_p95_ms": _ms(percentile(gaps, 95)),
        "rss_peak_mib": sampler.peak_kb / 1024,
        "vmhwm_mib": tree_kb(server.proc.pid, "VmHWM") / 1024,
        **cores,
        "loadavg": _loadavg(),
        "first_errors": sorted({r.error for r in results if r.error})[:3],
        "raw": [{**asdict(r), "tokens": r.tokens} for r in results],
    }


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return ""


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


async def bench_server(args, server: Server) -> dict:
    print(f"\n== {server.name}, {server.threads} thread(s): {' '.join(server.cmd)}", flush=True)
    server.start()
    await server.wait_healthy(args.startup_timeout)
    print(f"   healthy after {server.startup_s:.1f} s (port {server.port}, model id {server.model_id!r})", flush=True)
    warm = Result(client=-1, index=0, sent=0.0)
    await stream_one(
        args, server.port, server.model_id, prompt_text(args.endpoint, "a warm-up lap"), warm, time.perf_counter()
    )
    if warm.error:
        raise server.fail(f"failed the warm-up request: {warm.error}")
    print(f"   warm-up: {warm.tokens} tokens in {warm.done:.2f} s", flush=True)
    levels = []
    for clients in args.clients:
        level = await run_level(args, server, clients)
        levels.append(level)
        print("   " + progress_line(level), flush=True)
        if level["first_errors"]:
            print("     errors: " + " | ".join(level["first_errors"]), flush=True)
        await asyncio.sleep(1.0)  # let the server settle (aborted streams) before the next level
    return {
        "server": server.name,
        "threads": server.threads,
        "cmd": server.cmd,
        "port": server.port,
        "model_id": server.model_id,
        "startup_s": server.startup_s,
        "warmup": asdict(warm),
        "levels": levels,
    }


def fmt(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def progress_line(level: dict) -> str:
    return (
        f"{level['clients']:>3d} clients: {level['requests']} requests, {level['errors']} errors, "
        f"{level['tokens']} tokens in {level['wall_s']:.1f} s = {level['tok_s']:.1f} tok/s, "
        f"TTFT p50 {fmt(level['ttft_p50_ms'])} ms, ITL p50 {fmt(level['itl_p50_ms'], '.1f')} ms, "
        f"RSS {level['rss_peak_mib']:.0f} MiB, cores busy: server {level['server_cores']:.2f}, "
        f"load generator {level['client_cores']:.2f}, other programs {level['other_cores']:.2f}"
    )


def table(levels: list[dict]) -> str:
    rows = [
        "| server | threads | clients | requests | errors | tokens | wall s | agg tok/s | TTFT p50 ms | TTFT p95 ms "
        "| ITL p50 ms | ITL p95 ms | peak RSS MiB | VmHWM MiB | cores srv/gen/other |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in levels:
        errors = f"{v['errors']}" + (f" (+{v['aborted']} aborted)" if v["aborted"] else "")
        rows.append(
            f"| {v['server']} | {v['threads']} | {v['clients']} | {v['requests']} | {errors} | {v['tokens']} "
            f"| {v['wall_s']:.1f} | {v['tok_s']:.1f} | {fmt(v['ttft_p50_ms'])} | {fmt(v['ttft_p95_ms'])} "
            f"| {fmt(v['itl_p50_ms'], '.1f')} | {fmt(v['itl_p95_ms'], '.1f')} | {v['rss_peak_mib']:.0f} "
            f"| {v['vmhwm_mib']:.0f} | {v['server_cores']:.2f}/{v['client_cores']:.2f}/{v['other_cores']:.2f} |"
        )
    return "\n".join(rows)


def ratios(levels: list[dict], threads: list[int]) -> list[str]:
    def rate(server: str, t: int, clients: int) -> float | None:
        for v in levels:
            if (v["server"], v["threads"], v["clients"]) == (server, t, clients) and v["tokens"]:
                return v["tok_s"]
        return None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    lines = []
    for t in threads:
        scale = ratio(rate("ruvllm", t, 16), rate("ruvllm", t, 1))
        versus = ratio(rate("ruvllm", t, 16), rate("llama", t, 16))
        lines.append(
            f"- {t} thread(s): ruvllm 16 clients / ruvllm 1 client: "
            + (f"**{scale:.2f}x** (target >= 5: {'met' if scale >= 5 else 'missed'})" if scale else "n/a")
            + "; ruvllm / llama-cpp-python at 16 clients: "
            + (f"**{versus:.2f}x** (target > 1: {'met' if versus > 1 else 'missed'})" if versus else "n/a")
        )
    return lines


def versions() -> dict[str, str | None]:
    from importlib import metadata

    found = {}
    for name in ("ruvllm", "llama-cpp-python", "fastapi", "uvicorn", "sse-starlette", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def server_list(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names or any(n not in ("ruvllm", "llama") for n in names):
        raise argparse.ArgumentTypeError(f"servers are ruvllm and/or llama, got {text!r}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--servers", type=server_list, default=["ruvllm", "llama"], help="ruvllm,llama (default)")
    parser.add_argument("--gguf", type=Path, default=GGUF, help="the GGUF both servers load")
    parser.add_argument("--ruvllm-model", help="model for ruvllm serve instead of --gguf (e.g. a converted folder)")
    parser.add_argument("--compute", help="passed to ruvllm serve as --compute")
    parser.add_argument("--max-concurrent", type=int, help="ruvllm serve --max-concurrent (default: most clients)")
    parser.add_argument(
        "--no-ruvllm-threads-flag", dest="ruvllm_threads_flag", action="store_false",
        help="do not pass --threads T to ruvllm serve (the environment still sets OPENBLAS_NUM_THREADS=T)",
    )  # fmt: skip
    parser.add_argument("--ruvllm-cmd", help="command that runs ruvllm (default: .venv/bin/ruvllm); 'serve' follows")
    parser.add_argument("--ruvllm-arg", action="append", default=[], help="extra argument for ruvllm serve")
    parser.add_argument("--clients", type=int_list, default=[1, 4, 16, 32], help="concurrency levels: 1,4,16,32")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=120.0, help="per level: no new request after this")
    parser.add_argument("--grace", type=float, default=60.0, help="then requests still in flight are aborted")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    parser.add_argument("--threads", type=int_list, default=[1], help="1 (default), or 1,2 for both, reported apart")
    parser.add_argument("--n-ctx", type=int, default=2048, help="llama.cpp context size")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--request-timeout", type=float, default=300.0, help="silence on a stream that is an error")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args()

    if not args.gguf.exists():
        sys.exit(f"error: {args.gguf} does not exist (run ./build.sh, or pass --gguf)")
    if "llama" in args.servers:
        missing = [m for m in ("llama_cpp", *LLAMA_SERVER_DEPS) if importlib.util.find_spec(m) is None]
        if missing:
            sys.exit(
                f"error: llama-cpp-python's server needs {', '.join(missing)}: "
                f"{Path(sys.executable).name} -m pip install -r benchmarks/requirements.txt"
            )

    atexit.register(stop_all)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = Path(tempfile.mkdtemp(prefix="serve_load_"))
    print(
        f"model {args.gguf.name}; {args.endpoint} streaming, max_tokens {args.max_tokens}, temperature 0; "
        f"clients {args.clients}, {args.requests_per_client} requests per client or {args.seconds:g} s per level; "
        f"{os.cpu_count()} CPUs; server logs in {log_dir}",
        flush=True,
    )
    runs: list[dict] = []
    failures: list[dict] = []
    began = time.time()
    try:
        for threads in args.threads:
            for name in args.servers:
                server = make_server(name, threads, args, log_dir)
                try:
                    runs.append(asyncio.run(bench_server(args, server)))
                except ServerError as e:
                    print(e, file=sys.stderr, flush=True)
                    failures.append({"server": name, "threads": threads, "cmd": server.cmd, "error": str(e)})
                finally:
                    if server.proc is not None:
                        stop(server.proc)
    finally:
        stop_all()

    levels = [v for run in runs for v in run["levels"]]
    print()
    print(table(levels) if levels else "(no server run completed)")
    print()
    print("Aggregate decode tok/s = completion tokens received by all clients / wall time of the level.")
    print(
        "cores srv/gen/other: CPU cores kept busy on average during the level by the server, by this load "
        "generator, and by everything else (other programs, hypervisor steal): noise, a high value makes the row "
        "unreliable."
    )
    print("Ratios of aggregate tok/s:")
    print("\n".join(ratios(levels, args.threads)))
    if args.json:
        report = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]},
            "versions": versions(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(began)),
            "duration_s": time.time() - began,
            "runs": runs,
            "failures": failures,
            "ratios": ratios(levels, args.threads),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"\nraw figures: {args.json}")
    if failures:
        sys.exit(
            f"\n{len(failures)} server run(s) failed: "
            + ", ".join(f"{f['server']} ({f['threads']} thr)" for f in failures)
        )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted (servers stopped)")
