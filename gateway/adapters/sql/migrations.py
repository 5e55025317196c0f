"""Ordered, named schema migrations, applied once each at start-up and recorded in `schema_migrations`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from gateway.adapters.sql.tables import (
    CompactionCursorRow,
    ConversationRow,
    JobRow,
    MemoryCursorRow,
    MemoryProfileRow,
    MemoryRecordRow,
    MemorySourceRow,
    MessageRow,
    RequestRow,
    ResponseRow,
    SummaryRow,
)

log = logging.getLogger(__name__)

Migration = tuple[str, Callable[[Connection], None]]


def _initial(connection: Connection) -> None:
    names = (ConversationRow.__tablename__, MessageRow.__tablename__, RequestRow.__tablename__)
    SQLModel.metadata.create_all(connection, tables=[SQLModel.metadata.tables[str(n)] for n in names])


def _jobs(connection: Connection) -> None:
    SQLModel.metadata.create_all(connection, tables=[SQLModel.metadata.tables[str(JobRow.__tablename__)]])


def _summaries(connection: Connection) -> None:
    names = (SummaryRow.__tablename__, CompactionCursorRow.__tablename__)
    SQLModel.metadata.create_all(connection, tables=[SQLModel.metadata.tables[str(n)] for n in names])


def _memories(connection: Connection) -> None:
    names = (MemoryRecordRow.__tablename__, MemorySourceRow.__tablename__, MemoryCursorRow.__tablename__)
    SQLModel.metadata.create_all(connection, tables=[SQLModel.metadata.tables[str(n)] for n in names])


def _memory_profiles(connection: Connection) -> None:
    SQLModel.metadata.create_all(
        connection, tables=[SQLModel.metadata.tables[str(MemoryProfileRow.__tablename__)]]
    )


def _responses(connection: Connection) -> None:
    SQLModel.metadata.create_all(
        connection, tables=[SQLModel.metadata.tables[str(ResponseRow.__tablename__)]]
    )


def _profile_covered(connection: Connection) -> None:
    # A database created at 0005 or later already has it (the table is created from the current model).
    columns = {c["name"] for c in inspect(connection).get_columns(str(MemoryProfileRow.__tablename__))}
    if "covered" not in columns:
        connection.execute(text("ALTER TABLE memory_profiles ADD COLUMN covered TEXT"))


def _request_sent_context(connection: Connection) -> None:
    columns = {c["name"] for c in inspect(connection).get_columns(str(RequestRow.__tablename__))}
    if "sent_context" not in columns:
        kind = "JSONB" if connection.dialect.name == "postgresql" else "JSON"
        connection.execute(text(f"ALTER TABLE requests ADD COLUMN sent_context {kind}"))


def _conversation_titles(connection: Connection) -> None:
    columns = {c["name"] for c in inspect(connection).get_columns(str(ConversationRow.__tablename__))}
    for name in ("title", "gist"):
        if name not in columns:
            connection.execute(text(f"ALTER TABLE conversations ADD COLUMN {name} TEXT"))


def _job_priority(connection: Connection) -> None:
    columns = {c["name"] for c in inspect(connection).get_columns(str(JobRow.__tablename__))}
    if "priority" not in columns:
        connection.execute(text("ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0"))


MIGRATIONS: tuple[Migration, ...] = (
    ("0001_conversations_messages_requests", _initial),
    ("0002_jobs", _jobs),
    ("0003_summaries", _summaries),
    ("0004_memories", _memories),
    ("0005_memory_profiles", _memory_profiles),
    ("0006_responses", _responses),
    ("0007_profile_covered", _profile_covered),
    ("0008_request_sent_context", _request_sent_context),
    ("0009_conversation_titles", _conversation_titles),
    ("0010_job_priority", _job_priority),
)

# Serialises migrations between gateway replicas starting together on one Postgres.
_PG_LOCK_ID = 727_274_001


def migrate(engine: Engine) -> list[str]:
    """Apply pending migrations in order; returns the names applied."""
    applied_now: list[str] = []
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
        elif connection.dialect.name == "sqlite":
            # pysqlite opens no transaction before DDL, so processes of `serve --workers N` starting
            # together would each apply every migration; the write lock taken now serialises them
            # (the others wait on the busy timeout, then find the migrations done).
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        connection.execute(
            text(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "name VARCHAR(200) PRIMARY KEY, applied_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP)"
            )
        )
        done = {row[0] for row in connection.execute(text("SELECT name FROM schema_migrations"))}
        for name, apply in MIGRATIONS:
            if name in done:
                continue
            apply(connection)
            connection.execute(text("INSERT INTO schema_migrations (name) VALUES (:name)"), {"name": name})
            applied_now.append(name)
            log.info("applied migration %s", name)
    return applied_now
