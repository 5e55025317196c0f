"""The retrieval section's searches: both rankings of the question run together, the question's vector
(begun early where it can be), and how much of the conversation still waits for the index."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

import anyio

from gateway.errors import EmbeddingError, StoreError
from gateway.pipeline.call import QuestionVector
from gateway.pipeline.context.ranking import RRF_K
from gateway.ports import Embedder, JobQueue, VectorIndex
from gateway.records import EMBED, IndexBacklog, IndexHit, SearchQuery, SearchResult, embed_key_prefix


async def search_both(
    index: VectorIndex,
    embedder: Embedder | None,
    query: SearchQuery,
    other: SearchQuery | None,
    early: QuestionVector | None = None,
    keywords: tuple[str, ...] = (),
    meant: str = "",
) -> tuple[SearchResult, SearchResult | None, float]:
    """Both rankings for this conversation (and the user's others): the keyword searches start at
    once, for the question and `keywords` (words its messages may use instead), the semantic ones as
    soon as the question alone is embedded (usually begun as the request arrived: `early`); meanwhile
    the index prepares the conversation's semantic search. Where `meant` (the question without the
    participants it names: `ranking.for_meaning`) differs from the question, both are searched by
    meaning and their rankings blended. Returns the seconds spent waiting for the embeddings too."""
    queries = [query] if other is None else [query, other]
    worded = [with_keywords(q, keywords) for q in queries]
    keyword: list[SearchResult | None] = [None] * len(queries)
    semantic: list[SearchResult | None] = [None] * len(queries)
    failures: list[StoreError] = []
    embed_seconds = 0.0

    async def by_keyword(slot: int) -> None:
        try:
            keyword[slot] = await index.search(worded[slot])  # vector None: keyword only
        except StoreError as exc:  # kept: a task group would wrap it in an ExceptionGroup
            failures.append(exc)

    async def by_meaning() -> None:
        nonlocal embed_seconds
        embed_seconds = await _by_meaning(index, embedder, queries, semantic, failures, meant, early)

    async def prepare() -> None:
        # A failure here shows again in the semantic search that follows, which reports it.
        with contextlib.suppress(StoreError):
            await index.prepare(query)

    async with anyio.create_task_group() as group:
        for slot in range(len(queries)):
            group.start_soon(by_keyword, slot)
        if embedder is not None:
            group.start_soon(prepare)
        group.start_soon(by_meaning)
    if failures:
        raise failures[0]

    def merged(slot: int) -> SearchResult:
        hits_by_meaning, hits_by_word = semantic[slot], keyword[slot]
        return SearchResult(
            hits_by_meaning.semantic if hits_by_meaning else [],
            hits_by_word.keyword if hits_by_word else [],
        )

    return merged(0), merged(1) if other is not None else None, embed_seconds


async def _by_meaning(
    index: VectorIndex,
    embedder: Embedder | None,
    queries: list[SearchQuery],
    semantic: list[SearchResult | None],
    failures: list[StoreError],
    meant: str,
    early: QuestionVector | None,
) -> float:
    """`search_both`'s searches by meaning, into `semantic` (failures into `failures`); the seconds
    spent waiting for the embeddings."""
    question = queries[0].text
    # [slot][0] for the question as meant, [slot][1] as written (where they differ).
    meaning: list[list[SearchResult | None]] = [[None, None] for _ in queries]

    async def search_by(slot: int, which: int, vector: list[float]) -> None:
        try:
            meaning[slot][which] = await index.search(replace(queries[slot], text="", vector=vector))
        except StoreError as exc:  # kept: a task group would wrap it in an ExceptionGroup
            failures.append(exc)

    started = time.perf_counter()
    vector = await embed_question(embedder, meant or question, early)
    embed_seconds = time.perf_counter() - started
    if vector is None:
        return embed_seconds
    async with anyio.create_task_group() as group:
        for slot in range(len(queries)):
            group.start_soon(search_by, slot, 0, vector)
        if meant and meant != question:
            # The second embedding (begun early too) is awaited while the first searches run.
            written = await embed_question(embedder, question, early)
            embed_seconds = time.perf_counter() - started
            if written is not None:
                for slot in range(len(queries)):
                    group.start_soon(search_by, slot, 1, written)
    for slot, (found, also) in enumerate(meaning):
        if found is not None and also is not None:
            found = SearchResult(blended(found.semantic, also.semantic), [])
        semantic[slot] = found
    return embed_seconds


def with_keywords(query: SearchQuery, keywords: tuple[str, ...]) -> SearchQuery:
    """`query` whose text also holds `keywords`, for a keyword search."""
    return replace(query, text=" ".join((query.text, *keywords))) if keywords else query


async def embed_question(
    embedder: Embedder | None, question: str, early: QuestionVector | None
) -> list[float] | None:
    """The question's vector (None: no embedder, or it failed)."""
    if embedder is None:
        return None
    try:
        begun = early.of(question) if early is not None else None
        if begun is not None:
            return await begun
        return await embedder.embed_query(question)
    except EmbeddingError:
        return None  # keyword search still works


async def index_backlog(
    jobs: JobQueue | None, tenant: str, conversation_id: str | None
) -> IndexBacklog | None:
    """The conversation's messages still waiting for the index (None: unknown)."""
    if jobs is None or conversation_id is None:
        return None
    try:
        return IndexBacklog.of(await jobs.pending(EMBED, embed_key_prefix(conversation_id), tenant))
    except StoreError:
        return None  # only the report misses it


def blended(first: list[IndexHit], second: list[IndexHit]) -> list[IndexHit]:
    """Two rankings by meaning as one, by reciprocal rank, each row once at its higher cosine. Without
    the names, the topic ranks (LoCoMo dev's open-domain and temporal questions); with them, the named
    one's turns about anything (its multi-hop lists at 8,000 tokens): BENCHMARKS.md, session 37."""
    scores: dict[tuple[str, str], float] = {}
    best: dict[tuple[str, str], IndexHit] = {}
    for hits in (first, second):
        for rank, hit in enumerate(hits):
            key = (hit.node_id, hit.view)
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank)
            if key not in best or hit.score > best[key].score:
                best[key] = hit
    return sorted(best.values(), key=lambda h: -scores[(h.node_id, h.view)])
