"""Retrieval section: old messages of this path that match the question, verbatim, with their neighbours.

Flow per request: read the question (time range, exact terms, whether it asks about the past), embed it
(the only embedding on the request path), search the index for messages of this conversation older than
the recent window (semantic and keyword rankings, run together), fuse the rankings by reciprocal rank
over every view of a message, add weight for exact terms and a little for recency, keep only messages on
this request's own path (branches never leak), expand each hit into a group (± `neighbours` messages,
never splitting a tool call from its results), drop what the window already holds and what another group
took, fit the allowance best first, then show the groups oldest first, each labelled with its date.
"""

from __future__ import annotations

import contextlib
import operator
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime

import anyio

from gateway.config import RetrievalConfig
from gateway.errors import EmbeddingError, StoreError
from gateway.pipeline.call import HistoryItem, QuestionVector
from gateway.pipeline.context.question import (
    QuestionFacts,
    analyse,
    capitalised_names,
    contains_term,
    exact_terms,
    named_terms,
    states,
)
from gateway.pipeline.context.ranking import RRF_K, Candidate, fuse, smoothed
from gateway.pipeline.context.section import BuildInput, Proposal
from gateway.pipeline.context.tail_lines import Line, day_changes, day_of, line_of, lines_of, tool_safe, when
from gateway.ports import JSON, Embedder, JobQueue, JSONObject, MessageStore, Similarity, VectorIndex
from gateway.records import EMBED, IndexBacklog, SearchQuery, SearchResult, embed_key_prefix
from gateway.text import message_text, mostly_cjk

_NODE_ID = operator.attrgetter("node_id")

# A question, not a statement: a question mark (any script's), an opening interrogative word, or a
# Chinese interrogative (questions there often go without a mark).
_ASKS = re.compile(
    r"[?\uff1f]|^\s*(?:what|when|where|who|whom|which|why|how|do|does|did|have|has|had|is|are|was|were|can|could|"
    r"would|should|will)\b|什么|怎么|为什么|为何|哪|谁|多少|吗\W*$",
    re.I,
)
# An English-only model's share of the ranking on a question mostly in CJK (benchmarks/workchat.py).
FOREIGN_SEMANTIC_WEIGHT = 0.25
HEADER = "## Retrieved from earlier in this conversation (verbatim, oldest first)"
OTHER_HEADER = "## Retrieved from this user's other conversations (verbatim)"
DATE_LINE_TOKENS = 12  # "[2023-05-08 13:56]" and its line break
SEPARATOR_TOKENS = 2  # the line break or "…" between groups
MIN_GROUP_TOKENS = 12  # less room than this holds no message
OTHER_MAX = 3  # groups from other conversations: each costs a store read
# An exact term of the question held by more of the candidates than this weighs proportionally less.
RARE_TERM = 4
# The second hop: identifiers and names that the HOP_FROM best matches hold and the question does not
# ("nightly-export runs on etl-07" for "where does nightly-export run?") are searched for too, and what
# holds them ranks at HOP_SHARE of the match that named them, less further down the keyword ranking.
HOP_FROM = 2
HOP_LIMIT = 10
HOP_SHARE = 0.8
HOP_COMMON = 6  # a term held by more of the candidates than this leads nowhere in particular
HOP_TERMS = 4  # leads searched at most: a query of more finds messages holding only some of them
# Recency's weight (in reciprocal-rank units over the path) for a question about how things stand now;
# 0.1 otherwise, a tie-breaker.
CURRENT_RECENCY = 1.0
LINE_CACHE_SIZE = 50_000


@dataclass(slots=True)
class _Found:
    """What planning found, kept for `propose` (positions index `path`)."""

    facts: QuestionFacts
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


@dataclass(slots=True)
class _Group:
    start: int  # positions in the path, inclusive
    end: int
    score: float
    created_at: datetime | None
    tokens: int = 0
    lines: list[Line] = field(default_factory=list)
    label: str = ""  # the conversation, for groups from another one


@dataclass(slots=True)
class RetrievalSection:
    index: VectorIndex
    embedder: Embedder | None  # None: keyword search only
    store: MessageStore
    config: RetrievalConfig
    clock: Callable[[], datetime]
    jobs: JobQueue | None = None  # says how much of the conversation is still waiting for the index
    name: str = "retrieval"
    whole: bool = False
    # (encoding, message id) -> tokens of the message's line and the line break after it (forgotten all
    # at once when full). The section's text is counted from these: counted whole, its lines went
    # through the tokenizer's own cache, which the old messages retrieval reaches (tens of thousands
    # over many conversations) kept turning over (measured: 351 lines encoded again per request at 32
    # conversations of 1,000 messages; the tokenizer was about a quarter of the request's time).
    line_tokens: dict[tuple[str, str], int] = field(default_factory=dict, init=False, repr=False)
    # Message id -> its text in lower case, for the exact-term checks (the same old messages come back
    # request after request; forgotten all at once when full).
    lowered: dict[str, str] = field(default_factory=dict, init=False, repr=False)

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
        fair = self.similarity.fair
        # What goes in the tail is uncached on every turn it appears (design.md section 14): only for a
        # question about the past, one naming a term that only old messages hold, or a close match.
        window = [self._lowered(item) for item in build.window]
        old_only = [t for t in found.matched_terms if not any(contains_term(text, t) for text in window)]
        asks = (
            _ASKS.search(_question(build.current)) is not None
        )  # a statement in the past tense is no recall
        past = facts.time_range is not None or (asks and found.best_similarity >= fair)
        # A question that old messages answer closely is one about the past too, in any tense.
        close_question = asks and found.best_similarity >= self.similarity.close
        # Old messages still waiting for their vectors (a long history that just arrived) cannot be
        # scored by meaning: a question is asked over them as if they matched.
        backlog = found.detail.get("index_backlog")
        unscored = asks and isinstance(backlog, dict) and bool(backlog.get("unembedded"))
        if (facts.about_past and past) or old_only or close_question or unscored:
            found.detail["why"] = (
                "terms only old messages hold"
                if old_only
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
        found.detail["skipped"] = (
            "no close match" if found.matched_terms == old_only else "terms in the window"
        )
        return 0

    async def _find(self, build: BuildInput) -> _Found:
        state = build.call.state
        question = _question(build.current)
        facts = analyse(question, self.clock())
        found = _Found(facts)
        if state.conversation_id is None or state.leaf_id is None or not question.strip():
            return found
        started = time.perf_counter()
        # The stored path as far as this request holds it (all of it for a full-history client, the
        # newest stretch for a thin one), contiguous and ending at the newest message.
        # Stored messages all carry their node; only system prompts kept out of the chain come first
        # without one. (Built with C-level slicing and mapping: a resent history has thousands.)
        skip = 0
        while skip < len(state.items) and state.items[skip].node_id is None:
            skip += 1
        path = state.items[skip:]
        first_depth = state.leaf_depth - len(path) + 1
        positions = dict(zip(map(_NODE_ID, path), range(len(path)), strict=True))
        # The window's messages and the whole current exchange (a cut agent loop included) are not searched.
        recent = {item.node_id for item in (*build.window, *build.current, *build.system)}
        newest_older = len(path) - 1  # the newest message outside them, walking back from the end
        while newest_older >= 0 and path[newest_older].node_id in recent:
            newest_older -= 1
        if newest_older < 0 and first_depth <= 0:
            found.detail["skipped"] = "nothing outside the recent window"
            return found
        time_range = facts.time_range
        query = SearchQuery(
            tenant=build.call.tenant,
            text=question,
            vector=None,
            limit=self.config.candidates,
            conversation_id=state.conversation_id,
            max_depth=first_depth + newest_older + 1,
            since=time_range.since if time_range else None,
            until=time_range.until if time_range else None,
        )
        other = None
        if self.config.other_conversations and state.user_id is not None:
            other = replace(
                query,
                conversation_id=None,
                user_id=state.user_id,
                exclude_conversation_id=state.conversation_id,
                max_depth=None,
            )
        outcome: tuple[SearchResult, SearchResult | None, float] | None = None
        backlog: IndexBacklog | None = None

        async def search() -> None:
            nonlocal outcome
            with contextlib.suppress(StoreError):  # kept out of the task group's ExceptionGroup
                outcome = await self._search(query, other, state.question)

        async def read_backlog() -> None:
            nonlocal backlog
            backlog = await self._backlog(build.call.tenant, state.conversation_id)

        async with anyio.create_task_group() as group:
            group.start_soon(search)
            group.start_soon(read_backlog)  # one small query, while the question is embedded
        if outcome is None:
            found.detail["skipped"] = "index unavailable"
            return found
        result, found.other, embed_seconds = outcome
        if backlog:
            # Searched while part of the conversation was still being indexed (a long history that
            # arrived at once): those messages are in no ranking yet, or only in the keyword one.
            found.detail["index_backlog"] = {
                "unsearchable": backlog.unsearchable,
                "unembedded": backlog.unembedded,
                "without_neighbours": backlog.alone,
            }
        searched = time.perf_counter()
        candidates = fuse(result, self._semantic_weight(question))
        if any(c.node_id not in positions for c in candidates) and first_depth > 0:
            # A thin client's history holds only the newest stretch: read the whole path once.
            try:
                stored = await self.store.path(build.call.tenant, state.leaf_id)
            except StoreError:
                stored = []  # the hits outside the loaded stretch are left out; the rest still serve
            if stored:
                path = [HistoryItem(m.data, m.node.token_count, m.node.id) for m in stored]
                positions = dict(zip(map(_NODE_ID, path), range(len(path)), strict=True))
                first_depth = 0
        hits = [c for c in candidates if c.node_id in positions and c.node_id not in recent]
        found.best_similarity = max(
            (h.score for h in result.semantic if h.node_id in positions and h.node_id not in recent),
            default=0.0,
        )
        on_path = smoothed(hits, path, positions, recent)
        for hit in (*result.semantic, *result.keyword):
            found.dates.setdefault(hit.node_id, hit.created_at if hit.dated else None)
        texts = {c.node_id: self._lowered(path[positions[c.node_id]]) for c in on_path}
        # How many candidates hold each exact term, counted once: which terms matched, and how much each
        # weighs (most where it is rare: an error code said once picks its message out, a service name
        # said in every other turn hardly ranks anything).
        holding = {
            t: sum(t in text and contains_term(text, t) for text in texts.values()) for t in facts.terms
        }
        found.matched_terms = sorted(t for t, n in holding.items() if n)
        weight = {t: 2.0 / RRF_K * min(1.0, RARE_TERM / holding[t]) for t in found.matched_terms}
        # Recency breaks ties, and weighs more where the question asks how things stand now (the newest
        # of a value's revisions answers it; the older ones stay reachable, lower).
        recency = CURRENT_RECENCY if facts.asks_current else 0.1
        for c in on_path:
            text = texts[c.node_id]
            c.score += sum(w for t, w in weight.items() if t in text and contains_term(text, t))
            c.score += recency / RRF_K * positions[c.node_id] / max(len(path), 1)
        on_path.sort(key=lambda c: c.score, reverse=True)
        hopped = time.perf_counter()
        if hop := await self._hop(query, found, on_path, path, positions, recent, texts):
            found.detail["hop"] = list[JSON](hop)
        found.timings["hop"] = time.perf_counter() - hopped
        found.path, found.positions, found.first_depth, found.on_path = path, positions, first_depth, on_path
        found.detail.update(
            {
                "candidates": len(candidates),
                "on_path": len(on_path),
                "best_similarity": round(found.best_similarity, 3),
                "about_past": facts.about_past,
                "terms": list(found.matched_terms),
                # The question's vector was begun as the request arrived (context/prefetch.py).
                "embedded_early": state.question is not None and state.question.text == question,
            }
        )
        if time_range is not None:
            found.detail["time_range"] = time_range.phrase
        found.timings.update(
            {
                "embed": embed_seconds,  # waiting for the question's vector; the keyword search runs meanwhile
                "search": searched - started - embed_seconds,
                "rank": time.perf_counter() - searched - found.timings["hop"],
            }
        )
        return found

    async def _hop(
        self,
        query: SearchQuery,
        found: _Found,
        ranked: list[Candidate],
        path: list[HistoryItem],
        positions: dict[str, int],
        recent: set[str | None],
        texts: dict[str, str],
    ) -> list[str]:
        """The second hop (see HOP_SHARE): one more keyword search, for the identifiers and names the
        best matches hold and the question does not; re-sorts `ranked`. Returns the terms searched."""
        asked = query.text.lower()
        # Matched by a search (not only a neighbour's), and holding the question's own terms if any do.
        searched = [c for c in ranked if c.views]
        # A turn that only asks about the question's terms (the same question asked before) states no link.
        own = [c for c in searched if any(states(texts[c.node_id], t) for t in found.matched_terms)]
        named: dict[str, Candidate] = {}
        names: set[str] = set()
        for source in (own or searched)[:HOP_FROM]:
            said = message_text(path[positions[source.node_id]].message)
            names.update(capitalised_names(said))
            for term in named_terms(said):
                if contains_term(asked, term) or term in named:
                    continue
                # Said all over the conversation (a speaker's name, a word like "keep-alive"): no lead.
                if sum(term in text and contains_term(text, term) for text in texts.values()) <= HOP_COMMON:
                    named[term] = source
        if names & named.keys():
            # A capitalised word that the path also says in lower case is an ordinary word starting a
            # sentence ("Proposal: ...", "Confirmed that ..."), not a name.
            everything = "\n".join(message_text(item.message) for item in path)
            named = {t: c for t, c in named.items() if t not in names or not contains_term(everything, t)}
        # Identifiers first, then names, a few at most.
        named = {t: named[t] for t in sorted(named, key=names.__contains__)[:HOP_TERMS]}
        if not named:
            return []
        try:
            result = await self.index.search(
                replace(query, text=" ".join(named), vector=None, limit=HOP_LIMIT)
            )
        except StoreError:
            return []  # the first hop's ranking stands
        by_node = {c.node_id: c for c in ranked}
        for rank, hit in enumerate(result.keyword):
            if hit.node_id not in positions or hit.node_id in recent:
                continue
            text = texts.get(hit.node_id)
            if text is None:
                text = texts[hit.node_id] = message_text(path[positions[hit.node_id]].message).lower()
            sources_of = [s for t, s in named.items() if contains_term(text, t) and s.node_id != hit.node_id]
            if not sources_of:
                continue  # matched a piece of a term only ("etl" of "etl-07")
            candidate = by_node.get(hit.node_id)
            if candidate is None:
                candidate = by_node[hit.node_id] = Candidate(hit.node_id, created_at=hit.created_at)
                ranked.append(candidate)
            candidate.score += HOP_SHARE * max(s.score for s in sources_of) / (1 + rank)
            candidate.views.append(hit.view)
            found.dates.setdefault(hit.node_id, hit.created_at if hit.dated else None)
        ranked.sort(key=lambda c: c.score, reverse=True)
        return list(named)

    async def propose(self, build: BuildInput, allowance: int) -> Proposal:
        found = build.memo.get(self.name)
        if not isinstance(found, _Found) or allowance <= 0 or not (found.on_path or found.other):
            return Proposal(detail=found.detail if isinstance(found, _Found) else {})
        ranking = time.perf_counter()
        path, positions, detail = found.path, found.positions, found.detail
        # The window may have grown since planning: what it now holds is not sent twice.
        recent = {positions[i.node_id] for i in build.window if i.node_id in positions}
        recent |= {positions[i.node_id] for i in (*build.current, *build.system) if i.node_id in positions}
        groups: list[_Group] = []
        # The user's other conversations hold a closer match than anything old here: keep them room
        # (else this conversation's weaker groups could fill the allowance first).
        other_best = max((h.score for h in found.other.semantic), default=0.0) if found.other else 0.0
        keep = allowance // 2 if other_best > max(found.best_similarity, self.similarity.fair) else 0
        if "skipped" not in detail:
            # A reason usually follows what it explains ("we chose X." "why?" "because..."): a "why"
            # question's groups reach one message further forward.
            after = self.config.neighbours + found.facts.asks_why
            groups = self._groups(
                build, path, positions, found.on_path, recent, allowance - keep, found.dates, after
            )
        others: list[_Group] = []
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
        detail["search_ms"] = round(
            sum(timings.values()) * 1000, 2
        )  # the section's own time, embedding included
        detail["timings_ms"] = {k: round(v * 1000, 2) for k, v in timings.items()}
        return Proposal(
            tokens=tokens, text=text, detail=detail, verbatim_ids=tuple(i for i in ids if i is not None)
        )

    async def _search(
        self, query: SearchQuery, other: SearchQuery | None, early: QuestionVector | None = None
    ) -> tuple[SearchResult, SearchResult | None, float]:
        """Both rankings for this conversation (and the user's others): the keyword searches start at
        once, the semantic ones as soon as the question is embedded (usually begun as the request
        arrived: `early`); meanwhile the index prepares the conversation's semantic search. Returns the
        seconds spent waiting for the embedding too."""
        queries = [query] if other is None else [query, other]
        keyword: list[SearchResult | None] = [None] * len(queries)
        semantic: list[SearchResult | None] = [None] * len(queries)
        failures: list[StoreError] = []
        embed_seconds = 0.0

        async def by_keyword(slot: int) -> None:
            try:
                keyword[slot] = await self.index.search(queries[slot])  # vector None: keyword only
            except StoreError as exc:  # kept: a task group would wrap it in an ExceptionGroup
                failures.append(exc)

        async def by_meaning() -> None:
            nonlocal embed_seconds
            started = time.perf_counter()
            vector = await self._embed(query.text, early)
            embed_seconds = time.perf_counter() - started
            if vector is None:
                return
            for slot, q in enumerate(queries):
                try:
                    semantic[slot] = await self.index.search(replace(q, text="", vector=vector))
                except StoreError as exc:
                    failures.append(exc)

        async def prepare() -> None:
            # A failure here shows again in the semantic search that follows, which reports it.
            with contextlib.suppress(StoreError):
                await self.index.prepare(query)

        async with anyio.create_task_group() as group:
            for slot in range(len(queries)):
                group.start_soon(by_keyword, slot)
            if self.embedder is not None:
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

    async def _other_groups(
        self, build: BuildInput, result: SearchResult, facts: QuestionFacts, room: int
    ) -> list[_Group]:
        """The best few matches in the user's other conversations, each with the messages before it."""
        close = {h.node_id for h in result.semantic if h.score >= self.similarity.fair}
        out: list[_Group] = []
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
            group = _Group(0, len(items) - 1, candidate.score, candidate.created_at)
            group.label = path[-1].node.conversation_id
            group.lines = lines_of(items, 0, len(items) - 1)
            group.tokens = (
                sum(self._line_tokens(build, item) for item in items) + DATE_LINE_TOKENS + SEPARATOR_TOKENS
            )
            if group.tokens <= room:
                room -= group.tokens
                out.append(group)
        return out

    def _semantic_weight(self, question: str) -> float:
        if self.similarity.english_only and mostly_cjk(question):
            return FOREIGN_SEMANTIC_WEIGHT
        return 1.0

    async def _backlog(self, tenant: str, conversation_id: str | None) -> IndexBacklog | None:
        if self.jobs is None or conversation_id is None:
            return None
        try:
            return IndexBacklog.of(await self.jobs.pending(EMBED, embed_key_prefix(conversation_id), tenant))
        except StoreError:
            return None  # only the report misses it

    async def _embed(self, question: str, early: QuestionVector | None) -> list[float] | None:
        if self.embedder is None:
            return None
        try:
            if early is not None and early.text == question and not early.future.cancelled():
                return await early.future
            return await self.embedder.embed_query(question)
        except EmbeddingError:
            return None  # keyword search still works

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
    ) -> list[_Group]:
        n = self.config.neighbours
        forward = n if after is None else after
        taken: set[int] = set(recent)
        groups: list[_Group] = []
        days: set[date | None] = set()
        used = build.tokenizer.count(HEADER)
        # What the summary above already says: checked only for the candidates this loop reaches.
        above = "\n".join(build.above).lower()
        for candidate in ranked:
            at = positions[candidate.node_id]
            if at in taken:
                continue
            if used + self._line_tokens(build, path[at]) + SEPARATOR_TOKENS - 1 > allowance:
                # Not even its own line fits (its group holds it): skipped before the group is worked
                # out, since once the allowance is nearly used most candidates left end here.
                continue
            if above and _said_above(path[at].message, above):
                continue  # every identifier of it is in the summary verbatim: it adds nothing
            start, end = tool_safe(path, max(at - n, 0), min(at + forward, len(path) - 1))
            span = [i for i in range(start, end + 1) if i not in taken]
            if not span:
                continue
            # Keep the span contiguous: stop at the first message another group (or the window) holds.
            start = max([i for i in range(start, at) if i in taken], default=start - 1) + 1
            end = min([i for i in range(at + 1, end + 1) if i in taken], default=end + 1) - 1
            start, end = tool_safe(path, start, end)
            if any(i in taken for i in range(start, end + 1)):
                continue  # a tool step could not be kept whole here
            # Labelled by the first of its messages whose date a search returned, not by the hit's: a
            # neighbour may be from another day (the end of one session, the start of the next).
            span_ids = [path[i].node_id for i in range(start, end + 1)]
            when = next((dates[i] for i in span_ids if i is not None and i in dates), candidate.created_at)
            group = _Group(start, end, candidate.score, when)
            # Groups of one day share a date line: only the first of a day pays for it. A group costs its
            # lines and the breaks between them (each message's line counted once, see `_line_tokens`);
            # the section's whole text is counted exactly at the end.
            day = day_of(when)
            date_line = DATE_LINE_TOKENS if day not in days else 0
            group.tokens = sum(self._line_tokens(build, path[i]) for i in range(start, end + 1))
            group.tokens += SEPARATOR_TOKENS - 1
            marks = day_changes(path, start, end, dates, day)
            group.tokens += len(marks) * DATE_LINE_TOKENS
            if used + group.tokens + date_line > allowance:
                if allowance - used < MIN_GROUP_TOKENS:
                    break  # nothing more fits
                continue  # a smaller, lower-ranked group may still fit
            group.lines = lines_of(path, start, end, marks)
            used += group.tokens + date_line
            days.add(day)
            taken.update(range(start, end + 1))
            groups.append(group)
        return groups

    def _lowered(self, item: HistoryItem) -> str:
        """The message's text in lower case; stored messages never change, so each is made once."""
        if item.node_id is None:
            return message_text(item.message).lower()
        text = self.lowered.get(item.node_id)
        if text is None:
            if len(self.lowered) >= LINE_CACHE_SIZE:
                self.lowered.clear()
            text = self.lowered[item.node_id] = message_text(item.message).lower()
        return text

    def _line_tokens(self, build: BuildInput, item: HistoryItem) -> int:
        """Tokens of one message's line and the line break after it; stored messages never change, so
        each is counted once per encoding (the same old messages come back request after request)."""
        if item.node_id is None:
            return build.tokenizer.count(line_of(item) + "\n")
        count = self.line_tokens.get((build.tokenizer.name, item.node_id))
        return count if count is not None else self._counted(build, line_of(item), item.node_id)

    def _counted(self, build: BuildInput, line: str, node_id: str) -> int:
        """Tokens of `line` (message `node_id`'s) and a line break."""
        key = (build.tokenizer.name, node_id)
        count = self.line_tokens.get(key)
        if count is None:
            if len(self.line_tokens) >= LINE_CACHE_SIZE:
                self.line_tokens.clear()
            count = self.line_tokens[key] = build.tokenizer.count(line + "\n")
        return count

    def _compose(
        self, build: BuildInput, groups: list[_Group], others: list[_Group]
    ) -> tuple[str | None, int]:
        """The section's text and its tokens: this conversation's groups oldest first under one date
        line per day ("…" between groups that are not adjacent), then the other conversations' groups,
        each with its date. Every line but the first starts with a letter (a role), `[`, `#` or `…`, so
        the count is the sum of its lines' (see `Tokenizer.count`): a message line followed by another
        line is counted once per message and encoding."""
        blocks: list[list[Line]] = []
        if groups:
            blocks.append([(HEADER, None)])
            day_block: list[Line] = []
            day: date | str | None = "none yet"  # an undated group is a day of its own (None)
            previous: _Group | None = None
            for group in sorted(groups, key=lambda g: g.start):
                if day_of(group.created_at) != day:
                    if day_block:
                        blocks.append(day_block)
                    day = day_of(group.created_at)
                    day_block = [(f"[{when(group.created_at)}]", None)]
                elif previous is not None and group.start > previous.end + 1:
                    day_block.append(("…", None))
                day_block += group.lines
                previous = group
            blocks.append(day_block)
        if others:
            blocks.append([(OTHER_HEADER, None)])
            blocks += [[(f"[{when(g.created_at)}]", None), *g.lines] for g in others]
        if not blocks:
            return None, 0
        tokens = 0
        for number, block in enumerate(blocks):
            # Lines are joined by a line break, blocks by a blank line; the text ends with no break.
            last = "" if number == len(blocks) - 1 else "\n\n"
            for at, (line, node_id) in enumerate(block):
                if at < len(block) - 1 and node_id is not None:
                    tokens += self._counted(build, line, node_id)
                else:
                    tokens += build.tokenizer.count(line + ("\n" if at < len(block) - 1 else last))
        text = "\n\n".join("\n".join(line for line, _ in block) for block in blocks)
        return text, tokens


def _said_above(message: JSONObject, above: str) -> bool:
    text = message_text(message).strip().lower()
    terms = exact_terms(text)
    return (len(text) >= 20 and text in above) or (
        bool(terms) and all(contains_term(above, t) for t in terms)
    )


def _question(current: list[HistoryItem]) -> str:
    return message_text(current[0].message) if current else ""
