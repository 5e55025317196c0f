"""The one place that turns configuration into concrete adapters and per-tenant pipelines."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

from gateway.adapters import registry
from gateway.adapters.keyword_rank import ViewRanker
from gateway.adapters.lazy_index import LazyMemoryVectors, LazyVectorIndex
from gateway.adapters.sql.tables import utcnow
from gateway.adapters.static_meaning import StaticMeaning
from gateway.config import GatewayConfig, MemoryConfig, TenantConfig, TracingConfig
from gateway.errors import ConfigError
from gateway.features import compacts, learns, remembers, retrieves
from gateway.jobs.compact import CompactHandler, CompactionTarget
from gateway.jobs.conversation_title import TitleHandler
from gateway.jobs.embed import EmbedHandler, IndexTarget
from gateway.jobs.extract_memory import ExtractMemoryHandler, MemoryTarget
from gateway.jobs.memory_profile import ProfileHandler
from gateway.jobs.worker import JobHandler, WorkerPool
from gateway.limits import RateLimiter
from gateway.memory.agentic import OfferMemoryTool
from gateway.memory.ports import MemoryStore, MemoryVectors
from gateway.memory.scope import MemoryScopeStep, incognito
from gateway.memory.section import MemorySection
from gateway.metrics import Counters
from gateway.pipeline.body_memo import BodyMemo
from gateway.pipeline.call import ChatCall
from gateway.pipeline.compaction import CompactionPolicy
from gateway.pipeline.context.builder import ContextBuilder
from gateway.pipeline.context.prefetch import QuestionPrefetch
from gateway.pipeline.context.retrieval import RetrievalSection
from gateway.pipeline.context.section import Section, StableSection
from gateway.pipeline.context.summary import SummarySection
from gateway.pipeline.history_memo import HistoryMemo
from gateway.pipeline.identify import explicit_identity
from gateway.pipeline.ingest import IngestStep
from gateway.pipeline.persist import PersistStep
from gateway.pipeline.steps import ChatPipeline, PrepareStep
from gateway.ports import (
    Embedder,
    EpochStore,
    JobQueue,
    MessageStore,
    MessagesUpstream,
    ModelCatalog,
    SummaryStore,
    Tokenizers,
    Tracer,
    Upstream,
    VectorIndex,
)
from gateway.prefix_ledger import PrefixLedger
from gateway.records import (
    COMPACT,
    EMBED,
    EXTRACT_MEMORY,
    PROFILE,
    TITLE,
)
from gateway.services import Deps
from gateway.telemetry.cache_sizes import PROCESS, CacheSizes
from gateway.telemetry.metrics import Metrics
from gateway.tenants import Tenant, TenantRegistry
from gateway.tracing import NullTracer

if TYPE_CHECKING:
    from gateway.adapters.sql.store import SqlStore

log = logging.getLogger(__name__)


def build_upstream(tenant: TenantConfig) -> Upstream:
    return registry.upstream(tenant)


def rate_limiter(tenant: TenantConfig) -> RateLimiter | None:
    limits = tenant.limits
    return RateLimiter(limits.requests_per_minute, limits.burst) if limits.requests_per_minute else None


def build_messages_upstream(tenant: TenantConfig) -> MessagesUpstream | None:
    """Anthropic tenants answer `/v1/messages` natively; every other provider is reached by conversion."""
    if tenant.upstream.provider != "anthropic":
        return None
    from gateway.adapters.anthropic_messages import AnthropicMessages

    return AnthropicMessages(tenant.name, tenant.upstream)


def background_upstream(tenant: TenantConfig, upstream: Upstream) -> Upstream:
    """What the gateway's own calls for `tenant` go through: its key where a client's would go."""
    key = tenant.upstream.api_key
    if tenant.upstream.pass_through_client_key and key:
        from gateway.adapters.own_key import OwnKeyUpstream

        return OwnKeyUpstream(upstream, key)
    return upstream


@dataclass(frozen=True, slots=True)
class Shared:
    """What every tenant's pipeline shares: the stores, tokenizers, model catalog and counters."""

    store: MessageStore
    summaries: SummaryStore
    tokenizers: Tokenizers
    catalog: ModelCatalog
    counters: Counters
    jobs: JobQueue | None = None
    clock: Callable[[], datetime] = utcnow
    epochs: EpochStore | None = None
    history_memo_bytes: int = 0  # per tenant; 0: no memo
    unanswered_index_seconds: float = 300.0
    caches: CacheSizes = field(default_factory=CacheSizes)  # every cache built, for /metrics


def build_pipeline(
    tenant: TenantConfig,
    shared: Shared,
    *,
    index: IndexTarget | None = None,
    memory: tuple[MemoryStore, MemoryTarget] | None = None,
) -> ChatPipeline:
    if not tenant.store_conversations:
        return ChatPipeline(shared.counters)  # a pure proxy: nothing stored, nothing rewritten
    context = tenant.context
    memo = HistoryMemo(shared.history_memo_bytes) if shared.history_memo_bytes else None
    shared.caches.add(tenant.name, memo)
    prepare: list[PrepareStep] = [
        IngestStep(
            store=shared.store,
            tokenizers=shared.tokenizers,
            identity=tenant.identity,
            coverage_tokens=context.budget_tokens if context.enabled else 0,
            memo=memo,
            unanswered_index_seconds=shared.unanswered_index_seconds if index is not None else None,
        )
    ]
    if memory is not None:
        prepare.append(MemoryScopeStep(tenant.memory))
        # Before the builder, so the budget counts the tool's definition.
        prepare.append(
            OfferMemoryTool(tenant.memory, index is not None and tenant.memory.conversation_search)
        )
    embedder = index.embedder if index is not None else memory[1].embedder if memory is not None else None
    if context.enabled and embedder is not None:
        # The question is embedded while the request is stored: the retrieval and memory sections pick
        # it up.
        prepare.insert(
            0,
            QuestionPrefetch(
                embedder=embedder,
                budget_tokens=context.budget_tokens,
                remembers=_will_remember(tenant.memory) if memory is not None else None,
            ),
        )
    if context.enabled:
        prepare.append(_builder(tenant, shared, index, memory))
    delay = tenant.memory.extract_delay_seconds if memory is not None and learns(tenant) else None
    clock = shared.clock
    persist = PersistStep(
        store=shared.store,
        tokenizers=shared.tokenizers,
        compaction=CompactionPolicy.for_tenant(context, tenant.compaction) if compacts(tenant) else None,
        index=index is not None,
        extract_delay=delay,
        titles=delay is not None and tenant.memory.recent_conversations > 0,
        counters=shared.counters,
        ledger=PrefixLedger(clock=lambda: clock().timestamp()),
    )
    return ChatPipeline(shared.counters, prepare, [persist])


def _builder(
    tenant: TenantConfig,
    shared: Shared,
    index: IndexTarget | None,
    memory: tuple[MemoryStore, MemoryTarget] | None,
) -> ContextBuilder:
    """The stable block (pinned per epoch), then the volatile tail before the question (design.md
    section 14), each in priority order; the recent window is built in."""
    stable: list[StableSection] = [SummarySection(shared.summaries, tenant.compaction.summary_tokens)]
    tail: list[Section] = []
    if index is not None:
        meaning = StaticMeaning() if tenant.retrieval.meaning_in_hand else None
        shared.caches.add(tenant.name, meaning)
        retrieval = RetrievalSection(
            index=index.index,
            embedder=index.embedder,
            store=shared.store,
            config=tenant.retrieval,
            clock=shared.clock,
            jobs=shared.jobs,
            rank_views=ViewRanker(),
            meaning=meaning,
        )
        shared.caches.add(tenant.name, retrieval.memo)
        tail.append(retrieval)
    always: frozenset[str] = frozenset()
    if memory is not None:
        memories, target = memory
        memory_section = partial(
            MemorySection,
            memories=memories,
            vectors=target.vectors,
            embedder=target.embedder,
            config=tenant.memory,
            conversations=shared.store,
        )
        parts = [
            memory_section(part="standing", name="memory"),
            memory_section(part="relevant", name="memory_relevant"),
        ]
        stable.append(parts[0])
        tail.append(parts[1])  # the lowest priority when cutting (design.md §4)
        always = frozenset(p.name for p in parts)
    return ContextBuilder(
        config=tenant.context,
        tokenizers=shared.tokenizers,
        catalog=shared.catalog,
        stable=stable,
        tail=tail,
        epochs=shared.epochs,
        always=always,
    )


def _will_remember(config: MemoryConfig) -> Callable[[ChatCall], bool]:
    """Whether a call will search memory (a user is named or defaulted, and it is not incognito)."""

    def will(call: ChatCall) -> bool:
        if incognito(call.headers):
            return False
        return (
            config.default_user is not None or explicit_identity(call.headers, call.body).user_id is not None
        )

    return will


def index_table(model: str) -> str:
    """One index table per embedding model: vectors of different models are never compared."""
    return "messages_" + re.sub(r"[^A-Za-z0-9_]+", "_", model).strip("_")


@dataclass(slots=True)
class Embedders:
    """Each tenant's embedder, from the registry; tenants whose specs share a key share one (a built-in
    model is loaded once)."""

    config: GatewayConfig
    upstreams: Mapping[str, Upstream]
    tokenizers: Tokenizers
    shared: dict[str, Embedder] = field(default_factory=dict)

    def for_tenant(self, tenant: TenantConfig) -> Embedder:
        spec = tenant.retrieval.embedder
        key = registry.embedder_key(spec)
        if key is not None and key in self.shared:
            return self.shared[key]
        context = registry.EmbedderContext(self.config, self.upstreams[tenant.name], self.tokenizers)
        made = registry.embedder(spec, context)
        if key is not None:
            self.shared[key] = made
        return made


def build_indexes(config: GatewayConfig, embedders: Embedders) -> dict[str, IndexTarget]:
    """Each retrieving tenant's embedder and index; tenants sharing a model share both (one table per
    model, rows filtered by tenant)."""
    indexes: dict[str, VectorIndex] = {}
    targets: dict[str, IndexTarget] = {}
    for tenant in config.tenants:
        if not retrieves(tenant):
            continue
        embedder = embedders.for_tenant(tenant)
        table = index_table(embedder.model)
        if table not in indexes:
            spec = registry.IndexSpec(config, table, embedder.dimensions)
            # Opened by its first use, not now: an idle gateway holds no LanceDB (lazy_index.py).
            indexes[table] = LazyVectorIndex(partial(registry.message_index, spec))
        targets[tenant.name] = IndexTarget(
            embedder,
            indexes[table],
            tenant.retrieval.index_batch_messages,
            neighbour_vectors=tenant.retrieval.neighbour_vectors,
        )
    return targets


def memory_table(model: str) -> str:
    """One memory table per embedding model, named like the model's message table."""
    return "memories_" + index_table(model).removeprefix("messages_")


def build_memory(
    config: GatewayConfig, embedders: Embedders, upstreams: Mapping[str, Upstream]
) -> dict[str, MemoryTarget]:
    """Each remembering tenant's memory index (a table per embedding model, beside the messages')."""
    tables: dict[str, MemoryVectors] = {}
    targets: dict[str, MemoryTarget] = {}
    for tenant in config.tenants:
        if not remembers(tenant):
            continue
        embedder = embedders.for_tenant(tenant)
        table = memory_table(embedder.model)
        if table not in tables:
            spec = registry.IndexSpec(config, table, embedder.dimensions)
            tables[table] = LazyMemoryVectors(partial(registry.memory_vectors, spec))  # as the indexes
        targets[tenant.name] = MemoryTarget(upstreams[tenant.name], tenant.memory, embedder, tables[table])
    return targets


def build_deps(
    config: GatewayConfig,
    handlers: Mapping[str, JobHandler] | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> Deps:
    """Adapters and pipelines from `config`; `handlers` (job kind -> handler) go to the worker pool;
    `clock` dates stored messages and resolves "last week" (a settable one replays dated histories)."""
    from gateway.adapters.sql.memories import SqlMemoryStore
    from gateway.adapters.sql.responses import SqlResponseStore

    shared, sql = _shared(config, clock)
    upstreams = {t.name: build_upstream(t) for t in config.tenants}
    own = {t.name: background_upstream(t, upstreams[t.name]) for t in config.tenants}
    embedders = Embedders(config, own, shared.tokenizers)
    indexes = build_indexes(config, embedders)
    memory = build_memory(config, embedders, own)
    memories = SqlMemoryStore(sql.engine)
    body_memo = config.storage.body_memo_bytes
    tenants = TenantRegistry(
        Tenant(
            name=t.name,
            config=t,
            upstream=upstreams[t.name],
            pipeline=build_pipeline(
                t,
                shared,
                index=indexes.get(t.name),
                memory=(memories, memory[t.name]) if t.name in memory else None,
            ),
            messages=build_messages_upstream(t),
            limiter=rate_limiter(t),
            bodies=BodyMemo(body_memo, shared.counters) if body_memo else None,
        )
        for t in config.tenants
    )
    caches = shared.caches
    shared_parts = [shared.store, shared.tokenizers, *(t.index for t in indexes.values())]
    for part in [*shared_parts, *(t.vectors for t in memory.values())]:
        caches.add(PROCESS, part)
    for tenant in tenants.tenants:
        caches.add(tenant.name, tenant.bodies)
    metrics = Metrics(shared.counters, caches.read)
    all_handlers = _handlers(config, shared, own, indexes, memory, memories, metrics)
    all_handlers.update(handlers or {})
    workers = WorkerPool(sql.jobs, all_handlers, config.jobs, observe=metrics.job)
    # Jobs this process enqueues (with the messages that cause them) start without waiting for a poll.
    sql.jobs.add_listener(workers.notify)
    return Deps(
        tenants=tenants,
        store=shared.store,
        summaries=shared.summaries,
        jobs=sql.jobs,
        workers=workers,
        tokenizers=shared.tokenizers,
        responses=SqlResponseStore(sql.engine),
        metrics=metrics,
        counters=shared.counters,
        indexes=indexes,
        memories=memories,
        memory=memory,
        tracer=build_tracer(config.tracing),
        caches=caches,
    )


def _shared(config: GatewayConfig, clock: Callable[[], datetime]) -> tuple[Shared, SqlStore]:
    """The process-wide adapters every pipeline shares, and the SQL store under them."""
    from gateway.adapters.cached_store import CachedMessageStore
    from gateway.adapters.model_catalog import LiteLLMModelCatalog
    from gateway.adapters.sql.store import SqlStore
    from gateway.adapters.sql.summaries import SqlSummaryStore
    from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizers

    sql = SqlStore.open(config.storage.database_url, clock)
    summaries = SqlSummaryStore(sql.engine)
    size = config.storage.node_cache_size
    tokenizers = TiktokenTokenizers()
    # o200k_base now (~0.4 s), not inside the first request: it counts every model but the gpt-4 and
    # gpt-3.5 families. Their cl100k_base (~30 MB resident) loads with the first request that names one.
    tokenizers.for_model("gpt-4o")
    shared = Shared(
        store=CachedMessageStore(sql, size) if size else sql,
        summaries=summaries,
        tokenizers=tokenizers,
        catalog=LiteLLMModelCatalog.load(),
        counters=Counters(),
        jobs=sql.jobs,
        clock=clock,
        epochs=summaries,
        history_memo_bytes=config.storage.history_memo_bytes,
        unanswered_index_seconds=config.jobs.unanswered_index_seconds,
    )
    return shared, sql


def _handlers(
    config: GatewayConfig,
    shared: Shared,
    own: Mapping[str, Upstream],
    indexes: Mapping[str, IndexTarget],
    memory: Mapping[str, MemoryTarget],
    memories: MemoryStore,
    metrics: Metrics,
) -> dict[str, JobHandler]:
    """The background jobs' handlers, each reaching its tenant's targets by name."""
    store, jobs = shared.store, shared.jobs
    assert jobs is not None  # the SQL store's queue, always set by _shared
    targets = {
        t.name: CompactionTarget(
            own[t.name], t.compaction, CompactionPolicy.for_tenant(t.context, t.compaction)
        )
        for t in config.tenants
        if compacts(t)
    }
    # Tenants whose memory is learnt in the background (with a key of the gateway's own).
    learners = {t.name: memory[t.name] for t in config.tenants if t.name in memory and learns(t)}
    return {
        COMPACT: CompactHandler(store, shared.summaries, shared.tokenizers, targets.get),
        EMBED: EmbedHandler(store, indexes.get, jobs, metrics.job),
        EXTRACT_MEMORY: ExtractMemoryHandler(store, memories, learners.get, jobs, shared.clock),
        PROFILE: ProfileHandler(memories, learners.get),
        TITLE: TitleHandler(store, learners.get),
    }


def build_tracer(config: TracingConfig) -> Tracer:
    """OpenTelemetry's exporter when an endpoint is configured; otherwise nothing of it is imported."""
    if config.otlp_endpoint is None:
        return NullTracer()
    try:
        from gateway.adapters.otel_tracer import OtelTracer
    except ImportError as exc:
        raise ConfigError(
            'tracing.otlp_endpoint is set but OpenTelemetry is not installed: pip install "context-gateway[otel]"'
        ) from exc
    return OtelTracer(config.otlp_endpoint, config.service_name, config.flush_seconds)
