"""A pass-through tenant's upstream as the gateway's own background calls see it (summaries, memory,
embeddings): they carry the tenant's `upstream.api_key` where a client's key would go."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gateway.ports import ChatPayload, Headers, Upstream, UpstreamResponse


@dataclass(slots=True)
class OwnKeyUpstream:
    inner: Upstream
    key: str
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.inner.name

    async def chat_completions(
        self, payload: ChatPayload, headers: Headers, client_key: str | None
    ) -> UpstreamResponse:
        return await self.inner.chat_completions(payload, headers, self.key)

    async def forward(
        self,
        method: str,
        path: str,
        query: str,
        headers: Headers,
        body: AsyncIterator[bytes] | bytes,
        client_key: str | None,
    ) -> UpstreamResponse:
        return await self.inner.forward(method, path, query, headers, body, self.key)

    async def aclose(self) -> None:
        return None  # the client-facing upstream it wraps is closed by its owner
