"""When a LanceDB table is compacted: after enough writes (or rows), in the writer's own call, so the work
is paid by background jobs and never by a request.

Lance keeps each write as a fragment of its own, outside the indexes until compacted, and every search
pays for each one; a compaction merges them and indexes their rows (`LanceAdapter.optimize`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from gateway.errors import SearchIndexError

log = logging.getLogger(__name__)

# Older versions' files are deleted after this: readers need seconds at most, and every compaction leaves
# a full copy of the table and its full-text index behind until it ages out.
KEEP_VERSIONS = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class Policy:
    """How often one table is compacted."""

    label: str  # the table's kind, in the log ("index", "memory index")
    every_writes: int
    every_rows: int | None = None  # None: rows do not count
    # Throttle: after a compaction taking d seconds, the next waits at least d / busy_share, and one due
    # meanwhile is run as soon as it may (None: no throttle; a compaction due while one runs is skipped).
    busy_share: float | None = None


class Compactor:
    """Counts one table's writes and runs `compact` when its `Policy` says so (one at a time)."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        compact: Callable[[], Awaitable[None]],
        *,
        backlog: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.name = name
        self.policy = policy
        self._compact = compact
        # Asked at the process's first write: whether rows an earlier process left call for one at once.
        self._backlog = backlog
        self._writes = 0
        self._rows = 0
        self._running = False
        self._not_before = 0.0
        self._deferred: asyncio.TimerHandle | None = None  # the compaction a throttled write put off
        self._tasks: set[asyncio.Task[None]] = set()

    async def wrote(self, rows: int = 0) -> None:
        """Count a write of `rows` rows; compact when enough have piled up."""
        self._writes += 1
        self._rows += rows
        policy = self.policy
        due = self._writes >= policy.every_writes or (
            policy.every_rows is not None and self._rows >= policy.every_rows
        )
        if self._backlog is not None:
            backlog, self._backlog = self._backlog, None
            due = due or await backlog()
        if not due:
            return
        if self._running or time.monotonic() < self._not_before:
            if policy.busy_share is not None:
                # Rows outside the full-text index are scanned by every search: run it once allowed, even
                # if no write comes after the burst.
                self._defer()
            return
        await self._logged()

    async def optimize(self) -> None:
        """Compact now, unless a compaction is running already."""
        if self._running:
            return
        self._running = True
        started = time.monotonic()
        try:
            await self._compact()
        finally:
            self._running = False
            self._writes = self._rows = 0
            if self.policy.busy_share is not None:
                elapsed = time.monotonic() - started
                self._not_before = time.monotonic() + elapsed / self.policy.busy_share

    async def _logged(self) -> None:
        try:
            await self.optimize()
        except SearchIndexError as exc:
            # The write itself succeeded: failing it would only make its job redo it. A later write tries
            # again (e.g. after a commit conflict with another replica compacting).
            log.warning("%s %s: compaction failed, retried later: %s", self.policy.label, self.name, exc)

    def _defer(self) -> None:
        """Run the compaction that is due once the throttle allows (one pending at a time)."""
        if self._deferred is not None:
            return
        loop = asyncio.get_running_loop()

        def run() -> None:
            self._deferred = None
            if self._writes or self._rows:  # nothing left to do if a write compacted meanwhile
                self._tasks.add(task := loop.create_task(self._logged()))
                task.add_done_callback(self._tasks.discard)

        delay = max(self._not_before - time.monotonic(), 0.0) + 0.05
        self._deferred = loop.call_later(delay, run)

    def close(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        for task in list(self._tasks):
            task.cancel()
