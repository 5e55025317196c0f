"""Upstream adapter for any OpenAI-compatible API on plain aiohttp: the default byte pass-through.

The one client for OpenAI-compatible upstreams (the fastest of the three the overhead benchmark measured),
which the overhead benchmark measured as most of the gateway's own CPU per request (BENCHMARKS.md).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace

import aiohttp
from aiohttp.http import RawResponseMessage

from gateway.adapters.openai_wire import chat_request, forward_url, with_auth
from gateway.config import UpstreamConfig
from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable
from gateway.ports import ChatPayload, Headers, UpstreamResponse

log = logging.getLogger(__name__)

# errno values of a socket the peer already closed: what writing to a stale pooled connection gives.
_STALE_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


class _Attempt:
    """Per-request trace context: set when the connector hands out a pooled (reused) connection."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _on_reuse(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceConnectionReuseconnParams
) -> None:
    attempt = context.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.reused = True


def translate_error(exc: BaseException, base_url: str) -> UpstreamError:
    """Timeouts (connect or between chunks) are 504; anything else that broke the exchange is 502."""
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError subclasses it too
        return UpstreamTimeout(f"upstream {base_url} timed out ({type(exc).__name__})")
    return UpstreamUnreachable(f"upstream {base_url} failed: {type(exc).__name__}: {exc}")


def _is_stale(exc: aiohttp.ClientError, attempt: _Attempt) -> bool:
    """The request died on a pooled connection the upstream had closed, before any response byte.

    Then the upstream never read the request, so sending it again (even a POST) cannot duplicate work.
    A ServerDisconnectedError carrying a partial response, or any failure on a fresh connection, is not
    retried: the upstream may have seen that request.
    """
    if not attempt.reused:
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return not isinstance(exc.message, RawResponseMessage)
    if isinstance(exc, aiohttp.ClientOSError) and not isinstance(exc, aiohttp.ClientConnectorError):
        return exc.errno in _STALE_ERRNOS
    return False


class AiohttpUpstream:
    """Forwards to `config.base_url` over one lazily created aiohttp ClientSession."""

    def __init__(self, name: str, config: UpstreamConfig) -> None:
        assert config.base_url is not None  # guaranteed by UpstreamConfig validation
        self.name = name
        self._config = config
        self._base_url = config.base_url
        self._session: aiohttp.ClientSession | None = None
        self.retries = 0  # stale-connection retries, for tests and diagnostics

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: a ClientSession binds to the running loop, and the adapter is built
        # before the server's loop starts.
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_connection_reuseconn.append(_on_reuse)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._config.max_connections,
                    limit_per_host=0,
                    keepalive_timeout=self._config.keepalive_seconds,
                ),
                timeout=aiohttp.ClientTimeout(
                    total=None,  # a stream may last long; only silence (sock_read) is an error
                    sock_connect=self._config.connect_timeout_seconds,
                    sock_read=self._config.timeout_seconds,
                ),
                auto_decompress=False,
                # Forward only the client's headers: no aiohttp user-agent or guessed content-type, no
                # accept-encoding it did not ask for (a non-chat body is passed through still encoded).
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
                trace_configs=[trace],
            )
        return self._session

    async def chat_completions(
        self, payload: ChatPayload, headers: Headers, client_key: str | None
    ) -> UpstreamResponse:
        url, sent, content = chat_request(self._config, payload, headers, client_key)
        # The pipeline reads chat bodies, so they are decoded should the upstream ignore "identity".
        return await self._send("POST", url, sent, content, decompress=True)

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
        return await self._send(
            method, url, with_auth(self._config, headers, client_key), body, decompress=False
        )

    async def send(self, method: str, path: str, headers: Headers, body: bytes) -> UpstreamResponse:
        """A request whose body the gateway reads (decoded), with the caller's headers only."""
        return await self._send(method, forward_url(self._config, path, ""), headers, body, decompress=True)

    async def _send(
        self,
        method: str,
        url: str,
        headers: Headers,
        content: AsyncIterator[bytes] | bytes,
        *,
        decompress: bool,
    ) -> UpstreamResponse:
        started = False  # a streamed request body can be replayed only if aiohttp never pulled from it
        data: AsyncIterator[bytes] | bytes | None = content or None  # no body at all for b"" (GET)
        if not isinstance(content, bytes):

            async def tracked(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
                nonlocal started
                started = True
                async for chunk in source:
                    yield chunk

            data = tracked(content)
        session = self._client()
        retried = False
        while True:
            attempt = _Attempt()
            try:
                response = await session.request(
                    method,
                    url,
                    headers=headers,
                    data=data,
                    allow_redirects=False,
                    auto_decompress=decompress,
                    trace_request_ctx=attempt,
                )
                break
            except aiohttp.ClientError as exc:
                if not retried and not started and _is_stale(exc, attempt):
                    retried = True
                    self.retries += 1
                    log.debug("upstream %s: pooled connection was stale (%r), sending again", self.name, exc)
                    continue  # the pool drops the dead connection; the next attempt gets another one
                raise translate_error(exc, self._base_url) from exc
            except TimeoutError as exc:
                raise translate_error(exc, self._base_url) from exc

        async def close() -> None:
            if response.content.is_eof():
                response.release()  # complete: the connection goes back to the pool
            else:
                response.close()  # unfinished: drop the connection so the upstream stops its work

        return UpstreamResponse(
            status=response.status,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
            body=self._iterate(response),
            close=close,
        )

    async def _iterate(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise translate_error(exc, self._base_url) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
