"""Pure ASGI middleware: a request id and start time for every request, gateway-key auth and rate limits
on /v1 and /api, and body limits."""

from __future__ import annotations

import itertools
import os
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import AuthenticationFailed, ClientError, PayloadTooLarge, RateLimited
from gateway.http.errors import error_body
from gateway.inbound import messages_out
from gateway.limits import retry_after_header
from gateway.tenants import TenantRegistry


async def send_error(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """An error answered by the middleware itself, before any route runs."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


class RequestIds:
    """Request ids of 32 hex digits: a random prefix of this instance's own, then a counter (a uuid4 costs
    a getrandom call per request; the ids only need to be unique across processes and restarts)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._next = itertools.count()

    def stamp(self, scope: Scope) -> tuple[bytes, bytes]:
        """Puts `started` (perf_counter) and a new `request_id` into the scope; returns the id's header."""
        scope["started"] = time.perf_counter()
        request_id = f"{self._prefix}{next(self._next):016x}"
        scope["request_id"] = request_id
        return (b"x-gateway-request-id", request_id.encode())


class RequestContextMiddleware:
    """Stamps `request_id` and `started` (perf_counter) into the scope, and the id onto the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._ids = RequestIds()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = self._ids.stamp(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


class AuthMiddleware:
    """Resolves the caller of every /v1 and /api request from `Authorization: Bearer` (or `x-api-key`, as
    Anthropic SDKs send it; or `X-Gateway-Key`), and holds the tenant to its rate limit."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(("/v1/", "/api/")):
            await self.app(scope, receive, send)
            return
        bearer: str | None = None
        gateway_key: str | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and token.strip():
                    bearer = token.strip()
            elif name == b"x-gateway-key":
                gateway_key = value.decode("latin-1").strip()
            elif name == b"x-api-key" and bearer is None:
                bearer = value.decode("latin-1").strip() or None
        try:
            registry: TenantRegistry = scope["state"]["deps"].tenants
            caller = registry.resolve(bearer, gateway_key)
            if not caller.authenticated and scope["path"].startswith("/api/"):
                raise AuthenticationFailed(
                    "The gateway's REST API needs a gateway key (Authorization or X-Gateway-Key)."
                )
            limiter = caller.tenant.limiter
            if limiter is not None and (wait := limiter.take()) is not None:
                raise RateLimited(
                    f"Rate limit reached for tenant {caller.tenant.name!r}: "
                    f"{caller.tenant.config.limits.requests_per_minute} requests a minute. "
                    f"Try again in {wait:.1f} s.",
                    wait,
                )
            scope["caller"] = caller
        except ClientError as exc:
            if scope["path"].startswith("/v1/messages"):
                body = messages_out.error_body(exc.status, exc.message)
            else:
                body = error_body(exc.message, exc.error_type, None, exc.code)
            extra = (
                [(b"retry-after", retry_after_header(exc.retry_after))]
                if isinstance(exc, RateLimited)
                else []
            )
            await send_error(send, exc.status, body, extra)
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Holds the REST API's and the dashboard's request bodies to the body limit (the caller's tenant's, or
    `server.max_body_bytes`): a declared length over it is refused before anything is read, and a body
    that runs over it while being read raises PayloadTooLarge (413). /v1 reads its bodies with the same
    limit itself (`read_body`)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        caller = scope.get("caller")
        limit = self.max_body_bytes if caller is None else caller.tenant.body_limit(self.max_body_bytes)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                exc = PayloadTooLarge(
                    f"Request body of {value.decode()} bytes is over the gateway's limit of {limit} bytes."
                )
                await send_error(send, exc.status, error_body(exc.message, exc.error_type, None, exc.code))
                return
        size = 0

        async def limited() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > limit:
                    raise PayloadTooLarge(f"Request body is over the gateway's limit of {limit} bytes.")
            return message

        await self.app(scope, limited, send)
