"""Pure ASGI middleware: a request id and start time for every request, and gateway-key auth on /v1."""

from __future__ import annotations

import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import AuthenticationFailed
from gateway.http.errors import error_body
from gateway.inbound import messages_out
from gateway.tenants import TenantRegistry


class RequestContextMiddleware:
    """Stamps `request_id` and `started` (perf_counter) into the scope, and the id onto the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope["started"] = time.perf_counter()
        request_id = uuid.uuid4().hex
        scope["request_id"] = request_id
        header = (b"x-gateway-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


class AuthMiddleware:
    """Resolves the caller of every /v1 and /api request from `Authorization: Bearer` (or `x-api-key`, as
    Anthropic SDKs send it; or `X-Gateway-Key`)."""

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
            scope["caller"] = caller
        except AuthenticationFailed as exc:
            if scope["path"].startswith("/v1/messages"):
                body = messages_out.error_body(exc.status, exc.message)
            else:
                body = error_body(exc.message, exc.error_type, None, exc.code)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": exc.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
