"""The statements the job queue (`gateway.adapters.sql.jobs`) runs, built once per dialect."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    DateTime,
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
from sqlalchemy.sql.dml import ReturningDelete
from sqlmodel import SQLModel

from gateway.adapters.sql.tables import JOB_PENDING_WHERE, JobRow, utcnow
from gateway.errors import StoreError

JOBS = SQLModel.metadata.tables[str(JobRow.__tablename__)]
_TIMESTAMP = DateTime(timezone=True)
_ABSORB_AT_MOST = 256  # queued jobs `queued` lists (a job absorbs a bounded number at a time)


class Clock:
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


class Statements:
    """Every statement the queue runs, built once per dialect: building one costs more than running it,
    and enqueueing happens inside the request path's append transaction."""

    def __init__(self, postgres: bool) -> None:
        self.clock = clock = Clock(postgres)
        now = clock.now()
        self.insert: Insert = _insert(clock, postgres)
        self.lease: Update = _lease(clock)
        held = _held()
        self.complete: Update = (
            update(JOBS).where(held).values(status="done", lease_owner=None, lease_until=None, updated_at=now)
        )
        self.fail: Update = (
            update(JOBS)
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
            update(JOBS)
            .where(held)
            .values(
                status="queued",
                attempts=JOBS.c.attempts - 1,
                run_after=clock.after("delay"),
                lease_owner=None,
                lease_until=None,
                updated_at=now,
            )
        )
        self.counts: Select[Any] = select(JOBS.c.status, func.count()).group_by(JOBS.c.status)
        # Due queued jobs only (the status and run_after index finds them), with the clock they are aged by.
        self.oldest_queued: Select[Any] = (
            select(JOBS.c.kind, func.min(JOBS.c.run_after), now)
            .where(JOBS.c.status == "queued", JOBS.c.run_after <= now)
            .group_by(JOBS.c.kind)
        )
        self.tenant_counts: Select[Any] = self.counts.where(JOBS.c.tenant == bindparam("tenant"))
        self.get: Select[Any] = select(JOBS).where(JOBS.c.id == bindparam("job_id"))
        # Few jobs are pending at a time: the status index finds them, the kind and key filter the rest.
        self.pending: Select[Any] = select(JOBS.c.payload).where(
            JOBS.c.status.in_(("queued", "running")),
            JOBS.c.kind == bindparam("kind"),
            JOBS.c.key.like(bindparam("pattern"), escape="\\"),
        )
        self.tenant_pending: Select[Any] = self.pending.where(JOBS.c.tenant == bindparam("tenant"))
        self.queued: Select[Any] = _queued()
        self.rewrite: Update = update(JOBS).where(held).values(payload=bindparam("payload"), updated_at=now)
        self.absorb = _absorb()


def _insert(clock: Clock, postgres: bool) -> Insert:
    now = clock.now()
    dialect_insert = pg_insert if postgres else sqlite_insert
    return (
        dialect_insert(JOBS)
        .values(status="queued", attempts=0, run_after=clock.after("delay"), created_at=now, updated_at=now)
        .on_conflict_do_nothing(index_elements=["kind", "key"], index_where=JOB_PENDING_WHERE)
        .returning(JOBS.c.id)
    )


def _lease(clock: Clock) -> Update:
    now = clock.now()
    due = or_(
        and_(JOBS.c.status == "queued", JOBS.c.run_after <= now),
        # A running job whose lease ran out: its worker died or hung, so another may take it.
        and_(JOBS.c.status == "running", JOBS.c.lease_until <= now),
    )
    pick = (
        select(JOBS.c.id)
        .where(JOBS.c.kind.in_(bindparam("kinds", expanding=True)), due)
        .order_by(JOBS.c.priority.desc(), JOBS.c.run_after)
        .limit(bindparam("limit", type_=Integer()))
        .with_for_update(skip_locked=True)
    )
    return (
        update(JOBS)
        .where(JOBS.c.id.in_(pick))
        .values(
            status="running",
            lease_owner=bindparam("worker"),
            lease_until=clock.after("lease"),
            attempts=JOBS.c.attempts + 1,
            updated_at=now,
        )
        .returning(
            JOBS.c.id,
            JOBS.c.kind,
            JOBS.c.tenant,
            JOBS.c.payload,
            JOBS.c.key,
            JOBS.c.attempts,
            JOBS.c.lease_until,
        )
    )


def _held() -> ColumnElement[bool]:
    """The lease a worker holds. The attempt number fences it: a worker whose lease expired and was
    re-taken (by anyone, itself included) no longer matches, so its late result is dropped."""
    return and_(
        JOBS.c.id == bindparam("job_id"),
        JOBS.c.status == "running",
        JOBS.c.lease_owner == bindparam("worker"),
        JOBS.c.attempts == bindparam("attempt"),
    )


def _queued() -> Select[Any]:
    return (
        select(JOBS.c.key, JOBS.c.payload)
        .where(
            JOBS.c.status == "queued",
            JOBS.c.tenant == bindparam("tenant"),
            JOBS.c.kind == bindparam("kind"),
            JOBS.c.key.like(bindparam("pattern"), escape="\\"),
        )
        .order_by(JOBS.c.created_at)
        .limit(_ABSORB_AT_MOST)
    )


def _absorb() -> ReturningDelete[Any]:
    return (
        delete(JOBS)
        .where(
            JOBS.c.status == "queued",
            JOBS.c.tenant == bindparam("tenant"),
            JOBS.c.kind == bindparam("kind"),
            JOBS.c.key.in_(bindparam("keys", expanding=True)),
        )
        .returning(JOBS.c.key)
    )


_STATEMENTS = {"postgresql": Statements(postgres=True), "sqlite": Statements(postgres=False)}


def statements(dialect: str) -> Statements:
    try:
        return _STATEMENTS[dialect]
    except KeyError:
        raise StoreError(f"the job queue supports sqlite and postgresql, not {dialect}") from None
