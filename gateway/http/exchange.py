"""One chat exchange through the pipeline, whichever front door it came in by.

read the door's request -> prepare (identify, ingest, build) -> upstream -> relay or buffer the answer
(the memory tool loop answered here) -> persist. The door converts on the way in and out; the pipeline
sees chat completions only, so every door gets the same tree, context and stored answers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError, PayloadTooLarge, UpstreamError
from gateway.http.doors import Door, MessagesDoor
from gateway.http.headers import to_client, to_upstream
from gateway.http.streaming import RelayResponse
from gateway.memory.agentic import ToolLoop
from gateway.memory.scope import incognito
from gateway.memory.tool_stream import ToolStream
from gateway.pipeline.call import ChatCall, ChatOutcome
from gateway.pipeline.forward import buffered_outcome
from gateway.ports import ChatPayload, JSONObject, Span, TraceValue, UpstreamResponse
from gateway.services import Deps
from gateway.telemetry.logs import log_request, logging_requests
from gateway.tenants import Caller, Tenant
from gateway.tracing import NULL_SPAN

log = logging.getLogger(__name__)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"Request body of {declared} bytes is over the gateway's limit of {limit} bytes."
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"Request body is over the gateway's limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def overhead_header(request: Request, upstream_seconds: float) -> tuple[bytes, bytes]:
    overhead = time.perf_counter() - request.scope["started"] - upstream_seconds
    return (b"x-gateway-overhead-ms", f"{overhead * 1000:.3f}".encode())


def _context_headers(call: ChatCall) -> list[tuple[bytes, bytes]]:
    state = call.state
    headers: list[tuple[bytes, bytes]] = []
    if state.conversation_id is not None:
        headers.append((b"x-conversation-id", state.conversation_id.encode()))
    if state.leaf_id is not None:
        headers.append((b"x-message-id", state.leaf_id.encode()))
    if state.original_tokens is not None and state.sent_tokens is not None:
        headers.append((b"x-context-tokens-original", str(state.original_tokens).encode()))
        headers.append((b"x-context-tokens-sent", str(state.sent_tokens).encode()))
    if incognito(call.headers):
        headers.append((b"x-gateway-memory", b"off"))
    return headers


def error_response(door: Door, exc: GatewayError, request_id: str | None) -> Response:
    if exc.status >= 500:
        log.warning("request %s: %s", request_id, exc.message)
    return Response(door.error(exc), status_code=exc.status, media_type="application/json")


@dataclass(slots=True)
class _Tally:
    """What the request's metrics need, filled in as the exchange goes."""

    deps: Deps
    route: str
    tenant: str
    request_id: str
    call: ChatCall | None = None
    timings: tuple[float, float] | None = None  # gateway overhead, upstream (seconds)

    def done(self, status: int) -> None:
        call = self.call
        stream = call.stream if call is not None else False
        report = call.state.report if call is not None else None
        if call is not None and self.deps.tracer.recording:
            call.trace.root.set(
                {
                    "http.response.status_code": status,
                    "gen_ai.conversation.id": call.state.conversation_id,
                    "gateway.tokens.original": call.state.original_tokens,
                    "gateway.tokens.sent": call.state.sent_tokens,
                }
            )
            if status >= 500:
                call.trace.root.fail(f"HTTP {status}")
            call.trace.root.end()
        self.deps.metrics.request(self.route, self.tenant, status, stream, self.timings, report)
        if not logging_requests():
            return
        state = call.state if call is not None else None
        overhead, upstream = self.timings if self.timings is not None else (None, None)
        log_request(
            {
                "id": self.request_id,
                "tenant": self.tenant,
                "route": self.route,
                "status": status,
                "stream": stream,
                "model": call.body.get("model") if call is not None else None,
                "conversation": state.conversation_id if state is not None else None,
                "user": state.user_id if state is not None else None,
                "tokens_original": state.original_tokens if state is not None else None,
                "tokens_sent": state.sent_tokens if state is not None else None,
                "overhead_ms": round(overhead * 1000, 3) if overhead is not None else None,
                "upstream_ms": round(upstream * 1000, 1) if upstream is not None else None,
            }
        )


async def exchange(request: Request, door: Door, max_body_bytes: int) -> Response | RelayResponse:
    """Errors the gateway raises come back in the door's own shape."""
    caller: Caller = request.scope["caller"]
    tally = _Tally(request.state.deps, door.route, caller.tenant.name, request.scope["request_id"])
    try:
        response = await _Exchange(request, door, tally).run(max_body_bytes)
    except GatewayError as exc:
        tally.done(exc.status)
        return error_response(door, exc, request.scope.get("request_id"))
    if isinstance(response, Response):
        tally.done(response.status_code)
    return response


class _Exchange:
    """One request's way through the pipeline and the upstream; stored at most once, however it ends."""

    def __init__(self, request: Request, door: Door, tally: _Tally) -> None:
        self.request = request
        self.door = door
        self.tally = tally
        self.deps: Deps = request.state.deps
        self.caller: Caller = request.scope["caller"]
        self.tenant: Tenant = self.caller.tenant
        self.span: Span = NULL_SPAN
        self.sent = 0.0
        self.early = False
        self.persisted = False

    async def run(self, max_body_bytes: int) -> Response | RelayResponse:
        deps, tenant, door = self.deps, self.tenant, self.door
        deps.counters.chat_requests += 1
        raw = await read_body(self.request, tenant.body_limit(max_body_bytes))
        # Background jobs hold back while the request is in the gateway's hands (not the client's
        # upload, nor the upstream's answer).
        with deps.workers.foreground.request():
            payload = await self._prepare(raw)
        call = self.call
        self.sent = time.perf_counter()
        if deps.tracer.recording:
            self.span = call.trace.start(*_provider_call(tenant, payload), client=True)
        try:
            response = await door.send(tenant, call, payload, self.caller.client_key)
            waited = time.perf_counter() - self.sent
            # A thin-mode client's next request (or a Responses chain) must find this answer stored: it
            # is stored before the client sees the end of it; otherwise after the last byte.
            self.early = call.state.explicit or door.persists_first
            content_type = next((v for k, v in response.headers if k.lower() == "content-type"), "")
            if call.stream and response.status == 200 and content_type.startswith("text/event-stream"):
                return self._relay(response, waited)
            status, body = await self._read(response)
        except UpstreamError as exc:
            deps.counters.upstream_errors += 1
            _ended(self.span, None, exc.message)
            await self.persist(buffered_outcome(exc.status, exc.message.encode()))  # recorded as failed
            raise
        return await self._reply(response, status, body)

    async def _prepare(self, raw: bytes) -> ChatPayload:
        request, door, deps, tenant = self.request, self.door, self.deps, self.tenant
        self.parsed = await door.parse(raw)
        self.call = call = ChatCall(
            request_id=request.scope["request_id"],
            tenant=tenant.name,
            body=self.parsed.body,
            raw=self.parsed.raw,
            headers=door.upstream_headers(to_upstream(request.scope["headers"], chat=True)),
            started=request.scope["started"],
            answers_tools=door.answers_tools,
        )
        if deps.tracer.recording:  # else the call keeps NULL_TRACE: no attributes are built for nothing
            call.trace = deps.tracer.trace(f"POST {door.route}", _request_attributes(call, door.route))
        self.tally.call = call
        return await tenant.pipeline.prepare(call)

    async def persist(self, outcome: ChatOutcome) -> None:
        if not self.persisted:
            self.persisted = True
            with self.deps.workers.foreground.request():
                await self.tenant.pipeline.complete(self.call, outcome)

    async def persist_first(self, outcome: ChatOutcome) -> None:
        await self.persist(outcome)
        await self.door.stored(self.call, outcome)

    def _tool_loop(self) -> ToolLoop | None:
        if self.call.state.memory_tool and self.door.answers_tools:
            return self.deps.tool_loop(self.tenant.name)
        return None

    def _headers(self, response: UpstreamResponse, upstream_seconds: float) -> list[tuple[bytes, bytes]]:
        overhead = overhead_header(self.request, upstream_seconds)
        self.tally.timings = (float(overhead[1]) / 1000, upstream_seconds)
        return [
            *to_client(response.headers, decoded=True),
            *self.parsed.headers,
            *_context_headers(self.call),
            overhead,
        ]

    def _relay(self, response: UpstreamResponse, waited: float) -> RelayResponse:
        loop = self._tool_loop()
        if loop is not None:  # the model's memory_search calls are answered inside the stream
            response = _answering_tools(
                loop, self.call, self.door, response, self.tenant, self.caller.client_key
            )
        relay = self.door.relay(response, self.persist_first if self.early else None)
        headers = self._headers(response, waited)

        async def on_close(disconnected: bool) -> None:
            await response.close()
            outcome = relay.outcome(response.status, disconnected=disconnected)
            _ended(self.span, outcome, outcome.error)
            if outcome.client_disconnected:
                self.deps.counters.client_disconnects += 1
            await self.persist(outcome)
            self.tally.done(response.status)

        return RelayResponse(relay.frames(), response.status, headers, on_close)

    async def _read(self, response: UpstreamResponse) -> tuple[int, bytes]:
        try:
            body = await response.read()
        finally:
            await response.close()
        loop = self._tool_loop()
        if loop is None:
            return response.status, body
        door, tenant, call, key = self.door, self.tenant, self.call, self.caller.client_key

        async def post(again: JSONObject) -> tuple[int, bytes]:
            answer = await door.send_again(tenant, call, again, key)
            try:
                return answer.status, await answer.read()
            finally:
                await answer.close()

        # The model's memory_search calls are answered here: the client sees one answer.
        return await loop.finish(call, door.sent, response.status, body, post)

    async def _reply(self, response: UpstreamResponse, status: int, body: bytes) -> Response:
        upstream_seconds = time.perf_counter() - self.sent
        # A pure proxy, untraced, does nothing with the answer: it is not read into an outcome.
        keep = self.tenant.pipeline.completes or self.early or self.span is not NULL_SPAN
        outcome = self.door.outcome(status, body) if keep else None
        if outcome is not None:
            _ended(self.span, outcome, outcome.error)
        status, body = self.door.answer(status, body)
        headers = self._headers(response, upstream_seconds)
        done = None
        if outcome is not None and self.early:
            await self.persist_first(outcome)
        elif outcome is not None:
            done = BackgroundTask(self.persist, outcome)  # after the last byte: the client never waits for it
        reply = Response(body, status_code=status, background=done)
        reply.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
        return reply


def _answering_tools(
    loop: ToolLoop, call: ChatCall, door: Door, first: UpstreamResponse, tenant: Tenant, key: str | None
) -> UpstreamResponse:
    """The upstream stream with the gateway's own tool calls answered on the way (ToolStream)."""

    async def post(again: JSONObject) -> UpstreamResponse:
        return await door.send_again(tenant, call, again, key)

    stream = ToolStream(loop, call, door.sent, post)
    return UpstreamResponse(first.status, first.headers, stream.frames(first), stream.close, first.extra)


def _request_attributes(call: ChatCall, route: str) -> dict[str, TraceValue]:
    model = call.body.get("model")
    return {
        "http.request.method": "POST",
        "http.route": route,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model if isinstance(model, str) else None,
        "gateway.tenant": call.tenant,
        "gateway.request_id": call.request_id,
        "gateway.stream": call.stream,
    }


def _provider_call(tenant: Tenant, payload: ChatPayload) -> tuple[str, dict[str, TraceValue]]:
    """The provider call's span: named and described as the GenAI semantic conventions say."""
    model = payload.data.get("model")
    name = model if isinstance(model, str) else "unknown"
    upstream = tenant.config.upstream
    attributes: dict[str, TraceValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": upstream.provider,
        "gen_ai.request.model": name,
        "server.address": urlsplit(upstream.base_url).hostname if upstream.base_url else None,
    }
    return f"chat {name}", attributes


def _ended(span: Span, outcome: ChatOutcome | None, error: str | None) -> None:
    """End the provider call's span with what came back: model, token usage, finish reasons."""
    if span is NULL_SPAN:
        return
    if outcome is not None:
        usage = outcome.usage or {}
        reasons = [str(c["finish_reason"]) for c in outcome.choices if c.get("finish_reason")]
        span.set(
            {
                "gen_ai.response.model": outcome.model,
                "gen_ai.usage.input_tokens": _int(usage.get("prompt_tokens")),
                "gen_ai.usage.output_tokens": _int(usage.get("completion_tokens")),
                "gen_ai.response.finish_reasons": ",".join(reasons) or None,
                "http.response.status_code": outcome.http_status,
            }
        )
    if error is not None:
        span.fail("the provider call failed" if outcome is None else f"answer {outcome.status}")
    span.end()


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def count_message_tokens(request: Request, max_body_bytes: int) -> Response | RelayResponse:
    """`/v1/messages/count_tokens`: forwarded to an Anthropic upstream; otherwise estimated with the
    gateway's tokenizer, and said so in a header."""
    door = MessagesDoor()
    deps: Deps = request.state.deps
    caller: Caller = request.scope["caller"]
    try:
        raw = await read_body(request, caller.tenant.body_limit(max_body_bytes))
        parsed = door.parse_for_count(raw)
        if caller.tenant.messages is not None:
            headers = to_upstream(request.scope["headers"], chat=True)
            response = await caller.tenant.messages.count_tokens(raw, headers, caller.client_key)
            try:
                body = await response.read()
            finally:
                await response.close()
            return Response(body, status_code=response.status, media_type="application/json")
    except GatewayError as exc:
        return error_response(door, exc, request.scope.get("request_id"))
    tokenizer = deps.tokenizers.for_model(door.model)
    messages = parsed.body.get("messages")
    count = tokenizer.count_messages(messages if isinstance(messages, list) else [])
    tools = parsed.body.get("tools")
    if tools:
        count += tokenizer.count(orjson.dumps(tools).decode())
    estimate = {"x-gateway-token-count": f"estimated ({tokenizer.name})"}
    return Response(orjson.dumps({"input_tokens": count}), media_type="application/json", headers=estimate)
