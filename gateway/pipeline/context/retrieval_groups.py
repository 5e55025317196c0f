"""The retrieval section's groups: each ranked hit expanded into a span of its neighbours, never splitting
a tool call from its results, never repeating what the window or another group holds, fitted to the
allowance best first. Pure: token counts come in through `line_tokens`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.question import contains_term, exact_terms
from gateway.pipeline.context.ranking import Candidate
from gateway.pipeline.context.tail_lines import Line, day_changes, day_of, lines_of, tool_safe
from gateway.ports import JSONObject
from gateway.text import message_text

DATE_LINE_TOKENS = 12  # "[2023-05-08 13:56]" and its line break
SEPARATOR_TOKENS = 2  # the line break or "…" between groups
MIN_GROUP_TOKENS = 12  # less room than this holds no message


@dataclass(slots=True)
class Group:
    start: int  # positions in the path, inclusive
    end: int
    score: float
    created_at: datetime | None
    tokens: int = 0
    lines: list[Line] = field(default_factory=list)
    label: str = ""  # the conversation, for groups from another one


def groups_of(
    path: list[HistoryItem],
    positions: dict[str, int],
    ranked: Sequence[Candidate],
    recent: set[int],
    allowance: int,
    dates: dict[str, datetime | None],
    before: int,
    after: int,
    used: int,
    above: str,
    line_tokens: Callable[[HistoryItem], int],
    grouped: int | None = None,
) -> list[Group]:
    """Groups for the `ranked` hits, best first, within `allowance` tokens of which `used` are spent:
    `before` and `after` messages either side of each of the first `grouped` groups (all when None), the
    later hits alone, none of the positions in `recent`, none whose identifiers `above` (the summary,
    lower case) already says. `line_tokens` counts a message's line and the line break after it."""
    taken: set[int] = set(recent)
    groups: list[Group] = []
    days: set[date | None] = set()
    for candidate in ranked:
        at = positions[candidate.node_id]
        if at in taken:
            continue
        if used + line_tokens(path[at]) + SEPARATOR_TOKENS - 1 > allowance:
            # Not even its own line fits: skipped before its group is worked out, the common case late on.
            continue
        if above and said_above(path[at].message, above):
            continue  # every identifier of it is in the summary verbatim: it adds nothing
        # Past the best few, a hit comes alone: its neighbours cost twice its room and seldom hold what a
        # lower-ranked hit was found for, while more hits do (BENCHMARKS.md, issue 28).
        reach = (before, after) if grouped is None or len(groups) < grouped else (0, 0)
        start, end = tool_safe(path, max(at - reach[0], 0), min(at + reach[1], len(path) - 1))
        span = [i for i in range(start, end + 1) if i not in taken]
        if not span:
            continue
        # Keep the span contiguous: stop at the first message another group (or the window) holds.
        start = max([i for i in range(start, at) if i in taken], default=start - 1) + 1
        end = min([i for i in range(at + 1, end + 1) if i in taken], default=end + 1) - 1
        start, end = tool_safe(path, start, end)
        if any(i in taken for i in range(start, end + 1)):
            continue  # a tool step could not be kept whole here
        # Labelled by the first of its messages with a known date: a neighbour may be from another day.
        span_ids = [path[i].node_id for i in range(start, end + 1)]
        when = next((dates[i] for i in span_ids if i is not None and i in dates), candidate.created_at)
        group = Group(start, end, candidate.score, when)
        # Only the first group of a day pays for its date line; the whole text is counted exactly later.
        day = day_of(when)
        date_line = DATE_LINE_TOKENS if day not in days else 0
        group.tokens = sum(line_tokens(path[i]) for i in range(start, end + 1))
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


def other_group(items: list[HistoryItem], candidate: Candidate, label: str, tokens: int) -> Group:
    """A group from another conversation: all of `items` (the match and the messages before it)."""
    group = Group(0, len(items) - 1, candidate.score, candidate.created_at)
    group.label = label
    group.lines = lines_of(items, 0, len(items) - 1)
    group.tokens = tokens + DATE_LINE_TOKENS + SEPARATOR_TOKENS
    return group


def said_above(message: JSONObject, above: str) -> bool:
    """Whether the summary text `above` (lower case) already says `message`: all of it, or every one of
    its exact terms."""
    text = message_text(message).strip().lower()
    terms = exact_terms(text)
    return (len(text) >= 20 and text in above) or (
        bool(terms) and all(contains_term(above, t) for t in terms)
    )
