"""MemoryVectors over LanceDB: the memory writer upserts active memories, recall searches them.

One table per embedding model, beside the message index and built the same way (`lance_table`,
`lance_fulltext`): the asyncio API, `lancedb.expr` filters (ids holding quotes or backslashes can neither
break a filter nor widen it), CJK runs indexed as bigrams and characters, the same full-text
configuration and query objects. Memory tables are small (hundreds of rows per user), so there is no
vector cache and no compaction throttle: a compaction every few writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, timedelta

import anyio
import anyio.to_thread
import pyarrow as pa
from lancedb.expr import Expr, col, lit
from lancedb.index import FTS, Bitmap, BTree
from lancedb.table import AsyncTable

from gateway.adapters.lance_compaction import Policy
from gateway.adapters.lance_fulltext import FTS_CONFIG, keyword_query
from gateway.adapters.lance_table import LanceAdapter, open_table, query_vector, table_name, vector_array
from gateway.adapters.vector_cache import from_micros
from gateway.memory.records import MemoryHit, MemoryQuery, MemoryRow, MemorySearchResult
from gateway.text import cjk_terms

# Each write is a fragment of its own until compacted, and searches pay for each one; memory writes are
# small and frequent (a few rows per extraction), so compact after this many of them.
OPTIMIZE_EVERY_WRITES = 20
_HIT_COLUMNS = ["id", "scope", "created_at"]
# The row key. The tenant is part of it so that an upsert can never replace another tenant's row,
# whatever ids it carries (memory ids are unique anyway; this makes isolation not depend on it).
_KEY = ["id", "tenant"]
# The declared primary key (see lance_table.open_table): one column only, as LanceDB allows; memory ids
# are unique across tenants, so "id" alone is a key.
_PRIMARY_KEY = ["id"]


def schema(dimensions: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("tenant", pa.string(), nullable=False),
            pa.field("user_id", pa.string(), nullable=False),
            pa.field("scope", pa.string(), nullable=False),
            pa.field("type", pa.string(), nullable=False),
            pa.field("text", pa.string(), nullable=False),
            pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
            # Nullable: a memory is searchable by keyword even when its embedding failed.
            pa.field("vector", pa.list_(pa.float32(), dimensions), nullable=True),
        ]
    )


def _index_configs() -> dict[str, BTree | Bitmap | FTS]:
    # As the message index: a bitmap for the few tenants, BTrees for the many users and the merge key.
    return {"id": BTree(), "tenant": Bitmap(), "user_id": BTree(), "text": FTS_CONFIG}


def _rows_table(rows: Sequence[MemoryRow], target: pa.Schema, dimensions: int) -> pa.Table:
    unique = list({(r.id, r.tenant): r for r in rows}.values())  # a merge source must not repeat a key
    return pa.table(
        {
            "id": [r.id for r in unique],
            "tenant": [r.tenant for r in unique],
            "user_id": [r.user_id for r in unique],
            "scope": [r.scope for r in unique],
            "type": [r.type for r in unique],
            # CJK runs as bigrams and characters, as `keyword_query` spells the question (lance_fulltext).
            "text": [cjk_terms(r.text) for r in unique],
            # Naive datetimes are taken as UTC, as the store writes them.
            "created_at": [
                r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC) for r in unique
            ],
            "vector": vector_array([r.vector for r in unique], dimensions),
        },
        schema=target,
    )


def _filter(query: MemoryQuery) -> Expr:
    return (
        (col("tenant") == lit(query.tenant))
        & (col("user_id") == lit(query.user_id))
        & col("scope").isin([lit(scope) for scope in dict.fromkeys(query.scopes)])
    )


def _hits(result: pa.Table, score: Callable[[float], float], column: str) -> list[MemoryHit]:
    micros = result.column("created_at").cast(pa.int64()).to_pylist()
    data = result.select(["id", "scope", column]).to_pydict()
    hits = [
        MemoryHit(memory_id, scope, from_micros(at), score(raw))
        for memory_id, scope, at, raw in zip(data["id"], data["scope"], micros, data[column], strict=True)
    ]
    hits.sort(key=lambda h: h.score, reverse=True)  # the engine's order already; kept whatever it does
    return hits


class LanceMemoryVectors(LanceAdapter):
    """Memories' texts and vectors in one LanceDB table. Build with `LanceMemoryVectors.open`."""

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
    ) -> None:
        super().__init__(
            uri,
            name,
            dimensions,
            schema(dimensions),
            _index_configs(),
            Policy("memory index", optimize_every_writes),
            storage_options=storage_options,
            consistency=consistency,
            indexes_ready=indexes_ready,
        )

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
    ) -> LanceMemoryVectors:
        """Open (creating if missing) the table `table` under `uri`, a local directory or an object-store
        URI (`s3://...`, with `storage_options`); `consistency` as for `LanceIndex.open`."""
        name = table_name(table)
        ready = open_table(
            uri, name, schema(dimensions), dimensions, _index_configs(), key=_PRIMARY_KEY,
            storage_options=storage_options, consistency=consistency,
        )  # fmt: skip
        return cls(
            uri,
            name,
            dimensions,
            storage_options=storage_options,
            consistency=consistency,
            indexes_ready=ready,
            optimize_every_writes=optimize_every_writes,
        )

    # -- writes (the memory writer) -------------------------------------------------------------------

    async def upsert(self, rows: Sequence[MemoryRow]) -> None:
        if not rows:
            return
        data = await anyio.to_thread.run_sync(_rows_table, rows, self._schema, self.dimensions)

        async def merge(table: AsyncTable) -> None:
            # Matched rows are replaced whole: an edited memory's old words and vector must not be found.
            await (
                table.merge_insert(_KEY)
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(data, on_bad_vectors="null")
            )
            await self._index_once(table)

        async with self._writing:
            await self._engine("upsert", merge)
        await self._compaction.wrote()

    async def delete(self, tenant: str, memory_ids: Sequence[str]) -> None:
        if not memory_ids:
            return
        where = (col("tenant") == lit(tenant)) & col("id").isin([lit(i) for i in dict.fromkeys(memory_ids)])
        await self._engine("delete", lambda table: table.delete(where))
        await self._compaction.wrote()

    async def delete_user(self, tenant: str, user_id: str) -> None:
        where = (col("tenant") == lit(tenant)) & (col("user_id") == lit(user_id))
        await self._engine("delete_user", lambda table: table.delete(where))
        await self._compaction.wrote()

    # -- reads (recall, on the request path) ----------------------------------------------------------

    async def search(self, query: MemoryQuery) -> MemorySearchResult:
        if query.limit <= 0 or not query.scopes:
            return MemorySearchResult()
        where = _filter(query)
        vector = query_vector(query.vector, self.dimensions)
        text = keyword_query(query.text)
        return MemorySearchResult(
            *await self._rankings(where, vector, text, query.limit, _HIT_COLUMNS, _hits)
        )

    async def count(self, tenant: str, user_id: str | None = None) -> int:
        return await self._count(tenant, user_id)
