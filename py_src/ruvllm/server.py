"""`ruvllm serve`: an OpenAI-compatible HTTP server over one model, on Starlette + uvicorn (the
`serve` extra), with continuous batching.

    POST /v1/chat/completions, POST /v1/completions   OpenAI bodies (completions/), SSE when stream
    GET  /v1/models                                   the one model
    GET  /health                                      200 {"status": "ok"} once the model is loaded
    GET  /metrics                                     Prometheus text: requests, tokens, queue, batch, KV blocks

Requests are parsed, checked, tokenized and their schemas compiled off the event loop (in `Service`'s
`preparing` threads: a costly schema never holds /health or another request), then handed to the
`Scheduler`, whose thread steps every live sequence together; each request's Steps come back through
an asyncio queue and are turned into text (text.stream.TextStream) and OpenAI chunks
(completions.Response) here. A client that disconnects, or a stop string reached, cancels the
sequence: its KV blocks are free at the next step.

A body is parsed with json_body.parse (nesting bounded before the parser recurses, no NaN); every field
is checked by completions.check, fields it does not know ignored, as vLLM's and llama.cpp's servers do.
Each request is logged on stderr in one line once answered: client, method, path, status, tokens, time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import ipaddress
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable

from .api import Model
from .completions import Prepared, Response, prepare
from .errors import ContextFullError, InvalidArgumentError, RuvLLMError
from .files.json_body import FieldError, parse
from .runtime.batching import Request, Scheduler
from .runtime.constrain import Budgeted, Triggered
from .runtime.generate import Step
from .text.stream import TextStream

# Prometheus metrics: (name, type, Scheduler.stats() key, help).
METRICS = [
    ("ruvllm_requests_total", "counter", "requests", "Generation requests submitted."),
    ("ruvllm_requests_finished_total", "counter", "finished", "Requests that ran to their end."),
    ("ruvllm_requests_cancelled_total", "counter", "cancelled", "Requests cancelled (client gone, stop string)."),
    ("ruvllm_requests_refused_total", "counter", "refused", "Requests too long for the context or the KV blocks."),
    ("ruvllm_prompt_tokens_total", "counter", "prompt_tokens", "Prompt tokens received."),
    ("ruvllm_prompt_tokens_cached_total", "counter", "cached_prompt_tokens", "Prompt tokens in shared KV blocks."),
    ("ruvllm_generated_tokens_total", "counter", "generated_tokens", "Tokens generated."),
    ("ruvllm_steps_total", "counter", "steps", "Batched forward passes."),
    ("ruvllm_queue_depth", "gauge", "waiting", "Requests waiting to start."),
    ("ruvllm_running_sequences", "gauge", "running", "Sequences being generated."),
    ("ruvllm_batch_sequences", "gauge", "last_batch_sequences", "Sequences in the latest batched forward."),
    ("ruvllm_batch_rows", "gauge", "last_batch_rows", "Rows (tokens) in the latest batched forward."),
    ("ruvllm_kv_blocks_total", "gauge", "kv_blocks_total", "KV cache blocks in the pool."),
    ("ruvllm_kv_blocks_used", "gauge", "kv_blocks_used", "KV cache blocks held by sequences."),
    ("ruvllm_kv_blocks_cold", "gauge", "kv_blocks_cold", "KV blocks kept as int8/int4 codes (--hot-tokens)."),
    ("ruvllm_kv_hot_slots", "gauge", "kv_hot_slots", "float32 KV block slots in use."),
    ("ruvllm_kv_block_size", "gauge", "kv_block_size", "Positions per KV cache block."),
]
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks whether its client went away
MAX_CONCURRENT = 256  # --max-concurrent's bound: each sequence reserves KV blocks for a whole context
MAX_BODY_BYTES = 16 << 20  # a request body; larger ones are refused (413) before they are read whole
PREPARING_THREADS = 2  # requests prepared at once (parsed, checked, tokenized, schemas compiled)


Constraint = Budgeted | Triggered  # what a constrained request's steps follow


def error_body(
    message: str, kind: str = "invalid_request_error", code: str | None = None, param: str | None = None
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Service:
    """The model, its scheduler, and the handling of one request from body to answer."""

    def __init__(self, model: Model, max_concurrent: int = 8, max_context: int | None = None) -> None:
        self.model = model
        self.scheduler = Scheduler(model.engine, max_concurrent=max_concurrent, max_context=max_context)
        self.started = time.time()
        self.http_requests: dict[tuple[str, int], int] = {}
        # Preparing a request (its schemas above all) may take a while and memory: a few at a time, off
        # the event loop, so that /health and the other requests are answered meanwhile.
        self.preparing = concurrent.futures.ThreadPoolExecutor(PREPARING_THREADS, "ruvllm-prepare")

    def prepare(self, raw: bytes, kind: str) -> tuple[Prepared, Constraint | None]:
        """A request body, parsed and checked, its prompt tokenized and its constraint made (schemas
        compiled, the vocabulary prepared on first use): everything before the first step."""
        model, scheduler = self.model, self.scheduler
        prepared = prepare(parse(raw), kind, model.tokenizer, scheduler.max_context, model.name, "ignore")
        try:  # a prompt that can never run is refused before any answer
            scheduler.check(prepared.prompt_ids)
        except InvalidArgumentError as e:  # token ids outside the vocabulary, an empty prompt
            raise FieldError(f"prompt: {e}", "prompt") from None
        return prepared, prepared.constraint(model.vocabulary) if prepared.constrained else None

    async def run(self, prepared: Prepared, constraint: Constraint | None, response: Response) -> AsyncIterator[dict]:
        """The OpenAI chunks of one request as they come (none unless it streams: then the whole answer
        is `response.result()` once this ends)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Step | BaseException] = asyncio.Queue()
        model = self.model
        text = TextStream(
            model.tokenizer.detokenizer(), len(prepared.prompt_ids), prepared.options.stop, model.eos_token_ids
        )
        request: Request = self.scheduler.submit(
            prepared.prompt_ids,
            prepared.options,
            lambda item: loop.call_soon_threadsafe(queue.put_nowait, item),
            model.eos_token_ids,
            constraint,
        )
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                chunk = text.add(item)
                for event in response.add(chunk):
                    yield event
                if chunk.finish_reason is not None:
                    return
        finally:  # finished, a stop string, an error, or the client went away
            if not request.finished:
                self.scheduler.cancel(request)

    def metrics(self) -> str:
        """Prometheus text exposition."""
        stats = self.scheduler.stats()
        lines = []
        for name, kind, key, help_text in METRICS:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {stats[key]}"]
        name = "ruvllm_http_requests_total"
        lines += [f"# HELP {name} HTTP requests by path and status.", f"# TYPE {name} counter"]
        for (path, status), count in sorted(self.http_requests.items()):
            lines.append(f'{name}{{path="{path}",status="{status}"}} {count}')
        return "\n".join(lines) + "\n"


def create_app(service: Service, log: Callable[[str], None] | None = None):
    """The Starlette application (imported here: starlette is the `serve` extra). `log` takes the access
    log's lines (default: stderr)."""
    from starlette.applications import Starlette
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def count(path: str, status: int) -> None:
        service.http_requests[(path, status)] = service.http_requests.get((path, status), 0) + 1

    def answer(path: str, body: dict, status: int = 200) -> JSONResponse:
        count(path, status)
        return JSONResponse(body, status_code=status)

    async def completions(http: HTTPRequest, kind: str):
        path = http.url.path
        try:
            raw = await _body(http)
            if raw is None:
                message = f"the request body is larger than {MAX_BODY_BYTES:,} bytes"
                return answer(path, error_body(message, code="request_too_large"), 413)
            loop = asyncio.get_running_loop()
            prepared, constraint = await loop.run_in_executor(service.preparing, service.prepare, raw, kind)
        except ContextFullError as e:
            param = "messages" if kind == "chat" else "prompt"
            return answer(path, error_body(str(e), code="context_length_exceeded", param=param), 400)
        except RuvLLMError as e:
            return answer(path, error_body(str(e), param=getattr(e, "param", None)), 400)
        response = Response(prepared, service.model.tokenizer.token_bytes)
        http.scope[_TOKENS] = lambda: (len(prepared.prompt_ids), response.completion_tokens)  # for the access log
        if prepared.stream:
            count(path, 200)
            events = service.run(prepared, constraint, response)
            return StreamingResponse(_sse(events), media_type="text/event-stream")
        work = asyncio.ensure_future(_drain(service.run(prepared, constraint, response)))
        while not work.done():  # the whole answer, watching for the client going away
            await asyncio.wait([work], timeout=DISCONNECT_POLL_S)
            if not work.done() and await http.is_disconnected():
                work.cancel()  # the generator's `finally` cancels the sequence
                return answer(path, error_body("the client went away"), 499)
        try:
            work.result()
        except Exception as e:  # the generation failed: the client gets the reason, the server goes on
            return answer(path, error_body(_reason(e), "server_error"), 500)
        return answer(path, response.result())

    async def chat(http: HTTPRequest):
        return await completions(http, "chat")

    async def text(http: HTTPRequest):
        return await completions(http, "text")

    async def models(http: HTTPRequest):
        card = {"id": service.model.name, "object": "model", "created": int(service.started), "owned_by": "ruvllm"}
        return answer("/v1/models", {"object": "list", "data": [card]})

    async def health(http: HTTPRequest):
        return answer("/health", {"status": "ok", "model": service.model.name})

    async def metrics(http: HTTPRequest):
        return PlainTextResponse(service.metrics(), media_type="text/plain; version=0.0.4")

    async def failed(http: HTTPRequest, error: Exception):  # a bug of ours: still OpenAI's error object
        return answer(http.url.path, error_body(_reason(error), "server_error"), 500)

    async def unknown(http: HTTPRequest, error: Exception):  # no such path, or not with this method
        status = getattr(error, "status_code", 404)
        method, path = http.method, http.url.path
        message = f"Invalid URL ({method} {path}): ruvllm serves {', '.join(ENDPOINTS)}"
        if status == 405:
            message = f"{path} does not take {method}: ruvllm serves {', '.join(ENDPOINTS)}"
        return answer(path, error_body(message, code="unknown_url"), status)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", text, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        thread = service.scheduler.start()
        yield
        service.scheduler.close()
        service.preparing.shutdown(wait=False, cancel_futures=True)
        thread.join(timeout=5)

    handlers = {Exception: failed, 404: unknown, 405: unknown}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    return AccessLog(app, log or _to_stderr)


ENDPOINTS = ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models", "GET /health", "GET /metrics")
_TOKENS = "ruvllm.tokens"  # ASGI scope key: () -> (prompt tokens, completion tokens so far)


class AccessLog:
    """ASGI middleware: one line per HTTP request once its answer is sent (a stream: once it ends or
    its client goes away), `127.0.0.1:50312 POST /v1/chat/completions 200 prompt_tokens=31
    completion_tokens=16 412 ms`; the token counts only for completions."""

    def __init__(self, app, log: Callable[[str], None]) -> None:
        self.app, self.log = app, log

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # if the application fails before it answers

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            client = scope.get("client")
            parts = [f"{client[0]}:{client[1]}" if client else "-", scope["method"], scope["path"], str(status)]
            if _TOKENS in scope:
                prompt, completion = scope[_TOKENS]()
                parts += [f"prompt_tokens={prompt}", f"completion_tokens={completion}"]
            parts.append(f"{(time.perf_counter() - started) * 1000:.0f} ms")
            self.log(" ".join(parts))


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _body(http) -> bytes | None:
    """The request's body, or None once it passes MAX_BODY_BYTES (read no further)."""
    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    parts, size = [], 0
    async for part in http.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            return None
        parts.append(part)
    return b"".join(parts)


async def _drain(events: AsyncIterator[dict]) -> None:
    async for _ in events:
        pass


async def _sse(events: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events as OpenAI streams them, strict JSON (no NaN: clients' parsers refuse it); an
    error mid-stream is sent as an error event."""
    try:
        async for event in events:
            yield f"data: {json.dumps(event, ensure_ascii=False, allow_nan=False)}\n\n"
    except Exception as e:  # the generation failed mid-stream: the client gets the reason, the server goes on
        yield f"data: {json.dumps(error_body(_reason(e), 'server_error'))}\n\n"
    yield "data: [DONE]\n\n"


def _reason(error: Exception) -> str:
    """A failed generation's message: ours as it is, anything else named as an internal error."""
    if isinstance(error, RuvLLMError):
        return str(error)
    return f"internal error: {type(error).__name__}: {error}"


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, not listening yet (connections are refused until the server starts),
    so that a bad --host or --port, or a port in use, is reported before the model loads."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgumentError(f"--port must be an integer in [1, 65535], got {port!r}")
    if all(c in "0123456789." for c in host) or ":" in host:  # an address, never looked up as a name
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InvalidArgumentError(f"--host {host!r} is not an IP address") from None
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn chooses
        family, kind, proto, _, address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:  # (UnicodeError: a label IDNA cannot encode; no strerror)
        why = (e.strerror if isinstance(e, socket.gaierror) else None) or e
        raise InvalidArgumentError(
            f"--host {host!r} is not an IP address or a name this machine resolves ({why})"
        ) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart need not wait
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise InvalidArgumentError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None
    return sock


def serve(
    model: Model,
    host: str = "127.0.0.1",
    port: int = 8080,
    max_concurrent: int = 8,
    max_context=None,
    sock: socket.socket | None = None,
) -> None:
    """Run the server until interrupted, on `sock` if given (see `bind`), else on host:port."""
    import uvicorn

    with sock or bind(host, port) as listening:
        service = Service(model, max_concurrent, max_context)
        # The model and tokenizer are millions of long-lived objects: out of the collector's sight, a full
        # collection takes ~0 ms instead of ~20 ms in the middle of a step (measured with the JSON constraint).
        gc.freeze()
        # uvicorn's own access log is off: ours (AccessLog) has the token counts.
        config = uvicorn.Config(create_app(service), host=host, port=port, log_level="warning", access_log=False)
        uvicorn.Server(config).run(sockets=[listening])
