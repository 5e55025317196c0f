"""Keyword hits over the request's own history, for a conversation whose texts the index has not written
yet: a long history that just arrived in one request is findable by nothing for the seconds its first
job waits and runs (and longer behind other conversations' jobs), and questions asked then went without
recall (BENCHMARKS.md, issue 28: 115 of 423 LoCoMo questions asked right after got no tail)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from gateway.pipeline.call import HistoryItem
from gateway.records import IndexBacklog, IndexHit, SearchQuery, SearchResult
from gateway.text import message_text

# (question, message texts, limit) -> (message index, view, score), best first: BM25 over each message's
# views as the index writes them (adapters/keyword_rank.py, ViewRanker).
RankViews = Callable[[str, Sequence[str], int], list[tuple[int, str, float]]]

# Messages of the conversation not yet written to the index beyond which its keyword ranking is taken
# from the history in hand: a chat's newest exchange or two wait for their job on every turn, and those
# are in the recent window anyway.
UNSEARCHABLE_SLACK = 16
# The most messages ranked in hand: ~12 ms of CPU per 700 on the request path, so ~90 ms at this bound.
MAX_MESSAGES = 5_000
# Hits per `limit`: the only ranking while the index lacks the history, so as many as the index's two
# (by meaning and by keyword) give together; at `limit` alone a loose follow-up naming only the topic
# ("shipments 的换 UUID 的事还有一点") was never a candidate (BENCHMARKS.md, issue 28).
DEPTH = 2


def in_hand(backlog: IndexBacklog | None, appended: int, path_length: int) -> bool:
    """Whether the index's keyword ranking misses enough of this path that the history in hand ranks it
    instead: the conversation's messages not yet written plus those this request added (their job is
    queued only once the answer is stored)."""
    unsearchable = backlog.unsearchable if backlog is not None else 0
    return path_length <= MAX_MESSAGES and unsearchable + appended > UNSEARCHABLE_SLACK


@dataclass(frozen=True, slots=True)
class InHand:
    """The keyword side of the index's `search`, over `path[:searched]` (the messages older than the
    recent window) as the index would rank them once written: for the question and its second hop."""

    rank: RankViews
    path: Sequence[HistoryItem]
    searched: int
    first_depth: int
    conversation_id: str
    now: datetime
    # The messages' texts, made once for the question and its second hop.
    texts: list[str] = field(init=False)

    def __post_init__(self) -> None:
        texts = [message_text(item.message).strip() for item in self.path[: self.searched]]
        object.__setattr__(self, "texts", texts)

    async def search(self, query: SearchQuery) -> SearchResult:
        """Keyword hits only (undated), on a worker thread: ~12 ms of CPU for 700 messages."""
        return SearchResult([], await anyio.to_thread.run_sync(self._hits, query.text, query.limit))

    async def joined(self, query: SearchQuery, indexed: list[IndexHit]) -> list[IndexHit]:
        """This ranking, then the index's hits of messages older than the history in hand (a thin client
        sends only the newest stretch; the index may hold the rest)."""
        held = {item.node_id for item in self.path[: self.searched]}
        return [*(await self.search(query)).keyword, *(h for h in indexed if h.node_id not in held)]

    def _hits(self, question: str, limit: int) -> list[IndexHit]:
        hits: list[IndexHit] = []
        for at, view, score in self.rank(question, self.texts, limit * DEPTH):
            node_id = self.path[at].node_id
            if node_id is not None:
                hit = IndexHit(
                    node_id, self.conversation_id, view, self.first_depth + at, self.now, score, False
                )
                hits.append(hit)
        return hits
