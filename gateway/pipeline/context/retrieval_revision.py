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
from gateway.pipeline.context.question import shared_words
from gateway.pipeline.context.ranking import Candidate

PROMOTED = 2
_DECISION = re.compile(
    r"\b(?:decid(?:e|ed|ing)|decision|settled?|agreed?|final(?:ly)?|going with|go with|landed|approved?|"
    r"conclu(?:ded|sion)|chose|chosen|picked|switch(?:ed)? to|chang(?:e|ed) (?:it )?to|sign(?:ed)? off)\b|"
    r"定了|定下|决定|決定|结论|結論|最终|最終|批了|批准|敲定|确定|確定|采用|採用|改成|改为|改為|选了|選了|"
    r"결정|확정|합의"
)


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
        if _DECISION.search(text) and shared_words(text, words):
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
