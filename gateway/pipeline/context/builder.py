"""Build step: the cache-stable prompt (design.md section 14) under one budget.

    client system prompt(s)   verbatim
    stable block              summary + standing memory, pinned for the epoch
    window                    stored messages verbatim from the epoch's first message; each turn appends
    volatile tail             retrieved old groups + memories relevant to this question, when needed
    current exchange          the question (and an unfinished tool loop) verbatim

A history that fits goes out as sent (its epoch starts at its first message); one that outgrows the
budget starts a new epoch: the window jumps forward in one large step and the stable block is built once,
then shown again from its pins until the next jump. The newest `min_recent_exchanges` exchanges and the
current tool loop are kept whatever the budget, while the model's context window holds them. Whole
exchanges are kept or cut, never text. Every build leaves a ContextReport on the call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import orjson

from gateway.config import ContextConfig
from gateway.pipeline.call import ChatCall, HistoryItem
from gateway.pipeline.context.block import (
    INJECTED_HEADER,
    TAIL_HEADER,
    block_tokens,
    framing_tokens,
    injected_block,
)
from gateway.pipeline.context.budget import Budget, compute_budget
from gateway.pipeline.context.epoch import EPOCH_FILL, current_epoch, new_start
from gateway.pipeline.context.exchanges import split_current, trim_current
from gateway.pipeline.context.provider_compaction import compacted_at
from gateway.pipeline.context.report import (
    as_sent,
    cut_range,
    kept_context,
    known_tokens,
    leading_system,
    report_of,
)
from gateway.pipeline.context.section import BuildInput, Proposal, Section, StableSection
from gateway.pipeline.context.window import newest_exchanges_tokens
from gateway.ports import ChatPayload, EpochStore, JSONObject, ModelCatalog, Tokenizers
from gateway.tracing import spanned

REPLY_PRIMING_TOKENS = 3


@dataclass(slots=True)
class _Zone:
    """One injected block's sections as proposed (or restored), with their report entries."""

    proposals: list[tuple[str, Proposal]] = field(default_factory=list)
    reported: dict[str, JSONObject] = field(default_factory=dict)
    tokens: int = 0
    # Per section, what shows it again for the rest of an epoch (why it showed nothing, if so).
    pins: dict[str, JSONObject] = field(default_factory=dict)

    @property
    def texts(self) -> list[str]:
        return [p.text or "" for _, p in self.proposals]


@dataclass(slots=True)
class ContextBuilder:
    span_name: ClassVar[str] = "build"  # its span in a request trace

    config: ContextConfig
    tokenizers: Tokenizers
    catalog: ModelCatalog
    # The stable block's sections in priority order (summary, standing memory): pinned per epoch.
    stable: Sequence[StableSection] = ()
    # The volatile tail's sections in priority order (retrieved history, relevant memory).
    tail: Sequence[Section] = ()
    epochs: EpochStore | None = None
    # Sections a history that fits the budget gets too, by name (memory: a new or short conversation
    # still gets what the gateway knows of the user; its own messages go out as sent).
    always: frozenset[str] = frozenset()

    async def __call__(self, call: ChatCall, payload: ChatPayload) -> ChatPayload:
        state = call.state
        if not state.items:
            return payload
        body = payload.data
        model = str(body.get("model"))
        tokenizer = self.tokenizers.for_model(model)
        budget = compute_budget(body, self.config, self.catalog.context_window(model))
        tools = body.get("tools")
        fixed_extra = REPLY_PRIMING_TOKENS + (tokenizer.count(orjson.dumps(tools).decode()) if tools else 0)
        original = state.history_tokens + fixed_extra
        state.original_tokens = original
        compacted = compacted_at([item.message for item in state.items])
        if compacted is not None:
            # The provider manages this history (it reads from its own summary on): the client's bytes.
            state.provider_compaction = True
            self._unchanged(call, payload, budget, original)
            assert state.report is not None
            state.report["provider_compaction"] = {"message": compacted}
            return payload
        fits = original <= budget.input_tokens
        stable = [s for s in self.stable if not fits or s.name in self.always]
        tail = [s for s in self.tail if not fits or s.name in self.always]
        if fits and not stable and not tail:
            return self._unchanged(call, payload, budget, original)

        leading = leading_system(state.items)
        for item in state.items[:leading]:
            if item.tokens is None:  # a stored system prompt whose count was not read: it is sent
                item.tokens = tokenizer.count_message(item.message)
        system = state.items[:leading]
        history, current = split_current(state.items[leading:])
        system_tokens = known_tokens(system)
        limit = budget.input_tokens
        # An agent's working state (the newest exchanges, the current tool loop) is kept while the
        # model's window holds it: the budget yields first (a coding agent's system prompt and tools
        # alone can pass a small budget).
        ceiling = max(limit, (budget.context_window or limit) - budget.reserve_tokens)
        current, trimmed = trim_current(current, ceiling - system_tokens - fixed_extra)
        current_tokens = known_tokens(current)
        pinned = newest_exchanges_tokens(history, self.config.min_recent_exchanges)
        limit = max(limit, min(system_tokens + fixed_extra + current_tokens + pinned, ceiling))
        available = max(limit - system_tokens - current_tokens - fixed_extra, 0)
        build = BuildInput(call, tokenizer, system, history, current)
        allowances = self.config.recent_tokens + sum(s.allowance for s in (*stable, *tail))
        scale = min(1.0, available / max(allowances, 1))
        tail_reserve = int(sum(s.allowance for s in tail) * scale) + framing_tokens(
            tokenizer, len(tail), TAIL_HEADER
        )

        # The epoch: the deepest stored one on the path while it still fits, else a new one.
        path = [*history, *current]
        stored = await self._stored_epochs(call)
        # A history that fits keeps the epoch of its first message (a budget raised, a branch cut short).
        found = current_epoch(path[:1] if fits else path, stored)
        zone = _Zone()
        start: int | None = None
        epoch: JSONObject = {}
        if found is not None and found[0] <= len(history):
            at, pins = found
            window_tokens = _tokens_or_none(history[at:])
            zone = await self._restore(
                replace(build, history=history[:at], window=history[at:]), stable, pins
            )
            # The tail's room is kept whatever the window has grown to: half of what the stable block
            # leaves at most, as when the epoch began.
            reserve = _reserve(tail_reserve, available - zone.tokens) if at else 0
            if window_tokens is not None and zone.tokens + window_tokens + reserve <= available:
                start = at
                epoch = {"start_id": path[at].node_id, "new": False}
            else:
                epoch = {"ended": "the window outgrew the budget"}
        if start is None:
            stable_room = int(sum(s.allowance for s in stable) * scale) + framing_tokens(
                tokenizer, len(stable)
            )
            if fits:
                start = 0
            else:
                left = available - stable_room
                room = max(left - _reserve(tail_reserve, left), 0)
                start = new_start(history, int(room * EPOCH_FILL), self.config.min_recent_exchanges)
            window_tokens = known_tokens(history[start:])
            # The stable block before the tail (the summary outranks retrieved history), the tail's
            # reserve never more than half of what the window leaves.
            left = available - window_tokens
            zone = await self._propose(
                replace(build, history=history[:start], window=history[start:]),
                stable,
                max(left - (_reserve(tail_reserve, left) if start else 0), 0),
                scale,
            )
            epoch = {**epoch, "start_id": path[start].node_id if start < len(path) else None, "new": True}
            await self._pin(call, path, start, zone, epoch)
        sent_start = start
        window = history[start:]
        window_tokens = known_tokens(window)

        # The volatile tail: what this question needs from before the window, in what the rest leaves.
        above = [*zone.texts]
        tail_build = replace(build, window=window, above=above)
        planned = [await _planned(section, tail_build) for section in tail]
        need = sum(int(w * scale) for w, _ in planned) + framing_tokens(tokenizer, len(tail), TAIL_HEADER)
        if zone.tokens + window_tokens + need > available and any(
            w > s.allowance for (w, _), s in zip(planned, tail, strict=True)
        ):
            # A question about the past may take the window's room for this turn: the window gives way
            # down to its newest exchanges; the epoch, and so the next turn's prefix, stays as it was.
            # Only where the history it gains outweighs the window it re-sends uncached (a small budget;
            # under a large one the tail's reserve holds enough: benchmarks/cache.py, locomo.py).
            sent_start = max(
                start,
                new_start(history, max(available - zone.tokens - need, 0), self.config.min_recent_exchanges),
            )
            kept = known_tokens(history[sent_start:])
            gained = min(need, available - zone.tokens - kept) - (available - zone.tokens - window_tokens)
            if sent_start > start and gained >= kept:
                epoch["borrowed"] = {
                    "window_start": sent_start,
                    "tokens": known_tokens(history[start:sent_start]),
                }
                window = history[sent_start:]
                window_tokens = known_tokens(window)
                tail_build = replace(tail_build, window=window)
                # Planned again over the smaller window: what it gave up is old history now, to search.
                again = [await _planned(section, tail_build) for section in tail]
                planned = [(want, a + b) for (_, a), (want, b) in zip(planned, again, strict=True)]
        room = available - zone.tokens - window_tokens
        tail_zone = await self._propose(tail_build, tail, max(room, 0), scale, TAIL_HEADER, planned)
        if fits and not zone.proposals and not tail_zone.proposals:
            return self._unchanged(call, payload, budget, original, zone.reported | tail_zone.reported)

        stable_block = injected_block(zone.texts)
        tail_block = injected_block(tail_zone.texts, TAIL_HEADER)
        messages: list[HistoryItem] = list(system)
        if stable_block is not None:
            messages.append(HistoryItem(stable_block, zone.tokens))
        prefix_end = len(messages) - 1
        messages += window
        window_end = len(messages) - 1
        if tail_block is not None:
            messages.append(HistoryItem(tail_block, tail_zone.tokens))
        messages += current
        breaks = [i for i in (prefix_end, window_end) if i >= 0 and (i > prefix_end or stable_block)]
        if "borrowed" in epoch:
            # This turn's window is not the next turn's: a breakpoint after it would write a cache entry
            # nothing reads; one after the system prompt and stable block reads what the epoch cached.
            breaks = [prefix_end] if prefix_end >= 0 else []
        state.cache_breaks = tuple(sorted(set(breaks)))

        sent = known_tokens(messages) + fixed_extra
        covered = _covered_tokens(zone.proposals)
        state.summary_path_tokens = max(covered, _summarised_tokens(zone.reported))
        shown = {i for _, p in tail_zone.proposals for i in p.verbatim_ids}
        summarised = _index_after(history, [p.covers_through for _, p in zone.proposals if p.covers_through])
        cut = [item for item in history[summarised:sent_start] if item.node_id not in shown]
        retrieved_tokens = known_tokens([i for i in history if i.node_id in shown])
        history_tokens = state.history_tokens - system_tokens - current_tokens - covered
        sections: dict[str, JSONObject] = {
            "system": {"tokens": system_tokens, "messages": len(system)},
            **zone.reported,
            **tail_zone.reported,
            "window": {
                "tokens": window_tokens,
                "exchanges": sum(1 for item in window if item.message.get("role") == "user"),
                "message_ids": [item.node_id for item in window if item.node_id is not None],
            },
            "current": {
                "tokens": current_tokens,
                "trimmed_messages": len(trimmed),
                "trimmed_tokens": known_tokens(trimmed),
                "message_ids": [i.node_id for i in current if i.node_id is not None],
            },
        }
        state.sent_tokens = sent
        state.report = report_of(
            budget, original, sent, unchanged=False, sections=sections,
            cut=cut_range(cut, max(history_tokens - window_tokens - retrieved_tokens, 0)),
        )  # fmt: skip
        state.report["epoch"] = {**epoch, "window_start": start, "limit_tokens": limit}
        # What the previous turn sent too: all but the window's newest exchange (its answer is new).
        epoch_window = history[start:]  # what the previous turn sent, even when the tail borrowed from it
        prefix = (
            fixed_extra
            + system_tokens
            + zone.tokens
            + known_tokens(epoch_window)
            - newest_exchanges_tokens(epoch_window, 1)
        )
        state.report["cache_prefix_tokens"] = prefix if _seen_before(state.items, state.appended) else 0
        if fits and start == 0:
            state.report["history_unchanged"] = True
        blocks = {id(stable_block), id(tail_block)}
        state.report["sent"] = {
            # A message the store does not hold (the system prompt, outside the chain) goes in whole.
            "ids": [
                item.node_id if item.node_id is not None else {"message": item.message}
                for item in messages
                if id(item.message) not in blocks
            ],
            "context_at": len(system) if stable_block is not None else None,
            "tail_at": len(system) + (stable_block is not None) + len(window)
            if tail_block is not None
            else None,
            # Where the Anthropic doors put the gateway's cache breakpoints (indices into the messages).
            "cache_breaks": list(state.cache_breaks),
        }
        state.sent_context = kept_context(stable_block, tail_block)
        return ChatPayload({**body, "messages": [item.message for item in messages]})

    def _unchanged(
        self,
        call: ChatCall,
        payload: ChatPayload,
        budget: Budget,
        original: int,
        reported: dict[str, JSONObject] | None = None,
    ) -> ChatPayload:
        """The request as the client sent it: the exact client bytes go out."""
        state = call.state
        state.sent_tokens = original
        state.report = report_of(
            budget, original, original, unchanged=True, sections=reported or {}, cut=cut_range([], 0)
        )
        state.report["sent"] = as_sent(state.items, None)
        history, current = split_current(state.items[leading_system(state.items) :])
        prefix = max(original - known_tokens(current) - newest_exchanges_tokens(history, 1), 0)
        state.report["cache_prefix_tokens"] = prefix if _seen_before(state.items, state.appended) else 0
        return payload

    async def _stored_epochs(self, call: ChatCall) -> list[tuple[str, JSONObject]]:
        conversation = call.state.conversation_id
        if self.epochs is None or conversation is None:
            return []
        return await self.epochs.epochs(call.tenant, conversation)

    async def _pin(
        self, call: ChatCall, path: list[HistoryItem], start: int, zone: _Zone, epoch: JSONObject
    ) -> None:
        """Store a new epoch so the next turns (on any replica) show the same stable block."""
        state = call.state
        if self.epochs is None or state.conversation_id is None or start >= len(path):
            return
        node_id = path[start].node_id
        if node_id is None or (start == 0 and not zone.proposals):
            return  # nothing to pin: a history sent as it came
        pins: JSONObject = {**zone.pins}
        depth = state.leaf_depth - (len(path) - 1 - start)
        await self.epochs.pin_epoch(call.tenant, state.conversation_id, node_id, depth, {"sections": pins})
        epoch["pinned"] = True

    async def _restore(self, build: BuildInput, sections: Sequence[StableSection], pins: JSONObject) -> _Zone:
        """The stable block as the epoch pinned it."""
        zone = _Zone()
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

    async def _propose(
        self,
        build: BuildInput,
        sections: Sequence[Section],
        room: int,
        scale: float = 1.0,
        header: str = INJECTED_HEADER,
        planned: Sequence[tuple[int, float]] | None = None,
    ) -> _Zone:
        """Each section in priority order, within its scaled ask (from `planned`: each section's ask and
        the seconds its plan took, when already planned) plus what higher sections left, the whole block
        (framing included) within `room`."""
        zone = _Zone()
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
        proposals = [p for _, p in zone.proposals]
        zone.tokens = block_tokens(proposals, build.tokenizer, header)
        if zone.tokens > room:  # the framing does not fit a tiny budget: drop the block
            for detail in zone.reported.values():
                detail.update(tokens=0, dropped="no room for the injected block")
            return _Zone(reported=zone.reported)
        return zone


async def _planned(section: Section, build: BuildInput) -> tuple[int, float]:
    """A section's ask for this build, and the seconds its plan took (reported as its own time)."""
    started = time.perf_counter()
    want = await section.plan(build)
    return want, time.perf_counter() - started


def _reserve(tail_reserve: int, left: int) -> int:
    """Room kept for the volatile tail out of `left`: its scaled allowance, at most half (a small budget
    still gets its summary and a window)."""
    return min(tail_reserve, max(left, 0) // 2)


def _seen_before(items: list[HistoryItem], appended: int) -> bool:
    """Some of the request's history was stored by an earlier request: its prefix went upstream before."""
    return sum(1 for item in items if item.node_id is not None) > appended


def _tokens_or_none(items: list[HistoryItem]) -> int | None:
    counts = [item.tokens for item in items]
    return None if None in counts else sum(c for c in counts if c is not None)


def _index_after(history: list[HistoryItem], node_ids: list[str | None]) -> int:
    """Index in `history` right after the deepest of `node_ids` (0 when none is on it)."""
    wanted = {n for n in node_ids if n is not None}
    if not wanted:
        return 0
    return max((index + 1 for index, item in enumerate(history) if item.node_id in wanted), default=0)


def _covered_tokens(injected: list[tuple[str, Proposal]]) -> int:
    covered = [p.detail.get("covers_tokens") for _, p in injected if p.covers_through is not None]
    return max((c for c in covered if isinstance(c, int)), default=0)


def _summarised_tokens(reported: dict[str, JSONObject]) -> int:
    """Tokens of the path that the newest stored summary on it covers, whether it was sent or not (one
    over its allowance is not sent, yet a compaction finds nothing new to fold until the path grows past
    it: judged by what was sent, most answers queued a compaction job that found nothing to fold)."""
    covered = [d.get(k) for d in reported.values() for k in ("covers_tokens", "newest_covers_tokens")]
    return max((c for c in covered if isinstance(c, int) and not isinstance(c, bool)), default=0)
