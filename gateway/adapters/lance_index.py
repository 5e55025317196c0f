"""VectorIndex over LanceDB: the embed job writes message texts and vectors, retrieval searches them.

One table per embedding model; every row carries its tenant, user and conversation, and every query
filters by tenant. Reads and writes use LanceDB's asyncio API, which awaits the engine's own threads
directly (faster than the blocking API on worker threads); the CPU-bound parts done in Python (turning
rows into Arrow arrays) run on worker threads. Filters are built with `lancedb.expr` (typed
column/literal expressions, no SQL text), so ids holding quotes or backslashes can neither break a
filter nor widen it.

This is the table alone: searches of one conversation served from memory are `cached_index`'s, what
both LanceDB adapters share is `lance_table`'s, when to compact `lance_compaction`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, timedelta
from typing import Protocol

import anyio
import anyio.to_thread
import pyarrow as pa
from lancedb.expr import Expr, col, lit
from lancedb.index import FTS, Bitmap, BTree
from lancedb.table import AsyncTable, Table

from gateway.adapters.cached_index import CachedLanceIndex
from gateway.adapters.lance_compaction import Policy
from gateway.adapters.lance_fulltext import FTS_CONFIG, keyword_query
from gateway.adapters.lance_table import LanceAdapter, open_table, query_vector, table_name, vector_array
from gateway.adapters.vector_cache import from_micros
from gateway.errors import SearchIndexError
from gateway.records import IndexHit, IndexRow, SearchQuery, SearchResult
from gateway.text import cjk_terms

__all__ = [
    "FTS_CONFIG",
    "OPTIMIZE_EVERY_ROWS",
    "OPTIMIZE_EVERY_WRITES",
    "TEXT_INDEX",
    "LanceIndex",
    "WriteListener",
    "keyword_query",
    "schema",
    "table_name",
]

_HIT_COLUMNS = ["node_id", "conversation_id", "view", "depth", "created_at", "dated"]

# Each write is a fragment outside the indexes until compacted, and every search pays for each one.
OPTIMIZE_EVERY_WRITES = 10
OPTIMIZE_EVERY_ROWS = 5_000
_MAX_BUSY_SHARE = 0.2  # after a compaction taking d seconds, the next waits at least d / share
TEXT_INDEX = "text_idx"  # LanceDB's name for the full-text index on `text`
_BACKLOG_ROWS = 1_000  # unindexed rows a process finds at its first write that make it compact at once


def schema(dimensions: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("tenant", pa.string(), nullable=False),
            pa.field("user_id", pa.string(), nullable=True),
            pa.field("conversation_id", pa.string(), nullable=False),
            pa.field("node_id", pa.string(), nullable=False),
            pa.field("view", pa.string(), nullable=False),
            pa.field("depth", pa.int32(), nullable=False),
            pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
            pa.field("text", pa.string(), nullable=False),
            # Nullable: rows are added with their text first and embedded later.
            pa.field("vector", pa.list_(pa.float32(), dimensions), nullable=True),
            # False: said at an unknown time (history that arrived at once); added to older tables at open.
            pa.field("dated", pa.bool_(), nullable=True),
        ]
    )


def _index_configs() -> dict[str, BTree | Bitmap | FTS]:
    # A bitmap for the few tenants (faster than a BTree's row ids intersected with the conversation's);
    # BTrees for the many users and conversations, and for the row key merge_insert joins on.
    return {
        "id": BTree(),
        "tenant": Bitmap(),
        "user_id": BTree(),
        "conversation_id": BTree(),
        "text": FTS_CONFIG,
    }


def _add_dated(table: Table) -> None:
    if "dated" not in table.schema.names:
        # Tables written before undated history existed: every row there was dated.
        table.add_columns({"dated": "true"})


def _rows_table(rows: Sequence[IndexRow], target: pa.Schema, dimensions: int) -> pa.Table:
    unique = list({row.id: row for row in rows}.values())  # a merge source must not repeat a key
    return pa.table(
        {
            "id": [r.id for r in unique],
            "tenant": [r.tenant for r in unique],
            "user_id": [r.user_id for r in unique],
            "conversation_id": [r.conversation_id for r in unique],
            "node_id": [r.node_id for r in unique],
            "view": [r.view for r in unique],
            "depth": [r.depth for r in unique],
            # Naive datetimes are taken as UTC, as the store writes them.
            "created_at": [
                r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC) for r in unique
            ],
            "text": [cjk_terms(r.text) for r in unique],
            "vector": vector_array([r.vector for r in unique], dimensions),
            "dated": [r.dated for r in unique],
        },
        schema=target,
    )


def _vectors_table(tenant: str, vectors: dict[str, list[float]], dimensions: int) -> pa.Table:
    ids = list(vectors)
    columns = [
        pa.array(ids, pa.string()),
        pa.array([tenant] * len(ids), pa.string()),
        vector_array([vectors[i] for i in ids], dimensions),
    ]
    # The key is not nullable, as in the table (a primary key must not be).
    fields = [
        pa.field("id", pa.string(), nullable=False),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("vector", columns[2].type),
    ]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _filter(query: SearchQuery) -> Expr:
    where = col("tenant") == lit(query.tenant)
    if query.conversation_id is not None:
        where = where & (col("conversation_id") == lit(query.conversation_id))
    if query.user_id is not None:
        where = where & (col("user_id") == lit(query.user_id))
    if query.exclude_conversation_id is not None:
        where = where & (col("conversation_id") != lit(query.exclude_conversation_id))
    if query.max_depth is not None:
        where = where & (col("depth") < lit(query.max_depth))
    # Aware datetimes are compared as instants (lit converts them to UTC); naive ones are UTC. Undated
    # rows pass: when they were said is unknown, so no range rules them out.
    when: Expr | None = None
    if query.since is not None:
        when = col("created_at") >= lit(query.since)
    if query.until is not None:
        until = col("created_at") <= lit(query.until)
        when = until if when is None else when & until
    if when is not None:
        where = where & (when | (col("dated") == lit(False)))
    return where


def _hits(result: pa.Table, score: Callable[[float], float], column: str) -> list[IndexHit]:
    # Timestamps as integers, made into datetimes here: pyarrow's own conversion of zoned ones is slow.
    micros = result.column("created_at").cast(pa.int64()).to_pylist()
    data = result.select(["node_id", "conversation_id", "view", "depth", "dated", column]).to_pydict()
    hits = [
        IndexHit(node_id, conversation_id, view, depth, from_micros(at), score(raw), dated is not False)
        for node_id, conversation_id, view, depth, at, dated, raw in zip(
            data["node_id"],
            data["conversation_id"],
            data["view"],
            data["depth"],
            micros,
            data["dated"],
            data[column],
            strict=True,
        )
    ]
    hits.sort(key=lambda h: h.score, reverse=True)  # the engine's order already; kept whatever it does
    return hits


class WriteListener(Protocol):
    """What a layer above the table (`CachedLanceIndex`) learns of this process's writes, told while the
    write lock is held."""

    def writing(self, version: int) -> None:
        """A write (or compaction) starts from table version `version`."""
        ...

    def appendable(self, data: pa.Table, version: int) -> bool:
        """Whether every row of `data` is known to be new to the table at `version`."""
        ...

    async def added(self, data: pa.Table, version: int) -> None:
        """`data` was written, making table version `version`."""
        ...

    async def compacted(self, table: AsyncTable, before: int) -> None:
        """A compaction of the table as of version `before` committed."""
        ...

    def written(self) -> None:
        """The write or compaction under way is over, committed or not."""
        ...

    def deleted(self, tenant: str, conversation_id: str | None, user_id: str | None) -> None:
        """Rows of a conversation or of a user were deleted."""
        ...


class LanceIndex(LanceAdapter):
    """Message texts and vectors in one LanceDB table. Build with `LanceIndex.open`."""

    def __init__(
        self,
        uri: str,
        name: str,
        dimensions: int,
        *,
        storage_options: dict[str, str] | None = None,
        consistency: timedelta = timedelta(0),
        indexes_ready: bool = True,
        optimize_every_writes: int = OPTIMIZE_EVERY_WRITES,
        optimize_every_rows: int = OPTIMIZE_EVERY_ROWS,
    ) -> None:
        super().__init__(
            uri,
            name,
            dimensions,
            schema(dimensions),
            _index_configs(),
            Policy("index", optimize_every_writes, optimize_every_rows, _MAX_BUSY_SHARE),
            storage_options=storage_options,
            consistency=consistency,
            indexes_ready=indexes_ready,
            backlog=self._backlog,
        )
        self._listener: WriteListener | None = None

    @classmethod
    def open(
        cls,
        uri: str,
        table: str,
        dimensions: int,
        *,
        storage_options: dict[str, str] | None = None,
        consistency: timedelta = timedelta(0),
        optimize_every_writes: int = OPTIMIZE_EVERY_WRITES,
        optimize_every_rows: int = OPTIMIZE_EVERY_ROWS,
        cache_rows: int = 0,
    ) -> LanceIndex | CachedLanceIndex:
        """Open (creating if missing) the table `table` under `uri`: a local directory or an object-store
        URI (`s3://...`, with `storage_options`). `consistency` is how stale a read may be: 0 sees other
        processes' writes at once, at the cost of one manifest check per query (on object storage, a
        round trip; a second or so is then a fair trade). `cache_rows` bounds the in-memory copies of
        searched conversations' vectors (0: every search goes to the table; else the index comes
        wrapped in a `CachedLanceIndex`)."""
        name = table_name(table)
        ready = open_table(
            uri, name, schema(dimensions), dimensions, _index_configs(), key=["id"],
            storage_options=storage_options, consistency=consistency, upgrade=_add_dated,
        )  # fmt: skip
        index = cls(
            uri,
            name,
            dimensions,
            storage_options=storage_options,
            consistency=consistency,
            indexes_ready=ready,
            optimize_every_writes=optimize_every_writes,
            optimize_every_rows=optimize_every_rows,
        )
        return CachedLanceIndex(index, cache_rows) if cache_rows > 0 else index

    def listen(self, listener: WriteListener) -> None:
        """Tell `listener` of every write of this process from now on (one listener)."""
        self._listener = listener

    # -- writes (background jobs) ---------------------------------------------------------------------

    async def add(self, rows: Sequence[IndexRow]) -> None:
        if not rows:
            return
        data = await anyio.to_thread.run_sync(_rows_table, rows, self._schema, self.dimensions)
        embedded = any(r.vector is not None for r in rows)
        listener = self._listener

        async def insert(table: AsyncTable) -> int:
            if listener is not None:
                base = await table.version()
                listener.writing(base)
                if self._indexes_ready and listener.appendable(data, base):
                    # A plain append: a merge joins the new rows against the whole table.
                    return int((await table.add(data, on_bad_vectors="null")).version)
            # Insert the ids not there yet: a retried job re-adds the same rows without duplicates, and a
            # vector already set is never reset to null. Rows written earlier with their text alone get
            # their vector now (a large stretch's texts go first; a failed embedder's retry).
            builder = table.merge_insert("id").when_not_matched_insert_all()
            if embedded:
                builder = builder.when_matched_update_all(where="target.vector IS NULL")
            merged = await builder.execute(data, on_bad_vectors="null")
            if await self._index_once(table):
                return -1  # the indexes made versions of their own
            return int(merged.version)

        async with self._writing:
            try:
                version = await self._engine("add", insert)
                # Still under the lock: the next write finds the listener as this one left it.
                if listener is not None and version > 0:
                    await listener.added(data, version)
            finally:
                if listener is not None:
                    listener.written()
        await self._compaction.wrote(data.num_rows)

    async def set_vectors(self, tenant: str, vectors: dict[str, list[float]]) -> None:
        if not vectors:
            return
        data = await anyio.to_thread.run_sync(_vectors_table, tenant, vectors, self.dimensions)

        async def update(table: AsyncTable) -> None:
            # Matching on (id, tenant): an id of another tenant matches nothing; ids not added yet are
            # ignored (their add comes first in the embed job). Only the vector column is rewritten.
            await (
                table.merge_insert(["id", "tenant"])
                .when_matched_update_all()
                .execute(data, on_bad_vectors="null")
            )

        async with self._writing:
            await self._engine("set_vectors", update)
        await self._compaction.wrote(data.num_rows)

    async def delete(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> None:
        if conversation_id is None and user_id is None:
            raise ValueError("delete needs a conversation_id or a user_id")
        where = col("tenant") == lit(tenant)
        if conversation_id is not None:
            where = where & (col("conversation_id") == lit(conversation_id))
        if user_id is not None:
            where = where & (col("user_id") == lit(user_id))

        async def remove(table: AsyncTable) -> None:
            # Gone from every search at once; the bytes stay in older table versions until a compaction
            # rewrites the fragments and the versions age out (`KEEP_VERSIONS`).
            await table.delete(where)

        await self._engine("delete", remove)
        if self._listener is not None:
            self._listener.deleted(tenant, conversation_id, user_id)
        await self._compaction.wrote(0)

    async def _backlog(self) -> bool:
        """Whether an earlier process left so many rows outside the full-text index (each searched by a
        scan on every query) that this one compacts at its first write."""

        async def read(table: AsyncTable) -> int:
            stats = await table.index_stats(TEXT_INDEX)
            return stats.num_unindexed_rows if stats is not None else 0

        try:
            return await self._engine("index stats", read) >= _BACKLOG_ROWS
        except SearchIndexError:
            return False

    async def _optimize(self, table: AsyncTable) -> None:
        listener = self._listener
        if listener is None:
            await super()._optimize(table)
            return
        before = await table.version()
        listener.writing(before)
        try:
            await super()._optimize(table)
            await listener.compacted(table, before)
        finally:
            listener.written()

    # -- reads (request path) -------------------------------------------------------------------------

    async def search(self, query: SearchQuery) -> SearchResult:
        if query.limit <= 0:
            return SearchResult([], [])
        where = _filter(query)
        vector = query_vector(query.vector, self.dimensions)
        text = keyword_query(query.text)
        return SearchResult(*await self._rankings(where, vector, text, query.limit, _HIT_COLUMNS, _hits))

    async def prepare(self, query: SearchQuery) -> None:
        """Nothing to get ready: the table is searched as it is (`CachedLanceIndex` reads ahead)."""

    async def rows_of(self, tenant: str, conversation_id: str) -> list[tuple[str, bool]]:
        where = (col("tenant") == lit(tenant)) & (col("conversation_id") == lit(conversation_id))

        async def read(table: AsyncTable) -> list[tuple[str, bool]]:
            # The vector itself is not read: only whether it is null.
            result = (
                await table.query().where(where).select({"id": "id", "set": "vector IS NOT NULL"}).to_arrow()
            )
            return list(zip(result.column("id").to_pylist(), result.column("set").to_pylist(), strict=True))

        return await self._engine("rows_of", read)

    async def count(self, tenant: str) -> int:
        """Rows of one tenant (tests, the dashboard)."""
        return await self._count(tenant)
