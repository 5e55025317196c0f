"""Keyword hits over the request's own history, for a conversation whose texts the index has not written
yet: a long history that just arrived in one request is findable by nothing for the seconds its first
job waits and runs (and longer behind other conversations' jobs), and questions asked then went without
recall (BENCHMARKS.md, issue 28: 115 of 423 LoCoMo questions asked right after got no tail)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import anyio

from gateway.pipeline.call import CallState, HistoryItem
from gateway.pipeline.context.retrieval_search import blended, with_keywords
from gateway.records import IndexBacklog, IndexHit, SearchQuery, SearchResult
from gateway.text import message_text, mostly_cjk

if TYPE_CHECKING:  # retrieval_rank holds an InHand
    from gateway.pipeline.context.retrieval_rank import Found

# (question, message texts, limit) -> (message index, view, score), best first: BM25 over each message's
# views as the index writes them (adapters/keyword_rank.py, ViewRanker).
RankViews = Callable[[str, Sequence[str], int], list[tuple[int, str, float]]]
# (question, message texts, limit) -> (message index, cosine), best first: static word-piece vectors
# (adapters/static_meaning.py), for messages the model has not embedded yet.
RankMeaning = Callable[[str, Sequence[str], int], list[tuple[int, float]]]

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
# A year is when, not what: messages seldom write it (LoCoMo's "where was James on July 12, 2022?").
_YEAR = re.compile(r"(?:19|20)\d\d")


def in_hand(backlog: IndexBacklog | None, appended: int, path_length: int) -> bool:
    """Whether the index's keyword ranking misses enough of this path that the history in hand ranks it
    instead: the conversation's messages not yet written plus those this request added (their job is
    queued only once the answer is stored)."""
    unsearchable = backlog.unsearchable if backlog is not None else 0
    return path_length <= MAX_MESSAGES and unsearchable + appended > UNSEARCHABLE_SLACK


def names_exact_terms(terms: Sequence[str]) -> bool:
    """Whether the question's exact terms name something a message writes (not only a year)."""
    return any(not _YEAR.fullmatch(term) for term in terms)


def by_static_meaning(question: str, terms: Sequence[str]) -> bool:
    """Whether static vectors rank the history in hand for this question. Not where it names an exact
    term in Latin script: keyword finds where the term is written, and static vectors rank prose about
    its topic above it ("on which box is fx-rates deployed?" lost its inventory table: BENCHMARKS.md,
    session 38). A mostly CJK question's keyword ranking reads bigrams its words share with unrelated
    turns, so it keeps them (at the quarter weight of any ranking by meaning there)."""
    return mostly_cjk(question) or not names_exact_terms(terms)


def waiting_for_vectors(backlog: IndexBacklog | None, appended: int) -> bool:
    """Whether more of the conversation waits for its vectors than the newest turns of a live chat do (the
    model embeds ~60 messages a second on one core: a long history waits tens of seconds)."""
    waiting = backlog.unembedded if backlog is not None else 0
    return waiting + appended > UNSEARCHABLE_SLACK


def unembedded(backlog: IndexBacklog | None, appended: int, path_length: int) -> bool:
    """Whether enough of this path waits for its vectors that the history in hand is ranked by meaning
    too (not past MAX_MESSAGES: that costs a request too much)."""
    return path_length <= MAX_MESSAGES and waiting_for_vectors(backlog, appended)


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
    meaning: RankMeaning | None = None
    # The messages' texts, made once for the question and its second hop.
    texts: list[str] = field(init=False)

    def __post_init__(self) -> None:
        texts = [message_text(item.message).strip() for item in self.path[: self.searched]]
        object.__setattr__(self, "texts", texts)

    async def search(self, query: SearchQuery) -> SearchResult:
        """Keyword hits only (undated), on a worker thread: ~12 ms of CPU for 700 messages."""
        return SearchResult([], await anyio.to_thread.run_sync(self._hits, query.text, query.limit))

    async def by_meaning(self, text: str, limit: int) -> list[IndexHit]:
        """Each message's own view ranked by static vectors (none without `meaning`), on a worker thread.
        The hits carry no score: a static cosine is not the model's, whose thresholds read scores."""
        if self.meaning is None:
            return []
        ranked = await anyio.to_thread.run_sync(self.meaning, text, self.texts, limit)
        return [
            IndexHit(node_id, self.conversation_id, "m", self.first_depth + at, self.now, 0.0, False)
            for at, _ in ranked
            if (node_id := self.path[at].node_id) is not None
        ]

    async def ranked(
        self, result: SearchResult, query: SearchQuery, meant: str, by_word: bool
    ) -> SearchResult:
        """`result` with this history ranked by meaning (with `meaning`: blended with the model's hits of
        what it has embedded) and, `by_word`, by keyword (`joined`)."""
        semantic, keyword = result.semantic, result.keyword
        if self.meaning is not None:
            semantic = blended(semantic, await self.by_meaning(meant, query.limit))
        if by_word:
            keyword = await self.joined(query, keyword)
        return SearchResult(semantic, keyword)

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


async def with_history_in_hand(
    found: Found,
    query: SearchQuery,
    result: SearchResult,
    path: Sequence[HistoryItem],
    where: tuple[int, int, CallState],
    rankers: tuple[RankViews, RankMeaning | None],
    now: datetime,
) -> SearchResult:
    """`result` with the history in hand ranked where the index lacks it: by keyword until its texts are
    written, by static vectors until its own are. `where`: the end of the history older than the window
    on `path`, its first depth, the call's state; `rankers`: by keyword, by meaning (None: off)."""
    older, first_depth, state = where
    views, meaning = rankers
    by_word = in_hand(found.backlog, state.appended, len(path))
    by_meaning = meaning is not None and found.unembedded and by_static_meaning(query.text, found.facts.terms)
    if not (by_word or by_meaning) or state.conversation_id is None:
        return result
    hand = InHand(
        views, path, older, first_depth, state.conversation_id, now, meaning if by_meaning else None
    )
    if by_meaning:
        found.detail["meaning_in_hand"] = True
    if by_word:
        found.in_hand, found.detail["keyword_in_hand"] = hand, True
    return await hand.ranked(result, with_keywords(query, found.facts.acronyms), found.meant, by_word)
