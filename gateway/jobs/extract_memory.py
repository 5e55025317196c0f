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
from gateway.errors import StoreError
from gateway.jobs.worker import Postponed
from gateway.memory.llm import CallStats, ask
from gateway.memory.ports import MemoryStore, MemoryVectors
from gateway.memory.prompts import Candidate, Turn, extraction_request, resolution_request
from gateway.memory.records import USER_SCOPE, Memory, MemoryChanges
from gateway.memory.replies import Decision, candidates, decisions
from gateway.memory.resolve import Resolver
from gateway.ports import Embedder, JobQueue, MessageStore, Upstream
from gateway.records import (
    EMBED,
    IndexBacklog,
    Job,
    MemoryWork,
    StoredMessage,
    embed_key_prefix,
    profile_job,
)
from gateway.text import message_text

log = logging.getLogger(__name__)

_INJECTED = re.compile(r"<gateway_context>.*?(?:</gateway_context>|$)", re.DOTALL)
CONTEXT_CHARS = 400  # of the assistant message before a turn: enough to resolve "yes, that one"
TURN_CHARS = 4_000  # of one user turn (a pasted log says little about the user)
BATCH_CHARS = 24_000  # of all turns in one call: a small cheap model's context holds it
# Messages read at a time from the cursor on: a job reads what its turns need, not the whole path (a
# 2,500-message history sent at once was read whole once per job, ~60 times: BENCHMARKS.md, issue 28).
READ_STEP = 200
# A conversation with more messages than this waiting for their vectors (a history sent at once) is
# learnt once they have them, looked at again every INDEX_WAIT_SECONDS; a chat's own turns never wait.
INDEX_FIRST = 200
INDEX_WAIT_SECONDS = 5.0


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


def _learnable(message: StoredMessage) -> bool:
    """Never what was said in an incognito call."""
    return not message.meta.get("no_memory")


def user_turns(path: Sequence[StoredMessage], start: int, limit: int) -> tuple[list[Turn], int]:
    """Up to `limit` user turns of `path[start:]` (and at most BATCH_CHARS of text), and the index of
    the last message they cover (the new cursor): the whole rest of the path when it held no more.
    Each turn names its author (the user its request named), so a shared conversation's turns are
    learnt for whoever said them."""
    turns: list[Turn] = []
    end = len(path) - 1
    size = 0
    for index in range(start, len(path)):
        message = path[index]
        if message.node.role != "user" or not _learnable(message):
            continue
        text = clean(message_text(message.data))[:TURN_CHARS]
        if not text:
            continue
        if len(turns) == limit or (turns and size + len(text) > BATCH_CHARS):
            end = index - 1
            break
        size += len(text)
        before = path[index - 1] if index > 0 else None
        context = None
        if before is not None and before.node.role == "assistant" and _learnable(before):
            context = clean(message_text(before.data))[:CONTEXT_CHARS] or None
        said_at = None if message.meta.get("undated") else message.created_at
        author = message.meta.get("user_id")
        turns.append(
            Turn(
                len(turns) + 1,
                message.node.id,
                message.node.conversation_id,
                text,
                said_at,
                context,
                author if isinstance(author, str) else None,
            )
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
        await self._after_the_index(job.tenant, work.conversation_id)
        cursor = work.after or await self.memories.cursor(job.tenant, work.conversation_id)
        limit = target.config.extract_max_turns
        unread = await self._unread(job.tenant, conversation.last_message_id, cursor, limit)
        if unread is not None:
            path, start, rest = unread
        else:  # the cursor is on another branch (or gone): the whole path, to find where they part
            path = await self.store.path(job.tenant, conversation.last_message_id)
            start, rest = await self._start(job.tenant, path, cursor, limit), False
        turns, end = user_turns(path, start, limit)
        if end < start:
            return
        # Each author's turns are learnt for that author (a shared conversation has several).
        by_author: dict[str, list[Turn]] = {}
        for turn in turns:
            by_author.setdefault(turn.author or work.user_id, []).append(turn)
        if not by_author:
            await self.memories.save(
                MemoryChanges(job.tenant, cursor=(work.conversation_id, path[end].node.id))
            )
        authors = list(by_author)
        for number, author in enumerate(authors):
            last = number == len(authors) - 1
            cursor_after = (work.conversation_id, path[end].node.id) if last else None
            await self._learn(job.tenant, work, author, by_author[author], target, cursor_after)
        latest = await self.store.get_conversation(job.tenant, work.conversation_id)
        grown = latest is not None and latest.last_message_id != conversation.last_message_id
        if end < len(path) - 1 or rest or grown:
            # A long backlog, or turns that arrived while this job ran (their own enqueue found it
            # pending): the rest in a job of its own.
            after = MemoryWork(work.conversation_id, work.user_id, work.scope, work.model, path[end].node.id)
            await self.queue.enqueue(after.job(job.tenant))

    async def _after_the_index(self, tenant: str, conversation_id: str) -> None:
        """Raise Postponed while more than INDEX_FIRST of the conversation's messages wait for their
        vectors: a history that arrived at once is searched at once, its memories can wait (learnt beside
        its indexing, they slowed it by a fifth and the requests meanwhile: BENCHMARKS.md, issue 28)."""
        try:
            pending = await self.queue.pending(EMBED, embed_key_prefix(conversation_id), tenant)
        except StoreError:
            return  # the queue cannot say: learn now
        waiting = IndexBacklog.of(pending).unembedded
        if waiting > INDEX_FIRST:
            raise Postponed(INDEX_WAIT_SECONDS, f"{waiting} messages of the conversation wait for the index")

    async def _unread(
        self, tenant: str, leaf_id: str, cursor: str | None, limit: int
    ) -> tuple[list[StoredMessage], int, bool] | None:
        """The leaf's path from the cursor on (the cursor first), read READ_STEP messages at a time until
        it holds more than `limit` user turns: the messages, where the unread ones start, and whether
        the path goes on past them. None when the cursor is not on the leaf's path."""
        leaf = await self.store.path(tenant, leaf_id, newest_messages=1)
        at = await self.store.path(tenant, cursor, newest_messages=1) if cursor is not None else []
        if not leaf or (cursor is not None and not at):
            return None
        depth = leaf[-1].node.depth
        below = at[-1].node.depth - 1 if at else -1
        read: list[StoredMessage] = []
        users = 0
        while below < depth and users <= limit:
            through = min(below + READ_STEP, depth)
            part = await self.store.path(
                tenant, leaf_id, newest_messages=depth - below, through_depth=through
            )
            if not part or part[0].node.depth != below + 1:
                return None  # the path changed under this read (a deletion): read it whole
            if not read and cursor is not None and part[0].node.id != cursor:
                return None  # the cursor is on another branch
            read += part
            users += sum(m.node.role == "user" for m in part)
            below = through
        return read, 0 if cursor is None else 1, below < depth

    async def _start(self, tenant: str, path: Sequence[StoredMessage], cursor: str | None, limit: int) -> int:
        """Where reading starts: after the cursor when it is on this path; from the root for a
        conversation never read; on another branch than the one read (a regenerated answer, an edited
        question), after the last message the two branches share; the newest `limit` user turns when
        the read branch is gone (deleted)."""
        if cursor is None:
            return 0
        for index, message in enumerate(path):
            if message.node.id == cursor:
                return index + 1
        read = {m.node.id for m in await self.store.path(tenant, cursor)}
        if not read:
            return _newest_turns(path, limit)
        shared = [index for index, message in enumerate(path) if message.node.id in read]
        return shared[-1] + 1 if shared else 0

    async def _learn(
        self,
        tenant: str,
        work: MemoryWork,
        user_id: str,
        turns: list[Turn],
        target: MemoryTarget,
        cursor: tuple[str, str] | None,
    ) -> None:
        """One author's turns: extraction, resolution, then the index and SQL (with the cursor)."""
        model = target.config.model or work.model or ""
        request = extraction_request(model, turns, self.clock(), structured=True)
        limit = target.config.max_memory_chars
        found = await ask(target.upstream, request, lambda r: candidates(r, turns, limit), self.stats)
        resolver = Resolver(self.memories, target.vectors, target.embedder)

        async def decide(pairs: Sequence[tuple[Candidate, Sequence[Memory]]]) -> list[Decision]:
            request = resolution_request(model, pairs, structured=True)
            shown = [len(near) for _, near in pairs]
            return await ask(
                target.upstream, request, lambda r: decisions(r, len(pairs), shown, limit), self.stats
            )

        resolution = await resolver.resolve(tenant, user_id, work.scope, found, decide, self.clock())
        # New memories enter the index before SQL (a row SQL does not hold is never shown, and is
        # removed again if SQL refuses); changed ones after it, so a refused save changes nothing found.
        added = [r for r in resolution.rows() if r.id not in resolution.updated]
        await target.vectors.upsert(added)
        try:
            await self.memories.save(resolution.changes(tenant, cursor))
        except StoreError:
            await target.vectors.delete(tenant, [r.id for r in added])
            raise
        await target.vectors.upsert([r for r in resolution.rows() if r.id in resolution.updated])
        if resolution.removed:
            await target.vectors.delete(tenant, resolution.removed)
        log.info(
            "memory extraction of %s for %s: %d turns, %d candidates, %d added, %d updated, %d linked",
            work.conversation_id, user_id, len(turns), len(found), len(resolution.added),
            len(resolution.updated), len(resolution.links),
        )  # fmt: skip
        changed = [*resolution.added, *resolution.updated.values()]
        if target.config.profile and any(m.scope == USER_SCOPE for m in changed):
            delay = target.config.profile_delay_seconds
            await self.queue.enqueue(profile_job(tenant, user_id, work.model, delay))


def _newest_turns(path: Sequence[StoredMessage], limit: int) -> int:
    users = [i for i, m in enumerate(path) if m.node.role == "user"]
    return users[-limit] if len(users) >= limit else 0
