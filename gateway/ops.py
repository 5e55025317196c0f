"""Operator actions the CLI runs against the configured store, outside a serving gateway."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio
import orjson

from gateway.adapters.sql.store import SqlStore
from gateway.config import GatewayConfig
from gateway.features import retrieves
from gateway.inbound.exports import Imported
from gateway.memory.records import Memory, MemoryFilter
from gateway.memory.service import MemoryService
from gateway.pipeline.call import ChatCall, ChatOutcome
from gateway.ports import JSONObject
from gateway.records import (
    EMBED,
    Conversation,
    EmbedWork,
    IndexBacklog,
    JobState,
    RequestRecord,
    StoredMessage,
    compact_job,
)
from gateway.verify import Verified, verify_tenant
from gateway.wiring import build_deps


async def compact_now(
    config: GatewayConfig,
    tenant: str,
    conversation_id: str,
    model: str | None,
    wait_seconds: float,
    echo: Callable[[str], None],
) -> str | None:
    """Queue a forced compaction and run the job workers until it is done; returns the newest summary.

    It goes through the same durable queue as the gateway's own jobs, so a running gateway may pick the
    job up instead: either way the result lands in the same store."""
    deps = build_deps(config)
    try:
        conversation = await deps.store.get_conversation(tenant, conversation_id)
        if conversation is None or conversation.last_message_id is None:
            raise LookupError(f"no conversation {conversation_id!r} with messages for tenant {tenant!r}")
        tenant_config = next((t for t in config.tenants if t.name == tenant), None)
        model = model or (tenant_config.compaction.model if tenant_config else None)
        if not model:
            raise LookupError(
                f"no model for the summarisation calls: pass --model or set compaction.model for {tenant!r}"
            )
        queued = await deps.jobs.enqueue(
            compact_job(tenant, conversation.id, conversation.last_message_id, model, force=True)
        )
        echo(
            "compaction queued" if queued else "a compaction of this conversation is already pending; waiting"
        )
        deadline = time.monotonic() + wait_seconds
        async with deps.workers.running():
            deps.workers.notify()
            while time.monotonic() < deadline:
                counts = await deps.jobs.counts(tenant)
                if counts.get("queued", 0) == 0 and counts.get("running", 0) == 0:
                    break
                await anyio.sleep(0.1)
            else:
                raise LookupError(f"the compaction did not finish within {wait_seconds:.0f} s")
        summaries = await deps.summaries.summaries(tenant, conversation.id, "global")
        return summaries[0].content if summaries else None
    finally:
        await deps.aclose()


@contextlib.asynccontextmanager
async def _store(config: GatewayConfig) -> AsyncIterator[SqlStore]:
    """The configured SQL store alone (no models, no index): what the read-only commands need."""
    store = SqlStore.open(config.storage.database_url)
    try:
        yield store
    finally:
        await store.aclose()


async def list_conversations(
    config: GatewayConfig,
    tenant: str,
    user_id: str | None,
    limit: int,
    text: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Conversation]:
    async with _store(config) as store:
        return await store.list_conversations(
            tenant, limit=limit, user_id=user_id, text=text, since=since, until=until
        )


async def conversation_tree(
    config: GatewayConfig, tenant: str, conversation_id: str
) -> tuple[Conversation, list[StoredMessage]]:
    async with _store(config) as store:
        conversation = await store.get_conversation(tenant, conversation_id)
        if conversation is None:
            raise LookupError(f"no conversation {conversation_id!r} for tenant {tenant!r}")
        return conversation, await store.conversation_messages(tenant, conversation_id)


async def request_record(
    config: GatewayConfig, tenant: str, request_id: str
) -> tuple[RequestRecord, list[StoredMessage]]:
    """A request's record and the stored path it was sent from (empty when it has none)."""
    async with _store(config) as store:
        record = await store.get_request(tenant, request_id)
        if record is None:
            raise LookupError(f"no request {request_id!r} for tenant {tenant!r}")
        path = await store.path(tenant, record.parent_message_id) if record.parent_message_id else []
    return record, path


async def job_summary(config: GatewayConfig, tenant: str | None) -> tuple[dict[str, int], list[JobState]]:
    async with _store(config) as store:
        return await store.jobs.counts(tenant), await store.jobs.failures(tenant)


@dataclass(frozen=True, slots=True)
class Reindexed:
    conversations: int
    branches: int  # embed jobs asked for: one per branch (a leaf and its whole path)
    queued: int  # of those, queued now (the others were pending already)
    failed: int  # embed jobs of the tenant that failed for good while this command ran them


async def reindex(
    config: GatewayConfig,
    tenant: str,
    conversation_id: str | None,
    *,
    run: bool,
    progress: Callable[[int], None],
) -> Reindexed:
    """Queue embed jobs for every branch of the tenant's conversations (or of one) and, with `run`, work
    through the embed queue in this process until the tenant's backlog is empty, calling `progress` with
    the messages still waiting for their vectors. Rows the index holds already are kept (the index merges
    on row id), so after a model change, whose index is a table of its own, everything is embedded anew."""
    tenant_config = next((t for t in config.tenants if t.name == tenant), None)
    if tenant_config is None:
        raise LookupError(f"no tenant {tenant!r} in this config")
    if not retrieves(tenant_config):
        raise LookupError(
            f"tenant {tenant!r} has no retrieval (retrieval.enabled): there is no index to fill"
        )
    deps = build_deps(config)
    try:
        if conversation_id is not None:
            found = await deps.store.get_conversation(tenant, conversation_id)
            if found is None:
                raise LookupError(f"no conversation {conversation_id!r} for tenant {tenant!r}")
            conversations = [found]
        else:
            conversations = []
            while page := await deps.store.list_conversations(tenant, limit=500, offset=len(conversations)):
                conversations += page
        branches = queued = 0
        for conversation in conversations:
            messages = await deps.store.conversation_messages(tenant, conversation.id)
            parents = {m.node.parent_id for m in messages}
            for leaf in (m for m in messages if m.node.id not in parents):
                branches += 1
                work = EmbedWork(conversation.id, leaf.node.id, leaf.node.depth + 1)
                queued += await deps.jobs.enqueue(work.job(tenant)) is not None
        failed = 0
        if run:
            started = datetime.now(UTC)
            async with deps.workers.only([EMBED]).running():
                while pending := await deps.jobs.pending(EMBED, f"{EMBED}:", tenant):
                    progress(IndexBacklog.of(pending).unembedded)
                    await anyio.sleep(0.2)
            progress(0)
            failures = await deps.jobs.failures(tenant, limit=1_000)
            failed = sum(1 for j in failures if j.kind == EMBED and j.updated_at >= started)
        return Reindexed(len(conversations), branches, queued, failed)
    finally:
        await deps.aclose()


@contextlib.asynccontextmanager
async def _memory(config: GatewayConfig, tenant: str) -> AsyncIterator[MemoryService]:
    """The memory operations of a tenant, as the memory API runs them (vectors included)."""
    deps = build_deps(config)
    try:
        service = deps.memory_service(tenant)
        if service is None:
            raise LookupError(f"tenant {tenant!r} has no long-term memory (memory.enabled) or does not exist")
        yield service
    finally:
        await deps.aclose()


async def memories_of(config: GatewayConfig, tenant: str, user_id: str, limit: int) -> list[Memory]:
    async with _memory(config, tenant) as service:
        return await service.store.find(tenant, MemoryFilter(user_id, limit=limit))


async def export_memories(config: GatewayConfig, tenant: str, user_id: str) -> dict[str, object]:
    async with _memory(config, tenant) as service:
        return await service.export(tenant, user_id)


async def delete_memories(config: GatewayConfig, tenant: str, memory_ids: Sequence[str]) -> int:
    async with _memory(config, tenant) as service:
        return await service.delete(tenant, memory_ids)


async def import_history(
    config: GatewayConfig,
    tenant: str,
    conversations: Sequence[Imported],
    model: str,
    progress: Callable[[int], None],
) -> list[str | None]:
    """Each conversation through the tenant's pipeline (identify, ingest, persist), as if a client sent
    its whole history in one request: stored once (an import run twice recognises what it stored), and
    indexed and learnt from by the background jobs it queues. Returns the conversation ids."""
    deps = build_deps(config)
    try:
        target = next((t for t in deps.tenants.tenants if t.name == tenant), None)
        if target is None:
            raise LookupError(f"no tenant {tenant!r} in this config")
        ids: list[str | None] = []
        for done, conversation in enumerate(conversations, 1):
            body: JSONObject = {"model": model, "messages": list(conversation.messages)}
            headers = [("x-user-id", conversation.user)] if conversation.user else []
            call = ChatCall(uuid.uuid4().hex, tenant, body, orjson.dumps(body), headers, time.perf_counter())
            await target.pipeline.prepare(call)
            await target.pipeline.complete(call, ChatOutcome(status="complete", http_status=200))
            ids.append(call.state.conversation_id)
            progress(done)
        return ids
    finally:
        await deps.aclose()


async def verify(
    config: GatewayConfig, tenant: str | None, progress: Callable[[str, int], None] | None = None
) -> list[Verified]:
    """Check the stored trees, the index and the job queue of one tenant (or of every one)."""
    names = [t.name for t in config.tenants]
    if tenant is not None and tenant not in names:
        raise LookupError(f"no tenant {tenant!r} in this config")
    deps = build_deps(config)
    try:
        results = []
        for name in [tenant] if tenant is not None else names:
            target = deps.indexes.get(name)

            def step(done: int, name: str = name) -> None:
                if progress is not None:
                    progress(name, done)

            results.append(
                await verify_tenant(
                    name,
                    deps.store,
                    deps.jobs,
                    target.index if target else None,
                    step,
                    neighbour_vectors=target is None or target.neighbour_vectors != "off",
                )
            )
        return results
    finally:
        await deps.aclose()
