"""Bulk indexing: a long history that arrives in one request is indexed in bounded jobs, texts first,
newest first, with its progress visible; first the embed handler over the real SQL store and queue (a
shipped fake embedder and index, to see each job's work), then end to end through the real gateway with
the real local embedder and LanceDB and a lease far shorter than the whole import takes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.adapters.sql.store import SqlStore
from gateway.fakes.embedder import HashingEmbedder
from gateway.fakes.memory_index import MemoryIndex
from gateway.jobs.embed import (
    BATCH_CHARS,
    TEXT_CHUNK_MESSAGES,
    TEXT_COST_CHARS,
    EmbedHandler,
    IndexTarget,
)
from gateway.jobs.neighbour_vectors import composed_all
from gateway.records import EMBED, AppendRequest, EmbedWork, IndexBacklog, NewMessage, embed_key_prefix
from gateway.verify import verify_tenant
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, recorded, tenant, wait_for_jobs
from tests.test_metrics import scrape, value

# The model and LanceDB are what these tests are about.
pytestmark = pytest.mark.real


def chain(count: int) -> list[NewMessage]:
    messages: list[NewMessage] = []
    for depth in range(count):
        role = "user" if depth % 2 == 0 else "assistant"
        text = f"message {depth} about topic{depth}"
        parent = messages[-1].id if messages else None
        messages.append(
            NewMessage(f"{depth:032x}", parent, depth, role, {"role": role, "content": text}, 5, 0)
        )
    return messages


async def run_one(store: SqlStore, handler: EmbedHandler) -> None:
    """Lease, run and complete the next embed job."""
    job = (await store.jobs.lease("w", [EMBED], 60))[0]
    await handler(job)
    assert await store.jobs.complete(job, "w")


async def run_all(store: SqlStore, handler: EmbedHandler) -> None:
    """Run embed jobs, one at a time, until none is left."""
    while jobs := await store.jobs.lease("w", [EMBED], 60):
        await handler(jobs[0])
        assert await store.jobs.complete(jobs[0], "w")


def test_a_long_stretch_is_indexed_in_bounded_jobs_texts_then_alone_then_with_neighbours_newest_first(
    database_url: str,
) -> None:
    """`retrieval.neighbour_vectors: model`: the views with neighbours are embedded, in a last pass."""

    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            messages = chain(300)
            conversation_id = await store.append(AppendRequest("acme", None, "u1", None, tuple(messages)))
            embedder, index = HashingEmbedder(16), MemoryIndex()
            target = IndexTarget(embedder, index, batch_messages=50, neighbour_vectors="model")
            handler = EmbedHandler(store, {"acme": target}.get, store.jobs)
            await store.jobs.enqueue(EmbedWork(conversation_id, messages[-1].id, 300).job("acme"))

            async def backlog() -> IndexBacklog:
                pending = await store.jobs.pending(EMBED, embed_key_prefix(conversation_id), "acme")
                return IndexBacklog.of(pending)

            def embedded(view: str) -> list[int]:
                return sorted(
                    r.row.depth for r in index.rows.values() if r.unit is not None and r.row.view == view
                )

            assert await backlog() == IndexBacklog(unsearchable=300, unembedded=300)
            passes: list[tuple[list[int], list[int]]] = []
            while jobs := await store.jobs.lease("w", [EMBED], 60):
                job = jobs[0]
                before = len(embedder.calls)
                await handler(job)
                assert await store.jobs.complete(job, "w")
                # One bounded batch per job: 150 texts at most (one view of 150 messages, two of 75).
                assert len(embedder.calls) == before + 1
                assert len(embedder.calls[-1]) <= 150
                passes.append((embedded("m"), embedded("w")))
                if len(passes) == 1:
                    # After the first job every message is findable by keyword, the newest 150 by meaning
                    # (alone): no view with neighbours yet.
                    assert {r.row.node_id for r in index.rows.values()} == {m.id for m in messages}
                    assert passes[0] == (list(range(150, 300)), [])
                    assert await backlog() == IndexBacklog(unsearchable=0, unembedded=150, alone=150)
                if len(passes) == 2:
                    assert passes[1] == (list(range(300)), [])
                    assert await backlog() == IndexBacklog(alone=300)
            assert len(passes) == 2 + 4  # one view of 300 messages, 150 a job; then the other two, 75 a job
            # Newest first: each job with neighbours reached further back than the one before.
            reach = [min(w) for _, w in passes[2:]]
            assert reach == [224, 149, 74, 0]
            assert all(r.unit is not None for r in index.rows.values())
            # Every message in every view it has: "m" for all, "p" and "w" from the second on.
            views = {(r.row.node_id, r.row.view) for r in index.rows.values()}
            assert len(views) == 300 + 299 + 299
            assert not await backlog()
            assert (await store.jobs.counts())["failed"] == 0
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_composed_neighbour_vectors_index_a_long_stretch_in_one_pass_of_own_views(database_url: str) -> None:
    """The default: the model embeds each message's own view (and the two before each job's stretch,
    which its first views join); the views with neighbours get their members' vectors summed and
    normalised, in the same job and the same write. No pass is left after the own views."""

    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            messages = chain(300)
            conversation_id = await store.append(AppendRequest("acme", None, "u1", None, tuple(messages)))
            embedder, index = HashingEmbedder(16), MemoryIndex()
            target = IndexTarget(embedder, index, batch_messages=50)
            assert target.neighbour_vectors == "composed"
            handler = EmbedHandler(store, {"acme": target}.get, store.jobs)
            await store.jobs.enqueue(EmbedWork(conversation_id, messages[-1].id, 300).job("acme"))
            await run_one(store, handler)
            pending = await store.jobs.pending(EMBED, embed_key_prefix(conversation_id), "acme")
            # The newest 150 are found by meaning in all three views; no pass with neighbours is owed.
            assert IndexBacklog.of(pending) == IndexBacklog(unembedded=150)
            with_vectors = {(r.row.depth, r.row.view) for r in index.rows.values() if r.unit is not None}
            assert with_vectors == {(d, v) for d in range(150, 300) for v in "mp"} | {
                (d, "w") for d in range(149, 299)
            }
            await run_all(store, handler)
            # Own views only: 150 a job, and the two messages before the first job's stretch.
            assert [len(call) for call in embedder.calls] == [152, 150]
            m = {r.row.depth: r.row.vector for r in index.rows.values() if r.row.view == "m"}
            for held in index.rows.values():
                depth, view = held.row.depth, held.row.view
                members = {"m": [depth], "p": [depth - 1, depth], "w": [depth - 1, depth, depth + 1]}[view]
                found = [m[d] or [] for d in members if d in m]
                expected = composed_all(found, [range(len(found))])[0]
                assert held.row.vector is not None
                assert max(abs(a - b) for a, b in zip(held.row.vector, expected, strict=True)) < 1e-6
            exchange = chain(302)[300:]
            await store.append(AppendRequest("acme", conversation_id, "u1", None, tuple(exchange)))
            await store.jobs.enqueue(EmbedWork(conversation_id, exchange[-1].id, 2).job("acme"))
            await run_all(store, handler)
            # The exchange: its two messages' own views and the two before them, for its joined views.
            assert len(embedder.calls[-1]) == 4
            verified = await verify_tenant("acme", store, store.jobs, index)
            assert verified.index_rows == 302 + 301 + 301 and verified.rows_without_vector == 0
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_without_neighbour_vectors_only_each_messages_own_view_is_embedded(database_url: str) -> None:
    """`retrieval.neighbour_vectors: false`: a long stretch and a later exchange are embedded one text a
    message; the views with neighbours are written as texts (found by keyword) and no pass is left."""

    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            messages = chain(300)
            conversation_id = await store.append(AppendRequest("acme", None, "u1", None, tuple(messages)))
            embedder, index = HashingEmbedder(16), MemoryIndex()
            target = IndexTarget(embedder, index, batch_messages=50, neighbour_vectors="off")
            handler = EmbedHandler(store, {"acme": target}.get, store.jobs)

            await store.jobs.enqueue(EmbedWork(conversation_id, messages[-1].id, 300).job("acme"))
            await run_one(store, handler)
            pending = await store.jobs.pending(EMBED, embed_key_prefix(conversation_id), "acme")
            # No pass with neighbours is owed: the newest 150 are done, 150 wait for their own view.
            assert IndexBacklog.of(pending) == IndexBacklog(unembedded=150)
            await run_all(store, handler)
            # 300 texts, 150 a job (the bound is three views of 50 messages), and nothing after them.
            assert [len(call) for call in embedder.calls] == [150, 150]
            exchange = chain(302)[300:]
            await store.append(AppendRequest("acme", conversation_id, "u1", None, tuple(exchange)))
            await store.jobs.enqueue(EmbedWork(conversation_id, exchange[-1].id, 2).job("acme"))
            await run_all(store, handler)
            assert len(embedder.calls[-1]) == 2  # the exchange: its two messages' own views
            held = {(r.row.node_id, r.row.view): r.unit is not None for r in index.rows.values()}
            assert len(held) == 302 + 301 + 301  # every view is there, by keyword at least
            assert all(has for (_, view), has in held.items() if view == "m")
            assert not any(has for (_, view), has in held.items() if view != "m")
            pending = await store.jobs.pending(EMBED, embed_key_prefix(conversation_id), "acme")
            assert not IndexBacklog.of(pending)
            # `verify` asks vectors of the own views only; with the setting on, the others would be owed.
            verified = await verify_tenant("acme", store, store.jobs, index, neighbour_vectors=False)
            # (This chain's ids are not chain hashes: only the index's part is read.)
            assert verified.index_rows == 904 and verified.rows_without_vector == 0
            strict = await verify_tenant("acme", store, store.jobs, index)
            assert strict.rows_without_vector == 602
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_texts_of_a_very_long_stretch_go_in_chunks_too(database_url: str) -> None:
    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            total = TEXT_CHUNK_MESSAGES + 30
            messages = chain(total)
            conversation_id = await store.append(AppendRequest("acme", None, None, None, tuple(messages)))
            index = MemoryIndex()
            handler = EmbedHandler(
                store, {"acme": IndexTarget(HashingEmbedder(8), index, 100)}.get, store.jobs
            )
            await store.jobs.enqueue(EmbedWork(conversation_id, messages[-1].id, total).job("acme"))
            job = (await store.jobs.lease("w", [EMBED], 60))[0]
            await handler(job)
            await store.jobs.complete(job, "w")
            pending = await store.jobs.pending(EMBED, embed_key_prefix(conversation_id), "acme")
            modes = sorted((p["mode"], p["count"]) for p in pending)
            # The first job embedded the newest 300 messages' own views (100 messages' worth of texts)
            # and composed their views with neighbours.
            assert modes == [("texts", 30), ("vectors", total - 300)]
            assert IndexBacklog.of(pending) == IndexBacklog(unsearchable=30, unembedded=total - 300)
            alone = {r.row.node_id for r in index.rows.values() if r.row.view == "m"}
            assert alone == {m.id for m in messages[-TEXT_CHUNK_MESSAGES:]}
        finally:
            await store.aclose()

    asyncio.run(scenario())


IDENTIFIERS = ["KX-4471-QZ", "billing_reconcile_v2.py", "ERR_LEDGER_0x5F3A"]


def long_history(exchanges: int) -> list[dict[str, Any]]:
    """A chat of `exchanges` exchanges; three exact identifiers are planted in the first 50 turns."""
    topics = ["the garden", "a novel", "the weekend hike", "bread baking", "a podcast", "the football match"]
    out: list[dict[str, Any]] = []
    for i in range(exchanges):
        topic = topics[i % len(topics)]
        user = f"Turn {i}: tell me more about {topic}, please."
        if i in (3, 11, 20):
            user = f"Remember this for later: the reference is {IDENTIFIERS[(i > 3) + (i > 11)]}."
        out.append({"role": "user", "content": user})
        out.append({"role": "assistant", "content": f"Of course. On {topic}, here are a few thoughts ({i})."})
    return out


def conversation_index(gateway: Gateway, conversation_id: str) -> dict[str, Any]:
    index: dict[str, Any] = api(gateway, f"/conversations/{conversation_id}")["index"]
    return index


def test_a_700_message_history_in_one_request_is_fully_indexed_under_a_short_lease(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": 2_000},
                compaction={"enabled": False},
                retrieval={"index_batch_messages": 24},
            )
        ],
        # Far shorter than indexing 700 messages takes here (tens of seconds): only bounded jobs finish.
        jobs={"lease_seconds": 8, "max_attempts": 1},
    )
    client = gateway.client()
    history = [*long_history(349), {"role": "user", "content": "Thanks, that was a lot."}]
    assert len(history) == 699
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    conversation_id = raw.headers["x-conversation-id"]
    answer = raw.parse().choices[0].message.content

    # Texts first: every message is findable by keyword long before the vectors are all there.
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        samples.append(conversation_index(gateway, conversation_id))
        if samples[-1]["searchable"] == samples[-1]["messages"]:
            break
        time.sleep(0.05)
    partial = samples[-1]
    assert partial["messages"] == 700 and partial["searchable"] == 700
    assert partial["embedded"] < 700 and not partial["complete"]
    health = httpx.get(f"{gateway.server.url}/healthz").json()
    assert health["indexing"]["conversations"] == 1 and health["indexing"]["unembedded"] > 0

    # Asked now, a question naming no term is still asked over the old messages (their vectors are not
    # there to score it by meaning): the keyword search finds the planted turns.
    history += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Which reference did I ask you to remember for later?"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    answer = raw.parse().choices[0].message.content
    sent = "\n".join(str(m["content"]) for m in upstream.fake.last_chat().body["messages"][:-1])
    assert "Remember this for later: the reference is" in sent
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    assert report["sections"]["retrieval"]["index_backlog"]["unembedded"] > 0

    # An identifier from turn 20 is found by keyword, and the report says the search ran over a partly
    # indexed conversation.
    history += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": f"What did I say about {IDENTIFIERS[2]}?"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    answer = raw.parse().choices[0].message.content
    sent = "\n".join(str(m["content"]) for m in upstream.fake.last_chat().body["messages"][:-1])
    assert f"the reference is {IDENTIFIERS[2]}" in sent
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    backlog = report["sections"]["retrieval"]["index_backlog"]
    assert backlog["unembedded"] + backlog["without_neighbours"] > 0

    jobs = wait_for_jobs(gateway, timeout=300)
    assert jobs["failed"] == 0  # no job was cancelled for its size (max_attempts 1: one timeout fails it)
    health = httpx.get(f"{gateway.server.url}/healthz").json()
    assert health["workers"]["retried"] == 0 and health["workers"]["failed"] == 0
    assert health["indexing"] == {
        "conversations": 0,
        "unsearchable": 0,
        "unembedded": 0,
        "without_neighbours": 0,
    }
    done = conversation_index(gateway, conversation_id)
    assert done == {
        "messages": 704,
        "searchable": 704,
        "embedded": 704,
        "with_neighbours": 704,
        "complete": True,
    }
    # Progress only ever went forward.
    embedded = [s["embedded"] for s in samples]
    assert embedded == sorted(embedded)

    # Fully indexed: the identifier planted in turn 3 comes back, verbatim, in the turn it was said.
    history += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": f"Remind me, where did {IDENTIFIERS[0]} come up?"},
    ]
    client.chat.completions.create(model="gpt-4o", messages=history)
    sent = "\n".join(str(m["content"]) for m in upstream.fake.last_chat().body["messages"][:-1])
    assert f"the reference is {IDENTIFIERS[0]}" in sent


def test_jobs_of_long_messages_are_bounded_by_their_texts_size(database_url: str) -> None:
    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            messages = [
                replace(m, data={"role": m.role, "content": f"{m.data['content']} " + "word " * 500})
                for m in chain(40)
            ]
            conversation_id = await store.append(AppendRequest("acme", None, None, None, tuple(messages)))
            embedder, index = HashingEmbedder(8), MemoryIndex()
            handler = EmbedHandler(store, {"acme": IndexTarget(embedder, index, 64)}.get, store.jobs)
            await store.jobs.enqueue(EmbedWork(conversation_id, messages[-1].id, 40).job("acme"))
            first = True
            while jobs := await store.jobs.lease("w", [EMBED], 60):
                await handler(jobs[0])
                await store.jobs.complete(jobs[0], "w")
                if first:  # texts first, here too: every message findable by keyword after one job
                    assert len({r.row.node_id for r in index.rows.values() if r.row.view == "m"}) == 40
                    first = False
            # 40 messages of ~2,500 characters: far past BATCH_CHARS in one job, so several jobs, each
            # within it (its texts counted up to TEXT_COST_CHARS each, as the models read no further).
            assert len(embedder.calls) > 3
            for texts in embedder.calls:
                assert sum(min(len(t), TEXT_COST_CHARS) for t in texts) <= BATCH_CHARS
            assert len({r.row.node_id for r in index.rows.values() if r.unit is not None}) == 40
        finally:
            await store.aclose()

    asyncio.run(scenario())


def exchange_jobs(conversation_id: str, messages: list[NewMessage], size: int = 2) -> list[EmbedWork]:
    """One "all" job per exchange of `size` messages, as the persist step queues them, oldest first."""
    return [
        EmbedWork(conversation_id, messages[end - 1].id, size) for end in range(size, len(messages) + 1, size)
    ]


async def queued_exchanges(
    store: SqlStore, count: int
) -> tuple[str, list[NewMessage], HashingEmbedder, MemoryIndex, EmbedHandler]:
    """A conversation of `count` messages whose exchanges each queued an embed job, none run yet, and
    the handler that runs them (a shipped fake embedder and index, to see each job's work)."""
    messages = chain(count)
    conversation_id = await store.append(AppendRequest("acme", None, "u1", None, tuple(messages)))
    embedder, index = HashingEmbedder(8), MemoryIndex()
    handler = EmbedHandler(store, {"acme": IndexTarget(embedder, index)}.get, store.jobs)
    for work in exchange_jobs(conversation_id, messages):
        await store.jobs.enqueue(work.job("acme"))
    return conversation_id, messages, embedder, index, handler


def test_a_conversations_queued_exchanges_are_embedded_by_one_job(database_url: str) -> None:
    """Five exchanges queued one job each before any ran (a conversation busier than the workers): the
    first job to run takes the other four (one embedding call, one index write), the queue holds none of
    them afterwards, and the job's stored payload covers all ten messages, so a retry would too."""

    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            conversation_id, messages, embedder, index, handler = await queued_exchanges(store, 10)
            job = (await store.jobs.lease("w", [EMBED], 60))[0]
            assert job.payload["leaf_id"] == messages[1].id and job.worker == "w"
            await handler(job)
            assert await store.jobs.complete(job, "w")
            assert len(embedder.calls) == 1
            assert {r.row.node_id for r in index.rows.values() if r.unit is not None} == {
                m.id for m in messages
            }
            assert await store.jobs.pending(EMBED, embed_key_prefix(conversation_id), "acme") == []
            state = await store.jobs.get(job.id)
            assert state is not None and state.payload["leaf_id"] == messages[-1].id
            assert state.payload["count"] == 10
            assert await store.jobs.lease("w", [EMBED], 60) == []
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_jobs_of_another_branch_or_leased_elsewhere_are_left_alone(database_url: str) -> None:
    """Absorbing takes only what joins this job's stretch on its branch and is still queued: a branch's
    exchange keeps its job, a job another worker leased meanwhile stays that worker's, and a job whose
    lease was lost absorbs nothing."""

    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            messages = chain(8)
            conversation_id = await store.append(AppendRequest("acme", None, "u1", None, tuple(messages)))
            # A branch off message 3: the client edited message 4 and got another answer.
            fork = [
                NewMessage("b" * 32, messages[3].id, 4, "user", {"role": "user", "content": "edited"}, 3, 0),
                NewMessage(
                    "c" * 32, "b" * 32, 5, "assistant", {"role": "assistant", "content": "other"}, 3, 0
                ),
            ]
            await store.append(AppendRequest("acme", conversation_id, "u1", None, tuple(fork)))
            embedder, index = HashingEmbedder(8), MemoryIndex()
            handler = EmbedHandler(store, {"acme": IndexTarget(embedder, index)}.get, store.jobs)
            works = exchange_jobs(conversation_id, messages)  # leaves 1, 3, 5, 7
            for work in works:
                await store.jobs.enqueue(work.job("acme"))
            branch = EmbedWork(conversation_id, "c" * 32, 2)
            await store.jobs.enqueue(branch.job("acme"))
            first = (await store.jobs.lease("w1", [EMBED], 60))[0]
            second = (await store.jobs.lease("w2", [EMBED], 60))[0]  # leaf 3, now running elsewhere
            assert second.payload["leaf_id"] == messages[3].id
            # The branch job was queued last: its path is the one read first, and this job is not on it.
            await handler(first)
            assert await store.jobs.complete(first, "w1")
            assert len(embedder.calls) == 1 and len(embedder.calls[0]) < 6  # its own exchange alone
            queued = {
                p["leaf_id"] for p in await store.jobs.pending(EMBED, embed_key_prefix(conversation_id))
            }
            assert queued == {messages[3].id, messages[5].id, messages[7].id, "c" * 32}
            # The branch's job absorbs nothing of the main line; the main line's next job takes the last.
            third = (await store.jobs.lease("w1", [EMBED], 60))[0]
            assert third.payload["leaf_id"] == messages[5].id
            await handler(third)
            assert await store.jobs.complete(third, "w1")
            remaining = await store.jobs.queued(EMBED, embed_key_prefix(conversation_id), "acme")
            assert [p["leaf_id"] for _, p in remaining] == ["c" * 32]
            state = await store.jobs.get(third.id)
            assert state is not None and (state.payload["leaf_id"], state.payload["count"]) == (
                messages[7].id,
                4,
            )
            # A lease lost (expired and taken again) absorbs nothing and rewrites nothing.
            stale = replace(second, attempts=second.attempts + 5)
            assert await store.jobs.absorb(stale, [branch.job("acme").key or ""], {"x": 1}) == []
            state = await store.jobs.get(second.id)
            assert state is not None and state.payload == second.payload
            assert len(await store.jobs.queued(EMBED, embed_key_prefix(conversation_id), "acme")) == 1
            # The branch forks at this job's leaf: its exchange joins this stretch, so it is taken.
            await handler(second)
            assert await store.jobs.complete(second, "w2")
            state = await store.jobs.get(second.id)
            assert state is not None and (state.payload["leaf_id"], state.payload["count"]) == ("c" * 32, 4)
            assert await store.jobs.lease("w1", [EMBED], 60) == []
            embedded = {r.row.node_id for r in index.rows.values() if r.unit is not None}
            assert embedded == {m.id for m in messages} | {"b" * 32, "c" * 32}
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_a_job_that_absorbed_others_and_failed_does_all_of_it_on_retry(database_url: str) -> None:
    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            _, messages, embedder, index, handler = await queued_exchanges(store, 6)
            job = (await store.jobs.lease("w", [EMBED], 60))[0]
            embedder.fail = True
            try:
                await handler(job)
            except Exception as exc:  # the worker pool records it and retries
                await store.jobs.fail(job, "w", str(exc), 0.0)
            else:
                raise AssertionError("the embedder was told to fail")
            # Findable by keyword meanwhile: every absorbed message's text was written.
            assert {r.row.node_id for r in index.rows.values()} == {m.id for m in messages}
            embedder.fail = False
            retry = (await store.jobs.lease("w", [EMBED], 60))[0]
            assert retry.id == job.id and retry.payload["count"] == 6
            await handler(retry)
            assert await store.jobs.complete(retry, "w")
            assert {r.row.node_id for r in index.rows.values() if r.unit is not None} == {
                m.id for m in messages
            }
            assert await store.jobs.lease("w", [EMBED], 60) == []
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_exchanges_queued_while_no_worker_ran_are_indexed_by_one_job(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """Through the real gateway: five exchanges of one conversation are served by a process that runs no
    jobs (a front replica), then a process with a worker on the same database and index takes them: one
    embed job indexes all ten messages, and `/metrics` counts the four it absorbed."""
    acme = tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], compaction={"enabled": False})
    front = make_gateway([acme], jobs={"workers": 0})
    client = front.client()
    history: list[dict[str, Any]] = []
    conversation_id = ""
    for turn in range(5):
        history.append({"role": "user", "content": f"Question {turn}: what about ledger KX-{turn}?"})
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
        conversation_id = raw.headers["x-conversation-id"]
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    assert conversation_index(front, conversation_id)["searchable"] == 0
    back = make_gateway([acme], jobs={"workers": 1})
    wait_for_jobs(back)
    assert conversation_index(back, conversation_id) == {
        "messages": 10,
        "searchable": 10,
        "embedded": 10,
        "with_neighbours": 10,
        "complete": True,
    }
    metrics = {
        (sample.labels.get("kind"), sample.labels.get("outcome")): sample.value
        for family in text_string_to_metric_families(httpx.get(f"{back.server.url}/metrics").text)
        for sample in family.samples
        if sample.name == "gateway_job_runs_total"
    }
    assert metrics[("embed", "absorbed")] == 4 and metrics[("embed", "done")] == 1


def unindexed_gateway(make_gateway: Callable[..., Gateway], upstream: Upstream, **retrieval: Any) -> Gateway:
    """A gateway whose jobs never run (no worker): every history it is sent stays out of the index."""
    return make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": 2_000},
                compaction={"enabled": False},
                retrieval=retrieval,
            )
        ],
        jobs={"workers": 0},
    )


def test_a_question_asked_before_the_index_wrote_a_history_is_ranked_over_the_history_in_hand(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """No job runs here (a separate worker not started yet, or one busy with other conversations): the
    history that arrived in one request is in no index, and its questions still find their turns, ranked
    by keyword over the history the request holds, as the index's three views would rank them."""
    gateway = unindexed_gateway(make_gateway, upstream)
    client = gateway.client()
    history = [*long_history(200), {"role": "user", "content": f"Where did {IDENTIFIERS[1]} come up?"}]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    sent = "\n".join(str(m["content"]) for m in upstream.fake.last_chat().body["messages"][:-1])
    assert f"the reference is {IDENTIFIERS[1]}" in sent
    # Ranked, not resent (the whole budget: no vector scores the history yet, so it is asked as a match).
    assert len(sent) < len("\n".join(str(m["content"]) for m in history)) // 2
    recorded(gateway, raw.headers["x-gateway-request-id"])  # stored just after the answer
    retrieval = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]["sections"][
        "retrieval"
    ]
    assert retrieval["keyword_in_hand"] is True
    conversation_id = raw.headers["x-conversation-id"]
    assert conversation_index(gateway, conversation_id)["searchable"] == 0

    # Asked again, the history is stored and its job queued, not run: the backlog says so.
    history += [
        {"role": "assistant", "content": raw.parse().choices[0].message.content},
        {"role": "user", "content": f"And where did {IDENTIFIERS[2]} come up?"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    sent = "\n".join(str(m["content"]) for m in upstream.fake.last_chat().body["messages"][:-1])
    assert f"the reference is {IDENTIFIERS[2]}" in sent
    retrieval = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]["sections"][
        "retrieval"
    ]
    assert retrieval["index_backlog"]["unsearchable"] >= 400
    assert retrieval["keyword_in_hand"] is True


@pytest.mark.parametrize("meaning_in_hand", [True, False])
def test_a_question_asked_before_the_history_has_vectors_is_ranked_by_meaning_in_hand(
    upstream: Upstream, make_gateway: Callable[..., Gateway], meaning_in_hand: bool
) -> None:
    """A question that shares no word with its answer, asked before any vector of the history exists:
    static word-piece vectors rank the history in hand by meaning (`retrieval.meaning_in_hand`), so
    the answer is found; with them turned off only keywords rank it, and it is not."""
    gateway = unindexed_gateway(make_gateway, upstream, meaning_in_hand=meaning_in_hand)
    violin = "By the way, I started violin lessons with a teacher called Anna last week."
    history = long_history(200)
    history[14] = {"role": "user", "content": violin}
    question = {"role": "user", "content": "Which musical instrument am I learning to play?"}
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[*history, question]
    )
    sent = "\n".join(str(m["content"]) for m in upstream.fake.last_chat().body["messages"][:-1])
    assert (violin in sent) is meaning_in_hand
    assert len(sent) < len("\n".join(str(m["content"]) for m in history)) // 2  # ranked, not resent
    recorded(gateway, raw.headers["x-gateway-request-id"])  # stored just after the answer
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    assert report["sections"]["retrieval"].get("meaning_in_hand", False) is meaning_in_hand
    # What the ranking keeps for the next question over this history is shown in /metrics.
    held = scrape(gateway)
    for cache in ("static_pieces", "static_histories"):
        assert (value(held, "gateway_cache_bytes", cache=cache, owner="acme") > 0) is meaning_in_hand
