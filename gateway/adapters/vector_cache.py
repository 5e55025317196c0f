"""In-memory copies of recently searched conversations' rows, for the LanceDB index's searches of one
conversation: their vectors (semantic search) and their terms (keyword search, `keyword_rank.py`).

A search of one conversation in LanceDB is nearly all per-query overhead; the same top-k (or BM25) over
rows held in numpy costs a fraction of it (BENCHMARKS.md). The cached index (`cached_index.py`) keeps
each searched conversation's rows here and brings them up to date from the table before each search:
nothing when the table's version has not moved (or moved only by writes this process applied here), else
the rows created since the newest held one (less a margin for jobs that finish out of order). Entries
are also reloaded whole after `RELOAD_SECONDS`, which picks up what a delta cannot see (rows deleted by
another replica). Least recently used entries go first when `max_rows` is reached.

Only the data lives here; reading the table is the cached index's job (`cached_index.py`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from gateway.adapters.keyword_rank import Analyzer, KeywordQuery, Postings
from gateway.records import IndexHit, SearchQuery

# Rows are written by jobs that may finish out of order (two workers, retries): a delta re-reads this far
# behind the newest row it holds, and skips the ids it has.
DELTA_MARGIN = timedelta(minutes=10)
RELOAD_SECONDS = 600.0
COLUMNS = ["id", "user_id", "node_id", "view", "depth", "created_at", "dated", "vector", "text"]
# What a held row costs besides its vector: its id, metadata and terms (tracemalloc, 6,000 rows of 20-150
# words: 2,665 bytes a row with a 384-float vector).
ROW_OVERHEAD_BYTES = 1_130


def rows_within(megabytes: int, dimensions: int) -> int:
    """How many rows `megabytes` holds (the bound `storage.vector_cache_mb` sets)."""
    return megabytes * 2**20 // (4 * dimensions + ROW_OVERHEAD_BYTES)


Key = tuple[str, str]  # (tenant, conversation_id)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Entry:
    """One conversation's indexed rows: unit vectors in a matrix (zeros where a row has none yet), their
    terms, their metadata in parallel arrays. Never changed once built (`merged` returns a new one), so a
    search may read it while a refresh runs."""

    conversation_id: str
    user_id: str | None
    version: int  # the table version these rows reflect
    matrix: npt.NDArray[np.float32]
    positions: dict[str, int] = field(default_factory=dict)  # row id -> its row here
    node_ids: tuple[str, ...] = ()
    views: tuple[str, ...] = ()
    created: tuple[datetime, ...] = ()
    depths: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    micros: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    undated: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    embedded: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    postings: Postings = field(default_factory=Postings)
    loaded_at: float = field(default_factory=time.monotonic)
    # Every row of the conversation as of `version` (read whole, then only this process's writes); False
    # once a delta was read, which may miss rows another writer dated far back.
    whole: bool = True

    @classmethod
    def empty(cls, conversation_id: str, dimensions: int, version: int = -1) -> Entry:
        return cls(conversation_id, None, version, np.zeros((0, dimensions), dtype=np.float32))

    @property
    def rows(self) -> int:
        return len(self.node_ids)

    @property
    def ids(self) -> frozenset[str]:
        """Ids of the rows held with their vector."""
        return frozenset(i for i, at in self.positions.items() if self.embedded[at])

    def newest(self) -> datetime | None:
        return from_micros(int(self.micros.max())) if self.rows else None

    def merged(self, table: pa.Table, version: int, analyzer: Analyzer) -> Entry:
        """This entry plus the rows of `table` (columns `COLUMNS`) not held yet, and the vectors of held
        rows that had none, as of table version `version`."""
        vectors = table.column("vector").combine_chunks()
        valid = vectors.is_valid().to_pylist()
        row_ids = table.column("id").to_pylist()
        new: dict[str, int] = {}  # row id -> its row in `table`
        filled: dict[int, int] = {}  # held row without a vector -> its row in `table`, which has one
        for i, (row_id, has_vector) in enumerate(zip(row_ids, valid, strict=True)):
            at = self.positions.get(row_id)
            if at is None:
                new.setdefault(row_id, i)
            elif has_vector and not self.embedded[at]:
                filled[at] = i
        user_id = self.user_id
        if user_id is None and table.num_rows:
            user_id = table.column("user_id")[0].as_py()
        if not new and not filled:
            return replace(self, version=version, user_id=user_id)
        dimensions = self.matrix.shape[1]
        matrix = self.matrix
        embedded = self.embedded
        if filled:
            matrix, embedded = matrix.copy(), embedded.copy()
            rows = list(filled)
            matrix[rows] = _unit_rows(vectors.take(list(filled.values())), dimensions)
            embedded[rows] = True
        if not new:
            return replace(self, version=version, user_id=user_id, matrix=matrix, embedded=embedded)
        keep = list(new.values())
        taken = table.take(keep)
        has_vector = np.asarray([valid[i] for i in keep], dtype=np.bool_)
        added = np.zeros((len(keep), dimensions), dtype=np.float32)
        if has_vector.any():
            with_vector = [i for i, ok in zip(keep, has_vector, strict=True) if ok]
            added[has_vector] = _unit_rows(vectors.take(with_vector), dimensions)
        # As integers first: pyarrow's own conversion of zoned timestamps is slow.
        micros = np.asarray(taken.column("created_at").cast(pa.int64()).to_numpy(), dtype=np.int64)
        created = [from_micros(int(m)) for m in micros]
        depths = np.asarray(taken.column("depth").to_numpy(), dtype=np.int64)
        undated = np.asarray([d is False for d in taken.column("dated").to_pylist()], dtype=np.bool_)
        texts = taken.column("text").to_pylist()
        return replace(
            self,
            user_id=user_id,
            version=version,
            matrix=np.concatenate([matrix, added]),
            positions={**self.positions, **{row_id: self.rows + n for n, row_id in enumerate(new)}},
            node_ids=self.node_ids + tuple(taken.column("node_id").to_pylist()),
            views=self.views + tuple(taken.column("view").to_pylist()),
            created=self.created + tuple(created),
            depths=np.concatenate([self.depths, depths]),
            micros=np.concatenate([self.micros, micros]),
            undated=np.concatenate([self.undated, undated]),
            embedded=np.concatenate([embedded, has_vector]),
            postings=self.postings.extended(analyzer.view_terms(t or "") for t in texts),
        )

    def _allowed(self, query: SearchQuery) -> npt.NDArray[np.bool_]:
        """Rows passing the query's depth and time filters (the tenant and conversation are the entry's
        own)."""
        allowed = np.ones(self.rows, dtype=bool)
        if query.max_depth is not None:
            allowed &= self.depths < query.max_depth
        when = np.ones(self.rows, dtype=bool)
        if query.since is not None:
            when &= self.micros >= _micros(_aware(query.since))
        if query.until is not None:
            when &= self.micros <= _micros(_aware(query.until))
        allowed &= when | self.undated  # when undated rows were said is unknown: no range rules them out
        return allowed

    def search(self, query: SearchQuery, vector: npt.NDArray[np.float32]) -> list[IndexHit]:
        """Top `query.limit` rows with a vector by cosine similarity among those passing the filters."""
        if not self.rows or query.limit <= 0:
            return []
        norm = float(np.linalg.norm(vector))
        scores = self.matrix @ (vector / max(norm, 1e-12))
        return self._top(query, scores, self._allowed(query) & self.embedded)

    def keyword(self, query: SearchQuery, terms: KeywordQuery) -> list[IndexHit]:
        """Top `query.limit` rows by BM25 among those holding a term of `terms` and passing the filters
        (with or without a vector: a row is findable by its words as soon as it is written)."""
        if not self.rows or query.limit <= 0:
            return []
        scores = self.postings.scores(terms)
        return self._top(query, scores, self._allowed(query) & (scores > 0))

    def _top(
        self, query: SearchQuery, scores: npt.NDArray[np.float32], allowed: npt.NDArray[np.bool_]
    ) -> list[IndexHit]:
        candidates = np.flatnonzero(allowed)
        if len(candidates) > query.limit:
            top = np.argpartition(-scores[candidates], query.limit - 1)[: query.limit]
            candidates = candidates[top]
        order = candidates[np.argsort(-scores[candidates], kind="stable")]
        return [
            IndexHit(
                self.node_ids[i],
                self.conversation_id,
                self.views[i],
                int(self.depths[i]),
                self.created[i],
                float(scores[i]),
                not bool(self.undated[i]),
            )
            for i in order
        ]


def _unit_rows(vectors: pa.FixedSizeListArray, dimensions: int) -> npt.NDArray[np.float32]:
    """Vectors (none of them null) as rows of unit length: cosine = dot product from here on."""
    flat = vectors.flatten().to_numpy(zero_copy_only=False)
    matrix = np.asarray(flat, dtype=np.float32).reshape(len(vectors), dimensions)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.asarray(matrix / np.maximum(norms, 1e-12), dtype=np.float32)


class VectorCache:
    """Entries by (tenant, conversation), least recently used first out, at most `max_rows` rows in all."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._rows = 0

    @property
    def rows(self) -> int:
        return self._rows

    def get(self, key: Key) -> Entry | None:
        """The entry of `key`, unless it is missing or due for a whole reload."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if time.monotonic() - entry.loaded_at > RELOAD_SECONDS:
            self.drop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: Key, entry: Entry) -> bool:
        """Hold `entry` in place of any entry of `key`; False (and nothing held) if it is larger than the
        whole cache."""
        self.drop(key)
        if entry.rows > self.max_rows:
            return False
        self._entries[key] = entry
        self._rows += entry.rows
        while self._rows > self.max_rows:
            self.drop(next(iter(self._entries)))
        return True

    def drop(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._rows -= entry.rows

    def drop_user(self, tenant: str, user_id: str) -> None:
        for key in [k for k, e in self._entries.items() if k[0] == tenant and e.user_id == user_id]:
            self.drop(key)

    def advance(self, before: int, after: int, skip: set[Key] | None = None) -> None:
        """Entries exact as of table version `before` are exact as of `after` too (nothing they hold
        changed in between), but those of `skip`."""
        for key, entry in list(self._entries.items()):
            if entry.version == before and (skip is None or key not in skip):
                self._entries[key] = replace(entry, version=after)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries


def from_micros(value: int) -> datetime:
    """The UTC instant `value` microseconds after the epoch (how Arrow stores a timestamp)."""
    return _EPOCH + timedelta(microseconds=value)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _micros(value: datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
