"""Conversations through the real gateway and the official SDK: storage, identity, branches, budgets."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import openai
import pytest

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer
from gateway.fakes.openai_upstream import Reply
from tests.conftest import GATEWAY_KEY, Clock, Gateway, Upstream, recorded, tenant

AUTH = {"Authorization": f"Bearer {GATEWAY_KEY}"}
SYSTEM = {"role": "system", "content": "You are a meticulous assistant. Keep answers short."}
TOKENIZER = TiktokenTokenizer.for_model("gpt-4o")


def api(gateway: Gateway, path: str, key: str = GATEWAY_KEY) -> Any:
    response = httpx.get(f"{gateway.server.url}/api{path}", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def chat(gateway: Gateway, messages: list[Any], **kwargs: Any) -> tuple[str, httpx.Headers]:
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, **kwargs
    )
    return raw.parse().choices[0].message.content or "", raw.headers


def user_turn(n: int) -> str:
    return f"Turn {n}: please note item-{n:03d} and the number {n * 7919 % 10007} for later, thanks."


def test_300_turn_replay_is_bounded_and_stored_once(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    budget = 3_000
    # Window only here (summaries and retrieval have their own tests): the tail must be exactly the
    # client's messages.
    only_window = {"compaction": {"enabled": False}, "retrieval": {"enabled": False}}
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, context={"budget_tokens": budget}, **only_window)]
    )
    messages: list[Any] = [SYSTEM]
    for turn in range(300):
        messages.append({"role": "user", "content": user_turn(turn)})
        answer, headers = chat(gateway, messages)
        messages.append({"role": "assistant", "content": answer})
        forwarded = upstream.fake.last_chat().body["messages"]
        sent = TOKENIZER.count_messages(forwarded)
        assert sent <= budget, (turn, sent)
        assert int(headers["x-context-tokens-sent"]) == sent
        assert int(headers["x-context-tokens-original"]) == TOKENIZER.count_messages(messages[:-1])
        assert forwarded[0] == SYSTEM
        # The tail is the verbatim recent window, ending with the current question.
        assert forwarded[1:] == messages[len(messages) - len(forwarded) : -1]
        assert forwarded[1]["role"] == "user"
        if TOKENIZER.count_messages(messages[:-1]) <= budget:
            assert forwarded == messages[:-1]
    assert len(forwarded) > 20  # the window is full, not a token handful

    conversations = api(gateway, "/conversations")["data"]
    assert len(conversations) == 1
    stored = api(gateway, f"/conversations/{conversations[0]['id']}/messages")["data"]
    assert [m["message"] for m in stored] == messages[
        1:
    ]  # every turn once, in order, the system prompt aside
    assert [m["depth"] for m in stored] == list(range(600))
    report = api(gateway, f"/requests/{headers['x-gateway-request-id']}")
    assert report["report"]["unchanged"] is False
    assert report["report"]["sections"]["window"]["tokens"] > 0
    assert report["report"]["cut"]["messages"] == 599 - len(forwarded) + 1
    assert report["status"] == "complete"


def test_regeneration_and_edit_become_sibling_branches(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply("A1"), Reply("A2"), Reply("A2 again"), Reply("B2"))
    history: list[Any] = [{"role": "user", "content": "Q1"}]
    a1, first = chat(gateway, history)
    history += [{"role": "assistant", "content": a1}, {"role": "user", "content": "Q2"}]
    _, second = chat(gateway, history)
    _, regenerated = chat(gateway, history)  # the app's "regenerate" resends the same history
    edited = [*history[:2], {"role": "user", "content": "Q2 edited"}]
    _, edit = chat(gateway, edited)

    conversation_id = first["x-conversation-id"]
    assert {h["x-conversation-id"] for h in (second, regenerated, edit)} == {conversation_id}
    tree = api(gateway, f"/conversations/{conversation_id}/messages")["data"]
    by_id = {m["id"]: m for m in tree}
    children: dict[str | None, list[str]] = {}
    for node in tree:
        children.setdefault(node["parent_id"], []).append(node["message"]["content"])
    a1_id = next(m["id"] for m in tree if m["message"]["content"] == "A1")
    q2_id = next(m["id"] for m in tree if m["message"]["content"] == "Q2")
    assert sorted(children[a1_id]) == ["Q2", "Q2 edited"]
    assert sorted(children[q2_id]) == ["A2", "A2 again"]
    assert len(tree) == 7

    leaf = next(m["id"] for m in tree if m["message"]["content"] == "B2")
    path = api(gateway, f"/conversations/{conversation_id}/path/{leaf}")["data"]
    assert [m["message"]["content"] for m in path] == ["Q1", "A1", "Q2 edited", "B2"]
    assert by_id[leaf]["depth"] == 3


def test_thin_mode_supplies_history_from_the_store(gateway: Gateway, upstream: Upstream) -> None:
    headers = {"X-Conversation-Id": "chat-42", "X-User-Id": "ana"}
    client = gateway.client(default_headers=headers)
    upstream.fake.enqueue(Reply("Noted: Lisbon."), Reply("You said Lisbon."), Reply("Porto is north."))
    client.chat.completions.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": "I live in Lisbon."}]
    )
    client.chat.completions.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": "Where do I live?"}]
    )
    assert upstream.fake.last_chat().body["messages"] == [
        SYSTEM,
        {"role": "user", "content": "I live in Lisbon."},
        {"role": "assistant", "content": "Noted: Lisbon."},
        {"role": "user", "content": "Where do I live?"},
    ]
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "And Porto?"}]
    )
    assert [m["content"] for m in upstream.fake.last_chat().body["messages"]] == [
        "I live in Lisbon.", "Noted: Lisbon.", "Where do I live?", "You said Lisbon.", "And Porto?"
    ]  # fmt: skip
    conversation = api(gateway, f"/conversations/{raw.headers['x-conversation-id']}")
    assert (conversation["external_id"], conversation["user_id"], conversation["message_count"]) == (
        "chat-42",
        "ana",
        6,
    )


def test_thin_mode_on_an_explicit_branch_point(gateway: Gateway, upstream: Upstream) -> None:
    client = gateway.client(default_headers={"X-Conversation-Id": "chat-7"})
    upstream.fake.enqueue(Reply("first answer"), Reply("second answer"), Reply("branch answer"))
    one = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "one"}]
    )
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "two"}])
    branch = gateway.client(
        default_headers={"X-Conversation-Id": "chat-7", "X-Parent-Message-Id": one.headers["x-message-id"]}
    )
    branch.chat.completions.create(model="m", messages=[{"role": "user", "content": "two, differently"}])
    assert [m["content"] for m in upstream.fake.last_chat().body["messages"]] == ["one", "two, differently"]


def test_tool_exchanges_are_never_split(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, context={"budget_tokens": 900})])
    messages: list[Any] = [SYSTEM]
    for turn in range(30):
        call_id = f"call_{turn}"
        messages += [
            {"role": "user", "content": f"Look up order {turn}."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": f'{{"order": {turn}}}'}}
            ]},
            {"role": "tool", "tool_call_id": call_id, "content": "status: shipped " + "detail " * (turn % 5 * 10)},
            {"role": "assistant", "content": f"Order {turn} has shipped."},
        ]  # fmt: skip
    for end in range(5, len(messages), 4):
        upstream.fake.enqueue(Reply("ok"))
        history = [*messages[:end], {"role": "user", "content": "Next?"}]
        chat(gateway, history)
        forwarded = upstream.fake.last_chat().body["messages"]
        assert TOKENIZER.count_messages(forwarded) <= 900
        # After the system prompt (and the gateway's summary block, once there is one) comes a user turn.
        assert next(m for m in forwarded[1:] if m["role"] != "system")["role"] == "user"
        announced = {c["id"] for m in forwarded if m.get("tool_calls") for c in m["tool_calls"]}
        answered = {m["tool_call_id"] for m in forwarded if m["role"] == "tool"}
        assert announced == answered


def test_tenants_are_isolated_in_identity_store_and_api(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url), tenant("globex", upstream.base_url)])
    same = [{"role": "user", "content": "Our launch code is 0000."}]
    acme = gateway.client("sk-gw-acme", default_headers={"X-Conversation-Id": "shared-name"})
    globex = gateway.client("sk-gw-globex", default_headers={"X-Conversation-Id": "shared-name"})
    a = acme.chat.completions.with_raw_response.create(model="m", messages=same)  # type: ignore[arg-type]
    g = globex.chat.completions.with_raw_response.create(model="m", messages=same)  # type: ignore[arg-type]
    assert a.headers["x-conversation-id"] != g.headers["x-conversation-id"]
    # Thin mode in globex never reaches acme's history, though the external id is the same.
    globex.chat.completions.create(model="m", messages=[{"role": "user", "content": "What was it?"}])  # type: ignore[arg-type]
    forwarded = upstream.fake.last_chat().body["messages"]
    assert [m["content"] for m in forwarded] == [
        "Our launch code is 0000.",
        "(fake model) I read 1 messages. You said: Our launch code is 0000.",
        "What was it?",
    ]

    assert [c["id"] for c in api(gateway, "/conversations", "sk-gw-globex")["data"]] == [
        g.headers["x-conversation-id"]
    ]
    for path in (
        f"/conversations/{a.headers['x-conversation-id']}",
        f"/requests/{a.headers['x-gateway-request-id']}",
    ):
        response = httpx.get(
            f"{gateway.server.url}/api{path}", headers={"Authorization": "Bearer sk-gw-globex"}
        )
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_stream_answers_are_stored_with_their_status(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply("streamed answer here"), Reply("one two three four", break_after_chunks=3))
    stream = gateway.client().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "s1"}], stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
        == "streamed answer here"
    )
    broken = gateway.client().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "s2"}], stream=True
    )
    with pytest.raises(openai.APIError):
        list(broken.parse())
    complete = api(gateway, f"/requests/{stream.headers['x-gateway-request-id']}")
    partial = api(gateway, f"/requests/{broken.headers['x-gateway-request-id']}")
    assert (complete["status"], complete["usage"]["completion_tokens"]) == ("complete", 3)
    assert partial["status"] == "partial" and "upstream" in partial["error"]
    tree = api(gateway, f"/conversations/{stream.headers['x-conversation-id']}/messages")["data"]
    assert [m["message"] for m in tree] == [
        {"role": "user", "content": "s1"},
        {"role": "assistant", "content": "streamed answer here"},
    ]


def test_broken_store_still_forwards(gateway: Gateway, upstream: Upstream, tmp_path: Path) -> None:
    chat(gateway, [{"role": "user", "content": "before"}])
    with sqlite3.connect(tmp_path / "gateway.db") as connection:
        connection.execute("DROP TABLE messages")
    messages = [{"role": "user", "content": "after the store broke"}]
    answer, headers = chat(gateway, messages)
    assert answer.endswith("after the store broke")
    assert upstream.fake.last_chat().body["messages"] == messages
    counters = httpx.get(f"{gateway.server.url}/healthz").json()["counters"]
    assert counters["fail_open"] == 1
    assert "x-conversation-id" not in headers


def test_api_needs_a_real_key(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("open", upstream.base_url, api_keys=[], pass_through_client_key=True)])
    response = httpx.get(
        f"{gateway.server.url}/api/conversations", headers={"Authorization": "Bearer anything"}
    )
    assert response.status_code == 401
    bad = httpx.get(f"{gateway.server.url}/api/conversations?limit=x", headers=AUTH)
    assert bad.status_code == 401  # unknown key for this gateway: no tenant has sk-gw-acme


def test_api_rejects_bad_parameters(gateway: Gateway) -> None:
    response = httpx.get(f"{gateway.server.url}/api/conversations?limit=-1", headers=AUTH)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "limit"


def test_thin_mode_reads_only_what_the_budget_can_hold(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    only_window = {"compaction": {"enabled": False}, "retrieval": {"enabled": False}}
    gateway = make_gateway([tenant("acme", upstream.base_url, context={"budget_tokens": 600}, **only_window)])
    client = gateway.client(default_headers={"X-Conversation-Id": "long-thin"})
    for turn in range(40):
        question = {"role": "user", "content": user_turn(turn)}
        client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, question])  # type: ignore[list-item]
        forwarded = upstream.fake.last_chat().body["messages"]
        assert TOKENIZER.count_messages(forwarded) <= 600
        assert forwarded[0] == SYSTEM and forwarded[-1] == question
        assert forwarded[1]["role"] == "user"
    assert len(forwarded) > 6
    # Verbatim and in order: the window is the stored conversation's newest stretch.
    contents = [m["content"] for m in forwarded[1:-1]]
    kept = len(contents) // 2
    assert contents[0::2] == [user_turn(t) for t in range(39 - kept, 39)]


def test_pure_proxy_tenant_stores_and_rewrites_nothing(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, store_conversations=False, context={"budget_tokens": 100})]
    )
    messages = [{"role": "user", "content": user_turn(n)} for n in range(20)]
    _, headers = chat(gateway, messages)
    assert upstream.fake.last_chat().body["messages"] == messages
    assert "x-conversation-id" not in headers
    assert api(gateway, "/conversations")["data"] == []


def test_openwebui_chat_id_names_the_conversation_but_edits_still_branch(
    gateway: Gateway, upstream: Upstream
) -> None:
    client = gateway.client(default_headers={"X-OpenWebUI-Chat-Id": "owui-1", "X-OpenWebUI-User-Id": "u-9"})
    first = [{"role": "user", "content": "Plan a trip to Rome."}]
    a1 = client.chat.completions.create(model="m", messages=first).choices[0].message.content  # type: ignore[arg-type]
    client.chat.completions.create(
        model="m",
        messages=[*first, {"role": "assistant", "content": a1}, {"role": "user", "content": "In May."}],  # type: ignore[list-item]
    )
    # Editing the first message: Open WebUI sends it alone; it must not be appended to the old chat.
    edited = [{"role": "user", "content": "Plan a trip to Oslo."}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=edited)  # type: ignore[arg-type]
    assert upstream.fake.last_chat().body["messages"] == edited
    conversation = api(gateway, f"/conversations/{raw.headers['x-conversation-id']}")
    assert (conversation["external_id"], conversation["user_id"]) == ("owui-1", "u-9")
    tree = api(gateway, f"/conversations/{conversation['id']}/messages")["data"]
    roots = sorted(m["message"]["content"] for m in tree if m["parent_id"] is None)
    assert roots == ["Plan a trip to Oslo.", "Plan a trip to Rome."]


def test_two_gateways_sharing_a_database_with_their_own_node_caches(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    storage = {"database_url": f"sqlite:///{tmp_path}/shared.db", "data_dir": str(tmp_path / "data")}
    tenants = [tenant("acme", upstream.base_url, compaction={"enabled": False})]
    replicas = [make_gateway(tenants, storage=storage), make_gateway(tenants, storage=storage)]
    messages: list[Any] = [SYSTEM]
    conversation_ids = set()
    for turn in range(12):  # a load balancer alternating between the two replicas
        messages.append({"role": "user", "content": user_turn(turn)})
        answer, headers = chat(replicas[turn % 2], messages)
        messages.append({"role": "assistant", "content": answer})
        conversation_ids.add(headers["x-conversation-id"])
    assert len(conversation_ids) == 1
    tree = api(replicas[0], f"/conversations/{conversation_ids.pop()}/messages")["data"]
    assert [m["message"] for m in tree] == messages[1:]
    assert [m["parent_id"] for m in tree[1:]] == [m["id"] for m in tree[:-1]]


def test_thin_client_repeating_its_first_message_continues_the_chat(
    gateway: Gateway, upstream: Upstream
) -> None:
    client = gateway.client(default_headers={"X-Conversation-Id": "repeat"})
    upstream.fake.enqueue(Reply("Chapter one."), Reply("Chapter two."))
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "continue"}])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "continue"}])
    assert [m["content"] for m in upstream.fake.last_chat().body["messages"]] == [
        "continue",
        "Chapter one.",
        "continue",
    ]


def test_a_long_agent_loop_is_cut_by_whole_steps(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    # The budget yields to a tool loop while the model's window holds it; past the window (900 tokens
    # once the 4,000-token answer reserve is set aside), the loop is cut by whole steps.
    context = {"budget_tokens": 900, "context_window_tokens": 4_900}
    gateway = make_gateway([tenant("acme", upstream.base_url, context=context)])
    question = {"role": "user", "content": "Find every failing test and fix it."}
    messages: list[Any] = [SYSTEM, question]
    for step in range(30):  # one question, then a tool loop with no user turn in between
        call_id = f"call_{step}"
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "run", "arguments": f'{{"step": {step}}}'}}
            ]},
            {"role": "tool", "tool_call_id": call_id, "content": f"step {step} output " + "log " * 40},
        ]  # fmt: skip
    upstream.fake.enqueue(Reply("done"))
    _, headers = chat(gateway, messages)
    forwarded = upstream.fake.last_chat().body["messages"]
    assert TOKENIZER.count_messages(forwarded) <= 900
    assert forwarded[:2] == [SYSTEM, question]
    assert forwarded[-2:] == messages[-2:]  # the newest step is kept
    announced = [c["id"] for m in forwarded if m.get("tool_calls") for c in m["tool_calls"]]
    answered = [m["tool_call_id"] for m in forwarded if m["role"] == "tool"]
    assert announced == answered and len(announced) < 30
    report = api(gateway, f"/requests/{headers['x-gateway-request-id']}")["report"]
    assert report["sections"]["current"]["trimmed_messages"] == 2 * (30 - len(announced))


def test_system_prompt_in_the_chain_is_counted_and_kept(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    long_system = {"role": "system", "content": "Rules: " + "be exact and cite sources. " * 60}
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, context={"budget_tokens": 1500}, identity={"system_in_chain": True},
                compaction={"enabled": False})]
    )  # fmt: skip
    messages: list[Any] = [long_system]
    for turn in range(60):
        messages.append({"role": "user", "content": user_turn(turn)})
        answer, _ = chat(gateway, messages)
        messages.append({"role": "assistant", "content": answer})
        forwarded = upstream.fake.last_chat().body["messages"]
        assert forwarded[0] == long_system
        assert TOKENIZER.count_messages(forwarded) <= 1500, turn


def test_a_branch_point_in_another_conversation_decides_the_conversation(
    gateway: Gateway, upstream: Upstream
) -> None:
    first = gateway.client(default_headers={"X-Conversation-Id": "conv-a"})
    raw = first.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "in A"}]
    )
    other = gateway.client(
        default_headers={"X-Conversation-Id": "conv-b", "X-Parent-Message-Id": raw.headers["x-message-id"]}
    )
    branched = other.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "continue A"}]
    )
    assert branched.headers["x-conversation-id"] == raw.headers["x-conversation-id"]
    assert [m["content"] for m in upstream.fake.last_chat().body["messages"]] == ["in A", "continue A"]


def test_conversations_are_found_by_text_and_by_date(
    upstream: Upstream, make_gateway: Callable[..., Gateway], database_url: str, tmp_path: Path
) -> None:
    clock = Clock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])],
        clock=clock,
        storage={"database_url": database_url, "data_dir": str(tmp_path / "data")},
    )
    ids = {}
    for name, day, text in [
        ("march", datetime(2026, 3, 2, 9, 0, tzinfo=UTC), "The Lisbon flight is TP-8841."),
        ("april", datetime(2026, 4, 7, 18, 30, tzinfo=UTC), "Book the 端口 review with 100% of the team."),
        ("may", datetime(2026, 5, 1, 0, 0, tzinfo=UTC), "Nothing about flights here (tp_8841 is not it)."),
    ]:
        clock.now = day
        upstream.fake.enqueue(Reply("Noted."))
        _, headers = chat(gateway, [{"role": "user", "content": text}], extra_headers={"X-User-Id": name})
        ids[name] = headers["x-conversation-id"]
        recorded(gateway, headers["x-gateway-request-id"])  # stored (and dated) before the clock moves

    def found(**params: str) -> list[str]:
        listed = api(gateway, "/conversations?" + urlencode(params))["data"]
        return sorted(name for name, cid in ids.items() if cid in {c["id"] for c in listed})

    assert found() == ["april", "march", "may"]
    assert found(q="tp-8841") == ["march"]  # case-insensitive, and "_" is no wildcard
    assert found(q="端口") == ["april"]  # text without spaces
    assert found(q="100%") == ["april"]  # nor is "%"
    assert found(q="flight") == ["march", "may"]
    assert found(since="2026-04-07") == ["april", "may"]
    assert found(until="2026-04-07") == ["april", "march"]  # a date takes in that whole day
    assert found(since="2026-03-03", until="2026-04-30") == ["april"]
    assert found(until="2026-04-07T18:00:00Z") == ["march"]
    assert found(q="flight", since="2026-04-01") == ["may"]
    for name, bad in [("since", "last week"), ("until", "2026-13-01"), ("q", "x" * 201)]:
        refused = httpx.get(f"{gateway.server.url}/api/conversations", params={name: bad}, headers=AUTH)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == name, refused.text
