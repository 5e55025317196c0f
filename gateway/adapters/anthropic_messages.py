"""Upstream adapter for Anthropic's own Messages API: `/v1/messages` requests forwarded natively.

Used for `/v1/messages` when the tenant's provider is `anthropic` (chat completions to the same tenant
still go through litellm). The transport is the aiohttp pass-through; this module only adds Anthropic's
authentication (`x-api-key`) and version header.
"""

from __future__ import annotations

from gateway.adapters.aiohttp_upstream import AiohttpUpstream
from gateway.config import UpstreamConfig
from gateway.ports import Headers, UpstreamResponse

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"


class AnthropicMessages:
    def __init__(self, name: str, config: UpstreamConfig) -> None:
        self._config = config
        root = config.base_url or DEFAULT_BASE_URL
        # Auth is added here (x-api-key), so the transport is given no key of its own to send.
        transport = config.model_copy(
            update={
                "provider": "openai",
                "base_url": f"{root}/v1",
                "api_key": None,
                "pass_through_client_key": False,
            }
        )
        self._transport = AiohttpUpstream(name, transport)

    def _headers(self, headers: Headers, client_key: str | None) -> Headers:
        key = client_key if self._config.pass_through_client_key else self._config.api_key
        out = [
            (k, v) for k, v in headers if k.lower() not in ("x-api-key", "content-type", "accept-encoding")
        ]
        if not any(k.lower() == "anthropic-version" for k, _ in out):
            out.append(("anthropic-version", DEFAULT_VERSION))
        out += [("content-type", "application/json"), ("accept-encoding", "identity")]
        return [*out, ("x-api-key", key)] if key else out

    async def messages(self, body: bytes, headers: Headers, client_key: str | None) -> UpstreamResponse:
        return await self._post("/messages", body, headers, client_key)

    async def count_tokens(self, body: bytes, headers: Headers, client_key: str | None) -> UpstreamResponse:
        return await self._post("/messages/count_tokens", body, headers, client_key)

    async def _post(
        self, path: str, body: bytes, headers: Headers, client_key: str | None
    ) -> UpstreamResponse:
        # decompress: the gateway reads the answer (to store it), as it does chat completions.
        return await self._transport.send("POST", path, self._headers(headers, client_key), body)

    async def aclose(self) -> None:
        await self._transport.aclose()
