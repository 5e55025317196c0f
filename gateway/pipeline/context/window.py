"""Recent-window section: the newest whole exchanges that fit, verbatim and contiguous."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.exchanges import newest_exchanges
from gateway.pipeline.context.section import BuildInput, Proposal


def newest_exchanges_tokens(history: list[HistoryItem], count: int) -> int:
    """Tokens of the newest `count` whole exchanges of `history` (the window's minimum)."""
    exchanges = islice(newest_exchanges(history), max(count, 0))
    return sum(item.tokens or 0 for exchange in exchanges for item in exchange)


@dataclass(slots=True)
class RecentWindow:
    allowance: int
    name: str = "window"

    async def propose(self, build: BuildInput, allowance: int) -> Proposal:
        kept = 0
        proposal = Proposal()
        for exchange in newest_exchanges(build.history):
            counts = [item.tokens for item in exchange]
            if None in counts:
                break  # older than what the store was asked to count: beyond any budget
            cost = sum(c for c in counts if c is not None)
            if proposal.tokens + cost > allowance:
                break  # contiguous: an older exchange never jumps over a newer one that did not fit
            proposal.tokens += cost
            kept += 1
            proposal.messages[:0] = exchange
        proposal.detail = {
            "exchanges": kept,
            "message_ids": [item.node_id for item in proposal.messages if item.node_id is not None],
        }
        return proposal
