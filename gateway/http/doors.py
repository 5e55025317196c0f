"""The front doors at the HTTP edge: what differs between `/v1/chat/completions` and `/v1/messages`.

A door reads its API's request into the pipeline's chat form, sends the (possibly rebuilt) request to
the upstream in whichever protocol that upstream speaks, relays or converts the answer back into its
API's wire format, and reads the answer into the chat outcome the store keeps. Everything between
(identify, ingest, build, persist, jobs) is shared: `http/exchange.py`. One door object per request.

  ChatDoor            chat completions in, chat completions upstream: nothing converted
  MessagesDoor        Anthropic in, chat completions upstream (OpenAI-compatible, or litellm): converted
                      both ways, streams included
  NativeMessagesDoor  Anthropic in, Anthropic upstream: forwarded natively, read back for the store
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import orjson

from gateway.errors import GatewayError, InvalidRequest
from gateway.http.errors import error_body
from gateway.inbound import messages_out, responses_in
from gateway.inbound.chat_form import plain_chat
from gateway.inbound.messages_in import to_chat
from gateway.inbound.messages_native import NativeRelay, outcome_of, to_messages
from gateway.inbound.messages_out import MessagesStream, message_from_chat
from gateway.inbound.responses_native import NativeResponsesRelay, to_responses
from gateway.inbound.responses_native import outcome_of as native_outcome
from gateway.inbound.responses_out import ResponsesStream, Shell, response_from_chat
from gateway.pipeline.body_memo import BodyMemo
from gateway.pipeline.call import ChatCall, ChatOutcome
from gateway.pipeline.forward import (
    StreamRelay,
    StreamTranslator,
    buffered_outcome,
    prompt_cache_key,
    with_cache_hints,
    with_field,
    with_stream_usage,
)
from gateway.pipeline.identify import PARENT_HEADER
from gateway.pipeline.stream import parse_chunk
from gateway.pipeline.validate import parse_chat_request, parse_json_object
from gateway.ports import ChatPayload, Headers, JSONObject, MessagesUpstream, ResponseStore, UpstreamResponse
from gateway.records import StoredResponse
from gateway.tenants import Tenant

Persist = Callable[[ChatOutcome], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Parsed:
    body: JSONObject  # the chat-completion body the pipeline works on
    raw: bytes  # its bytes (the client's own for chat completions)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # extra response headers


class Relay(Protocol):
    def frames(self) -> AsyncIterator[bytes]: ...

    def outcome(self, http_status: int, *, disconnected: bool) -> ChatOutcome: ...


class Door(Protocol):
    route: str  # the path it serves (the `route` label of its metrics)
    # Whether the model's memory_search calls can be answered on this door (a chat-completions upstream).
    answers_tools: bool

    @property
    def persists_first(self) -> bool:
        """The answer must be stored before the client sees its end (the client may chain from it)."""
        ...

    async def parse(self, raw: bytes) -> Parsed: ...

    async def stored(self, call: ChatCall, outcome: ChatOutcome) -> None:
        """After the answer was stored, before the client sees its end (persists_first doors)."""
        ...

    def upstream_headers(self, headers: Headers) -> Headers: ...

    async def send(
        self, tenant: Tenant, call: ChatCall, payload: ChatPayload, key: str | None
    ) -> UpstreamResponse:
        """The request to the upstream, in the protocol it speaks."""
        ...

    async def send_again(
        self, tenant: Tenant, call: ChatCall, body: JSONObject, key: str | None
    ) -> UpstreamResponse:
        """A follow-up chat request of the memory tool loop."""
        ...

    @property
    def sent(self) -> JSONObject:
        """The chat body `send` sent (what the tool loop continues from)."""
        ...

    def relay(self, response: UpstreamResponse, before_done: Persist | None) -> Relay: ...

    def outcome(self, status: int, body: bytes) -> ChatOutcome:
        """A buffered answer (or error body) read into the chat outcome the store keeps."""
        ...

    def answer(self, status: int, body: bytes) -> tuple[int, bytes]:
        """A buffered upstream answer (or error body) in this API's shape, and the status to send."""
        ...

    def error(self, exc: GatewayError) -> bytes:
        """An error the gateway raised, in this API's shape."""
        ...


class _ChatUpstream:
    """Doors whose upstream takes chat completions (the tenant's `Upstream`)."""

    answers_tools = True
    persists_first = False
    translates = False  # whether `translator()` turns the chat stream into another API's events

    def __init__(self) -> None:
        self._strip_usage = False
        self._sent: JSONObject = {}

    async def stored(self, call: ChatCall, outcome: ChatOutcome) -> None:
        return None

    def for_upstream(self, payload: ChatPayload, tenant: Tenant) -> ChatPayload:
        return payload

    def translator(self) -> StreamTranslator | None:
        return None

    async def send(
        self, tenant: Tenant, call: ChatCall, payload: ChatPayload, key: str | None
    ) -> UpstreamResponse:
        if tenant.config.upstream.request_stream_usage:
            payload, strip = with_stream_usage(call, payload)
            self._strip_usage = strip and not self.translates  # a translator reads the usage chunk itself
        payload = with_cache_hints(call, self.for_upstream(payload, tenant), tenant.config.upstream)
        self._sent = payload.data
        return await tenant.upstream.chat_completions(payload, call.headers, key)

    async def send_again(
        self, tenant: Tenant, call: ChatCall, body: JSONObject, key: str | None
    ) -> UpstreamResponse:
        return await tenant.upstream.chat_completions(
            self.for_upstream(ChatPayload(body), tenant), call.headers, key
        )

    @property
    def sent(self) -> JSONObject:
        return self._sent

    def relay(self, response: UpstreamResponse, before_done: Persist | None) -> Relay:
        return StreamRelay(
            response, strip_usage=self._strip_usage, before_done=before_done, translator=self.translator()
        )

    def outcome(self, status: int, body: bytes) -> ChatOutcome:
        return buffered_outcome(status, body)


class ChatDoor(_ChatUpstream):
    """`/v1/chat/completions`: the pipeline's own form; nothing is converted."""

    route = "/v1/chat/completions"

    def __init__(self, bodies: BodyMemo | None = None) -> None:
        super().__init__()
        self._bodies = bodies

    async def parse(self, raw: bytes) -> Parsed:
        return Parsed(parse_chat_request(raw, self._bodies), raw)

    def upstream_headers(self, headers: Headers) -> Headers:
        return headers

    def answer(self, status: int, body: bytes) -> tuple[int, bytes]:
        return status, body

    def error(self, exc: GatewayError) -> bytes:
        return error_body(exc.message, exc.error_type, exc.param, exc.code)


class _AnthropicDoor:
    """What both `/v1/messages` doors share: Anthropic's request checks, headers and error shape."""

    route = "/v1/messages"
    persists_first = False
    native = False

    def __init__(self) -> None:
        super().__init__()
        self.model = ""
        self.original: JSONObject = {}

    async def parse(self, raw: bytes) -> Parsed:
        return self._parse(raw, count_only=False)

    async def stored(self, call: ChatCall, outcome: ChatOutcome) -> None:
        return None

    def parse_for_count(self, raw: bytes) -> Parsed:
        """A `count_tokens` body: a Messages request without `max_tokens`."""
        return self._parse(raw, count_only=True)

    def _parse(self, raw: bytes, *, count_only: bool) -> Parsed:
        self.original = parse_json_object(raw)
        converted = to_chat(self.original, count_only=count_only)
        self.model = str(converted.body["model"])
        headers = []
        if converted.dropped and not self.native:
            headers.append((b"x-gateway-dropped-params", ",".join(converted.dropped).encode()))
        return Parsed(converted.body, orjson.dumps(converted.body), headers)

    def error(self, exc: GatewayError) -> bytes:
        return messages_out.error_body(exc.status, exc.message)


class MessagesDoor(_AnthropicDoor, _ChatUpstream):
    """`/v1/messages` in front of a chat-completions upstream."""

    translates = True

    def for_upstream(self, payload: ChatPayload, tenant: Tenant) -> ChatPayload:
        # litellm reads thinking_blocks and cache_control (it speaks them to Anthropic); a plain
        # OpenAI-compatible server may refuse them.
        if tenant.config.upstream.is_openai_compatible:
            return ChatPayload(plain_chat(payload.data))
        return payload

    def upstream_headers(self, headers: Headers) -> Headers:
        return [(k, v) for k, v in headers if not k.lower().startswith("anthropic-")]

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


class NativeMessagesDoor(_AnthropicDoor):
    """`/v1/messages` to an Anthropic upstream: the client's bytes when the pipeline changed nothing."""

    answers_tools = False  # the memory tool loop speaks chat completions
    native = True

    def __init__(self, upstream: MessagesUpstream) -> None:
        super().__init__()
        self._upstream = upstream
        self._raw = b""

    def _parse(self, raw: bytes, *, count_only: bool) -> Parsed:
        self._raw = raw
        return super()._parse(raw, count_only=count_only)

    def upstream_headers(self, headers: Headers) -> Headers:
        return headers  # anthropic-version and anthropic-beta are the provider's own

    async def send(
        self, tenant: Tenant, call: ChatCall, payload: ChatPayload, key: str | None
    ) -> UpstreamResponse:
        if payload.raw is not None:
            body = self._raw  # nothing rewritten: the client's own bytes
        else:
            body = orjson.dumps(to_messages(payload.data, self.original, call.state.cache_breaks))
        return await self._upstream.messages(body, call.headers, key)

    async def send_again(
        self, tenant: Tenant, call: ChatCall, body: JSONObject, key: str | None
    ) -> UpstreamResponse:
        raise NotImplementedError("the native Messages door does not run the memory tool loop")

    @property
    def sent(self) -> JSONObject:
        return {}

    def relay(self, response: UpstreamResponse, before_done: Persist | None) -> Relay:
        return NativeRelay(response, before_done)

    def outcome(self, status: int, body: bytes) -> ChatOutcome:
        return outcome_of(status, body)

    def answer(self, status: int, body: bytes) -> tuple[int, bytes]:
        return status, body  # Anthropic's own answer and error bodies


class ResponsesDoor(_ChatUpstream):
    """`/v1/responses` (OpenAI Responses API) in front of a chat-completions upstream.

    A `previous_response_id` names a stored answer; the request then continues from it as a thin-mode
    call (`X-Parent-Message-Id`), so the history comes from the gateway's own tree, whatever the
    upstream. With `store` (the default) the response is saved before the client sees its end.
    """

    route = "/v1/responses"
    translates = True

    def __init__(self, responses: ResponseStore, tenant: str, request_id: str) -> None:
        super().__init__()
        self._responses = responses
        self._tenant = tenant
        self._request_id = request_id
        self._shell: Shell | None = None
        self._stream: ResponsesStream | None = None
        self._answer: JSONObject | None = None
        self._parent: str | None = None

    @property
    def persists_first(self) -> bool:  # type: ignore[override]  # a class attribute in the base
        return self._shell is not None and self._shell.store

    async def parse(self, raw: bytes) -> Parsed:
        request = parse_json_object(raw)
        converted = responses_in.to_chat(request)
        if converted.previous_response_id is not None:
            self._parent = await self._previous(converted.previous_response_id)
        self._shell = Shell.of(f"resp_{self._request_id}", request, converted.store)
        headers = []
        if converted.dropped:
            headers.append((b"x-gateway-dropped-params", ",".join(converted.dropped).encode()))
        return Parsed(converted.body, orjson.dumps(converted.body), headers)

    async def _previous(self, response_id: str) -> str:
        previous = await self._responses.get_response(self._tenant, response_id)
        if previous is None:
            raise InvalidRequest(
                f"Previous response with id '{response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        if previous.answer_message_id is None:
            raise InvalidRequest(
                f"Previous response '{response_id}' has no stored answer to continue from.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return previous.answer_message_id

    @property
    def shell(self) -> Shell:
        assert self._shell is not None, "parse() first"
        return self._shell

    def upstream_headers(self, headers: Headers) -> Headers:
        if self._parent is None:
            return headers
        kept = [(k, v) for k, v in headers if k.lower() != PARENT_HEADER]
        return [*kept, (PARENT_HEADER, self._parent)]  # the chain continues from the stored answer

    def for_upstream(self, payload: ChatPayload, tenant: Tenant) -> ChatPayload:
        return ChatPayload(plain_chat(payload.data))

    def translator(self) -> StreamTranslator | None:
        if self._stream is None:
            self._stream = ResponsesStream(self.shell)
        return self._stream

    def answer(self, status: int, body: bytes) -> tuple[int, bytes]:
        if status >= 400:
            return status, body  # OpenAI's error shape already
        try:
            completion = orjson.loads(body)
        except orjson.JSONDecodeError:
            completion = None
        if not isinstance(completion, dict):
            return 502, error_body("The upstream answered with a body that is not JSON.", "upstream_error")
        self._answer = response_from_chat(completion, self.shell)
        return status, orjson.dumps(self._answer)

    async def stored(self, call: ChatCall, outcome: ChatOutcome) -> None:
        body = self._stream.finish() if self._stream is not None else self._answer
        if body is None or outcome.status == "failed" or call.state.conversation_deleted:
            return
        await self._responses.save_response(
            StoredResponse(
                id=self.shell.id,
                tenant=self._tenant,
                conversation_id=call.state.conversation_id,
                answer_message_id=call.state.answer_id,
                body=body,
                created_at=datetime.now(UTC),
            )
        )

    def error(self, exc: GatewayError) -> bytes:
        return error_body(exc.message, exc.error_type, exc.param, exc.code)


class NativeResponsesDoor(ResponsesDoor):
    """`/v1/responses` to an upstream serving the Responses API (`upstream.responses: native`): the
    client's bytes when nothing is rewritten, the provider's answer and response ids as it sent them."""

    answers_tools = False  # the memory tool loop speaks chat completions
    translates = False

    def __init__(self, responses: ResponseStore, tenant: str, request_id: str) -> None:
        super().__init__(responses, tenant, request_id)
        self._raw = b""
        self._original: JSONObject = {}
        self._relay: NativeResponsesRelay | None = None
        self._body: JSONObject | None = None

    async def parse(self, raw: bytes) -> Parsed:
        self._raw = raw
        self._original = parse_json_object(raw)
        converted = responses_in.to_chat(self._original, native=True)
        previous = converted.previous_response_id
        if previous is not None:
            stored = await self._responses.get_response(self._tenant, previous)
            # One the gateway never saw (made at the provider directly) is the provider's to resolve.
            if stored is not None and stored.answer_message_id is not None:
                self._parent = stored.answer_message_id
        self._shell = Shell.of("", self._original, converted.store)
        return Parsed(converted.body, orjson.dumps(converted.body))

    async def send(
        self, tenant: Tenant, call: ChatCall, payload: ChatPayload, key: str | None
    ) -> UpstreamResponse:
        if payload.raw is not None:
            body = self._raw  # nothing rewritten: the client's own bytes
        else:
            body = orjson.dumps(to_responses(payload.data, self._original))
        cache_key = prompt_cache_key(call, tenant.config.upstream, self._original)
        if cache_key is not None:
            body = with_field(body, "prompt_cache_key", cache_key)
        headers = [*call.headers, ("content-type", "application/json"), ("accept-encoding", "identity")]
        return await tenant.upstream.forward("POST", "/responses", "", headers, body, key)

    def relay(self, response: UpstreamResponse, before_done: Persist | None) -> Relay:
        self._relay = NativeResponsesRelay(response, before_done)
        return self._relay

    def outcome(self, status: int, body: bytes) -> ChatOutcome:
        parsed = parse_chunk(body) if status < 400 else None
        self._body = parsed
        return native_outcome(status, body)

    def answer(self, status: int, body: bytes) -> tuple[int, bytes]:
        return status, body  # the provider's own answer and error bodies

    async def stored(self, call: ChatCall, outcome: ChatOutcome) -> None:
        body = self._relay.final if self._relay is not None else self._body
        response_id = body.get("id") if body is not None else None
        if body is None or not isinstance(response_id, str) or outcome.status == "failed":
            return
        if call.state.conversation_deleted:  # deleted while it answered: the answer is kept nowhere
            return
        await self._responses.save_response(
            StoredResponse(
                id=response_id,
                tenant=self._tenant,
                conversation_id=call.state.conversation_id,
                answer_message_id=call.state.answer_id,
                body=body,
                created_at=datetime.now(UTC),
            )
        )
