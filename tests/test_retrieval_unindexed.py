"""A history the index has not written yet, ranked by keyword in hand
(gateway/pipeline/context/retrieval_unindexed.py): when it applies, and how its hits join the index's."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from gateway.adapters.keyword_rank import ViewRanker
from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.retrieval_unindexed import (
    DEPTH,
    MAX_MESSAGES,
    UNSEARCHABLE_SLACK,
    InHand,
    in_hand,
)
from gateway.records import IndexBacklog, IndexHit, SearchQuery

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_it_applies_once_more_than_a_turn_or_two_wait_for_the_index() -> None:
    assert not in_hand(IndexBacklog(unsearchable=2), 2, 500)  # a chat's newest exchange waits every turn
    assert in_hand(IndexBacklog(unsearchable=UNSEARCHABLE_SLACK + 1), 0, 500)
    assert in_hand(None, 699, 700)  # the request itself brought the history: its job is not queued yet
    assert not in_hand(IndexBacklog(unsearchable=5_000), 0, MAX_MESSAGES + 1)  # too long for a request


def test_a_thin_clients_stretch_is_ranked_in_hand_and_the_index_keeps_what_is_older() -> None:
    """A thin client sent messages 10-15 only: they are ranked in hand, and the index's hits of older
    messages follow; its hits of the stretch are not added again."""
    texts = ["deploy notes", "the ledger-api rollback failed", "ok", "rollback again?", "yes", "thanks"]
    path = [HistoryItem({"role": "user", "content": t}, 3, f"n{10 + i}") for i, t in enumerate(texts)]
    hand = InHand(ViewRanker(), path, len(path), 10, "c1", NOW)
    indexed = [
        IndexHit("n3", "c1", "m", 3, NOW, 9.0),  # older than the stretch: the index's
        IndexHit("n11", "c1", "m", 11, NOW, 8.0),  # in the stretch: ranked in hand already
    ]
    query = SearchQuery("acme", "Why did the ledger-api rollback fail?", None, 20, "c1")
    hits = asyncio.run(hand.joined(query, indexed))
    assert hits[0].node_id == "n11" and not hits[0].dated and hits[0].depth == 11
    assert hits[-1] == indexed[0]
    assert indexed[1] not in hits


def test_it_returns_as_many_hits_as_the_indexs_two_rankings_would() -> None:
    """The only ranking while the index lacks the history: `DEPTH` times the query's limit, so a loose
    follow-up that names only the topic is still a candidate."""
    texts = [f"note {i} on the queue migration" for i in range(40)]
    path = [HistoryItem({"role": "user", "content": t}, 3, f"n{i}") for i, t in enumerate(texts)]
    hand = InHand(ViewRanker(), path, len(path), 0, "c1", NOW)
    result = asyncio.run(hand.search(SearchQuery("acme", "the queue migration?", None, 10, "c1")))
    assert len(result.keyword) == DEPTH * 10 and not result.semantic
