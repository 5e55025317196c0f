"""A fake OpenAI-compatible provider: a real Starlette app speaking the real wire format.

Scriptable (`enqueue(Reply(...))`), deterministic by default (it answers with a short echo of the last
user message), and it records every request it received. Used by the tests, the benchmarks and
`context-gateway demo` as the stand-in upstream. Usage counts real tokens and reports the cached tokens of
a simulated OpenAI prompt cache (`prompt_cache.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.fakes.memory_llm import is_memory_call, memory_answer
from gateway.fakes.openai_wire import (
    Reply,
    ToolCall,
    chat_usage,
    error_answer,
    finish_reason,
    responses_frames,
    responses_messages,
    responses_output,
    stream_frames,
)
from gateway.fakes.prompt_cache import CacheUsage, PromptCache
from gateway.jobs.prompts import CHUNK_MARKER, CONDENSE_MARKER, MERGE_MARKER
from gateway.ports import JSON, JSONObject

# benchmarks/fast_fake_upstream.py builds its answers with these, by these names.
_finish = finish_reason
_stream_frames = stream_frames
_usage = chat_usage


@dataclass(slots=True)
class Received:
    path: str
    headers: dict[str, str]
    body: JSONObject
    raw: bytes


@dataclass(slots=True)
class FakeUpstream:
    """State shared between the test thread and the server thread (guarded by a lock)."""

    model: str = "fake-model"
    received: list[Received] = field(default_factory=list)
    disconnects: int = 0
    _script: deque[Reply] = field(default_factory=deque)
    _summary_script: deque[Reply] = field(default_factory=deque)
    summary_calls: int = 0
    _memory_script: deque[Reply] = field(default_factory=deque)
    memory_calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    record: bool = True
    max_embedding_words: int | None = None  # /v1/embeddings refuses longer inputs (None: no limit)
    # Summaries a person can read (the demo's): the user's questions, one line each; tests keep the
    # default, whose lists say exactly which messages were folded.
    readable_summaries: bool = False
    # The provider's prompt cache, reported as usage's cached tokens; `simulate_cache = False` reports none.
    prompt_cache: PromptCache = field(default_factory=PromptCache)
    simulate_cache: bool = True

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def enqueue_summary(self, *replies: Reply) -> None:
        """Script answers to the gateway's own summarisation calls (kept apart from chat answers)."""
        with self._lock:
            self._summary_script.extend(replies)

    def enqueue_memory(self, *replies: Reply) -> None:
        """Script answers to the gateway's memory calls (extraction, resolution)."""
        with self._lock:
            self._memory_script.extend(replies)

    def summary_requests(self) -> list[Received]:
        """The gateway's summarisation calls received (each recorded as it arrives)."""
        with self._lock:
            return [r for r in self.received if summarisation_answer(r.body) is not None]

    def memory_requests(self) -> list[Received]:
        with self._lock:
            return [r for r in self.received if is_memory_call(r.body)]

    def next_reply(self, body: JSONObject) -> Reply:
        summary = summarisation_answer(body)
        memory = memory_answer(body) if summary is None else None
        if summary is not None and self.readable_summaries:
            summary = readable_summary(body)
        with self._lock:
            if memory is not None:
                self.memory_calls += 1
                return self._memory_script.popleft() if self._memory_script else Reply(content=memory)
            if summary is not None:
                self.summary_calls += 1
                return self._summary_script.popleft() if self._summary_script else Reply(content=summary)
            if self._script:
                return self._script.popleft()
        return Reply(content=default_answer(body))

    def last(self) -> Received:
        with self._lock:
            return self.received[-1]

    def measure(self, body: JSONObject, responses: bool = False) -> CacheUsage:
        """The prompt's real token count and the part of it the provider's cache already holds."""
        cache = self.prompt_cache
        if not self.simulate_cache:
            return CacheUsage(cache.count_responses(body) if responses else cache.count_chat(body), 0)
        if responses:
            return cache.openai_responses(body)
        if summarisation_answer(body) is not None:
            return cache.openai_chat(body, "summary")
        return cache.openai_chat(body, "memory" if is_memory_call(body) else "chat")

    def chat_requests(self) -> list[Received]:
        """Chat completions from clients, without the gateway's own summarisation calls."""
        with self._lock:
            return [
                r
                for r in self.received
                if r.path.endswith("/chat/completions")
                and summarisation_answer(r.body) is None
                and not is_memory_call(r.body)
            ]

    def last_chat(self) -> Received:
        return self.chat_requests()[-1]

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            ]
        )

    async def _remember(self, request: Request) -> JSONObject:
        raw = await request.body()
        body = orjson.loads(raw) if raw else {}
        if self.record:
            with self._lock:
                self.received.append(Received(request.url.path, dict(request.headers), body, raw))
        return body if isinstance(body, dict) else {}

    async def _models(self, request: Request) -> Response:
        await self._remember(request)
        data = {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}],
        }
        return Response(orjson.dumps(data), media_type="application/json")

    async def _embeddings(self, request: Request) -> Response:
        body = await self._remember(request)
        inputs = body.get("input")
        texts = inputs if isinstance(inputs, list) else [inputs]
        limit = self.max_embedding_words
        if limit is not None and any(len(str(t).split()) > limit for t in texts):
            # As a provider does (OpenAI: "maximum context length is 8192 tokens"); a word is at least a token.
            error = {"message": f"an input is longer than {limit} words", "type": "invalid_request_error"}
            return Response(orjson.dumps({"error": error}), status_code=400, media_type="application/json")
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(str(t)) % 7), 0.5, -0.25]}
            for i, t in enumerate(texts)
        ]
        out = {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
        return Response(orjson.dumps(out), media_type="application/json")

    async def _chat(self, request: Request) -> Response:
        body = await self._remember(request)
        reply = self.next_reply(body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return error_answer(reply)
        completion_id = f"chatcmpl-fake{next(self._ids)}"
        created = int(time.time())
        model = body.get("model") if isinstance(body.get("model"), str) else self.model
        usage = chat_usage(body, reply, self.measure(body))
        if body.get("stream") is True:
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and options.get("include_usage") is True
            frames = stream_frames(completion_id, created, str(model), reply, usage if with_usage else None)
            return StreamingResponse(self._paced(frames, reply), media_type="text/event-stream")
        message: JSONObject = {"role": "assistant", "content": reply.content, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in reply.tool_calls
            ]
        out = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(reply)}
            ],
            "usage": usage,
            "system_fingerprint": "fp_fake",
        }
        return Response(orjson.dumps(out), media_type="application/json")

    async def _responses(self, request: Request) -> Response:
        """OpenAI's Responses API, as a provider that serves it natively (OpenAI, vLLM) answers: the
        output items (responses_output), or the named events of a stream."""
        body = await self._remember(request)
        reply = self.next_reply({"messages": responses_messages(body.get("input"))})
        if reply.status != 200:
            return error_answer(reply)
        number = next(self._ids)
        output = responses_output(body, reply, number)
        words = len((reply.content or "").split())
        measured = self.measure(body, responses=True)
        response: JSONObject = {
            "id": f"resp_fake{number}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model") or self.model,
            "output": output,
            "usage": {
                "input_tokens": measured.prompt_tokens,
                "input_tokens_details": {"cached_tokens": measured.cached_tokens},
                "output_tokens": words + 1,
                "total_tokens": 0,
            },
            "previous_response_id": body.get("previous_response_id"),
            "store": body.get("store", True),
        }
        if body.get("stream") is not True:
            return Response(orjson.dumps(response), media_type="application/json")
        frames = responses_frames(response)
        return StreamingResponse(self._paced(frames, reply), media_type="text/event-stream")

    async def _paced(self, frames: list[bytes], reply: Reply) -> AsyncIterator[bytes]:
        try:
            for number, frame in enumerate(frames):
                if reply.break_after_chunks is not None and number >= reply.break_after_chunks:
                    raise ConnectionAbortedError("fake upstream breaks the stream on purpose")
                if reply.chunk_delay and number:
                    await asyncio.sleep(reply.chunk_delay)
                yield frame
        except (asyncio.CancelledError, GeneratorExit):
            with self._lock:
                self.disconnects += 1
            raise


_FOLDED = re.compile(r"folded: ([^\n]*)")
_RENDERED = re.compile(r"\[#(\d+) [^\]]*\] (\S*)")


def summarisation_answer(body: JSONObject) -> str | None:
    """Deterministic answers to the gateway's summarisation prompts, so tests can check exactly what was
    folded: a chunk summary lists each message it read as `#depth:first-word`, a merge lists the union of
    its two inputs' lists, in order."""
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return None
    system, user = messages[0], messages[-1]
    if not isinstance(system, dict) or not isinstance(user, dict):
        return None
    instruction, text = str(system.get("content") or ""), str(user.get("content") or "")
    if instruction.startswith(CHUNK_MARKER):
        entries = [f"#{depth}:{word}" for depth, word in _RENDERED.findall(text)]
    elif instruction.startswith((MERGE_MARKER, CONDENSE_MARKER)):
        entries = [entry for line in _FOLDED.findall(text) for entry in line.split()]
    else:
        return None
    return "## Key identifiers\nfolded: " + " ".join(entries)


_USER_LINE = re.compile(r"^\[#\d+ user[^\]]*\] (.+)$", re.MULTILINE)
_ASKED = re.compile(r"^- .+$", re.MULTILINE)


def readable_summary(body: JSONObject) -> str:
    """A stand-in summary a person can read: what the user asked, newest last, each cut at 60 characters
    (a chunk lists its user messages; a merge keeps its inputs' lines, the newest four). Much is lost,
    as in a real summary: what it drops, retrieval brings back."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    text = str(last.get("content") or "") if isinstance(last, dict) else ""
    lines = [f"- The user asked: {line.strip()[:60]}" for line in _USER_LINE.findall(text)]
    lines = lines or list(dict.fromkeys(_ASKED.findall(text)))
    return "## What the user has been asking\n" + "\n".join(lines[-4:])


def default_answer(body: JSONObject) -> str:
    messages = body.get("messages")
    last: JSON = None
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                last = message.get("content")
                break
    text = last if isinstance(last, str) else "your message"
    count = len(messages) if isinstance(messages, list) else 0
    return f"(fake model) I read {count} messages. You said: {text[:200]}"


__all__ = ["FakeUpstream", "Received", "Reply", "ToolCall", "default_answer", "summarisation_answer"]
