"""An in-memory MemoryVectors for tests and the demo: the LanceDB adapter's behaviour (replace on upsert,
tenant, user and scope filters) with brute-force cosine and the message fake's keyword score."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gateway.errors import SearchIndexError
from gateway.fakes.memory_index import _COMPOUND, _aware, _contains, _tokens, _unit
from gateway.memory.records import MemoryHit, MemoryQuery, MemoryRow, MemorySearchResult


@dataclass(slots=True)
class _Held:
    row: MemoryRow
    tokens: list[str]
    counts: Counter[str]
    unit: list[float] | None


@dataclass(slots=True)
class InMemoryMemoryVectors:
    """Rows in a dict keyed by (tenant, id), as the adapter's merge key. `dimensions` None accepts vectors
    of any length (all the same)."""

    dimensions: int | None = None
    rows: dict[tuple[str, str], _Held] = field(default_factory=dict)

    def _check(self, vector: Sequence[float]) -> None:
        if self.dimensions is not None and len(vector) != self.dimensions:
            raise SearchIndexError(f"vector of {len(vector)} dimensions for an index of {self.dimensions}")

    async def upsert(self, rows: Sequence[MemoryRow]) -> None:
        for row in rows:  # every vector checked before any row is stored, as one write in the adapter
            if row.vector is not None:
                self._check(row.vector)
        for row in rows:
            tokens = _tokens(row.text)
            unit = _unit(row.vector) if row.vector is not None else None
            vector = list(row.vector) if row.vector is not None else None
            held = replace(row, created_at=_aware(row.created_at), vector=vector)
            self.rows[(row.tenant, row.id)] = _Held(held, tokens, Counter(tokens), unit)

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
            unit = _unit(query.vector)
            scored = [
                (sum(a * b for a, b in zip(unit, h.unit, strict=True)), h) for h in candidates if h.unit
            ]
            scored.sort(key=lambda pair: pair[0], reverse=True)
            semantic = [_hit(h.row, score) for score, h in scored[: query.limit]]
        return MemorySearchResult(semantic, self._keyword(query, candidates))

    def _keyword(self, query: MemoryQuery, candidates: list[_Held]) -> list[MemoryHit]:
        terms = list(dict.fromkeys(_tokens(query.text)))
        if not terms:
            return []
        # BM25 without length normalisation, as the message fake; document frequencies over the tenant's
        # rows, roughly what Lance's index statistics give.
        tenant_rows = [h for h in self.rows.values() if h.row.tenant == query.tenant]
        total = len(tenant_rows)
        frequency = {t: sum(1 for h in tenant_rows if t in h.counts) for t in terms}
        weight = {t: math.log(1 + (total - frequency[t] + 0.5) / (frequency[t] + 0.5)) for t in terms}
        phrases = [_tokens(chunk) for chunk in dict.fromkeys(_COMPOUND.findall(query.text))]
        scored: list[tuple[float, _Held]] = []
        for held in candidates:
            score = sum(
                held.counts[t] / (held.counts[t] + 1.2) * weight[t] for t in terms if t in held.counts
            )
            for phrase in phrases:  # the whole identifier counts again, like the adapter's phrase clauses
                if phrase and _contains(held.tokens, phrase):
                    score += sum(weight.get(t, 0.0) for t in phrase)
            if score > 0:
                scored.append((score, held))
        scored.sort(key=lambda pair: pair[0], reverse=True)
        return [_hit(h.row, score) for score, h in scored[: query.limit]]

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
