"""The recent window's floor: the tokens of the newest whole exchanges (the builder keeps them whatever the
budget; epoch.py chooses where a window starts)."""

from __future__ import annotations

from itertools import islice

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.exchanges import newest_exchanges


def newest_exchanges_tokens(history: list[HistoryItem], count: int) -> int:
    """Tokens of the newest `count` whole exchanges of `history` (the window's minimum)."""
    exchanges = islice(newest_exchanges(history), max(count, 0))
    return sum(item.tokens or 0 for exchange in exchanges for item in exchange)
