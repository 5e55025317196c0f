"""The retrieval section's second hop: identifiers and names that the best matches hold and the
question does not ("nightly-export runs on etl-07" for "where does nightly-export run?") are searched for
too, and what holds them ranks at HOP_SHARE of the match that named them, less further down the keyword
ranking of the messages alone. With the question's exact terms, leads are read beside them in any of the
HOP_POOL best matches that state them, a short statement's first, and in the first statement of the
assistant's answer to a user's question naming them; without, anywhere in the HOP_FROM best.
A find that also says what was asked goes first among the finds and confirms its source. `leads` and
`follow` are pure; `second_hop` adds the keyword searches between them, one per lead."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import NamedTuple, Protocol

import anyio

from gateway.errors import StoreError
from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.answer_kinds import asked_kinds, holds_kind
from gateway.pipeline.context.question import (
    capitalised_names,
    contains_term,
    named_terms,
    shared_words,
    states,
    topic,
)
from gateway.pipeline.context.ranking import Candidate
from gateway.records import IndexHit, SearchQuery, SearchResult
from gateway.text import CJK, message_text

HOP_FROM = 2
# The best matches a source is chosen from: the one that shares most of the question's topic words goes
# first ("tally-api writes to pg-ledger-2" for "how full is the disk of the database tally-api writes to?").
# 16, not 8: the short statement of the link ranked ~15th among the messages holding a name said in many
# (24 and 32 gave the same; BENCHMARKS.md, session 28).
HOP_POOL = 16
HOP_LIMIT = 40  # views: about a third are messages alone
OWN_VIEW = "m"  # records.IndexRow: the message alone
HOP_SHARE = 0.8
HOP_COMMON = 6  # a term held by more of the candidates than this leads nowhere in particular
HOP_TERMS = 4  # leads searched at most: a query of more finds messages holding only some of them
# A Chinese, Japanese or Korean source names its link in words, not identifiers ("ff_tax_preview 后面藏着
# 发票合并" -> "发票合并是 Bogdan 的活"): its stretches of PHRASE characters that a few other messages
# of the path also hold, and the question does not, are leads too (the rarest CJK_LEADS of a source).
PHRASE = 4
CJK_LEADS = 2
_CJK_STRETCH = re.compile(f"[{CJK}]{{{PHRASE},}}")
# In English the same link is two plain words beside the question's term ("The invoice merge is behind
# ff_async_export" -> "The invoice merge is Ines's work"): pairs of words next to each other, neither a
# function word nor the question's, held by a few messages (only where the question names a term: without
# one, any two words of a chat are a pair).
_PLAIN = re.compile(r"[a-z]{3,}")
_EDGES = "\"'()[]{},;:!?.\u201c\u201d\u2018\u2019"
_FUNCTION_WORDS_TEXT = (
    "the and but not for nor yet with from into onto over under about after before behind between through "
    "this that these those there here then than when what which who whom whose where why how its our your "
    "their his her them they she him you are was were been being has have had does did can could will would "
    "shall should may might must also just only still all any each every some more most much many such own "
    "same other via per out off now new old"
)
_FUNCTION_WORDS = frozenset(_FUNCTION_WORDS_TEXT.split())
# Sentences and lines; a CJK full stop ends a sentence with no space after it.
_QUESTION_MARKS = ("?", "\uff1f")
_QUERY_KEY = re.compile(r"[?&][\w.-]+=$")
_PIECES = re.compile(r"(?<=[.!?;])\s+|(?<=[\u3002\uff01\uff1f\uff1b])|\n+")


class KeywordSearch(Protocol):
    """What the hop asks of the index (a `VectorIndex`, or the history in hand: retrieval_unindexed.py)."""

    async def search(self, query: SearchQuery) -> SearchResult: ...


async def second_hop(
    index: KeywordSearch,
    query: SearchQuery,
    matched_terms: list[str],
    dates: dict[str, datetime | None],
    ranked: list[Candidate],
    path: list[HistoryItem],
    positions: dict[str, int],
    recent: set[str | None],
    texts: dict[str, str],
) -> tuple[list[str], int]:
    """A keyword search for each lead the best matches name (together); re-sorts `ranked` and adds the
    dates of what it finds to `dates`. Returns the terms searched and how many sources a find confirmed."""
    named = leads(query.text.lower(), matched_terms, ranked, path, positions, texts)
    if not named:
        return [], 0
    # The leads alone: with the question's words too, its feature words outranked the short statement
    # that answers it ("发票合并是 Ravi 的活"; design-zh -1.0 at 8,000 tokens, BENCHMARKS.md).
    # One search per lead, their hits interleaved: in one query of four leads, messages naming the common
    # ones ("us-west-2", "p99") filled its HOP_LIMIT before "doc.jobs has 12 partitions" (BENCHMARKS.md).
    found: list[list[IndexHit]] = [[] for _ in named]
    failed: list[StoreError] = []

    async def search(slot: int, lead: str) -> None:
        try:
            result = await index.search(replace(query, text=lead, vector=None, limit=HOP_LIMIT))
        except StoreError as exc:  # kept: a task group would wrap it in an ExceptionGroup
            failed.append(exc)
        else:
            found[slot] = result.keyword

    async with anyio.create_task_group() as group:
        for slot, lead in enumerate(named):
            group.start_soon(search, slot, lead)
    if failed:
        return [], 0  # the first hop's ranking stands
    # A find holding two leads comes once per lead and ranks for each, as the one query's scores summed.
    hits = [hit for row in itertools.zip_longest(*found) for hit in row if hit is not None]
    asked = Asked(
        topic(query.text, tuple(matched_terms)), tuple(matched_terms), asked_kinds(query.text.lower())
    )
    confirmed = follow(hits, named, ranked, path, positions, recent, texts, dates, asked)
    return list(named), confirmed


def leads(
    asked: str,
    matched_terms: list[str],
    ranked: list[Candidate],
    path: list[HistoryItem],
    positions: dict[str, int],
    texts: dict[str, str],
) -> dict[str, Candidate]:
    """The terms worth a second search (identifiers first, then names, HOP_TERMS at most), each with the
    match that named it; `asked` is the question in lower case."""
    sources, replies = _sources(asked, matched_terms, ranked, path, positions, texts)
    named: dict[str, Candidate] = {}
    names: set[str] = set()
    phrases: dict[str, Candidate] = {}
    # English sources that may lead by pairs of words, lower case (read only where nothing is named).
    unnamed_sources: list[tuple[str, Candidate]] = []
    whole: list[str] = []  # every message's text, read once, on first need
    said_by: list[tuple[int, Candidate, list[str]]] = []  # (order, source, its terms)

    def path_texts() -> list[str]:
        if not whole:
            whole.extend(message_text(item.message) for item in path)
        return whole

    for order, source in enumerate(sources):
        text = message_text(path[positions[source.node_id]].message)
        # An answer's first statement weighs apart from the rest: its link is all it names.
        parts = (
            answering(text, matched_terms) if source.node_id in replies else [linking(text, matched_terms)]
        )
        said = "\n".join(parts)
        for part in parts:
            its_names = capitalised_names(part)
            names.update(its_names)
            here = [t for t in named_terms(part) if not _asked(t, asked, matched_terms)]
            here = [t for t in here if _rare_or_linked(t, part, its_names, matched_terms, texts)]
            said_by.append((order, source, here))
        if order < HOP_FROM and _CJK_STRETCH.search(said):  # each is counted over the whole path
            phrases |= {p: source for p in cjk_phrases(said.lower(), asked, path_texts()) if p not in phrases}
        elif order < HOP_FROM and matched_terms:
            unnamed_sources.append((said.lower(), source))
    unnamed: set[str] = set()
    if candidates := names & {t for _, _, here in said_by for t in here}:
        # A capitalised word the path also says in lower case, or capitalises only where a sentence or
        # line starts ("Thinking about it", "Pulled the logs"), is no name: dropped before the weighing,
        # or "Confirmed that webhook-relay's consumer group reads doc.jobs." halves doc.jobs' weight.
        everything = "\n".join(path_texts())
        unnamed = {
            t for t in candidates if contains_term(everything, t) or not capitalised_inside(everything, t)
        }
    # (weight, order, term, source): a statement naming one thing beside the question's term is a link;
    # a line naming six (a DDL's columns, a log's fields) spreads its weight over them.
    weighed: list[tuple[float, int, str, Candidate]] = []
    for order, source, here in said_by:
        here = [t for t in here if t not in unnamed]
        weighed += [(1 / len(here), order, t, source) for t in here]
    for _, _, term, source in sorted(weighed, key=lambda w: (-w[0], w[1])):
        named.setdefault(term, source)
    ordered = {t: named[t] for t in sorted(named, key=names.__contains__)}
    if not ordered and unnamed_sources:
        # Pairs of words lead only where nothing is named: beside a host, the finds of "cron move" that
        # said "runs" went before the host's region (styles-ops-en, right after, BENCHMARKS.md).
        lowered = [text.lower() for text in path_texts()]
        for said, source in unnamed_sources:
            for pair in word_pairs(said, asked, lowered):
                ordered.setdefault(pair, source)
    return dict(list({**ordered, **phrases}.items())[:HOP_TERMS])


def _sources(
    asked: str,
    matched_terms: list[str],
    ranked: list[Candidate],
    path: list[HistoryItem],
    positions: dict[str, int],
    texts: dict[str, str],
) -> tuple[list[Candidate], set[str]]:
    """The matches leads are read from, in order, and those of them that answer a user's question."""
    # Matched by a search (not only a neighbour's), and holding the question's own terms if any do.
    searched = [c for c in ranked if c.views]
    # A turn that only asks about the question's terms (the same question asked before) states no link;
    # the answer to a user's turn naming them states it without repeating them ("what's the status of
    # frame-decoder?" -> "it's been replaced by batch-gate").
    replies = {c.node_id for c in searched if replies_about(c, path, positions, matched_terms)}
    own = [
        c for c in searched if c.node_id in replies or any(states(texts[c.node_id], t) for t in matched_terms)
    ]
    words = topic(asked, tuple(matched_terms))
    pool = (own or searched)[:HOP_POOL]
    # Read beside the question's terms, every source of the pool may hold the link; without terms, the
    # statements of the best HOP_FROM are read (a turn that asked the question again shares most words).
    if matched_terms:
        return sorted(pool, key=lambda c: -shared_words(texts[c.node_id], words)), replies  # stable
    return sorted(pool, key=lambda c: -shared_words(statements(texts[c.node_id]), words))[:HOP_FROM], replies


# Where a sentence or line starts: after these, past spaces, quotes, brackets and list marks.
_STARTS = frozenset(".!?:\n\u3002\uff01\uff1f\uff1a")
_OPENERS = " \t\"'([*->#\u201c\u2018"


def _rare_or_linked(
    term: str, said: str, its_names: tuple[str, ...], matched_terms: list[str], texts: dict[str, str]
) -> bool:
    """Whether `term` of a source's `said` may lead. Said all over the conversation (a speaker's name, a
    word like "keep-alive"): no, unless an identifier said beside the question's own term (a service named
    everywhere is still a link) other than a URL parameter's value ("?after=eyJpZCI6IDQyfQ": a cursor or a
    size, repeated in every example)."""
    # A plain word is a term in CJK text (any Latin word) or as an acronym ("JSON"), but one said all
    # over the chat ("runbook", "staging" under every answer) links nothing: it must be rare too.
    if matched_terms and term not in its_names and not query_value(said, term) and not _PLAIN.fullmatch(term):
        return True
    return _count(term, texts) <= HOP_COMMON


def capitalised_inside(text: str, name: str) -> bool:
    """Whether `text` says `name` (lower case) capitalised somewhere other than a sentence's or a line's
    start: a person or a product is named mid-sentence too ("thanks Sara", "ask Wang Fang")."""
    for match in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text, re.IGNORECASE):
        if not text[match.start()].isupper():
            continue
        before = text[max(0, match.start() - 16) : match.start()].rstrip(_OPENERS)
        if before and before[-1] not in _STARTS:
            return True
    return False


def _asked(term: str, asked: str, matched_terms: list[str]) -> bool:
    """The question holds `term`, or `term` holds one of its terms ("ix_refunds_status" of "refunds")."""
    return contains_term(asked, term) or any(t in term for t in matched_terms)


def _count(term: str, texts: dict[str, str]) -> int:
    return sum(term in text and contains_term(text, term) for text in texts.values())


def linking(said: str, terms: list[str]) -> str:
    """The sentences and lines of `said` that hold one of the question's `terms` (all of it if it has
    none): a link is stated beside the name it links from ("Root cause of INC-4666: shipment-svc."),
    where a table's DDL or a log names a dozen identifiers that lead nowhere in particular."""
    if not terms:
        return statements(said)
    pieces = [p for p in _PIECES.split(said) if any(contains_term(p.lower(), t) for t in terms)]
    return "\n".join(pieces) or said


def replies_about(
    candidate: Candidate, path: list[HistoryItem], positions: dict[str, int], terms: list[str]
) -> bool:
    """Whether `candidate` is the assistant's answer to a user's one question, naming one of `terms` (a
    turn that only mentions one asks nothing about it; one asking three things is answered on any)."""
    at = positions.get(candidate.node_id)
    if not terms or not at or path[at].message.get("role") != "assistant":
        return False
    before = path[at - 1].message
    if before.get("role") != "user":
        return False
    pieces = _PIECES.split(message_text(before).lower())
    questions = [p for p in pieces if p.rstrip().endswith(_QUESTION_MARKS)]
    return len(questions) == 1 and any(contains_term(questions[0], t) for t in terms)


def answering(said: str, terms: list[str]) -> list[str]:
    """Where an answer states its link, in parts weighed apart: its first statement ("Exactly one writer:
    tally-svc. It runs a COPY sensor_readings ..."), then the other sentences naming the question's
    `terms`; all of it where the first names nothing and no other names a term (a code block answers)."""
    pieces = [p for p in _PIECES.split(said) if p.strip()]
    first = next((p for p in pieces if not p.rstrip().endswith(_QUESTION_MARKS)), "")
    beside = [p for p in pieces if p != first and any(contains_term(p.lower(), t) for t in terms)]
    if not beside and not named_terms(first):
        return [said]
    return [first, "\n".join(beside)] if beside else [first]


def statements(said: str) -> str:
    """`said` without its questions: a turn asking what is asked again ("Also, which Postgres version
    runs the database that holds documents?") names what it was asked beside, not the answer."""
    return "\n".join(p for p in _PIECES.split(said) if not p.rstrip().endswith(_QUESTION_MARKS))


def cjk_phrases(said: str, asked: str, path_texts: list[str]) -> list[str]:
    """The rarest CJK_LEADS stretches of PHRASE characters of `said` (lower case) that the question does
    not hold and 1 to HOP_COMMON other messages of the path (`path_texts`) do."""
    pieces = {
        run[i : i + PHRASE]
        for run in _CJK_STRETCH.findall(said)
        for i in range(len(run) - PHRASE + 1)
        if run[i : i + PHRASE] not in asked
    }
    if not pieces:
        return []
    held = {p: sum(p in text for text in path_texts) for p in pieces}
    # Held by the source itself and at least one other message, and by few.
    rare = sorted((n, p) for p, n in held.items() if 2 <= n <= HOP_COMMON + 1)
    return [p for _, p in rare[:CJK_LEADS]]


def word_pairs(said: str, asked: str, path_texts: list[str]) -> list[str]:
    """The rarest CJK_LEADS pairs of plain words next to each other in `said` (lower case), neither a
    function word nor a word of the question, that 2 to HOP_COMMON + 1 messages of the path (`path_texts`,
    lower case) hold: the source itself and a few others."""
    pairs: set[str] = set()
    previous = ""
    for raw in said.split():
        word = raw.strip(_EDGES)
        plain = (
            _PLAIN.fullmatch(word) is not None
            and word not in _FUNCTION_WORDS
            and not contains_term(asked, word)
        )
        if plain and previous and raw.startswith(word):
            pairs.add(f"{previous} {word}")
        # Punctuation ends the run: "merge, the queue" pairs nothing across the comma.
        previous = word if plain and raw.endswith(word) else ""
    if not pairs:
        return []
    held = {p: sum(p in text and contains_term(text, p) for text in path_texts) for p in pairs}
    rare = sorted((n, p) for p, n in held.items() if 2 <= n <= HOP_COMMON + 1)
    return [p for _, p in rare[:CJK_LEADS]]


class Asked(NamedTuple):
    """What a question asks, as its second hop's finds are read for it."""

    words: frozenset[str]  # its topic words (`topic`)
    terms: tuple[str, ...]  # its exact terms
    kinds: tuple[re.Pattern[str], ...] = ()  # the kinds of value it asks for (answer_kinds.py)


_NOTHING_ASKED = Asked(frozenset(), ())


def follow(
    hits: list[IndexHit],
    named: dict[str, Candidate],
    ranked: list[Candidate],
    path: list[HistoryItem],
    positions: dict[str, int],
    recent: set[str | None],
    texts: dict[str, str],
    dates: dict[str, datetime | None],
    asked: Asked = _NOTHING_ASKED,
) -> int:
    """Rank the second search's keyword `hits` that hold a lead into `ranked` (re-sorted), below the
    match that named them; a hit new to the ranking joins it. A hit that also says what was `asked`
    (the question's topic words, its terms) ranks before those that do not and confirms the link: its
    source gains as much as it does. A user's turn the best lead found that says nothing of it brings
    the assistant's answer after it (`_answer_after`). Returns how many sources were confirmed."""
    by_node = {c.node_id: c for c in ranked}
    confirmed: set[str] = set()
    finds: list[tuple[IndexHit, list[str], Saying]] = []  # (hit, the leads it holds, what it says)
    first = next(iter(named), "")  # the best lead: its finds' answers come with them
    for hit in hits:
        # A message alone: a view with neighbours ranks a run of messages that all name the lead above the
        # one statement that says what the lead is ("etl-07 sits in the eu-west-1 rack").
        if hit.view != OWN_VIEW or hit.node_id not in positions or hit.node_id in recent:
            continue
        text = texts.get(hit.node_id)
        if text is None:
            text = texts[hit.node_id] = message_text(path[positions[hit.node_id]].message).lower()
        held = [t for t, s in named.items() if _holds(text, t) and s.node_id != hit.node_id]
        if not held:
            continue  # matched a piece of a term only ("etl" of "etl-07")
        finds.append((hit, held, saying(text, held, asked)))
    # The finds that say what was asked first: a lead named all over the path ("fx-rates") put its one
    # linking statement ("fx-rates 的源码在 git/ledger") tenth among its finds, at a tenth of the share.
    finds.sort(key=lambda find: find[2].order)  # stable: keyword order within each kind
    for rank, (hit, held, said) in enumerate(finds):
        sources_of = [named[t] for t in held]
        candidate = by_node.get(hit.node_id)
        if candidate is None:
            candidate = by_node[hit.node_id] = Candidate(hit.node_id, created_at=hit.created_at)
            ranked.append(candidate)
        share = HOP_SHARE * max(s.score for s in sources_of) / (1 + rank)
        candidate.score += share
        if said.whole:
            for source in sources_of:  # once each, for its best confirming find
                if source.node_id not in confirmed:
                    confirmed.add(source.node_id)
                    source.score += share
        candidate.views.append(hit.view)
        dates.setdefault(hit.node_id, hit.created_at if hit.dated else None)
        if not said.beside and first in held:
            _answer_after(hit, share, by_node, ranked, path, positions, recent)
    ranked.sort(key=lambda c: c.score, reverse=True)
    return len(confirmed)


def _answer_after(
    find: IndexHit,
    share: float,
    by_node: dict[str, Candidate],
    ranked: list[Candidate],
    path: list[HistoryItem],
    positions: dict[str, int],
    recent: set[str | None],
) -> None:
    """A user's turn found by its lead that does not say what was asked ("gridcast inserts row by row,
    so slow" for how many rows it writes a batch) is answered by the assistant's turn after it: that
    gains as much, dated as the turn it answers (the same exchange) where no hit dated it."""
    at = positions[find.node_id]
    if at + 1 >= len(path) or path[at].message.get("role") != "user":
        return
    reply = path[at + 1]
    if reply.message.get("role") != "assistant" or reply.node_id is None or reply.node_id in recent:
        return
    candidate = by_node.get(reply.node_id)
    if candidate is None:
        when = find.created_at if find.dated else None
        candidate = by_node[reply.node_id] = Candidate(reply.node_id, created_at=when)
        ranked.append(candidate)
    candidate.score += share


@dataclass(frozen=True, slots=True)
class Saying:
    """What a find of the second hop says: what was asked, in a statement holding its lead (`beside`) or
    anywhere in it (`whole`); or only asks about its lead (`asks`: "does it hit otp-sender?")."""

    beside: bool
    whole: bool
    asks: bool

    @property
    def order(self) -> tuple[bool, bool, bool]:
        """Finds sort by this: saying it beside the lead first, then anywhere, questions last."""
        return (not self.beside, not self.whole, self.asks)


def saying(text: str, leads: list[str], asked: Asked) -> Saying:
    """What a find's `text` (lower case) holding `leads` says of what was `asked` (topic words, terms,
    the kinds of value asked for: a hosts file line gives "the private IP").
    A long turn shares a topic word somewhere ("error codes" for "the code behind") and asks about the
    lead elsewhere ("does it hit otp-sender?"): "otp-sender's code is in git/billing-edge" says it beside
    the lead and comes before that turn, which still comes before a statement saying no word of it."""
    words, terms, kinds = asked

    def says(part: str) -> bool:
        return bool(
            shared_words(part, words) or any(contains_term(part, t) for t in terms) or holds_kind(part, kinds)
        )

    pieces = [p for p in _PIECES.split(text) if any(_holds(p, t) for t in leads)] or [text]
    stated = "\n".join(p for p in pieces if not p.rstrip().endswith(_QUESTION_MARKS))
    return Saying(beside=bool(stated) and says(stated), whole=says(text), asks=not stated)


def query_value(said: str, term: str) -> bool:
    """Whether `said` writes `term` (lower case) only as a URL query parameter's value ("?after=...")."""
    lowered = said.lower()
    spots = [m.start() for m in re.finditer(rf"(?<![\w-]){re.escape(term)}(?![\w-])", lowered)]
    return bool(spots) and all(_QUERY_KEY.search(lowered, max(0, at - 64), at) for at in spots)


def _holds(text: str, term: str) -> bool:
    """`term` in `text` as a whole token, or anywhere for a CJK phrase (its words are not spaced)."""
    return term in text if _CJK_STRETCH.fullmatch(term) else contains_term(text, term)
