"""An in-memory VectorIndex for tests: the LanceDB adapter's behaviour (filters, idempotence, tenant
isolation, text before vectors) with brute-force cosine and a small term-frequency keyword score."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from gateway.errors import SearchIndexError
from gateway.records import IndexHit, IndexRow, SearchQuery, SearchResult
from gateway.text import cjk_bigrams

_TOKEN = re.compile(r"[^\W_]+")
_COMPOUND = re.compile(r"[^\W_]+(?:[._\-/:@#]+[^\W_]+)+")
# A few English stop words, as the real index drops them (it uses the full list).
_STOP_WORDS = frozenset(
    [
        *("a", "an", "and", "are", "as", "at", "be", "but", "by", "did", "do", "for", "from", "had"),
        *("has", "have", "i", "in", "is", "it", "of", "on", "or", "so", "that", "the", "this", "to"),
        *("was", "we", "were", "what", "when", "where", "which", "who", "why", "with", "you"),
    ]
)


def _tokens(text: str) -> list[str]:
    # CJK runs as bigrams, as the real index reads them.
    return [t for t in _TOKEN.findall(cjk_bigrams(text).lower()) if t not in _STOP_WORDS]


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else list(vector)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(slots=True)
class _Row:
    row: IndexRow
    tokens: list[str]
    counts: Counter[str]
    unit: list[float] | None


@dataclass(slots=True)
class MemoryIndex:
    """Rows in a dict keyed by id. `dimensions` None accepts vectors of any length (all the same)."""

    dimensions: int | None = None
    rows: dict[str, _Row] = field(default_factory=dict)

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
                    held.row, held.unit = replace(held.row, vector=list(row.vector)), _unit(row.vector)
                continue
            if row.vector is not None:
                self._check(row.vector)
            tokens = _tokens(row.text)
            unit = _unit(row.vector) if row.vector is not None else None
            self.rows[row.id] = _Row(
                replace(row, created_at=_aware(row.created_at)), tokens, Counter(tokens), unit
            )

    async def set_vectors(self, tenant: str, vectors: dict[str, list[float]]) -> None:
        for row_id, vector in vectors.items():
            self._check(vector)
            found = self.rows.get(row_id)
            if found is not None and found.row.tenant == tenant:
                found.row = replace(found.row, vector=list(vector))
                found.unit = _unit(vector)

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
            unit = _unit(query.vector)
            scored = [
                (sum(a * b for a, b in zip(unit, f.unit, strict=True)), f) for f in candidates if f.unit
            ]
            scored.sort(key=lambda pair: pair[0], reverse=True)
            semantic = [_hit(f.row, score) for score, f in scored[: query.limit]]
        return SearchResult(semantic, self._keyword(query, candidates))

    def _keyword(self, query: SearchQuery, candidates: list[_Row]) -> list[IndexHit]:
        terms = list(dict.fromkeys(_tokens(query.text)))
        if not terms:
            return []
        # BM25 without length normalisation; document frequencies over the tenant's rows, as Lance's
        # per-index statistics would roughly give.
        tenant_rows = [f for f in self.rows.values() if f.row.tenant == query.tenant]
        total = len(tenant_rows)
        frequency = {t: sum(1 for f in tenant_rows if t in f.counts) for t in terms}
        weight = {t: math.log(1 + (total - frequency[t] + 0.5) / (frequency[t] + 0.5)) for t in terms}
        phrases = [_tokens(chunk) for chunk in dict.fromkeys(_COMPOUND.findall(query.text))]
        scored: list[tuple[float, _Row]] = []
        for found in candidates:
            score = sum(
                found.counts[t] / (found.counts[t] + 1.2) * weight[t] for t in terms if t in found.counts
            )
            for phrase in phrases:  # the whole identifier counts again, like the adapter's phrase clauses
                if phrase and _contains(found.tokens, phrase):
                    score += sum(weight.get(t, 0.0) for t in phrase)
            if score > 0:
                scored.append((score, found))
        scored.sort(key=lambda pair: pair[0], reverse=True)
        return [_hit(f.row, score) for score, f in scored[: query.limit]]

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


def _contains(tokens: list[str], phrase: list[str]) -> bool:
    width = len(phrase)
    return any(tokens[i : i + width] == phrase for i in range(len(tokens) - width + 1))


def _hit(row: IndexRow, score: float) -> IndexHit:
    return IndexHit(row.node_id, row.conversation_id, row.view, row.depth, row.created_at, score, row.dated)
