"""PROTOTYPE, benchmarks only: the real gateway app with an upstream adapter on plain aiohttp (no httpx).

    python benchmarks/prototype_aiohttp_gateway.py --config gateway.yaml --port 9200

It measures what dropping the httpx layer (`http_client: httpx-aiohttp` wraps aiohttp in httpx's request
and response models) would save. Everything else is the shipped gateway: `create_app`, middleware,
routes, pipeline and SSE relay, served by uvicorn with uvloop + httptools like `context-gateway serve`.
Only the `Upstream` adapter differs. Not a supported configuration; see BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
from collections.abc import AsyncIterator

import aiohttp
import orjson
import uvicorn

from gateway.app import create_app
from gateway.config import UpstreamConfig, load_config
from gateway.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable
from gateway.ports import ChatPayload, Headers, UpstreamResponse
from gateway.tenants import TenantRegistry
from gateway.wiring import build_deps


class AiohttpUpstream:
    """Same contract as `gateway.adapters.http_upstream.HttpUpstream`, on one aiohttp ClientSession."""

    def __init__(self, name: str, config: UpstreamConfig) -> None:
        assert config.base_url is not None
        self.name = name
        self._config = config
        self._base_url = config.base_url
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # created lazily: it must be born inside the running loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self._config.connect_timeout_seconds,
                    sock_read=self._config.timeout_seconds,
                ),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    def _auth_headers(self, headers: Headers, client_key: str | None) -> Headers:
        key = client_key if self._config.pass_through_client_key else self._config.api_key
        if key:
            return [*headers, ("authorization", f"Bearer {key}")]
        return headers

    async def chat_completions(
        self, payload: ChatPayload, headers: Headers, client_key: str | None
    ) -> UpstreamResponse:
        content = payload.raw if payload.raw is not None else orjson.dumps(payload.data)
        out_headers = self._auth_headers(
            [*headers, ("content-type", "application/json"), ("accept-encoding", "identity")], client_key
        )
        return await self._send("POST", f"{self._base_url}/chat/completions", out_headers, content)

    async def forward(
        self,
        method: str,
        path: str,
        query: str,
        headers: Headers,
        body: AsyncIterator[bytes] | bytes,
        client_key: str | None,
    ) -> UpstreamResponse:
        url = f"{self._base_url}{path}" + (f"?{query}" if query else "")
        return await self._send(method, url, self._auth_headers(headers, client_key), body)

    async def _send(
        self, method: str, url: str, headers: Headers, content: AsyncIterator[bytes] | bytes
    ) -> UpstreamResponse:
        try:
            response = await self._client().request(
                method, url, headers=headers, data=content, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._translate(exc) from exc

        async def close() -> None:
            if response.content.is_eof():
                response.release()
            else:
                response.close()  # an unfinished body: drop the connection, cancelling upstream work

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
            raise self._translate(exc) from exc

    def _translate(self, exc: BaseException) -> UpstreamError:
        if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
            return UpstreamTimeout(f"upstream {self._base_url} timed out")
        return UpstreamUnreachable(f"upstream {self._base_url} failed: {type(exc).__name__}: {exc}")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    config = load_config(args.config)
    # The gateway's own wiring (whatever pipeline it builds), with only the upstream adapter swapped.
    deps = build_deps(config)
    deps.tenants = TenantRegistry(
        dataclasses.replace(t, upstream=AiohttpUpstream(t.name, t.config.upstream))
        for t in deps.tenants.tenants
    )
    uvicorn.run(
        create_app(config, deps),
        host=config.server.host,
        port=args.port,
        log_level=config.server.log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


if __name__ == "__main__":
    main()
