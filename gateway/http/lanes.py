"""The chat doors' own lane: `POST` to a front door goes from the gateway's middleware straight to its
endpoint, past Starlette's router (a pattern match per route before the doors), its two exception layers
and their wrappers around every `send`; every other request (the REST API, the dashboard, other /v1
paths, other methods, the lifespan) goes to the Starlette app as before, with the same middleware.

The door endpoints answer the gateway's own errors themselves (`exchange`); what Starlette's outermost
layer did for anything else is done here: the error is logged, and answered 500 in OpenAI's shape if the
answer had not begun (a stream already under way is cut, and the client sees it end early).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.errors import error_body
from gateway.http.middleware import AuthMiddleware, RequestIds, send_error

log = logging.getLogger(__name__)


class _Entry:
    """What RequestContextMiddleware and Starlette's outermost layer do, in one wrapper of `send`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._ids = RequestIds()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        header = self._ids.stamp(scope)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s to %s failed", scope["request_id"], scope["path"])
            if started:
                raise  # the server closes the connection: the answer stops where it was
            body = error_body("The gateway failed to handle this request.", "server_error", None, None)
            await send_error(send_with_id, 500, body)


class Lanes:
    """`doors`: path -> endpoint for `POST`; `app`: everything else."""

    def __init__(self, app: ASGIApp, doors: Mapping[str, ASGIApp]) -> None:
        self.app = app
        self._doors = {path: _Entry(AuthMiddleware(door)) for path, door in doors.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            door = self._doors.get(scope["path"])
            if door is not None:
                await door(scope, receive, send)
                return
        await self.app(scope, receive, send)
