"""Background jobs hold back while a request is in the gateway's hands: on a real SQLite queue, and through
the real server (a request waiting on its upstream, or one that failed, holds nothing back)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import openai
import pytest

from gateway.adapters.sql.store import SqlStore
from gateway.config import JobsConfig, parse_config
from gateway.errors import ConfigError
from gateway.fakes.openai_wire import Reply
from gateway.jobs import WorkerPool
from gateway.jobs.foreground import Foreground
from gateway.records import Job, NewJob
from tests.conftest import Gateway, Upstream, tenant

CONFIG = JobsConfig(workers=1, poll_seconds=0.02, lease_seconds=5, yield_seconds=0.6)


class Started:
    def __init__(self) -> None:
        self.at: list[float] = []

    async def __call__(self, job: Job) -> None:
        self.at.append(time.monotonic())


async def _until(condition: Callable[[], object]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def _settled(store: SqlStore, done: int) -> dict[str, int]:
    """The queue's counts once `done` jobs are done or 5 s have passed."""
    deadline = time.monotonic() + 5
    counts = await store.jobs.counts()
    while counts["done"] < done and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
        counts = await store.jobs.counts()
    return counts


@contextlib.asynccontextmanager
async def _pool(tmp_path: Path) -> AsyncIterator[tuple[SqlStore, Started, Foreground, WorkerPool]]:
    """A worker pool on a real SQLite queue, with the foreground it yields to; stopped on exit."""
    store = SqlStore.open(f"sqlite:///{tmp_path}/jobs.db")
    handler, foreground = Started(), Foreground()
    pool = WorkerPool(store.jobs, {"record": handler}, CONFIG, foreground=foreground)
    store.jobs.add_listener(pool.notify)
    try:
        async with pool.running():
            yield store, handler, foreground, pool
    finally:
        await store.aclose()


def test_a_job_starts_when_the_request_in_hand_leaves(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _pool(tmp_path) as (store, handler, foreground, pool):
            with foreground.request():
                await store.jobs.enqueue(NewJob("record", "acme", {"n": 1}))
                await asyncio.sleep(0.3)
                assert handler.at == []  # leased, held back while the request is worked on
                left = time.monotonic()
            await _until(lambda: handler.at)
            assert handler.at[0] - left < 0.2
        assert pool.stats.yielded == 1 and pool.stats.done == 1

    asyncio.run(scenario())


def test_a_process_that_is_never_quiet_still_runs_its_jobs(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _pool(tmp_path) as (store, handler, foreground, pool):
            with foreground.request():
                queued = time.monotonic()
                for n in range(2):
                    await store.jobs.enqueue(NewJob("record", "acme", {"n": n}))
                await _until(lambda: len(handler.at) == 2)
            # Each job waited its `yield_seconds`, then ran: deferred, not starved.
            assert handler.at[0] - queued >= CONFIG.yield_seconds * 0.9
            assert handler.at[1] - handler.at[0] >= CONFIG.yield_seconds * 0.9
            # The handler records a job as it starts; the queue marks it done just after it returns.
            assert await _settled(store, done=2) == {"queued": 0, "running": 0, "done": 2, "failed": 0}
        assert pool.stats.yielded == 2 and pool.stats.done == 2

    asyncio.run(scenario())


def test_the_wait_works_on_each_event_loop_that_uses_it() -> None:
    foreground = Foreground()

    async def waits_then_leaves() -> float:
        with foreground.request():
            waiting = asyncio.ensure_future(foreground.quiet(5))
            await asyncio.sleep(0.05)
        return await waiting

    # A second loop (a CLI command after the server, a test after another) finds the wait working.
    assert [asyncio.run(waits_then_leaves()) < 1 for _ in range(2)] == [True, True]


def test_yield_seconds_must_leave_the_job_most_of_its_lease() -> None:
    with pytest.raises(ConfigError, match=r"jobs\.yield_seconds \(2\) must be under half"):
        parse_config({"jobs": {"lease_seconds": 4, "yield_seconds": 2}, "tenants": []}, {})


def _in_hand(gateway: Gateway) -> int:
    workers = httpx.get(f"{gateway.server.url}/healthz").json()["workers"]
    return int(workers["requests_in_hand"])


def test_requests_waiting_on_the_upstream_or_failed_hold_no_job_back(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url)])
    client = gateway.client()
    # A stream the upstream takes two seconds to finish: the gateway is idle meanwhile.
    upstream.fake.enqueue(Reply(content="one two three four", chunk_delay=0.5))
    seen: list[int] = []

    def stream() -> None:
        chunks = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "slow one"}], stream=True
        )
        for _ in chunks:
            seen.append(_in_hand(gateway))

    reader = threading.Thread(target=stream)
    reader.start()
    reader.join(10)
    assert seen and max(seen) == 0

    upstream.fake.enqueue(Reply(status=500, error={"error": {"message": "down", "type": "server_error"}}))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "fails"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[])
    upstream.fake.enqueue(Reply(content="done"))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "plain"}])
    deadline = time.monotonic() + 5
    while _in_hand(gateway) != 0:  # a buffered answer is stored after its last byte
        assert time.monotonic() < deadline, "a request stayed in the gateway's hands"
        time.sleep(0.01)
