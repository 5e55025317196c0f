"""Tenants at run time: each gateway key resolves to a tenant and its upstream."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.config import TenantConfig
from gateway.errors import AuthenticationFailed
from gateway.limits import RateLimiter
from gateway.pipeline.body_memo import BodyMemo
from gateway.pipeline.steps import ChatPipeline
from gateway.ports import MessagesUpstream, Upstream


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    config: TenantConfig
    upstream: Upstream
    pipeline: ChatPipeline
    messages: MessagesUpstream | None = None  # the provider's native Messages API (Anthropic), if any
    limiter: RateLimiter | None = None  # limits.requests_per_minute; None: no limit
    bodies: BodyMemo | None = None  # storage.body_memo_bytes: recent large chat bodies, not parsed twice

    def body_limit(self, server_limit: int) -> int:
        own = self.config.limits.max_body_bytes
        return server_limit if own is None else min(own, server_limit)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the tenant, and the client's provider key when the tenant passes keys through."""

    tenant: Tenant
    client_key: str | None
    # False for the keyless tenant that takes any unrecognised key: such callers may chat, not read the API.
    authenticated: bool = True


class TenantRegistry:
    """Looks callers up by the sha256 of their key; keys are never kept in clear."""

    def __init__(self, tenants: Iterable[Tenant]) -> None:
        self._by_digest: dict[str, Tenant] = {}
        self._open: Tenant | None = None
        self.tenants = tuple(tenants)
        for tenant in self.tenants:
            for digest in tenant.config.key_digests():
                self._by_digest[digest] = tenant
            if not tenant.config.api_keys:
                self._open = tenant

    def resolve(self, bearer: str | None, gateway_key: str | None) -> Caller:
        """`X-Gateway-Key` names the tenant when present, and the bearer is then the provider key."""
        if gateway_key is not None:
            tenant = self._lookup(gateway_key)
            if tenant is None:
                raise AuthenticationFailed("Incorrect gateway key provided in X-Gateway-Key.")
            return Caller(tenant, bearer if tenant.config.upstream.pass_through_client_key else None)
        if bearer:
            tenant = self._lookup(bearer)
            if tenant is not None:
                return Caller(tenant, None)
        if self._open is not None:
            return Caller(self._open, bearer, authenticated=False)
        if not bearer:
            raise AuthenticationFailed(
                "You didn't provide an API key. Send your gateway key as 'Authorization: Bearer KEY'."
            )
        raise AuthenticationFailed("Incorrect API key provided: the gateway does not know this key.")

    def _lookup(self, key: str) -> Tenant | None:
        return self._by_digest.get(hashlib.sha256(key.encode()).hexdigest())

    async def aclose(self) -> None:
        for tenant in self.tenants:
            await tenant.upstream.aclose()
            if tenant.messages is not None:
                await tenant.messages.aclose()
