"""SQLModel tables: conversations, messages (a tree keyed by chain hash), requests, background jobs and
long-term memories."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, Column, DateTime, Index, Integer, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

JSONType = JSON().with_variant(JSONB(), "postgresql")
# None stored as SQL NULL (JSONType stores it as JSON null), so `IS NULL` finds it.
NullableJSON = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


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
    title: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    gist: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
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
    # The injected block as sent (NUL-packed like messages); cleared when something it held is deleted.
    sent_context: dict[str, object] | None = Field(
        default=None, sa_column=Column(NullableJSON, nullable=True)
    )


# A keyed job blocks a duplicate while it is in one of these statuses; the same predicate is the
# partial unique index's and the ON CONFLICT target's (Postgres needs them to match).
JOB_PENDING_WHERE = text("status IN ('queued', 'running')")


class JobRow(SQLModel, table=True):
    """One background job. `attempts` counts leases taken (including a running one); `run_after` is when
    a queued job may next be leased; `lease_owner`/`lease_until` belong to the worker running it."""

    __tablename__ = "jobs"
    __table_args__ = (
        # Workers look for queued jobs that are due, and running jobs whose lease has expired.
        Index("ix_jobs_status_run_after", "status", "run_after"),
        Index("ix_jobs_status_lease_until", "status", "lease_until"),
        # Dedupe: at most one pending job per kind and key; race-safe because the database enforces it.
        Index(
            "ux_jobs_pending_kind_key",
            "kind",
            "key",
            unique=True,
            sqlite_where=JOB_PENDING_WHERE,
            postgresql_where=JOB_PENDING_WHERE,
        ),
    )

    id: str = Field(primary_key=True, max_length=32)
    kind: str = Field(max_length=50)
    tenant: str = Field(max_length=200)
    payload: dict[str, object] = Field(sa_column=Column(JSONType, nullable=False))
    key: str | None = Field(default=None, max_length=200)
    status: str = Field(max_length=20)
    attempts: int = 0
    # Higher runs first among due jobs (then by `run_after`): a history's first index passes before
    # per-exchange upkeep, the views with neighbours after both.
    priority: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    run_after: datetime = Field(sa_column=_timestamp())
    lease_owner: str | None = Field(default=None, max_length=200)
    lease_until: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = Field(sa_column=_timestamp())
    updated_at: datetime = Field(sa_column=_timestamp())


class SummaryRow(SQLModel, table=True):
    """A rolling ("global") or chunk summary, keyed by the node it covers up to (valid for every branch
    through that node)."""

    __tablename__ = "summaries"
    __table_args__ = (
        Index("ix_summaries_conversation_level_depth", "tenant", "conversation_id", "level", "depth"),
        Index("ix_summaries_node_level", "node_id", "level", unique=True),
    )

    id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(max_length=200)
    conversation_id: str = Field(max_length=32)
    node_id: str = Field(max_length=32)
    from_node_id: str | None = Field(default=None, max_length=32)
    level: str = Field(max_length=10)
    depth: int
    path_tokens: int
    content: str
    token_count: int
    source_tokens: int
    model: str | None = Field(default=None, max_length=200)
    llm_input_tokens: int = 0
    llm_output_tokens: int = 0
    created_at: datetime = Field(sa_column=_timestamp())


class CompactionCursorRow(SQLModel, table=True):
    """How far a conversation's newest compaction reached, with a version for optimistic updates."""

    __tablename__ = "compaction_cursors"

    tenant: str = Field(primary_key=True, max_length=200)
    conversation_id: str = Field(primary_key=True, max_length=32)
    node_id: str | None = Field(default=None, max_length=32)
    version: int = 0
    updated_at: datetime = Field(sa_column=_timestamp())


class MemoryRecordRow(SQLModel, table=True):
    """One memory of a user (the source of truth; its vector lives in the memory index). `history` lists
    every change, oldest first; `content_hash` is the normalised content's, for exact-duplicate checks."""

    __tablename__ = "memories"
    __table_args__ = (
        Index("ix_memories_user_status_updated", "tenant", "user_id", "status", "updated_at"),
        Index("ix_memories_user_scope_hash", "tenant", "user_id", "scope", "content_hash"),
    )

    id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(max_length=200)
    user_id: str = Field(max_length=200)
    scope: str = Field(max_length=200)
    type: str = Field(max_length=20)
    content: str = Field(sa_column=Column(Text, nullable=False))
    content_hash: str = Field(max_length=32)
    tags: list[str] = Field(default_factory=list, sa_column=Column(JSONType, nullable=False))
    confidence: float
    event_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))
    status: str = Field(max_length=20)
    superseded_by: str | None = Field(default=None, max_length=32)
    history: list[dict[str, object]] = Field(default_factory=list, sa_column=Column(JSONType, nullable=False))
    created_at: datetime = Field(sa_column=_timestamp())
    updated_at: datetime = Field(sa_column=_timestamp())


class MemorySourceRow(SQLModel, table=True):
    """A message a memory was learnt from or confirmed by; found by conversation when that is deleted."""

    __tablename__ = "memory_sources"
    __table_args__ = (Index("ix_memory_sources_conversation", "tenant", "conversation_id"),)

    memory_id: str = Field(primary_key=True, max_length=32)
    message_id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(max_length=200)
    conversation_id: str | None = Field(default=None, max_length=32)


class MemoryCursorRow(SQLModel, table=True):
    """The message memory extraction has read up to in a conversation; `user_id` when it was known."""

    __tablename__ = "memory_cursors"

    tenant: str = Field(primary_key=True, max_length=200)
    conversation_id: str = Field(primary_key=True, max_length=32)
    user_id: str | None = Field(default=None, max_length=200)
    node_id: str = Field(max_length=32)
    updated_at: datetime = Field(sa_column=_timestamp())


class MemoryProfileRow(SQLModel, table=True):
    """A user's profile document: the job's text and the user's own edit, kept apart."""

    __tablename__ = "memory_profiles"

    tenant: str = Field(primary_key=True, max_length=200)
    user_id: str = Field(primary_key=True, max_length=200)
    generated: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    edited: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    memories: int = 0
    generated_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    edited_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))
    # JSON list of Profile.key() of the memories the generated text was written from (migration 0007).
    covered: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class ResponseRow(SQLModel, table=True):
    """A stored Responses API response: what `GET /v1/responses/{id}` returns, and the stored answer a
    `previous_response_id` chain continues from."""

    __tablename__ = "responses"
    __table_args__ = (Index("ix_responses_conversation", "tenant", "conversation_id"),)

    id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(primary_key=True, max_length=200)
    conversation_id: str | None = Field(default=None, max_length=32)
    answer_message_id: str | None = Field(default=None, max_length=32)
    body: dict[str, object] = Field(sa_column=Column(JSONType, nullable=False))
    created_at: datetime = Field(sa_column=_timestamp())
