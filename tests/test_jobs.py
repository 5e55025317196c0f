"""The durable job queue and its workers on real SQLite and real Postgres: leasing, dedupe, retries,
restarts, and queues on separate engines standing in for separate gateway processes."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import inspect, text

from gateway.adapters.sql import migrations
from gateway.adapters.sql.jobs import SqlJobQueue
from gateway.adapters.sql.store import SqlStore, build_engine
from gateway.app import create_app
from gateway.config import JobsConfig, parse_config
from gateway.errors import StoreError
from gateway.fakes.server import BackgroundServer
from gateway.jobs import Postponed, WorkerPool, retry_delay
from gateway.records import AppendRequest, Job, NewJob, NewMessage, RequestRecord, profile_job, title_job
from gateway.wiring import build_deps
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, recorded, tenant, wait_for_jobs

FAST = JobsConfig(workers=2, poll_seconds=0.02, lease_seconds=5, retry_base_seconds=0.05)


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[SqlJobQueue]:
    """A queue on an engine of its own, as another gateway process would have."""
    queue = SqlJobQueue.open(url)
    try:
        yield queue
    finally:
        await queue.aclose()


async def eventually(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


class Recorder:
    """A job handler that records what it ran, optionally failing its first `failures` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.jobs: list[Job] = []
        self.times: list[float] = []
        self.failures = failures

    async def __call__(self, job: Job) -> None:
        self.jobs.append(job)
        self.times.append(time.monotonic())
        if len(self.jobs) <= self.failures:
            raise ValueError(f"boom {len(self.jobs)}")

    @property
    def payloads(self) -> list[Any]:
        return [job.payload["n"] for job in self.jobs]


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def test_enqueue_lease_complete(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as queue:
            job_id = await queue.enqueue(NewJob("embed", "acme", {"n": 1, "text": "héllo"}))
            later = await queue.enqueue(NewJob("embed", "acme", {"n": 2}, delay_seconds=0.3))
            await queue.enqueue(NewJob("compact", "other", {"n": 3}))
            assert job_id is not None and later is not None
            assert await queue.counts() == {"queued": 3, "running": 0, "done": 0, "failed": 0}
            assert (await queue.counts("other"))["queued"] == 1

            assert await queue.lease("w1", ["extract_memory"], 5) == []  # only the kinds asked for
            [job] = await queue.lease("w1", ["embed"], 5, limit=10)  # the delayed one is not due yet
            assert (job.id, job.kind, job.tenant, job.key, job.attempts) == (job_id, "embed", "acme", None, 1)
            assert job.payload == {"n": 1, "text": "héllo"}
            assert job.lease_until > datetime.now(UTC)
            assert (await queue.counts("acme"))["running"] == 1

            assert await queue.complete(job, "w1")
            state = await queue.get(job_id)
            assert state is not None and (state.status, state.lease_owner) == ("done", None)

            await asyncio.sleep(0.3)
            [delayed] = await queue.lease("w1", ["embed"], 5, limit=10)
            assert delayed.id == later
            assert await queue.counts() == {"queued": 1, "running": 1, "done": 1, "failed": 0}

    run(scenario)


def test_a_higher_priority_job_is_leased_before_older_ones(database_url: str) -> None:
    """A history's first index pass (priority 1) goes before the per-exchange jobs queued ahead of it, and
    the views with neighbours (-1) after both; within a priority, the oldest first."""

    async def scenario() -> None:
        async with opened(database_url) as queue:
            low = await queue.enqueue(NewJob("embed", "acme", {"n": 0}, priority=-1))
            first = await queue.enqueue(NewJob("embed", "acme", {"n": 1}))
            second = await queue.enqueue(NewJob("embed", "acme", {"n": 2}))
            urgent = await queue.enqueue(NewJob("embed", "acme", {"n": 3}, priority=1))
            order = [(await queue.lease("w1", ["embed"], 5))[0].id for _ in range(4)]
            assert order == [urgent, first, second, low]

    run(scenario)


def test_titles_and_profiles_wait_behind_a_backlog_and_are_not_dropped(database_url: str) -> None:
    """With work queued, a title and a profile go after it; enqueued again meanwhile, each is still one."""

    async def scenario() -> None:
        async with opened(database_url) as queue:
            title = await queue.enqueue(title_job("acme", "c1", None))
            profile = await queue.enqueue(profile_job("acme", "u1", None))
            compact = await queue.enqueue(NewJob("compact", "acme", {"n": 0}))
            embed = await queue.enqueue(NewJob("embed", "acme", {"n": 1}))
            assert await queue.enqueue(title_job("acme", "c1", None)) is None  # deduped while pending
            kinds = ["title", "memory_profile", "compact", "embed"]
            order = [(await queue.lease("w1", kinds, 5))[0].id for _ in range(4)]
            assert order == [compact, embed, title, profile]

    run(scenario)


def test_the_priority_column_is_added_to_a_jobs_table_made_before_it(database_url: str) -> None:
    engine = build_engine(database_url)
    try:
        migrations.migrate(engine)
        with engine.begin() as connection:  # as a database from before 0010 was
            connection.execute(text("ALTER TABLE jobs DROP COLUMN priority"))
            connection.execute(text("DELETE FROM schema_migrations WHERE name = '0010_job_priority'"))
        assert migrations.migrate(engine) == ["0010_job_priority"]
        assert "priority" in {c["name"] for c in inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()


def test_a_keyed_job_is_not_enqueued_again_while_pending(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as queue, opened(database_url) as other:

            def compact(key: str) -> NewJob:
                return NewJob("compact", "acme", {"n": 0}, key=key)

            first = await queue.enqueue(compact("conv-1"))
            assert first is not None
            assert await queue.enqueue(compact("conv-1")) is None
            assert await queue.enqueue(NewJob("embed", "acme", {}, key="conv-1")) is not None  # other kind
            assert await queue.enqueue(compact("conv-2")) is not None

            [job] = await queue.lease("w1", ["compact"], 5)
            assert job.id == first
            assert await queue.enqueue(compact("conv-1")) is None  # running still counts as pending
            assert await queue.complete(job, "w1")
            again = await queue.enqueue(compact("conv-1"))  # done: a new one may be queued
            assert again is not None and again != first

            # Two processes racing on one key still store one job: the database enforces it.
            racing = [q.enqueue(compact("conv-3")) for q in (queue, other) for _ in range(10)]
            ids = await asyncio.gather(*racing)
            assert sum(job_id is not None for job_id in ids) == 1

    run(scenario)


def message(node_id: str, parent: str | None, depth: int, text: str) -> NewMessage:
    data: dict[str, Any] = {"role": "user", "content": text}
    return NewMessage(node_id.ljust(32, "0"), parent, depth, "user", data, 5, 5 * (depth + 1))


def record(request_id: str, conversation_id: str) -> RequestRecord:
    return RequestRecord(
        id=request_id, tenant="acme", conversation_id=conversation_id, user_id=None, parent_message_id=None,
        model="m", stream=False, status="complete", http_status=200, original_tokens=None, sent_tokens=None,
        report=None, usage=None, error=None, latency_ms=1.0, created_at=datetime.now(UTC),
    )  # fmt: skip


def test_jobs_in_an_append_commit_with_the_messages(database_url: str) -> None:
    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            first = message("a", None, 0, "hi")
            jobs = (NewJob("compact", "acme", {"n": 1}, key="k"), NewJob("embed", "acme", {"n": 2}))
            conversation_id = await store.append(AppendRequest("acme", None, None, None, (first,), jobs))
            assert await store.jobs.counts() == {"queued": 2, "running": 0, "done": 0, "failed": 0}

            second = message("b", first.id, 1, "more")
            duplicate = NewJob("compact", "acme", {"n": 3}, key="k")
            answer = AppendRequest("acme", conversation_id, None, None, (second,), (duplicate,))
            await store.complete(record("r1", conversation_id), answer)
            assert (await store.jobs.counts())["queued"] == 2  # the keyed compact job was already pending

            # The request record collides with r1 after the messages and jobs went in: all of it rolls back.
            third = message("c", second.id, 2, "lost")
            failing = AppendRequest(
                "acme", conversation_id, None, None, (third,), (NewJob("embed", "acme", {"n": 4}),)
            )
            with pytest.raises(StoreError):
                await store.complete(record("r1", conversation_id), failing)
            assert (await store.jobs.counts())["queued"] == 2
            stored = await store.conversation_messages("acme", conversation_id)
            assert [m.data["content"] for m in stored] == ["hi", "more"]
        finally:
            await store.aclose()

    run(scenario)


def test_concurrent_leasers_run_every_job_exactly_once(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as a, opened(database_url) as b, opened(database_url) as c:
            ids = [await a.enqueue(NewJob("embed", "acme", {"n": n})) for n in range(200)]
            leased: list[tuple[str, str]] = []
            lost: list[str] = []

            async def leaser(queue: SqlJobQueue, worker: str, limit: int) -> None:
                while jobs := await queue.lease(worker, ["embed"], 30, limit=limit):
                    for job in jobs:
                        leased.append((job.id, worker))
                        if not await queue.complete(job, worker):
                            lost.append(job.id)

            queues = (a, b, c)
            await asyncio.gather(
                *(leaser(q, f"w{i}-{j}", limit=1 + j) for i, q in enumerate(queues) for j in range(3))
            )
            assert Counter(job_id for job_id, _ in leased) == Counter(ids)  # each exactly once
            assert lost == []
            assert len({worker for _, worker in leased}) > 1
            assert await a.counts() == {"queued": 0, "running": 0, "done": 200, "failed": 0}

    run(scenario)


def test_an_expired_lease_is_taken_again_and_the_late_worker_loses(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as first, opened(database_url) as second:
            job_id = await first.enqueue(NewJob("compact", "acme", {"n": 1}))
            [mine] = await first.lease("w1", ["compact"], 0.2)
            assert await second.lease("w2", ["compact"], 0.2) == []  # still held
            await asyncio.sleep(0.25)

            [theirs] = await second.lease("w2", ["compact"], 5)
            assert (theirs.id, theirs.attempts) == (job_id, 2)
            assert not await first.complete(mine, "w1")
            await first.fail(mine, "w1", "too late", 0)  # a lost lease cannot fail the job either
            assert await second.complete(theirs, "w2")
            state = await second.get(theirs.id)
            assert state is not None and (state.status, state.attempts, state.last_error) == ("done", 2, None)

            # The attempt number fences a lease even when the same worker id takes the job back.
            await first.enqueue(NewJob("compact", "acme", {"n": 2}))
            [old] = await first.lease("w1", ["compact"], 0.1)
            await asyncio.sleep(0.15)
            [new] = await first.lease("w1", ["compact"], 5)
            assert not await first.complete(old, "w1")
            assert await first.complete(new, "w1")

    run(scenario)


def test_retry_delay_doubles_up_to_the_cap() -> None:
    config = JobsConfig(retry_base_seconds=2, retry_max_seconds=300)
    assert [retry_delay(config, n) for n in (1, 2, 3, 4, 8, 9, 10_000)] == [2, 4, 8, 16, 256, 300, 300]


def test_a_failing_handler_is_retried_with_backoff_then_failed(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as queue:
            config = FAST.model_copy(
                update={"workers": 1, "max_attempts": 3, "retry_base_seconds": 0.1, "retry_max_seconds": 0.15}
            )
            handler = Recorder(failures=10)
            pool = WorkerPool(queue, {"flaky": handler}, config)
            job_id = await queue.enqueue(NewJob("flaky", "acme", {"n": 1}))
            assert job_id is not None
            async with pool.running():
                await eventually(lambda: pool.stats.failed == 1)
            assert len(handler.jobs) == 3
            assert [job.attempts for job in handler.jobs] == [1, 2, 3]
            gaps = [later - earlier for earlier, later in zip(handler.times, handler.times[1:], strict=False)]
            assert gaps[0] >= 0.09 and gaps[1] >= 0.14  # 0.1, then 0.2 capped at 0.15
            assert (pool.stats.retried, pool.stats.done) == (2, 0)
            state = await queue.get(job_id)
            assert state is not None
            assert (state.status, state.attempts, state.last_error) == ("failed", 3, "ValueError: boom 3")

    run(scenario)


def test_a_postponed_job_runs_again_after_its_delay_without_counting_an_attempt(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as queue:
            times: list[float] = []

            async def waits_once(job: Job) -> None:
                times.append(time.monotonic())
                if len(times) == 1:
                    raise Postponed(0.3, "other work first")

            config = FAST.model_copy(update={"workers": 1, "max_attempts": 1})
            pool = WorkerPool(queue, {"patient": waits_once}, config)
            job_id = await queue.enqueue(NewJob("patient", "acme", {"n": 1}))
            assert job_id is not None
            async with pool.running():
                await eventually(lambda: pool.stats.done == 1)
            assert times[1] - times[0] >= 0.29  # queued again after its delay, not at once
            assert (pool.stats.postponed, pool.stats.retried, pool.stats.failed) == (1, 0, 0)
            state = await queue.get(job_id)
            assert state is not None and (state.status, state.attempts) == ("done", 1)

    run(scenario)


def test_a_handler_that_outlives_its_lease_is_stopped_and_retried(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as queue:
            calls: list[int] = []

            async def slow_once(job: Job) -> None:
                calls.append(job.attempts)
                if job.attempts == 1:
                    await asyncio.sleep(10)

            pool = WorkerPool(queue, {"slow": slow_once}, FAST.model_copy(update={"lease_seconds": 0.2}))
            job_id = await queue.enqueue(NewJob("slow", "acme", {}))
            assert job_id is not None
            async with pool.running():
                await eventually(lambda: pool.stats.done == 1)
            assert calls == [1, 2]
            state = await queue.get(job_id)
            assert state is not None and state.status == "done"

    run(scenario)


def test_a_restarted_process_runs_the_jobs_left_behind(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as before:
            for n in range(3):
                await before.enqueue(NewJob("record", "acme", {"n": n}))
            [crashed] = await before.lease("old-worker", ["record"], 0.3)  # never completed: the process died
        async with opened(database_url) as after:
            handler = Recorder()
            pool = WorkerPool(after, {"record": handler}, FAST)
            async with pool.running():
                await eventually(lambda: len(handler.jobs) == 3)
            assert sorted(handler.payloads) == [0, 1, 2]
            assert [job.attempts for job in handler.jobs if job.id == crashed.id] == [2]
            assert await after.counts() == {"queued": 0, "running": 0, "done": 3, "failed": 0}

    run(scenario)


def test_a_job_whose_workers_keep_dying_is_given_up(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as queue:
            job_id = await queue.enqueue(NewJob("record", "acme", {"n": 1}))
            assert job_id is not None
            await queue.lease("died", ["record"], 0.1)  # the only attempt allowed; its worker never returned
            handler = Recorder()
            pool = WorkerPool(queue, {"record": handler}, FAST.model_copy(update={"max_attempts": 1}))
            async with pool.running():
                await eventually(lambda: pool.stats.failed == 1)
            assert handler.jobs == []
            state = await queue.get(job_id)
            assert state is not None and state.status == "failed"
            assert state.last_error is not None and "lease expired" in state.last_error

    run(scenario)


def test_worker_pool_runs_jobs_and_notify_wakes_it(database_url: str) -> None:
    async def scenario() -> None:
        store = SqlStore.open(database_url)
        handler = Recorder()
        # A poll interval longer than the test: jobs run promptly only if something wakes the workers.
        pool = WorkerPool(store.jobs, {"record": handler}, FAST.model_copy(update={"poll_seconds": 60}))
        store.jobs.add_listener(pool.notify)
        assert len(set(pool.worker_ids)) == 2
        try:
            async with opened(database_url) as elsewhere:
                async with pool.running():
                    # Each step starts with both workers waiting, so only the step's own wake-up can run it.
                    await eventually(lambda: pool.idle == 2)
                    await store.jobs.enqueue(NewJob("record", "acme", {"n": 1}))
                    await eventually(lambda: handler.payloads == [1])
                    await eventually(lambda: pool.idle == 2)

                    job = NewJob("record", "acme", {"n": 2})
                    await store.append(AppendRequest("acme", None, None, None, (), (job,)))
                    await eventually(lambda: handler.payloads == [1, 2])
                    await eventually(lambda: pool.idle == 2)

                    # Enqueued by another process: nothing here knows until notified (or the next poll).
                    await elsewhere.enqueue(NewJob("record", "acme", {"n": 3}))
                    await asyncio.sleep(0.1)
                    assert handler.payloads == [1, 2]
                    pool.notify()
                    await eventually(lambda: handler.payloads == [1, 2, 3])
                    stopping = time.monotonic()
                assert time.monotonic() - stopping < 1  # idle workers stop at once, not after a poll
            assert pool.stats.done == 3
            assert await store.jobs.counts() == {"queued": 0, "running": 0, "done": 3, "failed": 0}
        finally:
            await store.aclose()

    run(scenario)


def test_stop_lets_a_running_handler_finish_within_the_grace_period(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as queue:
            started, release = asyncio.Event(), asyncio.Event()
            cancelled: list[str] = []

            async def blocking(job: Job) -> None:
                started.set()
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    cancelled.append(job.payload["name"])  # type: ignore[arg-type]
                    raise

            for name, grace in (("finishes", 5.0), ("cancelled", 0.1)):
                started.clear()
                pool = WorkerPool(queue, {"block": blocking}, FAST, grace_seconds=grace)
                job_id = await queue.enqueue(NewJob("block", "acme", {"name": name}))
                assert job_id is not None
                pool.start()
                await asyncio.wait_for(started.wait(), 5)
                stopping = asyncio.create_task(pool.stop())
                if name == "finishes":
                    await asyncio.sleep(0.05)
                    release.set()
                await asyncio.wait_for(stopping, 5)
                release.clear()
                state = await queue.get(job_id)
                assert state is not None
                # A cancelled job is handed back: queued at once, its lease gone, the attempt not counted.
                if name == "finishes":
                    assert state.status == "done" and pool.stats.released == 0
                else:
                    assert (state.status, state.lease_owner, state.attempts) == ("queued", None, 0)
                    assert pool.stats.released == 1
            assert cancelled == ["cancelled"]
            # Another process's pool runs it now, not when a lease would have expired (5 s here).
            recorder = Recorder()
            async with opened(database_url) as other:
                started_at = time.monotonic()
                async with WorkerPool(other, {"block": recorder}, FAST).running():
                    await eventually(lambda: len(recorder.jobs) == 1)
                assert time.monotonic() - started_at < 2
            assert recorder.jobs[0].attempts == 1 and recorder.jobs[0].payload == {"name": "cancelled"}
            done = await queue.get(recorder.jobs[0].id)
            assert done is not None and done.status == "done"

    run(scenario)


def test_the_app_runs_registered_handlers_and_reports_jobs_on_healthz(database_url: str) -> None:
    config = parse_config(
        {
            "storage": {"database_url": database_url},
            "jobs": {"workers": 1, "poll_seconds": 0.02},
            "tenants": [{"name": "acme", "api_keys": ["k"], "upstream": {"base_url": "http://x/v1"}}],
        },
        {},
    )
    handler = Recorder()
    deps = build_deps(config, handlers={"record": handler})

    async def enqueue() -> None:
        async with opened(database_url) as queue:
            await queue.enqueue(NewJob("record", "acme", {"n": 7}))

    with BackgroundServer(create_app(config, deps)) as server:
        asyncio.run(enqueue())
        deadline = time.monotonic() + 5
        while (health := httpx.get(f"{server.url}/healthz").json())["workers"]["done"] < 1:
            assert time.monotonic() < deadline, health
            time.sleep(0.01)
    assert health["jobs"] == {
        "queued": 0,
        "running": 0,
        "done": 1,
        "failed": 0,
        "oldest_queued_seconds": 0.0,
        "oldest_queued_seconds_by_kind": {},
    }
    assert health["workers"] == {
        "count": 1,
        "done": 1,
        "retried": 0,
        "failed": 0,
        "lost": 0,
        "released": 0,
        "yielded": 0,
        "postponed": 0,
        "requests_in_hand": 0,
    }
    assert handler.payloads == [7]
    asyncio.run(deps.aclose())


def _oldest_queued_metric(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        sample.labels["kind"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gateway_jobs_oldest_queued_seconds"
        for sample in family.samples
    }


def test_healthz_and_metrics_show_the_age_of_the_backlog(database_url: str) -> None:
    """With no worker running, a queued job ages on /healthz and /metrics; a delayed one (not due) does
    not count; once the job has run, the backlog's age is 0 on /healthz and absent from /metrics."""
    config = parse_config(
        {
            "storage": {"database_url": database_url},
            "jobs": {"workers": 0},
            "tenants": [{"name": "acme", "api_keys": ["k"], "upstream": {"base_url": "http://x/v1"}}],
        },
        {},
    )
    deps = build_deps(config)

    async def enqueue() -> None:
        async with opened(database_url) as queue:
            await queue.enqueue(NewJob("record", "acme", {"n": 1}))
            await queue.enqueue(NewJob("later", "acme", {"n": 2}, delay_seconds=600))

    async def run_it() -> None:
        async with opened(database_url) as queue:
            [job] = await queue.lease("w", ["record"], lease_seconds=5)
            assert await queue.complete(job, "w")

    with BackgroundServer(create_app(config, deps)) as server:
        empty = httpx.get(f"{server.url}/healthz").json()["jobs"]
        assert empty["oldest_queued_seconds"] == 0
        assert empty["oldest_queued_seconds_by_kind"] == {}
        assert _oldest_queued_metric(server.url) == {}

        asyncio.run(enqueue())
        time.sleep(0.3)
        jobs = httpx.get(f"{server.url}/healthz").json()["jobs"]
        assert jobs["queued"] == 2
        assert 0.2 <= jobs["oldest_queued_seconds"] < 60
        assert list(jobs["oldest_queued_seconds_by_kind"]) == ["record"]  # "later" is not due yet
        assert jobs["oldest_queued_seconds_by_kind"]["record"] == jobs["oldest_queued_seconds"]
        scraped = _oldest_queued_metric(server.url)
        assert list(scraped) == ["record"] and 0.2 <= scraped["record"] < 60

        asyncio.run(run_it())
        jobs = httpx.get(f"{server.url}/healthz").json()["jobs"]
        assert (jobs["queued"], jobs["done"]) == (1, 1)
        assert jobs["oldest_queued_seconds"] == 0
        assert jobs["oldest_queued_seconds_by_kind"] == {}
        assert _oldest_queued_metric(server.url) == {}
    asyncio.run(deps.aclose())


def test_done_jobs_are_pruned_after_their_retention(database_url: str) -> None:
    async def scenario() -> None:
        async with opened(database_url) as queue:
            for n in range(3):
                await queue.enqueue(NewJob("embed", "acme", {"n": n}))
            leased = await queue.lease("w1", ["embed"], 5, limit=2)
            for job in leased:
                assert await queue.complete(job, "w1")
            assert await queue.prune(3600) == 0  # done just now: kept for an hour
            await asyncio.sleep(0.2)
            assert await queue.prune(0.1) == 2
            assert await queue.counts() == {"queued": 1, "running": 0, "done": 0, "failed": 0}

    run(scenario)


def test_the_same_request_sent_again_queues_no_new_jobs(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """An identical request (a retry, a client resending) stores nothing new, so nothing is embedded
    again (issue 16 saw 1,580 embed jobs for 12,000 copies of one request)."""
    gateway = make_gateway([tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])])
    messages = [{"role": "user", "content": "Which port does ledger-api listen on?"}]
    client = gateway.client()
    first = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
    recorded(gateway, first.headers["x-gateway-request-id"])
    after_first = wait_for_jobs(gateway)["done"]
    assert after_first >= 1  # the exchange was indexed
    for _ in range(4):
        again = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        recorded(gateway, again.headers["x-gateway-request-id"])
    assert wait_for_jobs(gateway)["done"] == after_first
