"""Prompt epochs (design.md section 14): where the window starts, kept until the prompt outgrows it.

Between two epochs each turn's prompt begins with the previous turn's up to its volatile tail, so a
provider's prefix cache covers everything but the newest exchange. An epoch is keyed by the stored
message its window starts at, with its stable block's pins; the deepest one on a request's path holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.exchanges import newest_exchanges
from gateway.ports import JSONObject

# A new epoch's window takes this share of the window's room: the rest is what the next turns append
# before the window must jump again (one large step, so the cache is rebuilt rarely).
EPOCH_FILL = 0.5


def current_epoch(
    path: Sequence[HistoryItem], epochs: Sequence[tuple[str, JSONObject]]
) -> tuple[int, JSONObject] | None:
    """(index in `path` of the window's first message, pins) of the deepest stored epoch on the path."""
    positions = {item.node_id: index for index, item in enumerate(path) if item.node_id is not None}
    for node_id, pins in epochs:  # deepest first
        index = positions.get(node_id)
        if index is not None:
            return index, pins
    return None


def new_start(history: list[HistoryItem], room: int, keep_exchanges: int) -> int:
    """Index in `history` where a new epoch's window starts: the newest whole exchanges within `room`,
    and never fewer than `keep_exchanges` of them (an agent's working state)."""
    start = len(history)
    used = 0
    for kept, exchange in enumerate(newest_exchanges(history)):
        counts = [item.tokens for item in exchange]
        if None in counts:
            break  # older than what the store was asked to count
        cost = sum(c for c in counts if c is not None)
        if kept >= keep_exchanges and used + cost > room:
            break
        used += cost
        start -= len(exchange)
    return start
