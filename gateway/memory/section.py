"""Memory section of the context builder: what the gateway knows of the user, for this question.

Two parts, within the memory allowance of the one budget: the user's standing preferences and profile
facts (types preference, profile, constraint: they shape every answer, so they come whatever the
question), then the memories relevant to the question, found by meaning and by exact terms, fused by
reciprocal rank with a little weight for recency. Only active memories of the call's user and scopes
(their own and, inside a project, that project's) are read; a memory no search ranks closely enough is
left out, so an unrelated question gets only the standing part, or nothing.

In the cache-stable layout (design.md section 14) the two parts go to different places: the standing
part (`part="standing"`) into the stable block, pinned for an epoch by the ids it showed (`restore`
shows them again, less any deleted since), and the relevant part (`part="relevant"`) into the volatile
tail before the question. `part="all"` proposes both in one text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, TypeVar

from gateway.config import MemoryConfig
from gateway.errors import EmbeddingError, StoreError
from gateway.memory.ports import MemoryStore, MemoryVectors
from gateway.memory.records import ACTIVE, USER_SCOPE, Memory, MemoryFilter, MemoryHit, MemoryQuery, Profile
from gateway.pipeline.call import MemoryScope
from gateway.pipeline.context.section import BuildInput, Proposal
from gateway.ports import JSON, Embedder, JSONObject, MessageStore, Similarity
from gateway.records import Conversation
from gateway.text import message_text

log = logging.getLogger(__name__)
T = TypeVar("T")

STANDING_TYPES = ("preference", "profile", "constraint")
STANDING_MAX = 12
STANDING_SHARE = 0.5  # of the allowance, at most: the rest is for what the question needs
RRF_K = 30
RECENCY_WEIGHT = 0.004  # at most an eighth of a first rank's fused score, for a memory of today
RECENCY_DAYS = 90.0
KEYWORD_SLACK = 0.08  # a keyword match may be this much less close than `Similarity.relevant`
HEADER = "## What the gateway remembers about this user (from earlier conversations; newer facts win)"


@dataclass(slots=True)
class _Ranked:
    memory: Memory
    score: float = 0.0
    similarity: float | None = None
    keyword: bool = False


@dataclass(slots=True)
class _Found:
    standing: list[Memory] = field(default_factory=list)
    profile: Profile | None = None
    relevant: list[_Ranked] = field(default_factory=list)
    detail: JSONObject = field(default_factory=dict)
    recent: list[Conversation] = field(default_factory=list)  # the user's other, titled conversations


# memory id -> (fused score, cosine similarity if ranked by meaning, found by exact terms), best first
_Fused = dict[str, tuple[float, float | None, bool]]


@dataclass(slots=True)
class _Searched:
    """The question's search: what passed the relevance gate, and the rows read back for it."""

    fused: _Fused = field(default_factory=dict)
    rows: dict[str, Memory] = field(default_factory=dict)
    embedded: bool = False


@dataclass(slots=True)
class MemorySection:
    memories: MemoryStore
    vectors: MemoryVectors
    embedder: Embedder | None  # None: keyword search only
    config: MemoryConfig
    conversations: MessageStore | None = None  # for the recent-conversations digest
    part: Literal["all", "standing", "relevant"] = "all"
    name: str = "memory"
    whole: bool = False

    @property
    def allowance(self) -> int:
        return self.config.allowance_tokens

    @property
    def relevant_similarity(self) -> float:
        return (self.embedder.similarity if self.embedder is not None else Similarity()).relevant

    async def plan(self, build: BuildInput) -> int:
        found = build.memo.get(MEMO)  # both parts of one build share one search
        if not isinstance(found, _Found):
            found = await self._find(build)  # the builder reports the section's time ("ms")
            build.memo[MEMO] = found
        if self.part == "relevant":
            return self.allowance if found.relevant else 0
        if self.part == "standing":
            return self.allowance if found.standing or found.profile or found.recent else 0
        return self.allowance if found.standing or found.relevant or found.profile or found.recent else 0

    async def _find(self, build: BuildInput) -> _Found:
        scope = build.call.state.memory
        if scope is None:
            return _Found(detail={"skipped": "no memory for this call"})
        tenant = build.call.tenant
        question = message_text(build.current[0].message) if build.current else ""
        timings: dict[str, JSON] = {}
        errors: list[str] = []
        # The standing part (SQL reads) while the question is embedded and searched.
        standing_filter = MemoryFilter(scope.user_id, scope.scopes, STANDING_TYPES, limit=STANDING_MAX)
        standing, user_profile, searched, latest = await asyncio.gather(
            _degraded(self.memories.find(tenant, standing_filter), [], errors),
            _degraded(self._profile(tenant, scope.user_id), None, errors),
            _degraded(self._search(build, scope, question, timings), _Searched(), errors),
            _degraded(self._recent(build, scope.user_id), [], errors),
        )
        if user_profile is not None and user_profile.shown:
            # What the profile already says is not repeated (it covers only the user's own scope).
            standing = [m for m in standing if m.scope != USER_SCOPE or not user_profile.covers(m)]
        relevant = _relevant(searched, scope, {m.id for m in standing})
        detail: JSONObject = {
            "searched": len(searched.fused),
            "embedded": searched.embedded,
            "timings_ms": timings,
        }
        if errors:
            detail["errors"] = list[JSON](errors)
        return _Found(standing, user_profile, relevant[: self.config.top_n], detail, latest)

    async def _search(
        self, build: BuildInput, scope: MemoryScope, question: str, timings: dict[str, JSON]
    ) -> _Searched:
        """The memories the question finds by meaning and by exact terms that pass the relevance gate,
        fused, with their rows; each stage's time goes into `timings`."""
        if not question.strip():
            return _Searched()
        tenant = build.call.tenant
        started = time.perf_counter()
        vector = await self._embed(build, question)
        embedded_at = time.perf_counter()
        query = MemoryQuery(tenant, scope.user_id, scope.scopes, question, vector, self.config.top_n * 4)
        result = await self.vectors.search(query)
        searched_at = time.perf_counter()
        fused = _fuse(result.semantic, result.keyword)
        # Only what passes the relevance gate is read back (its status, its text), best first; a few
        # more than are shown, for those superseded or deleted since they were indexed.
        gate = self.relevant_similarity
        fused = {
            i: hit
            for i, hit in fused.items()
            if (hit[1] is not None and hit[1] >= gate)
            or (hit[2] and (hit[1] is None or hit[1] >= gate - KEYWORD_SLACK))
        }
        wanted = list(fused)[: self.config.top_n + STANDING_MAX]
        rows = {m.id: m for m in await self.memories.many(tenant, wanted)} if wanted else {}
        timings.update(
            embed=round((embedded_at - started) * 1000, 3),
            search=round((searched_at - embedded_at) * 1000, 3),
            read=round((time.perf_counter() - searched_at) * 1000, 3),
        )
        return _Searched(fused, rows, vector is not None)

    async def _profile(self, tenant: str, user_id: str) -> Profile | None:
        if not self.config.profile:
            return None
        found = await self.memories.profile(tenant, user_id)
        return found if found is not None and found.shown else None

    async def _recent(self, build: BuildInput, user_id: str) -> list[Conversation]:
        """The user's other titled conversations, newest first, for the digest."""
        wanted = self.config.recent_conversations
        if not wanted or self.conversations is None:
            return []
        latest = await self.conversations.list_conversations(
            build.call.tenant, user_id=user_id, limit=wanted + 1
        )
        current = build.call.state.conversation_id
        return [c for c in latest if c.id != current and c.title][:wanted]

    async def _embed(self, build: BuildInput, question: str) -> list[float] | None:
        if self.embedder is None:
            return None
        early = build.call.state.question
        try:
            begun = early.of(question) if early is not None else None
            if begun is not None:
                return await begun
            return await self.embedder.embed_query(question)
        except EmbeddingError:
            return None  # keyword search still works

    async def propose(self, build: BuildInput, allowance: int) -> Proposal:
        found = build.memo.get(MEMO)
        if not isinstance(found, _Found):
            found = await self._find(build)
            build.memo[MEMO] = found
        if self.part != "all":
            found = _part(found, self.part, build.memo.get(PINNED))
        detail: JSONObject = dict(found.detail)
        count = build.tokenizer.count
        header = RELEVANT_HEADER if self.part == "relevant" else HEADER
        used = count(header) + 1  # every line is counted with its line break
        lines = [header]
        profile_used = False
        if found.profile is not None and found.profile.shown:
            block = f"About this user (their profile):\n{found.profile.shown}"
            cost = count(block) + 1
            if cost <= 2 * self.config.profile_tokens and used + cost <= allowance:  # never cut mid-way
                lines.append(block)
                used += cost
                profile_used = True
            else:
                detail["profile_skipped"] = "over its allowance"
        # A memory learnt from messages the model is sent anyway (this conversation's window) says
        # nothing new: it is left out, not repeated.
        sent = {item.node_id for item in (*build.window, *build.current) if item.node_id is not None}

        def in_window(memory: Memory) -> bool:
            return bool(memory.sources) and all(source.message_id in sent for source in memory.sources)

        pool = [m for m in found.standing if not in_window(m)]
        candidates = [r for r in found.relevant if not in_window(r.memory)]
        if len(pool) + len(candidates) < len(found.standing) + len(found.relevant):
            detail["in_window"] = len(found.standing) + len(found.relevant) - len(pool) - len(candidates)
        room = max(int(allowance * STANDING_SHARE), used) if candidates else allowance
        standing, used = _take("Standing preferences and facts:", pool, room, used, count, lines)
        ranked = {r.memory.id: r for r in candidates}
        chosen, used = _take(
            "Relevant to this question:", [r.memory for r in candidates], allowance, used, count, lines
        )
        relevant: list[JSON] = [
            {
                "id": memory.id,
                "score": round(ranked[memory.id].score, 5),
                "similarity": _rounded(ranked[memory.id].similarity),
                "why": _why(ranked[memory.id]),
            }
            for memory in chosen
        ]
        detail["memory_ids"] = [*(m.id for m in standing), *(m.id for m in chosen)]
        detail["standing"] = [m.id for m in standing]
        detail["relevant"] = relevant
        detail["profile"] = profile_used
        digest, used = _digest(found.recent, allowance, used, count, lines)
        if digest:
            detail["recent_conversations"] = list[JSON](c.id for c in digest)
        if not standing and not chosen and not profile_used and not digest:
            return Proposal(detail=detail)
        text = "\n".join(lines)
        pin: JSONObject = {"memory_ids": [m.id for m in standing], "profile": profile_used}
        if profile_used and found.profile is not None:
            # The profile job rewrites it as memories are learnt: the epoch keeps the text it showed (the
            # user's deletions drop the epoch; the user's own edit shows at once).
            pin["profile_text"] = found.profile.shown
            pin["profile_edited"] = _stamp(found.profile.edited_at)
        if digest:
            pin["digest"] = "\n".join(lines[len(lines) - len(digest) - 1 :])
        return Proposal(tokens=count(text), text=text, detail=detail, pin=pin)

    async def restore(self, build: BuildInput, pin: JSONObject) -> Proposal:
        """The standing part as an epoch pinned it: the same memories (less any deleted or superseded
        since: delete means gone), the profile if it was shown, the same digest."""
        listed = pin.get("memory_ids")
        ids = [i for i in listed if isinstance(i, str)] if isinstance(listed, list) else []
        scope = build.call.state.memory
        if scope is None:
            return Proposal(detail={"skipped": "no memory for this call"})
        rows = {m.id: m for m in await self.memories.many(build.call.tenant, ids)} if ids else {}
        kept = [
            rows[i]
            for i in ids
            if i in rows and rows[i].status == ACTIVE and rows[i].user_id == scope.user_id
        ]
        build.memo[PINNED] = {m.id for m in kept}
        lines = [HEADER]
        if pin.get("profile") and self.config.profile:
            found = await self.memories.profile(build.call.tenant, scope.user_id)
            if found is not None and found.shown:
                pinned = pin.get("profile_text")
                edited = _stamp(found.edited_at) != pin.get("profile_edited")
                shown = pinned if isinstance(pinned, str) and not edited else found.shown
                lines.append(f"About this user (their profile):\n{shown}")
        if kept:
            lines += ["Standing preferences and facts:", *(_line(m) for m in kept)]
        digest = pin.get("digest")
        if isinstance(digest, str) and digest:
            lines.append(digest)
        detail: JSONObject = {
            "pinned": True,
            "memory_ids": [m.id for m in kept],
            "standing": [m.id for m in kept],
        }
        if len(lines) == 1:
            return Proposal(detail=detail, pin=pin)
        text = "\n".join(lines)
        return Proposal(tokens=build.tokenizer.count(text), text=text, detail=detail, pin=pin)


MEMO = "memory"  # where a build keeps the one search both parts share
PINNED = "memory.pinned"  # ids the stable block shows: the relevant part does not repeat them
RELEVANT_HEADER = "## What the gateway remembers about this user that bears on this question"


async def _degraded(part: Awaitable[T], empty: T, errors: list[str]) -> T:
    """A part that fails (the database or the index is down) leaves its share empty: memory is an
    addition, and the rest of the build (the window, thin mode's history) must go on."""
    try:
        return await part
    except StoreError as exc:  # SearchIndexError included
        log.warning("memory section: %s", exc)
        errors.append(str(exc)[:300])
        return empty


def _relevant(searched: _Searched, scope: MemoryScope, shown: set[str]) -> list[_Ranked]:
    """The searched memories still active in the call's scopes and not in the standing part, best first,
    with a little weight for recency."""
    now = datetime.now(UTC)
    relevant: list[_Ranked] = []
    for memory_id, (score, similarity, keyword) in searched.fused.items():
        memory = searched.rows.get(memory_id)
        if memory is None or memory.status != ACTIVE or memory.user_id != scope.user_id:
            continue  # deleted or superseded since it was indexed
        if memory.scope not in scope.scopes or memory_id in shown:
            continue
        age_days = max((now - (memory.event_at or memory.updated_at)).total_seconds() / 86_400, 0.0)
        score += RECENCY_WEIGHT / (1.0 + age_days / RECENCY_DAYS)
        relevant.append(_Ranked(memory, score, similarity, keyword))
    relevant.sort(key=lambda r: r.score, reverse=True)
    return relevant


def _part(found: _Found, part: str, pinned: object) -> _Found:
    """What one part of the section proposes from the build's one search."""
    if part == "standing":
        return _Found(found.standing, found.profile, [], found.detail, found.recent)
    shown = pinned if isinstance(pinned, set) else {m.id for m in found.standing}
    relevant = [r for r in found.relevant if r.memory.id not in shown]
    return _Found([], None, relevant, found.detail, [])


def _digest(
    conversations: list[Conversation], room: int, used: int, count: Callable[[str], int], lines: list[str]
) -> tuple[list[Conversation], int]:
    """The user's recent conversations, newest first, as a date, a title and a line each (those that fit)."""
    title = "The user's recent conversations (newest first):"
    cost = count(title) + 1
    if not conversations or used + cost > room:
        return [], used
    shown: list[Conversation] = []
    entries: list[str] = []
    for conversation in conversations:
        line = f"- [{conversation.updated_at:%Y-%m-%d}] {conversation.title}"
        line += f": {conversation.gist}" if conversation.gist else ""
        line_cost = count(line) + 1
        if used + cost + line_cost > room:
            break
        cost += line_cost
        entries.append(line)
        shown.append(conversation)
    if shown:
        lines += [title, *entries]
        used += cost
    return shown, used


def _take(
    title: str,
    memories: list[Memory],
    room: int,
    used: int,
    count: Callable[[str], int],
    lines: list[str],
) -> tuple[list[Memory], int]:
    """The memories whose lines fit `room` (with the used tokens so far), in order, under `title`;
    their lines go onto `lines`. Returns them and the tokens used after."""
    cost = count(title) + 1
    taken: list[tuple[Memory, str]] = []
    for memory in memories:
        line = _line(memory)
        tokens = count(line) + 1
        if used + cost + tokens <= room:
            taken.append((memory, line))
            cost += tokens
    if not taken:
        return [], used
    lines += [title, *(line for _, line in taken)]
    return [memory for memory, _ in taken], used + cost


def _stamp(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def _rounded(similarity: float | None) -> float | None:
    return None if similarity is None else round(similarity, 4)


def _why(ranked: _Ranked) -> str:
    if ranked.keyword and ranked.similarity is not None:
        return "meaning and exact terms"
    return "exact terms" if ranked.keyword else "meaning"


def _line(memory: Memory) -> str:
    when = memory.event_at or memory.created_at
    return f"- [{when:%Y-%m-%d}] {memory.content}"


def _fuse(semantic: list[MemoryHit], keyword: list[MemoryHit]) -> _Fused:
    """Both rankings fused by reciprocal rank."""
    out: _Fused = {}
    for rank, hit in enumerate(semantic):
        out[hit.memory_id] = (1.0 / (RRF_K + rank), hit.score, False)
    for rank, hit in enumerate(keyword):
        score, similarity, _ = out.get(hit.memory_id, (0.0, None, False))
        out[hit.memory_id] = (score + 1.0 / (RRF_K + rank), similarity, True)
    return dict(sorted(out.items(), key=lambda item: item[1][0], reverse=True))
