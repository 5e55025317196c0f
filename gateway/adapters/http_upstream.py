"""Upstream adapter for any OpenAI-compatible API over httpx: a direct byte pass-through.

Chosen by `upstream.http_client: httpx` (httpx's own pool) or `httpx-aiohttp` (httpx over aiohttp's
pool). The default is plain aiohttp (`aiohttp_upstream.py`), which the overhead benchmark measured at
about a third of httpx-aiohttp's CPU per request (BENCHMARKS.md); these remain for comparison and for
deployments that prefer httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from gateway.adapters.openai_wire import chat_request, forward_url, with_auth
from gateway.config import UpstreamConfig
from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable
from gateway.ports import ChatPayload, Headers, UpstreamResponse

_CONNECT_TYPES: tuple[type[BaseException], ...] = (httpx.ConnectError, httpx.ConnectTimeout)


def translate_error(exc: BaseException, base_url: str) -> UpstreamError:
    """Map httpx (and, behind httpx-aiohttp, aiohttp) failures onto the gateway's upstream errors.

    httpx-aiohttp maps every aiohttp connection error to `httpx.ConnectTimeout`, so the original aiohttp
    exception in `__cause__` is checked first: a refused connection is 502, only a real timeout is 504.
    """
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


def build_client(config: UpstreamConfig) -> httpx.AsyncClient:
    timeout = httpx.Timeout(config.timeout_seconds, connect=config.connect_timeout_seconds)
    limits = httpx.Limits(
        max_connections=config.max_connections,
        max_keepalive_connections=min(256, config.max_connections),
        keepalive_expiry=config.keepalive_seconds,
    )
    transport: httpx.AsyncBaseTransport
    if config.http_client == "httpx-aiohttp":
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits)
    else:
        transport = httpx.AsyncHTTPTransport(limits=limits)
    return httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False)


class HttpUpstream:
    """Forwards to `config.base_url`; the provider's bytes come back unchanged."""

    def __init__(self, name: str, config: UpstreamConfig, client: httpx.AsyncClient | None = None) -> None:
        assert config.base_url is not None  # guaranteed by UpstreamConfig validation
        self.name = name
        self._config = config
        self._base_url = config.base_url
        self._client = client if client is not None else build_client(config)

    async def chat_completions(
        self, payload: ChatPayload, headers: Headers, client_key: str | None
    ) -> UpstreamResponse:
        url, sent, content = chat_request(self._config, payload, headers, client_key)
        return await self._send("POST", url, sent, content, raw=False)

    async def forward(
        self,
        method: str,
        path: str,
        query: str,
        headers: Headers,
        body: AsyncIterator[bytes] | bytes,
        client_key: str | None,
    ) -> UpstreamResponse:
        url = forward_url(self._config, path, query)
        return await self._send(method, url, with_auth(self._config, headers, client_key), body, raw=True)

    async def _send(
        self, method: str, url: str, headers: Headers, content: AsyncIterator[bytes] | bytes, *, raw: bool
    ) -> UpstreamResponse:
        request = self._client.build_request(method, url, headers=headers, content=content)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise translate_error(exc, self._base_url) from exc
        return UpstreamResponse(
            status=response.status_code,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw],
            body=self._iterate(response, raw=raw),
            close=response.aclose,
        )

    async def _iterate(self, response: httpx.Response, *, raw: bool) -> AsyncIterator[bytes]:
        # `raw` keeps any content-encoding for byte-exact pass-through of non-chat endpoints.
        chunks = response.aiter_raw() if raw else response.aiter_bytes()
        try:
            async for chunk in chunks:
                yield chunk
        except httpx.HTTPError as exc:
            raise translate_error(exc, self._base_url) from exc

    async def aclose(self) -> None:
        await self._client.aclose()
