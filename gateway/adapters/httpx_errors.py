"""httpx's transport failures as the gateway's upstream errors (litellm reaches providers over httpx)."""

from __future__ import annotations

import asyncio

import httpx

from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable


def translate_error(exc: BaseException, base_url: str) -> UpstreamError:
    """Map an httpx failure onto the gateway's upstream errors: a refused connection is 502, only a real
    timeout is 504 (an aiohttp error in `__cause__`, as some transports wrap one, is checked first)."""
    cause = exc.__cause__
    cause_name = type(cause).__name__ if cause is not None else ""
    if isinstance(cause, asyncio.TimeoutError) or cause_name in {"ServerTimeoutError", "SocketTimeoutError"}:
        return UpstreamTimeout(f"upstream {base_url} timed out")
    if cause is not None and cause_name in {
        "ClientConnectorError",
        "ClientConnectorDNSError",
        "ServerDisconnectedError",
        "ClientOSError",
        "ClientPayloadError",
    }:
        return UpstreamUnreachable(f"upstream {base_url} failed: {cause_name}: {cause}")
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return UpstreamTimeout(f"upstream {base_url} timed out ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectTimeout) and cause is None:
        return UpstreamTimeout(f"upstream {base_url} did not accept the connection in time")
    return UpstreamUnreachable(f"upstream {base_url} failed: {type(exc).__name__}: {exc}")
