"""The body memo: a resent chat body is parsed only where it is new, with the result `orjson.loads` gives."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.metrics import Counters
from gateway.pipeline.body_memo import BodyMemo
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, tenant

Body = Callable[[list[dict[str, Any]]], bytes]


def history(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    system = {"role": "system", "content": "You are a careful assistant. " * 200}
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} {rng.random()} héllo ✓ " * 20}
        for i in range(n)
    ]
    return [system, *turns]


def compact(messages: list[dict[str, Any]]) -> bytes:  # what the openai and anthropic SDKs send (httpx)
    return json.dumps(
        {"messages": messages, "model": "m"}, separators=(",", ":"), ensure_ascii=False
    ).encode()


def memo(max_bytes: int = 64 << 20) -> tuple[BodyMemo, Counters]:
    counters = Counters()
    return BodyMemo(max_bytes, counters), counters


def test_a_growing_history_is_parsed_only_where_it_is_new() -> None:
    bodies, counters = memo()
    messages = history(400)
    first = bodies.loads(compact(messages[:300]))
    assert first == orjson.loads(compact(messages[:300]))
    assert counters.body_messages_reused == 0
    second = bodies.loads(compact(messages[:302]))
    assert second == orjson.loads(compact(messages[:302]))
    assert counters.body_messages_reused == 299  # all but the last one sent, which ended the array
    assert isinstance(first, dict) and isinstance(second, dict)
    # the reused messages are the earlier parse's own objects (the history memo compares by identity)
    assert all(a is b for a, b in zip(first["messages"][:299], second["messages"], strict=False))
    third = bodies.loads(compact(messages[:400]))
    assert third == orjson.loads(compact(messages[:400]))
    assert counters.body_messages_reused == 299 + 301
    assert len(bodies) == 1  # one conversation: its entry replaced, not added


def test_an_edited_message_is_parsed_again_from_the_edit_on() -> None:
    bodies, counters = memo()
    messages = history(300)
    bodies.loads(compact(messages))
    edited = [*messages[:150], {"role": "user", "content": "changed"}, *messages[151:]]
    assert bodies.loads(compact(edited)) == orjson.loads(compact(edited))
    assert counters.body_messages_reused == 150


@pytest.mark.parametrize(
    ("spell", "reused"),
    [
        (lambda b: json.dumps(b).encode(), 0),  # requests' json=: spaces and \u escapes
        (lambda b: json.dumps(b, indent=2).encode(), 0),
        # compact but ASCII-escaped: only the leading system message (plain ASCII) is spelt as orjson does
        (lambda b: json.dumps(b, separators=(",", ":")).encode(), 2),
    ],
    ids=["spaced", "indented", "ascii"],
)
def test_bodies_spelt_otherwise_are_parsed_in_full_and_right(
    spell: Callable[[Any], bytes], reused: int
) -> None:
    bodies, counters = memo()
    messages = history(300)
    for n in (200, 202, 300):
        raw = spell({"model": "m", "messages": messages[:n]})
        assert bodies.loads(raw) == orjson.loads(raw)
    assert counters.body_messages_reused == reused


def test_only_the_top_level_messages_key_is_spliced() -> None:
    bodies, counters = memo()
    messages = history(300)
    decoy = {"role": "user", "content": "not the conversation"}
    for n in (200, 202):
        # a nested `messages` array before the real one, and a key after it
        raw = orjson.dumps(
            {"metadata": {"messages": [decoy] * 3}, "model": "m", "messages": messages[:n], "stream": True}
        )
        assert bodies.loads(raw) == orjson.loads(raw)
    # a duplicate top-level key, which orjson resolves to the last: the memo must agree
    raw = compact(messages[:204])[:-1] + b',"messages":[{"role":"user","content":"last wins"}]}'
    assert bodies.loads(raw) == orjson.loads(raw)
    assert bodies.loads(raw)["messages"] == [{"role": "user", "content": "last wins"}]  # type: ignore[index]
    assert counters.body_messages_reused == 0  # the nested arrays stop the memo, and nothing is wrong


def test_invalid_json_after_the_reused_stretch_reports_the_clients_own_position() -> None:
    bodies, _ = memo()
    messages = history(300)
    bodies.loads(compact(messages))
    broken = compact(messages[:302])[:-40] + b"}}"
    with pytest.raises(orjson.JSONDecodeError) as expected:
        orjson.loads(broken)
    with pytest.raises(orjson.JSONDecodeError) as got:
        bodies.loads(broken)
    assert str(got.value) == str(expected.value)


def test_the_memo_is_bounded_by_bytes() -> None:
    one = len(compact(history(300)))
    bodies, _ = memo(max_bytes=int(one * 2.5))
    for seed in range(6):
        bodies.loads(compact(history(300, seed)))
        assert bodies.bytes_held <= bodies.max_bytes
    assert len(bodies) == 2
    small, counters = memo()
    small.loads(compact(history(3)))  # below min_bytes: parsed as it is, nothing kept
    assert len(small) == 0 and counters.body_messages_reused == 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.text(max_size=300) | json_values}
)


@settings(max_examples=60, deadline=None)
@given(
    base=st.lists(message, min_size=1, max_size=60),
    steps=st.lists(
        st.tuples(st.integers(0, 60), st.lists(message, max_size=4), st.booleans(), st.booleans()), max_size=6
    ),
)
def test_any_sequence_of_bodies_parses_as_orjson_does(
    base: list[dict[str, Any]], steps: list[tuple[int, list[dict[str, Any]], bool, bool]]
) -> None:
    """Branches, edits, other spellings and keys in any order: the memo's result is orjson's, always."""
    bodies = BodyMemo(64 << 20, Counters(), min_bytes=0)
    padding = {"role": "system", "content": "x" * 2000}
    current = [padding, *base]
    for keep, new, model_first, spaced in steps:
        current = current[: keep + 1] + new
        body = {"model": "m", "messages": current} if model_first else {"messages": current, "model": "m"}
        raw = json.dumps(body).encode() if spaced else orjson.dumps(body)
        assert bodies.loads(raw) == orjson.loads(raw)


def test_a_long_conversation_resent_through_the_gateway_reuses_its_parse(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """The real server and SDK: a long history resent with new turns is stored once, forwarded whole
    (it fits the budget), and its second request reuses the first one's parse."""
    budget = {"budget_tokens": 200_000, "recent_tokens": 150_000, "context_window_tokens": 400_000}
    gateway = make_gateway([tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], context=budget)])
    client = gateway.client()
    messages: list[Any] = history(120)
    for _ in range(3):
        reply = client.chat.completions.create(model="gpt-4o", messages=messages)
        messages = [*messages, {"role": "assistant", "content": reply.choices[0].message.content}]
        messages.append({"role": "user", "content": f"and then? {len(messages)}"})
    sent = upstream.fake.chat_requests()[-1].body["messages"]
    assert sent == messages[:-2]
    counters = httpx.get(f"{gateway.server.url}/healthz").json()["counters"]
    assert counters["body_messages_reused"] >= 2 * 120
    conversations = api(gateway, "/conversations")["data"]
    assert len(conversations) == 1 and conversations[0]["message_count"] == len(messages) - 2
    # (the system prompt is not in the chain; the last question was never sent; the last answer was)
