"""What the LanceDB adapters (message index, memory vectors) share: a table opened at start-up with its
indexes, the asyncio handle opened in the running loop, the engine's errors translated at this edge, one
write at a time, and the skeleton of an adapter over all that (`LanceAdapter`)."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread
import lancedb
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from lancedb.expr import Expr
from lancedb.index import FTS, Bitmap, BTree, IndexConfig
from lancedb.query import FullTextQuery
from lancedb.table import AsyncTable, LanceTable, Table

from gateway.adapters.lance_compaction import KEEP_VERSIONS, Compactor, Policy
from gateway.errors import SearchIndexError

log = logging.getLogger(__name__)

T = TypeVar("T")
H = TypeVar("H")  # a hit, as each adapter reads it
IndexConfigs = dict[str, BTree | Bitmap | FTS]

# What the engine raises: its Rust errors surface as RuntimeError/ValueError/OSError, pyarrow's as
# ArrowException subclasses, a missing column as KeyError. Translated to SearchIndexError at this edge.
ENGINE_ERRORS: tuple[type[BaseException], ...] = (
    RuntimeError,
    ValueError,
    OSError,
    KeyError,
    pa.ArrowException,
)


PRIMARY_KEY_METADATA = b"lance-schema:unenforced-primary-key:position"


def table_name(name: str) -> str:
    """A safe LanceDB table name for `name` (e.g. a model id): other characters become "_", and a short
    hash of the original keeps two names that differ only in those characters apart."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-")[:100]
    if not safe:
        raise ValueError(f"no usable characters in table name {name!r}")
    if safe == name:
        return name
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def vector_array(vectors: Sequence[Sequence[float] | None], dimensions: int) -> pa.FixedSizeListArray:
    """Vectors as a column (null where a row has none yet); one of another length is refused."""
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


def query_vector(vector: Sequence[float] | None, dimensions: int) -> npt.NDArray[np.float32] | None:
    """A search's vector for the engine (None: no semantic ranking); one of another length is refused."""
    if vector is None:
        return None
    if len(vector) != dimensions:
        raise SearchIndexError(f"query vector of {len(vector)} dimensions for an index of {dimensions}")
    return np.asarray(vector, dtype=np.float32)


def sql_string(value: str) -> str:
    """A SQL string literal's body: count_rows takes only SQL text, where a quote is doubled."""
    return value.replace("'", "''")


def missing_indexes(existing: Iterable[IndexConfig], wanted: IndexConfigs) -> IndexConfigs:
    indexed = {column for index in existing for column in index.columns}
    return {column: config for column, config in wanted.items() if column not in indexed}


# Replicas starting together on one directory race to create the table, declare its key, add columns:
# the losers see a conflict, a schema that changed under them, or a key set since they read. Every step
# checks before it acts, so opening again sees the winner's work and goes on.
OPEN_ATTEMPTS = 6
OPEN_RETRY_SECONDS = 0.05


def open_table(
    uri: str,
    name: str,
    schema: pa.Schema,
    dimensions: int,
    indexes: IndexConfigs,
    *,
    key: Sequence[str],
    storage_options: dict[str, str] | None,
    consistency: timedelta,
    upgrade: Callable[[Table], None] | None = None,
) -> bool:
    """Open (creating if missing) the table `name` under `uri`, check its vectors' size, `upgrade` an
    older table (e.g. add a column), declare `key` (the columns writes merge on) its primary key, and
    build missing indexes. Returns whether the indexes are ready (some engine versions refuse to index an
    empty table: the first write builds them then). A step that loses a race with another process opening
    the same table is retried from the start, a few times, with a growing random pause.

    The declared key is what makes concurrent merge_inserts of the same new rows safe: without it two
    writers (two job workers, two replicas) that both find an id absent both insert it, and the table
    holds it twice (lance-format/lance#4585; seen here by `context-gateway verify`). With it the later
    commit conflicts and is retried against the rows the first one wrote."""
    for attempt in range(OPEN_ATTEMPTS):
        try:
            # Start-up only: the blocking API, since this may run inside or outside an event loop.
            db = lancedb.connect(uri, read_consistency_interval=consistency, storage_options=storage_options)
            table = _declared(db, name, schema, dimensions, key, upgrade)
            break
        except ENGINE_ERRORS as exc:
            if attempt == OPEN_ATTEMPTS - 1:
                raise SearchIndexError(f"cannot open index table {name!r} at {uri}: {exc}") from exc
            log.info("index table %s: opening again after %s", name, exc)
            time.sleep(OPEN_RETRY_SECONDS * 2**attempt * (1 + random.random()))
    try:
        for column, config in missing_indexes(table.list_indices(), indexes).items():
            table.create_index(column, config=config)
    except ENGINE_ERRORS as exc:
        log.info("index table %s: indexes deferred until it has rows (%s)", name, exc)
        return False
    return True


def _declared(
    db: lancedb.DBConnection,
    name: str,
    schema: pa.Schema,
    dimensions: int,
    key: Sequence[str],
    upgrade: Callable[[Table], None] | None,
) -> Table:
    """The table `name`, created if missing, upgraded, its key declared and its vectors' size checked."""
    try:
        table = db.open_table(name)
    except ValueError:  # not there yet; exist_ok: another replica may be creating it right now
        table = db.create_table(name, schema=schema, exist_ok=True)
    if upgrade is not None:
        upgrade(table)
    if not all(PRIMARY_KEY_METADATA in (table.schema.field(c).metadata or {}) for c in key):
        if not isinstance(table, LanceTable):
            raise SearchIndexError(f"index table {name!r}: this LanceDB table cannot declare a primary key")
        table.set_unenforced_primary_key(list(key))
    found = table.schema.field("vector").type
    if not pa.types.is_fixed_size_list(found) or found.list_size != dimensions:
        raise SearchIndexError(f"index table {name!r} holds vectors of type {found}, not {dimensions}-d")
    return table


async def nearest(
    table: AsyncTable, vector: npt.NDArray[np.float32], where: Expr, limit: int, columns: list[str]
) -> pa.Table:
    """The `limit` rows passing `where` closest to `vector` by cosine, with `_distance`. Prefiltered
    (the default): top-k among the rows that pass; rows without a vector are skipped by the engine."""
    return await (
        table.query()
        .nearest_to(vector)
        .distance_type("cosine")
        .where(where)
        .limit(limit)
        .select([*columns, "_distance"])
        .to_arrow()
    )


async def matching(
    table: AsyncTable, text: FullTextQuery, where: Expr, limit: int, columns: list[str]
) -> pa.Table:
    """The `limit` rows passing `where` that best match the full-text query, with `_score` (BM25)."""
    return (
        await table.query()
        .nearest_to_text(text)
        .where(where)
        .limit(limit)
        .select([*columns, "_score"])
        .to_arrow()
    )


class WriteLock:
    """One write at a time to a table: this process's tasks (an anyio lock) and, for a table in a local
    directory, every process of the host (an exclusive `flock` on a file beside the table).

    Lance lets merge_inserts of the same new ids running at once in two processes both insert them once
    `id` has its scalar index, declared key or not (lance-format/lance#9238). On object storage there is
    no such lock: replicas there can still race (`context-gateway verify` finds it)."""

    def __init__(self, uri: str, name: str) -> None:
        self._tasks = anyio.Lock()
        local = "://" not in uri or uri.startswith("file://")
        self._path = Path(uri.removeprefix("file://")) / f".{name}.write-lock" if local else None
        self._fd: int | None = None

    async def __aenter__(self) -> None:
        await self._tasks.acquire()
        if self._path is None:
            return
        try:
            if self._fd is None:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                # Read-only: flock needs no more, and a file held open for writing would keep its file
                # system from being remounted read-only.
                self._fd = os.open(self._path, os.O_RDONLY | os.O_CREAT, 0o644)
            # Shielded: a cancellation arriving while the thread waits must not leave the lock taken.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(fcntl.flock, self._fd, fcntl.LOCK_EX)
        except OSError as exc:  # e.g. a full or read-only disk: an index error, as the write's own would be
            self._tasks.release()
            raise SearchIndexError(f"cannot lock {self._path} for writing: {exc}") from exc
        except BaseException:
            self._tasks.release()
            raise

    async def __aexit__(self, *_exc: object) -> None:
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._tasks.release()


# Each table handle's LanceDB caches (index data; manifests and file metadata). LanceDB's own defaults,
# 6 GB and 1 GB a connection, keep what every write's new version brings: a gateway grew without end.
INDEX_CACHE_BYTES = 48 * 2**20
METADATA_CACHE_BYTES = 16 * 2**20


def bounded_session() -> lancedb.Session:
    return lancedb.Session(
        index_cache_size_bytes=INDEX_CACHE_BYTES, metadata_cache_size_bytes=METADATA_CACHE_BYTES
    )


class LanceHandle:
    """The asyncio handle of one table, opened on first use in the loop that uses it."""

    def __init__(
        self, uri: str, name: str, *, storage_options: dict[str, str] | None, consistency: timedelta
    ) -> None:
        self.uri = uri
        self.name = name
        self._storage_options = storage_options
        self._consistency = consistency
        self._table: AsyncTable | None = None
        self._connection: lancedb.AsyncConnection | None = None
        self._session: lancedb.Session | None = None

    def cache_bytes(self) -> int:
        """What LanceDB's caches of this handle hold (0 before it is opened)."""
        return int(self._session.size_bytes) if self._session is not None else 0

    @asynccontextmanager
    async def translated(self, action: str) -> AsyncIterator[None]:
        try:
            yield
        except ENGINE_ERRORS as exc:
            raise SearchIndexError(f"index {action} failed: {type(exc).__name__}: {exc}") from exc

    async def table(self) -> AsyncTable:
        if self._table is None:
            async with self.translated("open"):
                self._connection = await lancedb.connect_async(
                    self.uri,
                    read_consistency_interval=self._consistency,
                    storage_options=self._storage_options,
                    session=(session := bounded_session()),
                )
                self._table = await self._connection.open_table(self.name)
                self._session = session
        return self._table

    async def run(self, action: str, operation: Callable[[AsyncTable], Awaitable[T]]) -> T:
        table = await self.table()
        async with self.translated(action):
            return await operation(table)

    async def both(
        self,
        semantic: Callable[[AsyncTable], Awaitable[list[H]]],
        keyword: Callable[[AsyncTable], Awaitable[list[H]]],
    ) -> tuple[list[H], list[H]]:
        """Both rankings of a search at once (the engine runs each on its own threads); a failure of
        either is one SearchIndexError, not an exception group."""
        table = await self.table()
        found: dict[str, list[H]] = {}
        failures: list[SearchIndexError] = []

        async def run(kind: str, ranking: Callable[[AsyncTable], Awaitable[list[H]]]) -> None:
            try:
                found[kind] = await ranking(table)
            except ENGINE_ERRORS as exc:
                failures.append(SearchIndexError(f"index search failed: {type(exc).__name__}: {exc}"))
                failures[-1].__cause__ = exc

        async with anyio.create_task_group() as group:
            group.start_soon(run, "semantic", semantic)
            group.start_soon(run, "keyword", keyword)
        if failures:
            raise failures[0]
        return found["semantic"], found["keyword"]

    def close(self) -> None:
        if self._table is not None:
            self._table.close()  # type: ignore[no-untyped-call]
            self._table = None
        if self._connection is not None:
            self._connection.close()  # type: ignore[no-untyped-call]
            self._connection = None
        self._session = None  # its caches go with the connection


class LanceAdapter:
    """One table as an adapter holds it: the handle, the write lock, the indexes an empty table could not
    have at start-up (built at the first write), compactions by `Policy`, and both rankings of a search."""

    def __init__(
        self,
        uri: str,
        name: str,
        dimensions: int,
        schema: pa.Schema,
        indexes: IndexConfigs,
        policy: Policy,
        *,
        storage_options: dict[str, str] | None,
        consistency: timedelta,
        indexes_ready: bool,
        backlog: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.uri = uri
        self.name = name
        self.dimensions = dimensions
        self._schema = schema
        self._indexes = indexes
        self._indexes_ready = indexes_ready
        self._handle = LanceHandle(uri, name, storage_options=storage_options, consistency=consistency)
        self._writing = WriteLock(uri, name)  # merges and compactions, one at a time
        self._compaction = Compactor(name, policy, self._compact, backlog=backlog)

    def translated(self, action: str) -> AbstractAsyncContextManager[None]:
        """Engine errors inside become SearchIndexError ("index <action> failed: ...")."""
        return self._handle.translated(action)

    def cache_bytes(self) -> dict[str, int]:
        return {"lancedb": self._handle.cache_bytes()}

    async def table(self) -> AsyncTable:
        """The asyncio table handle, opened in the running loop on first use."""
        return await self._handle.table()

    async def _engine(self, action: str, operation: Callable[[AsyncTable], Awaitable[T]]) -> T:
        return await self._handle.run(action, operation)

    async def _index_once(self, table: AsyncTable) -> bool:
        """Build the indexes the table was too empty for at start-up; True if they were built now."""
        if self._indexes_ready:
            return False
        for column, config in missing_indexes(await table.list_indices(), self._indexes).items():
            await table.create_index(column, config=config)
        self._indexes_ready = True
        return True

    async def optimize(self) -> None:
        """Merge small fragments, add new rows to the indexes, drop versions older than `KEEP_VERSIONS`."""
        await self._compaction.optimize()

    async def _compact(self) -> None:
        # This process's own writes wait: Lance refuses a compaction that a concurrent update of the same
        # fragments preempts ("Retryable commit conflict"); another replica's writes still can.
        async with self._writing:
            await self._engine("optimize", self._optimize)

    async def _optimize(self, table: AsyncTable) -> None:
        await table.optimize(cleanup_older_than=KEEP_VERSIONS)

    async def _rankings(
        self,
        where: Expr,
        vector: npt.NDArray[np.float32] | None,
        text: FullTextQuery | None,
        limit: int,
        columns: list[str],
        hits: Callable[[pa.Table, Callable[[float], float], str], list[H]],
    ) -> tuple[list[H], list[H]]:
        """The semantic and keyword rankings of the rows passing `where` (empty without a vector, a text)."""

        async def semantic(table: AsyncTable) -> list[H]:
            if vector is None:
                return []
            return hits(await nearest(table, vector, where, limit, columns), lambda d: 1.0 - d, "_distance")

        async def keyword(table: AsyncTable) -> list[H]:
            if text is None:
                return []
            return hits(await matching(table, text, where, limit, columns), float, "_score")

        return await self._handle.both(semantic, keyword)

    async def _count(self, tenant: str, user_id: str | None = None) -> int:
        # count_rows takes SQL text only, so the ids are quoted here (`sql_string`), not built as `expr`.
        where = f"tenant = '{sql_string(tenant)}'"
        if user_id is not None:
            where += f" AND user_id = '{sql_string(user_id)}'"
        return await self._engine("count", lambda table: table.count_rows(where))

    async def aclose(self) -> None:
        self._compaction.close()
        self._handle.close()
