"""What planning found (`Found`) and how its fused candidates are ranked on this request's path (`rank`):
on the path and outside the window, smoothed over neighbours, weighted by exact terms and recency, the
turns of a participant the question names up, the newest decisions first for a question about where
things stand (reports that it was done, for one asking when), then the second hop."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.question import QuestionFacts, identifier_words, topic
from gateway.pipeline.context.ranking import (
    CURRENT_RECENCY,
    Candidate,
    acronyms_held,
    boost,
    favour_speaker,
    smoothed,
    term_weights,
)
from gateway.pipeline.context.retrieval_hop import KeywordSearch, second_hop
from gateway.pipeline.context.retrieval_revision import COMPLETION, promote_statements, without_people
from gateway.pipeline.context.retrieval_unindexed import InHand
from gateway.ports import JSON, JSONObject
from gateway.records import IndexBacklog, SearchQuery, SearchResult
from gateway.text import message_text

OLD_RECENCY = 0.1  # recency's weight for any other question: a tie-breaker


@dataclass(slots=True)
class Found:
    """What planning found, kept for `propose` (positions index `path`)."""

    facts: QuestionFacts
    meant: str = ""  # the question as the search by meaning reads it (`ranking.for_meaning`)
    path: list[HistoryItem] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    first_depth: int = 0
    on_path: list[Candidate] = field(default_factory=list)
    other: SearchResult | None = None
    best_similarity: float = 0.0
    # Each message's own date, from any hit of it (None: undated); a group is labelled by its messages'.
    dates: dict[str, datetime | None] = field(default_factory=dict)
    matched_terms: list[str] = field(default_factory=list)
    detail: JSONObject = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    in_hand: InHand | None = None  # the history ranked by keyword in hand, not in the index yet
    backlog: IndexBacklog | None = None  # the conversation's messages waiting for the index (None: none)
    unembedded: bool = False  # enough of them (or of the request's own) wait for vectors to rank in hand
    # The second hop found an old message saying what was asked beside a lead an old match named.
    linked: bool = False


async def rank(
    found: Found,
    query: SearchQuery,
    result: SearchResult,
    candidates: list[Candidate],
    path: list[HistoryItem],
    positions: dict[str, int],
    recent: set[str | None],
    lowered: Callable[[HistoryItem], str],
    index: KeywordSearch,
) -> None:
    """The fused `candidates` on this path and outside the window, with their neighbours, exact terms,
    recency and the second hop (searching `index`, or the history in hand), into `found` (best first in
    `on_path`)."""
    hits = [c for c in candidates if c.node_id in positions and c.node_id not in recent]
    found.best_similarity = max(
        (h.score for h in result.semantic if h.node_id in positions and h.node_id not in recent),
        default=0.0,
    )
    on_path = smoothed(hits, path, positions, recent)
    for hit in (*result.semantic, *result.keyword):
        found.dates.setdefault(hit.node_id, hit.created_at if hit.dated else None)
    texts = {c.node_id: lowered(path[positions[c.node_id]]) for c in on_path}
    # A word of the question the candidates write inside an identifier weighs and leads as its exact terms
    # do; the topic of a decision keeps it ("the retries we argued about" for "the current retry policy").
    named = identifier_words(query.text, texts.values(), found.facts.terms)
    if named:
        found.detail["identifier_words"] = list[JSON](named)
    # A phrase of the question a candidate writes as its acronym weighs as a term of it, but leads no hop.
    held = acronyms_held(found.facts.acronyms, texts, lambda n: message_text(path[positions[n]].message))
    weights = term_weights((*found.facts.terms, *named, *held), texts)
    found.matched_terms = [t for t in weights if t not in held]
    if held:
        found.detail["acronyms"] = list[JSON](held)
    # Recency weighs more where the question asks how things stand now (the newest revision answers).
    recency = CURRENT_RECENCY if found.facts.asks_current else OLD_RECENCY
    boost(on_path, texts, weights, positions, len(path), recency)
    speaker = favour_speaker(on_path, texts, query.text.lower())
    if speaker is not None:
        found.detail["speaker"] = speaker
    if found.facts.asks_current:  # the newest decisions on its topic first (retrieval_revision.py)
        words = topic(query.text, found.facts.terms)
        promoted = promote_statements(on_path, words, found.facts.terms, path, recent, lowered)
        texts |= {node_id: lowered(path[positions[node_id]]) for node_id in promoted}
        if promoted:
            found.detail["decisions"] = list[JSON](promoted)
    if found.facts.asks_when_done:  # the newest reports that it was done, above any decision
        # Its words of letters only stay: a report names what was done by them, not by the service ("DNS
        # 切换 已完成" for "哪天把 sync-api 的 DNS 切到...", not "bump sync-api to Go 1.21: done").
        names = tuple(t for t in found.facts.terms if not t.isalpha())
        words = without_people(topic(query.text, names), query.text)
        reported = promote_statements(on_path, words, found.facts.terms, path, recent, lowered, COMPLETION)
        texts |= {node_id: lowered(path[positions[node_id]]) for node_id in reported}
        if reported:
            found.detail["completions"] = list[JSON](reported)
    hopped = time.perf_counter()
    searcher = found.in_hand or index  # the history in hand while the index lacks it
    hop, confirmed = await second_hop(
        searcher, query, found.matched_terms, found.dates, on_path, path, positions, recent, texts
    )
    if hop:
        found.detail["hop"] = list[JSON](hop)
    found.linked = confirmed > 0
    if confirmed:
        found.detail["hop_confirmed"] = confirmed
    found.timings["hop"] = time.perf_counter() - hopped
    found.on_path = on_path
