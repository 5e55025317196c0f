"""An in-memory MemoryVectors for tests and the demo: the LanceDB adapter's behaviour (replace on upsert,
tenant, user and scope filters) with brute-force cosine and the message fake's keyword score."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gateway.errors import SearchIndexError
from gateway.fakes.brute_force import Held, keyword, nearest
from gateway.fakes.memory_index import _aware
from gateway.memory.records import MemoryHit, MemoryQuery, MemoryRow, MemorySearchResult


@dataclass(slots=True)
class InMemoryMemoryVectors:
    """Rows in a dict keyed by (tenant, id), as the adapter's merge key. `dimensions` None accepts vectors
    of any length (all the same)."""

    dimensions: int | None = None
    rows: dict[tuple[str, str], Held[MemoryRow]] = field(default_factory=dict)

    def _check(self, vector: Sequence[float]) -> None:
        if self.dimensions is not None and len(vector) != self.dimensions:
            raise SearchIndexError(f"vector of {len(vector)} dimensions for an index of {self.dimensions}")

    async def upsert(self, rows: Sequence[MemoryRow]) -> None:
        for row in rows:  # every vector checked before any row is stored, as one write in the adapter
            if row.vector is not None:
                self._check(row.vector)
        for row in rows:
            vector = list(row.vector) if row.vector is not None else None
            held = replace(row, created_at=_aware(row.created_at), vector=vector)
            self.rows[(row.tenant, row.id)] = Held.of(held, row.text, row.vector)

    async def delete(self, tenant: str, memory_ids: Sequence[str]) -> None:
        for memory_id in memory_ids:
            self.rows.pop((tenant, memory_id), None)

    async def delete_user(self, tenant: str, user_id: str) -> None:
        for key, held in list(self.rows.items()):
            if held.row.tenant == tenant and held.row.user_id == user_id:
                del self.rows[key]

    async def search(self, query: MemoryQuery) -> MemorySearchResult:
        if query.limit <= 0 or not query.scopes:
            return MemorySearchResult()
        scopes = set(query.scopes)
        candidates = [
            held
            for held in self.rows.values()
            if held.row.tenant == query.tenant
            and held.row.user_id == query.user_id
            and held.row.scope in scopes
        ]
        semantic: list[MemoryHit] = []
        if query.vector is not None:
            self._check(query.vector)
            semantic = [_hit(row, score) for score, row in nearest(query.vector, candidates, query.limit)]
        tenant_rows = [h for h in self.rows.values() if h.row.tenant == query.tenant]
        found = keyword(query.text, tenant_rows, candidates, query.limit)
        return MemorySearchResult(semantic, [_hit(row, score) for score, row in found])

    async def count(self, tenant: str, user_id: str | None = None) -> int:
        return sum(
            1
            for held in self.rows.values()
            if held.row.tenant == tenant and (user_id is None or held.row.user_id == user_id)
        )

    async def aclose(self) -> None:
        return None


def _hit(row: MemoryRow, score: float) -> MemoryHit:
    return MemoryHit(row.id, row.scope, row.created_at, score)
