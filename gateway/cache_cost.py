"""A conversation's effective cost against full replay, from its requests' cache readings and the
tenant's prices: what `context-gateway context` and the dashboard's conversation page show.

Effective cost prices what the provider reported: uncached input, cached input, cache writes, output.
Full replay is the client's whole history sent every turn with the provider caching what it can. It is
estimated per request: the input sent plus what the gateway left out (original minus sent tokens), of
which the share the previous request's history covers (its original tokens over this one's, at most 1)
is priced as cached; the same output, no cache writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.cache_usage import CacheUsage, normalise
from gateway.config import ModelPrice, PricingConfig
from gateway.records import RequestRecord

USD = "USD"
TOKENS = "uncached input tokens"  # the unit when some model has no price: output is then left out


def price_of(pricing: PricingConfig, model: str | None) -> ModelPrice | None:
    """The listed price of `model`: its own name, else the longest listed name it starts with."""
    if model is None:
        return None
    best: ModelPrice | None = None
    for price in pricing.models:
        if model == price.model:
            return price
        if model.startswith(price.model) and (best is None or len(price.model) > len(best.model)):
            best = price
    return best


@dataclass(frozen=True, slots=True)
class Rates:
    """What one token costs, by kind."""

    uncached: float
    cached: float
    written: float
    output: float

    @classmethod
    def of(cls, price: ModelPrice | None, pricing: PricingConfig, unit: str) -> Rates:
        if unit == USD and price is not None:
            written = price.input if price.cache_write is None else price.cache_write
            return cls(price.input / 1e6, price.cached_input / 1e6, written / 1e6, price.output / 1e6)
        if price is not None and price.input > 0:  # this model's own ratios, in its uncached tokens
            written = price.input if price.cache_write is None else price.cache_write
            return cls(1.0, price.cached_input / price.input, written / price.input, 0.0)
        return cls(1.0, pricing.cached_share, 1.0, 0.0)

    def cost(self, uncached: float, cached: float, written: float, output: float) -> float:
        return self.uncached * uncached + self.cached * cached + self.written * written + self.output * output


@dataclass(frozen=True, slots=True)
class TurnCost:
    record: RequestRecord
    usage: CacheUsage | None  # None: the provider reported none (a failed request)
    cost: float | None
    replay_cost: float | None
    replay_cached_share: float | None  # full replay's input estimated cached


@dataclass(frozen=True, slots=True)
class ConversationCost:
    turns: tuple[TurnCost, ...]  # oldest first
    unit: str

    @property
    def input_tokens(self) -> int:
        return sum(t.usage.input_tokens for t in self.turns if t.usage is not None)

    @property
    def cached_tokens(self) -> int:
        return sum(t.usage.cached_tokens for t in self.turns if t.usage is not None)

    @property
    def hit_share(self) -> float | None:
        """Cached input over all input, every request together; None without input."""
        total = self.input_tokens
        return self.cached_tokens / total if total else None

    @property
    def cost(self) -> float:
        return sum(t.cost for t in self.turns if t.cost is not None)

    @property
    def replay_cost(self) -> float:
        return sum(t.replay_cost for t in self.turns if t.replay_cost is not None)

    @property
    def ratio(self) -> float | None:
        """Effective cost over full replay's; None when replay would have cost nothing."""
        replay = self.replay_cost
        return self.cost / replay if replay else None

    def text(self, value: float) -> str:
        return f"${value:,.4f}" if self.unit == USD else f"{value:,.0f} {self.unit}"


def conversation_cost(
    records: Sequence[RequestRecord], pricing: PricingConfig, before: RequestRecord | None = None
) -> ConversationCost:
    """`records` oldest first; `before`: the request just before the first (it only sets the first's
    replay estimate), None when the first is the conversation's first."""
    priced = all(price_of(pricing, r.model) is not None for r in records if normalise(r.usage) is not None)
    unit = USD if priced and pricing.models else TOKENS
    turns: list[TurnCost] = []
    previous = before.original_tokens if before is not None else None
    for record in records:
        usage = normalise(record.usage)
        original, sent = record.original_tokens, record.sent_tokens
        if usage is None:
            turns.append(TurnCost(record, None, None, None, None))
        else:
            rates = Rates.of(price_of(pricing, record.model), pricing, unit)
            left_out = max(original - sent, 0) if original is not None and sent is not None else 0
            replay = usage.input_tokens + left_out
            share = min(previous / original, 1.0) if previous and original else 0.0
            turns.append(
                TurnCost(
                    record,
                    usage,
                    rates.cost(
                        usage.uncached_tokens,
                        usage.cached_tokens,
                        usage.cache_write_tokens,
                        usage.output_tokens,
                    ),
                    rates.cost(replay * (1 - share), replay * share, 0, usage.output_tokens),
                    share,
                )
            )
        if original is not None:
            previous = original
    return ConversationCost(tuple(turns), unit)
