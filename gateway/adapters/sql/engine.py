"""The SQLAlchemy engine the store and the job queue share: psycopg 3 for Postgres, WAL for SQLite."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url


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
