"""An in-memory VectorIndex for tests: the LanceDB adapter's behaviour (filters, idempotence, tenant
isolation, text before vectors) with brute-force cosine and a small term-frequency keyword score."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from gateway.errors import SearchIndexError
from gateway.fakes.brute_force import Held, keyword, nearest, unit
from gateway.records import IndexHit, IndexRow, SearchQuery, SearchResult


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(slots=True)
class MemoryIndex:
    """Rows in a dict keyed by id. `dimensions` None accepts vectors of any length (all the same)."""

    dimensions: int | None = None
    rows: dict[str, Held[IndexRow]] = field(default_factory=dict)

    def _check(self, vector: Sequence[float]) -> None:
        if self.dimensions is not None and len(vector) != self.dimensions:
            raise SearchIndexError(f"vector of {len(vector)} dimensions for an index of {self.dimensions}")

    async def add(self, rows: Sequence[IndexRow]) -> None:
        for row in rows:
            held = self.rows.get(row.id)
            if held is not None:
                # As the real index: a retried job changes nothing, but a row held without its vector
                # gets the one given now.
                if held.unit is None and row.vector is not None:
                    self._check(row.vector)
                    held.row, held.unit = replace(held.row, vector=list(row.vector)), unit(row.vector)
                continue
            if row.vector is not None:
                self._check(row.vector)
            self.rows[row.id] = Held.of(replace(row, created_at=_aware(row.created_at)), row.text, row.vector)

    async def set_vectors(self, tenant: str, vectors: dict[str, list[float]]) -> None:
        for row_id, vector in vectors.items():
            self._check(vector)
            found = self.rows.get(row_id)
            if found is not None and found.row.tenant == tenant:
                found.row = replace(found.row, vector=list(vector))
                found.unit = unit(vector)

    async def delete(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> None:
        if conversation_id is None and user_id is None:
            raise ValueError("delete needs a conversation_id or a user_id")
        for row_id, found in list(self.rows.items()):
            row = found.row
            if row.tenant != tenant:
                continue
            if conversation_id is not None and row.conversation_id != conversation_id:
                continue
            if user_id is not None and row.user_id != user_id:
                continue
            del self.rows[row_id]

    async def prepare(self, query: SearchQuery) -> None:
        return None  # everything is in memory already

    async def search(self, query: SearchQuery) -> SearchResult:
        if query.limit <= 0:
            return SearchResult([], [])
        candidates = [found for found in self.rows.values() if _passes(found.row, query)]
        semantic: list[IndexHit] = []
        if query.vector is not None:
            self._check(query.vector)
            semantic = [_hit(row, score) for score, row in nearest(query.vector, candidates, query.limit)]
        tenant_rows = [f for f in self.rows.values() if f.row.tenant == query.tenant]
        found = keyword(query.text, tenant_rows, candidates, query.limit)
        return SearchResult(semantic, [_hit(row, score) for score, row in found])

    async def rows_of(self, tenant: str, conversation_id: str) -> list[tuple[str, bool]]:
        return [
            (f.row.id, f.unit is not None)
            for f in self.rows.values()
            if f.row.tenant == tenant and f.row.conversation_id == conversation_id
        ]

    async def count(self, tenant: str) -> int:
        return sum(1 for f in self.rows.values() if f.row.tenant == tenant)

    async def aclose(self) -> None:
        return None


def _passes(row: IndexRow, query: SearchQuery) -> bool:
    return (
        row.tenant == query.tenant
        and (query.conversation_id is None or row.conversation_id == query.conversation_id)
        and (query.user_id is None or row.user_id == query.user_id)
        and (query.exclude_conversation_id is None or row.conversation_id != query.exclude_conversation_id)
        and (query.max_depth is None or row.depth < query.max_depth)
        and (_in_range(row, query) or not row.dated)  # undated rows pass any time range
    )


def _in_range(row: IndexRow, query: SearchQuery) -> bool:
    return (query.since is None or row.created_at >= _aware(query.since)) and (
        query.until is None or row.created_at <= _aware(query.until)
    )


def _hit(row: IndexRow, score: float) -> IndexHit:
    return IndexHit(row.node_id, row.conversation_id, row.view, row.depth, row.created_at, score, row.dated)
