"""Resolution: each candidate memory against what the user's memory already holds.

Exact duplicates (same normalised text) and near duplicates (vectors closer than the model's duplicate
threshold) never reach the model: the existing memory just gains a source. A candidate with related
memories goes to one resolution call for the whole batch (ADD / UPDATE / SUPERSEDE / NOOP); one with
none is added. Superseded memories stay in SQL as history, linked to the memory that replaced them, and
leave the vector index, so recall never offers them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np

from gateway.memory.ports import MemoryStore, MemoryVectors
from gateway.memory.prompts import Candidate
from gateway.memory.records import (
    ACTIVE,
    SUPERSEDED,
    USER_SCOPE,
    Memory,
    MemoryChanges,
    MemoryDraft,
    MemoryQuery,
    MemoryRow,
    MemorySource,
    content_hash,
)
from gateway.memory.replies import Decision
from gateway.ports import Embedder, JSONObject

NEAREST = 4  # existing memories shown with each candidate
# Memories about the user at large: read in every project, so learnt into the user's own scope.
USER_WIDE_TYPES = frozenset({"preference", "profile"})

Decide = Callable[[Sequence[tuple[Candidate, Sequence[Memory]]]], Awaitable[list[Decision]]]


def scope_for(candidate: Candidate, conversation_scope: str) -> str:
    return USER_SCOPE if candidate.type in USER_WIDE_TYPES else conversation_scope


def history_entry(at: datetime, by: str, action: str, content: str | None) -> JSONObject:
    return {"at": at.isoformat(), "by": by, "action": action, "content": content}


def new_memory(
    tenant: str,
    user_id: str,
    draft: MemoryDraft,
    now: datetime,
    by: str,
    sources: tuple[MemorySource, ...] = (),
) -> Memory:
    """A memory to store, with a new id and its first history entry (`by`: extraction or user)."""
    return Memory(
        id=uuid.uuid4().hex,
        tenant=tenant,
        user_id=user_id,
        scope=draft.scope,
        type=draft.type,
        content=draft.content,
        tags=draft.tags,
        confidence=draft.confidence,
        event_at=draft.event_at,
        status=draft.status,
        superseded_by=None,
        created_at=now,
        updated_at=now,
        sources=sources,
        history=(history_entry(now, by, "created", None),),
    )


def memory_row(memory: Memory, vector: list[float] | None) -> MemoryRow:
    return MemoryRow(
        memory.id,
        memory.tenant,
        memory.user_id,
        memory.scope,
        memory.type,
        memory.content,
        memory.event_at or memory.created_at,
        vector,
    )


@dataclass(slots=True)
class Resolution:
    """What resolving a batch does: stored in one transaction, then the index follows."""

    added: list[Memory] = field(default_factory=list)
    updated: dict[str, Memory] = field(default_factory=dict)
    links: list[tuple[str, MemorySource]] = field(default_factory=list)
    vectors: dict[str, list[float]] = field(default_factory=dict)  # memory id -> vector of its text
    removed: list[str] = field(default_factory=list)  # superseded: out of the index

    def changes(self, tenant: str, cursor: tuple[str, str] | None) -> MemoryChanges:
        return MemoryChanges(
            tenant, tuple(self.added), tuple(self.updated.values()), tuple(self.links), cursor
        )

    def rows(self) -> list[MemoryRow]:
        active = [*self.added, *self.updated.values()]
        return [memory_row(m, self.vectors.get(m.id)) for m in active if m.status == ACTIVE]


@dataclass(slots=True)
class Resolver:
    memories: MemoryStore
    vectors: MemoryVectors
    embedder: Embedder

    async def resolve(
        self,
        tenant: str,
        user_id: str,
        conversation_scope: str,
        candidates: Sequence[Candidate],
        decide: Decide,
        now: datetime,
    ) -> Resolution:
        out = Resolution()
        fresh = await self._not_known(tenant, user_id, conversation_scope, candidates, out)
        if not fresh:
            return out
        vectors = await self.embedder.embed([c.content for c in fresh])
        duplicate, related = self.embedder.similarity.duplicate, self.embedder.similarity.related
        # Every pair's cosine in one product (unit vectors), not a Python loop per pair on the event loop.
        units = np.asarray(vectors, dtype=np.float32)
        cosines = units @ units.T
        pending: list[tuple[Candidate, list[float], list[Memory]]] = []
        kept: list[int] = []
        for at, (candidate, vector) in enumerate(zip(fresh, vectors, strict=True)):
            if any(self._same(candidate, fresh[k], float(cosines[at, k]), duplicate) for k in kept):
                continue  # said twice in this batch, in other words
            kept.append(at)
            scope = scope_for(candidate, conversation_scope)
            # By meaning only: a full-text query per candidate whose ranking was never read.
            query = MemoryQuery(tenant, user_id, (scope,), "", vector, NEAREST)
            hits = [h for h in (await self.vectors.search(query)).semantic if h.score >= related]
            near = {m.id: m for m in await self.memories.many(tenant, [h.memory_id for h in hits])}
            ranked = [(h.score, near[h.memory_id]) for h in hits if h.memory_id in near]
            ranked = [(s, m) for s, m in ranked if m.status == ACTIVE and m.user_id == user_id]
            if (
                ranked
                and ranked[0][0] >= duplicate
                and same_specifics(candidate.content, ranked[0][1].content)
            ):
                out.links.append((ranked[0][1].id, _source(candidate)))
            elif ranked:
                pending.append((candidate, vector, [m for _, m in ranked]))
            else:
                self._add(tenant, user_id, scope, candidate, vector, now, out)
        if pending:
            chosen = await decide([(c, shown) for c, _, shown in pending])
            for (candidate, vector, shown), decision in zip(pending, chosen, strict=True):
                await self._apply(
                    tenant, user_id, conversation_scope, candidate, vector, shown, decision, now, out
                )
        return out

    @staticmethod
    def _same(candidate: Candidate, other: Candidate, cosine: float, duplicate: float) -> bool:
        """Two candidates saying the same: as close as duplicates (their vectors' `cosine`), of one type,
        with the same numbers and negations (the rule a stored memory is matched by, too)."""
        return (
            candidate.type == other.type
            and cosine >= duplicate
            and same_specifics(candidate.content, other.content)
        )

    async def _not_known(
        self,
        tenant: str,
        user_id: str,
        conversation_scope: str,
        candidates: Sequence[Candidate],
        out: Resolution,
    ) -> list[Candidate]:
        """Candidates whose exact text is not held yet (in this batch or active in the memory); the
        known ones link their source to the memory that says it already."""
        unique: dict[tuple[str, str], Candidate] = {}
        for candidate in candidates:
            key = (scope_for(candidate, conversation_scope), content_hash(candidate.content))
            unique.setdefault(key, candidate)
        held: dict[tuple[str, str], Memory] = {}
        for scope in {scope for scope, _ in unique}:
            hashes = [h for s, h in unique if s == scope]
            for memory in await self.memories.by_hash(tenant, user_id, scope, hashes):
                held[(scope, memory.hash)] = memory
        fresh = []
        for key, candidate in unique.items():
            if key in held:
                out.links.append((held[key].id, _source(candidate)))
            else:
                fresh.append(candidate)
        return fresh

    def _add(
        self,
        tenant: str,
        user_id: str,
        scope: str,
        candidate: Candidate,
        vector: list[float],
        now: datetime,
        out: Resolution,
    ) -> Memory:
        draft = MemoryDraft(
            candidate.content, candidate.type, scope, candidate.tags, candidate.confidence, candidate.event_at
        )
        memory = new_memory(tenant, user_id, draft, now, "extraction", (_source(candidate),))
        out.added.append(memory)
        out.vectors[memory.id] = vector
        return memory

    async def _apply(
        self,
        tenant: str,
        user_id: str,
        conversation_scope: str,
        candidate: Candidate,
        vector: list[float],
        near: list[Memory],
        decision: Decision,
        now: datetime,
        out: Resolution,
    ) -> None:
        scope = scope_for(candidate, conversation_scope)
        if decision.action == "ADD" or decision.target is None:
            self._add(tenant, user_id, scope, candidate, vector, now, out)
            return
        target = out.updated.get(near[decision.target - 1].id, near[decision.target - 1])
        if target.status != ACTIVE:  # an earlier candidate of this batch superseded it already
            self._add(tenant, user_id, scope, candidate, vector, now, out)
            return
        if decision.action == "NOOP":
            out.links.append((target.id, _source(candidate)))
        elif decision.action == "UPDATE" and decision.content:
            merged = replace(
                target,
                content=decision.content,
                tags=tuple(dict.fromkeys([*target.tags, *candidate.tags])),
                event_at=candidate.event_at or target.event_at,
                updated_at=now,
                sources=(*target.sources, _source(candidate)),
                history=(*target.history, history_entry(now, "extraction", "updated", target.content)),
            )
            out.updated[target.id] = merged
            out.vectors[target.id] = (await self.embedder.embed([merged.content]))[0]
        else:  # SUPERSEDE: the newer fact wins, the older one stays as history
            newer = self._add(tenant, user_id, scope, candidate, vector, now, out)
            out.updated[target.id] = replace(
                target,
                status=SUPERSEDED,
                superseded_by=newer.id,
                updated_at=now,
                history=(*target.history, history_entry(now, "extraction", "superseded", target.content)),
            )
            out.removed.append(target.id)


_SPECIFIC = re.compile(r"[^\W_]*\d[^\W_]*(?:[.:/-]\d[^\W_]*)*")
_NEGATION = re.compile(
    r"\b(not|no|never|no longer|don't|doesn't|isn't|aren't|won't|stopped|nicht|kein\w*|pas|jamais"
    r"|nunca|não|nie)\b|不|没|안|않",
    re.I,
)


def same_specifics(a: str, b: str) -> bool:
    """Whether two close texts agree on their numbers, versions and negations: "runs on Postgres 16" and
    "now runs on Postgres 17" embed almost alike but contradict, so only the model may call them one."""
    a, b = a.replace("\u2019", "'"), b.replace("\u2019", "'")  # the typographic apostrophe
    numbers = {m.lower() for m in _SPECIFIC.findall(a)} == {m.lower() for m in _SPECIFIC.findall(b)}
    return numbers and bool(_NEGATION.search(a)) == bool(_NEGATION.search(b))


def _source(candidate: Candidate) -> MemorySource:
    return MemorySource(candidate.turn.message_id, candidate.turn.conversation_id)
