"""Whole exchanges: the unit the builder keeps or cuts, so a question stays with its answer and a tool
call with its results."""

from __future__ import annotations

from gateway.pipeline.call import HistoryItem


def split_current(items: list[HistoryItem]) -> tuple[list[HistoryItem], list[HistoryItem]]:
    """(history, current exchange): the current exchange starts at the last user message."""
    for index in range(len(items) - 1, -1, -1):
        if items[index].message.get("role") == "user":
            return items[:index], items[index:]
    return [], items


def group_exchanges(items: list[HistoryItem]) -> list[list[HistoryItem]]:
    """Each exchange starts at a user message; anything before the first one is an exchange of its own."""
    exchanges: list[list[HistoryItem]] = []
    for item in items:
        if item.message.get("role") == "user" or not exchanges:
            exchanges.append([item])
        else:
            exchanges[-1].append(item)
    return exchanges
