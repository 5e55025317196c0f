"""VectorIndex decorator: searches of one conversation served from an in-process copy of its rows, in
front of the LanceDB index (`LanceIndex.open` wraps it when `cache_rows` > 0).

The copies (`vector_cache`) are read from the table on first search and brought up to date before each
later one: nothing while the table's version has not moved, or moved only by this process's own writes
(the index tells this layer of each one under its write lock: `WriteListener`), else the rows created
since the newest held one. Every other call goes to the index as it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from lancedb.expr import col, lit
from lancedb.table import AsyncTable

from gateway.adapters.keyword_rank import Analyzer, KeywordQuery
from gateway.adapters.lance_table import query_vector
from gateway.adapters.vector_cache import COLUMNS, DELTA_MARGIN, ROW_OVERHEAD_BYTES, Entry, Key, VectorCache
from gateway.records import IndexRow, SearchQuery, SearchResult

if TYPE_CHECKING:
    from gateway.adapters.lance_index import LanceIndex

# This process's latest writes kept to bring a conversation read meanwhile up to date (`_caught_up`).
_APPLIED_WRITES = 256
_APPLIED_ROWS = 20_000
_LOOP_ROWS = 200  # rows of one write a catch-up on the event loop applies (more: left to the next read)


class CachedLanceIndex:
    """`inner`, with its searches of one conversation run in memory over at most `cache_rows` rows."""

    def __init__(self, inner: LanceIndex, cache_rows: int) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.name = inner.name
        self.dimensions = inner.dimensions
        self._cache = VectorCache(cache_rows)
        self._analyzer = Analyzer()
        self._refreshing: dict[Key, anyio.Lock] = {}
        self._too_big: set[Key] = set()
        # The table's version when this process's write now under way began (None: none is): a cached
        # conversation exact as of it is served as it is until that write has been applied to it.
        self._write_base: int | None = None
        # This process's latest writes, oldest first: (version before, version after, the rows; None for
        # a compaction, which changes no row).
        self._applied: deque[tuple[int, int, pa.Table | None]] = deque()
        self._applied_rows = 0
        inner.listen(self)

    def cache_bytes(self) -> dict[str, int]:
        applied = sum(data.nbytes for _, _, data in tuple(self._applied) if data is not None)
        row = 4 * self.dimensions + ROW_OVERHEAD_BYTES
        return {"vectors": self._cache.rows * row, "recent_writes": applied, **self.inner.cache_bytes()}

    # -- the index as it is ---------------------------------------------------------------------------

    async def add(self, rows: Sequence[IndexRow]) -> None:
        await self.inner.add(rows)

    async def set_vectors(self, tenant: str, vectors: dict[str, list[float]]) -> None:
        await self.inner.set_vectors(tenant, vectors)

    async def delete(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> None:
        await self.inner.delete(tenant, conversation_id=conversation_id, user_id=user_id)

    async def rows_of(self, tenant: str, conversation_id: str) -> list[tuple[str, bool]]:
        return await self.inner.rows_of(tenant, conversation_id)

    async def count(self, tenant: str) -> int:
        return await self.inner.count(tenant)

    async def optimize(self) -> None:
        await self.inner.optimize()

    async def aclose(self) -> None:
        await self.inner.aclose()

    # -- reads (request path) -------------------------------------------------------------------------

    async def search(self, query: SearchQuery) -> SearchResult:
        if query.limit <= 0 or self._cached_key(query) is None:
            return await self.inner.search(query)
        vector = query_vector(query.vector, self.dimensions)
        terms = self._analyzer.query(query.text)
        if vector is None and terms is None:
            return SearchResult([], [])
        async with self.inner.translated("search"):
            entry = await self._cached(query)
        if entry is None:
            return await self.inner.search(query)
        return _from_memory(entry, query, vector, terms)

    async def prepare(self, query: SearchQuery) -> None:
        if self._cached_key(query) is None:
            return
        async with self.inner.translated("prepare"):
            await self._cached(query)

    def _cached_key(self, query: SearchQuery) -> Key | None:
        """The cache key of a one-conversation query, when such queries are served from memory."""
        if query.conversation_id is None:
            return None
        if query.user_id is not None or query.exclude_conversation_id is not None:
            return None
        key = (query.tenant, query.conversation_id)
        return None if key in self._too_big else key

    async def _cached(self, query: SearchQuery) -> Entry | None:
        """The conversation's vectors as of the table's current version, read into memory on first use
        and brought up to date by what was added since (None: not cached, search the table)."""
        key = self._cached_key(query)
        if key is None:
            return None
        cache = self._cache
        lock = self._refreshing.setdefault(key, anyio.Lock())
        async with lock:
            table = await self.inner.table()
            version = await table.version()
            entry = cache.get(key)
            if entry is not None and (entry.version >= version or entry.version == self._write_base):
                # Exact now (or later: this process's write may have applied itself since the version was
                # read), or exact as of just before this process's write under way, which applies itself
                # when it lands: read again, the conversation's recent stretch would come back each time.
                return entry
            entry = await self._refreshed(table, key, entry, version)
            if not cache.put(key, entry):
                self._too_big.add(key)  # larger than the whole cache: searched in the table from now on
        # Locks of conversations no longer held go once they pile up.
        if len(self._refreshing) > 2 * len(self._too_big) + 1024:
            for stale in [k for k, held in self._refreshing.items() if not held.locked() and k not in cache]:
                del self._refreshing[stale]
        return entry

    async def _refreshed(self, table: AsyncTable, key: Key, entry: Entry | None, version: int) -> Entry:
        """`entry` (None: not held) with the table's rows of the conversation as of `version`: all of them,
        or those created since the newest held one, less `DELTA_MARGIN`."""
        where = (col("tenant") == lit(key[0])) & (col("conversation_id") == lit(key[1]))
        newest = entry.newest() if entry is not None else None
        if entry is None or newest is None:
            entry = Entry.empty(key[1], self.dimensions)
        else:
            where = where & (col("created_at") >= lit(newest - DELTA_MARGIN))
        rows = await table.query().where(where).select(COLUMNS).to_arrow()
        delta = entry.rows > 0
        read, applied = entry, list(self._applied)

        def merge() -> Entry:
            # On a worker thread with the writes that had landed by then; the loop applies any since.
            merged = read.merged(rows, version, self._analyzer)
            return self._caught_up(key, replace(merged, whole=False) if delta else merged, applied)

        entry = await anyio.to_thread.run_sync(merge)
        return self._caught_up(key, entry, max_rows=_LOOP_ROWS)

    # -- this process's writes (WriteListener: told by the index under its write lock) ----------------

    def writing(self, version: int) -> None:
        self._write_base = version

    def written(self) -> None:
        self._write_base = None

    def appendable(self, data: pa.Table, version: int) -> bool:
        """Whether every row of `data` is new to the table at `version`, as far as cached copies exact
        as of that version tell (a conversation not held, or held as of another version: unknown)."""
        ids = data.column("id").to_pylist()
        if len(set(ids)) < len(ids):
            return False
        held: dict[Key, Entry | None] = {}
        for key, row_id in zip(_keys(data), ids, strict=True):
            if key not in held:
                held[key] = self._cache.get(key)
            entry = held[key]
            if entry is None or not entry.whole or entry.version != version or row_id in entry.positions:
                return False
        return True

    async def added(self, data: pa.Table, version: int) -> None:
        """Apply this write to the cached conversations it touched, if the table had not moved since they
        were read (else the next search reads what changed); the others, exact before it, are exact after
        it too. So while this process is the only writer, searches read nothing from the table."""
        cache = self._cache
        if self._write_base is not None:
            self._remember(self._write_base, version, data)
        touched = _keys(data)
        current = {k: e for k in set(touched) if (e := cache.get(k)) is not None and e.version == version - 1}

        def merge() -> dict[Key, Entry]:
            # On a worker thread: a large text chunk's terms take a while to make.
            return {
                key: entry.merged(
                    data.take([i for i, k in enumerate(touched) if k == key]).select(COLUMNS),
                    version,
                    self._analyzer,
                )
                for key, entry in current.items()
            }

        merged = await anyio.to_thread.run_sync(merge) if current else {}
        for key, entry in merged.items():
            if cache.get(key) is current[key]:  # not replaced meanwhile (a refresh, a delete)
                cache.put(key, entry)
        cache.advance(version - 1, version, skip=set(touched))

    async def compacted(self, table: AsyncTable, before: int) -> None:
        """A compaction rewrites files, not rows: copies as of `before` stay exact, unless another writer
        changed the row count meanwhile (then their next search reads what changed)."""
        versions = await table.list_versions()  # type: ignore[no-untyped-call]
        rows = {v["version"]: v["metadata"].get("total_rows") for v in versions}
        after = max(rows, default=before)
        if before in rows and all(rows.get(v) == rows[before] for v in range(before + 1, after + 1)):
            self._cache.advance(before, after)
            self._remember(before, after, None)

    def deleted(self, tenant: str, conversation_id: str | None, user_id: str | None) -> None:
        if conversation_id is not None:
            self._cache.drop((tenant, conversation_id))
        if user_id is not None:
            self._cache.drop_user(tenant, user_id)

    def _remember(self, before: int, after: int, data: pa.Table | None) -> None:
        """Keep this write for `_caught_up`: the latest `_APPLIED_WRITES` writes, `_APPLIED_ROWS` rows
        at most (a bulk import's chunks are large)."""
        self._applied.append((before, after, data))
        self._applied_rows += data.num_rows if data is not None else 0
        while len(self._applied) > _APPLIED_WRITES or self._applied_rows > _APPLIED_ROWS:
            _, _, dropped = self._applied.popleft()
            self._applied_rows -= dropped.num_rows if dropped is not None else 0

    def _caught_up(
        self,
        key: Key,
        entry: Entry,
        applied: Iterable[tuple[int, int, pa.Table | None]] | None = None,
        max_rows: int | None = None,
    ) -> Entry:
        """`entry`, read as of its version, with this process's writes since applied (in order, while
        they follow on without a gap; `applied`: a snapshot of them, for a worker thread), so that a
        write landing while a conversation was read does not leave it a version behind. A write with
        more than `max_rows` rows of it stops there (on the event loop, a bulk chunk's terms would hold
        it up: the next search reads it instead)."""
        for before, after, data in self._applied if applied is None else applied:
            if after <= entry.version:
                continue
            if before != entry.version:
                break  # another writer's version in between: the next search reads what changed
            rows = None
            if data is not None:
                mine = [i for i, k in enumerate(_keys(data)) if k == key]
                if max_rows is not None and len(mine) > max_rows:
                    break
                rows = data.take(mine).select(COLUMNS) if mine else None
            entry = (
                entry.merged(rows, after, self._analyzer)
                if rows is not None
                else replace(entry, version=after)
            )
        return entry


def _from_memory(
    entry: Entry, query: SearchQuery, vector: npt.NDArray[np.float32] | None, terms: KeywordQuery | None
) -> SearchResult:
    return SearchResult(
        entry.search(query, vector) if vector is not None else [],
        entry.keyword(query, terms) if terms is not None else [],
    )


def _keys(data: pa.Table) -> list[Key]:
    """Each row's cache key."""
    return list(
        zip(data.column("tenant").to_pylist(), data.column("conversation_id").to_pylist(), strict=True)
    )
