"""The one place that turns configuration into concrete adapters and per-tenant pipelines."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.config import GatewayConfig, TenantConfig
from gateway.metrics import Counters
from gateway.pipeline.context.builder import ContextBuilder
from gateway.pipeline.ingest import IngestStep
from gateway.pipeline.persist import PersistStep
from gateway.pipeline.steps import ChatPipeline, CompleteStep, PrepareStep
from gateway.ports import MessageStore, ModelCatalog, Tokenizers, Upstream
from gateway.tenants import Tenant, TenantRegistry


@dataclass(slots=True)
class Deps:
    """Everything a running app needs, built once in the lifespan and passed explicitly."""

    tenants: TenantRegistry
    store: MessageStore
    counters: Counters = field(default_factory=Counters)

    async def aclose(self) -> None:
        await self.tenants.aclose()
        await self.store.aclose()


def build_upstream(tenant: TenantConfig) -> Upstream:
    if tenant.upstream.is_openai_compatible:
        from gateway.adapters.http_upstream import HttpUpstream

        return HttpUpstream(tenant.name, tenant.upstream)
    # Non-OpenAI providers go through litellm, which is only imported when such a tenant exists.
    from gateway.adapters.litellm_upstream import LiteLLMUpstream

    return LiteLLMUpstream(tenant.name, tenant.upstream)


def build_pipeline(
    tenant: TenantConfig,
    store: MessageStore,
    tokenizers: Tokenizers,
    catalog: ModelCatalog,
    counters: Counters,
) -> ChatPipeline:
    if not tenant.store_conversations:
        return ChatPipeline(counters)  # a pure proxy: nothing stored, nothing rewritten
    coverage = tenant.context.budget_tokens if tenant.context.enabled else 0
    prepare: list[PrepareStep] = [IngestStep(store, tokenizers, tenant.identity, coverage)]
    if tenant.context.enabled:
        prepare.append(ContextBuilder(tenant.context, tokenizers, catalog))
    complete: list[CompleteStep] = [PersistStep(store, tokenizers)]
    return ChatPipeline(counters, prepare, complete)


def build_deps(config: GatewayConfig) -> Deps:
    from gateway.adapters.model_catalog import LiteLLMModelCatalog
    from gateway.adapters.sql.store import SqlStore
    from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizers

    counters = Counters()
    store = SqlStore.open(config.storage.database_url)
    tokenizers = TiktokenTokenizers()
    catalog = LiteLLMModelCatalog.load()
    tenants = TenantRegistry(
        Tenant(t.name, t, build_upstream(t), build_pipeline(t, store, tokenizers, catalog, counters))
        for t in config.tenants
    )
    return Deps(tenants=tenants, store=store, counters=counters)
