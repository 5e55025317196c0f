"""The memory vectors on real LanceDB (in tmp_path) and their in-memory fake, through the same contract:
meaning and keyword search, replace on upsert, tenant, user and scope isolation, deletes, compaction."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import lancedb
import pytest

from gateway.adapters.lance_memories import LanceMemoryVectors, schema
from gateway.errors import SearchIndexError
from gateway.fakes.memory_vectors import InMemoryMemoryVectors
from gateway.memory.ports import MemoryVectors
from gateway.memory.records import MemoryHit, MemoryQuery, MemoryRow

T = TypeVar("T")
DIMS = 4
BASE = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
Vectors = LanceMemoryVectors | InMemoryMemoryVectors


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def unit(*values: float) -> list[float]:
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def row(
    memory_id: str,
    text: str,
    *,
    tenant: str = "acme",
    user: str = "ann",
    scope: str = "user",
    kind: str = "preference",
    vector: list[float] | None = None,
    minutes: int = 0,
) -> MemoryRow:
    return MemoryRow(
        id=memory_id,
        tenant=tenant,
        user_id=user,
        scope=scope,
        type=kind,
        text=text,
        created_at=BASE + timedelta(minutes=minutes),
        vector=vector,
    )


def query(
    text: str = "",
    vector: list[float] | None = None,
    *,
    tenant: str = "acme",
    user: str = "ann",
    scopes: tuple[str, ...] = ("user", "project-a"),
    limit: int = 5,
) -> MemoryQuery:
    return MemoryQuery(tenant=tenant, user_id=user, scopes=scopes, text=text, vector=vector, limit=limit)


def ids(hits: list[MemoryHit]) -> list[str]:
    return [h.memory_id for h in hits]


FACTS = [
    row("m-diet", "我是素食主义者", vector=unit(1, 0, 0, 0), minutes=1),
    row(
        "m-pg", "the database config lives in /etc/postgresql/pg_hba.conf", vector=unit(0, 1, 0, 0), minutes=2
    ),
    row("m-err", "the installer fails with error E1234 on Windows", vector=unit(0, 0, 1, 0), minutes=3),
    row("m-lang", "prefers answers in short bullet points", vector=unit(0, 0, 0, 1), minutes=4),
    row("m-proj", "project A deploys with helm", scope="project-a", vector=unit(0.6, 0.8, 0, 0), minutes=5),
]


def _implements_the_port(lance: LanceMemoryVectors, memory: InMemoryMemoryVectors) -> list[MemoryVectors]:
    return [lance, memory]  # checked by mypy, never called


@pytest.fixture(params=["lance", "memory"])
def vectors(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Vectors]:
    made: Vectors
    if request.param == "lance":
        made = LanceMemoryVectors.open(str(tmp_path / "lancedb"), "memories_test", DIMS)
    else:
        made = InMemoryMemoryVectors(DIMS)
    yield made
    run(made.aclose())


# -- search ---------------------------------------------------------------------------------------------


def test_finds_by_meaning_best_first(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert(FACTS)
        result = await vectors.search(query("", unit(1, 0.1, 0, 0), limit=3))
        assert ids(result.semantic) == ["m-diet", "m-proj", "m-pg"]
        scores = [h.score for h in result.semantic]
        assert scores == sorted(scores, reverse=True)
        assert scores[0] == pytest.approx(1 / math.sqrt(1.01), abs=1e-5)  # cosine of the two
        hit = result.semantic[1]
        assert hit.scope == "project-a" and hit.created_at == BASE + timedelta(minutes=5)
        assert hit.created_at.tzinfo is not None
        assert result.keyword == []  # no words in the question, no keyword ranking

    run(scenario())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pg_hba.conf", "m-pg"),
        ("where is pg_hba.conf?", "m-pg"),
        ("E1234", "m-err"),
        ("素食", "m-diet"),
        ("他吃素食吗", "m-diet"),
        ("helm", "m-proj"),
    ],
)
def test_finds_by_keyword(vectors: Vectors, text: str, expected: str) -> None:
    async def scenario() -> None:
        await vectors.upsert(FACTS)
        result = await vectors.search(query(text))
        assert result.keyword, text
        assert result.keyword[0].memory_id == expected
        assert result.keyword[0].score > 0
        assert result.semantic == []  # no query vector, no semantic ranking

    run(scenario())


def test_exact_identifier_is_not_a_neighbour(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert(FACTS)
        result = await vectors.search(query("E1235"))
        assert "m-err" not in ids(result.keyword)

    run(scenario())


def test_limit_is_respected(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert(
            [row(f"m{i}", f"likes kafka number {i}", vector=unit(1, i, 0, 0)) for i in range(12)]
        )
        result = await vectors.search(query("kafka", unit(1, 0, 0, 0), limit=4))
        assert len(result.semantic) == 4 and len(result.keyword) == 4
        assert ids(result.semantic) == ["m0", "m1", "m2", "m3"]
        for limit in (0, -1):
            empty = await vectors.search(query("kafka", unit(1, 0, 0, 0), limit=limit))
            assert empty.semantic == [] and empty.keyword == []

    run(scenario())


def test_row_without_vector_is_found_by_keyword_only(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert(
            [row("m-vec", "enjoys hiking", vector=unit(1, 0, 0, 0)), row("m-none", "uses ETIMEDOUT retries")]
        )
        result = await vectors.search(query("ETIMEDOUT", unit(1, 0, 0, 0)))
        assert ids(result.keyword) == ["m-none"]
        assert ids(result.semantic) == ["m-vec"]

    run(scenario())


def test_wrong_dimensions_are_index_errors(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert([row("a", "alpha", vector=unit(1, 0, 0, 0))])
        with pytest.raises(SearchIndexError):
            await vectors.search(query("alpha", [1.0, 0.0]))
        with pytest.raises(SearchIndexError):
            await vectors.upsert([row("b", "beta", vector=[1.0, 0.0])])
        assert await vectors.count("acme") == 1

    run(scenario())


# -- upsert replaces ------------------------------------------------------------------------------------


def test_upsert_again_replaces_text_and_vector(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert(FACTS)
        await vectors.upsert(
            [row("m-lang", "prefers long answers in Portuguese", vector=unit(-1, 0, 0, 0), minutes=9)]
        )
        assert await vectors.count("acme") == len(FACTS)
        assert (await vectors.search(query("bullet points"))).keyword == []
        found = await vectors.search(query("Portuguese"))
        assert ids(found.keyword) == ["m-lang"]
        assert found.keyword[0].created_at == BASE + timedelta(minutes=9)
        by_meaning = await vectors.search(query("", unit(-1, 0, 0, 0), limit=1))
        assert ids(by_meaning.semantic) == ["m-lang"]
        assert by_meaning.semantic[0].score == pytest.approx(1.0, abs=1e-5)
        old_place = await vectors.search(query("", unit(0, 0, 0, 1), limit=5))
        assert old_place.semantic[0].memory_id != "m-lang"
        # Duplicates inside one batch: the last one wins, one row kept.
        await vectors.upsert([row("m-dup", "first words"), row("m-dup", "second words")])
        assert ids((await vectors.search(query("second"))).keyword) == ["m-dup"]
        assert (await vectors.search(query("first"))).keyword == []
        assert await vectors.count("acme") == len(FACTS) + 1

    run(scenario())


def test_upsert_can_move_a_memory_to_another_scope(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert([row("m1", "deploys with helm", scope="project-a", vector=unit(1, 0, 0, 0))])
        await vectors.upsert([row("m1", "deploys with helm", scope="project-b", vector=unit(1, 0, 0, 0))])
        result = await vectors.search(query("helm", unit(1, 0, 0, 0)))
        assert result.semantic == [] and result.keyword == []
        result = await vectors.search(query("helm", unit(1, 0, 0, 0), scopes=("project-b",)))
        assert ids(result.semantic) == ["m1"] and ids(result.keyword) == ["m1"]

    run(scenario())


# -- isolation and filters ------------------------------------------------------------------------------


def test_tenants_never_mix(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert([row("x", "allergic to peanuts", tenant="acme", vector=unit(0, 1, 0, 0))])
        # Same user, scope and even the same memory id in another tenant, with closer vectors.
        await vectors.upsert(
            [
                row(f"y{i}", "allergic to peanuts peanuts", tenant="globex", vector=unit(1, 0, 0, 0))
                for i in range(20)
            ]
            + [row("x", "allergic to shellfish", tenant="globex", vector=unit(1, 0, 0, 0))]
        )
        result = await vectors.search(query("allergic peanuts", unit(1, 0, 0, 0)))
        assert ids(result.semantic) == ["x"] and ids(result.keyword) == ["x"]
        assert result.semantic[0].score == pytest.approx(0.0, abs=1e-5)  # acme's own vector, not globex's
        assert (await vectors.search(query("shellfish"))).keyword == []
        assert await vectors.count("acme") == 1
        assert await vectors.count("globex") == 21

    run(scenario())


def test_users_never_mix(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert(
            [
                row("a1", "drinks oolong tea", user="ann", vector=unit(1, 0, 0, 0)),
                row("b1", "drinks oolong tea", user="bob", vector=unit(1, 0, 0, 0)),
            ]
        )
        for user, expected in (("ann", ["a1"]), ("bob", ["b1"]), ("cat", [])):
            result = await vectors.search(query("oolong", unit(1, 0, 0, 0), user=user))
            assert ids(result.semantic) == expected and ids(result.keyword) == expected

    run(scenario())


def test_scope_filter(vectors: Vectors) -> None:
    async def scenario() -> None:
        v = unit(1, 0, 0, 0)
        await vectors.upsert(
            [
                row("u", "ci runs on buildkite", scope="user", vector=v),
                row("a", "ci runs on buildkite", scope="project-a", vector=v),
                row("b", "ci runs on buildkite", scope="project-b", vector=v),
            ]
        )
        result = await vectors.search(query("buildkite", v, scopes=("user", "project-a"), limit=10))
        assert sorted(ids(result.semantic)) == ["a", "u"] and sorted(ids(result.keyword)) == ["a", "u"]
        result = await vectors.search(query("buildkite", v, scopes=("project-b",)))
        assert ids(result.semantic) == ["b"] and ids(result.keyword) == ["b"]
        result = await vectors.search(query("buildkite", v, scopes=("user", "user")))
        assert ids(result.semantic) == ["u"]
        result = await vectors.search(query("buildkite", v, scopes=()))
        assert result.semantic == [] and result.keyword == []

    run(scenario())


def test_hostile_ids_neither_break_nor_widen_filters(vectors: Vectors) -> None:
    async def scenario() -> None:
        v = unit(1, 0, 0, 0)
        sneaky_user = "o'brien\\"
        sneaky_scope = "proj' OR '1'='1"
        await vectors.upsert(
            [
                row("plain", "token ECONNRESET", vector=v),
                row("q1", "token ECONNRESET", user=sneaky_user, scope=sneaky_scope, vector=v),
                row("q2", "token ECONNRESET", user=sneaky_user, scope="other", vector=v),
                row("q3", "token ECONNRESET", user="it's", scope="user", vector=v),
            ]
        )
        result = await vectors.search(query("ECONNRESET", v, user=sneaky_user, scopes=(sneaky_scope,)))
        assert ids(result.semantic) == ["q1"] and ids(result.keyword) == ["q1"]
        result = await vectors.search(query("ECONNRESET", v, user="it's", scopes=("user",)))
        assert ids(result.semantic) == ["q3"] and ids(result.keyword) == ["q3"]
        for user, scopes in (
            ("ann' OR '1'='1", ("user",)),
            ("ann", ("x') OR ('1'='1",)),
            ("ann\\' OR user_id != '", ("user",)),
        ):
            result = await vectors.search(query("ECONNRESET", v, user=user, scopes=scopes))
            assert result.semantic == [] and result.keyword == [], (user, scopes)
        assert await vectors.count("acme", sneaky_user) == 2
        assert await vectors.count("acme", "ann' OR '1'='1") == 0
        assert await vectors.count("acme' OR '1'='1") == 0
        await vectors.delete("acme", ["q1' OR '1'='1", "plain' OR id != '"])
        await vectors.delete_user("acme", "ann' OR '1'='1")
        await vectors.delete_user("acme' OR '1'='1", "ann")
        assert await vectors.count("acme") == 4
        await vectors.delete_user("acme", sneaky_user)
        assert await vectors.count("acme") == 2

    run(scenario())


# -- deletes --------------------------------------------------------------------------------------------


def test_delete_by_id_only_affects_that_tenant(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert([row("m1", "likes jazz"), row("m2", "likes blues"), row("m3", "likes funk")])
        await vectors.upsert(
            [row("m1", "likes jazz", tenant="globex"), row("m2", "likes blues", tenant="globex")]
        )
        await vectors.delete("acme", ["m1", "m3", "missing"])
        await vectors.delete("acme", [])
        assert await vectors.count("acme") == 1
        assert await vectors.count("globex") == 2
        assert ids((await vectors.search(query("likes", limit=10))).keyword) == ["m2"]
        found = await vectors.search(query("jazz", tenant="globex"))
        assert ids(found.keyword) == ["m1"]

    run(scenario())


def test_delete_user_removes_that_users_rows_only(vectors: Vectors) -> None:
    async def scenario() -> None:
        await vectors.upsert(
            [
                row(f"a{i}", f"ann fact {i}", user="ann", scope="user" if i % 2 else "project-a")
                for i in range(5)
            ]
            + [row(f"b{i}", f"bob fact {i}", user="bob") for i in range(3)]
            + [row("g1", "ann fact elsewhere", tenant="globex", user="ann")]
        )
        assert await vectors.count("acme") == 8
        assert await vectors.count("acme", "ann") == 5
        assert await vectors.count("acme", "bob") == 3
        await vectors.delete_user("acme", "ann")
        assert await vectors.count("acme", "ann") == 0
        assert await vectors.count("acme", "bob") == 3
        assert await vectors.count("acme") == 3
        assert await vectors.count("globex", "ann") == 1
        assert (await vectors.search(query("fact"))).keyword == []
        assert len((await vectors.search(query("fact", user="bob"))).keyword) == 3

    run(scenario())


# -- many writes, reopening (LanceDB) -------------------------------------------------------------------


def test_many_single_row_upserts_then_search(vectors: Vectors) -> None:
    async def scenario() -> None:
        for i in range(60):
            await vectors.upsert([row(f"m{i}", f"note {i} about redis", vector=unit(1, i / 60, 0, 0))])
        await vectors.upsert([row("m7", "note about E1234 instead", vector=unit(0, 0, 1, 0))])
        await vectors.delete("acme", ["m8"])
        assert await vectors.count("acme") == 59
        result = await vectors.search(query("redis", unit(1, 0, 0, 0), limit=100))
        assert len(result.keyword) == 58 and "m7" not in ids(result.keyword)
        assert ids(result.semantic)[:3] == ["m0", "m1", "m2"] and len(result.semantic) == 59
        assert ids((await vectors.search(query("E1234"))).keyword) == ["m7"]

    run(scenario())


def test_compaction_keeps_fragments_few(tmp_path: Path) -> None:
    async def scenario() -> None:
        vectors = LanceMemoryVectors.open(str(tmp_path / "lancedb"), "memories_test", DIMS)
        for i in range(45):
            await vectors.upsert([row(f"m{i}", f"note {i}", vector=unit(1, 0, 0, 0))])
        table = await vectors.table()
        stats: Any = await table.stats()
        # Compacted at the 20th and 40th writes (45 fragments without it).
        assert int(stats["fragment_stats"]["num_fragments"]) <= 10
        await vectors.aclose()

    run(scenario())


def test_reopening_the_table_sees_earlier_rows(tmp_path: Path) -> None:
    async def scenario() -> None:
        uri = str(tmp_path / "lancedb")
        first = LanceMemoryVectors.open(uri, "memories/e5 small", DIMS)
        await first.upsert(FACTS)
        await first.aclose()
        second = LanceMemoryVectors.open(uri, "memories/e5 small", DIMS)
        assert await second.count("acme") == len(FACTS)
        result = await second.search(query("pg_hba.conf", unit(0, 1, 0, 0)))
        assert ids(result.keyword)[0] == "m-pg" and ids(result.semantic)[0] == "m-pg"
        await second.aclose()
        with pytest.raises(SearchIndexError):
            LanceMemoryVectors.open(uri, "memories/e5 small", DIMS + 1)

    run(scenario())


def test_lance_indexes_deferred_on_an_empty_table_are_made_by_the_first_upsert(tmp_path: Path) -> None:
    async def scenario() -> None:
        uri = str(tmp_path / "lancedb")
        lancedb.connect(uri).create_table("memories_test", schema=schema(DIMS))  # no indexes
        vectors = LanceMemoryVectors(uri, "memories_test", DIMS, indexes_ready=False)
        await vectors.upsert(FACTS)
        table = await vectors.table()
        indexed = {column for index in await table.list_indices() for column in index.columns}
        assert indexed == {"id", "tenant", "user_id", "text"}
        assert ids((await vectors.search(query("E1234"))).keyword) == ["m-err"]
        await vectors.aclose()

    run(scenario())
