"""The SQL store on real SQLite and real Postgres: tree, paths, idempotence, losslessness, isolation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.adapters.sql.store import SqlStore
from gateway.records import AppendRequest, NewMessage, RequestRecord

MULTIMODAL: dict[str, Any] = {
    "role": "user",
    "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
    ],
    "name": "ana",
}
TOOL_CALL: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
}
TOOL_RESULT: dict[str, Any] = {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'}


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    store = SqlStore.open(database_url)
    yield store
    asyncio.run(store.aclose())


def chain(
    *messages: dict[str, Any], parent: str | None = None, depth: int = 0, prefix: str = "n"
) -> list[NewMessage]:
    out = []
    path_tokens = 0
    for offset, message in enumerate(messages):
        node_id = f"{prefix}{depth + offset:031d}"[:32]
        path_tokens += 10 + offset
        out.append(
            NewMessage(
                node_id, parent, depth + offset, str(message["role"]), message, 10 + offset, path_tokens
            )
        )
        parent = node_id
    return out


def record(request_id: str, tenant: str, conversation_id: str | None) -> RequestRecord:
    return RequestRecord(
        id=request_id, tenant=tenant, conversation_id=conversation_id, user_id="u", parent_message_id=None,
        model="m", stream=False, status="complete", http_status=200, original_tokens=100, sent_tokens=50,
        report={"unchanged": False, "sections": {"window": {"tokens": 40}}}, usage={"total_tokens": 7},
        error=None, latency_ms=1.5, created_at=datetime.now(UTC),
    )  # fmt: skip


def test_append_lookup_path_and_lossless_content(store: SqlStore) -> None:
    async def scenario() -> None:
        messages = chain(MULTIMODAL, TOOL_CALL, TOOL_RESULT)
        conversation_id = await store.append(AppendRequest("acme", None, "u1", None, tuple(messages)))
        lookup = await store.lookup("acme", [m.id for m in messages] + ["f" * 32], None)
        assert set(lookup.nodes) == {m.id for m in messages}
        assert lookup.nodes[messages[2].id].depth == 2
        assert lookup.nodes[messages[2].id].token_count == 12
        assert lookup.nodes[messages[2].id].path_tokens == 10 + 11 + 12
        assert lookup.nodes[messages[1].id].conversation_id == conversation_id

        path = await store.path("acme", messages[2].id)
        assert [m.data for m in path] == [MULTIMODAL, TOOL_CALL, TOOL_RESULT]
        assert [m.node.parent_id for m in path] == [None, messages[0].id, messages[1].id]

        conversation = await store.get_conversation("acme", conversation_id)
        assert conversation is not None
        assert (conversation.user_id, conversation.message_count) == ("u1", 3)
        assert (conversation.root_id, conversation.last_message_id) == (messages[0].id, messages[2].id)

    asyncio.run(scenario())


def test_a_stretch_of_a_path_is_read_from_its_older_end(store: SqlStore) -> None:
    async def scenario() -> None:
        messages = chain(*({"role": "user", "content": f"m{i}"} for i in range(10)))
        await store.append(AppendRequest("acme", None, "u1", None, tuple(messages)))
        leaf = messages[-1].id

        async def read(newest: int | None, through: int | None) -> list[str]:
            path = await store.path("acme", leaf, newest_messages=newest, through_depth=through)
            return [m.data["content"] for m in path]

        assert await read(None, 2) == ["m0", "m1", "m2"]
        assert await read(7, 5) == ["m3", "m4", "m5"]  # depths 3 to 5: past the older 3, through 5
        assert await read(7, None) == [f"m{i}" for i in range(3, 10)]
        assert await read(None, 9) == await read(None, None)

    asyncio.run(scenario())


def test_same_node_is_stored_once_even_when_requests_race(store: SqlStore) -> None:
    async def scenario() -> None:
        first = chain({"role": "user", "content": "hi"})
        conversation_id = await store.append(AppendRequest("acme", None, None, None, tuple(first)))
        answer = chain({"role": "assistant", "content": "hello"}, parent=first[0].id, depth=1)
        request = AppendRequest("acme", conversation_id, None, None, tuple(answer))
        await asyncio.gather(*(store.append(request) for _ in range(8)))
        messages = await store.conversation_messages("acme", conversation_id)
        assert [m.data["content"] for m in messages] == ["hi", "hello"]
        conversation = await store.get_conversation("acme", conversation_id)
        assert conversation is not None and conversation.message_count == 2

    asyncio.run(scenario())


def test_branches_share_their_prefix(store: SqlStore) -> None:
    async def scenario() -> None:
        trunk = chain({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})
        conversation_id = await store.append(AppendRequest("acme", None, None, None, tuple(trunk)))
        left = chain({"role": "user", "content": "left"}, parent=trunk[1].id, depth=2, prefix="l")
        right = chain({"role": "user", "content": "right"}, parent=trunk[1].id, depth=2, prefix="r")
        for branch in (left, right):
            await store.append(AppendRequest("acme", conversation_id, None, None, tuple(branch)))
        assert [m.data["content"] for m in await store.path("acme", left[0].id)] == ["q", "a", "left"]
        assert [m.data["content"] for m in await store.path("acme", right[0].id)] == ["q", "a", "right"]
        tree = await store.conversation_messages("acme", conversation_id)
        assert sorted(m.data["content"] for m in tree if m.node.parent_id == trunk[1].id) == ["left", "right"]

    asyncio.run(scenario())


def test_tenants_never_see_each_other(store: SqlStore) -> None:
    async def scenario() -> None:
        messages = chain({"role": "user", "content": "secret"})
        conversation_id = await store.append(AppendRequest("acme", None, None, "chat-1", tuple(messages)))
        await store.complete(record("r1", "acme", conversation_id), None)

        assert (await store.lookup("globex", [messages[0].id], "chat-1")).nodes == {}
        assert (await store.lookup("globex", [], "chat-1")).conversation is None
        assert (await store.lookup("acme", [], "chat-1")).conversation is not None
        assert await store.path("globex", messages[0].id) == []
        assert await store.get_conversation("globex", conversation_id) is None
        assert await store.conversation_messages("globex", conversation_id) == []
        assert await store.get_request("globex", "r1") is None
        assert await store.list_conversations("globex") == []
        assert [c.id for c in await store.list_conversations("acme")] == [conversation_id]

    asyncio.run(scenario())


def test_complete_stores_answer_and_request_record(store: SqlStore) -> None:
    async def scenario() -> None:
        question = chain({"role": "user", "content": "q"})
        conversation_id = await store.append(AppendRequest("acme", None, None, None, tuple(question)))
        answer = chain({"role": "assistant", "content": "a"}, parent=question[0].id, depth=1, prefix="a")
        await store.complete(
            record("r2", "acme", conversation_id),
            AppendRequest("acme", conversation_id, None, None, tuple(answer)),
        )
        stored = await store.get_request("acme", "r2")
        assert stored is not None
        assert stored.report == {"unchanged": False, "sections": {"window": {"tokens": 40}}}
        assert (stored.status, stored.usage, stored.sent_tokens) == ("complete", {"total_tokens": 7}, 50)
        assert [m.data["content"] for m in await store.path("acme", answer[0].id)] == ["q", "a"]

    asyncio.run(scenario())


def test_concurrent_first_requests_naming_one_conversation_create_it_once(store: SqlStore) -> None:
    async def scenario() -> None:
        requests = [
            AppendRequest(
                "acme",
                None,
                "u",
                "chat-race",
                tuple(chain({"role": "user", "content": f"m{i}"}, prefix=f"{i}")),
            )
            for i in range(6)
        ]
        ids = await asyncio.gather(*(store.append(r) for r in requests))
        assert len(set(ids)) == 1
        assert len(await store.conversation_messages("acme", ids[0])) == 6

    asyncio.run(scenario())
