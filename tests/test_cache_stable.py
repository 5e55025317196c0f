"""The cache-stable prompt (design.md section 14) through the real gateway and the caching fake upstream:
append-only between epochs, epochs that jump in large steps, the tail before the question, memory that
keeps a short chat's prefix stable, and an agent's working state kept whatever the budget."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from gateway.fakes.openai_upstream import Reply
from gateway.fakes.prompt_cache import PromptCache
from tests.conftest import GATEWAY_KEY, Clock, Gateway, Upstream, api, recorded, tenant, wait_for_jobs

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "bright",
    "stars",
    "shine",
]
NO_EXTRAS = {"retrieval": {"enabled": False}, "compaction": {"enabled": False}}


def text(seed: int, words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(words)) + f" #{seed}"


def chat(
    gateway: Gateway,
    upstream: Upstream,
    turns: int,
    *,
    system: str = "You are terse.",
    headers: dict[str, str] | None = None,
    answer_words: int = 120,
    request_ids: list[str] | None = None,
) -> list[list[dict[str, Any]]]:
    """A chat app resending its whole history; returns what the upstream received for each turn."""
    client = gateway.client()
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    sent: list[list[dict[str, Any]]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": text(turn, 30)})
        upstream.fake.enqueue(Reply(content=text(1000 + turn, answer_words)))
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=messages, extra_headers=headers or {}
        )
        if request_ids is not None:
            request_ids.append(raw.headers["x-gateway-request-id"])
        sent.append(upstream.fake.last_chat().body["messages"])
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
    return sent


def shares_prefix(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> bool:
    """`after` begins with `before` up to its volatile tail (or its question, when it had none)."""
    end = len(before) - 1  # the question
    if end > 0 and _is_tail(before[end - 1]):
        end -= 1
    return after[:end] == before[:end]


def _is_tail(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "system"
        and isinstance(content, str)
        and "for the next message only" in content
    )


def test_a_long_chat_is_append_only_between_epochs_and_the_provider_caches_it(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, context={"budget_tokens": 3000}, **NO_EXTRAS)])
    ids: list[str] = []
    sent = chat(gateway, upstream, 40, request_ids=ids)
    jumps = [n for n in range(1, len(sent)) if not shares_prefix(sent[n - 1], sent[n])]
    assert jumps, "the chat never outgrew the budget"
    # The window jumps in large steps: several turns append to each epoch.
    assert len(jumps) <= len(sent) // 4, jumps
    assert all(b - a >= 3 for a, b in itertools.pairwise(jumps)), jumps
    # Each request says why the provider's cache missed: at a jump, the epoch; otherwise it did not.
    for request_id in ids:
        recorded(gateway, request_id)
    reports = [api(gateway, f"/requests/{request_id}")["report"] for request_id in ids]
    misses = [str(report.get("cache", {}).get("miss", "")) for report in reports]
    assert sum("epoch began" in m for m in misses) == len(jumps), misses
    assert all(not m or "epoch began" in m or "shorter than the provider caches" in m for m in misses), set(
        misses
    )
    cache = upstream.fake.prompt_cache.records("chat")
    hit = sum(u.cached_tokens for u in cache) / sum(u.prompt_tokens for u in cache)
    assert hit > 0.5, hit


def test_epochs_are_stored_with_the_path_so_a_second_gateway_builds_the_same_bytes(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    config = [tenant("acme", upstream.base_url, context={"budget_tokens": 3000}, **NO_EXTRAS)]
    first = make_gateway(config)
    sent = chat(first, upstream, 30)
    second = make_gateway(config)  # another replica on the same database
    client = second.client()
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(30):
        history += [
            {"role": "user", "content": text(turn, 30)},
            {"role": "assistant", "content": text(1000 + turn, 120)},
        ]
    history.append({"role": "user", "content": text(30, 30)})
    upstream.fake.enqueue(Reply(content="ok"))
    client.chat.completions.create(model="gpt-4o", messages=history)
    assert shares_prefix(sent[-1], upstream.fake.last_chat().body["messages"])


def indexed_chat(
    upstream: Upstream, make_gateway: Callable[..., Gateway], key_line: str, answer_words: int
) -> tuple[Gateway, Any, list[dict[str, Any]]]:
    """A gateway with retrieval at a 3,000-token budget, and a 30-turn chat whose first user turn is
    `key_line`, sent whole once and indexed; returns the gateway, its client and the messages sent."""
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                context={"budget_tokens": 3000},
                compaction={"enabled": False},
                retrieval={"enabled": True},
            )
        ],
        jobs={"poll_seconds": 0.05},
    )
    client = gateway.client()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": key_line},
        {"role": "assistant", "content": "Noted."},
    ]
    for turn in range(30):
        messages += [
            {"role": "user", "content": text(turn, 30)},
            {"role": "assistant", "content": text(500 + turn, answer_words)},
        ]
    messages.append({"role": "user", "content": "ok"})
    upstream.fake.enqueue(Reply(content="fine"))
    client.chat.completions.create(model="gpt-4o", messages=messages)
    wait_for_jobs(gateway, timeout=600)  # the history's embedding, slow on a busy 2-core machine
    return gateway, client, messages


def test_the_tail_sits_right_before_the_question_and_the_stable_block_after_the_system_prompt(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    _, client, messages = indexed_chat(
        upstream, make_gateway, "The deploy key for ledger-api is LK-4471-ZQ, note it.", 120
    )
    messages += [
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "What was the deploy key LK-4471-ZQ for again?"},
    ]
    upstream.fake.enqueue(Reply(content="ledger-api"))
    client.chat.completions.create(model="gpt-4o", messages=messages)
    sent = upstream.fake.last_chat().body["messages"]
    assert sent[0] == messages[0]
    assert sent[-1] == messages[-1]
    assert _is_tail(sent[-2]) and "LK-4471-ZQ" in sent[-2]["content"]
    # Nothing question-specific before the window: everything between the system prompt and the tail is
    # the client's own messages, verbatim and in order.
    middle = sent[1:-2]
    assert all(m in messages for m in middle)


def test_a_short_chat_with_a_known_user_keeps_its_prefix_and_gets_memory_in_the_tail(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, memory={"enabled": True, "extraction": False}, **NO_EXTRAS)]
    )
    user = {"X-User-Id": "ana"}
    auth = {"authorization": f"Bearer {GATEWAY_KEY}", **user}
    for content, kind in (
        ("Ana is vegetarian.", "constraint"),
        ("Ana's cello teacher is called Mr Okafor.", "stable_fact"),
    ):
        httpx.post(
            f"{gateway.server.url}/api/memories", json={"content": content, "type": kind}, headers=auth
        ).raise_for_status()
    client = gateway.client()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    sent: list[list[dict[str, Any]]] = []
    for question in ("Hello there!", "Who teaches my cello lessons, Mr Okafor?", "Thanks, bye."):
        messages.append({"role": "user", "content": question})
        upstream.fake.enqueue(Reply(content="Sure."))
        client.chat.completions.create(model="gpt-4o", messages=messages, extra_headers=user)
        sent.append(upstream.fake.last_chat().body["messages"])
        messages.append({"role": "assistant", "content": "Sure."})
    # The standing memory is pinned after the system prompt from the first turn on.
    assert "vegetarian" in str(sent[0][1]["content"])
    assert sent[1][1] == sent[0][1] == sent[2][1]
    # The memory that bears on a question goes in the tail, for that turn only.
    assert _is_tail(sent[1][-2]) and "Okafor" in sent[1][-2]["content"]
    assert shares_prefix(sent[0], sent[1]) and shares_prefix(sent[1], sent[2])
    # Deleting a memory ends the epochs that pinned it: the next turn's stable block no longer shows it.
    vegetarian = next(
        m["id"]
        for m in httpx.get(f"{gateway.server.url}/api/memories", headers=auth).json()["data"]
        if "vegetarian" in m["content"]
    )
    httpx.delete(f"{gateway.server.url}/api/memories/{vegetarian}", headers=auth).raise_for_status()
    messages.append({"role": "user", "content": "One more thing."})
    upstream.fake.enqueue(Reply(content="Sure."))
    client.chat.completions.create(model="gpt-4o", messages=messages, extra_headers=user)
    assert "vegetarian" not in str(upstream.fake.last_chat().body["messages"])


def test_an_agent_keeps_its_newest_exchanges_when_its_system_prompt_outgrows_the_budget(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, context={"budget_tokens": 1000}, **NO_EXTRAS)])
    system = text(7, 1500)  # ~1,500 tokens of instructions and tools: over the whole budget
    sent = chat(gateway, upstream, 3, system=system, answer_words=40)
    first_question = text(0, 30)
    assert any(m.get("content") == first_question for m in sent[1]), "turn 2 lost turn 1"
    assert any(m.get("content") == text(1, 30) for m in sent[2])


def test_a_cache_miss_says_whether_the_client_changed_its_prefix_the_cache_expired_or_was_evicted(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    clock = Clock(datetime(2026, 5, 1, 9, 0, tzinfo=UTC))
    cache_time = [0.0]
    upstream.fake.prompt_cache.clock = lambda: cache_time[0]
    gateway = make_gateway([tenant("acme", upstream.base_url, **NO_EXTRAS)], clock=clock)
    client = gateway.client()
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    messages: list[dict[str, Any]] = [{"role": "system", "content": text(0, 1500)}]  # a cacheable prefix
    misses: list[str] = []
    for turn in range(6):
        if turn == 4:  # ten minutes later: past the provider's five
            clock.now += timedelta(minutes=10)
            cache_time[0] += 600
        if turn == 5:  # the provider dropped it early
            upstream.fake.prompt_cache = PromptCache(clock=lambda: cache_time[0])
        messages.append({"role": "user", "content": text(turn, 30)})
        upstream.fake.enqueue(Reply(content=text(1000 + turn, 60)))
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=messages,  # type: ignore[arg-type]
            **({"tools": [weather]} if turn >= 3 else {}),  # turn 3: the client adds a tool
        )
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
        recorded(gateway, request_id := raw.headers["x-gateway-request-id"])
        misses.append(str(api(gateway, f"/requests/{request_id}")["report"].get("cache", {}).get("miss", "")))
    assert misses[:3] == ["", "", ""], misses  # the first turn expects nothing cached; then hits
    assert "the client changed its prefix" in misses[3], misses
    assert misses[4].startswith("expired: 10 minutes since the previous turn"), misses
    assert "the provider evicted the prefix" in misses[5], misses


def test_a_question_about_the_past_borrows_the_windows_room_for_its_turn_alone(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway, client, messages = indexed_chat(
        upstream, make_gateway, "The deploy key for the ledger service is LK-4471-ZQ, note it.", 150
    )
    before = upstream.fake.last_chat().body["messages"]

    def ask(question: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        messages.extend([{"role": "assistant", "content": "fine"}, {"role": "user", "content": question}])
        upstream.fake.enqueue(Reply(content="fine"))
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)  # type: ignore[arg-type]
        recorded(gateway, request_id := raw.headers["x-gateway-request-id"])
        return upstream.fake.last_chat().body["messages"], api(gateway, f"/requests/{request_id}")["report"]

    for turn in range(4):  # the epoch's window grows towards the tail's reserve
        ask(text(200 + turn, 150))
    ask("thanks")
    before, _ = ask("thanks")  # the window's newest exchanges are short: giving way pays
    sent, report = ask("What was the deploy key of the ledger service that I told you to note?")
    borrowed = report["epoch"]["borrowed"]
    assert report["epoch"]["new"] is False and borrowed["window_start"] > report["epoch"]["window_start"]
    assert _is_tail(sent[-2]) and "LK-4471-ZQ" in sent[-2]["content"]
    assert len(sent) < len(before)  # the window gave way for this turn
    # No breakpoint after this turn's window (nothing would read it): after the system prompt only.
    assert report["sent"]["cache_breaks"] == [0]
    after, report = ask(text(99, 30))  # a statement: the epoch's window again, its prefix as cached before
    assert "borrowed" not in report["epoch"]
    window_end = len(after) - 2 - _is_tail(after[-2])  # before the tail, if any, and the question
    assert report["sent"]["cache_breaks"] == [window_end]
    assert shares_prefix(before, after)
