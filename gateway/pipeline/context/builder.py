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

One build, in steps: plan the room (`_plan`), place the window (`_epoch`: the stored epoch's start while
its window fits, else a new start), fill the volatile tail (`_tail`: the window may give way for this turn
alone), lay the messages out (`_layout`), write the report (`_report`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import orjson

from gateway.config import ContextConfig
from gateway.pipeline.call import ChatCall, HistoryItem
from gateway.pipeline.context.block import TAIL_HEADER, framing_tokens, injected_block
from gateway.pipeline.context.budget import Budget, compute_budget
from gateway.pipeline.context.builder_zone import Zone, planned_ask, propose_zone, restore_zone
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
from gateway.ports import ChatPayload, EpochStore, JSONObject, ModelCatalog, Tokenizer, Tokenizers

REPLY_PRIMING_TOKENS = 3


@dataclass(slots=True)
class _Plan:
    """The request's parts and the room the budget leaves them."""

    build: BuildInput  # the system prompt(s), the history before the current exchange, the current one
    budget: Budget
    original: int  # the request's tokens as the client sent it
    fixed_extra: int  # the tools and the reply's priming: sent whatever the layout
    fits: bool  # the history fits the budget as sent
    stable: list[StableSection]
    tail: list[Section]
    trimmed: list[HistoryItem]  # cut from the current tool loop to fit the model's window
    system_tokens: int
    current_tokens: int
    limit: int  # the budget, raised to hold the newest exchanges
    available: int  # what the limit leaves for the stable block, the window and the tail
    scale: float  # the sections' allowances scaled to `available`
    tail_reserve: int  # the tail's scaled allowances and framing


@dataclass(slots=True)
class _Epoch:
    """Where the window starts, and the epoch's entry in the report (the same keys, in the same order)."""

    start: int
    start_id: str | None
    new: bool
    ended: str | None = None  # why the stored epoch ended
    pinned: bool = False  # a new epoch stored for the next turns
    # This turn only: the window starts later (the tail took its room) and gave up these tokens.
    borrowed_start: int | None = None
    borrowed_tokens: int = 0

    def report(self, limit: int) -> JSONObject:
        out: JSONObject = {} if self.ended is None else {"ended": self.ended}
        out.update(start_id=self.start_id, new=self.new)
        if self.pinned:
            out["pinned"] = True
        if self.borrowed_start is not None:
            out["borrowed"] = {"window_start": self.borrowed_start, "tokens": self.borrowed_tokens}
        out.update(window_start=self.start, limit_tokens=limit)
        return out


@dataclass(slots=True)
class _Layout:
    """The messages as sent, with the injected blocks among them."""

    messages: list[HistoryItem]
    window: list[HistoryItem]  # the window as sent this turn
    stable_block: JSONObject | None
    tail_block: JSONObject | None
    cache_breaks: tuple[int, ...]  # where the Anthropic doors put the gateway's cache breakpoints
    sent_tokens: int


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

        plan = self._plan(call, tokenizer, budget, original, fixed_extra, stable, tail)
        zone, epoch = await self._epoch(plan)
        tail_zone, window, cut_end = await self._tail(plan, zone, epoch)
        if fits and not zone.proposals and not tail_zone.proposals:
            return self._unchanged(call, payload, budget, original, zone.reported | tail_zone.reported)
        layout = _layout(plan, zone, tail_zone, window, borrowed=epoch.borrowed_start is not None)
        state.cache_breaks = layout.cache_breaks
        state.summary_path_tokens = max(_covered_tokens(zone.proposals), _summarised_tokens(zone.reported))
        state.sent_tokens = layout.sent_tokens
        state.report = _report(plan, epoch, zone, tail_zone, layout, cut_end)
        state.sent_context = kept_context(layout.stable_block, layout.tail_block)
        return ChatPayload({**body, "messages": [item.message for item in layout.messages]})

    def _plan(
        self,
        call: ChatCall,
        tokenizer: Tokenizer,
        budget: Budget,
        original: int,
        fixed_extra: int,
        stable: list[StableSection],
        tail: list[Section],
    ) -> _Plan:
        """The request split into system prompt, history and current exchange, and the room they leave."""
        state = call.state
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
        allowances = self.config.recent_tokens + sum(s.allowance for s in (*stable, *tail))
        scale = min(1.0, available / max(allowances, 1))
        tail_reserve = int(sum(s.allowance for s in tail) * scale) + framing_tokens(
            tokenizer, len(tail), TAIL_HEADER
        )
        return _Plan(
            BuildInput(call, tokenizer, system, history, current, room_tokens=available),
            budget,
            original,
            fixed_extra,
            original <= budget.input_tokens,
            stable,
            tail,
            trimmed,
            system_tokens,
            current_tokens,
            limit,
            available,
            scale,
            tail_reserve,
        )

    async def _epoch(self, plan: _Plan) -> tuple[Zone, _Epoch]:
        """The window's start and the stable block: the deepest stored epoch on the path while its window
        still fits (its block restored from its pins), else a new epoch (its block proposed, then pinned)."""
        build, history = plan.build, plan.build.history
        path = [*history, *build.current]
        stored = await self._stored_epochs(build.call)
        # A history that fits keeps the epoch of its first message (a budget raised, a branch cut short).
        found = current_epoch(path[:1] if plan.fits else path, stored)
        ended = None
        if found is not None and found[0] <= len(history):
            at, pins = found
            window_tokens = _tokens_or_none(history[at:])
            zone = await restore_zone(
                replace(build, history=history[:at], window=history[at:]), plan.stable, pins
            )
            # The tail's room is kept whatever the window has grown to: half of what the stable block
            # leaves at most, as when the epoch began.
            reserve = _reserve(plan.tail_reserve, plan.available - zone.tokens) if at else 0
            if window_tokens is not None and zone.tokens + window_tokens + reserve <= plan.available:
                return zone, _Epoch(at, path[at].node_id, new=False)
            ended = "the window outgrew the budget"
        start = self._new_start(plan)
        # The stable block before the tail (the summary outranks retrieved history), the tail's reserve
        # never more than half of what the window leaves.
        left = plan.available - known_tokens(history[start:])
        zone = await propose_zone(
            replace(build, history=history[:start], window=history[start:]),
            plan.stable,
            max(left - (_reserve(plan.tail_reserve, left) if start else 0), 0),
            plan.scale,
        )
        epoch = _Epoch(start, path[start].node_id if start < len(path) else None, new=True, ended=ended)
        epoch.pinned = await self._pin(build.call, path, start, zone)
        return zone, epoch

    def _new_start(self, plan: _Plan) -> int:
        """A new epoch's first message: the history's first when it fits, else where the window fills
        EPOCH_FILL of what the stable block and the tail's reserve leave."""
        if plan.fits:
            return 0
        stable_room = int(sum(s.allowance for s in plan.stable) * plan.scale) + framing_tokens(
            plan.build.tokenizer, len(plan.stable)
        )
        left = plan.available - stable_room
        room = max(left - _reserve(plan.tail_reserve, left), 0)
        return new_start(plan.build.history, int(room * EPOCH_FILL), self.config.min_recent_exchanges)

    async def _tail(self, plan: _Plan, zone: Zone, epoch: _Epoch) -> tuple[Zone, list[HistoryItem], int]:
        """The volatile tail: what this question needs from before the window, in what the rest leaves;
        the window as sent this turn; where the report's cut stretch ends."""
        build, history = plan.build, plan.build.history
        window = history[epoch.start :]
        cut_end = epoch.start
        window_tokens = known_tokens(window)
        tail_build = replace(build, window=window, above=[*zone.texts])
        planned = [await planned_ask(section, tail_build) for section in plan.tail]
        need = sum(int(w * plan.scale) for w, _ in planned) + framing_tokens(
            build.tokenizer, len(plan.tail), TAIL_HEADER
        )
        if zone.tokens + window_tokens + need > plan.available and any(
            w > s.allowance for (w, _), s in zip(planned, plan.tail, strict=True)
        ):
            # The report's cut stretch ends at the start tried, even when the window keeps its room.
            cut_end, pays = self._borrow(plan, zone.tokens, epoch.start, need)
            if pays:
                epoch.borrowed_start = cut_end
                epoch.borrowed_tokens = known_tokens(history[epoch.start : cut_end])
                window = history[cut_end:]
                window_tokens = known_tokens(window)
                tail_build = replace(tail_build, window=window)
                # Planned again over the smaller window: what it gave up is old history now, to search.
                again = [await planned_ask(section, tail_build) for section in plan.tail]
                planned = [(want, a + b) for (_, a), (want, b) in zip(planned, again, strict=True)]
        room = plan.available - zone.tokens - window_tokens
        # The tail shares the room the stable block and the window left by what each section asks: the
        # plan's scale assumes their full shares, and what they did not use would go unsent.
        spare = room - framing_tokens(build.tokenizer, len(plan.tail), TAIL_HEADER)
        scale = max(plan.scale, min(1.0, spare / max(sum(w for w, _ in planned), 1)))
        tail_zone = await propose_zone(tail_build, plan.tail, max(room, 0), scale, TAIL_HEADER, planned)
        return tail_zone, window, cut_end

    def _borrow(self, plan: _Plan, stable_tokens: int, start: int, need: int) -> tuple[int, bool]:
        """Where this turn's window would start if a question about the past took its room (down to its
        newest exchanges; the epoch, and so the next turn's prefix, stays as it was), and whether that
        pays: only where the history the tail gains outweighs the window it re-sends uncached."""
        history, available = plan.build.history, plan.available
        window_tokens = known_tokens(history[start:])
        sent_start = max(
            start,
            new_start(history, max(available - stable_tokens - need, 0), self.config.min_recent_exchanges),
        )
        kept = known_tokens(history[sent_start:])
        gained = min(need, available - stable_tokens - kept) - (available - stable_tokens - window_tokens)
        return sent_start, sent_start > start and gained >= kept

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

    async def _pin(self, call: ChatCall, path: list[HistoryItem], start: int, zone: Zone) -> bool:
        """Store a new epoch so the next turns (on any replica) show the same stable block; whether it
        was stored."""
        state = call.state
        if self.epochs is None or state.conversation_id is None or start >= len(path):
            return False
        node_id = path[start].node_id
        if node_id is None or (start == 0 and not zone.proposals):
            return False  # nothing to pin: a history sent as it came
        pins: JSONObject = {**zone.pins}
        depth = state.leaf_depth - (len(path) - 1 - start)
        await self.epochs.pin_epoch(call.tenant, state.conversation_id, node_id, depth, {"sections": pins})
        return True


def _layout(
    plan: _Plan, zone: Zone, tail_zone: Zone, window: list[HistoryItem], *, borrowed: bool
) -> _Layout:
    """System prompt(s), stable block, window, volatile tail, current exchange; and the cache breakpoints
    after the stable block and after the window."""
    stable_block = injected_block(zone.texts)
    tail_block = injected_block(tail_zone.texts, TAIL_HEADER)
    messages: list[HistoryItem] = list(plan.build.system)
    if stable_block is not None:
        messages.append(HistoryItem(stable_block, zone.tokens))
    prefix_end = len(messages) - 1
    messages += window
    window_end = len(messages) - 1
    if tail_block is not None:
        messages.append(HistoryItem(tail_block, tail_zone.tokens))
    messages += plan.build.current
    breaks = [i for i in (prefix_end, window_end) if i >= 0 and (i > prefix_end or stable_block)]
    if borrowed:
        # This turn's window is not the next turn's: a breakpoint after it would write a cache entry
        # nothing reads; one after the system prompt and stable block reads what the epoch cached.
        breaks = [prefix_end] if prefix_end >= 0 else []
    sent_tokens = known_tokens(messages) + plan.fixed_extra
    return _Layout(messages, window, stable_block, tail_block, tuple(sorted(set(breaks))), sent_tokens)


def _report(
    plan: _Plan, epoch: _Epoch, zone: Zone, tail_zone: Zone, layout: _Layout, cut_end: int
) -> JSONObject:
    """The ContextReport of a build that changed the request."""
    state = plan.build.call.state
    history, window = plan.build.history, layout.window
    window_tokens = known_tokens(window)
    covered = _covered_tokens(zone.proposals)
    shown = {i for _, p in tail_zone.proposals for i in p.verbatim_ids}
    summarised = _index_after(history, [p.covers_through for _, p in zone.proposals if p.covers_through])
    cut = [item for item in history[summarised:cut_end] if item.node_id not in shown]
    retrieved_tokens = known_tokens([i for i in history if i.node_id in shown])
    history_tokens = state.history_tokens - plan.system_tokens - plan.current_tokens - covered
    report = report_of(
        plan.budget, plan.original, layout.sent_tokens, unchanged=False,
        sections=_sections(plan, zone, tail_zone, window),
        cut=cut_range(cut, max(history_tokens - window_tokens - retrieved_tokens, 0)),
    )  # fmt: skip
    report["epoch"] = epoch.report(plan.limit)
    # What the previous turn sent too: all but the window's newest exchange (its answer is new).
    epoch_window = history[epoch.start :]  # what the previous turn sent, even when the tail borrowed from it
    prefix = (
        plan.fixed_extra
        + plan.system_tokens
        + zone.tokens
        + known_tokens(epoch_window)
        - newest_exchanges_tokens(epoch_window, 1)
    )
    report["cache_prefix_tokens"] = prefix if _seen_before(state.items, state.appended) else 0
    if plan.fits and epoch.start == 0:
        report["history_unchanged"] = True
    report["sent"] = _sent(plan, layout)
    return report


def _sections(plan: _Plan, zone: Zone, tail_zone: Zone, window: list[HistoryItem]) -> dict[str, JSONObject]:
    current = plan.build.current
    return {
        "system": {"tokens": plan.system_tokens, "messages": len(plan.build.system)},
        **zone.reported,
        **tail_zone.reported,
        "window": {
            "tokens": known_tokens(window),
            "exchanges": sum(1 for item in window if item.message.get("role") == "user"),
            "message_ids": [item.node_id for item in window if item.node_id is not None],
        },
        "current": {
            "tokens": plan.current_tokens,
            "trimmed_messages": len(plan.trimmed),
            "trimmed_tokens": known_tokens(plan.trimmed),
            "message_ids": [i.node_id for i in current if i.node_id is not None],
        },
    }


def _sent(plan: _Plan, layout: _Layout) -> JSONObject:
    """The layout as sent: the stored ids in order, where the injected blocks went."""
    system = plan.build.system
    blocks = {id(layout.stable_block), id(layout.tail_block)}
    return {
        # A message the store does not hold (the system prompt, outside the chain) goes in whole.
        "ids": [
            item.node_id if item.node_id is not None else {"message": item.message}
            for item in layout.messages
            if id(item.message) not in blocks
        ],
        "context_at": len(system) if layout.stable_block is not None else None,
        "tail_at": len(system) + (layout.stable_block is not None) + len(layout.window)
        if layout.tail_block is not None
        else None,
        "cache_breaks": list(layout.cache_breaks),
    }


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
    over its allowance is not sent, yet a compaction would find nothing new to fold)."""
    covered = [d.get(k) for d in reported.values() for k in ("covers_tokens", "newest_covers_tokens")]
    return max((c for c in covered if isinstance(c, int) and not isinstance(c, bool)), default=0)
