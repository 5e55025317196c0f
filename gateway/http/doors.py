"""The front doors at the HTTP edge: what differs between `/v1/chat/completions` and `/v1/messages`.

A door reads its API's request into the pipeline's chat form, adjusts the chat request for the upstream,
and writes the chat answer (JSON, stream, or error) back in its API's wire format. Everything between
(identify, ingest, build, forward, persist, jobs) is shared: `http/exchange.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import orjson

from gateway.config import UpstreamConfig
from gateway.errors import GatewayError
from gateway.http.errors import error_body
from gateway.inbound import messages_out
from gateway.inbound.messages_in import for_openai, to_chat
from gateway.inbound.messages_out import MessagesStream, message_from_chat
from gateway.pipeline.forward import StreamTranslator
from gateway.pipeline.validate import parse_chat_request, parse_json_object
from gateway.ports import ChatPayload, Headers, JSONObject


@dataclass(frozen=True, slots=True)
class Parsed:
    body: JSONObject  # the chat-completion body the pipeline works on
    raw: bytes  # its bytes (the client's own for chat completions)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # extra response headers


class Door(Protocol):
    def parse(self, raw: bytes) -> Parsed: ...

    def for_upstream(self, payload: ChatPayload, upstream: UpstreamConfig) -> ChatPayload: ...

    def upstream_headers(self, headers: Headers) -> Headers: ...

    def translator(self) -> StreamTranslator | None: ...

    def answer(self, status: int, body: bytes) -> tuple[int, bytes]:
        """A buffered upstream answer (or error body) in this API's shape, and the status to send."""
        ...

    def error(self, exc: GatewayError) -> bytes:
        """An error the gateway raised, in this API's shape."""
        ...


class ChatDoor:
    """`/v1/chat/completions`: the pipeline's own form; nothing is converted."""

    def parse(self, raw: bytes) -> Parsed:
        return Parsed(parse_chat_request(raw), raw)

    def for_upstream(self, payload: ChatPayload, upstream: UpstreamConfig) -> ChatPayload:
        return payload

    def upstream_headers(self, headers: Headers) -> Headers:
        return headers

    def translator(self) -> StreamTranslator | None:
        return None

    def answer(self, status: int, body: bytes) -> tuple[int, bytes]:
        return status, body

    def error(self, exc: GatewayError) -> bytes:
        return error_body(exc.message, exc.error_type, exc.param, exc.code)


_ANTHROPIC_HEADERS = ("anthropic-",)


class MessagesDoor:
    """`/v1/messages` (Anthropic Messages API) in front of a chat-completions upstream (one per request)."""

    def __init__(self) -> None:
        self.model = ""

    def parse(self, raw: bytes) -> Parsed:
        return self._parse(raw, count_only=False)

    def parse_for_count(self, raw: bytes) -> Parsed:
        """A `count_tokens` body: a Messages request without `max_tokens`."""
        return self._parse(raw, count_only=True)

    def _parse(self, raw: bytes, *, count_only: bool) -> Parsed:
        converted = to_chat(parse_json_object(raw), count_only=count_only)
        self.model = str(converted.body["model"])
        headers = []
        if converted.dropped:
            headers.append((b"x-gateway-dropped-params", ",".join(converted.dropped).encode()))
        return Parsed(converted.body, orjson.dumps(converted.body), headers)

    def for_upstream(self, payload: ChatPayload, upstream: UpstreamConfig) -> ChatPayload:
        # litellm reads thinking_blocks and cache_control (it speaks them to Anthropic); a plain
        # OpenAI-compatible server may refuse them.
        if upstream.is_openai_compatible:
            return ChatPayload(for_openai(payload.data))
        return payload

    def upstream_headers(self, headers: Headers) -> Headers:
        return [(k, v) for k, v in headers if not k.lower().startswith(_ANTHROPIC_HEADERS)]

    def translator(self) -> StreamTranslator | None:
        return MessagesStream(self.model)

    def answer(self, status: int, body: bytes) -> tuple[int, bytes]:
        if status >= 400:
            return status, messages_out.error_body(status, messages_out.error_message(body))
        try:
            completion = orjson.loads(body)
        except orjson.JSONDecodeError:
            completion = None
        if not isinstance(completion, dict):
            return 502, messages_out.error_body(502, "The upstream answered with a body that is not JSON.")
        return status, orjson.dumps(message_from_chat(completion, self.model))

    def error(self, exc: GatewayError) -> bytes:
        return messages_out.error_body(exc.status, exc.message)
