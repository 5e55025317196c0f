"""Embed job: index messages for retrieval, in three views each, texts and vectors.

Each message is indexed in three views (itself; with its parent; with its parent and child) because a
short reply ("yes, port 8443 then") carries its meaning in its neighbours. By default the model embeds
each message's own view and the two views with neighbours get their messages' vectors composed
(`neighbour_vectors.py`); `retrieval.neighbour_vectors: model` embeds them as texts too, `off` writes them
as texts only (found by keyword). An exchange's views are written together. A large stretch (a long
history arriving in one request, an import) is split into bounded jobs so none outlives its lease, in
passes, each newest first (what the next questions are most likely about): its texts, in chunks of
`TEXT_CHUNK_MESSAGES` (the full-text index finds every message at once); each message's own view
(findable by meaning, a sixth of the model's work of all three), with the composed views in the same
jobs; with `model`, then the views with neighbours. A job embeds at most `IndexTarget.batch_messages`
messages' worth of texts. If the embedder fails, the texts are written alone, so the messages are
findable by keyword until a retry adds the vectors. Writes are keyed by row id: a retry rewrites nothing
twice. Until its job has run (normally within a second of the answer) a message is in the recent window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import anyio.to_thread

from gateway.config_sections import NeighbourVectors
from gateway.errors import EmbeddingError
from gateway.jobs.neighbour_vectors import composed_all
from gateway.jobs.worker import JobObserver
from gateway.ports import Embedder, JobQueue, MessageStore, VectorIndex
from gateway.records import (
    EMBED,
    EmbedWork,
    IndexRow,
    Job,
    StoredMessage,
    embed_key_prefix,
    message_views,
)
from gateway.text import message_text

log = logging.getLogger(__name__)

# Messages whose texts one job writes (three rows each): one store read and one index write, about a
# second on a 2-core machine (BENCHMARKS.md, "Bulk indexing").
TEXT_CHUNK_MESSAGES = 2_000
DEFAULT_BATCH_MESSAGES = 64
# The texts one job embeds, in characters (each counted up to TEXT_COST_CHARS, past which the models
# read no further): long messages make a job's embedding slow long before 64 of them are reached (e5 on
# one thread spent over 60 s on 64 messages of ~2,000 characters). About 4 s a job on this machine.
BATCH_CHARS = 24_000
TEXT_COST_CHARS = 2_000
# The views each kind of job embeds; "vectors" jobs queued before the passes were split embed all three.
_ALL_VIEWS = ("m", "p", "w")
_VIEWS = {"vectors": ("m",), "context": ("p", "w")}
_BRANCH_READS = 3  # paths a job reads looking for its branch's newest queued exchange (`_absorb`)


@dataclass(frozen=True, slots=True)
class IndexTarget:
    """Where one tenant's messages are indexed, and with which model."""

    embedder: Embedder
    index: VectorIndex
    batch_messages: int = DEFAULT_BATCH_MESSAGES  # messages one job embeds (three texts each)
    # "composed": the views with neighbours get their messages' own vectors summed; "model": embedded;
    # "off": written as texts, no vectors.
    neighbour_vectors: NeighbourVectors = "composed"


def index_rows(tenant: str, user_id: str | None, path: Sequence[StoredMessage], count: int) -> list[IndexRow]:
    """The views of the `count` newest messages of `path` (and the parent-and-child view of the message
    before them, whose child has now arrived). `path` holds at least two messages before those, if any."""
    return [row for row, _ in _views(tenant, user_id, path, [_text(m) for m in path], count)]


def _text(message: StoredMessage) -> str:
    return message_text(message.data).strip()


def _views(
    tenant: str, user_id: str | None, path: Sequence[StoredMessage], texts: Sequence[str], count: int
) -> list[tuple[IndexRow, tuple[int, ...]]]:
    """`index_rows`, each with the positions in `path` of the messages whose texts it joins."""
    rows: list[tuple[IndexRow, tuple[int, ...]]] = []
    # An empty message (a tool-call shell) has nothing to find it by: it is found through its neighbours.
    for owner, view, members in message_views([bool(t) for t in texts], max(len(path) - count, 0)):
        m = path[owner]
        # A "w" row is keyed by its child too: branches give a message several.
        suffix = f":{path[members[-1]].node.id}" if view == "w" else ""
        row = IndexRow(
            id=f"{m.node.id}:{view}{suffix}",
            tenant=tenant,
            user_id=user_id,
            conversation_id=m.node.conversation_id,
            node_id=m.node.id,
            view=view,
            depth=m.node.depth,
            created_at=m.created_at,
            text="\n".join(texts[j] for j in members),
            dated=m.meta.get("undated") is not True,
        )
        rows.append((row, members))
    return rows


def _model_views(how: NeighbourVectors, work: EmbedWork) -> tuple[str, ...]:
    """The views whose texts the model embeds in this job; "vectors" jobs queued before the passes were
    split embed all three."""
    if how != "model":
        return _VIEWS["vectors"]
    if work.then is not None or work.mode == "context":
        return _VIEWS.get(work.mode, _ALL_VIEWS)
    return _ALL_VIEWS


def _owner(row: IndexRow) -> str:
    """The message whose arrival made `row`: a "w" row (keyed by its child) is the child's."""
    return row.id.split(":")[2] if row.view == "w" else row.node_id


def _within_chars(cost: dict[str, int], path: Sequence[StoredMessage], count: int, lookback: int) -> int:
    """How many of the `count` newest messages of `path` one job embeds: at least one, and no more than
    BATCH_CHARS of texts (`cost`: each message's, by id), counting the `lookback` messages before them
    (embedded for the views that join them)."""
    total = 0
    newest = len(path) - 1
    for taken in range(count):
        total += cost.get(path[newest - taken].node.id, 0)
        before = path[max(newest - taken - lookback, 0) : newest - taken]
        if total + sum(cost.get(m.node.id, 0) for m in before) > BATCH_CHARS and taken > 0:
            return taken
    return count


def _costs(rows: Sequence[IndexRow]) -> dict[str, int]:
    """The characters the model reads of each message's `rows`, by the message that owns them."""
    cost: dict[str, int] = {}
    for r in rows:
        cost[_owner(r)] = cost.get(_owner(r), 0) + min(len(r.text), TEXT_COST_CHARS)
    return cost


@dataclass(slots=True)
class EmbedHandler:
    store: MessageStore
    targets: Callable[[str], IndexTarget | None]  # tenant -> its index; None: retrieval is off
    queue: JobQueue  # where the rest of a large stretch goes, as further bounded jobs
    # Told of each queued job folded into a running one, as the outcome "absorbed" (the metrics).
    observe: JobObserver | None = None

    async def __call__(self, job: Job) -> None:
        target = self.targets(job.tenant)
        work = EmbedWork.parse(job.payload)
        if target is None or work is None:
            return
        work = await self._absorb(job, work)
        if work.mode == "texts":
            await self._texts(job.tenant, target, work)
            return
        await self._embed(job.tenant, target, work)

    async def _embed(self, tenant: str, target: IndexTarget, work: EmbedWork) -> None:
        """Embed the newest views of the stretch that one job holds; queue the rest."""
        how = target.neighbour_vectors
        if work.mode == "context" and how == "off":
            return  # queued before the setting was turned off
        views = _model_views(how, work)
        # A job's bound is in texts: three views a message, or as many messages again when it embeds fewer.
        count = min(work.count, target.batch_messages * 3 // len(views))
        found = await self._read(tenant, work, count)
        if found is None:
            return  # deleted meanwhile
        path, conversation_id, user_id = found
        texts = [_text(m) for m in path]
        every_view = _views(tenant, user_id, path, texts, count)
        if how == "composed":  # each message's own view, and those of the two before the stretch
            cost = {m.node.id: min(len(t), TEXT_COST_CHARS) for m, t in zip(path, texts, strict=True)}
            count = _within_chars(cost, path, count, lookback=2)
        else:
            count = _within_chars(_costs([r for r, _ in every_view if r.view in views]), path, count, 0)
        if work.mode == "all" and work.count > count:
            # Too large for one job (many messages, or long ones): every message findable by keyword
            # first, then by meaning alone (one text each, a sixth of the model's work), then with its
            # neighbours, each pass in bounded jobs, newest first.
            await self._texts(tenant, target, replace(work, mode="texts"))
            stretch = (work.leaf_id, work.count)
            # `then`: the neighbours' pass to queue after this one (none unless the model embeds them).
            then = stretch if how == "model" else None
            await self._embed(tenant, target, EmbedWork(conversation_id, *stretch, "vectors", then))
            return
        kept = {m.node.id for m in path[len(path) - count :]}
        chosen = [(r, members) for r, members in every_view if _owner(r) in kept]
        if how == "composed":
            await self._composed(target, work, chosen, texts)
        else:
            await self._by_model(target, work, [r for r, _ in chosen], views)
        if await self._deleted(tenant, target, conversation_id):
            return
        if work.count > count:
            rest = replace(work, leaf_id=path[-count - 1].node.id, count=work.count - count)
            await self.queue.enqueue(rest.job(tenant))
        elif work.mode == "vectors" and work.then is not None and how == "model":
            await self.queue.enqueue(EmbedWork(conversation_id, *work.then, "context").job(tenant))

    async def _by_model(
        self, target: IndexTarget, work: EmbedWork, chosen: list[IndexRow], views: tuple[str, ...]
    ) -> None:
        """Embed the chosen rows of `views` one text each; without neighbour vectors, an exchange's other
        views still go in, as texts (found by keyword)."""
        rows = [r for r in chosen if r.view in views]
        texts_only = [r for r in chosen if r.view not in views] if work.mode == "all" else []
        if not rows:
            if texts_only:
                await target.index.add(texts_only)
            return
        try:
            vectors = await target.embedder.embed([r.text for r in rows])
        except EmbeddingError:
            if work.mode == "all":
                await target.index.add([*rows, *texts_only])  # by keyword meanwhile; a retry embeds
            raise
        # One write per batch (each write is a new table version and fragment, see lance_index); it
        # also fills in the vectors of rows whose texts were written first.
        embedded = [replace(r, vector=v) for r, v in zip(rows, vectors, strict=True)]
        await target.index.add([*embedded, *texts_only])

    async def _composed(
        self,
        target: IndexTarget,
        work: EmbedWork,
        chosen: list[tuple[IndexRow, tuple[int, ...]]],
        texts: list[str],
    ) -> None:
        """Embed the own view of every message the chosen rows join (the two before the stretch too:
        its first views hold them), and give each view with neighbours its members' vectors composed."""
        members = sorted({j for _, joined in chosen for j in joined})
        if not members:
            return
        try:
            vectors = await target.embedder.embed([texts[j] for j in members])
        except EmbeddingError:
            if work.mode == "all":
                await target.index.add([r for r, _ in chosen])  # by keyword meanwhile; a retry embeds
            raise
        at = {j: n for n, j in enumerate(members)}
        joins = [[at[j] for j in joined] for _, joined in chosen]
        # Off the event loop: the request path shares it (BENCHMARKS.md, issue 28).
        views = await anyio.to_thread.run_sync(composed_all, vectors, joins)
        await target.index.add([replace(r, vector=v) for (r, _), v in zip(chosen, views, strict=True)])

    async def _absorb(self, job: Job, work: EmbedWork) -> EmbedWork:
        """This job's work grown by the conversation's later exchanges still queued on the same branch,
        their jobs folded into this one (`JobQueue.absorb`): one path read, one embedding call and one
        index write for all of them. Under load a conversation's exchanges queue faster than jobs run,
        and each job's fixed cost (store reads, a call, a table write and its compaction share) was most
        of its time (BENCHMARKS.md, issue 16). Only stretches that join up with this one are taken."""
        if work.mode != "all" or work.conversation_id is None:
            return work
        prefix = f"{embed_key_prefix(work.conversation_id)}{work.mode}:"
        others: dict[str, EmbedWork] = {}
        for key, payload in await self.queue.queued(EMBED, prefix, job.tenant):
            other = EmbedWork.parse(payload)
            if key != job.key and other is not None and other.mode == "all":
                others[key] = other
        if not others:
            return work
        reach = work.count + sum(other.count for other in others.values())
        # The newest exchange of this job's branch: normally the one queued last. A path that does not
        # hold this job's leaf is another branch's, and so are the queued leaves on it.
        seen: set[str] = set()
        reads = 0
        for newest_key in reversed(others):
            if newest_key in seen:
                continue
            if reads == _BRANCH_READS:
                return work
            reads += 1
            newest = others[newest_key]
            path = await self.store.path(job.tenant, newest.leaf_id, newest_messages=reach)
            depths = {m.node.id: m.node.depth for m in path}
            if work.leaf_id in depths:
                break
            seen |= {key for key, other in others.items() if other.leaf_id in depths}
        else:
            return work
        stretches = {
            key: (depths[w.leaf_id] - w.count + 1, depths[w.leaf_id])
            for key, w in [*others.items(), (job.key or "", work)]
            if w.leaf_id in depths
        }
        low, high = stretches[newest_key]
        # Down from the newest (the path ends there): every stretch that reaches the covered span joins.
        for start, end in sorted(stretches.values(), key=lambda s: s[1], reverse=True):
            if end >= low - 1:
                low = min(low, start)
        if stretches[job.key or ""][0] < low:
            return work  # a gap between this job's stretch and the newer ones
        keys = [key for key, (start, _) in stretches.items() if start >= low and key in others]
        grown = EmbedWork(work.conversation_id, newest.leaf_id, high - low + 1, work.mode)
        absorbed = await self.queue.absorb(job, keys, grown.job(job.tenant).payload)
        if not absorbed:
            return work  # taken by other workers meanwhile (or this lease was lost)
        log.debug("embed job %s absorbed %d queued jobs of its conversation", job.id, len(absorbed))
        if self.observe is not None:
            for _ in absorbed:
                self.observe(EMBED, "absorbed", None)
        return grown

    async def _texts(self, tenant: str, target: IndexTarget, work: EmbedWork) -> None:
        """Write the texts (no vectors) of the newest `TEXT_CHUNK_MESSAGES` of the stretch; queue the rest."""
        count = min(work.count, TEXT_CHUNK_MESSAGES)
        found = await self._read(tenant, work, count)
        if found is None:
            return
        path, conversation_id, user_id = found
        # Thousands of rows: built off the event loop, which the request path shares.
        rows = await anyio.to_thread.run_sync(index_rows, tenant, user_id, path, count)
        await target.index.add(rows)
        if await self._deleted(tenant, target, conversation_id):
            return
        if work.count > count:
            rest = EmbedWork(conversation_id, path[-count - 1].node.id, work.count - count, "texts")
            await self.queue.enqueue(rest.job(tenant))

    async def _read(
        self, tenant: str, work: EmbedWork, count: int
    ) -> tuple[list[StoredMessage], str, str | None] | None:
        """The newest `count` messages of the stretch and the two before them (their views need them),
        the conversation and its user; None when it was deleted."""
        path = await self.store.path(tenant, work.leaf_id, newest_messages=count + 2)
        if not path:
            return None
        conversation = await self.store.get_conversation(tenant, path[-1].node.conversation_id)
        if conversation is None:
            return None
        return path, conversation.id, conversation.user_id

    async def _deleted(self, tenant: str, target: IndexTarget, conversation_id: str) -> bool:
        if await self.store.get_conversation(tenant, conversation_id) is not None:
            return False
        # Deleted while this job ran: its delete may have missed the rows written just now.
        await target.index.delete(tenant, conversation_id=conversation_id)
        return True
