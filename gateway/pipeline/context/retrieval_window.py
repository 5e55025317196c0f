"""Whether an old message matches the question better than anything the recent window holds: then the
window is not what answers it, even where it names the question's terms ("Which port does tenant-admin
listen on?" with tenant-admin said a few turns ago and its port said 150 turns back). Such questions had
gone without a tail (BENCHMARKS.md, issue 28: 4 of 305 on the English work chats, at every budget)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.pipeline.context.retrieval_unindexed import RankViews

# The best-ranked old messages compared with the window: the answer is among the first few when it is old.
OLD_COMPARED = 20


def old_outranks_window(rank: RankViews, question: str, window: Sequence[str], old: Sequence[str]) -> bool:
    """Whether BM25 over the window's messages and the `old` ones (best ranked first) together scores an
    old one above the best of the window (a tie, a statement repeated, leaves it to the window). An empty
    text between any two keeps each message to its own view."""
    old = old[:OLD_COMPARED]
    if not old:
        return False
    texts = [t for text in (*window, *old) for t in (text, "")]
    best_window = best_old = 0.0
    for at, _, score in rank(question, texts, len(texts)):
        if at < 2 * len(window):
            best_window = max(best_window, score)
        else:
            best_old = max(best_old, score)
    return best_old > best_window
