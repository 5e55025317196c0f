"""VectorIndex over LanceDB: the embed job writes message texts and vectors, retrieval searches them.

One table per embedding model; every row carries its tenant, user and conversation, and every query
filters by tenant. Reads and writes use LanceDB's asyncio API, which awaits the engine's own threads
directly: measured against the blocking API on worker threads, a search with both rankings took
~4.1 ms p50 instead of ~6.4 (100k rows, 384-d). The CPU-bound parts done in Python (turning rows into
Arrow arrays) run on worker threads.

Filters are built with `lancedb.expr` (typed column/literal expressions, no SQL text), so ids holding
quotes or backslashes can neither break a filter nor widen it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import UTC, timedelta
from typing import TypeVar

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from lancedb.expr import Expr, col, lit
from lancedb.index import FTS, Bitmap, BTree, IndexConfig
from lancedb.query import BooleanQuery, FullTextOperator, FullTextQuery, MatchQuery, Occur, PhraseQuery
from lancedb.table import AsyncTable, Table

from gateway.adapters.keyword_rank import COMPOUND, MAX_PHRASES, MAX_QUERY_TERMS, WORD, Analyzer, KeywordQuery
from gateway.adapters.lance_table import (
    LanceHandle,
    WriteLock,
    matching,
    missing_indexes,
    nearest,
    open_table,
)
from gateway.adapters.vector_cache import COLUMNS, DELTA_MARGIN, Entry, Key, VectorCache, from_micros
from gateway.errors import SearchIndexError
from gateway.records import IndexHit, IndexRow, SearchQuery, SearchResult
from gateway.text import cjk_bigrams

log = logging.getLogger(__name__)

T = TypeVar("T")

# Chosen by a ranking test over chat-like text (file names, error codes, ports, identifiers, hashes):
# the "simple" tokenizer splits on punctuation so "port 8443," and "E1234." still match; stemming finds
# "deploying" for "deploy"; positions allow the phrase clauses below, which put "parse_config.py"
# first among rows that merely mention "config" and "py"; tokens up to 80 characters keep sha256 hashes
# (the default 40 drops them).
FTS_CONFIG = FTS(
    base_tokenizer="simple",
    with_position=True,
    max_token_length=80,
    lower_case=True,
    stem=True,
    remove_stop_words=True,
    ascii_folding=True,
)
# The engine's word tokenizers keep a run of Chinese or Japanese characters (or a Korean word with its
# particles) as one token, so "端口" was never found in "我们把端口改成8443"; its n-gram tokenizer finds them
# but turns every English word and number into fragments too (measured: "8443" then matched any row with
# "84"). So the indexed text and the query both spell each such run as its overlapping character
# bigrams (`cjk_bigrams`), and the word tokenizer above keeps English whole.
_HIT_COLUMNS = ["node_id", "conversation_id", "view", "depth", "created_at", "dated"]

# Compaction. Lance keeps each write as a new fragment (a vector update too), outside the indexes until
# compacted; searches pay for each (measured, 100k rows: both rankings went from ~6.5 to ~25 ms p50
# after 200 small writes, and back after one optimize()). Compacting every 10 writes keeps it flat.
OPTIMIZE_EVERY_WRITES = 10
OPTIMIZE_EVERY_ROWS = 5_000
_MAX_BUSY_SHARE = 0.2  # after a compaction taking d seconds, the next waits at least d / share
# Older versions' files are deleted after this (readers need seconds at most). Every compaction rewrites
# the table (LanceDB's optimize() rewrites each fragment under 1M rows) and its full-text index, and the
# old copies stay until they age out: with 10 minutes a LoCoMo replay (17k rows, ~5,000 writes in an
# hour) left 47 GB on disk.
_KEEP_VERSIONS = timedelta(seconds=60)
# This process's latest writes kept to bring a conversation read meanwhile up to date (`_caught_up`).
_APPLIED_WRITES = 256
_APPLIED_ROWS = 20_000
_LOOP_ROWS = 200  # rows of one write a catch-up on the event loop applies (more: left to the next read)
TEXT_INDEX = "text_idx"  # LanceDB's name for the full-text index on `text`
_BACKLOG_ROWS = 1_000  # unindexed rows a process finds at its first write that make it compact at once


def table_name(name: str) -> str:
    """A safe LanceDB table name for `name` (e.g. a model id): other characters become "_", and a short
    hash of the original keeps two names that differ only in those characters apart."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-")[:100]
    if not safe:
        raise ValueError(f"no usable characters in table name {name!r}")
    if safe == name:
        return name
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


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
    # A bitmap for the few tenants (measured: both rankings ~1.5 ms faster than with a BTree, whose
    # lookup of a whole tenant's row ids is then intersected with the conversation's); BTrees for the
    # many users and conversations, and for the row key, which merge_insert joins on (set_vectors ran
    # 3.5x faster with it, add 1.4x, at 100k rows).
    return {
        "id": BTree(),
        "tenant": Bitmap(),
        "user_id": BTree(),
        "conversation_id": BTree(),
        "text": FTS_CONFIG,
    }


def _missing_indexes(existing: Iterable[IndexConfig]) -> dict[str, BTree | Bitmap | FTS]:
    return missing_indexes(existing, _index_configs())


def _add_dated(table: Table) -> None:
    if "dated" not in table.schema.names:
        # Tables written before undated history existed: every row there was dated.
        table.add_columns({"dated": "true"})


def _vector_array(vectors: Sequence[Sequence[float] | None], dimensions: int) -> pa.FixedSizeListArray:
    values = np.zeros((len(vectors), dimensions), dtype=np.float32)
    missing = np.ones(len(vectors), dtype=bool)
    for i, vector in enumerate(vectors):
        if vector is None:
            continue
        if len(vector) != dimensions:
            raise SearchIndexError(f"vector of {len(vector)} dimensions for an index of {dimensions}")
        values[i] = vector
        missing[i] = False
    return pa.FixedSizeListArray.from_arrays(
        pa.array(values.ravel()), dimensions, mask=pa.array(missing) if missing.any() else None
    )


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
            "text": [cjk_bigrams(r.text) for r in unique],
            "vector": _vector_array([r.vector for r in unique], dimensions),
            "dated": [r.dated for r in unique],
        },
        schema=target,
    )


def _vectors_table(tenant: str, vectors: dict[str, list[float]], dimensions: int) -> pa.Table:
    ids = list(vectors)
    columns = [
        pa.array(ids, pa.string()),
        pa.array([tenant] * len(ids), pa.string()),
        _vector_array([vectors[i] for i in ids], dimensions),
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


def keyword_query(text: str) -> FullTextQuery | None:
    """A full-text query for the user's plain text, or None when it has no word to look for.

    Built as query objects, never parsed: quotes, colons, parentheses and AND/OR are just text here.
    """
    if not WORD.search(text):
        return None
    phrases = list(dict.fromkeys(COMPOUND.findall(text)))[:MAX_PHRASES]
    text = cjk_bigrams(text)
    words = text.split()
    if len(words) > MAX_QUERY_TERMS:
        text = " ".join(list(dict.fromkeys(words))[:MAX_QUERY_TERMS])
    # Every argument spelled out (mypy does not see pydantic's field defaults): any word may match (OR),
    # exactly (fuzziness 0: "E1234" must not find "E1235").
    match = MatchQuery(
        text,
        "text",
        boost=1.0,
        fuzziness=0,
        max_expansions=50,
        operator=FullTextOperator.OR,
        prefix_length=0,
        document_granularity=None,
    )
    if not phrases:
        return match
    clauses: list[tuple[Occur, FullTextQuery]] = [(Occur.SHOULD, match)]
    clauses += [
        (Occur.SHOULD, PhraseQuery(phrase, "text", slop=0, document_granularity=None)) for phrase in phrases
    ]
    return BooleanQuery(clauses)


def _hits(result: pa.Table, score: Callable[[float], float], column: str) -> list[IndexHit]:
    # Timestamps as integers, made into datetimes here: pyarrow's own conversion of zoned timestamps
    # cost ~1 ms per 120 hits (measured), most of a keyword search's Python time.
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


class LanceIndex:
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
        cache_rows: int = 0,
    ) -> None:
        self.uri = uri
        self.name = name
        self.dimensions = dimensions
        self._storage_options = storage_options
        self._consistency = consistency
        self._schema = schema(dimensions)
        self._handle = LanceHandle(uri, name, storage_options=storage_options, consistency=consistency)
        self._indexes_ready = indexes_ready
        self._optimize_every_writes = optimize_every_writes
        self._optimize_every_rows = optimize_every_rows
        self._writes = 0
        self._rows = 0
        self._optimizing = False
        self._not_before = 0.0
        self._deferred: asyncio.TimerHandle | None = None  # the optimize a throttled write put off
        self._checked_backlog = False  # whether this process looked for rows left unindexed before it
        self._tasks: set[asyncio.Task[None]] = set()
        # Searches of one conversation run in memory over a copy of its rows (vector_cache): vectors and
        # terms (keyword_rank).
        self._cache = VectorCache(cache_rows) if cache_rows > 0 else None
        self._analyzer = Analyzer()
        self._refreshing: dict[Key, anyio.Lock] = {}
        self._too_big: set[Key] = set()
        # One merge at a time in this process and, for a local directory, on this host (WriteLock).
        self._writing = WriteLock(uri, name)
        # The table's version when this process's write now under way began (None: none is): a cached
        # conversation exact as of it is served as it is until that write has been applied to it.
        self._write_base: int | None = None
        # This process's latest writes, oldest first: (version before, version after, the rows; None for
        # a compaction, which changes no row). A conversation read from the table while they landed is
        # brought up to date from here instead of being read again (see `_caught_up`).
        self._applied: deque[tuple[int, int, pa.Table | None]] = deque()
        self._applied_rows = 0

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
    ) -> LanceIndex:
        """Open (creating if missing) the table `table` under `uri`: a local directory or an object-store
        URI (`s3://...`, with `storage_options`). `consistency` is how stale a read may be: 0 sees other
        processes' writes at once, at the cost of one manifest check per query (on object storage, a
        round trip; a second or so is then a fair trade). `cache_rows` bounds the in-memory copies of
        searched conversations' vectors (0: every search goes to the table)."""
        name = table_name(table)
        ready = open_table(
            uri, name, schema(dimensions), dimensions, _index_configs(), key=["id"],
            storage_options=storage_options, consistency=consistency, upgrade=_add_dated,
        )  # fmt: skip
        return cls(
            uri,
            name,
            dimensions,
            storage_options=storage_options,
            consistency=consistency,
            indexes_ready=ready,
            optimize_every_writes=optimize_every_writes,
            optimize_every_rows=optimize_every_rows,
            cache_rows=cache_rows,
        )

    def _translated(self, action: str) -> AbstractAsyncContextManager[None]:
        return self._handle.translated(action)

    async def _open(self) -> AsyncTable:
        """The asyncio table handle, opened in the running loop on first use."""
        return await self._handle.table()

    async def _engine(self, action: str, operation: Callable[[AsyncTable], Awaitable[T]]) -> T:
        return await self._handle.run(action, operation)

    # -- writes (background jobs) ---------------------------------------------------------------------

    async def add(self, rows: Sequence[IndexRow]) -> None:
        if not rows:
            return
        data = await anyio.to_thread.run_sync(_rows_table, rows, self._schema, self.dimensions)

        embedded = any(r.vector is not None for r in rows)

        async def insert(table: AsyncTable) -> int:
            if self._cache is not None:
                self._write_base = await table.version()
                if self._indexes_ready and self._all_new(data, self._write_base):
                    # None of these ids is in the table (the cached copies, exact as of this version,
                    # say so, and no other write can come in under the lock): a plain append. A merge
                    # joins the new rows against the whole table: 6 rows into 96,000 took 56 ms of CPU
                    # against 7 appended (BENCHMARKS.md, issue 16).
                    return int((await table.add(data, on_bad_vectors="null")).version)
            # Insert the ids not there yet: a retried job re-adds the same rows without duplicates, and a
            # vector already set is never reset to null. Rows written earlier with their text alone get
            # their vector now (a large stretch's texts go first; a failed embedder's retry).
            builder = table.merge_insert("id").when_not_matched_insert_all()
            if embedded:
                builder = builder.when_matched_update_all(where="target.vector IS NULL")
            merged = await builder.execute(data, on_bad_vectors="null")
            if not self._indexes_ready:
                for column, config in _missing_indexes(await table.list_indices()).items():
                    await table.create_index(column, config=config)
                self._indexes_ready = True
                return -1  # the indexes made versions of their own
            return int(merged.version)

        async with self._writing:
            try:
                version = await self._engine("add", insert)
                # Still under the lock: the next write finds the cached conversations as this one left
                # them (applied after it, a write could find them a version behind and skip them).
                if self._cache is not None and version > 0:
                    await self._cache_added(data, version)
            finally:
                self._write_base = None
        await self._wrote(data.num_rows)

    def _all_new(self, data: pa.Table, version: int) -> bool:
        """Whether every row of `data` is new to the table at `version`, as far as cached copies exact
        as of that version tell (a conversation not held, or held as of another version: unknown)."""
        assert self._cache is not None
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
        they follow on without a gap; `applied`: a snapshot of them, for a worker thread). Without this, a
        write landing while a conversation was being read left it a version behind, the next search read
        it again, and so on (logged: every refresh of a conversation found the table one write further
        on). A write with more than `max_rows` rows of it stops there (on the event loop, a bulk chunk's
        terms would hold it up: the next search reads it instead)."""
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

    async def _cache_added(self, data: pa.Table, version: int) -> None:
        """Apply this write to the cached conversations it touched, if the table had not moved since they
        were read (else the next search reads what changed); the others, exact before it, are exact after
        it too. So while this process is the only writer, searches read nothing from the table: with 32
        conversations written at once, nearly every search found the table moved by another
        conversation's write and re-read its delta."""
        cache = self._cache
        assert cache is not None
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
        await self._wrote(data.num_rows)

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
            # rewrites the fragments and the versions age out (`_KEEP_VERSIONS`).
            await table.delete(where)

        await self._engine("delete", remove)
        if self._cache is not None:
            if conversation_id is not None:
                self._cache.drop((tenant, conversation_id))
            if user_id is not None:
                self._cache.drop_user(tenant, user_id)
        await self._wrote(0)

    async def _wrote(self, rows: int) -> None:
        """Count a write; compact when enough have piled up (in the writer's own call, so the work is
        paid by background jobs and never by a request).

        Rows not yet in the full-text index are searched by a scan on every query: 12,000 of them made
        a keyword search of one conversation take 136 ms instead of 12 (BENCHMARKS.md). So a compaction
        put off by the throttle (`_MAX_BUSY_SHARE`) is run when the throttle allows, even if no write
        comes after the burst; and a process's first write looks for rows an earlier process left."""
        self._writes += 1
        self._rows += rows
        due = self._writes >= self._optimize_every_writes or self._rows >= self._optimize_every_rows
        if not self._checked_backlog:
            self._checked_backlog = True
            due = due or await self._unindexed() >= _BACKLOG_ROWS
        if not due:
            return
        if self._optimizing or time.monotonic() < self._not_before:
            self._defer()
            return
        await self._optimize_logged()

    async def _optimize_logged(self) -> None:
        try:
            await self.optimize()
        except SearchIndexError as exc:
            # The write itself succeeded: failing it would only make its job redo it. The next write
            # tries again (e.g. after a commit conflict with another replica compacting).
            log.warning("index %s: compaction failed, retried later: %s", self.name, exc)

    def _defer(self) -> None:
        """Run the compaction that is due once the throttle allows (one pending at a time)."""
        if self._deferred is not None:
            return
        loop = asyncio.get_running_loop()

        def run() -> None:
            self._deferred = None
            if self._writes or self._rows:  # nothing left to do if a write compacted meanwhile
                self._tasks.add(task := loop.create_task(self._optimize_logged()))
                task.add_done_callback(self._tasks.discard)

        delay = max(self._not_before - time.monotonic(), 0.0) + 0.05
        self._deferred = loop.call_later(delay, run)

    async def _unindexed(self) -> int:
        """Rows of the table not in its full-text index yet (0 if that cannot be read)."""

        async def read(table: AsyncTable) -> int:
            stats = await table.index_stats(TEXT_INDEX)
            return stats.num_unindexed_rows if stats is not None else 0

        try:
            return await self._engine("index stats", read)
        except SearchIndexError:
            return 0

    async def optimize(self) -> None:
        """Merge small fragments, add new rows to the indexes, drop versions older than a few minutes."""
        if self._optimizing:
            return
        self._optimizing = True
        started = time.monotonic()
        try:

            async def compact(table: AsyncTable) -> None:
                before = await table.version()
                self._write_base = before if self._cache is not None else None
                await table.optimize(cleanup_older_than=_KEEP_VERSIONS)
                if self._cache is not None:
                    await self._cache_compacted(table, before)

            # This process's own writes wait: Lance refuses a compaction that a concurrent update of the
            # same fragments preempts ("Retryable commit conflict"), and with two job workers filling in
            # vectors every compaction of a bulk import failed that way (measured: 32 imported
            # conversations left 1,371 fragments and 53,327 rows outside the full-text index; keyword
            # searches then scanned them and the full pipeline served 0.4 req/s). Writes are jobs, never
            # requests; another replica's writes can still preempt it (then a later write retries).
            async with self._writing:
                try:
                    await self._engine("optimize", compact)
                finally:
                    self._write_base = None
        finally:
            self._optimizing = False
            self._writes = self._rows = 0
            elapsed = time.monotonic() - started
            self._not_before = time.monotonic() + elapsed / _MAX_BUSY_SHARE

    async def _cache_compacted(self, table: AsyncTable, before: int) -> None:
        """A compaction rewrites files, not rows: copies as of `before` stay exact, unless another writer
        changed the row count meanwhile (then their next search reads what changed)."""
        assert self._cache is not None
        versions = await table.list_versions()  # type: ignore[no-untyped-call]
        rows = {v["version"]: v["metadata"].get("total_rows") for v in versions}
        after = max(rows, default=before)
        if before in rows and all(rows.get(v) == rows[before] for v in range(before + 1, after + 1)):
            self._cache.advance(before, after)
            self._remember(before, after, None)

    # -- reads (request path) -------------------------------------------------------------------------

    async def search(self, query: SearchQuery) -> SearchResult:
        if query.limit <= 0:
            return SearchResult([], [])
        where = _filter(query)
        vector = None
        if query.vector is not None:
            if len(query.vector) != self.dimensions:
                raise SearchIndexError(
                    f"query vector of {len(query.vector)} dimensions for an index of {self.dimensions}"
                )
            vector = np.asarray(query.vector, dtype=np.float32)
        if self._cached_key(query) is not None:
            terms = self._analyzer.query(query.text)
            if vector is None and terms is None:
                return SearchResult([], [])
            async with self._translated("search"):
                entry = await self._cached(query)
            if entry is not None:
                return _from_memory(entry, query, vector, terms)
        text = keyword_query(query.text)

        async def semantic(table: AsyncTable) -> list[IndexHit]:
            if vector is None:
                return []
            result = await nearest(table, vector, where, query.limit, _HIT_COLUMNS)
            return _hits(result, lambda distance: 1.0 - distance, "_distance")

        async def keyword(table: AsyncTable) -> list[IndexHit]:
            if text is None:
                return []
            result = await matching(table, text, where, query.limit, _HIT_COLUMNS)
            return _hits(result, float, "_score")

        return SearchResult(*await self._handle.both(semantic, keyword))

    async def prepare(self, query: SearchQuery) -> None:
        if self._cached_key(query) is None:
            return
        async with self._translated("prepare"):
            await self._cached(query)

    def _cached_key(self, query: SearchQuery) -> Key | None:
        """The cache key of a one-conversation query, when such queries are served from memory."""
        if self._cache is None or query.conversation_id is None:
            return None
        if query.user_id is not None or query.exclude_conversation_id is not None:
            return None
        key = (query.tenant, query.conversation_id)
        return None if key in self._too_big else key

    async def _cached(self, query: SearchQuery) -> Entry | None:
        """The conversation's vectors as of the table's current version, read into memory on first use
        and brought up to date by what was added since (None: not cached, search the table)."""
        key = self._cached_key(query)
        if key is None or self._cache is None:
            return None
        cache = self._cache
        lock = self._refreshing.setdefault(key, anyio.Lock())
        async with lock:
            table = await self._open()
            version = await table.version()
            entry = cache.get(key)
            if entry is not None and (entry.version >= version or entry.version == self._write_base):
                # Exact now (or later: this process's write can commit and apply itself here between the
                # version read and this line, so the version read is the stale one), or exact as of just
                # before this process's write under way, which applies itself here when it lands (it
                # adds messages of the newest exchanges, which the recent window holds; a compaction adds
                # none). Read again, the whole recent stretch of the conversation would come back: every
                # search during a write did that (measured: 1,163 re-reads of ~3,000 rows for 78 writes
                # at 32 connections).
                return entry
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
            entry = self._caught_up(key, entry, max_rows=_LOOP_ROWS)
            if not cache.put(key, entry):
                self._too_big.add(key)  # larger than the whole cache: searched in the table from now on
        # Locks of conversations no longer held go once they pile up.
        if len(self._refreshing) > 2 * len(self._too_big) + 1024:
            for stale in [k for k, held in self._refreshing.items() if not held.locked() and k not in cache]:
                del self._refreshing[stale]
        return entry

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
        return await self._engine(
            "count", lambda table: table.count_rows(f"tenant = '{_sql_string(tenant)}'")
        )

    async def aclose(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        for task in list(self._tasks):
            task.cancel()
        self._handle.close()


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


def _sql_string(value: str) -> str:
    """A SQL string literal's body: count_rows takes only SQL text, where a quote is doubled."""
    return value.replace("'", "''")
