"""The newest decisions on the question's topic, first, for a question about where something stands now;
the newest reports that something was done, first, for a question asking on which day it was.

A decision revised twice is often settled in words of its own ("where the deploy thing landed",
"键格式那件事最后还是定了 UUIDv7"): the newest statement names neither the service nor the question's
phrase, so both rankings put the older statements, which do, above it. Here the messages outside the
window that read as a decision ("settled", "agreed", "final", "定了", "结论"...) and share a topic word
with the question (its words other than the names it asks about and the asking itself) are found on
the path, and `PROMOTED` of them go first: those naming what the question asks about, then those that
share a person with one of these (the same decision settled by the one who asked for its revision), then
those that name no other service (the newest decision on a topic is often another service's), newest
first within each (BENCHMARKS.md, issue 28: revised questions). A report that something was done is
as loose ("the DNS cutover: shipped" for "when did we actually cut DNS for plan-api over?") and is found
the same way, by its own words (`COMPLETION`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.question import (
    STEM,
    capitalised_names,
    contains_term,
    inner_names,
    kebab_names,
    shared_words,
)
from gateway.pipeline.context.ranking import Candidate
from gateway.text import message_text

PROMOTED = 2
# A sentence ends at ". ", "? " or "! ", or at the full-width stop, question and exclamation marks (CJK
# text leaves no space after them); not at an ellipsis, which trails on ("about the format... landing
# on protobuf").
_SENTENCES = re.compile(r"(?<=[.!?])(?<!\.\.\.)\s+|(?<=[\u3002\uff01\uff1f])\s*|\n+")
_ASKED = ("?", "\uff1f")
DECISIONS_SEEN = 24  # the newest decisions on the topic looked at (the window's included: they link people)
_DECISION = re.compile(
    r"\b(?:decid(?:e|es|ed|ing)|decision|settl(?:e|es|ed|ing)|agree(?:s|d|ing)?|final(?:ly)?|"
    r"go(?:es|ing)? with|went with|land(?:s|ed|ing)? on|landed|stick(?:s|ing)? with|stuck with|approved?|"
    r"conclu(?:ded|sion)|chose|chosen|picked|switch(?:es|ed|ing)? to|chang(?:e|es|ed|ing) (?:it )?to|"
    r"sign(?:s|ed)? off)\b|"
    r"定了|定下|最后定|最後定|决定|決定|结论|結論|最终|最終|批了|批准|敲定|拍板|商量好|商定|说好了|說好了|就这么定|"
    r"就這麼定|确定|確定|采用|採用|改成|改为|改為|选了|選了|"
    r"결정|확정|합의"
)

# Done, not planned nor asked: "shipped", "went out", "搞定", "上线了"; not where the sentence says it is
# not ("isn't done yet", "还没上线").
_DONE = re.compile(
    r"\b(?:shipped|done|finished|completed|went (?:out|live)|(?:is|are|now) live|rolled out|deployed|"
    r"happened|did it|wrapped up|cut over)\b|"
    r"已完成|完成了|做完|搞定|弄完|上线了|已上线|发布了|已发布|切完|切好了|完工|"
    r"완료|끝났|배포했"
)
_NOT_YET = re.compile(r"\b(?:not|never|yet)\b|n't\b|还没|還沒|没有|沒有|未|아직|안 ")


class Statement(NamedTuple):
    """What a promoted message states: a sentence matching `said`, and not `unless`; with `others`, also
    one naming another service only (the newest decision on a topic is often another service's; a report
    that another service's move is done answers nothing about this one's)."""

    said: re.Pattern[str]
    unless: re.Pattern[str] | None = None
    others: bool = True

    def states(self, sentence: str) -> bool:
        return bool(self.said.search(sentence)) and not (self.unless and self.unless.search(sentence))


DECISION = Statement(_DECISION)
COMPLETION = Statement(_DONE, _NOT_YET, others=False)


def promote_statements(
    ranked: list[Candidate],
    words: frozenset[str],
    names: tuple[str, ...],
    path: list[HistoryItem],
    recent: set[str | None],
    lowered: Callable[[HistoryItem], str],
    statement: Statement = DECISION,
) -> list[str]:
    """Put PROMOTED decisions (or other `statement`s: COMPLETION) on `words` (outside `recent`) first in
    `ranked` (best first), adding them when no search found them; the ids promoted. Those that name what the question asks about (`names`, its
    exact terms) go first, then those that share a person with such a decision (a revision "after Sara's
    review" settled by "Sara approved: ..."), then those naming no other service, then the rest, newest
    first within each."""
    if not words:
        return []
    decisions: list[tuple[int, HistoryItem]] = []
    naming: set[int] = set()  # those whose deciding sentence names what the question asks about
    elsewhere: set[int] = set()  # those that name another service and not this one
    asked = set(names)
    for at in range(len(path) - 1, -1, -1):
        item = path[at]
        if len(decisions) == DECISIONS_SEEN:
            break
        text = lowered(item)
        if item.node_id is None or not statement.said.search(text):  # most messages: one search, no split
            continue
        # Stated, not asked: a question asked in passing ("where did we land on X?") decides nothing.
        said = [t for t in _SENTENCES.split(text) if t.strip() and not t.rstrip().endswith(_ASKED)]
        if decided := [t for t in said if statement.states(t) and shared_words(t, words)]:
            decisions.append((at, item))
            if any(contains_term(t, n) for t in decided for n in names):
                naming.add(at)
            elif any(kebab_names(t) - asked for t in decided):
                elsewhere.add(at)
    people = {word for at, item in decisions if at in naming for word in _people(item)}

    def kind(at: int, item: HistoryItem) -> int:
        if at in naming:
            return 3
        if people & _people(item):
            return 2
        return int(at not in elsewhere)

    eligible = [
        (kind(at, item), at, item.node_id)
        for at, item in decisions
        if item.node_id not in recent and (statement.others or at not in elsewhere)
    ]
    chosen = [str(node_id) for _, _, node_id in sorted(eligible, reverse=True)[:PROMOTED]]
    if not chosen:
        return []
    top = ranked[0].score if ranked else 0.0
    by_id = {c.node_id: c for c in ranked}
    for rank, node_id in enumerate(chosen):
        candidate = by_id.get(node_id)
        if candidate is None:
            candidate = Candidate(node_id)
            ranked.append(candidate)
        # Above the best, in the order chosen: the groups are made in this order.
        candidate.score = top + (PROMOTED - rank) * 1e-3
    ranked.sort(key=lambda c: c.score, reverse=True)
    return chosen


def without_people(words: frozenset[str], question: str) -> frozenset[str]:
    """The topic `words` but for the people `question` names: what was done, not who did it ("when did
    Caroline go to the support group?": every turn of Caroline's would share her name). An acronym
    ("DNS") stays."""
    people = {
        word[:STEM] for name in inner_names(question) for word in name.split() if word.upper() not in question
    }
    return words - people


def _people(item: HistoryItem) -> set[str]:
    """The words of the capitalised names a message holds ("After Sara" counts "sara")."""
    return {word for name in capitalised_names(message_text(item.message)) for word in name.split()}
