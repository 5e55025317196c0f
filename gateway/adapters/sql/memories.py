"""MemoryStore over the SQL store's engine: memories, their source links and extraction cursors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import TypeVar

import anyio
import orjson
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    RowMapping,
    delete,
    exists,
    func,
    insert,
    type_coerce,
    update,
)
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import SQLModel

from gateway.adapters.sql.tables import (
    ConversationRow,
    MemoryCursorRow,
    MemoryProfileRow,
    MemoryRecordRow,
    MemorySourceRow,
    utcnow,
)
from gateway.errors import StoreError
from gateway.memory.records import ACTIVE, Memory, MemoryChanges, MemoryFilter, MemorySource, Profile

T = TypeVar("T")
_IN_CHUNK = 900  # stays under SQLite's default bound-parameter limit
_MEMORIES = SQLModel.metadata.tables[str(MemoryRecordRow.__tablename__)]
_SOURCES = SQLModel.metadata.tables[str(MemorySourceRow.__tablename__)]
_CURSORS = SQLModel.metadata.tables[str(MemoryCursorRow.__tablename__)]
_PROFILES = SQLModel.metadata.tables[str(MemoryProfileRow.__tablename__)]
_CONVERSATIONS = SQLModel.metadata.tables[str(ConversationRow.__tablename__)]
# Newest first; the id breaks ties so pages never overlap or skip.
_NEWEST_FIRST = (_MEMORIES.c.updated_at.desc(), _MEMORIES.c.id.desc())


class SqlMemoryStore:
    """Saves are strict: a memory to update or link that is not stored (deleted meanwhile) fails the whole
    save, so the caller retries on fresh reads instead of indexing a memory that is gone."""

    def __init__(self, engine: Engine, *, threads: int = 4) -> None:
        self.engine = engine
        self._limiter = anyio.CapacityLimiter(threads)
        self._postgres = engine.dialect.name == "postgresql"
        dialect_insert = pg_insert if self._postgres else sqlite_insert
        # A message confirming a memory twice links it once.
        self._link = dialect_insert(_SOURCES).on_conflict_do_nothing(
            index_elements=["memory_id", "message_id"]
        )
        cursor = dialect_insert(_CURSORS)
        self._move_cursor = cursor.on_conflict_do_update(
            index_elements=["tenant", "conversation_id"],
            set_={
                "node_id": cursor.excluded.node_id,
                # A write with no memories does not know the user: keep the one an earlier write knew.
                "user_id": func.coalesce(cursor.excluded.user_id, _CURSORS.c.user_id),
                "updated_at": cursor.excluded.updated_at,
            },
        )

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except SQLAlchemyError as exc:
            raise StoreError(f"memory store failed: {type(exc).__name__}: {exc}") from exc

    async def get(self, tenant: str, memory_id: str) -> Memory | None:
        found = await self.many(tenant, [memory_id])
        return found[0] if found else None

    async def many(self, tenant: str, memory_ids: Sequence[str]) -> list[Memory]:
        def run() -> list[Memory]:
            with self.engine.connect() as connection:
                rows: list[RowMapping] = []
                for chunk in _chunks(list(dict.fromkeys(memory_ids))):
                    query = sa_select(_MEMORIES).where(
                        _MEMORIES.c.tenant == tenant, _MEMORIES.c.id.in_(chunk)
                    )
                    rows.extend(connection.execute(query).mappings())
                return _with_sources(connection, tenant, rows)

        return await self._run(run)

    async def find(self, tenant: str, where: MemoryFilter) -> list[Memory]:
        return await self._run(partial(self._find, tenant, where))

    def _find(self, tenant: str, where: MemoryFilter) -> list[Memory]:
        query = sa_select(_MEMORIES).where(*self._conditions(tenant, where)).order_by(*_NEWEST_FIRST)
        if where.text is None:
            query = query.limit(where.limit).offset(where.offset)
        with self.engine.connect() as connection:
            rows: list[RowMapping] = list(connection.execute(query).mappings())
            if where.text is not None:
                # In Python: SQLite's lower() folds ASCII only, and casefold() is what a reader expects.
                needle = where.text.casefold()
                matching = [row for row in rows if needle in row["content"].casefold()]
                rows = matching[where.offset : where.offset + where.limit]
            return _with_sources(connection, tenant, rows)

    def _conditions(self, tenant: str, where: MemoryFilter) -> list[ColumnElement[bool]]:
        m = _MEMORIES.c
        conditions = [m.tenant == tenant, m.user_id == where.user_id]
        if where.scopes is not None:
            conditions.append(m.scope.in_(where.scopes))
        if where.types is not None:
            conditions.append(m.type.in_(where.types))
        if where.statuses is not None:
            conditions.append(m.status.in_(where.statuses))
        if where.tag is not None:
            conditions.append(self._has_tag(where.tag))
        when = func.coalesce(m.event_at, m.created_at)
        if where.since is not None:
            conditions.append(when >= _utc(where.since))
        if where.until is not None:
            conditions.append(when <= _utc(where.until))
        return conditions

    def _has_tag(self, tag: str) -> ColumnElement[bool]:
        # An exact element match on each dialect (a LIKE on the JSON text would trip on escaping).
        if self._postgres:
            return type_coerce(_MEMORIES.c.tags, JSONB).contains([tag])
        each = func.json_each(_MEMORIES.c.tags).table_valued("value")
        return exists(sa_select(1).select_from(each).where(each.c.value == tag))

    async def by_hash(self, tenant: str, user_id: str, scope: str, hashes: Sequence[str]) -> list[Memory]:
        def run() -> list[Memory]:
            m = _MEMORIES.c
            with self.engine.connect() as connection:
                rows: list[RowMapping] = []
                for chunk in _chunks(list(dict.fromkeys(hashes))):
                    query = sa_select(_MEMORIES).where(
                        m.tenant == tenant,
                        m.user_id == user_id,
                        m.scope == scope,
                        m.status == ACTIVE,
                        m.content_hash.in_(chunk),
                    )
                    rows.extend(connection.execute(query).mappings())
                return _with_sources(connection, tenant, rows)

        return await self._run(run)

    async def save(self, changes: MemoryChanges) -> None:
        for memory in (*changes.added, *changes.updated):
            if memory.tenant != changes.tenant:
                raise ValueError(f"memory {memory.id} is of tenant {memory.tenant!r}, not {changes.tenant!r}")
        await self._run(partial(self._save, changes))

    def _save(self, changes: MemoryChanges) -> None:
        tenant = changes.tenant
        with self.engine.begin() as connection:
            # Learnt from conversations deleted since the job read them: nothing of those is kept. A new
            # memory all of whose sources are gone is not added; links into them are not made; their
            # cursors do not move (the delete holds the rows as this does, so one of the two waits).
            sources = [s for m in (*changes.added, *changes.updated) for s in m.sources]
            sources += [s for _, s in changes.sources]
            named = {s.conversation_id for s in sources if s.conversation_id is not None}
            if changes.cursor is not None:
                named.add(changes.cursor[0])
            gone = named - _hold_conversations(connection, named)
            added = [
                m
                for m in changes.added
                if not m.sources or any(s.conversation_id not in gone for s in m.sources)
            ]
            links = [
                (memory.id, source)
                for memory in (*added, *changes.updated)
                for source in memory.sources
                if source.conversation_id not in gone
            ]
            if added:  # an id already stored fails the whole write
                connection.execute(insert(_MEMORIES), [_columns(memory) for memory in added])
            for memory in changes.updated:
                whole = update(_MEMORIES).where(_MEMORIES.c.id == memory.id, _MEMORIES.c.tenant == tenant)
                if connection.execute(whole.values(_columns(memory))).rowcount != 1:
                    raise StoreError(f"memory {memory.id} to update is not stored (deleted meanwhile?)")
            written = {memory.id for memory in (*added, *changes.updated)}
            extra = [(mid, s) for mid, s in changes.sources if s.conversation_id not in gone]
            _lock_existing(connection, tenant, {mid for mid, _ in extra} - written)
            links.extend(extra)
            rows = {
                (mid, source.message_id): {
                    "memory_id": mid,
                    "message_id": source.message_id,
                    "tenant": tenant,
                    "conversation_id": source.conversation_id,
                }
                for mid, source in links
            }
            if rows:
                connection.execute(self._link, list(rows.values()))
            if changes.cursor is not None and changes.cursor[0] not in gone:
                conversation_id, node_id = changes.cursor
                user_id = next((m.user_id for m in (*changes.added, *changes.updated)), None)
                values = {"tenant": tenant, "conversation_id": conversation_id, "node_id": node_id}
                connection.execute(self._move_cursor, {**values, "user_id": user_id, "updated_at": utcnow()})

    async def delete(self, tenant: str, memory_ids: Sequence[str]) -> int:
        def run() -> int:
            removed = 0
            with self.engine.begin() as connection:
                for chunk in _chunks(list(dict.fromkeys(memory_ids))):
                    removed += len(_delete_memories(connection, tenant, _MEMORIES.c.id.in_(chunk))[0])
            return removed

        return await self._run(run)

    async def delete_user(self, tenant: str, user_id: str) -> list[str]:
        def run() -> list[str]:
            with self.engine.begin() as connection:
                # The extraction cursors stay: they hold no words, and without them the user's next turn
                # in an old conversation would read it from the root and learn the deleted facts again.
                ids, _ = _delete_memories(connection, tenant, _MEMORIES.c.user_id == user_id)
                connection.execute(
                    delete(_PROFILES).where(_PROFILES.c.tenant == tenant, _PROFILES.c.user_id == user_id)
                )
                return ids

        return await self._run(run)

    async def profile(self, tenant: str, user_id: str) -> Profile | None:
        def run() -> Profile | None:
            query = sa_select(_PROFILES).where(_PROFILES.c.tenant == tenant, _PROFILES.c.user_id == user_id)
            with self.engine.connect() as connection:
                row = connection.execute(query).mappings().first()
            return None if row is None else _profile(row)

        return await self._run(run)

    async def save_profile(
        self,
        tenant: str,
        user_id: str,
        *,
        generated: str | None = None,
        memories: Sequence[Memory] = (),
    ) -> None:
        covered = orjson.dumps(sorted(Profile.key(m) for m in memories)).decode()
        values = {
            "generated": generated,
            "memories": len(memories),
            "generated_at": utcnow(),
            "covered": covered,
        }
        await self._run(partial(self._upsert_profile, tenant, user_id, values))

    async def edit_profile(self, tenant: str, user_id: str, edited: str | None) -> Profile:
        values = {"edited": edited, "edited_at": utcnow() if edited is not None else None}
        await self._run(partial(self._upsert_profile, tenant, user_id, values))
        found = await self.profile(tenant, user_id)
        assert found is not None
        return found

    def _upsert_profile(self, tenant: str, user_id: str, values: Mapping[str, object]) -> None:
        """Only the given columns change: the job's write keeps the user's edit, and the user's keeps
        the job's text."""
        dialect_insert = pg_insert if self._postgres else sqlite_insert
        statement = dialect_insert(_PROFILES).values(tenant=tenant, user_id=user_id, **values)
        statement = statement.on_conflict_do_update(
            index_elements=["tenant", "user_id"], set_={k: statement.excluded[k] for k in values}
        )
        with self.engine.begin() as connection:
            connection.execute(statement)

    async def cursor(self, tenant: str, conversation_id: str) -> str | None:
        def run() -> str | None:
            query = sa_select(_CURSORS.c.node_id).where(
                _CURSORS.c.tenant == tenant, _CURSORS.c.conversation_id == conversation_id
            )
            with self.engine.connect() as connection:
                node_id: str | None = connection.execute(query).scalar()
                return node_id

        return await self._run(run)

    async def forget_conversations(self, tenant: str, conversation_ids: Sequence[str]) -> None:
        def run() -> None:
            with self.engine.begin() as connection:
                for chunk in _chunks(list(dict.fromkeys(conversation_ids))):
                    connection.execute(
                        delete(_SOURCES).where(
                            _SOURCES.c.tenant == tenant, _SOURCES.c.conversation_id.in_(chunk)
                        )
                    )
                _delete_cursors(connection, tenant, conversation_ids)

        return await self._run(run)


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), _IN_CHUNK):
        yield items[start : start + _IN_CHUNK]


def _hold_conversations(connection: Connection, conversation_ids: set[str]) -> set[str]:
    """The conversations of these that exist, their rows held (a no-op UPDATE first, as
    `_lock_existing` does, then which ones are there)."""
    found: set[str] = set()
    for chunk in _chunks(sorted(conversation_ids)):
        connection.execute(
            update(_CONVERSATIONS).where(_CONVERSATIONS.c.id.in_(chunk)).values(id=_CONVERSATIONS.c.id)
        )
        query = sa_select(_CONVERSATIONS.c.id).where(_CONVERSATIONS.c.id.in_(chunk))
        found |= {row[0] for row in connection.execute(query)}
    return found


def _lock_existing(connection: Connection, tenant: str, memory_ids: set[str]) -> None:
    """Links go to memories of the tenant that exist. A no-op UPDATE, not a SELECT, checks: it takes
    SQLite's write lock (a transaction there begins at its first write) and Postgres's row locks, so a
    delete racing this write either waits for it or makes it find the memory gone."""
    found = 0
    for chunk in _chunks(sorted(memory_ids)):
        touch = update(_MEMORIES).where(_MEMORIES.c.tenant == tenant, _MEMORIES.c.id.in_(chunk))
        found += connection.execute(touch.values(tenant=_MEMORIES.c.tenant)).rowcount
    if found != len(memory_ids):
        raise StoreError(f"memories to link are not stored (deleted meanwhile?): {sorted(memory_ids)}")


def _delete_memories(
    connection: Connection, tenant: str, which: ColumnElement[bool]
) -> tuple[list[str], set[str]]:
    """Memories first (taking their row locks), then their links: a link a racing write added while this
    waited is seen and removed. Returns their ids and the conversations they were learnt in."""
    query = delete(_MEMORIES).where(_MEMORIES.c.tenant == tenant, which).returning(_MEMORIES.c.id)
    ids: list[str] = list(connection.execute(query).scalars())
    conversations: set[str] = set()
    for chunk in _chunks(ids):
        links = _SOURCES.c.tenant == tenant, _SOURCES.c.memory_id.in_(chunk)
        gone = connection.execute(delete(_SOURCES).where(*links).returning(_SOURCES.c.conversation_id))
        conversations.update(c for c in gone.scalars() if c is not None)
    return ids, conversations


def _delete_cursors(connection: Connection, tenant: str, conversation_ids: Sequence[str]) -> None:
    for chunk in _chunks(list(dict.fromkeys(conversation_ids))):
        connection.execute(
            delete(_CURSORS).where(_CURSORS.c.tenant == tenant, _CURSORS.c.conversation_id.in_(chunk))
        )


def _utc(value: datetime) -> datetime:
    """Written and compared in UTC: SQLite stores the wall time and drops the zone. Naive means UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _columns(memory: Memory) -> dict[str, object]:
    return {
        "id": memory.id,
        "tenant": memory.tenant,
        "user_id": memory.user_id,
        "scope": memory.scope,
        "type": memory.type,
        "content": memory.content,
        "content_hash": memory.hash,
        "tags": list(memory.tags),
        "confidence": memory.confidence,
        "event_at": None if memory.event_at is None else _utc(memory.event_at),
        "status": memory.status,
        "superseded_by": memory.superseded_by,
        "history": list(memory.history),
        "created_at": _utc(memory.created_at),
        "updated_at": _utc(memory.updated_at),
    }


def _with_sources(connection: Connection, tenant: str, rows: Sequence[RowMapping]) -> list[Memory]:
    """The memories of these rows, in their order, each with its source links."""
    sources: dict[str, list[MemorySource]] = {row["id"]: [] for row in rows}
    for chunk in _chunks(list(sources)):
        query = (
            sa_select(_SOURCES.c.memory_id, _SOURCES.c.message_id, _SOURCES.c.conversation_id)
            .where(_SOURCES.c.tenant == tenant, _SOURCES.c.memory_id.in_(chunk))
            .order_by(_SOURCES.c.memory_id, _SOURCES.c.message_id)
        )
        for memory_id, message_id, conversation_id in connection.execute(query):
            sources[memory_id].append(MemorySource(message_id, conversation_id))
    return [_memory(row, tuple(sources[row["id"]])) for row in rows]


def _memory(row: RowMapping, sources: tuple[MemorySource, ...]) -> Memory:
    return Memory(
        id=row["id"],
        tenant=row["tenant"],
        user_id=row["user_id"],
        scope=row["scope"],
        type=row["type"],
        content=row["content"],
        tags=tuple(row["tags"]),
        confidence=row["confidence"],
        event_at=None if row["event_at"] is None else _utc(row["event_at"]),
        status=row["status"],
        superseded_by=row["superseded_by"],
        created_at=_utc(row["created_at"]),
        updated_at=_utc(row["updated_at"]),
        sources=sources,
        history=tuple(row["history"]),
    )


def _profile(row: RowMapping) -> Profile:
    def aware(value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    return Profile(
        row["tenant"],
        row["user_id"],
        row["generated"],
        row["edited"],
        int(row["memories"] or 0),
        aware(row["generated_at"]),
        aware(row["edited_at"]),
        frozenset(orjson.loads(row["covered"])) if row["covered"] else frozenset(),
    )
