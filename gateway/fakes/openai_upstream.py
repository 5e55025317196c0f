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
from gateway.fakes.prompt_cache import CacheUsage, PromptCache
from gateway.jobs.prompts import CHUNK_MARKER, CONDENSE_MARKER, MERGE_MARKER
from gateway.ports import JSON, JSONObject


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str
    id: str = "call_fake_1"


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer. Defaults give a normal, complete answer."""

    content: str | None = "Hello from the fake upstream."
    tool_calls: tuple[ToolCall, ...] = ()
    status: int = 200
    error: JSONObject | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    break_after_chunks: int | None = None
    finish_reason: str | None = None
    reasoning: str | None = None  # /v1/responses only: a reasoning item before the answer


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
            return _error_answer(reply)
        completion_id = f"chatcmpl-fake{next(self._ids)}"
        created = int(time.time())
        model = body.get("model") if isinstance(body.get("model"), str) else self.model
        usage = _usage(body, reply, self.measure(body))
        if body.get("stream") is True:
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and options.get("include_usage") is True
            frames = _stream_frames(completion_id, created, str(model), reply, usage if with_usage else None)
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
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(reply)}],
            "usage": usage,
            "system_fingerprint": "fp_fake",
        }
        return Response(orjson.dumps(out), media_type="application/json")

    async def _responses(self, request: Request) -> Response:
        """OpenAI's Responses API, as a provider that serves it natively (OpenAI, vLLM) answers: the
        output items (a reasoning item, a web_search_call when the request offers web search, the
        message, function calls), or the named events of a stream."""
        body = await self._remember(request)
        reply = self.next_reply({"messages": _responses_messages(body.get("input"))})
        if reply.status != 200:
            return _error_answer(reply)
        number = next(self._ids)
        output: list[JSON] = []
        if reply.reasoning:
            output.append(
                {
                    "type": "reasoning",
                    "id": f"rs_fake{number}",
                    "summary": [{"type": "summary_text", "text": reply.reasoning}],
                    "encrypted_content": f"enc:{reply.reasoning}",
                }
            )
        tools = body.get("tools")
        if isinstance(tools, list) and any(
            isinstance(t, dict) and t.get("type") == "web_search" for t in tools
        ):
            output.append(
                {
                    "type": "web_search_call",
                    "id": f"ws_fake{number}",
                    "status": "completed",
                    "action": {"type": "search", "query": "fake"},
                }
            )
        if reply.content:
            part: JSONObject = {
                "type": "output_text",
                "text": reply.content,
                "annotations": [],
                "logprobs": [],
            }
            output.append(
                {
                    "type": "message",
                    "id": f"msg_fake{number}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [part],
                }
            )
        for index, call in enumerate(reply.tool_calls):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_fake{number}_{index}",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                    "status": "completed",
                }
            )
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
        frames = _responses_frames(response)
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


def _finish(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _usage(body: JSONObject, reply: Reply, measured: CacheUsage | None = None) -> JSONObject:
    """Chat usage; without `measured` the prompt is estimated as its JSON bytes / 4 (the fast fake's way)."""
    completion = len((reply.content or "").split()) + sum(len(c.arguments) // 4 for c in reply.tool_calls)
    if measured is None:
        prompt = len(orjson.dumps(body.get("messages"))) // 4
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    prompt = measured.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": measured.cached_tokens},
    }


def _stream_frames(cid: str, created: int, model: str, reply: Reply, usage: JSONObject | None) -> list[bytes]:
    def chunk(delta: JSONObject, finish: str | None = None) -> bytes:
        body: JSONObject = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            body["usage"] = None
        return b"data: " + orjson.dumps(body) + b"\n\n"

    frames = [chunk({"role": "assistant", "content": "", "refusal": None})]
    if reply.content:
        words = reply.content.split(" ")
        frames += [chunk({"content": w if i == 0 else " " + w}) for i, w in enumerate(words)]
    for position, call in enumerate(reply.tool_calls):
        head: JSONObject = {
            "index": position,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        frames.append(chunk({"tool_calls": [head]}))
        for start in range(0, len(call.arguments), 8):
            piece = call.arguments[start : start + 8]
            frames.append(chunk({"tool_calls": [{"index": position, "function": {"arguments": piece}}]}))
    frames.append(chunk({}, _finish(reply)))
    if usage is not None:
        tail: JSONObject = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [],
            "usage": usage,
        }
        frames.append(b"data: " + orjson.dumps(tail) + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return frames


def _error_answer(reply: Reply) -> Response:
    """A scripted failure in OpenAI's error shape (the same for chat completions and responses)."""
    error = reply.error or {
        "message": "fake upstream error",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    return Response(orjson.dumps({"error": error}), status_code=reply.status, media_type="application/json")


def _responses_messages(items: JSON) -> list[JSON]:
    """The user messages of a Responses input, for the default echo answer."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[JSON] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            out.append({"role": "user", "content": content})
    return out


def _responses_frames(response: JSONObject) -> list[bytes]:
    """The event sequence OpenAI streams for a finished `response` (text in words, arguments in pieces)."""
    counter = itertools.count()

    def event(kind: str, **data: JSON) -> bytes:
        payload = {"type": kind, "sequence_number": next(counter), **data}
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    frames = [event("response.created", response=started), event("response.in_progress", response=started)]
    output = response["output"]
    assert isinstance(output, list)
    for index, item in enumerate(output):
        assert isinstance(item, dict)
        if item["type"] == "message":
            frames.append(
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
            )
            part = item["content"][0]  # type: ignore[index]
            assert isinstance(part, dict)
            ids: dict[str, JSON] = {"item_id": item["id"], "output_index": index, "content_index": 0}
            frames.append(event("response.content_part.added", **ids, part={**part, "text": ""}))
            for position, word in enumerate(str(part["text"]).split(" ")):
                frames.append(
                    event(
                        "response.output_text.delta",
                        **ids,
                        delta=word if position == 0 else " " + word,
                        logprobs=[],
                    )
                )
            frames.append(event("response.output_text.done", **ids, text=part["text"], logprobs=[]))
            frames.append(event("response.content_part.done", **ids, part=part))
        elif item["type"] == "function_call":
            frames.append(
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
            )
            arguments = str(item["arguments"])
            for start in range(0, len(arguments), 8):
                frames.append(
                    event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=arguments[start : start + 8],
                    )
                )
            frames.append(
                event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=arguments,
                )
            )
        else:
            frames.append(event("response.output_item.added", output_index=index, item=item))
        frames.append(event("response.output_item.done", output_index=index, item=item))
    frames.append(event("response.completed", response=response))
    return frames
