"""Whole exchanges: the unit the builder keeps or cuts, so a question stays with its answer and a tool
call with its results."""

from __future__ import annotations

from collections.abc import Iterator

from gateway.pipeline.call import HistoryItem


def split_current(items: list[HistoryItem]) -> tuple[list[HistoryItem], list[HistoryItem]]:
    """(history, current exchange): the current exchange starts at the last user message."""
    for index in range(len(items) - 1, -1, -1):
        if items[index].message.get("role") == "user":
            return items[:index], items[index:]
    return [], items


def newest_exchanges(items: list[HistoryItem]) -> Iterator[list[HistoryItem]]:
    """The exchanges of `items`, newest first: each starts at a user message, and anything before the
    first one is an exchange of its own. Found walking back from the end, so the window looks at the
    newest few of a long history without grouping all of it."""
    end = len(items)
    for index in range(len(items) - 1, -1, -1):
        if items[index].message.get("role") == "user":
            yield items[index:end]
            end = index
    if end > 0:
        yield items[:end]


def trim_current(current: list[HistoryItem], room: int) -> tuple[list[HistoryItem], list[HistoryItem]]:
    """Fit an agent loop (the user message, then assistant tool calls each followed by their results)
    into `room` tokens: the oldest whole steps go first, the question and the newest step always stay.
    Returns (kept, dropped)."""
    if not current or sum(item.tokens or 0 for item in current) <= room:
        return current, []
    head, rest = current[:1], current[1:]
    steps: list[list[HistoryItem]] = []
    for item in rest:
        if item.message.get("role") == "tool" and steps:
            steps[-1].append(item)  # a result stays with the call that asked for it
        else:
            steps.append([item])
    kept: list[list[HistoryItem]] = []
    used = sum(item.tokens or 0 for item in head)
    for step in reversed(steps):
        cost = sum(item.tokens or 0 for item in step)
        if kept and used + cost > room:
            break
        kept.insert(0, step)
        used += cost
    dropped_steps = steps[: len(steps) - len(kept)]
    return head + [i for s in kept for i in s], [i for s in dropped_steps for i in s]
