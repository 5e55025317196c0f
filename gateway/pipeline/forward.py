"""Forward step: ask upstream for usage when metering wants it, add the provider's prompt-cache hints,
and relay the answer frame by frame.

Cache hints (design.md section 14): an OpenAI-compatible upstream gets a `prompt_cache_key` per
conversation; an Anthropic one (natively or through litellm) gets `cache_control` breakpoints at the
rebuilt prompt's `cache_breaks`, within Anthropic's limit of four with the client's own.

`relay_stream` yields the provider's SSE frames unchanged (minus the usage chunk the gateway added on
its own), tees them into a `ChatAccumulator`, and turns an upstream failure mid-stream into the in-band
`data: {"error": ...}` frame that OpenAI clients raise on.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Protocol

import orjson

from gateway.config import UpstreamConfig
from gateway.errors import UpstreamError
from gateway.pipeline.call import ChatCall, ChatOutcome, OutcomeStatus
from gateway.pipeline.stream import ChatAccumulator, FrameSplitter, frame_data, is_usage_only, parse_chunk
from gateway.ports import JSON, ChatPayload, JSONObject, UpstreamResponse

# OpenAI caches prompts from this many tokens on; a shorter one has nothing to route to a cache.
OPENAI_CACHE_MIN_TOKENS = 1024
# Anthropic caches the prompt up to each block marked with cache_control, four marks at most per request.
MAX_CACHE_BREAKPOINTS = 4
# Blocks Anthropic refuses a cache_control on (an empty text block is refused too).
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def with_stream_usage(call: ChatCall, payload: ChatPayload) -> tuple[ChatPayload, bool]:
    """Ask for the usage chunk if the client did not; returns whether the gateway must strip it."""
    if not call.stream or call.client_wants_usage:
        return payload, False
    options = payload.data.get("stream_options")
    merged: JSONObject = {**options} if isinstance(options, dict) else {}
    merged["include_usage"] = True
    return ChatPayload({**payload.data, "stream_options": merged}), True


def conversation_cache_key(tenant: str, conversation_id: str) -> str:
    """One conversation's `prompt_cache_key`: a hash, so the provider never learns the stored id."""
    return "cg-" + hashlib.sha256(f"{tenant}\x00{conversation_id}".encode()).hexdigest()[:32]


def prompt_cache_key(call: ChatCall, upstream: UpstreamConfig, request: JSONObject) -> str | None:
    """The `prompt_cache_key` to add to `request` for an OpenAI-compatible upstream; None where the
    setting is off, the client named its own, the call belongs to no stored conversation, or the prompt
    is too short for OpenAI to cache (its bytes then stay the client's own)."""
    state = call.state
    if not (upstream.is_openai_compatible and upstream.prompt_cache_key) or state.conversation_id is None:
        return None
    if "prompt_cache_key" in request:
        return None
    if state.sent_tokens is not None and state.sent_tokens < OPENAI_CACHE_MIN_TOKENS:
        return None
    return conversation_cache_key(call.tenant, state.conversation_id)


def with_field(raw: bytes, name: str, value: JSON) -> bytes:
    """`raw` (one JSON object) with one more field before its closing brace: every byte sent stays."""
    end = raw.rfind(b"}")
    head = raw[:end]
    comma = b"" if head.rstrip().endswith(b"{") else b","
    return head + comma + orjson.dumps(name) + b":" + orjson.dumps(value) + raw[end:]


def with_cache_hints(call: ChatCall, payload: ChatPayload, upstream: UpstreamConfig) -> ChatPayload:
    """A chat request with the upstream's prompt-cache hints: `prompt_cache_key` for an OpenAI-compatible
    upstream (spliced into the client's bytes when they go out unchanged), breakpoints for Anthropic
    through litellm (only on a rebuilt prompt: the client's own request keeps its own marks)."""
    key = prompt_cache_key(call, upstream, payload.data)
    if key is not None:
        data = {**payload.data, "prompt_cache_key": key}
        raw = with_field(payload.raw, "prompt_cache_key", key) if payload.raw is not None else None
        return ChatPayload(data, raw)
    if upstream.provider == "anthropic" and payload.raw is None and call.state.cache_breaks:
        return ChatPayload(chat_with_breakpoints(payload.data, call.state.cache_breaks))
    return payload


def cache_marks(client: Sequence[tuple[int, JSON]], spots: Sequence[int]) -> dict[int, JSONObject]:
    """The cache_control to add at `spots` (positions in the request's block order, tools then system
    then messages, the most wanted first) beside the client's marks (`client`: position, value).

    At most four marks in all, none where the client marked already, and a one-hour ttl where a
    one-hour mark of the client's follows (Anthropic refuses a longer ttl after a shorter one).
    """
    taken = {position for position, _ in client}
    room = MAX_CACHE_BREAKPOINTS - len(client)
    marks: dict[int, JSONObject] = {}
    for spot in spots:
        if room <= 0:
            break
        if spot in taken or spot in marks:
            continue
        hour = any(p > spot and isinstance(v, dict) and v.get("ttl") == "1h" for p, v in client)
        marks[spot] = {"type": "ephemeral", "ttl": "1h"} if hour else {"type": "ephemeral"}
        room -= 1
    return marks


def markable(block: JSON) -> bool:
    """Whether Anthropic takes a cache_control on this block."""
    if not isinstance(block, dict) or block.get("type") in _UNMARKABLE:
        return False
    return not (block.get("type") == "text" and not block.get("text"))


def _chat_blocks(body: JSONObject) -> Iterator[JSONObject]:
    """The dicts of a chat body that litellm reads a cache_control from, in Anthropic's order."""
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict):
            yield tool
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        yield message
        for key in ("content", "tool_calls"):
            value = message.get(key)
            yield from (v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


def _chat_spot(message: JSON) -> JSONObject | None:
    """Where litellm puts the cache_control that marks a chat message's last Anthropic block."""
    if not isinstance(message, dict):
        return None
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[-1], dict):
        return calls[-1]  # the tool_use blocks come after the text
    content = message.get("content")
    if message.get("role") == "tool" or (isinstance(content, str) and content):
        return message  # litellm reads a message-level mark for string content and tool results
    if isinstance(content, list):
        part = next((p for p in reversed(content) if markable(p)), None)
        return part if isinstance(part, dict) else None
    return None


def chat_with_breakpoints(body: JSONObject, breaks: Sequence[int]) -> JSONObject:
    """A chat body for litellm's Anthropic path with the gateway's breakpoints at `breaks` (indices into
    its messages); the dicts it shares with the stored messages are copied, never changed."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body
    order = list(_chat_blocks(body))
    position = {id(d): n for n, d in enumerate(order)}
    client = [
        (n, d["cache_control"]) for n, d in enumerate(order) if isinstance(d.get("cache_control"), dict)
    ]
    wanted = [
        (i, _chat_spot(messages[i])) for i in sorted(set(breaks), reverse=True) if 0 <= i < len(messages)
    ]
    spots = {position[id(spot)]: i for i, spot in wanted if spot is not None}
    marks = cache_marks(client, list(spots))
    if not marks:
        return body
    out = list(messages)
    for spot, mark in marks.items():
        index = spots[spot]
        out[index] = _marked(out[index], order[spot], mark)
    return {**body, "messages": out}


def _marked(message: JSON, spot: JSONObject, mark: JSONObject) -> JSON:
    assert isinstance(message, dict)
    if spot is message:
        return {**message, "cache_control": mark}
    copy: JSONObject = dict(message)
    for key in ("content", "tool_calls"):
        value = copy.get(key)
        if isinstance(value, list):
            copy[key] = [{**v, "cache_control": mark} if v is spot else v for v in value]
    return copy


def error_frame(message: str, error_type: str, code: str | None) -> bytes:
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


class StreamTranslator(Protocol):
    """Turns chat-completion chunks into another API's stream (another front door's wire format)."""

    def feed(self, chunk: JSONObject) -> list[bytes]: ...

    def done(self) -> list[bytes]:
        """At `[DONE]`: the frames that end the stream."""
        ...

    def failed(self, message: str, error_type: str, code: str | None) -> bytes:
        """The in-band error frame for an upstream failure mid-stream."""
        ...


class StreamRelay:
    """One upstream SSE stream on its way to the client; `outcome()` describes how it went.

    `before_done` runs before the `[DONE]` frame is released: a client that sends its next request as
    soon as it sees `[DONE]` then finds this answer already stored (thin mode relies on it). With a
    `translator`, the client gets its frames instead of the chat chunks (the accumulator still reads
    the chunks, so what is stored is the same whichever door the request came through).
    """

    def __init__(
        self,
        response: UpstreamResponse,
        *,
        strip_usage: bool,
        before_done: Callable[[ChatOutcome], Awaitable[None]] | None = None,
        translator: StreamTranslator | None = None,
    ) -> None:
        self._response = response
        self._strip_usage = strip_usage
        self._before_done = before_done
        self._translator = translator
        self._chunk: JSONObject | None = None  # the last frame's parsed chunk (None: not a chunk)
        self.accumulator = ChatAccumulator()
        self._error: str | None = None

    async def frames(self) -> AsyncIterator[bytes]:
        splitter = FrameSplitter()
        accumulator = self.accumulator
        try:
            async for chunk in self._response.body:
                for frame in splitter.feed(chunk):
                    if not self._keep(frame, accumulator):
                        continue
                    if accumulator.saw_done and self._before_done is not None:
                        hook, self._before_done = self._before_done, None
                        await hook(self.outcome(200, disconnected=False))
                    if self._translator is None:
                        yield frame
                    elif accumulator.saw_done:
                        for out in self._translator.done():
                            yield out
                    elif self._chunk is not None:
                        for out in self._translator.feed(self._chunk):
                            yield out
        except UpstreamError as exc:
            self._error = exc.message
            yield self._failed(exc.message, exc.error_type, exc.code)
            return
        rest = splitter.rest()
        if rest.strip() and self._translator is None:
            yield rest
        if not accumulator.saw_done and not accumulator.finished:
            self._error = "upstream stream ended before the answer was complete"
            yield self._failed(self._error, "upstream_error", "upstream_stream_truncated")

    def _failed(self, message: str, error_type: str, code: str | None) -> bytes:
        if self._translator is not None:
            return self._translator.failed(message, error_type, code)
        return error_frame(message, error_type, code)

    def _keep(self, frame: bytes, accumulator: ChatAccumulator) -> bool:
        self._chunk = None
        data = frame_data(frame)
        if data is None:
            return True
        if data == b"[DONE]":
            accumulator.saw_done = True
            return True
        chunk = parse_chunk(data)
        if chunk is None:
            return True
        self._chunk = chunk
        if isinstance(chunk.get("error"), dict):
            self._error = orjson.dumps(chunk["error"]).decode()
        accumulator.add(chunk)
        return not (self._strip_usage and is_usage_only(chunk))

    def outcome(self, http_status: int, *, disconnected: bool) -> ChatOutcome:
        accumulator = self.accumulator
        # A client that hangs up right after `[DONE]` (OpenAI's SDK does) had the whole answer.
        disconnected = disconnected and not accumulator.saw_done
        complete = accumulator.finished and self._error is None and not disconnected
        has_any = bool(accumulator.choices())
        status: OutcomeStatus = "complete" if complete else ("partial" if has_any else "failed")
        error = self._error or ("client disconnected" if disconnected else None)
        return ChatOutcome(
            status=status,
            http_status=http_status,
            choices=accumulator.choices(),
            usage=accumulator.usage,
            error=error,
            model=accumulator.model,
            client_disconnected=disconnected,
        )


def buffered_outcome(http_status: int, body: bytes) -> ChatOutcome:
    """The outcome of a non-streamed answer (or of an upstream error body)."""
    parsed = parse_chunk(body)
    if http_status >= 400 or parsed is None:
        error = body.decode("utf-8", "replace")[:2000]
        return ChatOutcome(status="failed", http_status=http_status, error=error)
    choices = parsed.get("choices")
    usage = parsed.get("usage")
    model = parsed.get("model")
    return ChatOutcome(
        status="complete",
        http_status=http_status,
        choices=[c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else [],
        usage=usage if isinstance(usage, dict) else None,
        model=model if isinstance(model, str) else None,
    )
