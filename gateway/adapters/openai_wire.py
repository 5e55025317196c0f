"""What every OpenAI-compatible upstream adapter sends: the URL, the auth header and the chat body."""

from __future__ import annotations

import orjson

from gateway.config import UpstreamConfig
from gateway.ports import ChatPayload, Headers


def with_auth(config: UpstreamConfig, headers: Headers, client_key: str | None) -> Headers:
    """The tenant's key, or the client's own in pass-through mode; none for a keyless server."""
    key = client_key if config.pass_through_client_key else config.api_key
    return [*headers, ("authorization", f"Bearer {key}")] if key else headers


def chat_request(
    config: UpstreamConfig, payload: ChatPayload, headers: Headers, client_key: str | None
) -> tuple[str, Headers, bytes]:
    """(url, headers, body) of a chat completion; unchanged payloads keep the client's exact bytes."""
    content = payload.raw if payload.raw is not None else orjson.dumps(payload.data)
    sent = [*headers, ("content-type", "application/json"), ("accept-encoding", "identity")]
    return f"{config.base_url}/chat/completions", with_auth(config, sent, client_key), content


def forward_url(config: UpstreamConfig, path: str, query: str) -> str:
    return f"{config.base_url}{path}" + (f"?{query}" if query else "")
