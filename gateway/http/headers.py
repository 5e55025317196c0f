"""Which headers cross the gateway in each direction."""

from __future__ import annotations

from gateway.ports import Headers

# Hop-by-hop headers (RFC 9110 §7.6.1) plus those the gateway sets itself.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
# x-api-key is how Anthropic SDKs send the gateway key.
_NOT_UPSTREAM = _HOP_BY_HOP | {b"authorization", b"x-api-key", b"x-gateway-key", b"cookie"}
_NOT_UPSTREAM_CHAT = _NOT_UPSTREAM | {b"accept-encoding", b"content-type"}
_NOT_DOWNSTREAM = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}
)


def to_upstream(raw: list[tuple[bytes, bytes]], *, chat: bool) -> Headers:
    """Client headers worth forwarding (OpenAI-Organization, OpenAI-Beta, user-agent, custom x-...)."""
    drop = _NOT_UPSTREAM_CHAT if chat else _NOT_UPSTREAM
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw if k not in drop]


def to_client(headers: Headers, *, decoded: bool) -> list[tuple[bytes, bytes]]:
    """Upstream headers for the client; `decoded` drops content-encoding for bodies httpx decompressed."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        lower = name.lower()
        if lower in _NOT_DOWNSTREAM or (decoded and lower == "content-encoding"):
            continue
        out.append((lower.encode("latin-1"), value.encode("latin-1")))
    return out
