"""Compaction policy: when an answer makes a conversation worth summarising (a pure rule, design.md §5).

The persist step asks it whether to queue a compaction job; the compaction handler asks it how much of
the path the recent window keeps. Neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import CompactionConfig, ContextConfig


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When an answer makes a conversation worth compacting."""

    budget_tokens: int
    recent_tokens: int
    threshold_tokens: int

    @classmethod
    def for_tenant(cls, context: ContextConfig, compaction: CompactionConfig) -> CompactionPolicy:
        """The window's share and the threshold scale down with a budget smaller than the allowances,
        as the builder scales them, so a small budget still gets summaries."""
        budget = context.budget_tokens
        scale = min(1.0, budget / (context.recent_tokens + compaction.summary_tokens))
        recent = int(context.recent_tokens * scale)
        return cls(budget, recent, min(compaction.threshold_tokens, max(budget // 4, 1)))

    def due(self, history_tokens: int, summary_path_tokens: int) -> bool:
        # Only histories that (nearly) overflow the budget need a summary; a chat that fits is sent whole.
        if history_tokens <= self.budget_tokens - self.threshold_tokens:
            return False
        return history_tokens - self.recent_tokens - summary_path_tokens > self.threshold_tokens
