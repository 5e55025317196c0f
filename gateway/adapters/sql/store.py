"""MessageStore over SQLAlchemy/SQLModel; blocking database work runs on worker threads.

Hot-path queries select plain columns (no ORM objects): a 1,000-message history is one indexed
`id IN (...)` lookup on the primary key.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import orjson
from sqlalchemy import Engine, create_engine, event, func, update
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlmodel import col, select

from gateway.adapters.sql.migrations import migrate
from gateway.adapters.sql.tables import ConversationRow, MessageRow, RequestRow, utcnow
from gateway.errors import StoreError
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


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` use psycopg 3, the driver this project installs."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url


def build_engine(url: str) -> Engine:
    url = normalise_url(url)
    parsed = make_url(url)
    serialise = {"json_serializer": lambda o: orjson.dumps(o).decode(), "json_deserializer": orjson.loads}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=8, **serialise
        )

        @event.listens_for(engine, "connect")
        def _pragmas(connection: object, _record: object) -> None:
            cursor = connection.cursor()  # type: ignore[attr-defined]
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True, **serialise)


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
    )


def _node(row: Sequence[Any]) -> StoredNode:
    return StoredNode(row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def _message(row: Sequence[Any]) -> StoredMessage:
    return StoredMessage(_node(row), row[7], _aware(row[8]), row[9] or {})


class SqlStore:
    def __init__(self, engine: Engine, *, threads: int = 8) -> None:
        self.engine = engine
        self._limiter = anyio.CapacityLimiter(threads)
        self._insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert

    @classmethod
    def open(cls, url: str) -> SqlStore:
        engine = build_engine(url)
        migrate(engine)
        return cls(engine)

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
        with self.engine.connect() as connection:
            conversation = None
            if external_id is not None:
                found = connection.execute(
                    select(ConversationRow).where(
                        col(ConversationRow.tenant) == tenant, col(ConversationRow.external_id) == external_id
                    )
                ).first()
                conversation = (
                    _conversation(ConversationRow.model_validate(found._mapping)) if found else None
                )
            for start in range(0, len(hashes), _IN_CHUNK):
                chunk = hashes[start : start + _IN_CHUNK]
                query = sa_select(*_NODE_COLUMNS).where(
                    col(MessageRow.id).in_(chunk), col(MessageRow.tenant) == tenant
                )
                for row in connection.execute(query):
                    node = _node(row)
                    nodes[node.id] = node
        return Lookup(conversation, nodes)

    async def path(self, tenant: str, node_id: str) -> list[StoredMessage]:
        return await self._run(partial(self._path, tenant, node_id))

    def _path(self, tenant: str, node_id: str) -> list[StoredMessage]:
        """Root-to-node path through `parent_id`, with a recursive CTE (one round trip)."""
        ids = (col(MessageRow.id), col(MessageRow.parent_id))
        base = sa_select(*ids).where(col(MessageRow.id) == node_id, col(MessageRow.tenant) == tenant)
        walk = base.cte("walk", recursive=True)
        walk = walk.union_all(sa_select(*ids).join(walk, col(MessageRow.id) == walk.c.parent_id))
        query = (
            sa_select(*_MESSAGE_COLUMNS)
            .join(walk, col(MessageRow.id) == walk.c.id)
            .where(col(MessageRow.tenant) == tenant)
            .order_by(col(MessageRow.depth))
        )
        with self.engine.connect() as connection:
            return [_message(row) for row in connection.execute(query)]

    async def append(self, request: AppendRequest) -> str:
        return await self._run(partial(self._append, request))

    def _append(self, request: AppendRequest) -> str:
        with Session(self.engine) as session, session.begin():
            return self._append_in(session, request)

    def _append_in(self, session: Session, request: AppendRequest) -> str:
        now = utcnow()
        conversation_id = request.conversation_id
        if conversation_id is None:
            conversation_id = uuid.uuid4().hex
            root = request.messages[0].id if request.messages else None
            session.add(
                ConversationRow(
                    id=conversation_id,
                    tenant=request.tenant,
                    user_id=request.user_id,
                    external_id=request.external_id,
                    root_id=root,
                    created_at=now,
                    updated_at=now,
                )
            )
            session.flush()
        if not request.messages:
            return conversation_id
        rows = [
            {
                "id": m.id,
                "tenant": request.tenant,
                "conversation_id": conversation_id,
                "parent_id": m.parent_id,
                "depth": m.depth,
                "role": m.role,
                "content": m.data,
                "token_count": m.token_count,
                "path_tokens": m.path_tokens,
                "meta": {},
                "created_at": now,
            }
            for m in request.messages
        ]
        # Two requests racing with the same new message store it once: the id is the chain hash.
        statement = self._insert(MessageRow).values(rows).on_conflict_do_nothing(index_elements=["id"])
        inserted = len(session.execute(statement.returning(col(MessageRow.id))).all())
        values: dict[str, object] = {"last_message_id": request.messages[-1].id, "updated_at": now}
        if inserted:
            values["message_count"] = ConversationRow.message_count + inserted
        session.execute(
            update(ConversationRow)
            .where(col(ConversationRow.id) == conversation_id)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        return conversation_id

    async def complete(self, record: RequestRecord, answer: AppendRequest | None) -> None:
        await self._run(partial(self._complete, record, answer))

    def _complete(self, record: RequestRecord, answer: AppendRequest | None) -> None:
        with Session(self.engine) as session, session.begin():
            if answer is not None and answer.conversation_id is not None:
                self._append_in(session, answer)
            session.add(RequestRow.model_validate(_record_fields(record)))

    # -- read API -----------------------------------------------------------------------------------

    async def list_conversations(
        self, tenant: str, *, limit: int = 50, user_id: str | None = None, offset: int = 0
    ) -> list[Conversation]:
        def run() -> list[Conversation]:
            query = select(ConversationRow).where(ConversationRow.tenant == tenant)
            if user_id is not None:
                query = query.where(ConversationRow.user_id == user_id)
            query = query.order_by(col(ConversationRow.updated_at).desc()).offset(offset).limit(limit)
            with Session(self.engine) as session:
                return [_conversation(row) for row in session.scalars(query)]

        return await self._run(run)

    async def get_conversation(self, tenant: str, conversation_id: str) -> Conversation | None:
        def run() -> Conversation | None:
            with Session(self.engine) as session:
                row = session.get(ConversationRow, conversation_id)
                return _conversation(row) if row is not None and row.tenant == tenant else None

        return await self._run(run)

    async def conversation_messages(self, tenant: str, conversation_id: str) -> list[StoredMessage]:
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
        def run() -> RequestRecord | None:
            with Session(self.engine) as session:
                row = session.get(RequestRow, request_id)
                if row is None or row.tenant != tenant:
                    return None
                fields = row.model_dump()
                fields["created_at"] = _aware(row.created_at)
                return RequestRecord(**fields)

        return await self._run(run)

    async def count_messages(self, tenant: str) -> int:
        def run() -> int:
            with self.engine.connect() as connection:
                query = select(func.count()).select_from(MessageRow).where(MessageRow.tenant == tenant)
                return int(connection.execute(query).scalar_one())

        return await self._run(run)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.engine.dispose)


def _record_fields(record: RequestRecord) -> dict[str, object]:
    fields: dict[str, object] = {name: getattr(record, name) for name in RequestRecord.__dataclass_fields__}
    return fields


__all__ = ["JSONObject", "NewMessage", "SqlStore", "StoreError", "build_engine", "normalise_url"]
