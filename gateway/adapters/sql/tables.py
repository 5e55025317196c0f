"""SQLModel tables: conversations, messages (a tree keyed by chain hash) and requests."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, Column, DateTime, Index
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

JSONType = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


def _timestamp() -> Column[datetime]:
    return Column(DateTime(timezone=True), nullable=False, default=utcnow)


class ConversationRow(SQLModel, table=True):
    __tablename__ = "conversations"
    __table_args__ = (
        Index("ix_conversations_tenant_external", "tenant", "external_id", unique=True),
        Index("ix_conversations_tenant_updated", "tenant", "updated_at"),
    )

    id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(max_length=200)
    user_id: str | None = Field(default=None, max_length=200)
    external_id: str | None = Field(default=None, max_length=200)
    root_id: str | None = Field(default=None, max_length=32)
    last_message_id: str | None = Field(default=None, max_length=32)
    message_count: int = 0
    created_at: datetime = Field(sa_column=_timestamp())
    updated_at: datetime = Field(sa_column=_timestamp())


class MessageRow(SQLModel, table=True):
    """One node of the message tree. `id` is the chain hash: the same path is never stored twice, and
    the root hash includes the tenant, so ids never collide across tenants."""

    __tablename__ = "messages"
    __table_args__ = (
        Index("ix_messages_conversation_depth", "conversation_id", "depth"),
        Index("ix_messages_parent", "parent_id"),
    )

    id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(max_length=200)
    conversation_id: str = Field(max_length=32)
    parent_id: str | None = Field(default=None, max_length=32)
    depth: int
    role: str = Field(max_length=20)
    content: dict[str, object] = Field(sa_column=Column(JSONType, nullable=False))
    token_count: int
    path_tokens: int
    meta: dict[str, object] = Field(default_factory=dict, sa_column=Column(JSONType, nullable=False))
    created_at: datetime = Field(sa_column=_timestamp())


class RequestRow(SQLModel, table=True):
    __tablename__ = "requests"
    __table_args__ = (
        Index("ix_requests_tenant_created", "tenant", "created_at"),
        Index("ix_requests_conversation", "conversation_id"),
    )

    id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(max_length=200)
    conversation_id: str | None = Field(default=None, max_length=32)
    user_id: str | None = Field(default=None, max_length=200)
    parent_message_id: str | None = Field(default=None, max_length=32)
    model: str | None = Field(default=None, max_length=200)
    stream: bool = False
    status: str = Field(max_length=20)
    http_status: int
    original_tokens: int | None = None
    sent_tokens: int | None = None
    report: dict[str, object] | None = Field(default=None, sa_column=Column(JSONType, nullable=True))
    usage: dict[str, object] | None = Field(default=None, sa_column=Column(JSONType, nullable=True))
    error: str | None = None
    latency_ms: float
    created_at: datetime = Field(sa_column=_timestamp())
