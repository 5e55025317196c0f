"""The running app's dependencies and the operations that span several of them (deletion, memory service,
tool loop, index progress): built by `wiring`, used by the edge, which never imports the composition
root."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from gateway.errors import StoreError
from gateway.memory.agentic import ToolLoop
from gateway.memory.conversation_search import ConversationSearch
from gateway.memory.ports import MemoryStore
from gateway.memory.service import MemoryService
from gateway.metrics import Counters
from gateway.ports import JobQueue, JSONObject, MessageStore, ResponseStore, SummaryStore, Tokenizers, Tracer
from gateway.records import EMBED, Conversation, IndexBacklog, embed_key_prefix
from gateway.telemetry.cache_sizes import CacheSizes
from gateway.telemetry.metrics import Metrics
from gateway.tenants import TenantRegistry
from gateway.tracing import NullTracer

if TYPE_CHECKING:  # the job handlers' modules stay out of the edge's imports
    from gateway.jobs.embed import IndexTarget
    from gateway.jobs.extract_memory import MemoryTarget
    from gateway.jobs.worker import WorkerPool

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Deps:
    """Everything a running app needs, built once in the lifespan and passed explicitly."""

    tenants: TenantRegistry
    store: MessageStore
    summaries: SummaryStore
    jobs: JobQueue
    workers: WorkerPool  # started and stopped by the app lifespan; `workers.register(kind, handler)`
    tokenizers: Tokenizers
    responses: ResponseStore  # the Responses API's stored responses
    metrics: Metrics  # GET /metrics
    counters: Counters = field(default_factory=Counters)
    indexes: dict[str, IndexTarget] = field(default_factory=dict)  # tenant -> its retrieval index
    memories: MemoryStore | None = None
    memory: dict[str, MemoryTarget] = field(default_factory=dict)  # tenant -> its memory
    tracer: Tracer = field(default_factory=NullTracer)  # request traces (tracing.otlp_endpoint)
    caches: CacheSizes = field(default_factory=CacheSizes)  # what each cache holds, for the probes

    def cache_megabytes(self) -> dict[str, float]:
        """MB each cache holds now, all owners together (`/healthz`)."""
        held: dict[str, int] = {}
        for (cache, _), size in self.caches.read().items():
            held[cache] = held.get(cache, 0) + size
        return {cache: round(size / 2**20, 2) for cache, size in sorted(held.items())}

    async def delete_conversations(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> list[str]:
        """Delete conversations from the index (vectors included), then from the store: if the index
        fails, the conversation is still there and the DELETE can be retried."""
        target = self.indexes.get(tenant)
        if target is not None:
            await target.index.delete(tenant, conversation_id=conversation_id, user_id=user_id)
        deleted = await self.store.delete_conversations(
            tenant, conversation_id=conversation_id, user_id=user_id
        )
        if target is not None and user_id is not None and conversation_id is None:
            # Rows an embed job wrote before the conversation was known to be the user's go too.
            for conversation in deleted:
                await target.index.delete(tenant, conversation_id=conversation)
        if self.memories is not None and deleted:
            await self.memories.forget_conversations(tenant, deleted)
        return deleted

    def memory_service(self, tenant: str) -> MemoryService | None:
        """The memory API's operations for a tenant with memory; None when it has none."""
        target = self.memory.get(tenant)
        if target is None or self.memories is None:
            return None
        return MemoryService(
            self.memories, target.vectors, target.embedder, forget_sent=self.store.forget_sent_context
        )

    def tool_loop(self, tenant: str) -> ToolLoop | None:
        """What answers the model's memory_search calls for a tenant with agentic recall."""
        service = self.memory_service(tenant)
        target = self.memory.get(tenant)
        if service is None or target is None or not target.config.agentic:
            return None
        index = self.indexes.get(tenant)
        conversations = (
            ConversationSearch(index.index, index.embedder, self.store)
            if index is not None and target.config.conversation_search
            else None
        )
        return ToolLoop(service, target.config.agentic_rounds, conversations)

    async def delete_user(self, tenant: str, user_id: str) -> tuple[list[str], list[str]]:
        """Everything of one user: their conversations (as above) and their memories (rows, vectors,
        links). Returns (conversation ids, memory ids) deleted."""
        conversations = await self.delete_conversations(tenant, user_id=user_id)
        service = self.memory_service(tenant)
        memories = await service.delete_user(tenant, user_id) if service is not None else []
        return conversations, memories

    async def job_counts(self) -> dict[str, int] | None:
        """Jobs per status for `/healthz`; None when the database cannot say (health must still answer)."""
        try:
            return await self.jobs.counts()
        except StoreError:
            log.warning("cannot count jobs", exc_info=True)
            return None

    async def oldest_queued(self) -> dict[str, float] | None:
        """Per kind, the seconds the oldest due queued job has waited (the backlog's age); None when the
        database cannot say."""
        try:
            return await self.jobs.oldest_queued()
        except StoreError:
            log.warning("cannot age the job backlog", exc_info=True)
            return None

    async def index_progress(self, conversation: Conversation) -> JSONObject | None:
        """How far the index has got with a conversation: messages stored, searchable (by keyword at
        least) and embedded; None when its tenant has no retrieval."""
        if conversation.tenant not in self.indexes:
            return None
        pending = await self.jobs.pending(EMBED, embed_key_prefix(conversation.id), conversation.tenant)
        backlog = IndexBacklog.of(pending)
        total = conversation.message_count
        return {
            "messages": total,
            "searchable": max(total - backlog.unsearchable, 0),
            "embedded": max(total - backlog.unembedded, 0),
            # Embedded with their neighbours' views too (a long history gets those last).
            "with_neighbours": max(total - backlog.unembedded - backlog.alone, 0),
            "complete": not backlog,
        }

    async def indexing(self) -> JSONObject | None:
        """The whole index backlog for `/healthz`: conversations being indexed and their messages left;
        None when the database cannot say."""
        try:
            pending = await self.jobs.pending(EMBED, f"{EMBED}:")
        except StoreError:
            log.warning("cannot read the index backlog", exc_info=True)
            return None
        backlog = IndexBacklog.of(pending)
        conversations = {p.get("conversation_id") for p in pending} - {None}
        return {
            "conversations": len(conversations),
            "unsearchable": backlog.unsearchable,
            "unembedded": backlog.unembedded,
            "without_neighbours": backlog.alone,
        }

    async def aclose(self) -> None:
        await self.workers.stop()
        await anyio.to_thread.run_sync(self.tracer.shutdown)  # exports the spans still batched
        await self.tenants.aclose()
        await self.store.aclose()
        for closing in {id(t.index): t.index for t in self.indexes.values()}.values():
            await closing.aclose()
        for vectors in {id(t.vectors): t.vectors for t in self.memory.values()}.values():
            await vectors.aclose()
        embedders = [
            *(t.embedder for t in self.indexes.values()),
            *(t.embedder for t in self.memory.values()),
        ]
        for embedder in {id(e): e for e in embedders}.values():
            await embedder.aclose()
