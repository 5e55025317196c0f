"""The bare relay: the physical floor of an HTTP/1.1 proxy in Python, for the overhead benchmark.

    python benchmarks/bare_relay.py --port 9103 --upstream http://127.0.0.1:9101 --upstream-key sk-...

Raw asyncio on uvloop, no ASGI, no HTTP client library. Each client connection gets ONE keep-alive
connection to the upstream of its own (opened at its first request, reopened if the upstream closed it
while idle). Requests are parsed with `httptools.HttpRequestParser` (keep-alive, Content-Length or
chunked bodies) and written to the upstream as one buffer: the same method, path and headers, with the
Authorization header swapped for the upstream's, Host set to the upstream, hop-by-hop headers dropped and
the body re-framed with Content-Length. The upstream's bytes are written back to the client as they
arrive (a streamed, chunked SSE answer is relayed chunk by chunk, its framing untouched), while
`httptools.HttpResponseParser` follows them to know where each response ends (Content-Length, chunked,
or until close). Pipelined requests are forwarded in order; the responses come back in the same order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
from collections import deque
from urllib.parse import urlsplit

import httptools
import uvloop

DROP = {b"authorization", b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive"}


def bad_gateway() -> bytes:
    body = b'{"error":{"message":"upstream unreachable"}}'
    head = b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


class Upstream:
    def __init__(self, host: str, port: int, key: str) -> None:
        self.host = host
        self.port = port
        self.auth = b"Bearer " + key.encode("latin-1")
        self.host_header = f"{host}:{port}".encode("latin-1")


class UpstreamSide(asyncio.Protocol):
    """The relay's connection to the upstream, owned by one client connection."""

    __slots__ = ("client", "parser", "transport")

    def __init__(self, client: ClientSide) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client.transport is not None and not client.closed:
            client.transport.write(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            client.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        client = self.client
        if client.upstream is self:
            client.upstream = None
        if client.inflight:
            # a response read until close ends here; anything else was cut short
            with contextlib.suppress(httptools.HttpParserError):
                self.parser.feed_eof()
            if client.inflight:
                client.abort()

    def on_message_complete(self) -> None:
        self.client.response_done()

    def pause_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.resume_reading()


class ClientSide(asyncio.Protocol):
    """One client connection."""

    __slots__ = (
        "body",
        "close_after",
        "closed",
        "connecting",
        "connector",
        "headers",
        "inflight",
        "parser",
        "pending",
        "transport",
        "upstream",
        "upstream_config",
        "url",
    )

    def __init__(self, upstream: Upstream) -> None:
        self.upstream_config = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamSide | None = None
        self.connecting = False
        self.connector: asyncio.Future[None] | None = None
        self.pending: deque[bytes] = deque()  # requests waiting for the upstream connection
        self.inflight = 0
        self.close_after = False
        self.closed = False
        self.url = b""
        self.headers: list[bytes] = []
        self.body: list[bytes] = []

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.abort()
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                )
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()
        self.upstream = None

    def pause_writing(self) -> None:  # the client reads slower than the upstream writes
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in DROP:
            self.headers.append(name + b": " + value + b"\r\n")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        config = self.upstream_config
        body = b"".join(self.body)
        request = b"".join(
            (
                self.parser.get_method(),
                b" ",
                self.url,
                b" HTTP/1.1\r\nhost: ",
                config.host_header,
                b"\r\nauthorization: ",
                config.auth,
                b"\r\n",
                *self.headers,
                b"content-length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        if not self.parser.should_keep_alive():
            self.close_after = True
        self.inflight += 1
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None and not upstream.transport.is_closing():
            upstream.transport.write(request)
            return
        self.pending.append(request)
        if not self.connecting:
            self.connecting = True
            self.connector = asyncio.ensure_future(self.connect())

    # relaying
    async def connect(self) -> None:
        config = self.upstream_config
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(lambda: UpstreamSide(self), config.host, config.port)
        except OSError:
            self.connecting = False
            if self.transport is not None and not self.closed:
                self.transport.write(bad_gateway())
            self.abort()
            return
        self.connecting = False
        if self.closed:
            upstream.transport.close()  # type: ignore[union-attr]
            return
        self.upstream = upstream
        assert upstream.transport is not None
        while self.pending:
            upstream.transport.write(self.pending.popleft())

    def response_done(self) -> None:
        self.inflight -= 1
        if self.close_after and not self.inflight:
            self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()
        self.upstream = None


async def serve(host: str, port: int, upstream: Upstream) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: ClientSide(upstream), host, port, backlog=4096, reuse_address=True
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument("--upstream-key", required=True)
    args = parser.parse_args()
    target = urlsplit(args.upstream)
    if target.scheme != "http" or not target.hostname:
        parser.error("--upstream must be http://HOST:PORT")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    upstream = Upstream(target.hostname, target.port or 80, args.upstream_key)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port, upstream))


if __name__ == "__main__":
    main()
