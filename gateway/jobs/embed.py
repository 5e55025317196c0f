"""Embed job: index an exchange's new messages for retrieval (texts and vectors, one write).

Each message is indexed in three views (itself; with its parent; with its parent and child) because a
short reply ("yes, port 8443 then") carries its meaning in its neighbours. The views are embedded in one
batch and written together. If the embedder fails, the texts are written alone, so the messages are
findable by keyword until a retry adds the vectors. Writes are keyed by row id: a retry rewrites nothing
twice. Until its job has run (normally within a second of the answer) a message is in the recent window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gateway.errors import EmbeddingError
from gateway.pipeline.text import message_text
from gateway.ports import Embedder, JSONObject, MessageStore, VectorIndex
from gateway.records import IndexRow, Job, NewJob, StoredMessage

log = logging.getLogger(__name__)

EMBED = "embed"


def embed_job(tenant: str, leaf_id: str, count: int) -> NewJob:
    """Index the `count` newest messages of the path ending at `leaf_id`."""
    payload: JSONObject = {"leaf_id": leaf_id, "count": count}
    return NewJob(EMBED, tenant, payload, key=f"{EMBED}:{leaf_id}")


@dataclass(frozen=True, slots=True)
class IndexTarget:
    """Where one tenant's messages are indexed, and with which model."""

    embedder: Embedder
    index: VectorIndex


def index_rows(tenant: str, user_id: str | None, path: Sequence[StoredMessage], count: int) -> list[IndexRow]:
    """The views of the `count` newest messages of `path` (and the parent-and-child view of the message
    before them, whose child has now arrived). `path` holds at least two messages before those, if any."""
    texts = [message_text(m.data).strip() for m in path]
    rows: list[IndexRow] = []

    def row(index: int, view: str, text: str, suffix: str = "") -> None:
        m = path[index]
        rows.append(
            IndexRow(
                id=f"{m.node.id}:{view}{suffix}",
                tenant=tenant,
                user_id=user_id,
                conversation_id=m.node.conversation_id,
                node_id=m.node.id,
                view=view,
                depth=m.node.depth,
                created_at=m.created_at,
                text=text,
            )
        )

    for index in range(max(len(path) - count, 0), len(path)):
        if not texts[index]:
            continue  # nothing to find it by (an empty tool-call shell is found through its neighbours)
        row(index, "m", texts[index])
        if index >= 1 and texts[index - 1]:
            row(index, "p", f"{texts[index - 1]}\n{texts[index]}")
            before = texts[index - 2] if index >= 2 else ""
            window = "\n".join(t for t in (before, texts[index - 1], texts[index]) if t)
            row(index - 1, "w", window, f":{path[index].node.id}")  # keyed by the child: branches differ
    return rows


@dataclass(slots=True)
class EmbedHandler:
    store: MessageStore
    targets: Callable[[str], IndexTarget | None]  # tenant -> its index; None: retrieval is off

    async def __call__(self, job: Job) -> None:
        target = self.targets(job.tenant)
        leaf_id, count = job.payload.get("leaf_id"), job.payload.get("count")
        if target is None or not isinstance(leaf_id, str) or not isinstance(count, int) or count < 1:
            return
        path = await self.store.path(job.tenant, leaf_id, newest_messages=count + 2)
        if not path:
            return  # deleted meanwhile
        conversation_id = path[-1].node.conversation_id
        conversation = await self.store.get_conversation(job.tenant, conversation_id)
        if conversation is None:
            return
        rows = index_rows(job.tenant, conversation.user_id, path, count)
        if not rows:
            return
        try:
            vectors = await target.embedder.embed([r.text for r in rows])
        except EmbeddingError:
            # Findable by keyword meanwhile; the retry fills the vectors in.
            await target.index.add(rows)
            raise
        embedded = [replace(r, vector=v) for r, v in zip(rows, vectors, strict=True)]
        # One write per exchange: each write is a new table version and fragment (see lance_index).
        await target.index.add(embedded)
        if job.attempts > 1:  # an earlier attempt may have stored these rows without vectors
            await target.index.set_vectors(job.tenant, {r.id: r.vector for r in embedded if r.vector})
        if await self.store.get_conversation(job.tenant, conversation_id) is None:
            # Deleted while this job ran: its delete may have missed the rows written just now.
            await target.index.delete(job.tenant, conversation_id=conversation_id)
