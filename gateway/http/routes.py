"""Routes: chat completions through the pipeline, everything else under /v1 passed straight through."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import PayloadTooLarge, UpstreamError
from gateway.http.api import api_routes
from gateway.http.headers import to_client, to_upstream
from gateway.http.memory_api import memory_routes
from gateway.http.streaming import RelayResponse
from gateway.memory.scope import incognito
from gateway.pipeline.call import ChatCall, ChatOutcome
from gateway.pipeline.forward import StreamRelay, buffered_outcome, with_stream_usage
from gateway.pipeline.validate import parse_chat_request
from gateway.ports import ChatPayload, JSONObject
from gateway.tenants import Caller
from gateway.wiring import Deps

log = logging.getLogger(__name__)

_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


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


def _overhead_header(request: Request, upstream_seconds: float) -> tuple[bytes, bytes]:
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


class Endpoints:
    """Endpoint handlers bound to one app's dependencies."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes

    async def chat_completions(self, request: Request) -> Response | RelayResponse:
        deps: Deps = request.state.deps
        caller: Caller = request.scope["caller"]
        deps.counters.chat_requests += 1
        raw = await read_body(request, self.max_body_bytes)
        call = ChatCall(
            request_id=request.scope["request_id"],
            tenant=caller.tenant.name,
            body=parse_chat_request(raw),
            raw=raw,
            headers=to_upstream(request.scope["headers"], chat=True),
            started=request.scope["started"],
        )
        pipeline = caller.tenant.pipeline
        payload = await pipeline.prepare(call)
        strip_usage = False
        if caller.tenant.config.upstream.request_stream_usage:
            payload, strip_usage = with_stream_usage(call, payload)

        sent = time.perf_counter()
        try:
            response = await caller.tenant.upstream.chat_completions(payload, call.headers, caller.client_key)
        except UpstreamError as exc:
            deps.counters.upstream_errors += 1
            await pipeline.complete(call, buffered_outcome(exc.status, exc.message.encode()))
            raise
        waited = time.perf_counter() - sent
        content_type = next((v for k, v in response.headers if k.lower() == "content-type"), "")

        persisted = False

        async def persist(outcome: ChatOutcome) -> None:
            nonlocal persisted
            if not persisted:
                persisted = True
                await pipeline.complete(call, outcome)

        if call.stream and response.status == 200 and content_type.startswith("text/event-stream"):
            before_done = persist if call.state.explicit else None
            relay = StreamRelay(response, strip_usage=strip_usage, before_done=before_done)
            headers = [
                *to_client(response.headers, decoded=True),
                *_context_headers(call),
                _overhead_header(request, waited),
            ]

            async def on_close(disconnected: bool) -> None:
                await response.close()
                outcome = relay.outcome(response.status, disconnected=disconnected)
                if outcome.client_disconnected:
                    deps.counters.client_disconnects += 1
                await persist(outcome)

            return RelayResponse(relay.frames(), response.status, headers, on_close)

        try:
            body = await response.read()
        except UpstreamError as exc:
            deps.counters.upstream_errors += 1
            await persist(buffered_outcome(exc.status, exc.message.encode()))  # recorded as failed
            raise
        finally:
            await response.close()
        status = response.status
        loop = deps.tool_loop(caller.tenant.name) if call.state.memory_tool else None
        if loop is not None:
            upstream = caller.tenant.upstream

            async def post(again: JSONObject) -> tuple[int, bytes]:
                answer = await upstream.chat_completions(ChatPayload(again), call.headers, caller.client_key)
                try:
                    return answer.status, await answer.read()
                finally:
                    await answer.close()

            # The model's memory_search calls are answered here: the client sees one answer.
            try:
                status, body = await loop.finish(call, payload.data, status, body, post)
            except UpstreamError as exc:
                deps.counters.upstream_errors += 1
                await persist(buffered_outcome(exc.status, exc.message.encode()))  # recorded as failed
                raise
        upstream_seconds = time.perf_counter() - sent
        headers = [
            *to_client(response.headers, decoded=True),
            *_context_headers(call),
            _overhead_header(request, upstream_seconds),
        ]
        outcome = buffered_outcome(status, body)
        done = None
        if call.state.explicit:
            await persist(outcome)  # a thin-mode client's next request must find this answer stored
        else:
            done = BackgroundTask(persist, outcome)  # after the last byte: the client never waits for it
        reply = Response(body, status_code=status, background=done)
        reply.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
        return reply

    async def passthrough(self, request: Request) -> RelayResponse:
        """Any other /v1 path (embeddings, moderations, files, models...) goes upstream as it came."""
        deps: Deps = request.state.deps
        caller: Caller = request.scope["caller"]
        path = request.url.path.removeprefix("/v1")
        body = await read_body(request, self.max_body_bytes)
        sent = time.perf_counter()
        response = await caller.tenant.upstream.forward(
            request.method,
            path,
            request.url.query,
            to_upstream(request.scope["headers"], chat=False),
            body,
            caller.client_key,
        )
        waited = time.perf_counter() - sent
        headers = [*to_client(response.headers, decoded=False), _overhead_header(request, waited)]

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.body:
                    yield chunk
            except UpstreamError as exc:
                deps.counters.upstream_errors += 1
                log.warning("request %s: upstream failed mid-body: %s", request.scope["request_id"], exc)
                raise  # abort the connection: a cleanly ended chunked body would look complete

        async def on_close(disconnected: bool) -> None:
            await response.close()

        return RelayResponse(chunks(), response.status, headers, on_close)

    async def healthz(self, request: Request) -> Response:
        deps: Deps = request.state.deps
        body = {
            "status": "ok",
            "counters": deps.counters.snapshot(),
            "jobs": await deps.job_counts(),
            "indexing": await deps.indexing(),
            "workers": {"count": len(deps.workers.worker_ids), **deps.workers.stats.snapshot()},
        }
        return Response(orjson.dumps(body), media_type="application/json")


Handler = Callable[[Request], Awaitable[ASGIApp]]


class _Asgi:
    """Adapts a handler returning any ASGI response (`Response`, `RelayResponse`) to an endpoint."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive))
        await response(scope, receive, send)


def routes(max_body_bytes: int) -> list[Route]:
    endpoints = Endpoints(max_body_bytes)
    return [
        *memory_routes(),
        *api_routes(),
        Route("/v1/chat/completions", _Asgi(endpoints.chat_completions), methods=["POST"]),
        Route("/v1/{path:path}", _Asgi(endpoints.passthrough), methods=_ALL_METHODS),
        Route("/healthz", endpoints.healthz, methods=["GET"]),
    ]
