"""ResponseStore over the SQL store's engine (the `responses` table; rows go with their conversation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
from sqlalchemy import Engine, delete, insert
from sqlalchemy import select as sa_select
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import SQLModel

from gateway.adapters.sql import nul
from gateway.adapters.sql.store import HOLD_CONVERSATION
from gateway.adapters.sql.tables import ResponseRow
from gateway.errors import StoreError
from gateway.records import StoredResponse

T = TypeVar("T")
_RESPONSES = SQLModel.metadata.tables[str(ResponseRow.__tablename__)]


class SqlResponseStore:
    def __init__(self, engine: Engine, *, threads: int = 4) -> None:
        self.engine = engine
        self._limiter = anyio.CapacityLimiter(threads)

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except SQLAlchemyError as exc:
            raise StoreError(f"response store failed: {type(exc).__name__}: {exc}") from exc

    async def save_response(self, response: StoredResponse) -> None:
        row = {
            "id": response.id,
            "tenant": response.tenant,
            "conversation_id": response.conversation_id,
            "answer_message_id": response.answer_message_id,
            "body": nul.pack(response.body),  # jsonb holds no U+0000 (see nul)
            "created_at": response.created_at,
        }

        def run() -> None:
            with self.engine.begin() as connection:
                if response.conversation_id is not None:
                    held = {"held_id": response.conversation_id, "held_tenant": response.tenant}
                    if connection.execute(HOLD_CONVERSATION, held).rowcount == 0:
                        return  # deleted meanwhile: the answer is kept nowhere
                connection.execute(insert(_RESPONSES), [row])

        await self._run(run)

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        if "\x00" in response_id:
            return None  # no id holds one (and Postgres refuses it in a query)
        query = sa_select(_RESPONSES).where(_RESPONSES.c.tenant == tenant, _RESPONSES.c.id == response_id)

        def run() -> StoredResponse | None:
            with self.engine.connect() as connection:
                row = connection.execute(query).mappings().first()
            if row is None:
                return None
            return StoredResponse(
                id=row["id"],
                tenant=row["tenant"],
                conversation_id=row["conversation_id"],
                answer_message_id=row["answer_message_id"],
                body=nul.unpack(row["body"]),
                created_at=row["created_at"],
            )

        return await self._run(run)

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        if "\x00" in response_id:
            return False
        statement = delete(_RESPONSES).where(_RESPONSES.c.tenant == tenant, _RESPONSES.c.id == response_id)

        def run() -> bool:
            with self.engine.begin() as connection:
                return bool(connection.execute(statement).rowcount)

        return await self._run(run)
