"""What a context section is: a provider that proposes content within an allowance.

Sections that inject text (summary, retrieved history, memory) return `text`; the builder puts all of it
in one delimited system message. The recent window returns raw messages. Each proposal carries the
details the ContextReport keeps (ids, scores, what was cut).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.pipeline.call import ChatCall, HistoryItem
from gateway.ports import JSONObject, Tokenizer


@dataclass(frozen=True, slots=True)
class BuildInput:
    call: ChatCall
    tokenizer: Tokenizer
    system: list[HistoryItem]
    history: list[HistoryItem]
    current: list[HistoryItem]
    # The newest history the recent window keeps (at its smallest share while sections plan, at its
    # reserved share when they propose): other sections leave it be.
    window: list[HistoryItem] = field(default_factory=list)
    # What a section learned while planning, for its own `propose` of the same build.
    memo: dict[str, object] = field(default_factory=dict)
    # Texts the higher-priority sections already put in (the summary), in order.
    above: list[str] = field(default_factory=list)
    # The tokens the budget leaves the history's sections (0: unknown): more room searches deeper.
    room_tokens: int = 0


@dataclass(slots=True)
class Proposal:
    # The exact count of `text` (or of `messages`): the builder counts the injected block from it.
    tokens: int = 0
    messages: list[HistoryItem] = field(default_factory=list)
    text: str | None = None
    detail: JSONObject = field(default_factory=dict)
    # A summary covering the path up to this node: the recent window starts after it.
    covers_through: str | None = None
    # Messages this proposal shows verbatim (retrieved history): the recent window starts after the
    # newest of them, so nothing is sent twice.
    verbatim_ids: tuple[str, ...] = ()
    # What a stable-block section needs to show the same text again for the rest of an epoch (the
    # summary's id, the memories' ids): stored with the epoch, given back to `restore`.
    pin: JSONObject | None = None


class Section(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def allowance(self) -> int:
        """Default allowance under a large budget; scaled down when the budget is smaller."""
        ...

    @property
    def whole(self) -> bool:
        """Worth its whole ask under a small budget too, up to half of what the window leaves (the
        summary: the task state, sent whole or not at all); the others are scaled to the budget."""
        ...

    async def plan(self, build: BuildInput) -> int:
        """This request's allowance before scaling: the default, more when the question needs it
        (retrieval, for a question about the past), or 0 when the section has nothing worth sending."""
        ...

    async def propose(self, build: BuildInput, allowance: int) -> Proposal: ...


class StableSection(Section, Protocol):
    """A section of the stable block: proposed when an epoch begins, then shown again from its pin."""

    async def restore(self, build: BuildInput, pin: JSONObject) -> Proposal: ...
