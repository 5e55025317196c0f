"""The SQL memory store on real SQLite and real Postgres: round trips, filters, atomic saves, isolation and
deletion."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text

from gateway.adapters.sql import migrations
from gateway.adapters.sql.memories import SqlMemoryStore
from gateway.adapters.sql.store import SqlStore, build_engine
from gateway.errors import StoreError
from gateway.fakes.embedder import HashingEmbedder
from gateway.fakes.memory_vectors import InMemoryMemoryVectors
from gateway.memory.prompts import Candidate, Turn
from gateway.memory.records import (
    ACTIVE,
    DELETED,
    SUPERSEDED,
    Memory,
    MemoryChanges,
    MemoryFilter,
    MemorySource,
)
from gateway.memory.replies import Decision
from gateway.memory.resolve import Resolver

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def sql(database_url: str) -> Iterator[SqlStore]:
    store = SqlStore.open(database_url)
    yield store
    asyncio.run(store.aclose())


@pytest.fixture
def store(sql: SqlStore) -> SqlMemoryStore:
    """The memory store over a database holding the conversations c1..c9 the tests' sources name (a
    source in a conversation that is not there is dropped: learnt from a deleted conversation)."""
    with sql.engine.begin() as connection:
        for n in range(1, 10):
            connection.execute(
                text(
                    "INSERT INTO conversations (id, tenant, message_count, created_at, updated_at) "
                    "VALUES (:id, 'acme', 0, :now, :now)"
                ),
                {"id": conv(f"c{n}"), "now": T0},
            )
    return SqlMemoryStore(sql.engine)


def new_id() -> str:
    return uuid.uuid4().hex


def memory(
    content: str, *, tenant: str = "acme", user_id: str = "u1", minutes: int = 0, **fields: Any
) -> Memory:
    """A memory updated `minutes` after T0 (so lists order predictably)."""
    when = T0 + timedelta(minutes=minutes)
    values: dict[str, Any] = {
        "id": new_id(), "tenant": tenant, "user_id": user_id, "scope": "user", "type": "preference",
        "content": content, "tags": (), "confidence": 0.9, "event_at": None, "status": ACTIVE,
        "superseded_by": None, "created_at": when, "updated_at": when,
    }  # fmt: skip
    return Memory(**{**values, **fields})


def source(conversation: str = "c1", message: str | None = None) -> MemorySource:
    return MemorySource(message or new_id(), conversation.ljust(32, "0"))


def conv(name: str) -> str:
    return name.ljust(32, "0")


def count(engine: Engine, table: str, where: str = "1 = 1", **params: Any) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(text(f"SELECT COUNT(*) FROM {table} WHERE {where}"), params).scalar_one()
        )


def test_save_and_get_round_trip_every_field(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        sources = tuple(sorted((source("c1"), source("c2")), key=lambda s: s.message_id))
        history = ({"at": "2026-03-01T12:00:00+00:00", "by": "extraction", "action": "add", "content": None},)
        stated = datetime(2026, 2, 14, 9, 30, tzinfo=timezone(timedelta(hours=2)))
        mem = memory(
            "Ana prefers tea to coffee.", tags=("drinks", "утро"), event_at=stated, sources=sources,
            history=history, confidence=0.75, scope="project-a", type="stable_fact",
        )  # fmt: skip
        await store.save(MemoryChanges("acme", added=(mem,)))
        got = await store.get("acme", mem.id)
        assert got == mem
        assert got is not None
        for value in (got.event_at, got.created_at, got.updated_at):
            assert value is not None and value.utcoffset() == timedelta(0)
        assert got.event_at == stated  # the same instant, given in +02:00, read back in UTC
        assert isinstance(got.tags, tuple) and isinstance(got.history, tuple)

    asyncio.run(scenario())


def test_naive_datetimes_are_taken_as_utc(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        naive = datetime(2026, 3, 1, 12, 0)
        mem = memory("Ana lives in Lisbon.", created_at=naive, updated_at=naive, event_at=naive)
        await store.save(MemoryChanges("acme", added=(mem,)))
        got = await store.get("acme", mem.id)
        assert got is not None
        assert (got.created_at, got.updated_at, got.event_at) == (T0, T0, T0)

    asyncio.run(scenario())


def test_get_and_many_are_tenant_scoped(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        a1, a2 = memory("one"), memory("two")
        b1 = memory("other tenant", tenant="globex", sources=(source("c1"),))
        await store.save(MemoryChanges("acme", added=(a1, a2)))
        await store.save(MemoryChanges("globex", added=(b1,)))
        assert await store.get("globex", a1.id) is None
        assert await store.get("acme", b1.id) is None
        assert await store.get("acme", new_id()) is None
        found = await store.many("acme", [a1.id, b1.id, new_id(), a2.id, a1.id])
        assert sorted(m.id for m in found) == sorted([a1.id, a2.id])
        assert await store.many("acme", []) == []
        assert await store.many("globex", [b1.id]) == [b1]

    asyncio.run(scenario())


def test_updated_memory_is_replaced_whole_and_sources_merge(sql: SqlStore, store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        first = source("c1")
        original = memory("Ana works at Initech.", sources=(first,), tags=("work",))
        newer = memory("Ana works at Globex.", minutes=5)
        await store.save(MemoryChanges("acme", added=(original,)))

        second = source("c2")
        step = {"at": "2026-03-01T12:05:00+00:00", "by": "extraction", "action": "supersede"}
        superseded = replace(
            original, content="Ana worked at Initech.", status=SUPERSEDED, superseded_by=newer.id,
            tags=("work", "history"), confidence=0.5, scope="project-b", type="profile",
            event_at=T0 - timedelta(days=30), updated_at=T0 + timedelta(minutes=5),
            sources=(first, second),  # the first is linked already: not stored twice
            history=({**step, "content": original.content},),
        )  # fmt: skip
        await store.save(MemoryChanges("acme", added=(newer,), updated=(superseded,)))
        got = await store.get("acme", original.id)
        assert got is not None
        assert got == replace(superseded, sources=tuple(sorted((first, second), key=lambda s: s.message_id)))
        assert got.history[0]["content"] == "Ana works at Initech."
        assert count(sql.engine, "memory_sources", "memory_id = :m", m=original.id) == 2
        assert await store.by_hash("acme", "u1", "project-b", [superseded.hash]) == []  # not active
        assert await store.by_hash("acme", "u1", "user", [original.hash]) == []  # the old hash is gone

    asyncio.run(scenario())


def test_duplicate_source_links_are_ignored(sql: SqlStore, store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        link = source("c1")
        mem = memory("Ana has a cat.", sources=(link,))
        await store.save(MemoryChanges("acme", added=(mem,)))
        again = source("c2")
        repeated = ((mem.id, link), (mem.id, again), (mem.id, again))
        await store.save(MemoryChanges("acme", sources=repeated))
        await store.save(
            MemoryChanges("acme", updated=(replace(mem, sources=(link, again)),), sources=repeated)
        )
        got = await store.get("acme", mem.id)
        assert got is not None and set(got.sources) == {link, again} and len(got.sources) == 2
        assert count(sql.engine, "memory_sources") == 2

    asyncio.run(scenario())


def test_save_is_atomic(sql: SqlStore, store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        existing = memory("Ana likes jazz.", sources=(source("c1"),))
        await store.save(MemoryChanges("acme", added=(existing,), cursor=(conv("c1"), "n" * 32)))
        fresh = memory("Ana likes blues.", sources=(source("c2"),))
        collision = replace(existing, content="Ana likes rock.", sources=(source("c3"),))
        edited = replace(existing, content="Ana loves jazz.")
        with pytest.raises(StoreError):
            await store.save(
                MemoryChanges(
                    "acme", added=(fresh, collision), updated=(edited,),
                    sources=((existing.id, source("c4")),), cursor=(conv("c1"), "m" * 32),
                )
            )  # fmt: skip
        assert await store.get("acme", fresh.id) is None
        assert await store.get("acme", existing.id) == existing
        assert count(sql.engine, "memories") == 1
        assert count(sql.engine, "memory_sources") == 1
        assert await store.cursor("acme", conv("c1")) == "n" * 32

    asyncio.run(scenario())


def test_a_save_naming_a_memory_not_stored_fails_whole(sql: SqlStore, store: SqlMemoryStore) -> None:
    """An update or link to a memory deleted meanwhile (or of another tenant) stores nothing: the caller
    learns of it instead of indexing a ghost."""

    async def scenario() -> None:
        theirs = memory("Globex's memory.", tenant="globex")
        await store.save(MemoryChanges("globex", added=(theirs,)))
        fresh = memory("Ana likes blues.")
        for changes in (
            MemoryChanges("acme", added=(fresh,), updated=(memory("never stored"),)),
            MemoryChanges("acme", added=(fresh,), updated=(replace(theirs, tenant="acme"),)),
            MemoryChanges("acme", added=(fresh,), sources=((theirs.id, source("c1")),)),
            MemoryChanges("acme", added=(fresh,), sources=((new_id(), source("c1")),)),
        ):
            with pytest.raises(StoreError):
                await store.save(changes)
        assert await store.get("acme", fresh.id) is None
        assert count(sql.engine, "memory_sources") == 0
        with pytest.raises(ValueError):
            await store.save(MemoryChanges("acme", updated=(theirs,)))  # a memory of another tenant

    asyncio.run(scenario())


def test_find_filters_each_narrow(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        tea = memory("Ana prefers TEA.", minutes=1, tags=("drinks", "morning"))
        trip = memory(
            "Ana flew to Tokyo.", minutes=2, type="event", tags=("travel",),
            event_at=datetime(2025, 6, 1, tzinfo=UTC),
        )  # fmt: skip
        school = memory("Ana's daughter starts ÉCOLE in September.", minutes=3, scope="family", tags=("c_",))
        old = memory("Ana drinks coffee.", minutes=4, status=SUPERSEDED, tags=("drinks",))
        gone = memory("Ana dislikes tea.", minutes=5, status=DELETED, tags=('a"b%',))
        other_user = memory("Bob prefers tea.", user_id="u2", minutes=6, tags=("drinks",))
        await store.save(MemoryChanges("acme", added=(tea, trip, school, old, gone, other_user)))

        async def ids(**where: Any) -> list[str]:
            return [m.id for m in await store.find("acme", MemoryFilter(user_id="u1", **where))]

        assert await ids() == [school.id, trip.id, tea.id]  # active only, newest first
        assert await ids(statuses=None) == [gone.id, old.id, school.id, trip.id, tea.id]
        assert await ids(statuses=(SUPERSEDED, DELETED)) == [gone.id, old.id]
        assert await ids(scopes=("family",)) == [school.id]
        assert await ids(scopes=("user", "family"), types=("event",)) == [trip.id]
        assert await ids(tag="drinks", statuses=None) == [old.id, tea.id]
        assert await ids(tag="c_") == [school.id]
        assert await ids(tag="c") == []  # whole tags only
        assert await ids(tag='a"b%', statuses=None) == [gone.id]
        # By event time when known, else creation time (the trip happened long before it was stored).
        assert await ids(until=datetime(2025, 12, 31, tzinfo=UTC)) == [trip.id]
        assert await ids(since=T0) == [school.id, tea.id]
        assert await ids(since=T0 + timedelta(minutes=3), until=T0 + timedelta(minutes=3)) == [school.id]
        assert await ids(text="tea", statuses=None) == [gone.id, tea.id]
        assert await ids(text="école") == [school.id]  # case-insensitive beyond ASCII
        assert await ids(text="tea", tag="drinks") == [tea.id]
        assert await store.find("acme", MemoryFilter(user_id="nobody", statuses=None)) == []
        assert await store.find("globex", MemoryFilter(user_id="u1", statuses=None)) == []

    asyncio.run(scenario())


def test_find_pages_exactly_after_every_filter(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        mems = [memory(f"Fact number {i}{' (tea)' if i % 2 else ''}.", minutes=i) for i in range(12)]
        await store.save(MemoryChanges("acme", added=tuple(mems)))
        newest = [m.id for m in reversed(mems)]
        tea = [m.id for m in reversed(mems) if "tea" in m.content]

        async def page(limit: int, offset: int, **where: Any) -> list[str]:
            found = await store.find("acme", MemoryFilter(user_id="u1", limit=limit, offset=offset, **where))
            return [m.id for m in found]

        assert await page(5, 0) + await page(5, 5) + await page(5, 10) == newest
        assert await page(4, 10) == newest[10:]
        assert await page(2, 1, text="TEA") + await page(2, 3, text="TEA") == tea[1:5]
        assert await page(10, 5, text="tea") == tea[5:]
        assert await page(0, 0) == []

    asyncio.run(scenario())


def test_find_returns_sources(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        link = source("c1")
        mem = memory("Ana plays chess.", sources=(link,))
        await store.save(MemoryChanges("acme", added=(mem,)))
        assert [m.sources for m in await store.find("acme", MemoryFilter(user_id="u1", text="chess"))] == [
            (link,)
        ]

    asyncio.run(scenario())


def test_by_hash_finds_active_memories_of_the_user_and_scope(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        mem = memory("Ana prefers tea.")
        elsewhere = memory("Ana prefers tea.", scope="project-a")
        bob = memory("Ana prefers tea.", user_id="u2")
        theirs = memory("Ana prefers tea.", tenant="globex")
        await store.save(MemoryChanges("acme", added=(mem, elsewhere, bob)))
        await store.save(MemoryChanges("globex", added=(theirs,)))
        # The normalised form: case, spacing and a final full stop do not matter.
        probe = memory("  ana   PREFERS tea ").hash
        assert [m.id for m in await store.by_hash("acme", "u1", "user", [probe, "0" * 32])] == [mem.id]
        assert await store.by_hash("acme", "u1", "user", []) == []
        assert await store.by_hash("acme", "u1", "user", ["0" * 32]) == []

    asyncio.run(scenario())


def test_delete_removes_rows_and_sources_in_the_tenant_only(sql: SqlStore, store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        a1, a2 = memory("one", sources=(source("c1"),)), memory("two", sources=(source("c1"),))
        b1 = memory("theirs", tenant="globex", sources=(source("c1"),))
        await store.save(MemoryChanges("acme", added=(a1, a2)))
        await store.save(MemoryChanges("globex", added=(b1,)))
        assert await store.delete("acme", [a1.id, b1.id, new_id(), a1.id]) == 1
        assert await store.get("acme", a1.id) is None
        assert await store.get("acme", a2.id) is not None
        assert await store.get("globex", b1.id) == b1
        assert count(sql.engine, "memory_sources", "memory_id = :m", m=a1.id) == 0
        assert count(sql.engine, "memory_sources") == 2
        assert await store.delete("acme", []) == 0

    asyncio.run(scenario())


def test_delete_user_leaves_nothing_of_the_user(sql: SqlStore, store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        learnt = memory("Ana prefers tea.", sources=(source("c1"),))
        confirmed = memory("Ana has a cat.")
        bob = memory("Bob prefers coffee.", user_id="u2", sources=(source("c9"),))
        theirs = memory("Globex's Ana.", tenant="globex", sources=(source("c1"),))
        # Cursors of her conversations: one written with her memories, one where extraction only linked
        # a source (the user unknown to the write), one stored as hers where it found nothing: all kept.
        await store.save(MemoryChanges("acme", added=(learnt, confirmed), cursor=(conv("c1"), "n" * 32)))
        await store.save(
            MemoryChanges("acme", sources=((confirmed.id, source("c2")),), cursor=(conv("c2"), "n" * 32))
        )
        with sql.engine.begin() as connection:  # c3 is hers
            connection.execute(
                text("UPDATE conversations SET user_id = 'u1' WHERE id = :id"), {"id": conv("c3")}
            )
        await store.save(MemoryChanges("acme", cursor=(conv("c3"), "n" * 32)))
        # And one written with a memory of hers learnt without a source there.
        await store.save(MemoryChanges("acme", added=(memory("Ana skis."),), cursor=(conv("c4"), "n" * 32)))
        await store.save(MemoryChanges("acme", added=(bob,), cursor=(conv("c9"), "n" * 32)))
        await store.save(MemoryChanges("globex", added=(theirs,), cursor=(conv("c1"), "n" * 32)))

        removed = await store.delete_user("acme", "u1")
        assert len(removed) == 3 and {learnt.id, confirmed.id} <= set(removed)
        engine = sql.engine
        assert count(engine, "memories", "tenant = 'acme' AND user_id = 'u1'") == 0
        assert count(engine, "memory_sources", "memory_id IN (:a, :b)", a=learnt.id, b=confirmed.id) == 0
        # Her extraction cursors stay (they hold no words): her old turns are not read again from the
        # root, so what she deleted is not learnt again.
        assert await store.cursor("acme", conv("c1")) == "n" * 32
        assert await store.cursor("acme", conv("c3")) == "n" * 32
        # Another user of the tenant, and the same user id in another tenant, keep everything.
        assert await store.get("acme", bob.id) == bob
        assert await store.cursor("acme", conv("c9")) == "n" * 32
        assert await store.get("globex", theirs.id) == theirs
        assert await store.cursor("globex", conv("c1")) == "n" * 32
        assert await store.delete_user("acme", "u1") == []

    asyncio.run(scenario())


def test_cursor_moves_and_is_per_tenant(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        assert await store.cursor("acme", conv("c1")) is None
        await store.save(MemoryChanges("acme", cursor=(conv("c1"), "a" * 32)))
        await store.save(MemoryChanges("acme", cursor=(conv("c1"), "b" * 32)))
        await store.save(MemoryChanges("globex", cursor=(conv("c1"), "c" * 32)))
        assert await store.cursor("acme", conv("c1")) == "b" * 32
        assert await store.cursor("globex", conv("c1")) == "c" * 32

    asyncio.run(scenario())


def test_cursor_keeps_the_user_a_later_write_does_not_know(sql: SqlStore, store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        await store.save(MemoryChanges("acme", added=(memory("Ana skis."),), cursor=(conv("c1"), "a" * 32)))
        await store.save(MemoryChanges("acme", cursor=(conv("c1"), "b" * 32)))
        assert count(sql.engine, "memory_cursors", "user_id = 'u1'") == 1

    asyncio.run(scenario())


def test_forget_conversations_drops_links_and_cursors_not_memories(
    sql: SqlStore, store: SqlMemoryStore
) -> None:
    async def scenario() -> None:
        kept_link = source("c2")
        mem = memory("Ana runs marathons.", sources=(source("c1"), kept_link))
        theirs = memory("Globex's memory.", tenant="globex", sources=(source("c1"),))
        await store.save(MemoryChanges("acme", added=(mem,), cursor=(conv("c1"), "a" * 32)))
        await store.save(MemoryChanges("acme", cursor=(conv("c2"), "a" * 32)))
        await store.save(MemoryChanges("globex", added=(theirs,), cursor=(conv("c1"), "a" * 32)))
        await store.forget_conversations("acme", [conv("c1"), conv("c7")])
        got = await store.get("acme", mem.id)
        assert got is not None and got.sources == (kept_link,)
        assert await store.cursor("acme", conv("c1")) is None
        assert await store.cursor("acme", conv("c2")) == "a" * 32
        assert await store.get("globex", theirs.id) == theirs
        assert await store.cursor("globex", conv("c1")) == "a" * 32
        await store.forget_conversations("acme", [])
        assert count(sql.engine, "memory_sources") == 2

    asyncio.run(scenario())


def test_memory_migrations_apply_over_a_database_at_0003(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = build_engine(database_url)
    try:
        earlier = tuple(m for m in migrations.MIGRATIONS if m[0] < "0004")
        with monkeypatch.context() as patch:
            patch.setattr(migrations, "MIGRATIONS", earlier)
            assert migrations.migrate(engine) == [name for name, _ in earlier]
        assert "memories" not in inspect(engine).get_table_names()
        assert migrations.migrate(engine) == [
            "0004_memories",
            "0005_memory_profiles",
            "0006_responses",
            "0007_profile_covered",
            "0008_request_sent_context",
            "0009_conversation_titles",
            "0010_job_priority",
        ]
        tables = set(inspect(engine).get_table_names())
        assert {"memories", "memory_sources", "memory_cursors", "memory_profiles"} <= tables
        assert migrations.migrate(engine) == []

        with engine.begin() as connection:  # the conversation its source names
            connection.execute(
                text(
                    "INSERT INTO conversations (id, tenant, message_count, created_at, updated_at) "
                    "VALUES (:id, 'acme', 0, :now, :now)"
                ),
                {"id": conv("c1"), "now": T0},
            )

        async def scenario() -> None:
            store = SqlMemoryStore(engine)
            mem = memory("Ana prefers tea.", sources=(source("c1"),))
            await store.save(MemoryChanges("acme", added=(mem,), cursor=(conv("c1"), "a" * 32)))
            assert await store.get("acme", mem.id) == mem

        asyncio.run(scenario())
    finally:
        engine.dispose()


def test_a_link_racing_a_delete_leaves_no_orphan(sql: SqlStore, store: SqlMemoryStore) -> None:
    """A delete holding its transaction open: the save linking to that memory waits for it, then finds
    the memory gone and fails, rather than linking a message to nothing."""

    async def scenario() -> None:
        mem = memory("Ana keeps bees.")
        await store.save(MemoryChanges("acme", added=(mem,)))
        with sql.engine.connect() as deleting:
            deleting.execute(text("DELETE FROM memories WHERE id = :id"), {"id": mem.id})
            linking = asyncio.create_task(
                store.save(MemoryChanges("acme", sources=((mem.id, source("c2")),)))
            )
            await asyncio.sleep(0.5)
            assert not linking.done()  # waiting for the delete's locks
            deleting.execute(text("DELETE FROM memory_sources WHERE memory_id = :id"), {"id": mem.id})
            deleting.commit()
        with pytest.raises(StoreError):
            await linking
        assert count(sql.engine, "memory_sources") == 0

    asyncio.run(scenario())


def test_profile_keeps_the_job_text_and_the_users_edit_apart(store: SqlMemoryStore) -> None:
    async def scenario() -> None:
        assert await store.profile("acme", "u1") is None
        terse = [memory("Ana likes terse answers."), memory("Ana writes Go.")]
        await store.save_profile("acme", "u1", generated="## Style\n- terse", memories=terse)
        edited = await store.edit_profile("acme", "u1", "Ana likes detail.")
        assert (edited.generated, edited.edited, edited.shown) == (
            "## Style\n- terse",
            "Ana likes detail.",
            "Ana likes detail.",
        )
        await store.save_profile("acme", "u1", generated="## Style\n- verbose", memories=terse)
        again = await store.profile("acme", "u1")
        assert (
            again is not None
            and again.edited == "Ana likes detail."
            and again.generated == "## Style\n- verbose"
        )
        assert again.generated_at is not None and again.generated_at.tzinfo is not None
        assert again.memories == 2
        # While the user's edit is shown, it covers what was known when they made it.
        assert again.covers(terse[0]) and not again.covers(memory("Ana moved.", minutes=10**6))
        reset = await store.edit_profile("acme", "u1", None)
        assert reset.shown == "## Style\n- verbose" and reset.edited_at is None
        # The generated text covers exactly the memories it was written from, as they read then: one
        # committed while the model wrote it, or one changed since, is not covered.
        assert reset.covers(terse[0]) and reset.covers(terse[1])
        assert not reset.covers(memory("Ana prefers Korean."))
        assert not reset.covers(replace(terse[0], content="Ana likes long answers."))
        assert await store.profile("globex", "u1") is None and await store.profile("acme", "u2") is None
        await store.delete_user("acme", "u1")
        assert await store.profile("acme", "u1") is None

    asyncio.run(scenario())


def test_what_was_learnt_from_a_conversation_deleted_meanwhile_is_not_kept(
    sql: SqlStore, store: SqlMemoryStore
) -> None:
    """An extraction job read the turns, then the conversation was deleted (the user deleted it, or
    themselves) before the job saved: nothing learnt only from it is stored, no link into it is made,
    and its cursor does not move; what holds a source elsewhere too is kept, linked there only."""

    async def scenario() -> None:
        kept = memory("Ana keeps bees.", sources=(source("c2"),))
        await store.save(MemoryChanges("acme", added=(kept,)))
        with sql.engine.begin() as connection:  # the delete lands between the job's read and its write
            connection.execute(text("DELETE FROM conversations WHERE id = :id"), {"id": conv("c1")})
        only_there = memory("Ana is allergic to nuts.", sources=(source("c1"),))
        both = memory("Ana lives in Porto.", sources=(source("c1"), source("c3")))
        await store.save(
            MemoryChanges(
                "acme",
                added=(only_there, both),
                sources=((kept.id, source("c1")),),
                cursor=(conv("c1"), "n" * 32),
            )
        )
        assert await store.get("acme", only_there.id) is None
        found = await store.get("acme", both.id)
        assert found is not None and [s.conversation_id for s in found.sources] == [conv("c3")]
        linked = await store.get("acme", kept.id)
        assert linked is not None and [s.conversation_id for s in linked.sources] == [conv("c2")]
        assert count(sql.engine, "memory_sources", "conversation_id = :c", c=conv("c1")) == 0
        assert await store.cursor("acme", conv("c1")) is None

    asyncio.run(scenario())


def test_a_batch_saying_one_thing_twice_in_other_words_adds_it_once(store: SqlMemoryStore) -> None:
    """The resolver's in-batch duplicates: the same words in another order (one vector) are one memory,
    unless their numbers differ; nothing stored is near, so the rest are added without asking."""

    async def undecided(pairs: Sequence[tuple[Candidate, Sequence[Memory]]]) -> list[Decision]:
        raise AssertionError(f"nothing stored is near, yet asked about {pairs}")

    said = [
        "I drink green tea every morning.",
        "Every morning I drink green tea.",
        "My sister lives in Porto.",
        "I swim 2 times a week.",
        "I swim 3 times a week.",
    ]
    turn = Turn(1, new_id(), conv("c1"), " ".join(said), T0)
    batch = [Candidate(text, "preference", (), 0.9, None, turn) for text in said]
    resolver = Resolver(store, InMemoryMemoryVectors(), HashingEmbedder())
    out = asyncio.run(resolver.resolve("acme", "u1", "project-a", batch, undecided, T0))
    assert [m.content for m in out.added] == [said[0], said[2], said[3], said[4]]
