"""What a user (through the API) can do with their memory, keeping SQL and the vector index in step.

Writes go to the index first and SQL second where they add (a failed SQL write leaves an orphan row
that recall ignores, since it reads every hit back from SQL), and to SQL first and the index second where
they remove (a memory gone from SQL is never shown, whatever the index still holds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

from gateway.errors import StoreError
from gateway.memory.ports import MemoryStore, MemoryVectors
from gateway.memory.records import (
    ACTIVE,
    Memory,
    MemoryChanges,
    MemoryDraft,
    MemoryFilter,
    MemoryQuery,
    MemorySearchResult,
    content_hash,
)
from gateway.memory.resolve import history_entry, memory_row, new_memory
from gateway.ports import Embedder


@dataclass(slots=True)
class MemoryService:
    store: MemoryStore
    vectors: MemoryVectors
    embedder: Embedder
    # Drops the injected blocks kept with a user's request records (`MessageStore.forget_sent_context`):
    # they may quote a memory, or a profile made of it, that a deletion takes away.
    forget_sent: Callable[[str, str], Awaitable[int]] | None = None

    async def create(
        self, tenant: str, user_id: str, drafts: Sequence[MemoryDraft], *, skip_known: bool = False
    ) -> list[Memory]:
        """New memories; with `skip_known`, drafts whose text the user's scope holds already (with the
        same status) are left out, so importing one export twice adds nothing the second time."""
        now = datetime.now(UTC)
        if skip_known:
            drafts = await self._unknown(tenant, user_id, drafts)
        made = [new_memory(tenant, user_id, draft, now, "user") for draft in drafts]
        if not made:
            return []
        active = [m for m in made if m.status == ACTIVE]  # superseded history is not searched
        vectors = await self.embedder.embed([m.content for m in active]) if active else []
        await self.vectors.upsert([memory_row(m, v) for m, v in zip(active, vectors, strict=True)])
        try:
            await self.store.save(MemoryChanges(tenant, added=tuple(made)))
        except StoreError:
            await self.vectors.delete(tenant, [m.id for m in active])
            raise
        return made

    async def _unknown(self, tenant: str, user_id: str, drafts: Sequence[MemoryDraft]) -> list[MemoryDraft]:
        held = {(m.scope, m.status, m.hash) for m in await self.all_of(tenant, user_id)}
        out: list[MemoryDraft] = []
        for draft in drafts:
            key = (draft.scope, draft.status, content_hash(draft.content))
            if key not in held:
                held.add(key)
                out.append(draft)
        return out

    async def edit(self, memory: Memory, **fields: object) -> Memory:
        """The memory with `fields` changed (content, type, scope, tags, event_at, status); the text
        before an edit of the content is kept in its history."""
        now = datetime.now(UTC)
        entry = history_entry(now, "user", "edited", memory.content)
        edited = replace(memory, **fields, updated_at=now, history=(*memory.history, entry))  # type: ignore[arg-type]
        if edited.status == ACTIVE:
            vector = (await self.embedder.embed([edited.content]))[0]
            await self.vectors.upsert([memory_row(edited, vector)])
            await self.store.save(MemoryChanges(memory.tenant, updated=(edited,)))
        else:
            await self.store.save(MemoryChanges(memory.tenant, updated=(edited,)))
            await self.vectors.delete(memory.tenant, [memory.id])
        return edited

    async def delete(self, tenant: str, memory_ids: Sequence[str]) -> int:
        users = {m.user_id for m in await self.store.many(tenant, list(memory_ids))}
        count = await self.store.delete(tenant, memory_ids)
        await self.vectors.delete(tenant, memory_ids)
        if self.forget_sent is not None:
            for user in sorted(users):
                await self.forget_sent(tenant, user)
        return count

    async def delete_user(self, tenant: str, user_id: str) -> list[str]:
        removed = await self.store.delete_user(tenant, user_id)
        await self.vectors.delete_user(tenant, user_id)
        if self.forget_sent is not None:
            await self.forget_sent(tenant, user_id)
        return removed

    async def search(
        self, tenant: str, user_id: str, scopes: tuple[str, ...], text: str, limit: int
    ) -> list[tuple[Memory, float]]:
        """Active memories for `text`, best first, by reciprocal-rank fusion of both rankings."""
        vector = await self.embedder.embed_query(text)
        result: MemorySearchResult = await self.vectors.search(
            MemoryQuery(tenant, user_id, scopes, text, vector, limit)
        )
        scores: dict[str, float] = {}
        for ranking in (result.semantic, result.keyword):
            for rank, hit in enumerate(ranking):
                scores[hit.memory_id] = scores.get(hit.memory_id, 0.0) + 1.0 / (30 + rank)
        rows = {m.id: m for m in await self.store.many(tenant, list(scores))}
        found = [
            (rows[i], s)
            for i, s in scores.items()
            if i in rows and rows[i].status == ACTIVE and rows[i].user_id == user_id
        ]
        return sorted(found, key=lambda pair: pair[1], reverse=True)[:limit]

    async def export(self, tenant: str, user_id: str) -> dict[str, object]:
        """Every memory of the user as one document (what `import` takes back)."""
        memories = await self.all_of(tenant, user_id)
        return {
            "object": "memories.export",
            "user_id": user_id,
            "exported_at": datetime.now(UTC),
            "memories": [{**asdict(m), "object": "memory"} for m in memories],
        }

    async def all_of(self, tenant: str, user_id: str) -> list[Memory]:
        """Every memory of the user, whatever its status (export), with sources and history."""
        out: list[Memory] = []
        while True:
            page = await self.store.find(
                tenant, MemoryFilter(user_id, statuses=None, limit=500, offset=len(out))
            )
            out += page
            if len(page) < 500:
                break
        return await self.store.many(tenant, [m.id for m in out]) if out else []
