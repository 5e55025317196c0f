"""MessageStore over SQLAlchemy/SQLModel; blocking database work runs on worker threads.

The request path uses Core statements built once at import with bound parameters (building a statement
cost more than running it) and plain-column rows, no ORM objects; the read API may use the ORM.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import TypeVar

import anyio
from sqlalchemy import Engine, Text, cast, delete, func, insert, update
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlmodel import col, select

from gateway.adapters.sql import nul
from gateway.adapters.sql.engine import build_engine, normalise_url
from gateway.adapters.sql.jobs import SqlJobQueue, cancel_in, enqueue_in
from gateway.adapters.sql.migrations import migrate
from gateway.adapters.sql.store_rows import (
    CONVERSATION_BY_EXTERNAL,
    CONVERSATIONS,
    HOLD_CONVERSATION,
    IN_CHUNK,
    MAX_DEPTH,
    MESSAGE_COLUMNS,
    MESSAGES,
    NODES_BY_ID,
    OWNED_BY_CONVERSATION,
    PATH,
    REQUESTS,
    TOUCH_CONVERSATION,
    forget_sent_context_in,
    record_fields,
    to_conversation,
    to_message,
    to_node,
    to_request,
)
from gateway.adapters.sql.tables import ConversationRow, MessageRow, RequestRow, utcnow
from gateway.errors import ConversationDeleted, StoreError
from gateway.ports import JSONObject
from gateway.records import (
    AppendRequest,
    Conversation,
    Lookup,
    NewMessage,
    RequestRecord,
    StoredMessage,
    StoredNode,
)

T = TypeVar("T")


class SqlStore:
    def __init__(self, engine: Engine, *, threads: int = 8, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self._clock = clock  # when messages were received; a settable clock replays dated histories
        self._limiter = anyio.CapacityLimiter(threads)
        self.jobs = SqlJobQueue(engine)  # shares the engine: jobs commit with the messages that cause them
        dialect_insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
        # Two first requests naming the same conversation at once create it once.
        self._insert_conversation = (
            dialect_insert(CONVERSATIONS)
            .on_conflict_do_nothing(index_elements=["tenant", "external_id"])
            .returning(CONVERSATIONS.c.id)
        )
        self._insert_messages = (
            dialect_insert(MESSAGES).on_conflict_do_nothing(index_elements=["id"]).returning(MESSAGES.c.id)
        )

    @classmethod
    def open(cls, url: str, clock: Callable[[], datetime] = utcnow) -> SqlStore:
        engine = build_engine(url)
        migrate(engine)
        return cls(engine, clock=clock)

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except SQLAlchemyError as exc:
            raise StoreError(f"store failed: {type(exc).__name__}: {exc}") from exc

    # -- request path -------------------------------------------------------------------------------

    async def lookup(self, tenant: str, hashes: Sequence[str], external_id: str | None) -> Lookup:
        return await self._run(partial(self._lookup, tenant, list(hashes), external_id))

    def _lookup(self, tenant: str, hashes: list[str], external_id: str | None) -> Lookup:
        nodes: dict[str, StoredNode] = {}
        conversation = None
        with self.engine.connect() as connection:
            if external_id is not None:
                by_external = {"tenant": tenant, "external_id": external_id}
                found = connection.execute(CONVERSATION_BY_EXTERNAL, by_external).first()
                conversation = (
                    to_conversation(ConversationRow.model_validate(found._mapping)) if found else None
                )
            for start in range(0, len(hashes), IN_CHUNK):
                by_ids = {"ids": hashes[start : start + IN_CHUNK], "tenant": tenant}
                for row in connection.execute(NODES_BY_ID, by_ids):
                    nodes[row[0]] = to_node(row)
        return Lookup(conversation, nodes)

    async def path(
        self,
        tenant: str,
        node_id: str,
        newest_tokens: int | None = None,
        newest_messages: int | None = None,
        through_depth: int | None = None,
    ) -> list[StoredMessage]:
        if "\x00" in node_id:
            return []  # no id holds a NUL (and Postgres refuses one in a query)
        read = partial(self._path, tenant, node_id, newest_tokens, newest_messages, through_depth)
        return await self._run(read)

    def _path(
        self,
        tenant: str,
        node_id: str,
        newest_tokens: int | None,
        newest_messages: int | None,
        through_depth: int | None,
    ) -> list[StoredMessage]:
        with self.engine.connect() as connection:
            floor, min_depth = -1, -1
            if newest_tokens is not None or newest_messages is not None:
                leaf = connection.execute(NODES_BY_ID, {"ids": [node_id], "tenant": tenant}).first()
                if leaf is None:
                    return []
                if newest_tokens is not None:
                    floor = to_node(leaf).path_tokens - newest_tokens
                if newest_messages is not None:
                    min_depth = to_node(leaf).depth - newest_messages
            max_depth = MAX_DEPTH if through_depth is None else through_depth
            params = {
                "node_id": node_id,
                "tenant": tenant,
                "floor": floor,
                "min_depth": min_depth,
                "max_depth": max_depth,
            }
            return [to_message(row) for row in connection.execute(PATH, params)]

    async def append(self, request: AppendRequest) -> str:
        conversation_id = await self._run(partial(self._append, request))
        if request.jobs:
            self.jobs.notify_listeners()
        return conversation_id

    def _append(self, request: AppendRequest) -> str:
        with self.engine.begin() as connection:
            return self._append_in(connection, request)

    def _append_in(self, connection: Connection, request: AppendRequest) -> str:
        now = self._clock()
        conversation_id = request.conversation_id
        if conversation_id is None:
            conversation_id = uuid.uuid4().hex
            created = connection.execute(
                self._insert_conversation,
                {
                    "id": conversation_id,
                    "tenant": request.tenant,
                    "user_id": request.user_id,
                    "external_id": request.external_id,
                    "root_id": request.messages[0].id if request.messages else None,
                    "last_message_id": None,
                    "message_count": 0,
                    "created_at": now,
                    "updated_at": now,
                },
            )
            if created.first() is None and request.external_id is not None:
                # Another request created this named conversation first: join it.
                by_external = {"tenant": request.tenant, "external_id": request.external_id}
                conversation_id = connection.execute(CONVERSATION_BY_EXTERNAL, by_external).first()[0]  # type: ignore[index]
        else:
            held = {"held_id": conversation_id, "held_tenant": request.tenant}
            if connection.execute(HOLD_CONVERSATION, held).rowcount == 0:
                raise ConversationDeleted(f"conversation {conversation_id} was deleted")
        if request.cancel_jobs:
            cancel_in(connection, request.tenant, request.cancel_jobs)
        if not request.messages:
            enqueue_in(connection, request.jobs)
            return conversation_id
        rows = [
            {
                "id": m.id,
                "tenant": request.tenant,
                "conversation_id": conversation_id,
                "parent_id": m.parent_id,
                "depth": m.depth,
                "role": m.role,
                "content": nul.pack(m.data),
                "token_count": m.token_count,
                "path_tokens": m.path_tokens,
                "meta": m.meta(),
                "created_at": now,
            }
            for m in request.messages
        ]
        # Two requests racing with the same new message store it once: the id is the chain hash.
        inserted = len(connection.execute(self._insert_messages, rows).all())
        if inserted or request.jobs_even_if_stored:
            # The jobs are about these messages: when all of them were stored already (the same request
            # sent again, a regenerated identical answer), they were queued then, unless the request
            # says they reach back to messages of its own that no other job covers.
            enqueue_in(connection, request.jobs)
        params = {
            "conversation_id": conversation_id,
            "last_message_id": request.messages[-1].id,
            "now": now,
            "added": inserted,
        }
        connection.execute(TOUCH_CONVERSATION, params)
        return conversation_id

    async def complete(self, record: RequestRecord, answer: AppendRequest | None) -> bool:
        stored = await self._run(partial(self._complete, record, answer))
        if stored and answer is not None and answer.jobs:
            self.jobs.notify_listeners()
        return stored

    def _complete(self, record: RequestRecord, answer: AppendRequest | None) -> bool:
        with self.engine.begin() as connection:
            stored = True
            if answer is not None and answer.conversation_id is not None:
                try:
                    self._append_in(connection, answer)
                except ConversationDeleted:
                    # Deleted while the answer streamed (nothing was written yet): the answer goes, and
                    # the record keeps no link to the conversation or its messages.
                    stored = False
                    record = replace(
                        record, conversation_id=None, parent_message_id=None, report=None, sent_context=None
                    )
            connection.execute(insert(REQUESTS), record_fields(record))
            return stored

    # -- read API -----------------------------------------------------------------------------------

    async def list_conversations(
        self,
        tenant: str,
        *,
        limit: int = 50,
        user_id: str | None = None,
        offset: int = 0,
        text: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[Conversation]:
        def run() -> list[Conversation]:
            query = select(ConversationRow).where(ConversationRow.tenant == tenant)
            if user_id is not None:
                query = query.where(ConversationRow.user_id == user_id)
            if since is not None:
                query = query.where(col(ConversationRow.updated_at) >= since)
            if until is not None:
                query = query.where(col(ConversationRow.updated_at) < until)
            if text:
                # A message holding a NUL is stored with it escaped (nul.pack): search for that form.
                needle = nul.escape(text) if "\x00" in text else text
                # A substring of the stored JSON (the message text; quotes and newlines are escaped there).
                pattern = "%" + needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
                holds = (
                    sa_select(col(MessageRow.id))
                    .where(
                        col(MessageRow.tenant) == tenant,
                        col(MessageRow.conversation_id) == col(ConversationRow.id),
                        cast(col(MessageRow.content), Text).ilike(pattern, escape="\\"),
                    )
                    .exists()
                )
                query = query.where(holds)
            query = query.order_by(col(ConversationRow.updated_at).desc()).offset(offset).limit(limit)
            with Session(self.engine) as session:
                return [to_conversation(row) for row in session.scalars(query)]

        return await self._run(run)

    async def get_conversation(self, tenant: str, conversation_id: str) -> Conversation | None:
        if "\x00" in conversation_id:
            return None

        def run() -> Conversation | None:
            with Session(self.engine) as session:
                row = session.get(ConversationRow, conversation_id)
                return to_conversation(row) if row is not None and row.tenant == tenant else None

        return await self._run(run)

    async def conversation_messages(self, tenant: str, conversation_id: str) -> list[StoredMessage]:
        if "\x00" in conversation_id:
            return []

        def run() -> list[StoredMessage]:
            query = (
                sa_select(*MESSAGE_COLUMNS)
                .where(col(MessageRow.tenant) == tenant, col(MessageRow.conversation_id) == conversation_id)
                .order_by(col(MessageRow.depth), col(MessageRow.created_at))
            )
            with self.engine.connect() as connection:
                return [to_message(row) for row in connection.execute(query)]

        return await self._run(run)

    async def get_request(self, tenant: str, request_id: str) -> RequestRecord | None:
        if "\x00" in request_id:
            return None

        def run() -> RequestRecord | None:
            with Session(self.engine) as session:
                row = session.get(RequestRow, request_id)
                return to_request(row) if row is not None and row.tenant == tenant else None

        return await self._run(run)

    async def list_requests(
        self, tenant: str, *, conversation_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[RequestRecord]:
        query = select(RequestRow).where(RequestRow.tenant == tenant)
        if conversation_id is not None:
            query = query.where(RequestRow.conversation_id == conversation_id)
        query = query.order_by(col(RequestRow.created_at).desc()).offset(offset).limit(limit)

        def run() -> list[RequestRecord]:
            with Session(self.engine) as session:
                return [to_request(row) for row in session.scalars(query)]

        return await self._run(run)

    async def delete_conversations(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> list[str]:
        if conversation_id is None and user_id is None:
            raise ValueError("give conversation_id or user_id")
        if "\x00" in (conversation_id or "") + (user_id or ""):
            return []  # stored ids hold none (a user id with one is stored as its digest: bounded_id)

        def run() -> list[str]:
            # Rows locked first (Postgres): an answer being stored meanwhile either commits before (and
            # is deleted here) or finds its conversation gone; SQLite serialises writers anyway.
            query = (
                sa_select(CONVERSATIONS.c.id, CONVERSATIONS.c.user_id)
                .where(CONVERSATIONS.c.tenant == tenant)
                .with_for_update()
            )
            if conversation_id is not None:
                query = query.where(CONVERSATIONS.c.id == conversation_id)
            if user_id is not None:
                query = query.where(CONVERSATIONS.c.user_id == user_id)
            with self.engine.begin() as connection:
                rows = list(connection.execute(query))
                ids = [row[0] for row in rows]
                for start in range(0, len(ids), IN_CHUNK):
                    chunk = ids[start : start + IN_CHUNK]
                    for table in OWNED_BY_CONVERSATION:
                        column = table.c.id if table is CONVERSATIONS else table.c.conversation_id
                        connection.execute(delete(table).where(table.c.tenant == tenant, column.in_(chunk)))
                # Retrieval reaches a user's other conversations: blocks sent elsewhere may quote these.
                for user in {row[1] for row in rows if row[1] is not None}:
                    forget_sent_context_in(connection, tenant, user)
            return ids

        return await self._run(run)

    async def set_title(self, tenant: str, conversation_id: str, title: str, gist: str | None) -> bool:
        def run() -> bool:
            with self.engine.begin() as connection:
                done = connection.execute(
                    update(CONVERSATIONS)
                    .where(CONVERSATIONS.c.tenant == tenant, CONVERSATIONS.c.id == conversation_id)
                    .values(title=title.replace("\x00", ""), gist=gist.replace("\x00", "") if gist else None)
                )
                return bool(done.rowcount)

        return await self._run(run)

    async def forget_sent_context(self, tenant: str, user_id: str) -> int:
        def run() -> int:
            with self.engine.begin() as connection:
                return forget_sent_context_in(connection, tenant, user_id)

        return await self._run(run)

    async def count_messages(self, tenant: str) -> int:
        def run() -> int:
            with self.engine.connect() as connection:
                query = select(func.count()).select_from(MessageRow).where(MessageRow.tenant == tenant)
                return int(connection.execute(query).scalar_one())

        return await self._run(run)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.engine.dispose)


__all__ = [
    "HOLD_CONVERSATION",
    "JSONObject",
    "NewMessage",
    "SqlStore",
    "StoreError",
    "build_engine",
    "normalise_url",
]
