"""The one place that turns configuration into concrete adapters and per-tenant pipelines."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.config import GatewayConfig, TenantConfig
from gateway.errors import StoreError
from gateway.jobs.compact import CompactHandler, CompactionTarget
from gateway.jobs.worker import JobHandler, WorkerPool
from gateway.metrics import Counters
from gateway.pipeline.context.builder import ContextBuilder
from gateway.pipeline.context.summary import SummarySection
from gateway.pipeline.ingest import IngestStep
from gateway.pipeline.persist import COMPACT, CompactionPolicy, PersistStep
from gateway.pipeline.steps import ChatPipeline, CompleteStep, PrepareStep
from gateway.ports import JobQueue, MessageStore, ModelCatalog, SummaryStore, Tokenizers, Upstream
from gateway.tenants import Tenant, TenantRegistry

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Deps:
    """Everything a running app needs, built once in the lifespan and passed explicitly."""

    tenants: TenantRegistry
    store: MessageStore
    summaries: SummaryStore
    jobs: JobQueue
    workers: WorkerPool  # started and stopped by the app lifespan; `workers.register(kind, handler)`
    counters: Counters = field(default_factory=Counters)

    async def job_counts(self) -> dict[str, int] | None:
        """Jobs per status for `/healthz`; None when the database cannot say (health must still answer)."""
        try:
            return await self.jobs.counts()
        except StoreError:
            log.warning("cannot count jobs", exc_info=True)
            return None

    async def aclose(self) -> None:
        await self.workers.stop()
        await self.tenants.aclose()
        await self.store.aclose()


def build_upstream(tenant: TenantConfig) -> Upstream:
    if tenant.upstream.is_openai_compatible:
        if tenant.upstream.http_client == "aiohttp":
            from gateway.adapters.aiohttp_upstream import AiohttpUpstream

            return AiohttpUpstream(tenant.name, tenant.upstream)
        from gateway.adapters.http_upstream import HttpUpstream

        return HttpUpstream(tenant.name, tenant.upstream)
    # Non-OpenAI providers go through litellm, which is only imported when such a tenant exists.
    from gateway.adapters.litellm_upstream import LiteLLMUpstream

    return LiteLLMUpstream(tenant.name, tenant.upstream)


def compacts(tenant: TenantConfig) -> bool:
    """Background summaries need the context builder and a key of the gateway's own for the calls."""
    return (
        tenant.store_conversations
        and tenant.context.enabled
        and tenant.compaction.enabled
        # With pass-through keys there is no key of the gateway's own to pay for background calls.
        and not tenant.upstream.pass_through_client_key
    )


def build_pipeline(
    tenant: TenantConfig,
    store: MessageStore,
    summaries: SummaryStore,
    tokenizers: Tokenizers,
    catalog: ModelCatalog,
    counters: Counters,
) -> ChatPipeline:
    if not tenant.store_conversations:
        return ChatPipeline(counters)  # a pure proxy: nothing stored, nothing rewritten
    context = tenant.context
    coverage = context.budget_tokens if context.enabled else 0
    prepare: list[PrepareStep] = [IngestStep(store, tokenizers, tenant.identity, coverage)]
    policy = None
    if context.enabled:
        sections = [SummarySection(summaries, tenant.compaction.summary_tokens)]
        prepare.append(ContextBuilder(context, tokenizers, catalog, sections))
    if compacts(tenant):
        policy = CompactionPolicy.for_tenant(context, tenant.compaction)
    complete: list[CompleteStep] = [PersistStep(store, tokenizers, policy)]
    return ChatPipeline(counters, prepare, complete)


def build_deps(config: GatewayConfig, handlers: Mapping[str, JobHandler] | None = None) -> Deps:
    """Adapters and pipelines from `config`; `handlers` (job kind -> handler) go to the worker pool."""
    from gateway.adapters.cached_store import CachedMessageStore
    from gateway.adapters.model_catalog import LiteLLMModelCatalog
    from gateway.adapters.sql.store import SqlStore
    from gateway.adapters.sql.summaries import SqlSummaryStore
    from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizers

    counters = Counters()
    sql = SqlStore.open(config.storage.database_url)
    summaries = SqlSummaryStore(sql.engine)
    size = config.storage.node_cache_size
    store: MessageStore = CachedMessageStore(sql, size) if size else sql
    tokenizers = TiktokenTokenizers()
    # Load both offline encodings now (about a second), not inside the first request that needs one.
    for model in ("gpt-4o", "gpt-4"):
        tokenizers.for_model(model)
    catalog = LiteLLMModelCatalog.load()
    tenants = TenantRegistry(
        Tenant(
            t.name, t, build_upstream(t), build_pipeline(t, store, summaries, tokenizers, catalog, counters)
        )
        for t in config.tenants
    )
    targets = {
        t.name: CompactionTarget(
            t.upstream,
            t.config.compaction,
            CompactionPolicy.for_tenant(t.config.context, t.config.compaction),
        )
        for t in tenants.tenants
        if compacts(t.config)
    }
    all_handlers: dict[str, JobHandler] = {COMPACT: CompactHandler(store, summaries, tokenizers, targets.get)}
    all_handlers.update(handlers or {})
    jobs = sql.jobs
    workers = WorkerPool(jobs, all_handlers, config.jobs)
    # Jobs this process enqueues (with the messages that cause them) start without waiting for a poll.
    jobs.add_listener(workers.notify)
    return Deps(
        tenants=tenants, store=store, summaries=summaries, jobs=jobs, workers=workers, counters=counters
    )
