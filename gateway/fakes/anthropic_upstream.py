"""A fake Anthropic Messages API: a real Starlette app that the litellm upstream adapter is tested against.

It speaks Anthropic's wire format (`POST /v1/messages`, JSON or the named SSE events), answers with a
short echo of the last user message unless a `Reply` is enqueued, and records every request it received
so tests can assert what litellm actually sent (system field, content blocks, `x-api-key`). Usage counts
real tokens, split by a simulated prompt cache at the request's `cache_control` breakpoints (`prompt_cache.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.fakes.prompt_cache import BreakpointLimitError, CacheUsage, PromptCache, count_breakpoints
from gateway.ports import JSON, JSONObject


@dataclass(frozen=True, slots=True)
class ToolUse:
    name: str
    input: JSONObject
    id: str = "toolu_fake_1"


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer. Defaults give a normal, complete text answer.

    `status` other than 200 answers with Anthropic's error body (`error_type`, `error_message`);
    `stream_error_after` sends an in-band `event: error` after that many stream events, as Anthropic does
    when it is overloaded mid-answer; `break_after_events` drops the connection instead.
    """

    text: str | None = "Hello from the fake Anthropic upstream."
    tool_uses: tuple[ToolUse, ...] = ()
    thinking: str | None = None  # a signed thinking block before the text
    compaction: str | None = None  # the provider's compaction block (its summary), opening the answer
    status: int = 200
    error_type: str = "api_error"
    error_message: str = "fake upstream error"
    stop_reason: str | None = None
    delay: float = 0.0
    event_delay: float = 0.0
    stream_error_after: int | None = None
    break_after_events: int | None = None


@dataclass(slots=True)
class Received:
    path: str
    headers: dict[str, str]
    body: JSONObject
    raw: bytes


@dataclass(slots=True)
class FakeAnthropic:
    """State shared between the test thread and the server thread (guarded by a lock)."""

    model: str = "claude-fake"
    received: list[Received] = field(default_factory=list)
    disconnects: int = 0
    _script: deque[Reply] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    # Anthropic's prompt cache at `cache_control` breakpoints; `simulate_cache = False` reports none.
    prompt_cache: PromptCache = field(default_factory=PromptCache)
    simulate_cache: bool = True

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def next_reply(self, body: JSONObject) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        return Reply(text=default_answer(body))

    def last(self) -> Received:
        with self._lock:
            return self.received[-1]

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            ]
        )

    async def _count_tokens(self, request: Request) -> Response:
        raw = await request.body()
        parsed = orjson.loads(raw) if raw else {}
        body: JSONObject = parsed if isinstance(parsed, dict) else {}
        with self._lock:
            self.received.append(Received(request.url.path, dict(request.headers), body, raw))
        return _json({"input_tokens": self.prompt_cache.count_anthropic(body)}, 200)

    async def _messages(self, request: Request) -> Response:
        raw = await request.body()
        parsed = orjson.loads(raw) if raw else {}
        body: JSONObject = parsed if isinstance(parsed, dict) else {}
        with self._lock:
            self.received.append(Received(request.url.path, dict(request.headers), body, raw))
        found, limit = count_breakpoints(body), self.prompt_cache.max_breakpoints
        if found > limit:  # refused before any scripted answer is used, as Anthropic validates first
            return _json(_error("invalid_request_error", str(BreakpointLimitError(found, limit))), 400)
        reply = self.next_reply(body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            response = _json(_error(reply.error_type, reply.error_message), reply.status)
            if reply.status in (429, 529):
                response.headers["retry-after"] = "7"  # Anthropic says when to come back
            return response
        measured = self.measure(body)
        message_id = f"msg_fake{next(self._ids)}"
        model = body.get("model") if isinstance(body.get("model"), str) else self.model
        message = _message(message_id, str(model), reply, measured)
        if body.get("stream") is True:
            return StreamingResponse(
                self._paced(_events(message, reply), reply), media_type="text/event-stream"
            )
        return _json(message, 200)

    def measure(self, body: JSONObject) -> CacheUsage:
        """The prompt's real token count, split as Anthropic bills it (BreakpointLimitError: over 4)."""
        if self.simulate_cache:
            return self.prompt_cache.anthropic(body)
        return CacheUsage(self.prompt_cache.count_anthropic(body), 0)

    async def _paced(self, events: list[bytes], reply: Reply) -> AsyncIterator[bytes]:
        try:
            for number, event in enumerate(events):
                if reply.break_after_events is not None and number >= reply.break_after_events:
                    raise ConnectionAbortedError("fake Anthropic breaks the stream on purpose")
                if reply.stream_error_after is not None and number >= reply.stream_error_after:
                    yield _sse("error", _error("overloaded_error", reply.error_message))
                    return
                if reply.event_delay and number:
                    await asyncio.sleep(reply.event_delay)
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            with self._lock:
                self.disconnects += 1
            raise


def default_answer(body: JSONObject) -> str:
    messages = body.get("messages")
    last = ""
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                last = _text_of(message.get("content"))
                break
    count = len(messages) if isinstance(messages, list) else 0
    return f"(fake claude) I read {count} messages. You said: {last[:200] or 'nothing'}"


def _text_of(content: JSON) -> str:
    """Anthropic content is a string or a list of blocks; only text blocks count here."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        return " ".join(text for text in texts if isinstance(text, str))
    return ""


THINKING_SIGNATURE = "sig_fake_EqQBCkYIBxgCKkB"


def _json(data: JSONObject, status: int) -> Response:
    # Anthropic puts a request id on every answer, errors included.
    return Response(
        orjson.dumps(data),
        status_code=status,
        media_type="application/json",
        headers={"request-id": "req_fake"},
    )


def _error(error_type: str, message: str) -> JSONObject:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def _sse(event: str, data: JSONObject) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _message(message_id: str, model: str, reply: Reply, measured: CacheUsage) -> JSONObject:
    content: list[JSON] = []
    if reply.compaction is not None:
        content.append({"type": "compaction", "content": reply.compaction})
    if reply.thinking:
        content.append({"type": "thinking", "thinking": reply.thinking, "signature": THINKING_SIGNATURE})
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for use in reply.tool_uses:
        content.append({"type": "tool_use", "id": use.id, "name": use.name, "input": use.input})
    stop = reply.stop_reason or ("tool_use" if reply.tool_uses else "end_turn")
    output = len((reply.text or "").split()) + sum(len(orjson.dumps(u.input)) // 4 for u in reply.tool_uses)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": measured.uncached_tokens,
            "output_tokens": output,
            "cache_creation_input_tokens": measured.cache_write_tokens,
            "cache_read_input_tokens": measured.cached_tokens,
        },
    }


def _events(message: JSONObject, reply: Reply) -> list[bytes]:
    """The event sequence Anthropic streams for `message` (text split per word, tool input in pieces)."""
    usage = message["usage"]
    assert isinstance(usage, dict)
    start: JSONObject = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**usage, "output_tokens": 1},
    }
    events = [_sse("message_start", {"type": "message_start", "message": start})]
    index = 0
    if reply.compaction is not None:  # started empty, then the whole summary in one delta
        events.append(_block_start(index, {"type": "compaction", "content": ""}))
        events.append(_block_delta(index, {"type": "compaction_delta", "content": reply.compaction}))
        events.append(_block_stop(index))
        index += 1
    if reply.thinking:
        events.append(_block_start(index, {"type": "thinking", "thinking": "", "signature": ""}))
        events.append(_block_delta(index, {"type": "thinking_delta", "thinking": reply.thinking}))
        events.append(_block_delta(index, {"type": "signature_delta", "signature": THINKING_SIGNATURE}))
        events.append(_block_stop(index))
        index += 1
    if reply.text:
        events.append(_block_start(index, {"type": "text", "text": ""}))
        events.append(_sse("ping", {"type": "ping"}))
        words = reply.text.split(" ")
        for position, word in enumerate(words):
            piece = word if position == 0 else " " + word
            events.append(_block_delta(index, {"type": "text_delta", "text": piece}))
        events.append(_block_stop(index))
        index += 1
    for use in reply.tool_uses:
        events.append(_block_start(index, {"type": "tool_use", "id": use.id, "name": use.name, "input": {}}))
        if not reply.text:
            events.append(_sse("ping", {"type": "ping"}))
        arguments = orjson.dumps(use.input).decode()
        # Anthropic opens every tool input with an empty partial_json before the real pieces.
        pieces = ["", *(arguments[i : i + 8] for i in range(0, len(arguments), 8))]
        for piece in pieces:
            events.append(_block_delta(index, {"type": "input_json_delta", "partial_json": piece}))
        events.append(_block_stop(index))
        index += 1
    delta: JSONObject = {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
    }
    events.append(_sse("message_delta", {**delta, "usage": usage}))  # Anthropic repeats the input counts
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events


def _block_start(index: int, block: JSONObject) -> bytes:
    return _sse(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
    )


def _block_delta(index: int, delta: JSONObject) -> bytes:
    return _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _block_stop(index: int) -> bytes:
    return _sse("content_block_stop", {"type": "content_block_stop", "index": index})
