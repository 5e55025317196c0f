"""A cheap HTTP/1.1 load generator for loopback benchmarks.

Each `Conn` is an asyncio Protocol on a keep-alive connection: the request is pre-built bytes written in
one call, and the response is parsed by httptools (the C parser uvicorn itself uses), so the client side
costs a few tens of microseconds per request and the same for every target. No HTTP client library
(headers objects, URL parsing, pools) sits between the clock and the socket.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import httptools

perf = time.perf_counter


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode() + body


class Conn(asyncio.Protocol):
    """One keep-alive connection, one request in flight at a time."""

    def __init__(self, keep_body: bool = False, header: bytes | None = None) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[float] | None = None
        self.keep_body = keep_body
        self.header = header  # lower-case name of one response header to capture
        self.header_value: bytes | None = None
        self.body: list[bytes] = []
        self.first = 0.0  # perf_counter() at the first body byte of the current response
        self.status = 0
        self.on_first: Callable[[], None] | None = None
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError(f"connection lost: {exc!r}"))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.body = []
        self.first = 0.0
        self.header_value = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.header is not None and name.lower() == self.header:
            self.header_value = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.first:
            self.first = perf()
            if self.on_first is not None:
                self.on_first()
        if self.keep_body:
            self.body.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(perf())

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    # API
    def send(self, request: bytes) -> asyncio.Future[float]:
        """Write the request; the future resolves to perf_counter() when the response is complete."""
        if self.closed or self.transport is None:
            raise ConnectionError("connection is closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()


async def connect(host: str, port: int, **kwargs: object) -> Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: Conn(**kwargs), host, port)  # type: ignore[arg-type]
    return conn


def pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list (nan when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]
