"""Routes: the chat front doors (chat completions, Anthropic messages) through the pipeline, everything
else under /v1 passed straight through."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.dashboard.pages import dashboard_routes
from gateway.errors import NotFound, UpstreamError
from gateway.http.api import api_routes
from gateway.http.doors import (
    ChatDoor,
    MessagesDoor,
    NativeMessagesDoor,
    NativeResponsesDoor,
    ResponsesDoor,
)
from gateway.http.exchange import count_message_tokens, exchange, overhead_header, read_body
from gateway.http.headers import to_client, to_upstream
from gateway.http.memory_api import memory_routes
from gateway.http.streaming import RelayResponse
from gateway.ports import JSON
from gateway.services import Deps
from gateway.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.tenants import Caller

log = logging.getLogger(__name__)

_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class Endpoints:
    """Endpoint handlers bound to one app's dependencies."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes

    async def chat_completions(self, request: Request) -> Response | RelayResponse:
        caller: Caller = request.scope["caller"]
        return await exchange(request, ChatDoor(caller.tenant.bodies), self.max_body_bytes)

    async def messages(self, request: Request) -> Response | RelayResponse:
        caller: Caller = request.scope["caller"]
        native = caller.tenant.messages
        door = NativeMessagesDoor(native) if native is not None else MessagesDoor()
        return await exchange(request, door, self.max_body_bytes)

    async def responses(self, request: Request) -> Response | RelayResponse:
        deps: Deps = request.state.deps
        caller: Caller = request.scope["caller"]
        native = caller.tenant.config.upstream.responses == "native"
        kind = NativeResponsesDoor if native else ResponsesDoor
        door = kind(deps.responses, caller.tenant.name, request.scope["request_id"])
        return await exchange(request, door, self.max_body_bytes)

    async def stored_response(self, request: Request) -> Response:
        """GET (or DELETE) /v1/responses/{id}: a response stored with `store: true`."""
        deps: Deps = request.state.deps
        caller: Caller = request.scope["caller"]
        response_id = request.path_params["response_id"]
        if request.method == "DELETE":
            deleted = await deps.responses.delete_response(caller.tenant.name, response_id)
            if deleted:
                body = {"id": response_id, "object": "response", "deleted": True}
                return Response(orjson.dumps(body), media_type="application/json")
        else:
            stored = await deps.responses.get_response(caller.tenant.name, response_id)
            if stored is not None:
                return Response(orjson.dumps(stored.body), media_type="application/json")
        raise NotFound(f"No response found with id '{response_id}'.", param="response_id", code="not_found")

    async def count_tokens(self, request: Request) -> Response | RelayResponse:
        return await count_message_tokens(request, self.max_body_bytes)

    async def passthrough(self, request: Request) -> RelayResponse:
        """Any other /v1 path (embeddings, moderations, files, models...) goes upstream as it came."""
        deps: Deps = request.state.deps
        caller: Caller = request.scope["caller"]
        path = request.url.path.removeprefix("/v1")
        body = await read_body(request, caller.tenant.body_limit(self.max_body_bytes))
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
        headers = [*to_client(response.headers, decoded=False), overhead_header(request, waited)]

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

    async def metrics(self, request: Request) -> Response:
        """Prometheus text format; the queue counts are left out (not wrong) when the store is down."""
        deps: Deps = request.state.deps
        queue = await deps.job_counts()
        oldest = await deps.oldest_queued()
        return Response(deps.metrics.exposition(queue or {}, oldest or {}), media_type=METRICS_CONTENT_TYPE)

    async def healthz(self, request: Request) -> Response:
        deps: Deps = request.state.deps
        # The workers' own counts first: a job they count as done is then done in the queue's counts too
        # (read the other way round, a job finishing between the reads showed running and done at once).
        workers = {
            "count": len(deps.workers.worker_ids),
            **deps.workers.stats.snapshot(),
            "requests_in_hand": deps.workers.foreground.working,  # jobs wait for these to leave
        }
        jobs: dict[str, JSON] | None = None
        counts = await deps.job_counts()
        if counts is not None:
            # The backlog's age: how long the oldest job that could run now has waited (0 when none).
            oldest = await deps.oldest_queued()
            jobs = {**counts}
            if oldest is not None:
                jobs["oldest_queued_seconds"] = round(max(oldest.values(), default=0.0), 3)
                jobs["oldest_queued_seconds_by_kind"] = {k: round(v, 3) for k, v in sorted(oldest.items())}
        body = {
            "status": "ok",
            "process": os.getpid(),  # which of `serve --workers N` answered
            "counters": deps.counters.snapshot(),
            "jobs": jobs,
            "indexing": await deps.indexing(),
            "workers": workers,
            "caches_mb": deps.cache_megabytes(),
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


def doors(endpoints: Endpoints) -> dict[str, ASGIApp]:
    """The front doors by path, for POST: served by their own lane (lanes.py), and routed too (so that
    another method is answered 405 as on every route)."""
    return {
        "/v1/chat/completions": _Asgi(endpoints.chat_completions),
        "/v1/messages": _Asgi(endpoints.messages),
        "/v1/responses": _Asgi(endpoints.responses),
    }


def routes(
    endpoints: Endpoints, dashboard_secret: str | None = None, admin_key: str | None = None
) -> list[BaseRoute]:
    door = doors(endpoints)
    return [
        *dashboard_routes(dashboard_secret, admin_key),
        *memory_routes(),
        *api_routes(),
        Route("/v1/chat/completions", door["/v1/chat/completions"], methods=["POST"]),
        Route("/v1/messages", door["/v1/messages"], methods=["POST"]),
        Route("/v1/messages/count_tokens", _Asgi(endpoints.count_tokens), methods=["POST"]),
        Route("/v1/responses", door["/v1/responses"], methods=["POST"]),
        Route("/v1/responses/{response_id}", endpoints.stored_response, methods=["GET", "DELETE"]),
        Route("/v1/{path:path}", _Asgi(endpoints.passthrough), methods=_ALL_METHODS),
        Route("/healthz", endpoints.healthz, methods=["GET"]),
        Route("/metrics", endpoints.metrics, methods=["GET"]),
    ]
