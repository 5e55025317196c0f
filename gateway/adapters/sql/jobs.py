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
from sqlalchemy import (
    ColumnElement,
    DateTime,
    Engine,
    Insert,
    Integer,
    Interval,
    Select,
    Update,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import SQLModel

from gateway.adapters.sql.migrations import migrate
from gateway.adapters.sql.tables import JOB_PENDING_WHERE, JobRow, utcnow
from gateway.errors import StoreError
from gateway.ports import JSONObject
from gateway.records import Job, JobState, NewJob

T = TypeVar("T")
STATUSES = ("queued", "running", "done", "failed")
_JOBS = SQLModel.metadata.tables[str(JobRow.__tablename__)]
_TIMESTAMP = DateTime(timezone=True)
_ERROR_CHARS = 4000  # enough for a message and the end of a traceback; the log has the whole of it
_ABSORB_AT_MOST = 256  # queued jobs `queued` lists (a job absorbs a bounded number at a time)


class _Clock:
    """The times the queue compares. On Postgres they come from the database's clock, so replicas whose
    clocks drift still agree on when a lease expires; on SQLite (one machine) from this process's UTC
    clock. Statements take `now` and named offsets in seconds; `params` fills them for one execution."""

    def __init__(self, postgres: bool) -> None:
        self.postgres = postgres

    def now(self) -> ColumnElement[datetime]:
        return func.now() if self.postgres else bindparam("now", type_=_TIMESTAMP)

    def after(self, name: str) -> ColumnElement[datetime]:
        if self.postgres:
            return func.now() + bindparam(name, type_=Interval())
        return bindparam(name, type_=_TIMESTAMP)

    def params(self, **seconds: float) -> dict[str, Any]:
        if self.postgres:
            return {name: timedelta(seconds=value) for name, value in seconds.items()}
        now = utcnow()
        return {"now": now, **{name: now + timedelta(seconds=value) for name, value in seconds.items()}}


class _Statements:
    """Every statement the queue runs, built once per dialect: building one costs more than running it,
    and enqueueing happens inside the request path's append transaction."""

    def __init__(self, postgres: bool) -> None:
        self.clock = clock = _Clock(postgres)
        now = clock.now()
        dialect_insert = pg_insert if postgres else sqlite_insert
        self.insert: Insert = (
            dialect_insert(_JOBS)
            .values(
                status="queued", attempts=0, run_after=clock.after("delay"), created_at=now, updated_at=now
            )
            .on_conflict_do_nothing(index_elements=["kind", "key"], index_where=JOB_PENDING_WHERE)
            .returning(_JOBS.c.id)
        )
        due = or_(
            and_(_JOBS.c.status == "queued", _JOBS.c.run_after <= now),
            # A running job whose lease ran out: its worker died or hung, so another may take it.
            and_(_JOBS.c.status == "running", _JOBS.c.lease_until <= now),
        )
        pick = (
            select(_JOBS.c.id)
            .where(_JOBS.c.kind.in_(bindparam("kinds", expanding=True)), due)
            .order_by(_JOBS.c.priority.desc(), _JOBS.c.run_after)
            .limit(bindparam("limit", type_=Integer()))
            .with_for_update(skip_locked=True)
        )
        self.lease: Update = (
            update(_JOBS)
            .where(_JOBS.c.id.in_(pick))
            .values(
                status="running",
                lease_owner=bindparam("worker"),
                lease_until=clock.after("lease"),
                attempts=_JOBS.c.attempts + 1,
                updated_at=now,
            )
            .returning(
                _JOBS.c.id,
                _JOBS.c.kind,
                _JOBS.c.tenant,
                _JOBS.c.payload,
                _JOBS.c.key,
                _JOBS.c.attempts,
                _JOBS.c.lease_until,
            )
        )
        # The attempt number fences a lease: a worker whose lease expired and was re-taken (by anyone,
        # itself included) no longer matches, so its late result is dropped.
        held = and_(
            _JOBS.c.id == bindparam("job_id"),
            _JOBS.c.status == "running",
            _JOBS.c.lease_owner == bindparam("worker"),
            _JOBS.c.attempts == bindparam("attempt"),
        )
        self.complete: Update = (
            update(_JOBS)
            .where(held)
            .values(status="done", lease_owner=None, lease_until=None, updated_at=now)
        )
        self.fail: Update = (
            update(_JOBS)
            .where(held)
            .values(
                status=bindparam("new_status"),
                run_after=clock.after("retry"),
                last_error=bindparam("error"),
                lease_owner=None,
                lease_until=None,
                updated_at=now,
            )
        )
        self.release: Update = (
            update(_JOBS)
            .where(held)
            .values(
                status="queued",
                attempts=_JOBS.c.attempts - 1,
                run_after=now,
                lease_owner=None,
                lease_until=None,
                updated_at=now,
            )
        )
        self.counts: Select[Any] = select(_JOBS.c.status, func.count()).group_by(_JOBS.c.status)
        # Due queued jobs only (the status and run_after index finds them), with the clock they are aged by.
        self.oldest_queued: Select[Any] = (
            select(_JOBS.c.kind, func.min(_JOBS.c.run_after), now)
            .where(_JOBS.c.status == "queued", _JOBS.c.run_after <= now)
            .group_by(_JOBS.c.kind)
        )
        self.tenant_counts: Select[Any] = self.counts.where(_JOBS.c.tenant == bindparam("tenant"))
        self.get: Select[Any] = select(_JOBS).where(_JOBS.c.id == bindparam("job_id"))
        # Few jobs are pending at a time: the status index finds them, the kind and key filter the rest.
        self.pending: Select[Any] = select(_JOBS.c.payload).where(
            _JOBS.c.status.in_(("queued", "running")),
            _JOBS.c.kind == bindparam("kind"),
            _JOBS.c.key.like(bindparam("pattern"), escape="\\"),
        )
        self.tenant_pending: Select[Any] = self.pending.where(_JOBS.c.tenant == bindparam("tenant"))
        self.queued: Select[Any] = (
            select(_JOBS.c.key, _JOBS.c.payload)
            .where(
                _JOBS.c.status == "queued",
                _JOBS.c.tenant == bindparam("tenant"),
                _JOBS.c.kind == bindparam("kind"),
                _JOBS.c.key.like(bindparam("pattern"), escape="\\"),
            )
            .order_by(_JOBS.c.created_at)
            .limit(_ABSORB_AT_MOST)
        )
        self.rewrite: Update = update(_JOBS).where(held).values(payload=bindparam("payload"), updated_at=now)
        self.absorb = (
            delete(_JOBS)
            .where(
                _JOBS.c.status == "queued",
                _JOBS.c.tenant == bindparam("tenant"),
                _JOBS.c.kind == bindparam("kind"),
                _JOBS.c.key.in_(bindparam("keys", expanding=True)),
            )
            .returning(_JOBS.c.key)
        )


_STATEMENTS = {"postgresql": _Statements(postgres=True), "sqlite": _Statements(postgres=False)}


def _statements(dialect: str) -> _Statements:
    try:
        return _STATEMENTS[dialect]
    except KeyError:
        raise StoreError(f"the job queue supports sqlite and postgresql, not {dialect}") from None


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
        from gateway.adapters.sql.store import build_engine  # the store module imports this one

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

    async def release(self, job: Job, worker: str) -> bool:
        params = {
            "job_id": job.id,
            "worker": worker,
            "attempt": job.attempts,
            **self._statements.clock.params(),
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
