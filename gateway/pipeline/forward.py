"""Forward step: ask upstream for usage when metering wants it, and relay the answer frame by frame.

`relay_stream` yields the provider's SSE frames unchanged (minus the usage chunk the gateway added on
its own), tees them into a `ChatAccumulator`, and turns an upstream failure mid-stream into the in-band
`data: {"error": ...}` frame that OpenAI clients raise on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import orjson

from gateway.errors import UpstreamError
from gateway.pipeline.call import ChatCall, ChatOutcome, OutcomeStatus
from gateway.pipeline.stream import ChatAccumulator, FrameSplitter, frame_data, is_usage_only, parse_chunk
from gateway.ports import ChatPayload, JSONObject, UpstreamResponse


def with_stream_usage(call: ChatCall, payload: ChatPayload) -> tuple[ChatPayload, bool]:
    """Ask for the usage chunk if the client did not; returns whether the gateway must strip it."""
    if not call.stream or call.client_wants_usage:
        return payload, False
    options = payload.data.get("stream_options")
    merged: JSONObject = {**options} if isinstance(options, dict) else {}
    merged["include_usage"] = True
    return ChatPayload({**payload.data, "stream_options": merged}), True


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
