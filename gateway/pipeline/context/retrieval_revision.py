"""The newest decisions on the question's topic, first, for a question about where something stands now.

A decision revised twice is often settled in words of its own ("where the deploy thing landed",
"键格式那件事最后还是定了 UUIDv7"): the newest statement names neither the service nor the question's
phrase, so both rankings put the older statements, which do, above it. Here the messages outside the
window that read as a decision ("settled", "agreed", "final", "定了", "结论"...) and share a topic word
with the question (its words other than the names it asks about and the asking itself) are found on
the path, and the newest `PROMOTED` of them go first (BENCHMARKS.md, issue 28: revised questions).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.ranking import Candidate
from gateway.text import CJK

PROMOTED = 2
_DECISION = re.compile(
    r"\b(?:decid(?:e|ed|ing)|decision|settled?|agreed?|final(?:ly)?|going with|go with|landed|approved?|"
    r"conclu(?:ded|sion)|chose|chosen|picked|switch(?:ed)? to|chang(?:e|ed) (?:it )?to|sign(?:ed)? off)\b|"
    r"定了|定下|决定|決定|结论|結論|最终|最終|批了|批准|敲定|确定|確定|采用|採用|改成|改为|改為|选了|選了|"
    r"결정|확정|합의"
)
_WORD = re.compile(r"[a-z][a-z0-9]{2,}")
_CJK_RUN = re.compile(f"[{CJK}]+")
# Words of the asking, not of the topic ("what is the current X", "X 最后定的是什么").
_ASKING = frozenset(
    [
        "what",
        "which",
        "who",
        "whom",
        "how",
        "when",
        "where",
        "why",
        "did",
        "does",
        "do",
        "is",
        "are",
        "was",
        "were",
        "the",
        "for",
        "with",
        "and",
        "our",
        "we",
        "you",
        "current",
        "currently",
        "now",
        "latest",
        "final",
        "finally",
        "end",
        "ended",
        "settled",
        "settle",
        "landed",
        "moment",
        "these",
        "days",
        "still",
        "use",
        "used",
        "using",
        "have",
        "has",
        "had",
        "there",
        "that",
        "this",
        "right",
        "today",
        "going",
        "end",
    ]
)
_ASKING_CJK = frozenset("的是什么现在目前当前最后终定了哪个呢吗在用还")
_STEM = 4  # "retry" and "retries", "log" and "logs": words are compared by their first four letters


def topic(question: str, names: tuple[str, ...]) -> frozenset[str]:
    """The question's topic words, lower case: Latin words by their stems, CJK runs by their bigrams,
    without the names it asks about (`names`, its exact terms) and the words of asking."""
    lowered = question.lower()
    for name in names:
        lowered = lowered.replace(name, " ")
    words = {w[:_STEM] for w in _WORD.findall(lowered) if w not in _ASKING}
    for run in _CJK_RUN.findall(lowered):
        words |= {run[i : i + 2] for i in range(len(run) - 1) if not _ASKING_CJK & set(run[i : i + 2])}
    return frozenset(words)


def _shares(text: str, words: frozenset[str]) -> bool:
    found = _WORD.findall(text)
    # A three-letter word ("log", "fix") is found by the first three letters of a longer one.
    stems = {w[:_STEM] for w in found} | {w[:3] for w in found}
    return any(w in stems or (len(w) == 2 and w in text) for w in words)


def promote_decisions(
    ranked: list[Candidate],
    words: frozenset[str],
    path: list[HistoryItem],
    recent: set[str | None],
    lowered: Callable[[HistoryItem], str],
) -> list[str]:
    """Put the newest PROMOTED decisions on `words` (outside `recent`) first in `ranked` (best first),
    adding them when no search found them; the ids promoted, newest first."""
    if not words:
        return []
    chosen: list[str] = []
    for item in reversed(path):
        if len(chosen) == PROMOTED:
            break
        if item.node_id is None or item.node_id in recent:
            continue
        text = lowered(item)
        if _DECISION.search(text) and _shares(text, words):
            chosen.append(item.node_id)
    if not chosen:
        return []
    top = ranked[0].score if ranked else 0.0
    by_id = {c.node_id: c for c in ranked}
    for rank, node_id in enumerate(chosen):
        candidate = by_id.get(node_id)
        if candidate is None:
            candidate = Candidate(node_id)
            ranked.append(candidate)
        # Above the best, the newest highest: the groups are made in this order.
        candidate.score = top + (PROMOTED - rank) * 1e-3
    ranked.sort(key=lambda c: c.score, reverse=True)
    return chosen
