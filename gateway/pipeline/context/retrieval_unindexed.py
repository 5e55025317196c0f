"""Keyword hits over the request's own history, for a conversation whose texts the index has not written
yet: a long history that just arrived in one request is findable by nothing for the seconds its first
job waits and runs (and longer behind other conversations' jobs), and questions asked then went without
recall (BENCHMARKS.md, issue 28: 115 of 423 LoCoMo questions asked right after got no tail)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from gateway.pipeline.call import HistoryItem
from gateway.records import IndexHit
from gateway.text import message_text

# (question, message texts, limit) -> (message index, view, score), best first: BM25 over each message's
# views as the index writes them (adapters/keyword_rank.py, ViewRanker).
RankViews = Callable[[str, Sequence[str], int], list[tuple[int, str, float]]]

# Messages of the conversation not yet written to the index beyond which its keyword ranking is taken
# from the history in hand: a chat's newest exchange or two wait for their job on every turn, and those
# are in the recent window anyway.
UNSEARCHABLE_SLACK = 16
# The most messages ranked in hand (a request's CPU: ~3 views each).
MAX_MESSAGES = 20_000


def in_hand(backlog: object, appended: int, path_length: int) -> bool:
    """Whether the index's keyword ranking misses enough of this path that the history in hand ranks it
    instead: the report's `index_backlog` plus the messages this request added (their job is queued only
    once the answer is stored)."""
    if path_length > MAX_MESSAGES:
        return False
    unsearchable = backlog.get("unsearchable") if isinstance(backlog, dict) else 0
    return isinstance(unsearchable, int) and unsearchable + appended > UNSEARCHABLE_SLACK


def keyword_hits(
    rank: RankViews,
    question: str,
    path: Sequence[HistoryItem],
    searched: int,
    first_depth: int,
    conversation_id: str,
    limit: int,
    now: datetime,
) -> list[IndexHit]:
    """The keyword ranking the index would give once written, over `path[:searched]` (the messages older
    than the recent window), as undated hits."""
    texts = [message_text(item.message).strip() for item in path[:searched]]
    hits: list[IndexHit] = []
    for at, view, score in rank(question, texts, limit):
        node_id = path[at].node_id
        if node_id is not None:
            hits.append(IndexHit(node_id, conversation_id, view, first_depth + at, now, score, False))
    return hits
