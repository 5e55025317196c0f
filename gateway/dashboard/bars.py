"""A ContextReport as the dashboard's stacked bar: tokens per part of what the model received, beside
what sending the whole history would have cost."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.ports import JSON, JSONObject

# Left to right as the prompt reads: the client's system prompt, what the gateway injected, the recent
# window, the question.
ORDER = ("system", "memory", "summary", "retrieval", "window", "current")
LABELS = {
    "system": "system",
    "memory": "memory",
    "summary": "summary",
    "retrieval": "retrieved",
    "window": "recent",
    "current": "question",
}


@dataclass(frozen=True, slots=True)
class Segment:
    name: str
    label: str
    tokens: int
    percent: float  # of the bar's full width (the larger of sent and original)


@dataclass(frozen=True, slots=True)
class Bar:
    segments: list[Segment]
    sent: int
    original: int
    budget: int | None

    @property
    def saved_percent(self) -> float:
        return 100 * (self.original - self.sent) / self.original if self.original > self.sent > 0 else 0.0


def _tokens(detail: JSON) -> int:
    value = detail.get("tokens") if isinstance(detail, dict) else None
    return value if isinstance(value, int) and value > 0 else 0


def bar(report: JSONObject) -> Bar:
    sections = report.get("sections")
    sections = sections if isinstance(sections, dict) else {}
    sent = report.get("sent_tokens")
    original = report.get("original_tokens")
    budget = report.get("budget_tokens")
    sent = sent if isinstance(sent, int) else sum(_tokens(d) for d in sections.values())
    original = original if isinstance(original, int) else sent
    width = max(sent, original, 1)
    names = [n for n in ORDER if n in sections] + [n for n in sections if n not in ORDER]
    segments = [
        Segment(n, LABELS.get(n, n), _tokens(sections[n]), round(100 * _tokens(sections[n]) / width, 2))
        for n in names
        if _tokens(sections[n])
    ]
    return Bar(segments, sent, original, budget if isinstance(budget, int) else None)
