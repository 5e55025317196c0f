"""An ASGI response that relays an upstream body and always runs its close callback.

Starlette's `StreamingResponse` skips its background task when the client disconnects; here the close
callback runs in a shielded `finally`, so the upstream request is cancelled and the outcome recorded
whether the stream finished, failed, or the client went away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from starlette.types import Receive, Scope, Send

OnClose = Callable[[bool], Awaitable[None]]


class RelayResponse:
    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        status: int,
        headers: list[tuple[bytes, bytes]],
        on_close: OnClose,
    ) -> None:
        self._chunks = chunks
        self._status = status
        self._headers = headers
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = False
        try:
            async with anyio.create_task_group() as group:

                async def watch_disconnect() -> None:
                    nonlocal disconnected
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    disconnected = True
                    group.cancel_scope.cancel()

                group.start_soon(watch_disconnect)
                await send({"type": "http.response.start", "status": self._status, "headers": self._headers})
                async for chunk in self._chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close(disconnected)
