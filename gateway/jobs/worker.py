"""In-process workers: loops that lease jobs from the durable queue and run the handler for each kind.

A handler is registered per job kind (built-ins the same way a plugin would be). A job is done when its
handler returns; an exception is recorded and the job retried with exponential backoff until
`max_attempts`, then marked failed. Handlers must be idempotent: a job whose worker died, or whose
handler outlived the lease, runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Protocol

from gateway.config import JobsConfig
from gateway.errors import StoreError
from gateway.jobs.foreground import Foreground
from gateway.ports import JobQueue
from gateway.records import Job

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 10.0
_MAX_DOUBLINGS = 62  # 2**62 seconds is past any cap; keeps the power from growing without bound


class JobHandler(Protocol):
    async def __call__(self, job: Job) -> None:
        """Do the job; raise to have it retried. Runs again after a crash or lost lease: be idempotent."""
        ...


def retry_delay(config: JobsConfig, attempts: int) -> float:
    """Seconds before the next try after `attempts` failed ones: base * 2**(attempts-1), capped."""
    return min(config.retry_base_seconds * 2.0 ** min(attempts - 1, _MAX_DOUBLINGS), config.retry_max_seconds)


class Postponed(Exception):
    """Raised by a handler whose job should wait for other work: it is queued again after `seconds`,
    the attempt not counted."""

    def __init__(self, seconds: float, why: str) -> None:
        super().__init__(why)
        self.seconds = seconds


# Told of every run: (kind, outcome: done, retried, failed, lost, released or postponed, seconds the
# handler ran, if it ran to an end).
JobObserver = Callable[[str, str, float | None], None]


@dataclass(slots=True)
class WorkerStats:
    """What this process's workers did since start, shown on `/healthz` next to the queue's counts."""

    done: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0  # finished after the lease had expired and been taken again: the result was dropped
    released: int = 0  # handed back unfinished at shutdown, for another worker to run at once
    yielded: int = 0  # jobs that waited for the requests being worked on before they started
    postponed: int = 0  # handed back by their handler to wait for other work (a long history's index)

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


PRUNE_EVERY_SECONDS = 300.0


class WorkerPool:
    """`config.workers` loops, each leasing one job at a time of the kinds that have a handler.

    Loops sleep `poll_seconds` between empty leases; `notify()` wakes them at once. Use
    `async with pool.running():` (or `start()` / `await stop()`) on the event loop that calls `notify()`.
    """

    def __init__(
        self,
        queue: JobQueue,
        handlers: Mapping[str, JobHandler] | None = None,
        config: JobsConfig | None = None,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        observe: JobObserver | None = None,
        foreground: Foreground | None = None,
    ) -> None:
        self.queue = queue
        self.foreground = foreground or Foreground()
        self.config = config or JobsConfig()
        self.stats = WorkerStats()
        self._observe = observe
        self._handlers: dict[str, JobHandler] = dict(handlers or {})
        self._grace_seconds = grace_seconds
        # host and pid say where a lease came from; the token keeps two pools in one process apart.
        prefix = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        self.worker_ids = tuple(f"{prefix}-{n}" for n in range(self.config.workers))
        self._wakes: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._idle = 0

    def register(self, kind: str, handler: JobHandler) -> None:
        """Add or replace the handler for `kind`; running loops pick it up on their next lease."""
        self._handlers[kind] = handler
        self.notify()

    def only(self, kinds: Sequence[str]) -> WorkerPool:
        """A pool of its own on the same queue, running only `kinds` (a command that works through the
        jobs it queued, like `context-gateway reindex`, without taking other kinds of work)."""
        handlers = {kind: handler for kind, handler in self._handlers.items() if kind in kinds}
        return WorkerPool(
            self.queue,
            handlers,
            self.config,
            grace_seconds=self._grace_seconds,
            observe=self._observe,
            foreground=self.foreground,
        )

    @property
    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def idle(self) -> int:
        """Loops waiting for work (found none at their last lease)."""
        return self._idle

    def notify(self) -> None:
        """Wake idle loops to look for jobs now (call on the pool's event loop)."""
        for wake in self._wakes:
            wake.set()

    def start(self) -> None:
        if self._tasks:
            raise RuntimeError("the worker pool is already running")
        self._stopping = False
        self._wakes = [asyncio.Event() for _ in self.worker_ids]
        for worker, wake in zip(self.worker_ids, self._wakes, strict=True):
            task = asyncio.create_task(self._loop(worker, wake), name=f"job-worker {worker}")
            task.add_done_callback(self._loop_ended)
            self._tasks.append(task)

    async def stop(self) -> None:
        """Stop the loops: idle ones at once; a running handler gets `grace_seconds` to finish, then is
        cancelled and its job handed back to the queue (another worker runs it at once, the attempt not
        counted; if that fails too, the lease expires and the job runs again then)."""
        self._stopping = True
        self.notify()
        tasks, self._tasks = self._tasks, []
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self._grace_seconds)
        for task in pending:
            task.cancel()
        # Results were already reported by `_loop_ended`; this only waits for the cancellations.
        await asyncio.gather(*tasks, return_exceptions=True)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[WorkerPool]:
        self.start()
        try:
            yield self
        finally:
            await self.stop()

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("%s stopped by an unexpected error", task.get_name(), exc_info=error)

    async def _loop(self, worker: str, wake: asyncio.Event) -> None:
        pruned_at = 0.0
        while not self._stopping:
            # One loop per process keeps the table from growing with every job ever run.
            prunes = worker == self.worker_ids[0] and self.config.keep_done_seconds > 0
            if prunes and time.monotonic() - pruned_at >= PRUNE_EVERY_SECONDS:
                pruned_at = time.monotonic()
                try:
                    await self.queue.prune(self.config.keep_done_seconds)
                except StoreError:
                    log.warning("job worker %s: pruning done jobs failed", worker, exc_info=True)
            # Cleared before leasing: a notify() arriving during the lease is kept for the wait below.
            wake.clear()
            try:
                busy = await self._step(worker)
            except StoreError:
                # The database is unreachable: wait a poll interval and try again; the loop must live on.
                log.warning("job worker %s: the queue failed", worker, exc_info=True)
                busy = False
            if busy or self._stopping:
                continue
            self._idle += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.config.poll_seconds)
            finally:
                self._idle -= 1

    async def _step(self, worker: str) -> bool:
        """Lease and run one job; False when there was none."""
        kinds = self.kinds
        if not kinds:
            return False
        jobs = await self.queue.lease(worker, kinds, self.config.lease_seconds)
        for job in jobs:
            # The request path first: a job starts in a quiet moment, or late (never lost).
            waited = await self.foreground.quiet(self.config.yield_seconds)
            if waited > 0:
                self.stats.yielded += 1
            await self._run(worker, job, waited)
        return bool(jobs)

    async def _run(self, worker: str, job: Job, waited: float = 0.0) -> None:
        if job.attempts > self.config.max_attempts:
            # Every earlier lease expired unfinished: its worker died (this job may be what kills it).
            error = f"gave up: {job.attempts - 1} attempts ended without a result (lease expired)"
            log.error("job %s (%s) failed for good: %s", job.id, job.kind, error)
            self.stats.failed += 1
            self._observed(job, "failed", None)
            await self.queue.fail(job, worker, error, None)
            return
        handler = self._handlers[job.kind]
        started = time.perf_counter()
        try:
            # A handler outliving its lease could run twice at once; stop it when the lease ends.
            async with asyncio.timeout(self.config.lease_seconds - waited) as deadline:
                await handler(job)
        except asyncio.CancelledError:
            if self._stopping:
                await self._release(worker, job)
            raise
        except Postponed as later:
            await self._release(worker, job, later)
            return
        except Exception as exc:  # any handler failure is recorded on the job and retried, never lost
            expired = deadline.expired()
            error = f"timed out after {self.config.lease_seconds:g}s" if expired else _describe(exc)
            await self._record_failure(worker, job, error, exc, time.perf_counter() - started)
            return
        seconds = time.perf_counter() - started
        if await self.queue.complete(job, worker):
            self.stats.done += 1
            self._observed(job, "done", seconds)
        else:
            self.stats.lost += 1
            self._observed(job, "lost", seconds)
            log.warning(
                "job %s (%s) finished after its lease was taken over; result dropped", job.id, job.kind
            )

    async def _release(self, worker: str, job: Job, later: Postponed | None = None) -> None:
        try:
            released = await self.queue.release(job, worker, later.seconds if later is not None else 0.0)
        except StoreError:
            log.warning(
                "job %s (%s): could not hand it back; it runs again when its lease ends", job.id, job.kind
            )
            return
        if not released:
            return
        if later is not None:
            self.stats.postponed += 1
            self._observed(job, "postponed", None)
            log.info("job %s (%s) postponed %.0fs: %s", job.id, job.kind, later.seconds, later)
            return
        self.stats.released += 1
        self._observed(job, "released", None)
        log.info("job %s (%s) handed back unfinished at shutdown", job.id, job.kind)

    def _observed(self, job: Job, outcome: str, seconds: float | None) -> None:
        if self._observe is not None:
            self._observe(job.kind, outcome, seconds)

    async def _record_failure(
        self, worker: str, job: Job, error: str, exc: Exception, seconds: float
    ) -> None:
        if job.attempts >= self.config.max_attempts:
            log.error(
                "job %s (%s) failed for good after %d attempts: %s",
                job.id,
                job.kind,
                job.attempts,
                error,
                exc_info=exc,
            )
            self.stats.failed += 1
            self._observed(job, "failed", seconds)
            await self.queue.fail(job, worker, error, None)
            return
        delay = retry_delay(self.config, job.attempts)
        log.warning(
            "job %s (%s) attempt %d failed, retrying in %.1fs: %s",
            job.id, job.kind, job.attempts, delay, error, exc_info=exc,
        )  # fmt: skip
        self.stats.retried += 1
        self._observed(job, "retried", seconds)
        await self.queue.fail(job, worker, error, delay)


def _describe(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
