"""Rolling task-state compaction: background jobs, exact coverage, branches, races, failures, on demand.

The fake upstream answers the gateway's summarisation calls deterministically: a chunk summary lists
every message it read as `#depth:first-word`, a merge the union of its inputs, so coverage can be checked
exactly.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.adapters.aiohttp_upstream import AiohttpUpstream
from gateway.adapters.sql.store import SqlStore
from gateway.adapters.sql.summaries import SqlSummaryStore
from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizers
from gateway.config import CompactionConfig, ContextConfig, UpstreamConfig
from gateway.fakes.openai_upstream import FakeUpstream, Reply
from gateway.fakes.server import BackgroundServer
from gateway.jobs.compact import CompactHandler, CompactionTarget
from gateway.jobs.prompts import CONDENSE_MARKER
from gateway.pipeline.canonical import chain_hashes, root_hash
from gateway.pipeline.compaction import CompactionPolicy
from gateway.records import AppendRequest, Job, NewMessage
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, tenant, wait_for_jobs

CONTEXT = {"budget_tokens": 1200, "recent_tokens": 300}
NO_RETRIEVAL = {"enabled": False}
COMPACTION = {"threshold_tokens": 200, "chunk_tokens": 300, "summary_tokens": 400}
JOBS = {"poll_seconds": 0.05, "retry_base_seconds": 0.1, "lease_seconds": 5}
SYSTEM = {"role": "system", "content": "You are terse."}


def folded(text: str) -> list[tuple[int, str]]:
    line = re.search(r"folded: ([^\n]*)", text)
    assert line is not None, text
    return [(int(d), w) for d, w in (entry[1:].split(":", 1) for entry in line.group(1).split())]


def turn_text(label: str, n: int) -> str:
    return f"{label}-turn-{n} please remember code {n * 7919 % 10007} and the file notes_{n}.md for later."


@pytest.fixture
def compacting(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(
        # Retrieval's default share would shrink the summary's under this small budget: not under test here.
        [tenant("acme", upstream.base_url, context=CONTEXT, compaction=COMPACTION, retrieval=NO_RETRIEVAL)],
        jobs=JOBS,
    )


def play(gateway: Gateway, messages: list[Any], label: str, turns: range) -> httpx.Headers:
    headers = httpx.Headers()
    for n in turns:
        messages.append({"role": "user", "content": turn_text(label, n)})
        raw = gateway.client().chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        headers = raw.headers
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        wait_for_jobs(gateway)
    return headers


def test_long_conversation_is_compacted_without_gaps_or_overlaps(
    compacting: Gateway, upstream: Upstream
) -> None:
    messages: list[Any] = [SYSTEM]
    headers = play(compacting, messages, "A", range(40))
    conversation_id = headers["x-conversation-id"]
    summaries = api(compacting, f"/conversations/{conversation_id}/summaries")
    globals_, chunks = summaries["global"], summaries["chunk"]
    assert len(globals_) >= 2, "the cursor should have moved more than once"
    for summary in globals_:
        # A rolling summary covers exactly the path root..its node: every message once, in order.
        assert [d for d, _ in folded(summary["content"])] == list(range(summary["depth"] + 1))
    previous = -1
    for chunk in sorted(chunks, key=lambda c: c["depth"]):
        depths = [d for d, _ in folded(chunk["content"])]
        assert depths == list(range(previous + 1, chunk["depth"] + 1))  # consecutive, disjoint ranges
        assert chunk["token_count"] > 0 and chunk["source_tokens"] > 0
        previous = chunk["depth"]

    report = api(compacting, f"/requests/{headers['x-gateway-request-id']}")["report"]
    used = report["sections"]["summary"]
    assert used["tokens"] > 0
    forwarded = upstream.fake.last_chat().body["messages"]
    assert forwarded[0] == SYSTEM
    assert forwarded[1]["role"] == "system" and "<gateway_context>" in forwarded[1]["content"]
    summary = next(s for s in globals_ if s["id"] == used["summary_id"])
    assert summary["content"] in forwarded[1]["content"]
    # The window starts right after the summarised node: nothing is sent twice.
    window_turns = [
        int(m["content"].split("-turn-")[1].split()[0]) for m in forwarded[2:] if m["role"] == "user"
    ]
    assert min(window_turns) * 2 >= summary["depth"] + 1
    assert window_turns == list(range(min(window_turns), 40))
    assert int(headers["x-context-tokens-sent"]) <= CONTEXT["budget_tokens"]


def test_request_never_waits_on_compaction(compacting: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue_summary(*(Reply(f"folded: #0:slow-{i}", delay=2.0) for i in range(3)))
    messages: list[Any] = [SYSTEM]
    slowest = 0.0
    for n in range(24):
        messages.append({"role": "user", "content": turn_text("A", n)})
        start = time.monotonic()
        answer = compacting.client().chat.completions.create(model="gpt-4o", messages=messages)
        slowest = max(slowest, time.monotonic() - start)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    assert upstream.fake.summary_calls >= 1, "compaction never started"
    assert slowest < 1.5, f"a chat request waited {slowest:.2f}s"
    wait_for_jobs(compacting, timeout=30)


def test_failed_summary_call_is_retried_and_never_corrupts(compacting: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue_summary(Reply(status=500), Reply(status=503))
    messages: list[Any] = [SYSTEM]
    headers = play(compacting, messages, "A", range(30))
    jobs = wait_for_jobs(compacting)
    assert jobs.get("failed", 0) == 0
    globals_ = api(compacting, f"/conversations/{headers['x-conversation-id']}/summaries")["global"]
    assert globals_, "the retried compaction should have produced a summary"
    for summary in globals_:
        assert [d for d, _ in folded(summary["content"])] == list(range(summary["depth"] + 1))


def test_branches_keep_separate_summaries(compacting: Gateway, upstream: Upstream) -> None:
    trunk: list[Any] = [SYSTEM]
    play(compacting, trunk, "A", range(30))
    branch = trunk[: 1 + 2 * 4]  # share the first four exchanges, then diverge
    play(compacting, branch, "B", range(4, 34))
    forwarded = upstream.fake.last_chat().body["messages"]
    injected = forwarded[1]["content"]
    assert "<gateway_context>" in injected
    words = [w for _, w in folded(injected)]
    a_turns = [int(w.split("-turn-")[1]) for w in words if w.startswith("A-turn-")]
    assert a_turns and max(a_turns) < 4, "branch B's summary folded messages of branch A"
    assert any(w.startswith("B-turn-") for w in words)


def test_compaction_on_demand_and_summaries_api_scoping(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [
            tenant("acme", upstream.base_url, context={"budget_tokens": 100_000, "recent_tokens": 200}),
            tenant("globex", upstream.base_url),
        ],
        jobs=JOBS,
    )
    messages: list[Any] = [SYSTEM]
    headers = play(gateway, messages, "A", range(8))  # fits the budget: no compaction on its own
    conversation_id = headers["x-conversation-id"]
    assert api(gateway, f"/conversations/{conversation_id}/summaries")["global"] == []
    url = f"{gateway.server.url}/api/conversations/{conversation_id}/compact"
    auth = {"Authorization": f"Bearer {GATEWAY_KEY}"}
    missing_model = httpx.post(url, headers=auth)
    assert missing_model.status_code == 400 and missing_model.json()["error"]["param"] == "model"
    response = httpx.post(url, headers=auth, json={"model": "cheap-model"})
    assert response.status_code == 202 and response.json()["queued"] is True
    wait_for_jobs(gateway)
    globals_ = api(gateway, f"/conversations/{conversation_id}/summaries")["global"]
    assert len(globals_) == 1 and folded(globals_[0]["content"])[0] == (0, "A-turn-0")
    assert globals_[0]["model"] == "cheap-model"
    other = httpx.get(
        f"{gateway.server.url}/api/conversations/{conversation_id}/summaries",
        headers={"Authorization": "Bearer sk-gw-globex"},
    )
    assert other.status_code == 404


@pytest.fixture
def summariser() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with BackgroundServer(fake.app()) as server:
        yield fake, f"{server.url}/v1"


def test_racing_workers_produce_one_summary(database_url: str, summariser: tuple[FakeUpstream, str]) -> None:
    fake, base_url = summariser
    tokenizers = TiktokenTokenizers()
    tokenizer = tokenizers.for_model("gpt-4o")

    async def scenario() -> None:
        seed = SqlStore.open(database_url)
        parent: str | None = None
        messages: list[NewMessage] = []
        path_tokens = 0
        root = root_hash("acme", "user", "")
        contents = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": turn_text("R", i)} for i in range(40)
        ]
        for depth, (message, node) in enumerate(zip(contents, chain_hashes(root, contents), strict=True)):
            tokens = tokenizer.count_message(message)
            path_tokens += tokens
            messages.append(
                NewMessage(node.hex(), parent, depth, str(message["role"]), message, tokens, path_tokens)
            )
            parent = node.hex()
        conversation_id = await seed.append(AppendRequest("acme", None, None, None, tuple(messages)))
        job = Job("job-1", "compact", "acme", {"conversation_id": conversation_id, "leaf_id": parent, "model": "m"},
                  None, 1, datetime.now(UTC))  # fmt: skip

        handlers = []
        for _ in range(2):  # separate engines, as two gateway processes would have
            store = SqlStore.open(database_url)
            upstream = AiohttpUpstream("acme", UpstreamConfig(base_url=base_url, api_key="k"))
            compaction = CompactionConfig(**COMPACTION)
            policy = CompactionPolicy.for_tenant(ContextConfig(**CONTEXT), compaction)
            target = CompactionTarget(upstream, compaction, policy)
            handlers.append(
                CompactHandler(store, SqlSummaryStore(store.engine), tokenizers, lambda _t, t=target: t)
            )
        await asyncio.gather(*(handler(job) for handler in handlers))
        summaries = SqlSummaryStore(seed.engine)
        globals_ = await summaries.summaries("acme", conversation_id, "global")
        chunks = await summaries.summaries("acme", conversation_id, "chunk")
        assert globals_ and len(globals_) == len(chunks)  # one writer's rows, not both
        assert len({g.node_id for g in globals_}) == len(globals_)
        assert [d for d, _ in folded(globals_[0].content)] == list(range(globals_[0].depth + 1))
        assert await summaries.cursor("acme", conversation_id) == (globals_[0].node_id, 1)

    asyncio.run(scenario())
    assert fake.summary_calls >= 2


def test_cli_compacts_a_stored_conversation(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Any
) -> None:
    from click.testing import CliRunner

    from gateway.cli import main

    context = {"budget_tokens": 100_000, "recent_tokens": 200}
    # No workers here: no embed jobs either, or they would wait for ever.
    tenants = [tenant("acme", upstream.base_url, context=context, retrieval=NO_RETRIEVAL)]
    gateway = make_gateway(tenants, jobs={**JOBS, "workers": 0})  # this gateway runs no jobs itself
    messages: list[Any] = [SYSTEM]
    headers = play(gateway, messages, "C", range(8))
    config = tmp_path / "config.json"
    storage = {"database_url": gateway.config.storage.database_url, "data_dir": str(tmp_path / "data")}
    config.write_text(json.dumps({"storage": storage, "jobs": JOBS, "tenants": tenants}))
    result = CliRunner().invoke(
        main,
        [
            "compact",
            "--config",
            str(config),
            "--tenant",
            "acme",
            "--model",
            "m",
            headers["x-conversation-id"],
        ],
    )
    assert result.exit_code == 0, result.output
    assert "compaction queued" in result.output
    assert folded(result.output)[0] == (0, "C-turn-0")
    args = ["compact", "--config", str(config), "--tenant", "acme", "--model", "m", "nope"]
    missing = CliRunner().invoke(main, args)
    assert missing.exit_code != 0 and "no conversation 'nope'" in missing.output


def test_rolling_summary_over_its_allowance_is_rebuilt_from_chunk_summaries(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    # The fake's summaries grow with what they fold, so a small allowance forces recompaction.
    compaction = {**COMPACTION, "summary_tokens": 120, "chunk_tokens": 200}
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, context=CONTEXT, compaction=compaction)], jobs=JOBS
    )
    headers = play(gateway, [SYSTEM], "A", range(40))
    condensed = [
        r for r in upstream.fake.received if str(r.body["messages"][0]["content"]).startswith(CONDENSE_MARKER)
    ]
    assert condensed, "the rolling summary never outgrew its allowance"
    assert all(
        len(r.body["messages"][1]["content"]) < 4_000 for r in condensed
    )  # each call reads a bounded input
    globals_ = api(gateway, f"/conversations/{headers['x-conversation-id']}/summaries")["global"]
    for summary in globals_:
        assert [d for d, _ in folded(summary["content"])] == list(range(summary["depth"] + 1))


def test_thin_mode_clients_get_the_summary_too(compacting: Gateway, upstream: Upstream) -> None:
    client = compacting.client(default_headers={"X-Conversation-Id": "thin-compacted"})
    for n in range(40):
        client.chat.completions.create(
            model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": turn_text("T", n)}]
        )  # type: ignore[list-item]
        wait_for_jobs(compacting)
    forwarded = upstream.fake.last_chat().body["messages"]
    assert forwarded[1]["role"] == "system" and "<gateway_context>" in forwarded[1]["content"]
    depths = [d for d, _ in folded(forwarded[1]["content"])]
    assert depths == list(range(len(depths)))
    first_window_turn = next(m for m in forwarded[2:] if m["role"] == "user")["content"]
    assert int(first_window_turn.split("-turn-")[1].split()[0]) * 2 >= len(depths)  # nothing sent twice


def test_a_summary_too_long_to_send_does_not_queue_a_compaction_every_answer(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The stored summary is over its allowance (the fake's summaries are longer than 40 tokens), so it is
    never sent; the path it covers still counts when an answer asks whether to compact, so compaction
    jobs run when there is something to fold (each one stores a summary), not after every answer."""
    compaction = {**COMPACTION, "summary_tokens": 40}
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, context=CONTEXT, compaction=compaction, retrieval=NO_RETRIEVAL)],
        jobs=JOBS,
    )
    headers = play(gateway, [SYSTEM], "A", range(40))
    report = api(gateway, f"/requests/{headers['x-gateway-request-id']}")["report"]
    assert report["sections"]["summary"]["skipped"] == "over allowance"
    globals_ = api(gateway, f"/conversations/{headers['x-conversation-id']}/summaries")["global"]
    assert len(globals_) >= 2, "compaction should still have run"
    runs = {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(httpx.get(f"{gateway.server.url}/metrics").text)
        for sample in family.samples
        if sample.name == "gateway_job_runs_total" and sample.labels["kind"] == "compact"
    }
    # Nearly every job folded something (one global summary each); a few find the fold just short of the
    # threshold, which the handler measures at an exchange boundary. Judged by what was sent, 24 jobs
    # ran for 8 summaries here.
    assert runs["done"] - len(globals_) <= 3, (runs, len(globals_))
