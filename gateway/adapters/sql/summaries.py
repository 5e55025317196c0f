"""SummaryStore over the SQL store's engine: summaries keyed by node, the per-conversation compaction
cursor with an optimistic version check, and the prompt epochs (rows of level "epoch": keyed by a node
as summaries are, their content the epoch's pins)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import anyio
import orjson
from sqlalchemy import Engine, bindparam, insert, update
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import SQLModel

from gateway.adapters.sql.tables import CompactionCursorRow, SummaryRow, utcnow
from gateway.errors import StoreError
from gateway.ports import JSONObject
from gateway.records import NewSummary, Summary

T = TypeVar("T")
_SUMMARIES = SQLModel.metadata.tables[str(SummaryRow.__tablename__)]
_CURSORS = SQLModel.metadata.tables[str(CompactionCursorRow.__tablename__)]

_BY_CONVERSATION = (
    sa_select(_SUMMARIES)
    .where(
        _SUMMARIES.c.tenant == bindparam("tenant"),
        _SUMMARIES.c.conversation_id == bindparam("conversation_id"),
        _SUMMARIES.c.level == bindparam("level"),
    )
    .order_by(_SUMMARIES.c.depth.desc())
)
_CURSOR = sa_select(_CURSORS.c.node_id, _CURSORS.c.version).where(
    _CURSORS.c.tenant == bindparam("tenant"), _CURSORS.c.conversation_id == bindparam("conversation_id")
)
_MOVE_CURSOR = (
    update(_CURSORS)
    .where(
        _CURSORS.c.tenant == bindparam("b_tenant"),
        _CURSORS.c.conversation_id == bindparam("b_conversation_id"),
        _CURSORS.c.version == bindparam("b_expected"),
    )
    .values(
        node_id=bindparam("b_node_id"), version=bindparam("b_expected") + 1, updated_at=bindparam("b_now")
    )
)

EPOCH = "epoch"  # the summaries table's level for prompt epochs


class SqlSummaryStore:
    def __init__(self, engine: Engine, *, threads: int = 4) -> None:
        self.engine = engine
        self._limiter = anyio.CapacityLimiter(threads)
        dialect_insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
        # The first compaction of a conversation creates its cursor at version 0; racing creators agree.
        self._create_cursor = dialect_insert(_CURSORS).on_conflict_do_nothing(
            index_elements=["tenant", "conversation_id"]
        )
        self._pin = dialect_insert(_SUMMARIES).on_conflict_do_nothing(index_elements=["node_id", "level"])

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except SQLAlchemyError as exc:
            raise StoreError(f"summary store failed: {type(exc).__name__}: {exc}") from exc

    async def summaries(self, tenant: str, conversation_id: str, level: str = "global") -> list[Summary]:
        def run() -> list[Summary]:
            params = {"tenant": tenant, "conversation_id": conversation_id, "level": level}
            with self.engine.connect() as connection:
                return [_summary(dict(row._mapping)) for row in connection.execute(_BY_CONVERSATION, params)]

        return await self._run(run)

    async def cursor(self, tenant: str, conversation_id: str) -> tuple[str | None, int]:
        return await self._run(partial(self._cursor, tenant, conversation_id))

    def _cursor(self, tenant: str, conversation_id: str) -> tuple[str | None, int]:
        params = {"tenant": tenant, "conversation_id": conversation_id}
        with self.engine.begin() as connection:
            row = connection.execute(_CURSOR, params).first()
            if row is None:
                connection.execute(
                    self._create_cursor, {**params, "node_id": None, "version": 0, "updated_at": utcnow()}
                )
                row = connection.execute(_CURSOR, params).first()
            assert row is not None
            return row[0], int(row[1])

    async def save(self, tenant: str, conversation_id: str, version: int, rows: Sequence[NewSummary]) -> bool:
        return await self._run(partial(self._save, tenant, conversation_id, version, list(rows)))

    def _save(self, tenant: str, conversation_id: str, version: int, rows: list[NewSummary]) -> bool:
        if not rows:
            return True
        now = utcnow()
        with self.engine.begin() as connection:
            params = {
                "b_tenant": tenant,
                "b_conversation_id": conversation_id,
                "b_expected": version,
                "b_node_id": rows[-1].node_id,
                "b_now": now,
            }
            if connection.execute(_MOVE_CURSOR, params).rowcount != 1:
                return False  # another worker moved the cursor since this one read it: its work wins
            connection.execute(
                insert(_SUMMARIES),
                [{"id": uuid.uuid4().hex, **asdict(row), "created_at": now} for row in rows],
            )
            return True

    async def epochs(self, tenant: str, conversation_id: str) -> list[tuple[str, JSONObject]]:
        rows = await self.summaries(tenant, conversation_id, EPOCH)
        out: list[tuple[str, JSONObject]] = []
        for row in rows:
            pins = orjson.loads(row.content)
            out.append((row.node_id, pins if isinstance(pins, dict) else {}))
        return out

    async def pin_epoch(
        self, tenant: str, conversation_id: str, node_id: str, depth: int, pins: JSONObject
    ) -> None:
        row = {
            "id": uuid.uuid4().hex,
            "tenant": tenant,
            "conversation_id": conversation_id,
            "node_id": node_id,
            "from_node_id": None,
            "level": EPOCH,
            "depth": depth,
            "path_tokens": 0,
            "content": orjson.dumps(pins).decode(),
            "token_count": 0,
            "source_tokens": 0,
            "model": None,
            "created_at": utcnow(),
        }

        def run() -> None:
            with self.engine.begin() as connection:
                connection.execute(self._pin, row)

        await self._run(run)


def _summary(row: Mapping[str, Any]) -> Summary:
    fields = dict(row)
    created: datetime = fields["created_at"]
    if created.tzinfo is None:  # SQLite keeps no zone; everything is written in UTC
        fields["created_at"] = created.replace(tzinfo=UTC)
    return Summary(**fields)
