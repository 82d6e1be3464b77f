"""The OpenAI answer to one prepared request, built from the text layer's `Chunk`s as they come: the
stream's chunks (chat.completion.chunk / text_completion objects) and the whole answer, so the solo
API, the worker and the batching server shape them with the same code."""

from __future__ import annotations

import time
import uuid

from ..text.stream import Chunk
from ..text.tool_calls import parse_tool_calls
from .request import Prepared


class Response:
    """Builds the OpenAI answer to one prepared request from its chunks: `add` gives the stream chunks
    for one Chunk (chat.completion.chunk / text_completion objects), `result` the whole answer."""

    def __init__(self, prepared: Prepared, token_bytes: list[bytes]) -> None:
        self.prepared, self.token_bytes = prepared, token_bytes
        chat = prepared.kind == "chat"
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.object = "chat.completion" if chat else "text_completion"
        self.created = int(time.time())
        self.text: list[str] = []
        self.logprobs: list[dict] = []
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.buffer_for_tools = chat and prepared.tool_choice != "none"  # calls are parsed from the whole text
        self.sent_role = False

    @property
    def completion_tokens(self) -> int:
        """Tokens generated so far (a chunk each)."""
        return len(self.text)

    def _head(self, stream: bool) -> dict:
        kind = self.object + (".chunk" if stream and self.prepared.kind == "chat" else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.prepared.model}

    def add(self, chunk: Chunk) -> list[dict]:
        """Take one chunk; the stream chunks it gives (none while text is held back)."""
        self.text.append(chunk.text)
        entry = self._logprob_entry(chunk) if self.prepared.logprobs else None
        if entry is not None:
            self.logprobs.append(entry)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            stats = chunk.stats
            self.usage = {
                "prompt_tokens": stats.prompt_tokens,
                "completion_tokens": stats.completion_tokens,
                "total_tokens": stats.prompt_tokens + stats.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
            }
        if not self.prepared.stream:
            return []
        out = []
        if self.prepared.kind == "chat":
            if not self.sent_role:
                out.append(self._chat_chunk({"role": "assistant", "content": ""}, None, None))
                self.sent_role = True
            if not self.buffer_for_tools and (chunk.text or entry is not None):
                out.append(self._chat_chunk({"content": chunk.text}, None, entry))
            if self.finish_reason is not None:
                out += self._chat_ending()
        else:
            if chunk.text or entry is not None or self.finish_reason is not None:
                choice = {"index": 0, "text": chunk.text, "logprobs": None, "finish_reason": self.finish_reason}
                if entry is not None:
                    choice["logprobs"] = _text_logprobs([entry])
                out.append({**self._head(True), "choices": [choice]})
        if self.finish_reason is not None and self.prepared.include_usage:
            out.append({**self._head(True), "choices": [], "usage": self.usage})
        return out

    def _chat_chunk(self, delta: dict, finish: str | None, entry: dict | None) -> dict:
        logprobs = {"content": [entry]} if entry is not None else None
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**self._head(True), "choices": [choice]}

    def _chat_ending(self) -> list[dict]:
        if not self.buffer_for_tools:
            return [self._chat_chunk({}, self.finish_reason, None)]
        content, calls = parse_tool_calls("".join(self.text))
        delta: dict = {"content": content}
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        finish = "tool_calls" if calls else self.finish_reason
        logprobs = {"content": self.logprobs} if self.prepared.logprobs else None
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return [{**self._head(True), "choices": [choice]}]

    def result(self) -> dict:
        """The whole answer (after the last chunk)."""
        text = "".join(self.text)
        if self.prepared.kind == "chat":
            message: dict = {"role": "assistant", "content": text}
            finish = self.finish_reason
            if self.prepared.tool_choice != "none":
                content, calls = parse_tool_calls(text)
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": calls}
                    finish = "tool_calls"
            logprobs = {"content": self.logprobs} if self.prepared.logprobs else None
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
        else:
            logprobs = _text_logprobs(self.logprobs) if self.prepared.logprobs else None
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": self.finish_reason}
        return {**self._head(False), "choices": [choice], "usage": self.usage}

    def _logprob_entry(self, chunk: Chunk) -> dict | None:
        if chunk.logprob is None:
            return None
        return {
            **self._token(chunk.token_id),
            "logprob": chunk.logprob,
            "top_logprobs": [{**self._token(t), "logprob": lp} for t, lp in chunk.top_logprobs],
        }

    def _token(self, token_id: int) -> dict:
        data = self.token_bytes[token_id] if token_id < len(self.token_bytes) else b""
        return {"token": data.decode("utf-8", errors="replace"), "bytes": list(data)}


def _text_logprobs(entries: list[dict]) -> dict:
    """The /v1/completions layout: parallel lists."""
    offsets, at = [], 0
    for entry in entries:
        offsets.append(at)
        at += len(entry["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }
