"""Retrieval end to end: the real gateway, real LanceDB in a temp directory, the real local embedder,
driven by the official SDK; what counts is what the fake upstream received."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from gateway.adapters.lance_index import LanceIndex
from gateway.fakes.openai_upstream import Reply
from gateway.pipeline.context.retrieval import SPEAKER_GROUPED
from gateway.records import SearchQuery
from gateway.wiring import index_table
from tests.conftest import GATEWAY_KEY, Clock, Gateway, Upstream, api, recorded, tenant, wait_for_jobs

TOPICS = [
    "the weather in Lisbon was mild and sunny all week",
    "we compared three sourdough recipes and their hydration",
    "the football match went to extra time before a late goal",
    "a long walk along the river with the dog after lunch",
    "notes on a novel about a lighthouse keeper and his brother",
    "planning a birthday dinner with pasta and a lemon tart",
    "the garden needs new tomato stakes before the summer",
    "a podcast episode about the history of Roman roads",
]
SMALL = {"budget_tokens": 400}
# Each test runs once on the real model and LanceDB; budgeting-only tests run on the shipped fakes (the
# model changes nothing there), and tests of meaning run with the multilingual model too.
REAL = pytest.mark.real
MINILM = pytest.param(None, marks=REAL, id="minilm")
E5 = pytest.param("multilingual-e5-small-q4", marks=REAL, id="e5")
FAKE = pytest.param("fake", id="fake")
BUDGETING_ONLY = pytest.mark.budgeting_only
MEANING = pytest.mark.meaning


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "embedder_model" in metafunc.fixturenames:
        definition = metafunc.definition
        if definition.get_closest_marker("budgeting_only") is not None:
            models = [FAKE]
        elif definition.get_closest_marker("meaning") is not None:
            models = [MINILM, E5]
        else:
            models = [MINILM]
        metafunc.parametrize("embedder_model", models)


@pytest.fixture
def make_gateway(embedder_model: str | None, make_gateway: Callable[..., Gateway]) -> Callable[..., Gateway]:
    def factory(tenants: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Gateway:
        for t in tenants:
            embedder = t.setdefault("retrieval", {}).setdefault("embedder", {})
            if embedder_model == "fake":
                embedder.setdefault("provider", "fake")
            else:
                embedder.setdefault("model", embedder_model)
        return make_gateway(tenants, *args, **kwargs)

    return factory


NO_SUMMARIES = {"enabled": False}


def filler(count: int, offset: int = 0) -> list[dict[str, Any]]:
    """`count` user/assistant exchanges about everyday things (no codes, no numbers)."""
    out: list[dict[str, Any]] = []
    for i in range(offset, offset + count):
        topic = TOPICS[i % len(TOPICS)]
        out.append({"role": "user", "content": f"Let us talk about this: {topic}."})
        out.append({"role": "assistant", "content": f"Happy to. About {topic}, there is a lot to say."})
    return out


def gateway_with(
    make_gateway: Callable[..., Gateway],
    upstream: Upstream,
    clock: Any = None,
    jobs: dict[str, Any] | None = None,
    **extra: Any,
) -> Gateway:
    """One tenant "acme" (`extra`: its sections); `jobs`: the gateway's jobs section."""
    extra.setdefault("context", SMALL)
    extra.setdefault("compaction", NO_SUMMARIES)
    sections = {} if jobs is None else {"jobs": jobs}
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], **extra)]
    return make_gateway(tenants, clock=clock, **sections)


def injected(upstream: Upstream) -> str:
    """The gateway's injected context block in the last forwarded request ('' if none)."""
    messages = upstream.fake.last_chat().body["messages"]
    return "\n".join(
        str(m["content"])
        for m in messages
        if m["role"] == "system" and "<gateway_context>" in str(m["content"])
    )


def forwarded(upstream: Upstream) -> str:
    return "\n".join(str(m.get("content")) for m in upstream.fake.last_chat().body["messages"])


def say(gateway: Gateway, messages: list[dict[str, Any]], **headers: str) -> Any:
    return gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, extra_headers=headers
    )


def test_an_error_code_500_turns_back_is_retrieved(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = gateway_with(make_gateway, upstream)
    history = [
        {"role": "user", "content": "The nightly job died again."},
        {
            "role": "assistant",
            "content": "The log shows ledger_sync.py failed with ECONNRESET-7731 at 02:14.",
        },
        *filler(249),
        {"role": "user", "content": "Thanks, that is all for now."},
    ]
    say(gateway, history)  # a full-history client importing a long chat: 501 messages at once
    wait_for_jobs(gateway, timeout=600)  # e5 reads long messages at a few per second
    history += [
        {"role": "assistant", "content": upstream.fake.last_chat().body["messages"][-1]["content"]},
        {"role": "user", "content": "Which error code did ledger_sync.py fail with?"},
    ]
    raw = say(gateway, history)
    assert "ECONNRESET-7731" in injected(upstream)
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    retrieval = report["sections"]["retrieval"]
    assert retrieval["message_ids"] and "ledger_sync.py" in retrieval["terms"]
    assert report["sent_tokens"] <= 400
    # Verbatim, with its neighbour (the question before it); imported at once, so its date is unknown.
    assert "user: The nightly job died again." in injected(upstream)
    assert "[date unknown]" in injected(upstream)


@BUDGETING_ONLY
def test_a_request_naming_someone_only_old_messages_mention_gets_those_messages(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    # No question, no past tense, no exact term: the name alone, which the window never says and an old
    # message does, points back.
    gateway = gateway_with(make_gateway, upstream)
    history = [
        {"role": "user", "content": "Priya from the agency sent the signed lease back on Monday."},
        {"role": "assistant", "content": "Great, noted."},
        *filler(120),
        {"role": "user", "content": "Thanks."},
    ]
    injected_text, retrieval = indexed_then_asked(
        gateway, upstream, history, "Write a two-line thank-you note to Priya."
    )
    assert "Priya from the agency sent the signed lease back" in injected_text
    assert retrieval["why"] == "names only old messages hold"


@BUDGETING_ONLY
def test_a_question_about_a_term_the_window_says_gets_the_link_only_old_messages_state(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    # The window names the incident, so no term is old-only; which service it was and who is on call for
    # that service are said only long before: the second hop's find confirms the link (with the test's
    # short history the question is also close to them by meaning, which asks for room first; the
    # benchmark's ops-en chat, where it is not, got no room before: BENCHMARKS.md, session 34).
    gateway = gateway_with(make_gateway, upstream)
    history = [
        {
            "role": "user",
            "content": "Root cause of INC-4666: shipment-svc. Unrelated: the coffee machine on the third "
            "floor broke again, and the plants by the window need water before the long weekend.",
        },
        {"role": "assistant", "content": "Noted."},
        *filler(40),
        {
            "role": "user",
            "content": "Ines is on call for shipment-svc this rotation. The summer offsite moved to the "
            "lake house in May, with a barbecue, a boat trip and a long hike on the second day.",
        },
        {"role": "assistant", "content": "Good to know."},
        *filler(40, offset=3),
        {"role": "user", "content": "The postmortem for INC-4666 is due Friday."},
        {"role": "assistant", "content": "I will draft the INC-4666 timeline."},
        {"role": "user", "content": "Thanks."},
    ]
    injected_text, retrieval = indexed_then_asked(
        gateway, upstream, history, "Who is on call for the service behind INC-4666?"
    )
    assert retrieval["hop"] == ["shipment-svc"] and retrieval["hop_confirmed"] == 1
    assert "Root cause of INC-4666: shipment-svc." in injected_text
    assert "Ines is on call for shipment-svc" in injected_text


@BUDGETING_ONLY
def test_a_present_tense_question_whose_name_the_window_says_still_gets_the_old_answer(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    # The window names tenant-admin, so no term is old-only and the question is not about the past; an
    # old message holds more of its words than any window message does: that is what answers it.
    gateway = gateway_with(make_gateway, upstream)
    history = [
        {"role": "user", "content": "Where did we put the admin services?"},
        {"role": "assistant", "content": "tenant-admin runs on c5-node-a3 and listens on port 8443."},
        *filler(120),
        {"role": "user", "content": "I restarted tenant-admin after the deploy."},
        {"role": "assistant", "content": "Good, tenant-admin is healthy again."},
        {"role": "user", "content": "Thanks."},
    ]
    injected_text, retrieval = indexed_then_asked(
        gateway, upstream, history, "Which port does tenant-admin listen on?"
    )
    assert "port 8443" in injected_text
    assert retrieval["why"] == "an old message matches it better than the window"


def test_a_past_tense_question_that_nothing_matches_closely_still_recalls(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    # None of the question's words is written where the findings were said, so no old message matches it
    # closely; it asks about the past all the same, and only old messages can answer it.
    gateway = gateway_with(make_gateway, upstream)
    history = [
        {"role": "user", "content": "first finding: export download links are guessable, sequential ids"},
        {"role": "assistant", "content": "Noted."},
        *filler(60),
        {"role": "user", "content": "Thanks."},
    ]
    injected_text, retrieval = indexed_then_asked(
        gateway, upstream, history, "What did the pen testers flag?"
    )
    assert retrieval["why"] == "a question about the past"
    assert "export download links are guessable" in injected_text


def indexed_then_asked(
    gateway: Gateway, upstream: Upstream, history: list[dict[str, Any]], question: str
) -> tuple[str, dict[str, Any]]:
    """`history` sent and indexed, then `question` asked after the answer: what was injected, and the
    retrieval section's report."""
    say(gateway, history)
    wait_for_jobs(gateway, timeout=600)
    answer = upstream.fake.last_chat().body["messages"][-1]["content"]
    raw = say(
        gateway, [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]
    )
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    return injected(upstream), report["sections"]["retrieval"]


def chained(source: str, link: str, others: list[dict[str, Any]], reply: str) -> list[dict[str, Any]]:
    """A history stating `source`, later `link`, then `others` (user turns, each answered with `reply`),
    with everyday exchanges between them."""
    return [
        {"role": "user", "content": source},
        {"role": "assistant", "content": "Noted."},
        *filler(60),
        {"role": "user", "content": link},
        {"role": "assistant", "content": "Good to know."},
        *filler(30, offset=5),
        *[m for other in others for m in (other, {"role": "assistant", "content": reply})],
        *filler(60, offset=3),
        {"role": "user", "content": "Thanks, that is all for now."},
    ]


def test_a_fact_chained_through_two_turns_is_found_by_a_second_hop(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The question names the job; only the turn about the job names the host, and only the host's turn
    says the region: the second search, for what the first match names, finds it among turns that talk
    about regions and machines in the question's own words."""
    gateway = gateway_with(make_gateway, upstream, context={"budget_tokens": 600})
    distractors = [
        {"role": "user", "content": f"In which region should the machine that runs the {kind} job be?"}
        for kind in (
            "build",
            "test",
            "staging",
            "batch",
            "GPU",
            "cache",
            "backup",
            "report",
            "billing",
            "search",
            "mail",
            "audit",
            "import",
            "cleanup",
            "metrics",
            "invoice",
        )
    ]
    history = chained(
        "The nightly-export job runs on etl-07 now.",
        "Heads up, etl-07 is physically in eu-west-1.",
        distractors,
        "It depends on the prices.",
    )
    context, retrieval = indexed_then_asked(
        gateway, upstream, history, "In which region is the machine that runs the nightly-export job?"
    )
    assert "The nightly-export job runs on etl-07 now." in context
    assert "etl-07 is physically in eu-west-1" in context
    assert "etl-07" in retrieval["hop"]


def test_a_hop_follows_a_host_the_whole_chat_talks_about_from_the_sentence_that_links_it(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The host is named in a dozen turns, so it is no rare word; the job's schema,
    naming the job beside six columns, matches the question better than the one line that links the job
    to the host. The link's own sentence still leads to the host, and the host's region is found."""
    gateway = gateway_with(make_gateway, upstream, context={"budget_tokens": 700})
    schema = (
        "Schema for the nightly-export job's state table:\n"
        "nightly-export: run_id, started_at, finished_at, row_count, export_path, checksum_sha"
    )
    chatter = [
        {"role": "user", "content": f"Ops note: etl-07 {what}, nothing lost, the queue drained on its own."}
        for what in (
            "rebooted again after the kernel patch",
            "shows high load on the second socket",
            "needs a firmware update this quarter",
            "had its fan replaced by facilities",
            "was slow to answer ssh this morning",
            "ran out of inodes on the scratch disk",
            "got a new network card last month",
            "logged ECC warnings overnight",
            "was drained for maintenance",
            "is back in the pool",
        )
    ]
    history = [
        {"role": "user", "content": "Heads up: the nightly-export job runs on etl-07 now."},
        {"role": "assistant", "content": "Noted."},
        *filler(40),
        {"role": "user", "content": schema},
        {"role": "assistant", "content": "Got it."},
        *filler(20, offset=3),
        {"role": "user", "content": "Reminder: etl-07 sits in the eu-west-1 rack."},
        {"role": "assistant", "content": "Good to know."},
        *[m for c in chatter for m in (c, {"role": "assistant", "content": "Thanks for the update."})],
        *filler(60, offset=5),
        {"role": "user", "content": "Thanks, that is all for now."},
    ]
    context, retrieval = indexed_then_asked(
        gateway, upstream, history, "In which region is the machine that runs the nightly-export job?"
    )
    assert "the nightly-export job runs on etl-07 now." in context
    assert "etl-07 sits in the eu-west-1 rack" in context
    assert "etl-07" in retrieval["hop"] and "row_count" not in retrieval["hop"]


def test_a_hop_follows_a_feature_named_in_plain_words_beside_the_flag_the_question_names(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The flag's statement names the feature in words, no identifier: "invoice merge", said by it and by
    the one turn saying whose work it is, is searched for, among turns asking who built other things."""
    gateway = gateway_with(make_gateway, upstream, context={"budget_tokens": 600})
    asking = [
        {"role": "user", "content": f"Who built the {kind} feature, and is the work behind it done?"}
        for kind in ("export", "search", "login", "billing", "upload", "audit", "report", "backup")
    ]
    history = chained(
        "The invoice merge is behind ff_async_export.",
        "The invoice merge is Ines's work.",
        asking,
        "Not sure, ask around.",
    )
    context, retrieval = indexed_then_asked(
        gateway, upstream, history, "Who built the feature behind ff_async_export?"
    )
    assert "The invoice merge is behind ff_async_export." in context
    assert "The invoice merge is Ines's work." in context
    assert retrieval["hop"] == ["invoice merge"]


def test_a_hop_skips_a_repeated_cursor_and_reaches_the_link_past_turns_asking_about_the_lead(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The endpoint's service is named once; the same example cursor follows the endpoint in turns about
    paging, and turns that say "codes" elsewhere ask about the service: the cursor leads nowhere, and the
    statement saying where the service's code lives, beside its name, is found before those turns."""
    gateway = gateway_with(make_gateway, upstream, context={"budget_tokens": 600})
    paging = [
        {
            "role": "user",
            "content": f"Should {kind} page with a cursor?\nGET /v1/usage?limit=50&after=eyJpZCI6IDQyfQ",
        }
        for kind in ("exports", "search", "logins", "billing", "uploads", "audits", "reports", "backups")
    ]
    asking = [
        {
            "role": "user",
            "content": f"We skipped the {kind} error codes last time. Does the changelog hit webhook-relay?",
        }
        for kind in ("export", "search", "login", "billing", "upload", "audit", "report", "backup")
    ]
    history = chained(
        "Requests to /v1/usage end up in webhook-relay.",
        "The code of webhook-relay lives in git/ops-tools, not the monorepo.",
        [*paging, *asking],
        "Let me check.",
    )
    context, retrieval = indexed_then_asked(
        gateway, upstream, history, "Which repository holds the code behind /v1/usage?"
    )
    assert "Requests to /v1/usage end up in webhook-relay." in context
    assert "The code of webhook-relay lives in git/ops-tools" in context
    assert "webhook-relay" in retrieval["hop"] and "eyjpzci6idqyfq" not in retrieval["hop"]


def test_a_plain_word_the_chat_writes_inside_an_identifier_is_followed_like_an_identifier(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The word "payouts" is a plain word of the question and a table of the chat (/v1/payouts): as an exact term
    of the question it picks out the turn naming the table's database, and the second hop follows that
    database to its version, past turns saying the question's other words about other databases. Asked
    as the history arrives (no job runs: ranked by keyword over the history in hand)."""
    gateway = gateway_with(make_gateway, upstream, jobs={"workers": 0}, context={"budget_tokens": 600})
    others = [
        {
            "role": "user",
            "content": f"The database pg-{kind} runs Postgres version {n} since the last upgrade.",
        }
        for n, kind in enumerate(("exports", "search", "logins", "billing", "uploads", "audits"), start=11)
    ]
    history = chained(
        "The payouts table is in pg-ledger-2.",
        "pg-ledger-2 is on 13.14 now.",
        [{"role": "user", "content": "GET /v1/payouts?limit=100 pages by cursor."}, *others],
        "Noted.",
    )
    question = "Which Postgres version runs the database that holds payouts?"
    raw = say(gateway, [*history, {"role": "user", "content": question}])
    context = injected(upstream)
    retrieval = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]["sections"][
        "retrieval"
    ]
    assert retrieval["keyword_in_hand"] is True
    assert "The payouts table is in pg-ledger-2." in context
    assert "pg-ledger-2 is on 13.14 now." in context
    assert retrieval["identifier_words"] == ["payouts"]


def test_a_phrase_of_the_question_is_found_where_the_chat_writes_its_acronym(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """Asked about dropping the dead-letter queue, the turn that says "killing the DLQ" is found among
    turns about dropping other queues' retries, and the report names the acronym."""
    gateway = gateway_with(make_gateway, upstream, context={"budget_tokens": 600})
    others = [
        {"role": "user", "content": f"Concerns were raised about dropping the {kind} queue's retries."}
        for kind in ("export", "search", "login", "billing", "upload", "audit", "report", "backup")
    ]
    history = [
        {
            "role": "user",
            "content": "Yuki raised another worry about killing the DLQ: poison messages block.",
        },
        {"role": "assistant", "content": "Noted."},
        *filler(40),
        *[m for o in others for m in (o, {"role": "assistant", "content": "Fair point, noted."})],
        *filler(60, offset=3),
        {"role": "user", "content": "Thanks, that is all for now."},
    ]
    context, retrieval = indexed_then_asked(
        gateway, upstream, history, "What concerns were raised about dropping the dead-letter queue?"
    )
    assert "killing the DLQ" in context
    assert retrieval["acronyms"] == ["dlq"]


def test_a_question_about_one_person_of_a_transcript_gets_that_ones_own_turns_alone(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """A chat app relaying a conversation between two people labels each turn with its speaker. Asked
    about one of them, their own turns rank first and, past the best two, come without the other's
    turns beside them."""
    gateway = gateway_with(make_gateway, upstream, context={"budget_tokens": 700})
    history: list[dict[str, Any]] = []
    for i in range(60):
        topic = TOPICS[i % len(TOPICS)]
        history.append({"role": "user", "content": f"Noah: Have you heard about this? {topic}."})
        history.append({"role": "assistant", "content": f"Mia: Not really, tell me more about {topic}."})
        if i == 12:
            history.append({"role": "user", "content": "Noah: What did you get up to on Sunday?"})
            history.append(
                {"role": "assistant", "content": "Mia: I went kayaking on the lake, my favourite pastime."}
            )
    history.append({"role": "user", "content": "Noah: Talk soon."})
    context, retrieval = indexed_then_asked(gateway, upstream, history, "What pastime does Mia enjoy?")
    assert retrieval["speaker"] == "mia"
    assert "Mia: I went kayaking on the lake" in context
    groups = retrieval["groups"]
    assert len(groups) > SPEAKER_GROUPED and sum(g["from"] < g["to"] for g in groups) <= SPEAKER_GROUPED, (
        groups
    )


def test_a_why_question_gets_the_reason_said_after_the_decision(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The reason follows the decision, after the assistant asked for it, in words of its own."""
    gateway = gateway_with(make_gateway, upstream)
    history = [
        *filler(40),
        {"role": "user", "content": "We decided to move billing-worker from RabbitMQ to Kafka."},
        {"role": "assistant", "content": "Okay, go on."},
        {
            "role": "user",
            "content": "The auditors want thirty days of events replayed, the old broker drops them.",
        },
        {"role": "assistant", "content": "Understood."},
        *filler(80, offset=2),
        {"role": "user", "content": "Thanks, that is all for now."},
    ]
    say(gateway, history)
    wait_for_jobs(gateway, timeout=600)
    history += [
        {"role": "assistant", "content": upstream.fake.last_chat().body["messages"][-1]["content"]},
        {"role": "user", "content": "Why did we decide to move billing-worker from RabbitMQ to Kafka?"},
    ]
    raw = say(gateway, history)
    assert "The auditors want thirty days of events replayed" in injected(upstream)
    # In one group with the decision (depth 80), reaching past the assistant's turn to the reason (82).
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    groups = report["sections"]["retrieval"]["groups"]
    assert any(g["from"] <= 80 and g["to"] >= 82 for g in groups), groups


def test_a_decision_revised_twice_is_answered_by_its_newest_statement_in_loose_words(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The first two statements name the service, and so do a dozen turns that discuss it; the last
    statement, which answers, says only "the deploy thing". Without the promotion of the newest decisions
    the turns naming the service fill the room (budget 400)."""
    gateway = gateway_with(make_gateway, upstream)
    history = [
        {"role": "user", "content": "Deploy strategy for webhook-relay: we decided on blue-green."},
        {"role": "assistant", "content": "Noted, blue-green deploys for webhook-relay."},
        *filler(40),
        {"role": "user", "content": "Change of plan on the webhook-relay deploy strategy: rolling updates."},
        {"role": "assistant", "content": "Rolling updates for webhook-relay, got it."},
        *[
            m
            for worry in ("the queue", "the cache", "the pager", "the logs", "the quotas", "the certs")
            for m in (
                {"role": "user", "content": f"A worry about the webhook-relay deploy strategy: {worry}."},
                {
                    "role": "assistant",
                    "content": f"The deploy strategy for webhook-relay can handle {worry}.",
                },
            )
        ],
        *filler(40, offset=3),
        {
            "role": "user",
            "content": "Summary of where the deploy thing landed: a canary at 25 percent, agreed.",
        },
        {"role": "assistant", "content": "Okay."},
        *filler(30, offset=5),
        {"role": "user", "content": "Thanks, that is all for now."},
    ]
    say(gateway, history)
    wait_for_jobs(gateway, timeout=600)
    history += [
        {"role": "assistant", "content": upstream.fake.last_chat().body["messages"][-1]["content"]},
        {"role": "user", "content": "What is the current deploy strategy for webhook-relay?"},
    ]
    raw = say(gateway, history)
    assert "a canary at 25 percent" in injected(upstream)
    retrieval = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]["sections"][
        "retrieval"
    ]
    assert len(retrieval["decisions"]) == 2


@MEANING
def test_a_paraphrase_is_found_by_meaning(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = gateway_with(make_gateway, upstream)
    client = gateway.client()
    thin = {"X-Conversation-Id": "pets-1"}
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "user", "content": "We adopted a kitten from the shelter and called her Biscuit."}
        ],
        extra_headers=thin,
    )
    for exchange in range(12):
        turn = filler(1, exchange)[0]
        client.chat.completions.create(model="gpt-4o", messages=[turn], extra_headers=thin)
    wait_for_jobs(gateway)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "What name did we give the animal we took home?"}],
        extra_headers=thin,
    )
    assert "Biscuit" in injected(upstream)
    # The question's vector was begun as the request arrived (context/prefetch.py) and was the one used.
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    assert report["sections"]["retrieval"]["embedded_early"] is True


def test_a_transcripts_participant_is_left_out_of_the_question_searched_by_meaning(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """A label opens every turn of its speaker: by meaning it would match them all alike."""
    gateway = gateway_with(make_gateway, upstream)
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Caroline: How was the weekend?"},
        {"role": "assistant", "content": "Melanie: We painted a sunset over the lake with the kids."},
    ]
    for exchange in range(40):
        turn = filler(1, exchange)
        history += [
            {"role": "user", "content": f"Caroline: {turn[0]['content']}"},
            {"role": "assistant", "content": f"Melanie: {turn[1]['content']}"},
        ]
    history.append({"role": "user", "content": "What did Melanie paint with her kids?"})
    raw = say(gateway, history)
    retrieval = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]["sections"][
        "retrieval"
    ]
    assert retrieval["meant"] == "What did paint with her kids?"
    # Begun as the request arrived, from the request's own last messages, and the one the section used.
    assert retrieval["embedded_early"] is True
    assert "We painted a sunset" in forwarded(upstream)


def test_a_retrieved_group_never_splits_a_tool_exchange(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = gateway_with(make_gateway, upstream)
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup_invoice", "arguments": "{}"}}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Look up the open invoice please."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "invoice INV-99812: total 420 EUR, due Friday"},
        {"role": "assistant", "content": "It is due on Friday."},
        *filler(20),
        {"role": "user", "content": "ok"},
    ]
    say(gateway, history)
    wait_for_jobs(gateway)
    history += [
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "What was the total of INV-99812?"},
    ]
    say(gateway, history)
    block = injected(upstream)
    assert "tool: invoice INV-99812" in block
    # The call that asked for the result comes with it, right before it.
    assert "assistant: <tool call lookup_invoice({})>\ntool: invoice INV-99812" in block


def test_tenants_never_see_each_others_history(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    keys = {"a": "sk-gw-a", "b": "sk-gw-b"}
    gateway = make_gateway(
        [
            tenant(n, upstream.base_url, api_keys=[k], context=SMALL, compaction=NO_SUMMARIES)
            for n, k in keys.items()
        ]
    )
    for name, key in keys.items():
        secret = "the vault code is ZEBRA-4411" if name == "a" else "the vault code is unknown"
        gateway.client(key).chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": f"Remember: {secret}."}],
            extra_headers={"X-Conversation-Id": "shared-id"},
        )
        for exchange in range(10):
            gateway.client(key).chat.completions.create(
                model="gpt-4o",
                messages=[filler(1, exchange)[0]],
                extra_headers={"X-Conversation-Id": "shared-id"},
            )
    wait_for_jobs(gateway)
    question = [{"role": "user", "content": "What was the vault code ZEBRA-4411 about?"}]
    gateway.client(keys["b"]).chat.completions.create(
        model="gpt-4o", messages=question, extra_headers={"X-Conversation-Id": "shared-id"}
    )
    assert "Remember: the vault code is ZEBRA-4411" not in forwarded(upstream)
    gateway.client(keys["a"]).chat.completions.create(
        model="gpt-4o", messages=question, extra_headers={"X-Conversation-Id": "shared-id"}
    )
    assert "Remember: the vault code is ZEBRA-4411" in injected(upstream)  # the control: it is findable


def test_other_conversations_only_of_the_same_user(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = gateway_with(make_gateway, upstream, retrieval={"other_conversations": True})
    client = gateway.client()

    def chat(conversation: str, user: str, text: str) -> None:
        client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": text}],
            extra_headers={"X-Conversation-Id": conversation, "X-User-Id": user},
        )

    chat("alice-1", "alice", "My gym locker code is 5813, do not forget it.")
    for exchange in range(6):
        chat("alice-1", "alice", filler(1, exchange)[0]["content"])
    for exchange in range(15):  # long enough to be rebuilt (a chat that fits the budget goes out unchanged)
        chat("bob-1", "bob", filler(1, exchange + 3)[0]["content"])
        chat("alice-2", "alice", filler(1, exchange + 3)[0]["content"])
    wait_for_jobs(gateway)
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "What is my gym locker code 5813 for?"}],
        extra_headers={"X-Conversation-Id": "bob-1", "X-User-Id": "bob"},
    )
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    # It looked, and found nothing of bob's close enough to send (or none at all).
    assert report["sections"]["retrieval"].get("other_conversations", []) == []
    assert "My gym locker code is 5813" not in forwarded(upstream)
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "What is my gym locker code?"}],
        extra_headers={"X-Conversation-Id": "alice-2", "X-User-Id": "alice"},
    )
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    block = injected(upstream)
    assert "other conversations" in block and "My gym locker code is 5813" in block, {
        k: v for k, v in report["sections"]["retrieval"].items() if k != "message_ids"
    }


def test_a_branch_never_retrieves_another_branchs_messages(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = gateway_with(make_gateway, upstream)
    opening = [
        {"role": "user", "content": "Let us name the project."},
        {"role": "assistant", "content": "Sure."},
    ]
    branches = {}
    for codename in ("ALPHA-7", "BETA-3"):  # the second is an edit of the same turn: a sibling branch
        history = [
            *opening,
            {"role": "user", "content": f"The project codename is {codename}."},
            {"role": "assistant", "content": "Noted."},
            *filler(15),
            {"role": "user", "content": "ok"},
        ]
        say(gateway, history)
        branches[codename] = [*history, {"role": "assistant", "content": "fine"}]
    wait_for_jobs(gateway)
    say(gateway, [*branches["BETA-3"], {"role": "user", "content": "What was the project codename again?"}])
    sent = forwarded(upstream)
    assert "The project codename is BETA-3." in sent
    assert "ALPHA-7" not in sent


def test_deleting_a_conversation_or_a_user_removes_its_vectors(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = gateway_with(make_gateway, upstream)
    client = gateway.client()
    for conversation, user in (("c-1", "carol"), ("c-2", "carol"), ("d-1", "dave")):
        client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": f"The launch password in {conversation} is KAPPA-9911."}],
            extra_headers={"X-Conversation-Id": conversation, "X-User-Id": user},
        )
    wait_for_jobs(gateway)
    ids = {c["external_id"]: c["id"] for c in api(gateway, "/conversations")["data"]}

    async def rows(conversation_id: str) -> int:
        model = gateway.config.tenants[0].retrieval.embedder.local_model
        index = LanceIndex.open(gateway.config.storage.index_location, index_table(model), 384)
        query = SearchQuery(
            tenant="acme",
            text="KAPPA-9911",
            vector=[1.0] + [0.0] * 383,
            limit=10,
            conversation_id=conversation_id,
        )
        found = await index.search(query)
        await index.aclose()
        return len(found.semantic) + len(found.keyword)

    assert all(asyncio.run(rows(i)) > 0 for i in ids.values())
    headers = {"Authorization": f"Bearer {GATEWAY_KEY}"}
    gone = httpx.delete(f"{gateway.server.url}/api/conversations/{ids['d-1']}", headers=headers)
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert asyncio.run(rows(ids["d-1"])) == 0
    assert asyncio.run(rows(ids["c-1"])) > 0
    user = httpx.delete(f"{gateway.server.url}/api/users/carol", headers=headers)
    assert sorted(user.json()["conversations"]) == sorted([ids["c-1"], ids["c-2"]])
    assert asyncio.run(rows(ids["c-1"])) == 0 and asyncio.run(rows(ids["c-2"])) == 0
    assert api(gateway, "/conversations")["data"] == []
    missing = httpx.delete(f"{gateway.server.url}/api/conversations/{ids['d-1']}", headers=headers)
    assert missing.status_code == 404


@pytest.mark.parametrize("budget", [400])
def test_messages_not_yet_embedded_are_found_by_keyword(
    upstream: Upstream, make_gateway: Callable[..., Gateway], budget: int
) -> None:
    # The embedder is broken (the provider answers vectors of the wrong size): no vector is ever stored.
    broken = {"embedder": {"provider": "upstream", "model": "fake-embed", "dimensions": 8}}
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": budget},
                compaction=NO_SUMMARIES,
                retrieval=broken,
            )
        ],
        jobs={"max_attempts": 1},
    )
    history = [
        {"role": "user", "content": "Which port did we pick for the staging proxy?"},
        {"role": "assistant", "content": "We picked port 8443 for staging_proxy.conf."},
        *filler(20),
        {"role": "user", "content": "ok"},
    ]
    say(gateway, history)
    jobs = wait_for_jobs(gateway)
    assert jobs.get("failed", 0) >= 1  # embedding failed for good ...
    say(
        gateway,
        [
            *history,
            {"role": "assistant", "content": "fine"},
            {"role": "user", "content": "Which file had port 8443?"},
        ],
    )
    assert "We picked port 8443 for staging_proxy.conf." in injected(upstream)  # ... keyword search found it


def test_a_time_reference_in_the_question_filters_by_date(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    clock = Clock(datetime(2026, 3, 2, 10, 0, tzinfo=UTC))  # a Monday
    gateway = gateway_with(make_gateway, upstream, clock=clock)
    client = gateway.client()
    thin = {"X-Conversation-Id": "ledger"}

    def chat(text: str) -> None:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": text}], extra_headers=thin
        )

    chat("For the ledger service we chose Postgres as the database.")
    for exchange in range(6):
        chat(filler(1, exchange)[0]["content"])
    clock.now = datetime(2026, 3, 10, 10, 0, tzinfo=UTC)  # the week after
    chat("For the ledger service we chose Redis as the cache.")
    for exchange in range(6):
        chat(filler(1, exchange + 2)[0]["content"])
    clock.now = datetime(2026, 3, 18, 10, 0, tzinfo=UTC)  # "last week" is now 9-15 March
    for exchange in range(6):
        chat(filler(1, exchange + 4)[0]["content"])
    wait_for_jobs(gateway)
    chat("What did we choose for the ledger service last week?")
    block = injected(upstream)
    assert "we chose Redis as the cache" in block and "[2026-03-10" in block
    assert "Postgres" not in block
    chat("What did we choose as the database for the ledger service?")  # no time reference: both weeks
    assert "we chose Postgres as the database" in injected(upstream)


@BUDGETING_ONLY
def test_budget_left_by_retrieval_is_the_windows_room_to_grow(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    # A question about the past with few matches leaves room unused: it is what the append-only window
    # grows into on the next turns (design.md section 14), not filled by moving the window's start.
    few = {"candidates": 5}  # few matches: retrieval needs far less than its allowance
    gateway = gateway_with(make_gateway, upstream, context={"budget_tokens": 8_000}, retrieval=few)
    long_turn = " ".join(TOPICS) + ". "
    history: list[dict[str, Any]] = []
    for i in range(60):
        history.append({"role": "user", "content": f"Part {i}: " + long_turn * 2})
        history.append({"role": "assistant", "content": f"Reply {i}: " + long_turn * 2})
        if i == 54:  # just older than the smallest window: retrieval finds it, the window could hold it
            history.append(
                {"role": "user", "content": "The wifi password for the office is orange-kettle-42."}
            )
            history.append({"role": "assistant", "content": "Noted."})
    history.append({"role": "user", "content": "ok"})
    say(gateway, history)
    wait_for_jobs(gateway, timeout=600)  # e5 reads long messages at a few per second
    history += [
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "Did I mention the wifi password earlier?"},
    ]
    raw = say(gateway, history)
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    assert "orange-kettle-42" in forwarded(upstream)
    assert report["sent_tokens"] <= report["budget_tokens"]
    # What retrieval leaves is the window's room to grow: the next turns append to this prompt.
    before = upstream.fake.last_chat().body["messages"]
    history += [{"role": "assistant", "content": "fine"}, {"role": "user", "content": "ok, thanks"}]
    say(gateway, history)
    after = upstream.fake.last_chat().body["messages"]
    assert after[: len(before) - 2] == before[:-2]  # up to the tail and the question


@BUDGETING_ONLY
def test_the_newest_two_exchanges_stay_whatever_retrieval_asks_for(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = gateway_with(make_gateway, upstream, context={"budget_tokens": 3_000})
    long = " ".join(TOPICS)  # ~50 tokens: an exchange below is ~500, two are past the window floor
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Our staging database password rotation runs from vault_rotate.sh."},
        {"role": "assistant", "content": "Noted: vault_rotate.sh rotates the staging password."},
    ]
    for i in range(59):
        # Every old exchange matches the question a little, so retrieval could fill all the room it gets.
        history.append({"role": "user", "content": f"Point {i} on the staging password rotation: {long}"})
        history.append({"role": "assistant", "content": f"Answer {i}: " + " ".join([long] * 9)})
    history.append({"role": "user", "content": "Thanks."})
    answer = say(gateway, history).parse().choices[0].message.content  # the history arrives at once
    wait_for_jobs(gateway, timeout=600)  # e5 reads long messages at a few per second
    history.append({"role": "assistant", "content": answer})
    history.append({"role": "user", "content": "Which script did we say rotates the staging password?"})
    raw = say(gateway, history)
    sent = upstream.fake.last_chat().body["messages"]
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    assert "vault_rotate.sh" in injected(upstream)  # retrieval asked for its larger allowance
    assert report["sections"]["retrieval"]["asked"] == 9_000
    # The last two whole exchanges before the question go out as they were, whatever retrieval asked.
    own = [m for m in sent if "<gateway_context>" not in str(m["content"])]  # the tail left out
    assert [m["content"] for m in own[-5:]] == [m["content"] for m in history[-5:]]
    assert report["sections"]["window"]["exchanges"] >= 2
    assert report["sent_tokens"] <= 3_000


def test_history_that_arrives_at_once_is_undated_and_passes_time_ranges(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    clock = Clock(datetime(2026, 3, 18, 10, 0, tzinfo=UTC))  # a Wednesday: "last week" is 9-15 March
    gateway = gateway_with(make_gateway, upstream, clock=clock)
    history = [
        {"role": "user", "content": "For the ledger service we chose Redis as the cache."},
        {"role": "assistant", "content": "Redis it is for the ledger cache."},
        *filler(30),
        {"role": "user", "content": "That is all for today."},
    ]
    raw = say(gateway, history)  # a client with a long chat starts using the gateway
    conversation_id = raw.headers["x-conversation-id"]
    wait_for_jobs(gateway)
    stored = api(gateway, f"/conversations/{conversation_id}/messages")["data"]
    undated = [m["message"]["content"] for m in stored if m["meta"].get("undated")]
    # Everything the client had before is undated; its question and the answer are from now.
    assert undated == [m["content"] for m in history[:-1]]
    history += [
        {"role": "assistant", "content": raw.parse().choices[0].message.content},
        {"role": "user", "content": "What did we choose for the ledger service last week?"},
    ]
    say(gateway, history)
    block = injected(upstream)
    # Stored today, said at an unknown time: it may be last week's, and it is not labelled as today's.
    assert "we chose Redis as the cache" in block
    assert "[date unknown]" in block and "[2026-03-18" not in block


def test_a_fresh_agent_loop_is_dated(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = gateway_with(make_gateway, upstream)
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "What is the weather in Lisbon?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    raw = say(gateway, messages)  # the question, its tool call and the result: all said just now
    stored = api(gateway, f"/conversations/{raw.headers['x-conversation-id']}/messages")["data"]
    assert len(stored) == 4 and not any(m["meta"].get("undated") for m in stored)


def test_a_group_spanning_two_days_shows_each_messages_own_day(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    clock = Clock(datetime(2026, 3, 2, 18, 0, tzinfo=UTC))
    gateway = gateway_with(make_gateway, upstream, clock=clock, retrieval={"neighbours": 1})
    client = gateway.client()
    thin = {"X-Conversation-Id": "trip"}

    def chat(text: str) -> None:
        upstream.fake.enqueue(Reply(content="Noted."))  # answers that do not repeat the question
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": text}], extra_headers=thin
        )

    for exchange in range(4):
        chat(filler(1, exchange)[0]["content"])
    chat("Good night, more tomorrow.")  # the day's last message, just before the hit
    clock.now = datetime(2026, 3, 3, 9, 0, tzinfo=UTC)
    chat("The flight code for the Lisbon trip is TP-8841.")  # the next day's first: its neighbour is older
    for exchange in range(30):  # past the 400-token budget, so the request is rebuilt
        chat(filler(1, exchange + 4)[0]["content"])
    clock.now = datetime(2026, 3, 9, 9, 0, tzinfo=UTC)
    wait_for_jobs(gateway)
    upstream.fake.enqueue(Reply(content="TP-8841."))
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Which flight code did we get for the Lisbon trip?"}],
        extra_headers=thin,
    )
    block = injected(upstream)
    assert "TP-8841" in block, block
    # The record says exactly what went: stored messages by id, the block kept whole at its place.
    recorded(gateway, raw.headers["x-gateway-request-id"])
    record = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")
    path = api(gateway, f"/conversations/{record['conversation_id']}/path/{record['parent_message_id']}")[
        "data"
    ]
    by_id = {m["id"]: m["message"] for m in path}
    layout = record["report"]["sent"]
    rebuilt = [by_id[i] for i in layout["ids"]]
    kept = record["sent_context"]
    if layout["context_at"] is not None:
        rebuilt.insert(layout["context_at"], {k: v for k, v in kept.items() if k != "tail"})
    rebuilt.insert(layout["tail_at"], kept["tail"])
    assert rebuilt == upstream.fake.last_chat().body["messages"]
    # The dashboard's request page lists the retrieved group: its messages, score and first day.
    page = httpx.get(
        f"{gateway.server.url}/dashboard/requests/{record['id']}",
        headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
    ).text
    groups = page[
        page.index('<table id="groups">') : page.index("</table>", page.index('<table id="groups">'))
    ]
    assert "TP-8841" in groups and "2026-03-02" in groups, groups
    # The hit's group starts with the answer before it, from 2 March, then the hit, from 3 March: the
    # group is labelled with its first message's day and the day changes inside it on a line of its own.
    hit = block.index("user: The flight code for the Lisbon trip is TP-8841.")
    assert block[:hit].endswith("assistant: Noted.\n[2026-03-03 09:00]\n"), block
    assert block.rfind("[2026-03-02 18:00]", 0, hit) >= 0
