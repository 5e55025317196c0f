"""Writes that could go wrong, through real gateways on one database (SQLite and Postgres): an answer
still streaming when its conversation is deleted is kept nowhere, a replica whose cache still knows a
deleted conversation stores the history afresh instead of joining the deleted id, and a message with a
NUL character is stored like any other."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from gateway.adapters.sql import migrations
from gateway.adapters.sql.store import SqlStore, build_engine
from gateway.fakes.openai_upstream import Reply
from gateway.records import RequestRecord
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, recorded, tenant

AUTH = {"Authorization": f"Bearer {GATEWAY_KEY}"}


def gateway_on(
    make_gateway: Callable[..., Gateway], upstream: Upstream, database_url: str, tmp_path: Path
) -> Gateway:
    storage = {"database_url": database_url, "data_dir": str(tmp_path / "data")}
    return make_gateway([tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])], storage=storage)


def rows_of(database_url: str, conversation_id: str) -> int:
    """Messages stored under the conversation id, read from the database itself (the API hides
    messages whose conversation row is gone)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            query = text("SELECT count(*) FROM messages WHERE conversation_id = :id")
            return int(connection.execute(query, {"id": conversation_id}).scalar_one())
    finally:
        engine.dispose()


def get(gateway: Gateway, path: str) -> httpx.Response:
    return httpx.get(f"{gateway.server.url}/api{path}", headers=AUTH)


def delete(gateway: Gateway, path: str) -> httpx.Response:
    return httpx.delete(f"{gateway.server.url}/api{path}", headers=AUTH)


def ask(gateway: Gateway, messages: list[dict[str, Any]], **kwargs: Any) -> httpx.Headers:
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, **kwargs
    )
    raw.parse()
    return raw.headers


def test_an_answer_streaming_when_its_conversation_is_deleted_is_kept_nowhere(
    upstream: Upstream, make_gateway: Callable[..., Gateway], database_url: str, tmp_path: Path
) -> None:
    gateway = gateway_on(make_gateway, upstream, database_url, tmp_path)
    history = [{"role": "user", "content": "Remember the launch code ZX-4411, please."}]
    first = ask(gateway, history)
    recorded(gateway, first["x-gateway-request-id"])
    conversation_id = first["x-conversation-id"]
    history += [
        {"role": "assistant", "content": "Hello from the fake upstream."},
        {"role": "user", "content": "Now write me a long poem about it."},
    ]
    upstream.fake.enqueue(Reply(content="A slow poem " * 20, chunk_delay=0.05))
    stream = gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=history, stream=True
    )
    headers = stream.headers
    assert headers["x-conversation-id"] == conversation_id
    chunks = iter(stream.parse())
    next(chunks)  # the answer has begun
    assert delete(gateway, f"/conversations/{conversation_id}").status_code == 200
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "slow poem" in text  # the client got its whole answer
    recorded(gateway, headers["x-gateway-request-id"])
    assert get(gateway, f"/conversations/{conversation_id}").status_code == 404
    assert rows_of(database_url, conversation_id) == 0
    assert all(c["id"] != conversation_id for c in get(gateway, "/conversations").json()["data"])
    record = get(gateway, f"/requests/{headers['x-gateway-request-id']}").json()
    assert record["conversation_id"] is None and record["report"] is None and record["status"] == "complete"
    # The same history sent again is a new conversation, stored whole.
    again = ask(gateway, history)
    recorded(gateway, again["x-gateway-request-id"])
    assert again["x-conversation-id"] != conversation_id
    messages = get(gateway, f"/conversations/{again['x-conversation-id']}/messages").json()["data"]
    assert len(messages) == 4


def test_a_replica_that_cached_a_deleted_conversation_stores_the_history_afresh(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    config = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])]
    one, two = make_gateway(config), make_gateway(config)  # two replicas, one database
    history = [{"role": "user", "content": "Our staging host is stg-12."}]
    first = ask(one, history)
    recorded(one, first["x-gateway-request-id"])
    old = first["x-conversation-id"]
    history += [
        {"role": "assistant", "content": "Hello from the fake upstream."},
        {"role": "user", "content": "And production is prd-3."},
    ]
    second = ask(two, history)  # the second replica reads the history and caches its nodes
    recorded(two, second["x-gateway-request-id"])
    assert second["x-conversation-id"] == old
    assert delete(one, f"/conversations/{old}").status_code == 200
    history += [
        {"role": "assistant", "content": "Hello from the fake upstream."},
        {"role": "user", "content": "Which host was staging?"},
    ]
    third = ask(two, history)  # its cache still knows every message but the newest
    recorded(two, third["x-gateway-request-id"])
    new = third["x-conversation-id"]
    assert new != old
    assert get(one, f"/conversations/{old}").status_code == 404
    stored = get(one, f"/conversations/{new}/messages").json()["data"]
    assert len(stored) == 6  # the whole history, stored again, and the answer


def test_a_delete_racing_many_answers_leaves_no_orphan(
    upstream: Upstream, make_gateway: Callable[..., Gateway], database_url: str, tmp_path: Path
) -> None:
    """Answers finishing around the DELETE: each is stored before it (and deleted with it) or dropped,
    never left pointing into the deleted conversation. A client naming its conversation gets its
    exchange stored before the response ends, so every store has happened once the answers are in."""
    gateway = gateway_on(make_gateway, upstream, database_url, tmp_path)
    named = {"X-Conversation-Id": "busy"}
    base = [{"role": "user", "content": "Start of a busy conversation."}]
    first = ask(gateway, base, extra_headers=named)
    conversation_id = first["x-conversation-id"]
    base.append({"role": "assistant", "content": "Hello from the fake upstream."})

    def branch(n: int) -> None:
        upstream.fake.enqueue(Reply(content=f"answer {n}", delay=0.01 * n))
        ask(gateway, [*base, {"role": "user", "content": f"Branch question {n}?"}], extra_headers=named)

    threads = [threading.Thread(target=branch, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.04)
    assert delete(gateway, f"/conversations/{conversation_id}").status_code == 200
    for thread in threads:
        thread.join()
    # Whatever was stored after the DELETE went to a conversation of its own, never to the deleted id.
    assert get(gateway, f"/conversations/{conversation_id}").status_code == 404
    conversations = get(gateway, "/conversations").json()["data"]
    for conversation in conversations:
        messages = get(gateway, f"/conversations/{conversation['id']}/messages").json()["data"]
        ids_here = {m["id"] for m in messages}
        assert all(m["parent_id"] is None or m["parent_id"] in ids_here for m in messages)
        assert all(m["role"] != "assistant" or m["parent_id"] in ids_here for m in messages)
    assert rows_of(database_url, conversation_id) == 0


def test_a_message_with_a_nul_character_is_stored_like_any_other(
    upstream: Upstream, make_gateway: Callable[..., Gateway], database_url: str, tmp_path: Path
) -> None:
    """U+0000 is valid JSON and providers accept it; Postgres's jsonb cannot hold it (issue 15 found such
    a message answered but never stored). Stored, read back exactly, and the history recognised."""
    gateway = gateway_on(make_gateway, upstream, database_url, tmp_path)
    text = "A log line with a NUL \x00 byte and the escape \ue000 character too"
    history = [{"role": "user", "content": text}]
    first = ask(gateway, history)
    recorded(gateway, first["x-gateway-request-id"])
    conversation_id = first["x-conversation-id"]
    stored = get(gateway, f"/conversations/{conversation_id}/messages").json()["data"]
    assert len(stored) == 2 and stored[0]["message"]["content"] == text
    history += [
        stored[1]["message"],
        {"role": "user", "content": "And again \x00."},
    ]
    second = ask(gateway, history)
    recorded(gateway, second["x-gateway-request-id"])
    assert second["x-conversation-id"] == conversation_id
    assert len(get(gateway, f"/conversations/{conversation_id}/messages").json()["data"]) == 4
    assert upstream.fake.last_chat().body["messages"][-1]["content"] == "And again \x00."


def test_ids_with_a_nul_character_name_one_conversation_and_one_user(
    upstream: Upstream, make_gateway: Callable[..., Gateway], database_url: str, tmp_path: Path
) -> None:
    """Postgres's text columns refuse U+0000: such a client id is kept as its digest, so the request is
    stored (not failed open) and the same id finds the same conversation again."""
    gateway = gateway_on(make_gateway, upstream, database_url, tmp_path)
    named = {"conversation_id": "chat\x00one"}
    history = [{"role": "user", "content": "Hello there."}]
    upstream.fake.enqueue(Reply(content="Hi."))
    first = ask(gateway, history, extra_body={"metadata": named, "user": "ana\x00"})
    recorded(gateway, first["x-gateway-request-id"])
    history += [{"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Still me."}]
    second = ask(gateway, history, extra_body={"metadata": named, "user": "ana\x00"})
    recorded(gateway, second["x-gateway-request-id"])
    assert second["x-conversation-id"] == first["x-conversation-id"]
    conversation = get(gateway, f"/conversations/{first['x-conversation-id']}").json()
    assert conversation["user_id"].startswith("sha256:")
    assert rows_of(database_url, first["x-conversation-id"]) == 4


def _migrate_in_a_process(database_url: str, start: Any, results: Any) -> None:
    engine = build_engine(database_url)
    try:
        start.wait(60)  # a barrier: every process is ready before any migrates
        results.put(migrations.migrate(engine))
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))
    finally:
        engine.dispose()


def test_processes_starting_together_apply_each_migration_once(database_url: str) -> None:
    """`serve --workers N` (or replicas) start at once on an empty database: one process applies the
    migrations, the others wait and find them done; none fails (SQLite raced to a UNIQUE error here)."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(3), context.Queue()
    processes = [
        context.Process(target=_migrate_in_a_process, args=(database_url, start, results)) for _ in range(3)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    assert all(isinstance(o, list) for o in outcomes), outcomes
    applied = sorted(outcomes, key=len)
    assert applied[0] == applied[1] == [] and applied[2] == [name for name, _ in migrations.MIGRATIONS]


def test_connections_opening_a_new_sqlite_file_together_all_get_wal(tmp_path: Path) -> None:
    """Each new connection switches the file to WAL; SQLite refuses that switch at once ("database is
    locked", no busy wait) while another connection holds a lock, which failed about one start in four of
    three processes on a new file (`serve --workers N`). Here: engines of their own in threads (the same
    locks as processes, started faster), sixty fresh files, eight at once each."""
    for round_ in range(60):
        url = f"sqlite:///{tmp_path}/new-{round_}.db"
        engines = [build_engine(url) for _ in range(8)]
        start = threading.Barrier(len(engines))

        def open_one(engine: Any, start: threading.Barrier = start) -> object:
            start.wait(30)
            try:
                with engine.connect() as connection:
                    return connection.exec_driver_sql("PRAGMA journal_mode").scalar()
            except Exception as exc:
                return repr(exc)

        try:
            with ThreadPoolExecutor(len(engines)) as pool:
                outcomes = list(pool.map(open_one, engines))
        finally:
            for engine in engines:
                engine.dispose()
        assert outcomes == ["wal"] * len(engines), outcomes


def test_the_sent_block_survives_the_migration_a_nul_and_is_forgotten_per_user(database_url: str) -> None:
    """0008 adds `requests.sent_context` to a database made before it; the block is kept as sent (a NUL
    included, which Postgres's jsonb cannot hold as such) and dropped for one user only."""
    engine = build_engine(database_url)
    try:
        migrations.migrate(engine)
        with engine.begin() as connection:  # as a database from before 0008 was
            connection.execute(text("ALTER TABLE requests DROP COLUMN sent_context"))
            connection.execute(text("ALTER TABLE conversations DROP COLUMN title"))
            connection.execute(text("ALTER TABLE conversations DROP COLUMN gist"))
            connection.execute(
                text(
                    "DELETE FROM schema_migrations WHERE name IN ('0008_request_sent_context', '0009_conversation_titles')"
                )
            )
        assert migrations.migrate(engine) == ["0008_request_sent_context", "0009_conversation_titles"]
    finally:
        engine.dispose()
    block = {
        "role": "system",
        "content": "<gateway_context>\nA NUL \x00 and an escape \ue000.\n</gateway_context>",
    }

    def record(request_id: str, user: str | None, sent: dict[str, Any] | None) -> RequestRecord:
        return RequestRecord(
            request_id, "acme", None, user, None, "gpt-4o", False, "complete", 200, 10, 10,
            {"sent": {"ids": [], "context_at": 0}}, None, None, 1.0, datetime.now(UTC), sent,
        )  # fmt: skip

    async def scenario() -> None:
        store = SqlStore.open(database_url)
        try:
            for request_id, user in [("r-ana-1", "ana"), ("r-ana-2", "ana"), ("r-bob", "bob")]:
                await store.complete(record(request_id, user, block), None)
            await store.complete(record("r-none", "ana", None), None)
            got = await store.get_request("acme", "r-ana-1")
            assert got is not None and got.sent_context == block
            assert await store.forget_sent_context("acme", "ana") == 2
            assert await store.forget_sent_context("globex", "bob") == 0  # another tenant's user
            for request_id, kept in [("r-ana-1", None), ("r-ana-2", None), ("r-bob", block)]:
                got = await store.get_request("acme", request_id)
                assert got is not None and got.sent_context == kept and got.report is not None
        finally:
            await store.aclose()

    asyncio.run(scenario())


def test_a_model_name_with_a_nul_character_is_recorded(
    upstream: Upstream, make_gateway: Callable[..., Gateway], database_url: str, tmp_path: Path
) -> None:
    """A client's `model` (and a provider's error text) may hold U+0000; Postgres's text columns refuse
    it, and the request's record failed (issue 15 noted it). It is recorded, the NUL replaced."""
    gateway = gateway_on(make_gateway, upstream, database_url, tmp_path)
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o\x00mini", messages=[{"role": "user", "content": "Hello"}]
    )
    headers = raw.headers
    recorded(gateway, headers["x-gateway-request-id"])
    record = get(gateway, f"/requests/{headers['x-gateway-request-id']}").json()
    assert record["model"] == "gpt-4o\ufffdmini" and record["status"] == "complete"
