"""create_app(config, deps) -> the ASGI app: middleware, routes, the chat doors' lane, and a lifespan
that owns the resources."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.types import ASGIApp

from gateway.collector import release_free_heap, trimming_heap
from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.http.errors import handle_gateway_error, handle_http_exception
from gateway.http.lanes import Lanes
from gateway.http.middleware import AuthMiddleware, BodyLimitMiddleware, RequestContextMiddleware
from gateway.http.routes import Endpoints, doors, routes
from gateway.services import Deps
from gateway.wiring import build_deps


def create_app(config: GatewayConfig, deps: Deps | None = None) -> ASGIApp:
    """Build the ASGI app. Without `deps`, the lifespan builds them from `config` and closes them."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Deps]]:
        owned = deps is None
        resources = build_deps(config) if deps is None else deps
        if owned:
            release_free_heap()  # what building them freed, back to the system (collector.py)
        try:
            # The job workers run as long as the app does, whoever built the deps.
            async with resources.workers.running(), trimming_heap():
                yield {"deps": resources}
        finally:
            if owned:
                await resources.aclose()

    endpoints = Endpoints(config.server.max_body_bytes)
    app = Starlette(
        routes=routes(endpoints, config.server.dashboard_secret, config.server.admin_key),
        middleware=[
            Middleware(RequestContextMiddleware),
            Middleware(AuthMiddleware),
            Middleware(BodyLimitMiddleware, config.server.max_body_bytes),
        ],
        exception_handlers={GatewayError: handle_gateway_error, HTTPException: handle_http_exception},
        lifespan=lifespan,
    )
    return Lanes(app, doors(endpoints))  # the chat doors' POSTs past the router (lanes.py)
