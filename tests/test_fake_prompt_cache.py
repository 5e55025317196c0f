"""The shipped fakes' prompt cache: the simulator's rules, and its usage as the official SDKs read it.

OpenAI: automatic, from 1,024 tokens in 128-token steps, per (model, prompt_cache_key), TTL refreshed on
a hit. Anthropic: at `cache_control` breakpoints with a 20-block lookback, at most 4 breakpoints. Every
expected number follows from the simulator's own token count, never from a guess at it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from openai import OpenAI

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer
from gateway.fakes.anthropic_upstream import FakeAnthropic, Reply
from gateway.fakes.openai_upstream import FakeUpstream
from gateway.fakes.prompt_cache import (
    BreakpointLimitError,
    CacheUsage,
    PromptCache,
    anthropic_blocks,
    chat_segments,
    count_breakpoints,
)
from gateway.fakes.server import BackgroundServer
from gateway.jobs.prompts import CHUNK_MARKER

MODEL = "gpt-4o"
CLAUDE = "claude-fake"
EPHEMERAL = {"type": "ephemeral"}


class Clock:
    """A settable monotonic clock for the simulator."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def words(count: int, seed: str = "alpha") -> str:
    """About `count` tokens: " seed" is one token in o200k_base, numbered every 50 words."""
    return " ".join(f"{seed}{i}" if i % 50 == 0 else seed for i in range(count))


def boundary(tokens: int) -> int:
    """OpenAI's cached length for a seen prefix of `tokens` tokens: 1,024 + 128·k, or 0 under 1,024."""
    return 0 if tokens < 1024 else 1024 + 128 * ((tokens - 1024) // 128)


def chat(*contents: str, **extra: Any) -> dict[str, Any]:
    roles = ["system", *(("user", "assistant")[i % 2] for i in range(len(contents) - 1))]
    messages = [{"role": role, "content": c} for role, c in zip(roles, contents, strict=True)]
    return {"model": MODEL, "messages": messages, **extra}


def common_prefix(cache: PromptCache, first: dict[str, Any], second: dict[str, Any]) -> int:
    """How many leading tokens two chat requests share, by the simulator's own linearisation."""
    encoder = cache.encoder(MODEL)
    a, b = (array("I", b"".join(chat_segments(encoder, body))) for body in (first, second))
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    return shared


# ------------------------------------------------------------------------------------ OpenAI, unit


def test_the_count_is_real_tokens_as_the_gateway_counts_them() -> None:
    cache = PromptCache()
    body = chat("You are terse.", "Hello there, how are you?", "Fine.", "And the weather?")
    body["messages"].append({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
    body["messages"].insert(
        3,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
    )
    expected = TiktokenTokenizer.for_model(MODEL).count_messages(body["messages"])
    assert cache.count_chat(body) == expected
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    assert cache.count_chat({**body, "tools": tools}) > expected  # tools come first, and count


def test_requests_sharing_leading_messages_share_leading_tokens() -> None:
    cache = PromptCache()
    encoder = cache.encoder(MODEL)
    short = chat("System.", words(300), "An answer.")
    long = chat("System.", words(300), "An answer.", "A follow-up question.")
    a = b"".join(chat_segments(encoder, short)[:-1])  # without the reply's primer
    assert b"".join(chat_segments(encoder, long)).startswith(a)


def test_a_prompt_sent_twice_is_cached_in_128_token_steps() -> None:
    cache = PromptCache()
    body = chat("You are a careful assistant.", words(1920))
    total = cache.count_chat(body)
    assert 1990 <= total <= 2010  # about 2,000 tokens
    first, second = cache.openai_chat(body), cache.openai_chat(body)
    assert first == CacheUsage(total, 0, 0, "chat")
    assert second == CacheUsage(total, 1920, 0, "chat") and boundary(total) == 1920
    assert second.uncached_tokens == total - 1920


def test_a_prompt_under_1024_tokens_never_caches() -> None:
    cache = PromptCache()
    body = chat("System.", words(900))
    assert cache.count_chat(body) < 1024
    assert [cache.openai_chat(body).cached_tokens for _ in range(3)] == [0, 0, 0]
    assert len(cache) == 0


def test_the_next_turn_reads_the_previous_turns_prompt() -> None:
    cache = PromptCache()
    turn = chat("System.", words(3000), "A long answer. " * 20)
    cache.openai_chat(turn)
    following = chat("System.", words(3000), "A long answer. " * 20, "Next question?")
    shared = common_prefix(cache, turn, following)
    assert shared >= cache.count_chat(turn) - 3  # all but the reply's primer, at most
    assert cache.openai_chat(following).cached_tokens == boundary(shared) > 3000


def test_a_changed_early_message_breaks_the_cache_from_that_point() -> None:
    cache = PromptCache()
    original = chat(words(1500, "alpha"), words(1500, "beta"), words(1500, "gamma"))
    cache.openai_chat(original)
    changed = chat(words(1500, "alpha"), words(1500, "delta"), words(1500, "gamma"))
    shared = common_prefix(cache, original, changed)
    assert 1024 < shared < 2000  # the system message and the second one's framing
    assert cache.openai_chat(changed).cached_tokens == boundary(shared)
    # The first message changed: nothing is cached, though everything after it is as before.
    assert cache.openai_chat(chat(words(1500, "omega"), words(1500, "beta"))).cached_tokens == 0


def test_entries_expire_after_the_ttl_and_a_hit_refreshes_them() -> None:
    clock = Clock()
    cache = PromptCache(ttl=300, clock=clock)
    body = chat("System.", words(1500))
    expected = boundary(cache.count_chat(body))
    cache.openai_chat(body)
    clock.now += 200
    assert cache.openai_chat(body).cached_tokens == expected
    clock.now += 250  # 450 s after the write, 250 after the hit that refreshed it
    assert cache.openai_chat(body).cached_tokens == expected
    clock.now += 301
    assert cache.openai_chat(body).cached_tokens == 0


def test_prompt_cache_key_and_model_isolate_caches() -> None:
    cache = PromptCache()
    body = chat("System.", words(1500))
    expected = boundary(cache.count_chat(body))
    cache.openai_chat({**body, "prompt_cache_key": "conversation-a"})
    assert cache.openai_chat({**body, "prompt_cache_key": "conversation-b"}).cached_tokens == 0
    assert cache.openai_chat(body).cached_tokens == 0  # no key is a key of its own
    assert cache.openai_chat({**body, "prompt_cache_key": "conversation-a"}).cached_tokens == expected
    assert cache.openai_chat({**body, "model": "gpt-4.1"}).cached_tokens == 0


def test_stats_per_request_and_totals() -> None:
    cache = PromptCache()
    body = chat("System.", words(1500))
    total = cache.count_chat(body)
    cache.openai_chat(body)
    cache.openai_chat(body, tag="summary")
    assert cache.records() == [
        CacheUsage(total, 0, 0, "chat"),
        CacheUsage(total, boundary(total), 0, "summary"),
    ]
    totals = cache.totals()
    assert (totals.requests, totals.prompt_tokens, totals.cached_tokens) == (2, 2 * total, boundary(total))
    assert totals.uncached_tokens == 2 * total - boundary(total)
    assert cache.totals("summary").requests == 1 and cache.records("chat")[0].cached_tokens == 0
    cache.clear()
    assert cache.records() == [] and cache.totals().requests == 0
    assert cache.openai_chat(body).cached_tokens == 0  # the entries went too


def test_the_store_is_bounded() -> None:
    cache = PromptCache(max_entries=10)
    for seed in ("alpha", "beta", "gamma"):
        cache.openai_chat(chat(words(3000, seed)))
    assert len(cache) == 10


# ------------------------------------------------------------------------------------ Anthropic, unit


def claude(*blocks: Any, system: Any = None, tools: Any = None, **extra: Any) -> dict[str, Any]:
    """A Messages request whose user turns hold `blocks` (a string: a plain text block)."""
    content = [b if isinstance(b, dict) else {"type": "text", "text": b} for b in blocks]
    body: dict[str, Any] = {
        "model": CLAUDE,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": content}],
    }
    if system is not None:
        body["system"] = system
    if tools is not None:
        body["tools"] = tools
    return {**body, **extra}


def cached(text: str, **control: Any) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": {**EPHEMERAL, **control}}


def ends(cache: PromptCache, body: dict[str, Any]) -> list[int]:
    """The token count of the prefix ending at each block, by the simulator's own blocks."""
    out: list[int] = []
    for block in anthropic_blocks(cache.encoder(CLAUDE), body):
        out.append((out[-1] if out else 0) + block.count)
    return out


def test_a_breakpoint_writes_its_prefix_and_the_next_request_reads_it() -> None:
    cache = PromptCache()
    body = claude("What does it say?", system=[cached(words(1500))])
    total, written = cache.count_anthropic(body), ends(cache, body)[0]
    first = cache.anthropic(body)
    assert first == CacheUsage(total, 0, written, "messages")
    assert first.uncached_tokens == total - written > 0
    second = cache.anthropic(claude("Something else entirely?", system=[cached(words(1500))]))
    assert (second.cached_tokens, second.cache_write_tokens) == (written, 0)


def test_tools_come_first_and_the_last_tools_breakpoint_caches_them() -> None:
    cache = PromptCache()
    tools: list[dict[str, Any]] = [
        {"name": f"tool_{i}", "description": words(300), "input_schema": {"type": "object"}} for i in range(4)
    ]
    tools[-1] = {**tools[-1], "cache_control": EPHEMERAL}
    body = claude("Hi", system="Be brief.", tools=tools)
    assert cache.anthropic(body).cache_write_tokens == ends(cache, body)[3]
    other = claude("Another question", system="Be very brief.", tools=tools)
    assert cache.anthropic(other).cached_tokens == ends(cache, body)[3]  # the system changed, not the tools


def test_growing_conversation_reads_the_last_breakpoint_and_writes_the_new_one() -> None:
    cache = PromptCache()
    system = [cached(words(1200))]
    one = claude(cached(words(300, "beta")), system=system)
    cache.anthropic(one)
    two = claude(words(300, "beta"), "A new question", system=system)
    two["messages"][0]["content"][-1]["cache_control"] = EPHEMERAL
    marks = ends(cache, two)
    usage = cache.anthropic(two)
    # The first turn's breakpoint sat on the user block, now the second block of three: within lookback.
    assert usage.cached_tokens == ends(cache, one)[-1] == marks[1]
    assert usage.cache_write_tokens == marks[2] - marks[1]
    assert usage.uncached_tokens == 0


def test_reads_happen_only_at_breakpoints() -> None:
    cache = PromptCache()
    body = claude("Question?", system=[cached(words(1500))])
    cache.anthropic(body)
    unmarked = claude("Question?", system=[{"type": "text", "text": words(1500)}])
    usage = cache.anthropic(unmarked)
    assert usage == CacheUsage(cache.count_anthropic(unmarked), 0, 0, "messages")


def test_lookback_finds_an_entry_within_20_blocks_before_a_breakpoint() -> None:
    cache = PromptCache()
    system = [cached(words(1500))]
    cache.anthropic(claude("first", system=system))
    system = [{"type": "text", "text": words(1500)}]  # the same text, no breakpoint of its own now
    near = claude(*[f"note {i}" for i in range(19)], cached("last"), system=system)  # 20 blocks after
    usage = cache.anthropic(near)
    marks = ends(cache, near)
    assert usage.cached_tokens == marks[0] and usage.cache_write_tokens == marks[-1] - marks[0]
    far = claude(*[f"other {i}" for i in range(20)], cached("last"), system=system)  # 21 blocks after
    usage = cache.anthropic(far)
    assert usage.cached_tokens == 0 and usage.cache_write_tokens == cache.count_anthropic(far)


def test_a_prefix_under_the_minimum_is_not_cached() -> None:
    cache = PromptCache()
    body = claude("Question?", system=[cached(words(900))])
    assert ends(cache, body)[0] < 1024
    assert [cache.anthropic(body).cache_write_tokens for _ in range(2)] == [0, 0]
    big = PromptCache(min_tokens=2048)  # as for models with a larger minimum
    body = claude("Question?", system=[cached(words(1500))])
    assert [big.anthropic(body).cached_tokens for _ in range(2)] == [0, 0]


def test_ttl_of_a_breakpoint_five_minutes_or_one_hour() -> None:
    clock = Clock()
    cache = PromptCache(clock=clock)
    short = claude("q", system=[cached(words(1500, "alpha"))])
    long = claude("q", system=[cached(words(1500, "beta"), ttl="1h")])
    cache.anthropic(short)
    cache.anthropic(long)
    clock.now += 600
    assert cache.anthropic(short).cached_tokens == 0
    assert cache.anthropic(long).cached_tokens == ends(cache, long)[0]


def test_more_than_four_breakpoints_is_refused() -> None:
    cache = PromptCache()
    body = claude(*[cached(f"block {i}") for i in range(4)], system=[cached("system")])
    assert count_breakpoints(body) == 5
    with pytest.raises(
        BreakpointLimitError, match=r"A maximum of 4 blocks with cache_control may be provided\. Found 5\."
    ):
        cache.anthropic(body)
    assert cache.records() == []


# ------------------------------------------------------------------------------------ over HTTP


@pytest.fixture
def openai_fake() -> Iterator[tuple[FakeUpstream, OpenAI]]:
    fake = FakeUpstream()
    with BackgroundServer(fake.app()) as server:
        yield fake, OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)


@pytest.fixture
def anthropic_fake() -> Iterator[tuple[FakeAnthropic, anthropic.Anthropic]]:
    fake = FakeAnthropic()
    with BackgroundServer(fake.app()) as server:
        yield fake, anthropic.Anthropic(base_url=server.url, api_key="sk-ant-test", max_retries=0)


def test_chat_completions_report_cached_tokens(openai_fake: tuple[FakeUpstream, OpenAI]) -> None:
    fake, client = openai_fake
    body = chat("You are a careful assistant.", words(1920))
    total = fake.prompt_cache.count_chat(body)
    first = client.chat.completions.create(model=MODEL, messages=body["messages"])
    assert first.usage is not None and first.usage.prompt_tokens == total
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = client.chat.completions.create(model=MODEL, messages=body["messages"])
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens == boundary(total) == 1920
    assert second.usage.total_tokens == total + second.usage.completion_tokens
    stream = client.chat.completions.create(
        model=MODEL, messages=body["messages"], stream=True, stream_options={"include_usage": True}
    )
    usage = list(stream)[-1].usage
    assert usage is not None and usage.prompt_tokens == total
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 1920
    assert [r.cached_tokens for r in fake.prompt_cache.records("chat")] == [0, 1920, 1920]


def test_chat_completions_cache_per_prompt_cache_key(openai_fake: tuple[FakeUpstream, OpenAI]) -> None:
    fake, client = openai_fake
    body = chat("System.", words(1500))
    expected = boundary(fake.prompt_cache.count_chat(body))

    def cached_tokens(key: str) -> int:
        answer = client.chat.completions.create(model=MODEL, messages=body["messages"], prompt_cache_key=key)
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        return answer.usage.prompt_tokens_details.cached_tokens or 0

    assert [cached_tokens("a"), cached_tokens("b"), cached_tokens("a")] == [0, 0, expected]


def test_the_cache_expires_over_http() -> None:
    clock = Clock()
    fake = FakeUpstream(prompt_cache=PromptCache(ttl=60, clock=clock))
    body = chat("System.", words(1500))
    with BackgroundServer(fake.app()) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)
        seen = []
        for step in (0, 30, 61):
            clock.now += step
            answer = client.chat.completions.create(model=MODEL, messages=body["messages"])
            assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
            seen.append(answer.usage.prompt_tokens_details.cached_tokens)
    assert seen == [0, boundary(fake.prompt_cache.count_chat(body)), 0]


def test_summarisation_calls_are_cached_and_tagged(openai_fake: tuple[FakeUpstream, OpenAI]) -> None:
    fake, client = openai_fake
    messages: Any = [
        {"role": "system", "content": CHUNK_MARKER + " Summarise."},
        {"role": "user", "content": words(1500)},
    ]
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=messages)
    assert fake.summary_calls == 2
    assert [r.tag for r in fake.prompt_cache.records()] == ["summary", "summary"]
    assert fake.prompt_cache.records()[1].cached_tokens > 0


def test_simulation_off_reports_no_cached_tokens(openai_fake: tuple[FakeUpstream, OpenAI]) -> None:
    fake, client = openai_fake
    fake.simulate_cache = False
    body = chat("System.", words(1500))
    for _ in range(2):
        answer = client.chat.completions.create(model=MODEL, messages=body["messages"])
        assert answer.usage is not None and answer.usage.prompt_tokens == fake.prompt_cache.count_chat(body)
        assert answer.usage.prompt_tokens_details is not None
        assert answer.usage.prompt_tokens_details.cached_tokens == 0
    assert fake.prompt_cache.records() == []


def test_responses_report_cached_input_tokens(openai_fake: tuple[FakeUpstream, OpenAI]) -> None:
    fake, client = openai_fake
    request: dict[str, Any] = {"model": MODEL, "instructions": "Be brief.", "input": words(1500)}
    total = fake.prompt_cache.count_responses(request)
    first = client.responses.create(**request)
    second = client.responses.create(**request)
    assert first.usage is not None and second.usage is not None
    assert first.usage.input_tokens == second.usage.input_tokens == total
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert second.usage.input_tokens_details.cached_tokens == boundary(total)
    with client.responses.stream(**request) as stream:
        final = stream.get_final_response()
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == boundary(total)


def test_messages_report_cache_writes_then_reads(
    anthropic_fake: tuple[FakeAnthropic, anthropic.Anthropic],
) -> None:
    fake, client = anthropic_fake
    request: dict[str, Any] = {
        "model": CLAUDE,
        "max_tokens": 64,
        "system": [cached(words(1500))],
        "messages": [{"role": "user", "content": "What does it say?"}],
    }
    total = fake.prompt_cache.count_anthropic(request)
    written = ends(fake.prompt_cache, request)[0]
    first = client.messages.create(**request).usage
    assert (first.input_tokens, first.cache_creation_input_tokens, first.cache_read_input_tokens) == (
        total - written,
        written,
        0,
    )
    second = client.messages.create(**request).usage
    assert (second.input_tokens, second.cache_creation_input_tokens, second.cache_read_input_tokens) == (
        total - written,
        0,
        written,
    )
    assert (
        client.messages.count_tokens(**{k: v for k, v in request.items() if k != "max_tokens"}).input_tokens
        == total
    )


def test_streamed_messages_carry_usage_at_start_and_end(
    anthropic_fake: tuple[FakeAnthropic, anthropic.Anthropic],
) -> None:
    fake, client = anthropic_fake
    request: dict[str, Any] = {
        "model": CLAUDE,
        "max_tokens": 64,
        "system": [cached(words(1500))],
        "messages": [{"role": "user", "content": "What does it say?"}],
    }
    client.messages.create(**request)
    written = ends(fake.prompt_cache, request)[0]
    total = fake.prompt_cache.count_anthropic(request)
    events = list(client.messages.create(**request, stream=True))
    start = next(e for e in events if e.type == "message_start").message.usage
    delta = next(e for e in events if e.type == "message_delta").usage
    for usage in (start, delta):
        assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (
            total - written,
            written,
            0,
        )
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message().usage
    assert final.cache_read_input_tokens == written and final.output_tokens > 1


def test_more_than_four_breakpoints_is_anthropics_400(
    anthropic_fake: tuple[FakeAnthropic, anthropic.Anthropic],
) -> None:
    fake, client = anthropic_fake
    fake.enqueue(Reply(text="Kept for the next valid request."))
    content = [cached(f"block {i}") for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": content}])
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        },
    }
    assert fake.received and fake.prompt_cache.records() == []  # received, refused before measuring
    answer = client.messages.create(
        model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": content[:4]}]
    )
    assert answer.content[0].type == "text" and answer.content[0].text == "Kept for the next valid request."
