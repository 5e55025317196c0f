"""MessageStore over SQLAlchemy/SQLModel; blocking database work runs on worker threads.

The request path uses Core statements built once at import with bound parameters (building a statement
cost more than running it) and plain-column rows, no ORM objects; the read API may use the ORM.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import orjson
from sqlalchemy import (
    Engine,
    Select,
    Text,
    bindparam,
    cast,
    create_engine,
    delete,
    event,
    func,
    insert,
    update,
)
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlmodel import SQLModel, col, select

from gateway.adapters.sql import nul
from gateway.adapters.sql.jobs import SqlJobQueue, cancel_in, enqueue_in
from gateway.adapters.sql.migrations import migrate
from gateway.adapters.sql.tables import (
    CompactionCursorRow,
    ConversationRow,
    MessageRow,
    RequestRow,
    ResponseRow,
    SummaryRow,
    utcnow,
)
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
_IN_CHUNK = 900  # stays under SQLite's default bound-parameter limit
_NODE_COLUMNS = (
    col(MessageRow.id),
    col(MessageRow.conversation_id),
    col(MessageRow.parent_id),
    col(MessageRow.depth),
    col(MessageRow.role),
    col(MessageRow.token_count),
    col(MessageRow.path_tokens),
)
_MESSAGE_COLUMNS = (*_NODE_COLUMNS, col(MessageRow.content), col(MessageRow.created_at), col(MessageRow.meta))
_CONVERSATIONS = SQLModel.metadata.tables[str(ConversationRow.__tablename__)]
_MESSAGES = SQLModel.metadata.tables[str(MessageRow.__tablename__)]
_REQUESTS = SQLModel.metadata.tables[str(RequestRow.__tablename__)]
_SUMMARIES = SQLModel.metadata.tables[str(SummaryRow.__tablename__)]
# Everything that holds a conversation's words, deleted with it (the conversation row last).
_OWNED_BY_CONVERSATION = (
    _MESSAGES,
    _SUMMARIES,
    _REQUESTS,  # their reports name message ids
    SQLModel.metadata.tables[str(ResponseRow.__tablename__)],  # stored Responses hold the answers' text
    SQLModel.metadata.tables[str(CompactionCursorRow.__tablename__)],
    _CONVERSATIONS,
)

_NODES_BY_ID = sa_select(*_NODE_COLUMNS).where(
    col(MessageRow.id).in_(bindparam("ids", expanding=True)), col(MessageRow.tenant) == bindparam("tenant")
)
_CONVERSATION_BY_EXTERNAL = sa_select(_CONVERSATIONS).where(
    _CONVERSATIONS.c.tenant == bindparam("tenant"), _CONVERSATIONS.c.external_id == bindparam("external_id")
)


def _path_statement() -> Select[*tuple[Any, ...]]:
    """Node-to-root walk through `parent_id` (a recursive CTE: one round trip), oldest first. It stops at
    messages whose whole path is at or under `floor` tokens, or at depth `min_depth`, so only the newest
    stretch is read."""
    ids = (col(MessageRow.id), col(MessageRow.parent_id))
    start = sa_select(*ids).where(
        col(MessageRow.id) == bindparam("node_id"), col(MessageRow.tenant) == bindparam("tenant")
    )
    walk = start.cte("walk", recursive=True)
    step = (
        sa_select(*ids)
        .join(walk, col(MessageRow.id) == walk.c.parent_id)
        .where(
            col(MessageRow.path_tokens) > bindparam("floor"), col(MessageRow.depth) > bindparam("min_depth")
        )
    )
    walk = walk.union_all(step)
    return (
        sa_select(*_MESSAGE_COLUMNS)
        .join(walk, col(MessageRow.id) == walk.c.id)
        .where(col(MessageRow.tenant) == bindparam("tenant"))
        .order_by(col(MessageRow.depth))
    )


_PATH = _path_statement()
# Locks an existing conversation's row for the rest of the transaction (a concurrent DELETE waits, or
# has already removed it: no row).
HOLD_CONVERSATION = (
    update(_CONVERSATIONS)
    .where(_CONVERSATIONS.c.id == bindparam("held_id"), _CONVERSATIONS.c.tenant == bindparam("held_tenant"))
    .values(updated_at=_CONVERSATIONS.c.updated_at)
)
_TOUCH_CONVERSATION = (
    update(_CONVERSATIONS)
    .where(_CONVERSATIONS.c.id == bindparam("conversation_id"))
    .values(
        last_message_id=bindparam("last_message_id"),
        updated_at=bindparam("now"),
        message_count=_CONVERSATIONS.c.message_count + bindparam("added"),
    )
)


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` use psycopg 3, the driver this project installs."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url


_LOCK_WAIT_SECONDS = 30.0  # how long a SQLite connection waits for another's lock


def build_engine(url: str) -> Engine:
    url = normalise_url(url)
    parsed = make_url(url)
    serialise = {"json_serializer": lambda o: orjson.dumps(o).decode(), "json_deserializer": orjson.loads}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": _LOCK_WAIT_SECONDS},
            pool_size=8,
            **serialise,
        )

        @event.listens_for(engine, "connect")
        def _pragmas(connection: object, _record: object) -> None:
            cursor = connection.cursor()  # type: ignore[attr-defined]
            _write_ahead_log(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True, **serialise)


def _write_ahead_log(cursor: sqlite3.Cursor) -> None:
    """Put the database in WAL mode (kept in the file: once is enough). The switch takes the file's
    exclusive lock and SQLite answers "database is locked" at once, without its busy wait, when another
    process holds a lock: processes starting together on a new file (`serve --workers N`) each try it,
    so a locked switch is tried again until the mode is WAL or the wait is over."""
    deadline = time.monotonic() + _LOCK_WAIT_SECONDS
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _conversation(row: ConversationRow) -> Conversation:
    return Conversation(
        id=row.id,
        tenant=row.tenant,
        user_id=row.user_id,
        external_id=row.external_id,
        root_id=row.root_id,
        last_message_id=row.last_message_id,
        message_count=row.message_count,
        created_at=_aware(row.created_at),
        updated_at=_aware(row.updated_at),
        title=row.title,
        gist=row.gist,
    )


def _node(row: Sequence[Any]) -> StoredNode:
    return StoredNode(row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def _message(row: Sequence[Any]) -> StoredMessage:
    return StoredMessage(_node(row), nul.unpack(row[7]), _aware(row[8]), row[9] or {})


class SqlStore:
    def __init__(self, engine: Engine, *, threads: int = 8, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self._clock = clock  # when messages were received; a settable clock replays dated histories
        self._limiter = anyio.CapacityLimiter(threads)
        self.jobs = SqlJobQueue(engine)  # shares the engine: jobs commit with the messages that cause them
        dialect_insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
        # Two first requests naming the same conversation at once create it once.
        self._insert_conversation = (
            dialect_insert(_CONVERSATIONS)
            .on_conflict_do_nothing(index_elements=["tenant", "external_id"])
            .returning(_CONVERSATIONS.c.id)
        )
        self._insert_messages = (
            dialect_insert(_MESSAGES).on_conflict_do_nothing(index_elements=["id"]).returning(_MESSAGES.c.id)
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
                found = connection.execute(_CONVERSATION_BY_EXTERNAL, by_external).first()
                conversation = (
                    _conversation(ConversationRow.model_validate(found._mapping)) if found else None
                )
            for start in range(0, len(hashes), _IN_CHUNK):
                by_ids = {"ids": hashes[start : start + _IN_CHUNK], "tenant": tenant}
                for row in connection.execute(_NODES_BY_ID, by_ids):
                    nodes[row[0]] = _node(row)
        return Lookup(conversation, nodes)

    async def path(
        self, tenant: str, node_id: str, newest_tokens: int | None = None, newest_messages: int | None = None
    ) -> list[StoredMessage]:
        if "\x00" in node_id:
            return []  # no id holds a NUL (and Postgres refuses one in a query)
        return await self._run(partial(self._path, tenant, node_id, newest_tokens, newest_messages))

    def _path(
        self, tenant: str, node_id: str, newest_tokens: int | None, newest_messages: int | None
    ) -> list[StoredMessage]:
        with self.engine.connect() as connection:
            floor, min_depth = -1, -1
            if newest_tokens is not None or newest_messages is not None:
                leaf = connection.execute(_NODES_BY_ID, {"ids": [node_id], "tenant": tenant}).first()
                if leaf is None:
                    return []
                if newest_tokens is not None:
                    floor = _node(leaf).path_tokens - newest_tokens
                if newest_messages is not None:
                    min_depth = _node(leaf).depth - newest_messages
            params = {"node_id": node_id, "tenant": tenant, "floor": floor, "min_depth": min_depth}
            return [_message(row) for row in connection.execute(_PATH, params)]

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
                conversation_id = connection.execute(_CONVERSATION_BY_EXTERNAL, by_external).first()[0]  # type: ignore[index]
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
        connection.execute(_TOUCH_CONVERSATION, params)
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
            connection.execute(insert(_REQUESTS), _record_fields(record))
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
                return [_conversation(row) for row in session.scalars(query)]

        return await self._run(run)

    async def get_conversation(self, tenant: str, conversation_id: str) -> Conversation | None:
        if "\x00" in conversation_id:
            return None

        def run() -> Conversation | None:
            with Session(self.engine) as session:
                row = session.get(ConversationRow, conversation_id)
                return _conversation(row) if row is not None and row.tenant == tenant else None

        return await self._run(run)

    async def conversation_messages(self, tenant: str, conversation_id: str) -> list[StoredMessage]:
        if "\x00" in conversation_id:
            return []

        def run() -> list[StoredMessage]:
            query = (
                sa_select(*_MESSAGE_COLUMNS)
                .where(col(MessageRow.tenant) == tenant, col(MessageRow.conversation_id) == conversation_id)
                .order_by(col(MessageRow.depth), col(MessageRow.created_at))
            )
            with self.engine.connect() as connection:
                return [_message(row) for row in connection.execute(query)]

        return await self._run(run)

    async def get_request(self, tenant: str, request_id: str) -> RequestRecord | None:
        if "\x00" in request_id:
            return None

        def run() -> RequestRecord | None:
            with Session(self.engine) as session:
                row = session.get(RequestRow, request_id)
                return _request(row) if row is not None and row.tenant == tenant else None

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
                return [_request(row) for row in session.scalars(query)]

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
                sa_select(_CONVERSATIONS.c.id, _CONVERSATIONS.c.user_id)
                .where(_CONVERSATIONS.c.tenant == tenant)
                .with_for_update()
            )
            if conversation_id is not None:
                query = query.where(_CONVERSATIONS.c.id == conversation_id)
            if user_id is not None:
                query = query.where(_CONVERSATIONS.c.user_id == user_id)
            with self.engine.begin() as connection:
                rows = list(connection.execute(query))
                ids = [row[0] for row in rows]
                for start in range(0, len(ids), _IN_CHUNK):
                    chunk = ids[start : start + _IN_CHUNK]
                    for table in _OWNED_BY_CONVERSATION:
                        column = table.c.id if table is _CONVERSATIONS else table.c.conversation_id
                        connection.execute(delete(table).where(table.c.tenant == tenant, column.in_(chunk)))
                # Retrieval reaches a user's other conversations: blocks sent elsewhere may quote these.
                for user in {row[1] for row in rows if row[1] is not None}:
                    _forget_sent_context(connection, tenant, user)
            return ids

        return await self._run(run)

    async def set_title(self, tenant: str, conversation_id: str, title: str, gist: str | None) -> bool:
        def run() -> bool:
            with self.engine.begin() as connection:
                done = connection.execute(
                    update(_CONVERSATIONS)
                    .where(_CONVERSATIONS.c.tenant == tenant, _CONVERSATIONS.c.id == conversation_id)
                    .values(title=title.replace("\x00", ""), gist=gist.replace("\x00", "") if gist else None)
                )
                return bool(done.rowcount)

        return await self._run(run)

    async def forget_sent_context(self, tenant: str, user_id: str) -> int:
        def run() -> int:
            with self.engine.begin() as connection:
                return _forget_sent_context(connection, tenant, user_id)

        return await self._run(run)

    async def count_messages(self, tenant: str) -> int:
        def run() -> int:
            with self.engine.connect() as connection:
                query = select(func.count()).select_from(MessageRow).where(MessageRow.tenant == tenant)
                return int(connection.execute(query).scalar_one())

        return await self._run(run)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.engine.dispose)


def _forget_sent_context(connection: Connection, tenant: str, user_id: str) -> int:
    requests = _REQUESTS.c
    done = connection.execute(
        update(_REQUESTS)
        .where(requests.tenant == tenant, requests.user_id == user_id, requests.sent_context.is_not(None))
        .values(sent_context=None)
    )
    # The user's prompt epochs pin what their stable blocks showed (a profile's text): a new epoch begins.
    summaries = _SUMMARIES.c
    conversations = sa_select(_CONVERSATIONS.c.id).where(
        _CONVERSATIONS.c.tenant == tenant, _CONVERSATIONS.c.user_id == user_id
    )
    connection.execute(
        delete(_SUMMARIES).where(
            summaries.tenant == tenant,
            summaries.level == "epoch",
            summaries.conversation_id.in_(conversations),
        )
    )
    return int(done.rowcount)


MODEL_CHARS = 200  # requests.model


def _record_fields(record: RequestRecord) -> dict[str, object]:
    fields: dict[str, object] = {name: getattr(record, name) for name in RequestRecord.__dataclass_fields__}
    for name in ("model", "error"):  # client- and provider-written text: Postgres refuses U+0000 in it
        value = fields[name]
        if isinstance(value, str) and "\x00" in value:
            fields[name] = value.replace("\x00", "\ufffd")
    model = fields["model"]
    if isinstance(model, str) and len(model) > MODEL_CHARS:  # the column's size: the rest is dropped, said so
        fields["model"] = model[: MODEL_CHARS - 1] + "\u2026"
    for name in ("report", "usage"):
        value = fields[name]
        if isinstance(value, dict):
            fields[name] = nul.pack(value)
    if record.sent_context is not None:
        fields["sent_context"] = nul.pack(record.sent_context)
    return fields


def _request(row: RequestRow) -> RequestRecord:
    fields = row.model_dump()
    fields["created_at"] = _aware(row.created_at)
    fields["sent_context"] = nul.unpack(row.sent_context) if row.sent_context is not None else None
    fields["report"] = nul.unpack(row.report) if row.report is not None else None
    fields["usage"] = nul.unpack(row.usage) if row.usage is not None else None
    return RequestRecord(**fields)


__all__ = ["JSONObject", "NewMessage", "SqlStore", "StoreError", "build_engine", "normalise_url"]
