"""Memory extraction job: learn long-term memories from the user turns of a conversation not read yet.

Reads the conversation's newest path from the extraction cursor on, at most `extract_max_turns` user
turns per call (a longer backlog queues the rest), asks the tenant's model for candidate memories, and
resolves them against the user's memory (`memory/resolve.py`). Only user turns are read as sources:
the system prompt never, the assistant's words only as context, and the gateway's own injected block is
cut out of any text that carries it. The vectors are written first, then memories and cursor in one
transaction: a failure anywhere stores nothing of the batch, and the retry reads the same turns.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.config import MemoryConfig
from gateway.memory.llm import CallStats, ask
from gateway.memory.ports import MemoryStore, MemoryVectors
from gateway.memory.prompts import Candidate, Turn, extraction_request, resolution_request
from gateway.memory.records import USER_SCOPE, Memory
from gateway.memory.replies import Decision, candidates, decisions
from gateway.memory.resolve import Resolver
from gateway.pipeline.text import message_text
from gateway.ports import Embedder, JobQueue, MessageStore, Upstream
from gateway.records import Job, MemoryWork, StoredMessage, profile_job

log = logging.getLogger(__name__)

_INJECTED = re.compile(r"<gateway_context>.*?(?:</gateway_context>|$)", re.DOTALL)
CONTEXT_CHARS = 400  # of the assistant message before a turn: enough to resolve "yes, that one"
TURN_CHARS = 4_000  # of one user turn (a pasted log says little about the user)


@dataclass(frozen=True, slots=True)
class MemoryTarget:
    """What one tenant's memory needs: its upstream (for the calls), settings, embedder and index."""

    upstream: Upstream
    config: MemoryConfig
    embedder: Embedder
    vectors: MemoryVectors


def clean(text: str) -> str:
    """A message's text without any block the gateway injected (a client may echo one back)."""
    return _INJECTED.sub("", text).strip()


def user_turns(path: Sequence[StoredMessage], start: int, limit: int) -> tuple[list[Turn], int]:
    """Up to `limit` user turns of `path[start:]`, and the index of the last message they cover (the
    new cursor): the whole rest of the path when it held no more than `limit`."""
    turns: list[Turn] = []
    end = len(path) - 1
    for index in range(start, len(path)):
        message = path[index]
        if message.node.role != "user":
            continue
        if len(turns) == limit:
            end = index - 1
            break
        text = clean(message_text(message.data))[:TURN_CHARS]
        if not text:
            continue
        before = path[index - 1] if index > 0 else None
        context = None
        if before is not None and before.node.role == "assistant":
            context = clean(message_text(before.data))[:CONTEXT_CHARS] or None
        said_at = None if message.meta.get("undated") else message.created_at
        turns.append(
            Turn(len(turns) + 1, message.node.id, message.node.conversation_id, text, said_at, context)
        )
    return turns, end


@dataclass(slots=True)
class ExtractMemoryHandler:
    store: MessageStore
    memories: MemoryStore
    targets: Callable[[str], MemoryTarget | None]
    queue: JobQueue
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    stats: CallStats = field(default_factory=CallStats)

    async def __call__(self, job: Job) -> None:
        work = MemoryWork.parse(job.payload)
        target = self.targets(job.tenant)
        if work is None or target is None or not target.config.extraction:
            return
        conversation = await self.store.get_conversation(job.tenant, work.conversation_id)
        if conversation is None or conversation.last_message_id is None:
            return  # deleted meanwhile
        path = await self.store.path(job.tenant, conversation.last_message_id)
        cursor = work.after or await self.memories.cursor(job.tenant, work.conversation_id)
        start = _start(path, cursor, target.config.extract_max_turns)
        turns, end = user_turns(path, start, target.config.extract_max_turns)
        if end < start:
            return
        new_cursor = (work.conversation_id, path[end].node.id)
        model = target.config.model or work.model or ""
        found: list[Candidate] = []
        if turns:
            request = extraction_request(model, turns, self.clock(), structured=True)
            limit = target.config.max_memory_chars
            found = await ask(target.upstream, request, lambda r: candidates(r, turns, limit), self.stats)
        resolver = Resolver(self.memories, target.vectors, target.embedder)

        async def decide(pairs: Sequence[tuple[Candidate, Sequence[Memory]]]) -> list[Decision]:
            request = resolution_request(model, pairs, structured=True)
            shown = [len(near) for _, near in pairs]
            limit = target.config.max_memory_chars
            return await ask(
                target.upstream, request, lambda r: decisions(r, len(pairs), shown, limit), self.stats
            )

        resolution = await resolver.resolve(job.tenant, work.user_id, work.scope, found, decide, self.clock())
        await target.vectors.upsert(resolution.rows())
        await self.memories.save(resolution.changes(job.tenant, new_cursor))
        if resolution.removed:
            await target.vectors.delete(job.tenant, resolution.removed)
        log.info(
            "memory extraction of %s: %d turns, %d candidates, %d added, %d updated, %d linked",
            work.conversation_id, len(turns), len(found), len(resolution.added),
            len(resolution.updated), len(resolution.links),
        )  # fmt: skip
        changed = [*resolution.added, *resolution.updated.values()]
        if target.config.profile and any(m.scope == USER_SCOPE for m in changed):
            delay = target.config.profile_delay_seconds
            await self.queue.enqueue(profile_job(job.tenant, work.user_id, work.model, delay))
        if end < len(path) - 1:  # a long backlog: the rest in a job of its own
            after = MemoryWork(work.conversation_id, work.user_id, work.scope, work.model, path[end].node.id)
            await self.queue.enqueue(after.job(job.tenant))


def _start(path: Sequence[StoredMessage], cursor: str | None, limit: int) -> int:
    """Where reading starts: after the cursor when it is on this path; from the root for a conversation
    never read; on another branch than the one read, the newest `limit` user turns (what they repeat of
    the other branch is found as known and only linked)."""
    if cursor is None:
        return 0
    for index, message in enumerate(path):
        if message.node.id == cursor:
            return index + 1
    users = [i for i, m in enumerate(path) if m.node.role == "user"]
    return users[-limit] if len(users) >= limit else 0
