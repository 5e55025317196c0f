"""The message index on real LanceDB (in tmp_path) and its in-memory fake, through the same cases:
exact terms, semantic ranking, text-before-vectors, idempotence, tenant isolation, filters, deletion."""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import shutil
import time
from collections.abc import Coroutine, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import lancedb
import pyarrow as pa
import pytest
from lancedb.query import MatchQuery

from gateway.adapters.lance_index import LanceIndex, keyword_query, schema, table_name
from gateway.adapters.vector_cache import RELOAD_SECONDS, Entry, VectorCache
from gateway.errors import SearchIndexError
from gateway.fakes.memory_index import MemoryIndex
from gateway.ports import VectorIndex
from gateway.records import IndexRow, SearchQuery

T = TypeVar("T")
DIMS = 4
BASE = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def unit(*values: float) -> list[float]:
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def row(
    node: str,
    text: str,
    *,
    tenant: str = "acme",
    conversation: str = "c1",
    user: str | None = "u1",
    depth: int = 0,
    vector: list[float] | None = None,
    view: str = "m",
    created_at: datetime | None = None,
    dated: bool = True,
) -> IndexRow:
    return IndexRow(
        id=f"{node}:{view}",
        tenant=tenant,
        user_id=user,
        conversation_id=conversation,
        node_id=node,
        view=view,
        depth=depth,
        created_at=created_at or BASE + timedelta(minutes=depth),
        text=text,
        vector=vector,
        dated=dated,
    )


def query(
    text: str = "", vector: list[float] | None = None, *, tenant: str = "acme", limit: int = 5, **filters: Any
) -> SearchQuery:
    return SearchQuery(tenant=tenant, text=text, vector=vector, limit=limit, **filters)


FILLER = [
    "connection refused ECONNREFUSED on retry",
    "error E1235 when saving the draft",
    "billing returned error code E12345",
    "port 8080 is the default for the dev server",
    "moved parse.py and config.py into the tools folder",
    "the config parser is in python",
    "we talked about lunch and the weather",
    "the cache hit rate dropped after the deploy",
    "user profile page loads slowly",
]
TARGETS = {
    "t-econn": "the socket hung up with ECONNRESET while streaming",
    "t-e1234": "the installer failed with error E1234 again",
    "t-8443": "nginx listens on port 8443 for tls",
    "t-parse": "the bug is in parse_config.py near line 40",
    "t-snake": "rename user_profile_cache before the release",
}


def corpus() -> list[IndexRow]:
    rows = [row(f"f{i}", FILLER[i % len(FILLER)], depth=i) for i in range(270)]
    rows += [row(node, text, depth=300 + i) for i, (node, text) in enumerate(TARGETS.items())]
    return rows


def _implements_the_port(lance: LanceIndex, memory: MemoryIndex) -> list[VectorIndex]:
    return [lance, memory]  # checked by mypy, never called


@pytest.fixture(params=["lance", "memory"])
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LanceIndex | MemoryIndex]:
    made: LanceIndex | MemoryIndex
    if request.param == "lance":
        made = LanceIndex.open(str(tmp_path / "lancedb"), "messages_test", DIMS)
    else:
        made = MemoryIndex(DIMS)
    yield made
    run(made.aclose())


@pytest.fixture(params=["lance", "memory", "lance-cached"])
def scoped(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LanceIndex | MemoryIndex]:
    """For searches of one conversation ("c1", every row's by default): the cached variant serves both
    rankings from its in-memory copy (vector_cache, keyword_rank), the others from the table or the fake."""
    made: LanceIndex | MemoryIndex
    if request.param == "memory":
        made = MemoryIndex(DIMS)
    else:
        cache_rows = 10_000 if request.param == "lance-cached" else 0
        made = LanceIndex.open(str(tmp_path / "lancedb"), "messages_test", DIMS, cache_rows=cache_rows)
    yield made
    run(made.aclose())


def one(text: str = "", vector: list[float] | None = None, **filters: Any) -> SearchQuery:
    """A query of conversation "c1"."""
    return query(text, vector, conversation_id="c1", **filters)


def ids(hits: list[Any]) -> list[str]:
    return [h.node_id for h in hits]


def fragments(table: Any) -> int:
    stats: Any = table.stats()  # typed as a class, a dict at run time
    return int(stats["fragment_stats"]["num_fragments"])


# -- keyword --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ECONNRESET", "t-econn"),
        ("E1234", "t-e1234"),
        ("what was on port 8443?", "t-8443"),
        ("parse_config.py", "t-parse"),
        ("where did user_profile_cache go", "t-snake"),
    ],
)
def test_exact_terms_rank_first_among_many_rows(
    scoped: LanceIndex | MemoryIndex, text: str, expected: str
) -> None:
    async def scenario() -> None:
        await scoped.add(corpus())
        result = await scoped.search(one(text))
        assert result.keyword, text
        assert result.keyword[0].node_id == expected
        assert result.semantic == []  # no query vector, no semantic ranking
        scores = [h.score for h in result.keyword]
        assert scores == sorted(scores, reverse=True) and scores[0] > 0

    run(scenario())


CJK_ROWS = {
    "z-port": "我们把端口改成8443了，因为防火墙只放行这个",
    "z-timeout": "parse_config.py里的超时参数是30秒",
    "z-pool": "数据库迁移到PostgreSQL 17之后连接池报错",
    "z-cache": "缓存服务的端口号是6379",
    "k-deploy": "지난주에 결제 서비스를 배포했어요",
    "k-port": "포트는 8443으로 바꿨어요",
    "k-lunch": "점심은 김치찌개를 먹었어요",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("端口改成多少了", "z-port"),  # a run of Chinese characters holding the stored word
        ("连接池", "z-pool"),
        ("迁移到哪个数据库", "z-pool"),
        ("parse_config.py的超时", "z-timeout"),  # an English identifier glued to Chinese text
        ("缓存的端口号", "z-cache"),
        ("배포", "k-deploy"),  # a Korean stem inside a word with its endings
        ("결제 서비스", "k-deploy"),
        ("김치찌개", "k-lunch"),
    ],
)
def test_chinese_and_korean_terms_are_found_inside_longer_runs(
    scoped: LanceIndex | MemoryIndex, text: str, expected: str
) -> None:
    async def scenario() -> None:
        rows = corpus() + [row(node, t, depth=400 + i) for i, (node, t) in enumerate(CJK_ROWS.items())]
        await scoped.add(rows)
        result = await scoped.search(one(text))
        assert result.keyword, text
        assert result.keyword[0].node_id == expected

    run(scenario())


@pytest.mark.parametrize(
    "text",
    [
        '"ECONNRESET',
        "ECONNRESET AND (weather OR",
        "title:ECONNRESET",
        "NOT ECONNRESET",
        "ECONNRESET) -x +y ~2 ^3 * \\ ' ; --",
        "ECONNRESET' OR '1'='1",
    ],
)
def test_query_syntax_characters_are_plain_text(scoped: LanceIndex | MemoryIndex, text: str) -> None:
    async def scenario() -> None:
        await scoped.add(corpus())
        result = await scoped.search(one(text))
        assert result.keyword and result.keyword[0].node_id == "t-econn"

    run(scenario())


@pytest.mark.parametrize("text", ["", "   \n\t", "?!", "()", '"', "___"])
def test_empty_or_wordless_query_has_no_keyword_hits(scoped: LanceIndex | MemoryIndex, text: str) -> None:
    async def scenario() -> None:
        await scoped.add(corpus())
        result = await scoped.search(one(text, unit(1, 0, 0, 0)))
        assert result.keyword == []

    run(scenario())


def test_keyword_query_objects() -> None:
    assert keyword_query("  ") is None
    assert keyword_query("(") is None
    plain = keyword_query("port 8443")
    assert plain is not None and plain.query_type().value == "match"
    compound = keyword_query("is parse_config.py fixed")
    assert compound is not None and compound.query_type().value == "boolean"
    long = keyword_query(" ".join(f"word{i % 900}" for i in range(5000)))
    assert isinstance(long, MatchQuery) and len(long.query.split()) == 256


# -- semantic -------------------------------------------------------------------------------------------


def test_semantic_ranking_is_cosine_similarity(scoped: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        await scoped.add(
            [
                row("a", "alpha", vector=unit(1, 0, 0, 0), depth=1),
                row("b", "beta", vector=unit(0.8, 0.6, 0, 0), depth=2),
                row("c", "gamma", vector=unit(0, 1, 0, 0), depth=3),
                row("d", "delta", vector=unit(-1, 0, 0, 0), depth=4),
            ]
        )
        result = await scoped.search(one("", unit(1, 0, 0, 0), limit=3))
        assert ids(result.semantic) == ["a", "b", "c"]
        assert [round(h.score, 4) for h in result.semantic] == [1.0, 0.8, 0.0]
        assert result.semantic[1].depth == 2 and result.semantic[1].view == "m"
        assert result.semantic[1].created_at == BASE + timedelta(minutes=2)
        assert result.semantic[1].created_at.tzinfo is not None

    run(scenario())


def test_rows_without_vectors_are_found_by_keyword_then_semantically_once_embedded(
    scoped: LanceIndex | MemoryIndex,
) -> None:
    async def scenario() -> None:
        await scoped.add([row("old", "unrelated words", vector=unit(0, 0, 1, 0))])
        await scoped.add(
            [row("new", "deploy to staging with ETIMEDOUT"), row("new2", "another fresh message")]
        )
        result = await scoped.search(one("ETIMEDOUT", unit(1, 0, 0, 0)))
        assert ids(result.keyword) == ["new"]
        assert ids(result.semantic) == ["old"]  # rows without a vector are not ranked semantically

        await scoped.set_vectors("acme", {"new:m": unit(1, 0, 0, 0), "new2:m": unit(0.6, 0.8, 0, 0)})
        result = await scoped.search(one("ETIMEDOUT", unit(1, 0, 0, 0)))
        assert ids(result.semantic) == ["new", "new2", "old"]
        assert result.semantic[0].score == pytest.approx(1.0, abs=1e-5)
        assert ids(result.keyword) == ["new"]  # the text survived the vector update

    run(scenario())


def test_wrong_dimensions_are_index_errors(index: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        await index.add([row("a", "alpha")])
        with pytest.raises(SearchIndexError):
            await index.search(query("alpha", [1.0, 0.0]))
        with pytest.raises(SearchIndexError):
            await index.set_vectors("acme", {"a:m": [1.0, 0.0]})

    run(scenario())


# -- writes ---------------------------------------------------------------------------------------------


def test_add_is_idempotent_and_keeps_vectors(index: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        rows = [row(f"n{i}", f"message number {i} about kafka", depth=i) for i in range(50)]
        await index.add(rows)
        await index.add(rows)
        await index.add(rows[:10] + rows[:10])  # duplicates inside one batch too
        assert await index.count("acme") == 50
        await index.set_vectors("acme", {"n3:m": unit(1, 0, 0, 0)})
        await index.add(rows)  # a retried job re-adds without vectors: the one set stays
        result = await index.search(query("kafka", unit(1, 0, 0, 0), limit=100))
        assert ids(result.semantic) == ["n3"]
        assert sorted(ids(result.keyword)) == sorted(r.node_id for r in rows)

    run(scenario())


def test_set_vectors_ignores_unknown_ids(index: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        await index.add([row("a", "alpha")])
        await index.set_vectors("acme", {"missing:m": unit(1, 0, 0, 0), "a:m": unit(0, 1, 0, 0)})
        assert await index.count("acme") == 1
        result = await index.search(query("", unit(0, 1, 0, 0)))
        assert ids(result.semantic) == ["a"]

    run(scenario())


# -- isolation and filters ------------------------------------------------------------------------------


def test_tenants_never_mix(index: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        # The same conversation and node ids in two tenants; the other tenant's rows are many and closer.
        await index.add([row("x", "shared secret ECONNRESET", tenant="acme", vector=unit(0, 1, 0, 0))])
        await index.add(
            [
                row(f"y{i}", "shared secret ECONNRESET ECONNRESET", tenant="globex", vector=unit(1, 0, 0, 0))
                for i in range(40)
            ]
        )
        result = await index.search(query("shared secret ECONNRESET", unit(1, 0, 0, 0), conversation_id="c1"))
        assert ids(result.semantic) == ["x"] and ids(result.keyword) == ["x"]
        # Vectors of one tenant cannot be written onto another's rows, nor deleted by another.
        await index.set_vectors("globex", {"x:m": unit(1, 0, 0, 0)})
        result = await index.search(query("", unit(1, 0, 0, 0)))
        assert result.semantic[0].score == pytest.approx(0.0, abs=1e-5)
        await index.delete("globex", conversation_id="c1")
        assert await index.count("acme") == 1
        assert await index.count("globex") == 0

    run(scenario())


def test_quotes_in_ids_neither_break_nor_widen_filters(index: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        sneaky = "acme' OR '1'='1"
        await index.add([row("plain", "token ECONNRESET", vector=unit(1, 0, 0, 0))])
        await index.add(
            [
                row(
                    "q1",
                    "token ECONNRESET",
                    tenant=sneaky,
                    conversation="it's",
                    user="o'brien\\",
                    vector=unit(1, 0, 0, 0),
                ),
                row(
                    "q2",
                    "token ECONNRESET",
                    tenant=sneaky,
                    conversation="other",
                    user="x",
                    vector=unit(1, 0, 0, 0),
                ),
            ]
        )
        for q in (
            query("ECONNRESET", unit(1, 0, 0, 0), tenant=sneaky, conversation_id="it's"),
            query("ECONNRESET", unit(1, 0, 0, 0), tenant=sneaky, user_id="o'brien\\"),
            query("ECONNRESET", unit(1, 0, 0, 0), tenant=sneaky, exclude_conversation_id="other"),
        ):
            result = await index.search(q)
            assert ids(result.semantic) == ["q1"] and ids(result.keyword) == ["q1"]
        result = await index.search(query("ECONNRESET", unit(1, 0, 0, 0), tenant="x' OR tenant != '"))
        assert result.semantic == [] and result.keyword == []
        assert await index.count(sneaky) == 2
        assert await index.count("x' OR tenant != '") == 0
        await index.delete(sneaky, conversation_id="it's")
        await index.delete("acme' OR '1'='1' OR tenant = 'acme", user_id="u1")
        assert await index.count(sneaky) == 1
        assert await index.count("acme") == 1

    run(scenario())


def test_user_filter_and_excluded_conversation(index: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        v = unit(1, 0, 0, 0)
        await index.add(
            [
                row("a1", "kafka lag", conversation="a", user="ann", vector=v),
                row("a2", "kafka lag", conversation="b", user="ann", vector=v),
                row("a3", "kafka lag", conversation="c", user="ann", vector=v),
                row("b1", "kafka lag", conversation="d", user="bob", vector=v),
                row("n1", "kafka lag", conversation="e", user=None, vector=v),
            ]
        )
        result = await index.search(query("kafka", v, user_id="ann", exclude_conversation_id="b"))
        assert sorted(ids(result.semantic)) == ["a1", "a3"]
        assert sorted(ids(result.keyword)) == ["a1", "a3"]
        result = await index.search(query("kafka", v, user_id="ann", conversation_id="c"))
        assert ids(result.semantic) == ["a3"] and ids(result.keyword) == ["a3"]
        result = await index.search(query("kafka", v, exclude_conversation_id="a"))
        assert sorted(ids(result.keyword)) == ["a2", "a3", "b1", "n1"]

    run(scenario())


def test_max_depth_keeps_older_messages_only(scoped: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        v = unit(1, 0, 0, 0)
        await scoped.add([row(f"d{d}", "flaky test in ci", depth=d, vector=v) for d in range(10)])
        result = await scoped.search(one("flaky", v, limit=20, max_depth=4))
        assert sorted(ids(result.semantic)) == ["d0", "d1", "d2", "d3"]
        assert sorted(ids(result.keyword)) == ["d0", "d1", "d2", "d3"]
        result = await scoped.search(one("flaky", v, max_depth=0))
        assert result.semantic == [] and result.keyword == []

    run(scenario())


def test_undated_rows_pass_any_time_range_and_say_so(scoped: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        v = unit(1, 0, 0, 0)
        late = BASE + timedelta(days=30)  # stored a month later, said at an unknown time
        await scoped.add(
            [
                row("dated-in", "budget review", created_at=BASE + timedelta(hours=1), vector=v),
                row("dated-out", "budget review", created_at=late, vector=v),
                row("undated", "budget review", created_at=late, vector=v, dated=False),
            ]
        )
        window = {"since": BASE, "until": BASE + timedelta(days=1), "limit": 10}
        result = await scoped.search(one("budget", v, **window))
        assert sorted(ids(result.semantic)) == ["dated-in", "undated"]
        assert sorted(ids(result.keyword)) == ["dated-in", "undated"]
        assert {h.node_id: h.dated for h in result.semantic + result.keyword} == {
            "dated-in": True,
            "undated": False,
        }

    run(scenario())


def test_since_and_until_bound_created_at(scoped: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        v = unit(1, 0, 0, 0)
        await scoped.add(
            [row(f"h{h}", "standup notes", created_at=BASE + timedelta(hours=h), vector=v) for h in range(6)]
        )
        result = await scoped.search(
            one("standup", v, limit=10, since=BASE + timedelta(hours=2), until=BASE + timedelta(hours=4))
        )
        assert sorted(ids(result.semantic)) == ["h2", "h3", "h4"]  # both bounds inclusive
        assert sorted(ids(result.keyword)) == ["h2", "h3", "h4"]
        # An aware bound in another zone is the same instant: 15:00+02:00 is 13:00 UTC.
        plus_two = timezone(timedelta(hours=2))
        result = await scoped.search(
            one("standup", v, limit=10, since=datetime(2024, 3, 1, 15, 0, tzinfo=plus_two))
        )
        assert sorted(ids(result.keyword)) == ["h1", "h2", "h3", "h4", "h5"]

    run(scenario())


def test_limit_zero_returns_nothing(scoped: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        await scoped.add([row("a", "alpha", vector=unit(1, 0, 0, 0))])
        result = await scoped.search(one("alpha", unit(1, 0, 0, 0), limit=0))
        assert result.semantic == [] and result.keyword == []

    run(scenario())


# -- deletion -------------------------------------------------------------------------------------------


def test_delete_by_conversation_and_by_user(index: LanceIndex | MemoryIndex) -> None:
    async def scenario() -> None:
        v = unit(1, 0, 0, 0)
        await index.add(
            [
                row("a1", "postgres vacuum", conversation="a", user="ann", vector=v),
                row("a2", "postgres vacuum", conversation="b", user="ann", vector=v),
                row("b1", "postgres vacuum", conversation="c", user="bob", vector=v),
                row("b2", "postgres vacuum", conversation="d", user="bob", vector=v),
                row("o1", "postgres vacuum", conversation="a", tenant="other", user="ann", vector=v),
            ]
        )
        await index.delete("acme", conversation_id="a")
        result = await index.search(query("postgres", v, limit=10))
        assert sorted(ids(result.semantic)) == ["a2", "b1", "b2"]
        assert sorted(ids(result.keyword)) == ["a2", "b1", "b2"]
        await index.delete("acme", user_id="bob")
        result = await index.search(query("postgres", v, limit=10))
        assert ids(result.semantic) == ["a2"] and ids(result.keyword) == ["a2"]
        await index.delete("acme", conversation_id="b", user_id="bob")  # both must match: nothing
        assert await index.count("acme") == 1
        assert await index.count("other") == 1
        with pytest.raises(ValueError):
            await index.delete("acme")

    run(scenario())


# -- LanceDB only ---------------------------------------------------------------------------------------


def test_table_names_are_sanitised() -> None:
    assert table_name("messages_minilm") == "messages_minilm"
    odd = table_name("sentence-transformers/all-MiniLM-L6-v2")
    assert (
        odd.startswith("sentence-transformers_all-MiniLM-L6-v2-")
        and len(odd) == len("sentence-transformers_all-MiniLM-L6-v2") + 9
    )
    assert table_name("a/b") != table_name("a_b") != table_name("a.b")
    with pytest.raises(ValueError):
        table_name("///")


def test_a_table_from_before_undated_rows_gets_the_column_at_open(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    old = schema(DIMS).remove(schema(DIMS).get_field_index("dated"))
    db = lancedb.connect(uri)
    table = db.create_table("messages_old", schema=old)
    kept = row("kept", "rotate the api keys", vector=unit(1, 0, 0, 0))
    values = {f.name: [getattr(kept, f.name)] for f in old if f.name != "vector"}
    table.add(pa.table({**values, "vector": [kept.vector]}, schema=old))
    index = LanceIndex.open(uri, "messages_old", DIMS)

    async def scenario() -> None:
        await index.add([row("new", "rotate the api keys", vector=unit(1, 0, 0, 0), dated=False)])
        window = {"since": BASE + timedelta(days=1), "limit": 10}
        result = await index.search(query("rotate", unit(1, 0, 0, 0), **window))
        assert ids(result.semantic) == ["new"]  # the old row counts as dated (and is out of range)
        result = await index.search(query("rotate", unit(1, 0, 0, 0), limit=10))
        assert {h.node_id: h.dated for h in result.keyword} == {"kept": True, "new": False}
        await index.aclose()

    run(scenario())


def test_open_creates_schema_and_indexes_and_checks_dimensions(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    index = LanceIndex.open(uri, "openai/text-embedding-3-small", 8)
    table = lancedb.connect(uri).open_table(index.name)
    fields = {f.name: f for f in table.schema}
    assert fields["vector"].nullable and fields["vector"].type.list_size == 8
    assert str(fields["created_at"].type) == "timestamp[us, tz=UTC]"
    indexed = {column: i.index_type for i in table.list_indices() for column in i.columns}
    assert indexed == {
        "id": "BTree",
        "tenant": "Bitmap",
        "conversation_id": "BTree",
        "user_id": "BTree",
        "text": "FTS",
    }
    LanceIndex.open(uri, "openai/text-embedding-3-small", 8)  # reopening is fine
    with pytest.raises(SearchIndexError, match="8"):
        LanceIndex.open(uri, "openai/text-embedding-3-small", 16)


def test_indexes_deferred_until_the_first_add(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    from gateway.adapters.lance_index import schema

    lancedb.connect(uri).create_table(
        "bare", schema=schema(DIMS)
    )  # as an engine that cannot index empty tables leaves it
    index = LanceIndex(uri, "bare", DIMS, indexes_ready=False)
    run(index.add([row("a", "alpha ECONNRESET")]))
    table = lancedb.connect(uri).open_table("bare")
    assert {c for i in table.list_indices() for c in i.columns} == {
        "id",
        "tenant",
        "conversation_id",
        "user_id",
        "text",
    }
    assert ids(run(index.search(query("ECONNRESET"))).keyword) == ["a"]


def test_a_second_instance_sees_writes_at_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    writer = LanceIndex.open(uri, "shared", DIMS)
    reader = LanceIndex.open(uri, "shared", DIMS)

    async def scenario() -> None:
        assert (await reader.search(query("ECONNRESET"))).keyword == []  # the reader's handle is open now
        await writer.add([row("a", "fresh ECONNRESET")])
        assert ids((await reader.search(query("ECONNRESET"))).keyword) == ["a"]
        await writer.set_vectors("acme", {"a:m": unit(1, 0, 0, 0)})
        assert ids((await reader.search(query("", unit(1, 0, 0, 0)))).semantic) == ["a"]
        await writer.delete("acme", conversation_id="c1")
        assert (await reader.search(query("ECONNRESET", unit(1, 0, 0, 0)))).keyword == []

    run(scenario())


def test_compaction_after_many_small_writes_changes_no_result(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    index = LanceIndex.open(uri, "frag", DIMS, optimize_every_writes=10_000)

    def vector(i: int) -> list[float]:
        return unit(1, (i % 7) / 7, (i % 3) / 3, 0.1)

    async def scenario() -> None:
        for i in range(60):  # 60 small appends and 60 vector updates: 120 fragments' worth of writes
            await index.add(
                [row(f"n{i}", f"note {i} about the {'ECONNRESET' if i % 10 == 0 else 'weather'}", depth=i)]
            )
            await index.set_vectors("acme", {f"n{i}:m": vector(i)})
        await index.delete("acme", user_id="nobody")
        q = query("ECONNRESET weather", unit(1, 0.5, 0.2, 0.1), limit=20, max_depth=55)
        before = await index.search(q)
        await index.optimize()
        after = await index.search(q)
        assert [(h.node_id, round(h.score, 5)) for h in after.semantic] == [
            (h.node_id, round(h.score, 5)) for h in before.semantic
        ]
        # BM25 statistics move a little once every row is in one index segment; the ranking does not
        # (ties among equal texts may come in any order).
        econnreset = {f"n{i}" for i in (0, 10, 20, 30, 40, 50)}
        assert set(ids(before.keyword)[:6]) == set(ids(after.keyword)[:6]) == econnreset
        assert len(before.keyword) == len(after.keyword) == 20
        assert await index.count("acme") == 60

    run(scenario())
    table = lancedb.connect(uri).open_table("frag")
    assert fragments(table) <= 2
    assert all(i.num_unindexed_rows == 0 for i in table.list_indices())


def test_writes_trigger_compaction(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    index = LanceIndex.open(uri, "auto", DIMS, optimize_every_writes=5)

    async def scenario() -> None:
        for i in range(5):
            await index.add([row(f"n{i}", f"note {i}")])

    run(scenario())
    table = lancedb.connect(uri).open_table("auto")
    assert fragments(table) == 1
    assert all(i.num_unindexed_rows == 0 for i in table.list_indices())


def unindexed(uri: str, name: str) -> int:
    table = lancedb.connect(uri).open_table(name)
    return max(i.num_unindexed_rows for i in table.list_indices())


def test_a_compaction_put_off_by_the_throttle_runs_without_another_write(tmp_path: Path) -> None:
    """Rows left out of the full-text index make every keyword search scan them: a burst of writes
    that ends while compaction is throttled must still end up indexed."""
    uri = str(tmp_path / "db")
    index = LanceIndex.open(uri, "later", DIMS, optimize_every_writes=2)

    async def scenario() -> None:
        for i in range(2):
            await index.add([row(f"a{i}", f"first {i}")])  # the second write compacts
        for i in range(2):
            await index.add([row(f"b{i}", f"second {i}")])  # due again at once: throttled, put off
        assert unindexed(uri, "later") > 0
        deadline = time.monotonic() + 60
        while unindexed(uri, "later") > 0:
            assert time.monotonic() < deadline, "the put-off compaction never ran"
            await asyncio.sleep(0.1)
        await index.aclose()

    run(scenario())


def test_a_process_compacts_at_its_first_write_what_an_earlier_one_left_unindexed(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    bulk = LanceIndex.open(uri, "left", DIMS, optimize_every_writes=1_000, optimize_every_rows=100_000)
    run(bulk.add([row("first", "indexes are made with the first write")]))
    run(bulk.add([row(f"n{i}", f"imported note {i}") for i in range(1_200)]))
    assert unindexed(uri, "left") >= 1_200
    later = LanceIndex.open(uri, "left", DIMS, optimize_every_writes=1_000, optimize_every_rows=100_000)
    run(later.add([row("next", "the next process's first write")]))
    assert unindexed(uri, "left") == 0


def test_compactions_are_not_preempted_by_the_processs_own_concurrent_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two job workers filling in vectors while a compaction runs: Lance refuses a compaction that a
    concurrent update preempts, which left a bulk import's rows out of the full-text index (every
    compaction of the import failed). This process's writes now wait for its compaction."""
    uri = str(tmp_path / "db")
    index = LanceIndex.open(uri, "busy", DIMS, optimize_every_writes=4)

    async def worker(name: str) -> None:
        for i in range(30):
            await index.add([row(f"{name}{i}", f"{name} note {i} about the weather")])
            await index.set_vectors("acme", {f"{name}{i}:m": unit(1, i / 30, 0.5, 0.1)})

    async def scenario() -> None:
        await index.add([row("first", "indexes are made with the first write")])
        await asyncio.gather(worker("a"), worker("b"))
        await index.aclose()

    with caplog.at_level(logging.WARNING, logger="gateway"):
        run(scenario())
    failed = [r.getMessage() for r in caplog.records if "compaction failed" in r.getMessage()]
    assert failed == []
    assert lancedb.connect(uri).open_table("busy").count_rows() == 61


def test_engine_failures_become_search_index_errors(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    index = LanceIndex.open(uri, "gone", DIMS)

    async def scenario() -> None:
        await index.add([row("a", "alpha")])
        shutil.rmtree(uri)
        with pytest.raises(SearchIndexError):
            await index.search(query("alpha", unit(1, 0, 0, 0)))
        with pytest.raises(SearchIndexError):
            await index.add([row("b", "beta")])

    run(scenario())


# -- the in-memory copy of searched conversations (vector_cache) -----------------------------------------


def _scattered_rows() -> list[IndexRow]:
    """Two tenants, two conversations each, dated and deep enough for every filter; some rows unembedded."""
    rows = []
    for tenant in ("acme", "other"):
        for conversation in ("c1", "c2"):
            for depth in range(40):
                angle = (depth * 37 + len(conversation) + len(tenant)) % 360
                vector = unit(math.cos(math.radians(angle)), math.sin(math.radians(angle)), depth % 3, 1)
                rows.append(
                    row(
                        f"{tenant}-{conversation}-{depth}",
                        f"message {depth}",
                        tenant=tenant,
                        conversation=conversation,
                        depth=depth,
                        vector=None if depth % 7 == 3 else vector,
                        created_at=BASE + timedelta(hours=depth),
                        dated=depth % 5 != 1,  # some said at an unknown time: they pass time ranges
                    )
                )
    return rows


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"max_depth": 25},
        {"since": BASE + timedelta(hours=10), "until": BASE + timedelta(hours=30)},
        {"since": (BASE + timedelta(hours=5)).astimezone(timezone(timedelta(hours=-7)))},
        {"max_depth": 0},
    ],
)
def test_cached_semantic_search_matches_the_table(tmp_path: Path, filters: dict[str, Any]) -> None:
    uri = str(tmp_path / "db")
    table = LanceIndex.open(uri, "shared", DIMS)
    cached = LanceIndex.open(uri, "shared", DIMS, cache_rows=1000)

    async def scenario() -> None:
        await table.add(_scattered_rows())
        # Generic directions: no two rows tie, so both orders are fully determined.
        for vector in (unit(0.9, 0.3, 0.2, 0.1), unit(0.2, -0.9, 0.3, 0.1), unit(0.1, 0.2, 1, 0.7)):
            for limit in (1, 10, 100):
                q = query("", vector, limit=limit, conversation_id="c2", **filters)
                expected = (await table.search(q)).semantic
                found = (await cached.search(q)).semantic
                assert ids(found) == ids(expected)
                assert [h.score for h in found] == pytest.approx([h.score for h in expected], abs=1e-5)
                assert [(h.view, h.depth, h.created_at, h.conversation_id, h.dated) for h in found] == [
                    (h.view, h.depth, h.created_at, h.conversation_id, h.dated) for h in expected
                ]
                assert all(h.node_id.startswith("acme-c2-") for h in found)
        # Keyword hits from memory: the same rows as the table's full-text index, under every filter
        # (their order may differ where scores tie: BM25 here counts the conversation's rows only).
        for text in ("message", "message 12", "12 OR 30"):
            q = query(text, limit=100, conversation_id="c2", **filters)
            expected = (await table.search(q)).keyword
            found = (await cached.search(q)).keyword
            assert sorted(ids(found)) == sorted(ids(expected)), text
            assert {(h.node_id, h.view, h.depth, h.created_at, h.dated) for h in found} == {
                (h.node_id, h.view, h.depth, h.created_at, h.dated) for h in expected
            }
            if text == "message 12" and found:
                assert found[0].node_id == expected[0].node_id == "acme-c2-12"
        # One conversation: its 40 rows, 34 of them with a vector (keyword search finds all 40).
        assert cached._cache is not None and cached._cache.rows == 40
        entry = cached._cache.get(("acme", "c2"))
        assert entry is not None and len(entry.ids) == 34

    run(scenario())


def test_cached_search_sees_rows_added_since_by_this_or_another_instance(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    cached = LanceIndex.open(uri, "shared", DIMS, cache_rows=1000)
    other = LanceIndex.open(uri, "shared", DIMS)  # another replica's writer

    async def scenario() -> None:
        await cached.add([row("a", "first", vector=unit(0, 1, 0, 0), depth=1)])
        near = query("", unit(1, 0, 0, 0), conversation_id="c1")
        assert ids((await cached.search(near)).semantic) == ["a"]
        await cached.add([row("b", "second", vector=unit(1, 0.1, 0, 0), depth=2)])
        # Its own write went straight into the copy: no read of the table is due.
        assert cached._cache is not None
        entry = cached._cache.get(("acme", "c1"))
        assert entry is not None and "b:m" in entry.ids
        assert entry.version == await (await cached.inner.table()).version()
        assert ids((await cached.search(near)).semantic) == ["b", "a"]
        await other.add([row("c", "third", vector=unit(1, 0, 0, 0), depth=3)])
        await other.add([row("d", "unembedded", depth=4)])
        assert ids((await cached.search(near)).semantic) == ["c", "b", "a"]
        await other.set_vectors("acme", {"d:m": unit(1, 0.05, 0, 0)})  # a retried job fills it in
        await cached.prepare(near)
        assert ids((await cached.search(near)).semantic) == ["c", "d", "b", "a"]
        # A row written late for an older message (jobs finishing out of order) is found too.
        await other.add([row("e", "late", vector=unit(1, 0.2, 0, 0), depth=0)])
        assert ids((await cached.search(near)).semantic) == ["c", "d", "b", "e", "a"]

    run(scenario())


def test_this_processs_writes_keep_every_cached_conversation_current_without_reading(tmp_path: Path) -> None:
    index = LanceIndex.open(str(tmp_path / "db"), "shared", DIMS, cache_rows=1000)

    async def scenario() -> None:
        await index.add([row(f"{c}0", "kafka broker", vector=unit(1, 0, 0, 0), conversation=c) for c in "ab"])
        for c in "ab":
            await index.search(query("kafka", unit(1, 0, 0, 0), conversation_id=c))
        assert index._cache is not None
        await index.add([row("a1", "kafka again", vector=unit(0, 1, 0, 0), conversation="a")])
        table = await index.inner.table()
        version = await table.version()
        held = {c: index._cache.get(("acme", c)) for c in "ab"}
        # "a" took the write itself; "b", untouched by it, is as current as the table.
        assert all(e is not None and e.version == version for e in held.values())
        loads: list[object] = []
        merged = Entry.merged

        def counted(entry: Entry, *args: Any) -> Entry:
            loads.append(args)
            return merged(entry, *args)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Entry, "merged", counted)
            found = await index.search(query("kafka", unit(1, 0, 0, 0), conversation_id="b"))
            assert ids(found.keyword) == ["b0"] and ids(found.semantic) == ["b0"]
            found = await index.search(query("kafka", unit(0, 1, 0, 0), conversation_id="a"))
            assert sorted(ids(found.keyword)) == ["a0", "a1"] and ids(found.semantic)[0] == "a1"
        assert loads == []  # nothing read from the table

    run(scenario())


def test_a_conversation_read_while_this_process_wrote_is_brought_up_to_date_from_its_writes(
    tmp_path: Path,
) -> None:
    """A copy read as of version v, put after this process's writes v+1 and v+2 had landed, is brought up
    to v+2 from those writes (its own rows added, the other conversation's write passed over), not left
    behind for the next search to read again; another writer's version in between stops it there."""
    uri = str(tmp_path / "db")
    index = LanceIndex.open(uri, "shared", DIMS, cache_rows=1000)
    other = LanceIndex.open(uri, "shared", DIMS)

    async def scenario() -> None:
        await index.add(
            [row(f"{c}0", "kafka", vector=unit(1, 0, 0, 0), conversation=c) for c in ("c1", "c2")]
        )
        await index.search(query("kafka", unit(1, 0, 0, 0), conversation_id="c1"))
        assert index._cache is not None
        read = index._cache.get(("acme", "c1"))
        assert read is not None
        await index.add([row("x1", "kafka two", vector=unit(0, 1, 0, 0), conversation="c2", depth=1)])
        await index.add([row("a1", "kafka one", vector=unit(0, 1, 0, 0), conversation="c1", depth=1)])
        table = await index.inner.table()
        now = await table.version()
        caught = index._caught_up(("acme", "c1"), read)
        assert caught.version == now == read.version + 2
        # On the event loop a write with more of its rows than allowed is left to the next read.
        bounded = index._caught_up(("acme", "c1"), read, max_rows=0)
        assert bounded.version == read.version + 1 and "a1:m" not in bounded.positions
        assert set(caught.positions) == {"c10:m", "a1:m"} and caught.embedded.all()
        assert ids(
            caught.keyword(query("kafka", conversation_id="c1", limit=5), index._analyzer.query("kafka one"))
        ) == [
            "a1",
            "c10",
        ]
        # Another writer's version in between: caught up to just before it, the rest left to a read.
        await other.add([row("z1", "elsewhere", conversation="c3")])
        await index.add([row("a2", "kafka three", vector=unit(0, 0, 1, 0), conversation="c1", depth=2)])
        again = index._caught_up(("acme", "c1"), read)
        assert again.version == now and "a2:m" not in again.positions
        found = await index.search(query("kafka", unit(0, 0, 1, 0), conversation_id="c1"))
        assert ids(found.semantic)[0] == "a2"

    run(scenario())


def test_new_rows_of_a_conversation_held_whole_are_appended_and_others_merged(tmp_path: Path) -> None:
    """A write whose ids the cached copy (read whole, exact as of the table's version) does not hold is a
    plain append; a retried write of the same rows, a write to a conversation not held, and a write to
    one whose copy came partly from a delta read (which may miss rows another writer dated far back) go
    through the merge, and no row is ever stored twice."""
    uri = str(tmp_path / "db")
    index = LanceIndex.open(uri, "shared", DIMS, cache_rows=1000)
    other = LanceIndex.open(uri, "shared", DIMS)

    async def scenario() -> None:
        await index.add([row("a0", "kafka broker", vector=unit(1, 0, 0, 0), depth=0)])  # builds the indexes
        await index.search(query("kafka", unit(1, 0, 0, 0), conversation_id="c1"))
        table = await index.inner.table()
        merges: list[str] = []
        original = table.merge_insert

        def counted(on: Any) -> Any:
            merges.append(str(on))
            return original(on)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(table, "merge_insert", counted)
            await index.add([row("a1", "kafka again", vector=unit(0, 1, 0, 0), depth=1)])
            assert merges == []  # appended
            await index.add([row("a1", "kafka again", vector=unit(0, 1, 0, 0), depth=1)])  # a retried job
            assert len(merges) == 1
            await index.add([row("b0", "elsewhere", vector=unit(1, 0, 0, 0), conversation="c2")])
            assert len(merges) == 2  # not held: unknown
            # Another writer adds a row dated an hour before the newest held: a delta read misses it.
            late = BASE - timedelta(hours=1)
            await other.add([row("late", "kafka late", created_at=late)])
            await index.search(query("kafka", unit(1, 0, 0, 0), conversation_id="c1"))
            assert index._cache is not None
            entry = index._cache.get(("acme", "c1"))
            assert entry is not None and not entry.whole and "late:m" not in entry.positions
            await index.add([row("late", "kafka late", vector=unit(1, 1, 0, 0), created_at=late)])
            assert len(merges) == 3
        held = await index.rows_of("acme", "c1")
        assert sorted(held) == [("a0:m", True), ("a1:m", True), ("late:m", True)]

    run(scenario())


def test_searches_while_this_process_writes_read_nothing_from_the_table(tmp_path: Path) -> None:
    """Writes to four conversations, one after another, with searches of them running all along: a search
    that lands between a write's commit and its application to the copy serves the copy as it was (and
    the write then brings it current), instead of reading the conversation's recent rows again; and a
    write applied after the next one had committed left copies a version behind."""
    index = LanceIndex.open(str(tmp_path / "db"), "shared", DIMS, cache_rows=10_000)
    conversations = "abcd"

    async def scenario() -> None:
        await index.add(
            [row(f"{c}0", "kafka broker", vector=unit(1, 0, 0, 0), conversation=c) for c in conversations]
        )
        for c in conversations:
            await index.search(query("kafka", unit(1, 0, 0, 0), conversation_id=c))
        table = await index.inner.table()
        reads: list[str] = []
        original = table.query

        def counted() -> Any:
            reads.append("query")
            return original()

        async def write(c: str) -> None:
            for depth in range(1, 6):
                vector = unit(1, depth, 0, 0)
                await index.add(
                    [row(f"{c}{depth}", f"kafka {depth}", vector=vector, conversation=c, depth=depth)]
                )

        async def search(c: str) -> None:
            for _ in range(30):
                found = await index.search(query("kafka", unit(1, 0, 0, 0), conversation_id=c))
                assert found.keyword and found.semantic
                await asyncio.sleep(0)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(table, "query", counted)
            await asyncio.gather(*map(write, conversations), *map(search, conversations))
        assert reads == []
        version = await table.version()
        assert index._cache is not None
        for c in conversations:
            entry = index._cache.get(("acme", c))
            assert entry is not None and entry.version == version and entry.rows == 6
            found = await index.search(query("kafka", unit(1, 5, 0, 0), conversation_id=c, limit=10))
            assert ids(found.semantic)[0] == f"{c}5" and len(found.keyword) == 6

    run(scenario())


def test_cached_conversations_are_forgotten_when_deleted(tmp_path: Path) -> None:
    index = LanceIndex.open(str(tmp_path / "db"), "shared", DIMS, cache_rows=1000)

    async def scenario() -> None:
        await index.add(
            [
                row("a", "one", vector=unit(1, 0, 0, 0), conversation="c1", user="u1"),
                row("b", "two", vector=unit(1, 0, 0, 0), conversation="c2", user="u1"),
                row("c", "three", vector=unit(1, 0, 0, 0), conversation="c3", user="u2"),
            ]
        )
        for conversation in ("c1", "c2", "c3"):
            await index.search(query("", unit(1, 0, 0, 0), conversation_id=conversation))
        assert index._cache is not None and index._cache.rows == 3
        await index.delete("acme", conversation_id="c1")
        assert ("acme", "c1") not in index._cache
        await index.delete("acme", user_id="u1")
        assert ("acme", "c2") not in index._cache and ("acme", "c3") in index._cache
        for conversation in ("c1", "c2"):
            assert (
                await index.search(query("", unit(1, 0, 0, 0), conversation_id=conversation))
            ).semantic == []
        assert ids((await index.search(query("", unit(1, 0, 0, 0), conversation_id="c3"))).semantic) == ["c"]

    run(scenario())


def test_cache_holds_at_most_its_rows_and_searches_larger_conversations_in_the_table(tmp_path: Path) -> None:
    index = LanceIndex.open(str(tmp_path / "db"), "shared", DIMS, cache_rows=5)

    async def scenario() -> None:
        rows = [
            row(f"s{i}", "small", vector=unit(1, i, 0, 0), conversation="small", depth=i) for i in range(3)
        ]
        rows += [row(f"t{i}", "two", vector=unit(1, i, 0, 0), conversation="two", depth=i) for i in range(2)]
        rows += [row(f"b{i}", "big", vector=unit(1, i, 0, 0), conversation="big", depth=i) for i in range(8)]
        await index.add(rows)
        assert index._cache is not None
        await index.search(query("", unit(1, 0, 0, 0), conversation_id="small"))
        await index.search(query("", unit(1, 0, 0, 0), conversation_id="two"))
        assert index._cache.rows == 5
        found = await index.search(query("", unit(1, 0, 0, 0), conversation_id="big", limit=3))
        assert ids(found.semantic) == ["b0", "b1", "b2"]  # served, but not held
        assert ("acme", "big") not in index._cache and index._cache.rows == 5
        assert ids(
            (await index.search(query("", unit(1, 0, 0, 0), conversation_id="big", limit=2))).semantic
        ) == [
            "b0",
            "b1",
        ]
        await index.add([row("s9", "small", vector=unit(1, 9, 0, 0), conversation="small", depth=9)])
        await index.search(query("", unit(1, 0, 0, 0), conversation_id="small"))
        # Six rows do not fit with "two": the least recently used entry went.
        assert index._cache.rows == 4 and ("acme", "two") not in index._cache

    run(scenario())


def test_cache_entries_are_reloaded_whole_after_a_while() -> None:
    cache = VectorCache(max_rows=10)
    fresh = Entry.empty("c1", DIMS)
    old = replace(Entry.empty("c2", DIMS), loaded_at=time.monotonic() - RELOAD_SECONDS - 1)
    cache.put(("acme", "c1"), fresh)
    cache.put(("acme", "c2"), old)
    assert cache.get(("acme", "c1")) is fresh
    assert cache.get(("acme", "c2")) is None  # due: the next search reads the conversation again
    assert ("acme", "c2") not in cache


def test_a_compaction_keeps_cached_copies_exact_unless_another_writer_added_rows(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    cached = LanceIndex.open(uri, "shared", DIMS, cache_rows=1000)
    other = LanceIndex.open(uri, "shared", DIMS)
    near = query("", unit(1, 0, 0, 0), conversation_id="c1")

    async def scenario() -> None:
        for depth in range(4):
            await cached.add([row(f"n{depth}", "text", vector=unit(1, depth, 0, 0), depth=depth)])
        await cached.search(near)
        assert cached._cache is not None
        await cached.optimize()
        table = await cached.inner.table()
        entry = cached._cache.get(("acme", "c1"))
        assert entry is not None and entry.version == await table.version()  # no read due
        assert ids((await cached.search(near)).semantic) == ["n0", "n1", "n2", "n3"]

        await other.add([row("x", "from another replica", vector=unit(1, 0.5, 0, 0), depth=9)])
        await cached.optimize()
        entry = cached._cache.get(("acme", "c1"))
        assert entry is not None and entry.version != await table.version()  # left for the next search
        assert ids((await cached.search(near)).semantic) == ["n0", "x", "n1", "n2", "n3"]

    run(scenario())


def test_concurrent_adds_of_the_same_new_rows_store_each_once(tmp_path: Path) -> None:
    """Two job workers of one process indexing overlapping messages at once, after the table has been
    optimised (its `id` index built): each row once (they were stored twice, found by verify)."""
    index = LanceIndex.open(str(tmp_path / "lancedb"), "messages_race", DIMS, optimize_every_writes=1000)

    async def scenario() -> list[tuple[str, bool]]:
        await index.add([row("seed", "seed text", vector=unit(1, 0, 0, 0))])
        await index.optimize()
        for round_ in range(5):
            rows = [row(f"n{round_}-{i}", f"text {i}", vector=unit(1, i, 0, 0)) for i in range(4)]
            await asyncio.gather(index.add(rows), index.add(rows), index.add(rows[:2]))
        return await index.rows_of("acme", "c1")

    held = run(scenario())
    run(index.aclose())
    ids_held = [row_id for row_id, _ in held]
    assert len(ids_held) == 21 and len(set(ids_held)) == 21
    assert all(has_vector for _, has_vector in held)


def _in_three_processes(target: Any, uri: str) -> list[object]:
    """Run `target(uri, start, results)` in three spawned processes sharing a barrier; each one's
    outcome, as it put it in `results`."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(3), context.Queue()
    processes = [context.Process(target=target, args=(uri, start, results)) for _ in range(3)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    return outcomes


def _open_in_a_process(uri: str, start: Any, results: Any) -> None:
    from gateway.adapters.lance_memories import LanceMemoryVectors

    try:
        start.wait(60)  # a barrier: every process is ready before any opens
        LanceIndex.open(uri, "messages_shared", DIMS)
        LanceMemoryVectors.open(uri, "memories_shared", DIMS)
        results.put("opened")
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))


def test_replicas_opening_one_new_directory_together_all_start(tmp_path: Path) -> None:
    """Replicas (or `serve --workers N`) start at once on one empty LanceDB directory: they race to create
    each table, declare its key and add columns; every one starts (before, most such starts had one lose
    with a commit conflict, a changed schema or a key already set, and that gateway exited)."""
    for round_ in range(3):  # the race is timing's: three fresh directories
        uri = str(tmp_path / f"shared-{round_}")
        outcomes = _in_three_processes(_open_in_a_process, uri)
        assert outcomes == ["opened"] * 3, outcomes
        table = lancedb.connect(uri).open_table("messages_shared")
        assert "dated" in table.schema.names and table.count_rows() == 0
        index = LanceIndex.open(uri, "messages_shared", DIMS)
        run(index.add([row("a", "after the race ECONNRESET")]))
        assert ids(run(index.search(query("ECONNRESET"))).keyword) == ["a"]
        run(index.aclose())


def _add_in_a_process(uri: str, start: Any, results: Any) -> None:
    try:
        index = LanceIndex.open(uri, "messages_shared", DIMS, optimize_every_writes=10**6)

        async def scenario() -> None:
            for round_ in range(6):
                start.wait(60)  # each round's rows added by every process at the same moment
                await index.add(
                    [row(f"n{round_}-{i}", f"text {i}", vector=unit(1, i, 0, 0)) for i in range(4)]
                )

        run(scenario())
        results.put("added")
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))


def test_processes_adding_the_same_new_rows_at_once_store_each_once(tmp_path: Path) -> None:
    """Processes of `serve --workers N` (or replicas on one directory) indexing the same messages at
    once, after the table's `id` index is built: each row once. Lance let both inserts through (three
    processes stored 92 rows for 36 ids); the host-wide write lock serialises them."""
    uri = str(tmp_path / "lancedb")
    index = LanceIndex.open(uri, "messages_shared", DIMS)
    run(index.add([row("seed", "seed text", vector=unit(1, 0, 0, 0))]))
    run(index.optimize())
    run(index.aclose())
    outcomes = _in_three_processes(_add_in_a_process, uri)
    assert outcomes == ["added"] * 3, outcomes
    held = lancedb.connect(uri).open_table("messages_shared").to_arrow().column("id").to_pylist()
    assert len(held) == 25 and len(set(held)) == 25


def test_a_write_lock_that_cannot_be_taken_is_an_index_error(tmp_path: Path) -> None:
    """The host-wide write lock's file cannot be opened (here a directory stands in its place; a full
    or read-only disk does the same): the write fails as an index error, and the next one can go on."""
    uri = str(tmp_path / "lancedb")
    index = LanceIndex.open(uri, "messages_locked", DIMS)
    blocker = tmp_path / "lancedb" / ".messages_locked.write-lock"
    blocker.mkdir()
    with pytest.raises(SearchIndexError, match="cannot lock"):
        run(index.add([row("a", "alpha ECONNRESET")]))
    blocker.rmdir()
    run(index.add([row("a", "alpha ECONNRESET")]))
    assert ids(run(index.search(query("ECONNRESET"))).keyword) == ["a"]


def test_a_version_read_before_this_process_wrote_serves_the_newer_copy(tmp_path: Path) -> None:
    """A search reads the table's version, and this process's write commits and brings the cached copy
    past it before the search goes on (CI caught it, about 1 run in 50): the copy is newer than the
    version read, so it is served as it is, not read again."""
    index = LanceIndex.open(str(tmp_path / "db"), "shared", DIMS, cache_rows=10_000)

    async def scenario() -> None:
        await index.add([row("a0", "kafka broker", vector=unit(1, 0, 0, 0))])
        await index.search(query("kafka", unit(1, 0, 0, 0), conversation_id="c1"))
        await index.add([row("a1", "kafka topic", vector=unit(1, 1, 0, 0), depth=1)])
        table = await index.inner.table()
        current = await table.version()
        assert index._cache is not None
        entry = index._cache.get(("acme", "c1"))
        assert entry is not None and entry.version == current
        reads: list[str] = []
        original = table.query

        async def stale() -> int:
            return current - 1

        def counted() -> Any:
            reads.append("query")
            return original()

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(table, "version", stale)
            patch.setattr(table, "query", counted)
            found = await index.search(query("kafka", unit(1, 1, 0, 0), conversation_id="c1"))
        assert reads == []
        assert ids(found.semantic) == ["a1", "a0"] and len(found.keyword) == 2

    run(scenario())
