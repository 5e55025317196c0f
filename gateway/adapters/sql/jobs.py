"""The durable job queue (`JobQueue`) over the `jobs` table; the worker pool leases from it.

Leasing is one `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING`: on Postgres the
row locks let replicas lease side by side without ever taking the same job; SQLite has no row locks
(SQLAlchemy omits the clause there) but runs each write statement under its single writer lock, which
gives the same guarantee. Dedupe of keyed jobs is a partial unique index plus ON CONFLICT DO NOTHING, so
two processes enqueueing the same key at once still store one job.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import anyio
from sqlalchemy import Engine, Update, delete, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from gateway.adapters.sql.engine import build_engine
from gateway.adapters.sql.job_statements import JOBS as _JOBS
from gateway.adapters.sql.job_statements import statements as _statements
from gateway.adapters.sql.migrations import migrate
from gateway.adapters.sql.tables import utcnow
from gateway.errors import StoreError
from gateway.ports import JSONObject
from gateway.records import Job, JobState, NewJob

T = TypeVar("T")
STATUSES = ("queued", "running", "done", "failed")
_ERROR_CHARS = 4000  # enough for a message and the end of a traceback; the log has the whole of it


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern (escape character backslash) matching what starts with `prefix`."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def enqueue_in(connection: Connection, jobs: Sequence[NewJob]) -> list[str | None]:
    """Insert jobs inside the caller's transaction (they commit or roll back with it). Returns each job's
    id, or None where a job with the same kind and key is already queued or running."""
    if not jobs:
        return []
    statements = _statements(connection.dialect.name)
    rows = [
        {
            "id": uuid.uuid4().hex,
            "kind": job.kind,
            "tenant": job.tenant,
            "payload": job.payload,
            "key": job.key,
            "priority": job.priority,
            **statements.clock.params(delay=job.delay_seconds),
        }
        for job in jobs
    ]
    # A skipped duplicate returns no row, so ids are matched by value rather than by position.
    inserted = {row[0] for row in connection.execute(statements.insert, rows)}
    return [row["id"] if row["id"] in inserted else None for row in rows]


def cancel_in(connection: Connection, tenant: str, jobs: Sequence[tuple[str, str]]) -> int:
    """Drop queued (not running) jobs by kind and key inside the caller's transaction; returns how many."""
    dropped = 0
    for kind, key in jobs:
        statement = delete(_JOBS).where(
            _JOBS.c.tenant == tenant, _JOBS.c.kind == kind, _JOBS.c.key == key, _JOBS.c.status == "queued"
        )
        dropped += connection.execute(statement).rowcount
    return dropped


class SqlJobQueue:
    """`JobQueue` over SQLite or Postgres. Blocking database work runs on worker threads."""

    def __init__(self, engine: Engine, *, threads: int = 4, owns_engine: bool = False) -> None:
        self.engine = engine
        self._statements = _statements(engine.dialect.name)
        self._limiter = anyio.CapacityLimiter(threads)
        self._owns_engine = owns_engine
        self._listeners: list[Callable[[], None]] = []

    @classmethod
    def open(cls, url: str) -> SqlJobQueue:
        """A queue with an engine of its own (a worker-only process, or a test standing in for one)."""
        engine = build_engine(url)
        migrate(engine)
        return cls(engine, owns_engine=True)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the event loop) after this process enqueues jobs, so local workers start on
        them at once instead of at their next poll."""
        self._listeners.append(callback)

    def notify_listeners(self) -> None:
        for callback in self._listeners:
            callback()

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except SQLAlchemyError as exc:
            raise StoreError(f"job queue failed: {type(exc).__name__}: {exc}") from exc

    async def enqueue(self, job: NewJob) -> str | None:
        job_id = (await self._run(partial(self._enqueue, job)))[0]
        if job_id is not None:
            self.notify_listeners()
        return job_id

    def _enqueue(self, job: NewJob) -> list[str | None]:
        with self.engine.begin() as connection:
            return enqueue_in(connection, [job])

    async def lease(
        self, worker: str, kinds: Sequence[str], lease_seconds: float, limit: int = 1
    ) -> list[Job]:
        if not kinds or limit < 1:
            return []
        params = {
            "worker": worker,
            "kinds": list(kinds),
            "limit": limit,
            **self._statements.clock.params(lease=lease_seconds),
        }
        return await self._run(partial(self._lease, params))

    def _lease(self, params: dict[str, Any]) -> list[Job]:
        with self.engine.begin() as connection:
            rows = connection.execute(self._statements.lease, params).all()
        worker = params["worker"]
        return [Job(row[0], row[1], row[2], row[3], row[4], row[5], _aware(row[6]), worker) for row in rows]

    async def complete(self, job: Job, worker: str) -> bool:
        params = {
            "job_id": job.id,
            "worker": worker,
            "attempt": job.attempts,
            **self._statements.clock.params(),
        }
        return await self._run(partial(self._update, self._statements.complete, params)) == 1

    async def fail(self, job: Job, worker: str, error: str, retry_in: float | None) -> None:
        params = {
            "job_id": job.id,
            "worker": worker,
            "attempt": job.attempts,
            "new_status": "failed" if retry_in is None else "queued",
            "error": error[-_ERROR_CHARS:],
            **self._statements.clock.params(retry=retry_in or 0.0),
        }
        await self._run(partial(self._update, self._statements.fail, params))

    async def release(self, job: Job, worker: str, delay_seconds: float = 0.0) -> bool:
        params = {
            "job_id": job.id,
            "worker": worker,
            "attempt": job.attempts,
            **self._statements.clock.params(delay=delay_seconds),
        }
        return await self._run(partial(self._update, self._statements.release, params)) == 1

    def _update(self, statement: Update, params: dict[str, Any]) -> int:
        with self.engine.begin() as connection:
            return connection.execute(statement, params).rowcount

    async def counts(self, tenant: str | None = None) -> dict[str, int]:
        def run() -> dict[str, int]:
            counts = dict.fromkeys(STATUSES, 0)
            with self.engine.connect() as connection:
                if tenant is None:
                    rows = connection.execute(self._statements.counts)
                else:
                    rows = connection.execute(self._statements.tenant_counts, {"tenant": tenant})
                counts.update({row[0]: int(row[1]) for row in rows})
            return counts

        return await self._run(run)

    async def oldest_queued(self) -> dict[str, float]:
        def run() -> dict[str, float]:
            params = self._statements.clock.params()
            with self.engine.connect() as connection:
                rows = connection.execute(self._statements.oldest_queued, params).all()
            return {
                row[0]: max((_aware(row[2]) - _aware(row[1])).total_seconds(), 0.0)
                for row in rows
                if row[1] is not None
            }

        return await self._run(run)

    async def pending(self, kind: str, key_prefix: str, tenant: str | None = None) -> list[JSONObject]:
        params = {"kind": kind, "pattern": _like_prefix(key_prefix), "tenant": tenant}
        statement = self._statements.pending if tenant is None else self._statements.tenant_pending

        def run() -> list[JSONObject]:
            with self.engine.connect() as connection:
                return [row[0] for row in connection.execute(statement, params)]

        return await self._run(run)

    async def queued(self, kind: str, key_prefix: str, tenant: str) -> list[tuple[str, JSONObject]]:
        params = {"kind": kind, "pattern": _like_prefix(key_prefix), "tenant": tenant}

        def run() -> list[tuple[str, JSONObject]]:
            with self.engine.connect() as connection:
                return [(row[0], row[1]) for row in connection.execute(self._statements.queued, params)]

        return await self._run(run)

    async def absorb(self, job: Job, keys: Sequence[str], payload: JSONObject) -> list[str]:
        if not keys or job.worker is None:
            return []
        held = {"job_id": job.id, "worker": job.worker, "attempt": job.attempts, "payload": payload}
        held.update(self._statements.clock.params())
        absorbed = {"tenant": job.tenant, "kind": job.kind, "keys": [k for k in keys if k != job.key]}

        def run() -> list[str]:
            with self.engine.begin() as connection:
                if connection.execute(self._statements.rewrite, held).rowcount != 1:
                    return []  # the lease was lost: the job is someone else's now
                return [row[0] for row in connection.execute(self._statements.absorb, absorbed)]

        return await self._run(run)

    async def failures(self, tenant: str | None = None, limit: int = 20) -> list[JobState]:
        """The newest jobs that failed for good, with their errors (the CLI's `jobs`)."""
        query = (
            select(_JOBS).where(_JOBS.c.status == "failed").order_by(_JOBS.c.updated_at.desc()).limit(limit)
        )
        if tenant is not None:
            query = query.where(_JOBS.c.tenant == tenant)

        def run() -> list[JobState]:
            with self.engine.connect() as connection:
                rows = connection.execute(query).mappings().all()
            out = []
            for row in rows:
                fields = dict(row)
                for name in ("run_after", "lease_until", "created_at", "updated_at"):
                    if fields[name] is not None:
                        fields[name] = _aware(fields[name])
                out.append(
                    JobState(**{k: v for k, v in fields.items() if k in JobState.__dataclass_fields__})
                )
            return out

        return await self._run(run)

    async def retry(self, tenant: str, job_id: str) -> bool:
        """Queue a job that failed for good once more, from its first attempt; False when there is no
        such failed job, or a job with its key is pending already (that one will do the work)."""
        statement = (
            update(_JOBS)
            .where(_JOBS.c.id == job_id, _JOBS.c.tenant == tenant, _JOBS.c.status == "failed")
            .values(
                status="queued",
                attempts=0,
                run_after=utcnow(),
                lease_owner=None,
                lease_until=None,
                updated_at=utcnow(),
            )
        )

        def run() -> bool:
            try:
                with self.engine.begin() as connection:
                    return bool(connection.execute(statement).rowcount)
            except IntegrityError:
                return False

        done = await self._run(run)
        if done:
            self.notify_listeners()
        return done

    async def prune(self, done_for_seconds: float) -> int:
        cutoff = utcnow() - timedelta(seconds=done_for_seconds)

        def run() -> int:
            statement = delete(_JOBS).where(_JOBS.c.status == "done", _JOBS.c.updated_at < cutoff)
            with self.engine.begin() as connection:
                return int(connection.execute(statement).rowcount)

        return await self._run(run)

    async def get(self, job_id: str) -> JobState | None:
        def run() -> JobState | None:
            with self.engine.connect() as connection:
                row = connection.execute(self._statements.get, {"job_id": job_id}).first()
            if row is None:
                return None
            fields = dict(row._mapping)
            for name in ("run_after", "lease_until", "created_at", "updated_at"):
                if fields[name] is not None:
                    fields[name] = _aware(fields[name])
            return JobState(**fields)

        return await self._run(run)

    async def aclose(self) -> None:
        if self._owns_engine:
            await anyio.to_thread.run_sync(self.engine.dispose)
