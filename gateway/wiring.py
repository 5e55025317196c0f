"""The one place that turns configuration into concrete adapters."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.config import GatewayConfig, TenantConfig
from gateway.metrics import Counters
from gateway.pipeline.steps import ChatPipeline
from gateway.ports import Upstream
from gateway.tenants import Tenant, TenantRegistry


@dataclass(slots=True)
class Deps:
    """Everything a running app needs, built once in the lifespan and passed explicitly."""

    tenants: TenantRegistry
    pipeline: ChatPipeline
    counters: Counters = field(default_factory=Counters)

    async def aclose(self) -> None:
        await self.tenants.aclose()


def build_upstream(tenant: TenantConfig) -> Upstream:
    if tenant.upstream.is_openai_compatible:
        from gateway.adapters.http_upstream import HttpUpstream

        return HttpUpstream(tenant.name, tenant.upstream)
    # Non-OpenAI providers go through litellm, which is only imported when such a tenant exists.
    from gateway.adapters.litellm_upstream import LiteLLMUpstream

    return LiteLLMUpstream(tenant.name, tenant.upstream)


def build_deps(config: GatewayConfig) -> Deps:
    counters = Counters()
    tenants = TenantRegistry(Tenant(t.name, t, build_upstream(t)) for t in config.tenants)
    return Deps(tenants=tenants, pipeline=ChatPipeline(counters), counters=counters)
