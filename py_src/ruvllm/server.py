"""`ruvllm serve`: an OpenAI-compatible HTTP server over one model, on Starlette + uvicorn (the
`serve` extra), with continuous batching.

    POST /v1/chat/completions, POST /v1/completions   OpenAI bodies (completions.py), SSE when stream
    GET  /v1/models                                   the one model
    GET  /health                                      200 {"status": "ok"} once the model is loaded
    GET  /metrics                                     Prometheus text: requests, tokens, queue, batch, KV blocks

Requests are checked and tokenized on the event loop, then handed to the `Scheduler`, whose thread
steps every live sequence together; each request's Steps come back through an asyncio queue and are
turned into text (text.stream.TextStream) and OpenAI chunks (completions.Response) here. A client that
disconnects, or a stop string reached, cancels the sequence: its KV blocks are free at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import AsyncIterator

from .api import Model
from .completions import Prepared, Response, prepare
from .errors import ContextFullError, RuvLLMError
from .runtime.batching import Request, Scheduler
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


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Service:
    """The model, its scheduler, and the handling of one request from body to answer."""

    def __init__(self, model: Model, max_concurrent: int = 8, max_context: int | None = None) -> None:
        self.model = model
        self.scheduler = Scheduler(model.engine, max_concurrent=max_concurrent, max_context=max_context)
        self.started = time.time()
        self.http_requests: dict[tuple[str, int], int] = {}

    def prepare(self, body: object, kind: str) -> Prepared:
        prepared = prepare(body, kind, self.model.tokenizer, self.scheduler.max_context, self.model.name)
        self.scheduler.check(prepared.prompt_ids)  # a prompt that can never run is refused before any answer
        return prepared

    async def run(self, prepared: Prepared, response: Response) -> AsyncIterator[dict]:
        """The OpenAI chunks of one request as they come (none unless it streams: then the whole answer
        is `response.result()` once this ends)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Step | BaseException] = asyncio.Queue()
        model = self.model
        constraint = prepared.constraint(model.vocabulary) if prepared.constrained else None
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


def create_app(service: Service):
    """The Starlette application (imported here: starlette is the `serve` extra)."""
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
            body = json.loads(await http.body())
        except ValueError as e:
            return answer(path, error_body(f"the request body is not JSON: {e}"), 400)
        try:
            prepared = service.prepare(body, kind)
        except ContextFullError as e:
            return answer(path, error_body(str(e), code="context_length_exceeded"), 400)
        except RuvLLMError as e:
            return answer(path, error_body(str(e)), 400)
        response = Response(prepared, service.model.tokenizer.token_bytes)
        if prepared.stream:
            count(path, 200)
            return StreamingResponse(_sse(service.run(prepared, response)), media_type="text/event-stream")
        work = asyncio.ensure_future(_drain(service.run(prepared, response)))
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
        thread.join(timeout=5)

    return Starlette(routes=routes, lifespan=lifespan)


async def _drain(events: AsyncIterator[dict]) -> None:
    async for _ in events:
        pass


async def _sse(events: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events as OpenAI streams them; an error mid-stream is sent as an error event."""
    try:
        async for event in events:
            yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
    except Exception as e:  # the generation failed mid-stream: the client gets the reason, the server goes on
        yield f"data: {json.dumps(error_body(_reason(e), 'server_error'))}\n\n"
    yield "data: [DONE]\n\n"


def _reason(error: Exception) -> str:
    """A failed generation's message: ours as it is, anything else named as an internal error."""
    if isinstance(error, RuvLLMError):
        return str(error)
    return f"internal error: {type(error).__name__}: {error}"


def serve(model: Model, host: str = "127.0.0.1", port: int = 8080, max_concurrent: int = 8, max_context=None) -> None:
    """Run the server until interrupted."""
    import uvicorn

    service = Service(model, max_concurrent, max_context)
    # The model and tokenizer are millions of long-lived objects: out of the collector's sight, a full
    # collection takes ~0 ms instead of ~20 ms in the middle of a step (measured with the JSON constraint).
    gc.freeze()
    uvicorn.run(create_app(service), host=host, port=port, log_level="warning")
