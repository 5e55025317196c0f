"""The retrieval section's text: each group's lines (a message per line, a date line where the day
changes), kept whole around tool calls."""

from __future__ import annotations

from datetime import date, datetime

from gateway.pipeline.call import HistoryItem
from gateway.text import message_text

# A line of the section's text: the line, and the stored message it shows (None: a date line).
Line = tuple[str, str | None]


def tool_safe(path: list[HistoryItem], start: int, end: int) -> tuple[int, int]:
    """Widen [start, end] so no tool result is shown without the call that asked for it, and no call
    without its results."""
    while start > 0 and path[start].message.get("role") == "tool":
        start -= 1
    # Results follow their call: take every tool message after the end (a call's, or its siblings').
    while end + 1 < len(path) and path[end + 1].message.get("role") == "tool":
        end += 1
    return start, end


def day_changes(
    path: list[HistoryItem], start: int, end: int, dates: dict[str, datetime | None], day: date | None
) -> dict[int, datetime | None]:
    """Where inside [start, end] its messages' own dates (as far as known) move to another day than the
    group's label says: position -> the date to show on a line before it."""
    marks: dict[int, datetime | None] = {}
    for i in range(start, end + 1):
        node_id = path[i].node_id
        if node_id is not None and node_id in dates and day_of(dates[node_id]) != day:
            day = day_of(dates[node_id])
            marks[i] = dates[node_id]
    return marks


def lines_of(
    path: list[HistoryItem], start: int, end: int, marks: dict[int, datetime | None] | None = None
) -> list[Line]:
    """The messages' lines, with a date line before each position in `marks`."""
    lines: list[Line] = []
    for i in range(start, end + 1):
        if marks and i in marks:
            lines.append((f"[{when(marks[i])}]", None))
        lines.append((line_of(path[i]), path[i].node_id))
    return lines


def line_of(item: HistoryItem) -> str:
    return f"{item.message.get('role')}: {message_text(item.message)}"


def when(created_at: datetime | None) -> str:
    return f"{created_at:%Y-%m-%d %H:%M}" if created_at is not None else "date unknown"


def day_of(created_at: datetime | None) -> date | None:
    return created_at.date() if created_at is not None else None
