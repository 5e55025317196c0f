"""An injected block's sections as the context builder proposes them (or restores them from an epoch's
pins), each within its share of the room, with the entries they leave in the ContextReport."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.pipeline.context.block import INJECTED_HEADER, block_tokens, framing_tokens
from gateway.pipeline.context.section import BuildInput, Proposal, Section, StableSection
from gateway.ports import JSONObject
from gateway.tracing import spanned


@dataclass(slots=True)
class Zone:
    """One injected block's sections as proposed (or restored), with their report entries."""

    proposals: list[tuple[str, Proposal]] = field(default_factory=list)
    reported: dict[str, JSONObject] = field(default_factory=dict)
    tokens: int = 0
    # Per section, what shows it again for the rest of an epoch (why it showed nothing, if so).
    pins: dict[str, JSONObject] = field(default_factory=dict)

    @property
    def texts(self) -> list[str]:
        return [p.text or "" for _, p in self.proposals]


async def restore_zone(build: BuildInput, sections: Sequence[StableSection], pins: JSONObject) -> Zone:
    """The stable block as the epoch pinned it."""
    zone = Zone()
    by_name = pins.get("sections")
    pinned = by_name if isinstance(by_name, dict) else {}
    for section in sections:
        pin = pinned.get(section.name)
        if not isinstance(pin, dict):
            continue
        started = time.perf_counter()
        with spanned(build.call.trace, f"build.{section.name}"):
            proposal = await section.restore(build, pin)
        zone.reported[section.name] = {
            "tokens": proposal.tokens if proposal.text else 0,
            **proposal.detail,
            "pinned": True,
            "ms": round((time.perf_counter() - started) * 1000, 3),
        }
        if proposal.text:
            zone.proposals.append((section.name, proposal))
    zone.tokens = block_tokens([p for _, p in zone.proposals], build.tokenizer)
    return zone


async def propose_zone(
    build: BuildInput,
    sections: Sequence[Section],
    room: int,
    scale: float = 1.0,
    header: str = INJECTED_HEADER,
    planned: Sequence[tuple[int, float]] | None = None,
) -> Zone:
    """Each section in priority order, within its scaled ask (from `planned`: each section's ask and the
    seconds its plan took, when already planned) plus what higher sections left, the whole block
    (framing included) within `room`."""
    zone = Zone()
    if not sections:
        return zone
    spare = max(room - framing_tokens(build.tokenizer, len(sections), header), 0)
    carry = 0
    for position, section in enumerate(sections):
        if planned is not None:
            want, took = planned[position]
            started = time.perf_counter() - took
        else:
            started = time.perf_counter()
            want = await section.plan(build)
        # Its own scaled share (a `whole` section: its whole ask, up to half of what is spare) plus
        # what higher sections left.
        share = int(want * scale)
        if section.whole:
            share = max(share, min(want, spare // 2))
        allowance = max(min(share + carry, spare), 0)
        with spanned(build.call.trace, f"build.{section.name}") as span:
            proposal = await section.propose(build, allowance)  # with none, it says why
            used = proposal.tokens if proposal.text and proposal.tokens <= allowance else 0
            span.set({"gateway.section.allowance": allowance, "gateway.section.tokens": used})
        zone.reported[section.name] = {
            "tokens": used,
            "asked": want,
            "allowance": allowance,
            **proposal.detail,
            "ms": round((time.perf_counter() - started) * 1000, 3),
        }
        if used:
            zone.proposals.append((section.name, proposal))
            build.above.append(proposal.text or "")  # lower sections can avoid repeating it
        skipped = proposal.detail.get("skipped")
        pin = proposal.pin if used and proposal.pin is not None else {}
        zone.pins[section.name] = {"skipped": skipped, **pin} if isinstance(skipped, str) else pin
        carry, spare = allowance - used, spare - used
    zone.tokens = block_tokens([p for _, p in zone.proposals], build.tokenizer, header)
    if zone.tokens > room:  # the framing does not fit a tiny budget: drop the block
        for detail in zone.reported.values():
            detail.update(tokens=0, dropped="no room for the injected block")
        return Zone(reported=zone.reported)
    return zone


async def planned_ask(section: Section, build: BuildInput) -> tuple[int, float]:
    """A section's ask for this build, and the seconds its plan took (reported as its own time)."""
    started = time.perf_counter()
    want = await section.plan(build)
    return want, time.perf_counter() - started
