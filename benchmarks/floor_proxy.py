"""The stack floor: the least a proxy built on the gateway's stack can do, for the overhead benchmark.

    python benchmarks/floor_proxy.py --port 9102 --upstream http://127.0.0.1:9101 --upstream-key sk-...

uvicorn (`loop="uvloop", http="httptools"`) serving a raw ASGI app (no starlette, no routing), one
aiohttp `ClientSession` to the upstream (a TCPConnector with a large limit, keep-alive). No JSON parsing,
no auth check: the whole request body is read and sent with the same method to the upstream's same path
(and query) with the upstream's Authorization header; the answer comes back with its status, content-type
and body (read whole), or, when the upstream answers `text/event-stream`, relayed chunk by chunk as
aiohttp's `resp.content.iter_any()` yields them (`more_body=True`).
"""

from __future__ import annotations

import argparse
import resource
from typing import Any

import aiohttp
import uvicorn

Scope = dict[str, Any]


class FloorProxy:
    def __init__(self, upstream: str, key: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.auth = f"Bearer {key}"
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.http(scope, receive, send)

    async def lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=10_000, keepalive_timeout=30)
                self.session = aiohttp.ClientSession(
                    connector=connector,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                    auto_decompress=False,
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Any, send: Any) -> None:
        parts: list[bytes] = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(parts)
        url = self.upstream + scope["path"]
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode("latin-1")
        headers = {"Authorization": self.auth}
        if body:
            headers["Content-Type"] = "application/json"
        assert self.session is not None
        try:
            async with self.session.request(scope["method"], url, data=body or None, headers=headers) as resp:
                media = resp.headers.get("Content-Type", "application/json").encode("latin-1")
                if media.startswith(b"text/event-stream"):
                    await send(
                        {
                            "type": "http.response.start",
                            "status": resp.status,
                            "headers": [(b"content-type", media)],
                        }
                    )
                    async for data in resp.content.iter_any():
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                data = await resp.read()
                status = resp.status
        except aiohttp.ClientError as exc:
            media, status = b"application/json", 502
            data = b'{"error":{"message":"upstream: %s"}}' % type(exc).__name__.encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", media), (b"content-length", str(len(data)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": data})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--upstream", required=True, help="http://127.0.0.1:PORT (paths are appended as sent)"
    )
    parser.add_argument("--upstream-key", required=True)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvicorn.run(
        FloorProxy(args.upstream, args.upstream_key),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=75,
    )


if __name__ == "__main__":
    main()
