"""Retrieval section: old messages of this path that match the question, verbatim, with their neighbours.

Flow per request: read the question (time range, exact terms, whether it asks about the past), embed it
(the only embedding on the request path), search the index for messages of this conversation older than
the recent window (semantic and keyword rankings, run together), fuse the rankings by reciprocal rank
over every view of a message, add weight for exact terms and a little for recency, keep only messages on
this request's own path (branches never leak), expand each hit into a group (± `neighbours` messages,
never splitting a tool call from its results), drop what the window already holds and what another group
took, fit the allowance best first, then show the groups oldest first, each labelled with its date.

This module orchestrates (plan, propose, the searches and reads); the other parts live beside it:
retrieval_rank.py (the candidates ranked on this path), ranking.py (fusion, neighbours' share, term and
recency weights), retrieval_revision.py (the newest decisions), retrieval_hop.py (the second hop),
retrieval_groups.py (hits into groups), retrieval_compose.py (the section's text and its count) and
retrieval_memo.py (each message's lowered text and line tokens); retrieval_search.py runs the searches.
"""

from __future__ import annotations

import contextlib
import operator
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial

import anyio

from gateway.config import RetrievalConfig
from gateway.errors import StoreError
from gateway.pipeline.call import HistoryItem, QuestionVector
from gateway.pipeline.context.question import QuestionFacts, analyse, contains_term, inner_names
from gateway.pipeline.context.ranking import (
    READ_FOR_SPEAKERS,
    RRF_K,
    Candidate,
    for_meaning,
    fuse,
    semantic_weight,
)
from gateway.pipeline.context.retrieval_compose import HEADER, OTHER_HEADER, compose
from gateway.pipeline.context.retrieval_groups import Group, groups_of, other_group
from gateway.pipeline.context.retrieval_memo import MessageMemo
from gateway.pipeline.context.retrieval_rank import Found, rank
from gateway.pipeline.context.retrieval_search import index_backlog, search_both
from gateway.pipeline.context.retrieval_unindexed import (
    RankMeaning,
    RankViews,
    unembedded,
    waiting_for_vectors,
    with_history_in_hand,
)
from gateway.pipeline.context.retrieval_window import OLD_COMPARED, old_outranks_window
from gateway.pipeline.context.section import BuildInput, Proposal
from gateway.ports import Embedder, JobQueue, MessageStore, Similarity, VectorIndex
from gateway.records import IndexBacklog, SearchQuery, SearchResult
from gateway.text import message_text

# contains_term and _Group: benchmarks/locomo_ranking.py and tests/test_tokenizer.py use them from here.
__all__ = ["RetrievalSection", "_Group", "contains_term"]

_NODE_ID = operator.attrgetter("node_id")
_Group = Group

# A question, not a statement: a question mark (any script's), an opening interrogative word, or a
# Chinese interrogative (questions there often go without a mark).
_ASKS = re.compile(
    r"[?\uff1f]|^\s*(?:what|when|where|who|whom|which|why|how|do|does|did|have|has|had|is|are|was|were|can|could|"
    r"would|should|will)\b|什么|怎么|为什么|为何|哪|谁|多少|吗\W*$",
    re.I,
)
OTHER_MAX = 3  # groups from other conversations: each costs a store read
# The configured candidates fill the room of a 4,000-token budget; more room searches deeper, up to
# POOL_GROWTH times as many (240 at 8,000: recall up on every set there, mixed at 4,000; BENCHMARKS.md).
POOL_ROOM = 4_000
POOL_GROWTH = 2.0
# A question about one participant is answered by their own turns: past their best 2 hits (a keyword hit
# may be the other's question, the answer beside it), the other's turns give way to more of theirs
# (LoCoMo dev, right after / after indexing: 89.9 / 91.1 with 8, 90.3 / 91.4 with 2, 89.3 / 91.6 with 0).
SPEAKER_GROUPED = 2
# What the searches returned, the user's other conversations' too, and the seconds spent embedding.
_Searched = tuple[SearchResult, SearchResult | None, float]


@dataclass(slots=True)
class RetrievalSection:
    index: VectorIndex
    embedder: Embedder | None  # None: keyword search only
    store: MessageStore
    config: RetrievalConfig
    clock: Callable[[], datetime]
    jobs: JobQueue | None = None  # says how much of the conversation is still waiting for the index
    # Ranks the history in hand by keyword while the index has not written it (retrieval_unindexed.py).
    rank_views: RankViews | None = None
    # Ranks it by meaning (static vectors) while the model has not embedded it.
    meaning: RankMeaning | None = None
    name: str = "retrieval"
    whole: bool = False
    # Each old message's lowered text and line tokens, made once (retrieval_memo.py).
    memo: MessageMemo = field(default_factory=MessageMemo, init=False, repr=False)

    @property
    def allowance(self) -> int:
        return self.config.allowance_tokens

    @property
    def similarity(self) -> Similarity:
        """Where this section's embedding model puts its cosines."""
        return self.embedder.similarity if self.embedder is not None else Similarity()

    async def plan(self, build: BuildInput) -> int:
        """Search now (before the budget is split), then ask for room by what the question and the
        scores say: more when it asks about the past or names a term only old messages hold, the default
        for a close match, nothing otherwise."""
        found = await self._find(build)
        build.memo[self.name] = found
        if not found.on_path:
            return 0
        facts = found.facts
        # What goes in the tail is uncached on every turn it appears (design.md section 14): only for a
        # question about the past, one naming a term or a name that only old messages hold, a close match,
        # a link the second hop confirmed in old messages, or a question an old message matches better by
        # keyword than the window does.
        question = _question(build.current)
        window = [self._lowered(item) for item in build.window]
        old_only = [t for t in found.matched_terms if not any(contains_term(text, t) for text in window)]
        # A name the question says ("a thank-you note to Priya") that only old messages hold points back as
        # such a term does.
        old_names = [] if old_only else self._old_names(found, question, window)
        # A statement in the past tense is no recall; a question in it is, matched closely or not ("what
        # did the pen testers flag?" names nothing the history writes); one only beside the past ("what
        # should I check before deploying?") when old messages match it at least fairly.
        asks = _ASKS.search(question) is not None
        fair = found.best_similarity >= self.similarity.fair
        past = facts.time_range is not None or (asks and (facts.in_past_tense or fair))
        # A question that old messages answer closely is one about the past too, in any tense.
        close_question = asks and found.best_similarity >= self.similarity.close
        # Old messages still waiting for their vectors (a long history that just arrived) cannot be
        # scored by meaning: a question is asked over them as if they matched.
        waiting = found.unembedded or (found.backlog is not None and found.backlog.unembedded > 0)
        unscored = asks and waiting
        if (facts.about_past and past) or old_only or old_names or close_question or unscored:
            found.detail["why"] = (
                "terms only old messages hold"
                if old_only
                else "names only old messages hold"
                if old_names
                else (
                    "a question about the past"
                    if facts.about_past and past
                    else "a question close to old messages"
                    if close_question
                    else "a question while old messages are being embedded"
                )
            )
            return self.config.recall_allowance_tokens
        other_best = max((h.score for h in found.other.semantic), default=0.0) if found.other else 0.0
        if max(found.best_similarity, other_best) >= self.similarity.tail:
            found.detail["why"] = "a close match"
            return self.config.allowance_tokens
        # "Who is on call for the service behind INC-4666?" with the incident in the window: which service
        # it was, and who is on call for it, only old messages say.
        if asks and found.linked:
            found.detail["why"] = "a link only old messages state"
            return self.config.allowance_tokens
        if asks and await self._old_outranks_window(found, question, window):
            found.detail["why"] = "an old message matches it better than the window"
            return self.config.allowance_tokens
        found.detail["skipped"] = (
            "no close match" if found.matched_terms == old_only else "terms in the window"
        )
        return 0

    def _old_names(self, found: Found, question: str, window: list[str]) -> list[str]:
        """The names of `question` (capitalised, other than where a sentence starts) that no message of
        `window` (lower case) holds and a candidate found on the path does."""
        names = [
            n
            for n in inner_names(question)
            if n not in found.matched_terms and not any(contains_term(text, n) for text in window)
        ]
        if not names:
            return []
        held = [self._lowered(found.path[found.positions[c.node_id]]) for c in found.on_path]
        return [n for n in names if any(n in text and contains_term(text, n) for text in held)]

    async def _old_outranks_window(self, found: Found, question: str, window: list[str]) -> bool:
        """Whether an old message holds more of the question's words than the window does (keyword
        ranking of both, on a worker thread as the ranking in hand: a window of long tool results is
        thousands of words; False without a ranker)."""
        if self.rank_views is None:
            return False
        old = [self._lowered(found.path[found.positions[c.node_id]]) for c in found.on_path[:OLD_COMPARED]]
        ranked = partial(old_outranks_window, self.rank_views, question, window, old)
        return await anyio.to_thread.run_sync(ranked)

    async def _find(self, build: BuildInput) -> Found:
        state = build.call.state
        question = _question(build.current)
        facts = analyse(question, self.clock())
        found = Found(facts)
        if state.conversation_id is None or state.leaf_id is None or not question.strip():
            return found
        started = time.perf_counter()
        path, positions, first_depth = _loaded_path(build)
        # Read from the path's last messages, as the prefetch reads them from the request's.
        found.meant = for_meaning(question, (self._lowered(item) for item in path[-READ_FOR_SPEAKERS:]))
        # The window's messages and the whole current exchange (a cut agent loop included) are not searched.
        recent = {item.node_id for item in (*build.window, *build.current, *build.system)}
        newest_older = len(path) - 1  # the newest message outside them, walking back from the end
        while newest_older >= 0 and path[newest_older].node_id in recent:
            newest_older -= 1
        if newest_older < 0 and first_depth <= 0:
            found.detail["skipped"] = "nothing outside the recent window"
            return found
        if facts.acronyms:  # only those the conversation writes: most initials of a phrase are none
            written = self._written(facts.acronyms, path)
            facts = found.facts = replace(facts, acronyms=written)
        time_range = facts.time_range
        query = SearchQuery(
            tenant=build.call.tenant,
            text=question,
            vector=None,
            limit=pool_size(self.config.candidates, build.room_tokens),
            conversation_id=state.conversation_id,
            max_depth=first_depth + newest_older + 1,
            since=time_range.since if time_range else None,
            until=time_range.until if time_range else None,
        )
        outcome = await self._search_and_backlog(build, query, found)
        if outcome is None:
            found.detail["skipped"] = "index unavailable"
            return found
        result, found.other, embed_seconds = outcome
        found.unembedded = unembedded(found.backlog, state.appended, len(path))
        if self.rank_views is not None:
            where = (newest_older + 1, first_depth, state)
            rankers = (self.rank_views, self.meaning)
            result = await with_history_in_hand(found, query, result, path, where, rankers, self.clock())
        searched = time.perf_counter()
        embedded = not waiting_for_vectors(found.backlog, state.appended)  # at any length, unlike unembedded
        weight = semantic_weight(question, facts.terms, self.similarity.english_only, embedded)
        candidates = fuse(result, weight)
        if any(c.node_id not in positions for c in candidates) and first_depth > 0:
            path, positions, first_depth = await self._whole_path(
                build.call.tenant, state.leaf_id, path, positions, first_depth
            )
        await rank(found, query, result, candidates, path, positions, recent, self._lowered, self.index)
        found.path, found.positions, found.first_depth = path, positions, first_depth
        found.detail.update(
            {
                "candidates": len(candidates),
                "on_path": len(found.on_path),
                "best_similarity": round(found.best_similarity, 3),
                "about_past": facts.about_past,
                "terms": list(found.matched_terms),
                # The question's vector was begun as the request arrived (context/prefetch.py).
                "embedded_early": state.question is not None and state.question.text == found.meant,
            }
        )
        if time_range is not None:
            found.detail["time_range"] = time_range.phrase
        if found.meant != question:
            found.detail["meant"] = found.meant
        found.timings.update(
            {
                "embed": embed_seconds,  # waiting for the question's vector; the keyword search runs meanwhile
                "search": searched - started - embed_seconds,
                "rank": time.perf_counter() - searched - found.timings["hop"],
            }
        )
        return found

    async def _search_and_backlog(
        self, build: BuildInput, query: SearchQuery, found: Found
    ) -> _Searched | None:
        """`_search` (None: the index failed), the user's other conversations too where configured,
        while the conversation's index backlog is read into `found.detail`."""
        state = build.call.state
        other = None
        if self.config.other_conversations and state.user_id is not None:
            other = replace(
                query,
                conversation_id=None,
                user_id=state.user_id,
                exclude_conversation_id=state.conversation_id,
                max_depth=None,
            )
        outcome: _Searched | None = None
        backlog: IndexBacklog | None = None

        async def search() -> None:
            nonlocal outcome
            with contextlib.suppress(StoreError):  # kept out of the task group's ExceptionGroup
                outcome = await self._search(query, other, state.question, found.facts.acronyms, found.meant)

        async def read_backlog() -> None:
            nonlocal backlog
            backlog = await index_backlog(self.jobs, build.call.tenant, state.conversation_id)

        async with anyio.create_task_group() as group:
            group.start_soon(search)
            group.start_soon(read_backlog)  # one small query, while the question is embedded
        if outcome is not None and backlog:
            found.backlog = backlog
            # Part of the conversation was still being indexed: in no ranking yet, or only the keyword one.
            found.detail["index_backlog"] = {
                "unsearchable": backlog.unsearchable,
                "unembedded": backlog.unembedded,
                "without_neighbours": backlog.alone,
            }
        return outcome

    async def _whole_path(
        self, tenant: str, leaf_id: str, path: list[HistoryItem], positions: dict[str, int], first_depth: int
    ) -> tuple[list[HistoryItem], dict[str, int], int]:
        """A thin client's history holds only the newest stretch: the whole path, read once (the
        stretch as it was if the store fails: the hits outside it are left out, the rest still serve)."""
        try:
            stored = await self.store.path(tenant, leaf_id)
        except StoreError:
            return path, positions, first_depth
        if not stored:
            return path, positions, first_depth
        path = [HistoryItem(m.data, m.node.token_count, m.node.id) for m in stored]
        return path, dict(zip(map(_NODE_ID, path), range(len(path)), strict=True)), 0

    async def propose(self, build: BuildInput, allowance: int) -> Proposal:
        found = build.memo.get(self.name)
        if not isinstance(found, Found) or allowance <= 0 or not (found.on_path or found.other):
            return Proposal(detail=found.detail if isinstance(found, Found) else {})
        ranking = time.perf_counter()
        path, positions, detail = found.path, found.positions, found.detail
        # The window may have grown since planning: what it now holds is not sent twice.
        recent = {positions[i.node_id] for i in build.window if i.node_id in positions}
        recent |= {positions[i.node_id] for i in (*build.current, *build.system) if i.node_id in positions}
        groups: list[Group] = []
        # The user's other conversations hold a closer match than anything old here: keep them room
        # (else this conversation's weaker groups could fill the allowance first).
        other_best = max((h.score for h in found.other.semantic), default=0.0) if found.other else 0.0
        keep = allowance // 2 if other_best > max(found.best_similarity, self.similarity.fair) else 0
        if "skipped" not in detail:
            # A reason usually follows what it explains ("we chose X." "why?" "because..."): a "why"
            # question's groups reach one message further forward.
            after = self.config.neighbours + found.facts.asks_why
            grouped = SPEAKER_GROUPED if "speaker" in detail else None
            groups = self._groups(
                build, path, positions, found.on_path, recent, allowance - keep, found.dates, after, grouped
            )
        others: list[Group] = []
        if found.other is not None:
            room = allowance - sum(g.tokens for g in groups) - build.tokenizer.count(OTHER_HEADER)
            others = await self._other_groups(build, found.other, found.facts, room)
            detail["other_conversations"] = [g.label for g in others]
        text, tokens = self._compose(build, groups, others)
        while (groups or others) and tokens > allowance:  # the joins cost a little: drop the weakest
            weakest = min(groups + others, key=lambda g: g.score)
            (groups if weakest in groups else others).remove(weakest)
            text, tokens = self._compose(build, groups, others)
        ids = [path[i].node_id for g in groups for i in range(g.start, g.end + 1)]
        detail["groups"] = [
            {
                "from": found.first_depth + g.start,
                "to": found.first_depth + g.end,
                "score": round(g.score * RRF_K, 3),
            }
            for g in groups
        ]
        detail["message_ids"] = [i for i in ids if i is not None]
        ended = time.perf_counter()
        timings = {**found.timings, "group": ended - ranking}
        # The section's own time, embedding included.
        detail["search_ms"] = round(sum(timings.values()) * 1000, 2)
        detail["timings_ms"] = {k: round(v * 1000, 2) for k, v in timings.items()}
        return Proposal(
            tokens=tokens, text=text, detail=detail, verbatim_ids=tuple(i for i in ids if i is not None)
        )

    async def _search(
        self,
        query: SearchQuery,
        other: SearchQuery | None,
        early: QuestionVector | None = None,
        keywords: tuple[str, ...] = (),
        meant: str = "",
    ) -> tuple[SearchResult, SearchResult | None, float]:
        """`search_both` with this section's index and embedder (a method: benchmarks/locomo_ranking.py
        hooks it)."""
        return await search_both(self.index, self.embedder, query, other, early, keywords, meant)

    async def _other_groups(
        self, build: BuildInput, result: SearchResult, facts: QuestionFacts, room: int
    ) -> list[Group]:
        """The best few matches in the user's other conversations, each with the messages before it."""
        close = {h.node_id for h in result.semantic if h.score >= self.similarity.fair}
        out: list[Group] = []
        for candidate in fuse(result)[:OTHER_MAX]:
            try:
                path = await self.store.path(
                    build.call.tenant, candidate.node_id, newest_messages=self.config.neighbours + 1
                )
            except StoreError:
                break  # the store is failing: no more reads for this request
            if not path:
                continue
            items = [HistoryItem(m.data, m.node.token_count, m.node.id) for m in path]
            lowered = message_text(items[-1].message).lower()
            if candidate.node_id not in close and not any(contains_term(lowered, t) for t in facts.terms):
                continue  # only clear matches cross conversations
            tokens = sum(self._line_tokens(build, item) for item in items)
            group = other_group(items, candidate, path[-1].node.conversation_id, tokens)
            if group.tokens <= room:
                room -= group.tokens
                out.append(group)
        return out

    def _groups(
        self,
        build: BuildInput,
        path: list[HistoryItem],
        positions: dict[str, int],
        ranked: Sequence[Candidate],
        recent: set[int],
        allowance: int,
        dates: dict[str, datetime | None],
        after: int | None = None,  # messages after a hit (default: `neighbours`)
        grouped: int | None = None,  # the best hits that come with neighbours (default: `grouped_hits`)
    ) -> list[Group]:
        """`groups_of` with this section's neighbours, header, summary and line counts (a method:
        benchmarks/locomo_ranking.py replays it)."""
        n = self.config.neighbours
        return groups_of(
            path,
            positions,
            ranked,
            recent,
            allowance,
            dates,
            before=n,
            after=n if after is None else after,
            used=build.tokenizer.count(HEADER),
            above="\n".join(build.above).lower(),
            line_tokens=partial(self._line_tokens, build),
            grouped=self.config.grouped_hits if grouped is None else grouped,
        )

    def _written(self, acronyms: tuple[str, ...], path: list[HistoryItem]) -> tuple[str, ...]:
        """The `acronyms` some message of `path` writes in capitals."""
        wanted, seen = set(acronyms), set[str]()
        for item in path:
            seen |= self.memo.capitals(item) & wanted
            if len(seen) == len(wanted):
                break
        return tuple(a for a in acronyms if a in seen)

    def _lowered(self, item: HistoryItem) -> str:
        return self.memo.lowered(item)

    def _line_tokens(self, build: BuildInput, item: HistoryItem) -> int:
        return self.memo.item_tokens(build.tokenizer, item)

    def _compose(self, build: BuildInput, groups: list[Group], others: list[Group]) -> tuple[str | None, int]:
        """The section's text and its tokens (`compose`), message lines counted once per message and
        encoding."""
        return compose(groups, others, partial(self.memo.counted, build.tokenizer), build.tokenizer.count)


def pool_size(candidates: int, room_tokens: int) -> int:
    """The hits each ranking returns where the history's sections have `room_tokens` (0: unknown):
    `candidates`, more past POOL_ROOM, where the tail holds more old messages than they bring."""
    growth = min(max(room_tokens / POOL_ROOM, 1.0), POOL_GROWTH)
    return round(candidates * growth)


def _loaded_path(build: BuildInput) -> tuple[list[HistoryItem], dict[str, int], int]:
    """The stored path as far as this request holds it (all of it for a full-history client, the newest
    stretch for a thin one), contiguous and ending at the newest message: the messages, their positions
    and the first one's depth."""
    state = build.call.state
    # Only system prompts kept out of the chain come without a node, all first.
    skip = 0
    while skip < len(state.items) and state.items[skip].node_id is None:
        skip += 1
    path = state.items[skip:]
    # C-level slicing and mapping: a resent history has thousands.
    positions = dict(zip(map(_NODE_ID, path), range(len(path)), strict=True))
    return path, positions, state.leaf_depth - len(path) + 1


def _question(current: list[HistoryItem]) -> str:
    return message_text(current[0].message) if current else ""
