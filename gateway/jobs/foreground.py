"""The request path's claim on the process: background jobs start only while no request is being worked on.

A request counts from its arrival until its prompt is sent upstream, and again while its answer is stored;
not while the upstream generates (the gateway is idle then, and a stream can last minutes). A job waits
for a quiet moment before it starts, at most `max_wait` seconds, so a process that is never quiet still
runs its jobs: they are deferred, never starved.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator


class Foreground:
    """Counts the requests in the gateway's own hands; `quiet()` waits until there are none."""

    def __init__(self) -> None:
        self._working = 0
        self._quiet: asyncio.Event | None = None  # made on first use, on the loop that awaits it
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def working(self) -> int:
        return self._working

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Around the request path's own work (call on the event loop the jobs run on)."""
        self._working += 1
        if self._quiet is not None:
            self._quiet.clear()
        try:
            yield
        finally:
            self._working -= 1
            if self._working == 0 and self._quiet is not None:
                self._quiet.set()

    async def quiet(self, max_wait: float) -> float:
        """Return once no request is being worked on, or after `max_wait` seconds; the seconds waited."""
        if self._working == 0 or max_wait <= 0:
            return 0.0
        loop = asyncio.get_running_loop()
        if self._quiet is None or self._loop is not loop:  # an event serves the loop it first waited on
            self._quiet, self._loop = asyncio.Event(), loop
        started = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._quiet.wait(), max_wait)
        return time.perf_counter() - started
