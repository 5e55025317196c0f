"""The message store's tables, its request-path statements (built once at import: building a statement
costs more than running it) and its row-to-record conversions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Select, bindparam, delete, update
from sqlalchemy import select as sa_select
from sqlmodel import SQLModel, col

from gateway.adapters.sql import nul
from gateway.adapters.sql.tables import (
    CompactionCursorRow,
    ConversationRow,
    MessageRow,
    RequestRow,
    ResponseRow,
    SummaryRow,
)
from gateway.records import Conversation, RequestRecord, StoredMessage, StoredNode

IN_CHUNK = 900  # stays under SQLite's default bound-parameter limit
NODE_COLUMNS = (
    col(MessageRow.id),
    col(MessageRow.conversation_id),
    col(MessageRow.parent_id),
    col(MessageRow.depth),
    col(MessageRow.role),
    col(MessageRow.token_count),
    col(MessageRow.path_tokens),
)
MESSAGE_COLUMNS = (*NODE_COLUMNS, col(MessageRow.content), col(MessageRow.created_at), col(MessageRow.meta))
CONVERSATIONS = SQLModel.metadata.tables[str(ConversationRow.__tablename__)]
MESSAGES = SQLModel.metadata.tables[str(MessageRow.__tablename__)]
REQUESTS = SQLModel.metadata.tables[str(RequestRow.__tablename__)]
SUMMARIES = SQLModel.metadata.tables[str(SummaryRow.__tablename__)]
# Everything that holds a conversation's words, deleted with it (the conversation row last).
OWNED_BY_CONVERSATION = (
    MESSAGES,
    SUMMARIES,
    REQUESTS,  # their reports name message ids
    SQLModel.metadata.tables[str(ResponseRow.__tablename__)],  # stored Responses hold the answers' text
    SQLModel.metadata.tables[str(CompactionCursorRow.__tablename__)],
    CONVERSATIONS,
)

NODES_BY_ID = sa_select(*NODE_COLUMNS).where(
    col(MessageRow.id).in_(bindparam("ids", expanding=True)), col(MessageRow.tenant) == bindparam("tenant")
)
CONVERSATION_BY_EXTERNAL = sa_select(CONVERSATIONS).where(
    CONVERSATIONS.c.tenant == bindparam("tenant"), CONVERSATIONS.c.external_id == bindparam("external_id")
)


def _path_statement() -> Select[*tuple[Any, ...]]:
    """Node-to-root walk through `parent_id` (a recursive CTE: one round trip), oldest first. It stops at
    messages whose whole path is at or under `floor` tokens, or at depth `min_depth`, so only the newest
    stretch is read; only messages at or above `max_depth` are returned (the walk itself stays in SQL)."""
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
        sa_select(*MESSAGE_COLUMNS)
        .join(walk, col(MessageRow.id) == walk.c.id)
        .where(col(MessageRow.tenant) == bindparam("tenant"), col(MessageRow.depth) <= bindparam("max_depth"))
        .order_by(col(MessageRow.depth))
    )


PATH = _path_statement()
MAX_DEPTH = 2**31 - 1  # `max_depth` when a whole path is read (the column is a 32-bit integer on Postgres)
# Locks an existing conversation's row for the rest of the transaction (a concurrent DELETE waits, or
# has already removed it: no row).
HOLD_CONVERSATION = (
    update(CONVERSATIONS)
    .where(CONVERSATIONS.c.id == bindparam("held_id"), CONVERSATIONS.c.tenant == bindparam("held_tenant"))
    .values(updated_at=CONVERSATIONS.c.updated_at)
)
TOUCH_CONVERSATION = (
    update(CONVERSATIONS)
    .where(CONVERSATIONS.c.id == bindparam("conversation_id"))
    .values(
        last_message_id=bindparam("last_message_id"),
        updated_at=bindparam("now"),
        message_count=CONVERSATIONS.c.message_count + bindparam("added"),
    )
)


def aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def to_conversation(row: ConversationRow) -> Conversation:
    return Conversation(
        id=row.id,
        tenant=row.tenant,
        user_id=row.user_id,
        external_id=row.external_id,
        root_id=row.root_id,
        last_message_id=row.last_message_id,
        message_count=row.message_count,
        created_at=aware(row.created_at),
        updated_at=aware(row.updated_at),
        title=row.title,
        gist=row.gist,
    )


def to_node(row: Sequence[Any]) -> StoredNode:
    return StoredNode(row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def to_message(row: Sequence[Any]) -> StoredMessage:
    return StoredMessage(to_node(row), nul.unpack(row[7]), aware(row[8]), row[9] or {})


def forget_sent_context_in(connection: Connection, tenant: str, user_id: str) -> int:
    requests = REQUESTS.c
    done = connection.execute(
        update(REQUESTS)
        .where(requests.tenant == tenant, requests.user_id == user_id, requests.sent_context.is_not(None))
        .values(sent_context=None)
    )
    # The user's prompt epochs pin what their stable blocks showed (a profile's text): a new epoch begins.
    summaries = SUMMARIES.c
    conversations = sa_select(CONVERSATIONS.c.id).where(
        CONVERSATIONS.c.tenant == tenant, CONVERSATIONS.c.user_id == user_id
    )
    connection.execute(
        delete(SUMMARIES).where(
            summaries.tenant == tenant,
            summaries.level == "epoch",
            summaries.conversation_id.in_(conversations),
        )
    )
    return int(done.rowcount)


MODEL_CHARS = 200  # requests.model


def record_fields(record: RequestRecord) -> dict[str, object]:
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


def to_request(row: RequestRow) -> RequestRecord:
    fields = row.model_dump()
    fields["created_at"] = aware(row.created_at)
    fields["sent_context"] = nul.unpack(row.sent_context) if row.sent_context is not None else None
    fields["report"] = nul.unpack(row.report) if row.report is not None else None
    fields["usage"] = nul.unpack(row.usage) if row.usage is not None else None
    return RequestRecord(**fields)
