"""Pure ranking for the retrieval section: reciprocal-rank fusion of the semantic and keyword rankings,
the score each hit lends to the messages beside it, the weight of exact terms and recency, and the
turns of a participant the question names."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.question import contains_term, topic
from gateway.records import IndexHit, SearchResult
from gateway.text import mostly_cjk

RRF_K = 30  # measured on LoCoMo (benchmarks/locomo.py): 30 ranked a little better than the usual 60
NEIGHBOUR_SHARE = 0.5
# An exact term of the question held by more of the candidates than this weighs proportionally less.
RARE_TERM = 4
# Recency's weight (in reciprocal-rank units over the path) for a question about how things stand now;
# 0.1 otherwise, a tie-breaker.
CURRENT_RECENCY = 1.0
# A transcript of several people ("Melanie: I'm off to go swimming with the kids"): a question naming one
# of them asks about what that one said or did, so their own turns weigh this much more (reciprocal-rank
# units). LoCoMo dev, replayed: 89.2 % at 0, 90.5 at 1.0, 90.9 at 2.0 (BENCHMARKS.md, issue 28).
SPEAKER_WEIGHT = 2.0
# A label is a participant's only where it starts this share of the candidates (two people: about half
# each), so "Error: ..." or "Note: ..." opening a few messages is none.
SPEAKER_SHARE = 0.2
SPEAKER_MIN = 3
# The last messages of a request (or path) whose labels say who a transcript's participants are, for
# `for_meaning` before any candidate is found.
READ_FOR_SPEAKERS = 32
# Two characters at least: "Q:" and "A:" label no one a question could name ("what is a good place?").
_LABEL = re.compile(r"([^\W\d_][\w'.-]{1,40}(?: [^\W\d_][\w'.-]{0,40})?) ?[:\uff1a] ?")


# An English-only model's share of the ranking on a question mostly in CJK (benchmarks/workchat.py).
FOREIGN_SEMANTIC_WEIGHT = 0.25
# The ranking by meaning's share where the question names no exact term ("what worried us about moving
# session handling to the edge?"): its words match by keyword wherever they are said. 2 on LoCoMo dev
# 92.5 -> 93.0 and blind-en 90.8 -> 91.3; 3 and 5 gave LoCoMo 92.6 and 91.5 (BENCHMARKS.md, session 42).
TERMLESS_SEMANTIC_WEIGHT = 2.0


@dataclass(slots=True)
class Candidate:
    node_id: str
    score: float = 0.0
    created_at: datetime | None = None
    conversation_id: str = ""
    views: list[str] = field(default_factory=list)


def fuse(result: SearchResult, semantic_weight: float = 1.0) -> list[Candidate]:
    """Reciprocal-rank fusion over both rankings: every view of a message adds to its score by meaning,
    its best view alone by keyword (`best_views`)."""
    by_node: dict[str, Candidate] = {}

    def add(hits: list[IndexHit], weight: float = 1.0) -> None:
        for rank, hit in enumerate(hits):
            candidate = by_node.get(hit.node_id)
            if candidate is None:  # not setdefault: that makes a candidate for every hit
                candidate = by_node[hit.node_id] = Candidate(hit.node_id)
            candidate.score += weight / (RRF_K + rank)
            # An undated hit (history that arrived at once) has no date to show.
            candidate.created_at = candidate.created_at or (hit.created_at if hit.dated else None)
            candidate.conversation_id = hit.conversation_id
            candidate.views.append(hit.view)

    add(result.semantic, semantic_weight)
    add(best_views(result.keyword))
    return sorted(by_node.values(), key=lambda c: c.score, reverse=True)


def semantic_weight(question: str, terms: tuple[str, ...], english_only: bool, embedded: bool) -> float:
    """The weight of the ranking by meaning in `fuse` for `question` with its exact `terms`; more without
    terms only where the history is `embedded` (a history still waiting for its vectors is ranked by
    meaning in part: blind-en's open-domain questions right after it arrived, 48.9 -> 44.4 with it)."""
    if english_only and mostly_cjk(question):
        return FOREIGN_SEMANTIC_WEIGHT
    return TERMLESS_SEMANTIC_WEIGHT if not terms and embedded else 1.0


def best_views(hits: list[IndexHit]) -> list[IndexHit]:
    """Each message's first hit only, ranked among messages. By keyword a message's views and its
    neighbours' repeat the same words: an earlier message that asked the question in passing took five
    places above the short answer naming the same two words (BENCHMARKS.md, session 29)."""
    first: dict[str, IndexHit] = {}
    for hit in hits:
        first.setdefault(hit.node_id, hit)
    return list(first.values())  # in the order first seen


def smoothed(
    hits: list[Candidate], path: list[HistoryItem], positions: dict[str, int], recent: set[str | None]
) -> list[Candidate]:
    """Evidence sits next to what matched (an answer beside its question, a fact beside the remark
    that mentions it): every hit lends NEIGHBOUR_SHARE of its fused score to the messages either side,
    which may rank a message no search returned."""
    by_position: dict[int, Candidate] = {}
    for hit in hits:
        at = positions[hit.node_id]
        here = by_position.get(at)
        if here is None:
            here = by_position[at] = Candidate(hit.node_id, created_at=hit.created_at)
        here.score += hit.score
        here.views += hit.views
        for near in (at - 1, at + 1):
            node_id = path[near].node_id if 0 <= near < len(path) else None
            if node_id is None or node_id in recent:
                continue
            # Its own date only (a neighbour may be from another day): the group finds one later.
            neighbour = by_position.get(near)
            if neighbour is None:
                neighbour = by_position[near] = Candidate(node_id)
            neighbour.score += NEIGHBOUR_SHARE * hit.score
    return list(by_position.values())


def term_weights(terms: Iterable[str], texts: dict[str, str]) -> dict[str, float]:
    """The question's exact terms that the candidates' `texts` (lower case) hold, sorted, each weighing
    most where few hold it (an error code said once picks its message out, a name said every other
    turn hardly ranks anything)."""
    holding = {t: sum(t in text and contains_term(text, t) for text in texts.values()) for t in terms}
    return {
        t: 2.0 / RRF_K * min(1.0, RARE_TERM / holding[t]) for t in sorted(t for t, n in holding.items() if n)
    }


def acronyms_held(acronyms: Iterable[str], texts: dict[str, str], raw: Callable[[str], str]) -> list[str]:
    """The `acronyms` (lower case) that a candidate writes in capitals ("killing the DLQ"): `texts` the
    candidates' lower-cased texts by node, `raw` a node's own text."""
    return [
        a
        for a in acronyms
        if any(
            a in text and contains_term(text, a) and contains_term(raw(n), a.upper())
            for n, text in texts.items()
        )
    ]


def boost(
    ranked: list[Candidate],
    texts: dict[str, str],
    weights: dict[str, float],
    positions: dict[str, int],
    path_length: int,
    recency: float,
) -> None:
    """Add each candidate's exact terms' weights and its recency (`recency` reciprocal ranks at the
    newest message), then sort `ranked` best first."""
    for c in ranked:
        text = texts[c.node_id]
        c.score += sum(w for t, w in weights.items() if t in text and contains_term(text, t))
        c.score += recency / RRF_K * positions[c.node_id] / max(path_length, 1)
    ranked.sort(key=lambda c: c.score, reverse=True)


def participants(texts: Iterable[str]) -> set[str]:
    """The speaker labels (lower case) that open at least SPEAKER_SHARE of these texts."""
    labels: Counter[str] = Counter()
    count = 0
    for text in texts:
        count += 1
        label = _LABEL.match(text)
        if label is not None:
            labels[label.group(1)] += 1
    floor = max(SPEAKER_MIN, SPEAKER_SHARE * count)
    return {label for label, n in labels.items() if n >= floor}


def favour_speaker(ranked: list[Candidate], texts: dict[str, str], question: str) -> str | None:
    """Where the (lower-cased) question names exactly one participant of a transcript, that one's own
    turns go up by SPEAKER_WEIGHT and `ranked` is sorted again; the participant, or None."""
    named = [
        label
        for label in participants(texts.values())
        if (label in question if mostly_cjk(label) else contains_term(question, label))
    ]
    if len(named) != 1:  # none, or a question about two people: neither one's turns come first
        return None
    for c in ranked:
        label = _LABEL.match(texts[c.node_id])
        if label is not None and label.group(1) == named[0]:
            c.score += SPEAKER_WEIGHT / RRF_K
    ranked.sort(key=lambda c: c.score, reverse=True)
    return named[0]


def for_meaning(question: str, texts: Iterable[str]) -> str:
    """The question as the search by meaning reads it: without the names of the participants it names
    (`participants` of the lower-cased recent `texts`). A label opens every turn of its speaker, so by
    meaning the name matched all their turns alike and buried the topic (LoCoMo dev, each message's own
    vector: multi-hop evidence in the top 40, 43 -> 64 %); `favour_speaker` still puts their turns first.
    The question as it is where no topic word would be left ("Who is Caroline?")."""
    lowered = question.lower()
    named = [n for n in participants(texts) if (n in lowered if mostly_cjk(n) else contains_term(lowered, n))]
    if not named or not topic(question, tuple(named)):
        return question
    # A Latin name is a whole word, its possessive with it ("Melanie's", "James'"); a CJK one is not.
    spelled = "|".join(
        re.escape(n) if mostly_cjk(n) else rf"(?<![^\W\d_]){re.escape(n)}(?:['\u2019]s?)?(?![^\W\d_])"
        for n in sorted(named, key=len, reverse=True)
    )
    return " ".join(re.sub(spelled, " ", question, flags=re.I).split())
