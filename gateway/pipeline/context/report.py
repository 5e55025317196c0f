"""What the ContextReport of one build holds: the budget, the sections, the cut stretch, the layout
as sent, and the injected blocks as kept with the request record."""

from __future__ import annotations

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.budget import Budget
from gateway.ports import JSON, JSONObject


def known_tokens(items: list[HistoryItem]) -> int:
    return sum(item.tokens or 0 for item in items)


def leading_system(items: list[HistoryItem]) -> int:
    count = 0
    for item in items:
        if item.message.get("role") not in ("system", "developer"):
            break
        count += 1
    return count


def as_sent(items: list[HistoryItem], context_at: int | None) -> JSONObject:
    """The layout of a history sent as the client sent it: the stored path, after the leading messages
    the store does not hold (the system prompt, outside the chain), which go in whole."""
    leading = leading_system(items)
    unstored: list[JSON] = [item.message for item in items[:leading] if item.node_id is None]
    return {"as_sent": True, "context_at": context_at, "leading": unstored}


def cut_range(items: list[HistoryItem], tokens: int) -> JSONObject:
    """The cut messages form one stretch of the path (oldest first): kept as a range, not a list."""
    return {
        "messages": len(items),
        "tokens": tokens,
        "from_id": next((i.node_id for i in items if i.node_id is not None), None),
        "to_id": next((i.node_id for i in reversed(items) if i.node_id is not None), None),
    }


def kept_context(stable: JSONObject | None, tail: JSONObject | None) -> JSONObject | None:
    """The injected blocks as kept with the request record (forgotten when a memory they held is
    deleted): the stable block as the message, the tail under "tail"."""
    if stable is None and tail is None:
        return None
    kept: JSONObject = dict(stable) if stable is not None else {}
    if tail is not None:
        kept["tail"] = tail
    return kept


def report_of(
    budget: Budget,
    original: int,
    sent: int,
    *,
    unchanged: bool,
    sections: dict[str, JSONObject],
    cut: JSONObject,
) -> JSONObject:
    return {
        "unchanged": unchanged,
        "budget_tokens": budget.input_tokens,
        "context_window": budget.context_window,
        "reserve_tokens": budget.reserve_tokens,
        "original_tokens": original,
        "sent_tokens": sent,
        "over_budget": sent > budget.input_tokens,
        "sections": sections,  # type: ignore[dict-item]
        "cut": cut,
    }
