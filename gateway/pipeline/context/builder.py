"""Build step: assemble system + injected sections + recent window + current question under one budget.

If the whole history fits, the request goes out unchanged (the exact client bytes). Otherwise sections
propose content within allowances scaled to the budget: the recent window keeps at least its own
allowance, the other sections get theirs in priority order, and whatever they leave flows to the window.
Whole exchanges are kept or cut, never text. Every build leaves a ContextReport on the call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import orjson

from gateway.config import ContextConfig
from gateway.pipeline.call import ChatCall, HistoryItem
from gateway.pipeline.context.budget import Budget, compute_budget
from gateway.pipeline.context.exchanges import split_current, trim_current
from gateway.pipeline.context.section import BuildInput, Proposal, Section
from gateway.pipeline.context.window import RecentWindow, newest_exchanges_tokens
from gateway.ports import JSON, ChatPayload, JSONObject, ModelCatalog, Tokenizer, Tokenizers
from gateway.tracing import spanned

REPLY_PRIMING_TOKENS = 3
WINDOW_FLOOR = 0.25
INJECTED_HEADER = "The gateway added the following context from earlier in this conversation and from memory."


@dataclass(slots=True)
class ContextBuilder:
    span_name: ClassVar[str] = "build"  # its span in a request trace

    config: ContextConfig
    tokenizers: Tokenizers
    catalog: ModelCatalog
    # Injected sections in priority order (summary, retrieved history, memory); the window is built in.
    sections: Sequence[Section] = ()
    # Of those, the ones a history that fits the budget gets too (memory: a new or short conversation
    # still gets what the gateway knows of the user; its own messages go out as sent).
    always: Sequence[Section] = ()

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
        if original <= budget.input_tokens:
            added = await self._added(call, tokenizer, budget, original) if self.always else None
            if added is not None:
                return ChatPayload({**body, "messages": added})
            state.sent_tokens = original
            state.report = _report(budget, original, original, unchanged=True, sections={}, cut=_cut([], 0))
            state.report["sent"] = _as_sent(state.items, None)
            return payload

        leading = _leading_system(state.items)
        for item in state.items[:leading]:
            if item.tokens is None:  # a stored system prompt whose count was not read: it is sent
                item.tokens = tokenizer.count_message(item.message)
        history, current = split_current(state.items[leading:])
        system_tokens = known_tokens(state.items[:leading])
        # A long agent loop after the last question is cut by whole steps (call + results) too.
        current, trimmed = trim_current(current, budget.input_tokens - system_tokens - fixed_extra)
        build = BuildInput(call, tokenizer, state.items[:leading], history, current)
        current_tokens = known_tokens(current)
        available = max(budget.input_tokens - system_tokens - current_tokens - fixed_extra, 0)

        window = RecentWindow(self.config.recent_tokens)
        scale = min(1.0, available / max(window.allowance + sum(s.allowance for s in self.sections), 1))
        share = window.allowance * scale
        # The smallest window there can be: a floor of its share, and never fewer than the newest
        # `min_recent_exchanges` whole exchanges (unless they alone overflow what is available).
        pinned = min(newest_exchanges_tokens(history, self.config.min_recent_exchanges), available)
        smallest = max(int(share * WINDOW_FLOOR), pinned)
        # Sections plan against that window (retrieval searches what lies before it).
        build = replace(build, window=(await window.propose(build, smallest)).messages)
        wanted, planned = await _plan(build, self.sections)
        # A section that asks for more than its default (retrieval, for a question about the past) takes
        # the extra from the window's share, down to the smallest window; the summary keeps its share.
        extra = sum(max(w - s.allowance, 0) for w, s in zip(wanted, self.sections, strict=True)) * scale
        reserved = int(max(share - extra, smallest))
        # The window always keeps its own share; the sections' texts share the rest with the block's own
        # framing (header, delimiters, a separator per section), which their allowances do not count.
        spare = max(available - reserved - _framing_tokens(tokenizer, len(self.sections)), 0)
        # What the window keeps at that share: the other sections work on what lies before it.
        build = replace(build, window=(await window.propose(build, reserved)).messages)
        injected, reported = await self._propose(build, wanted, planned, scale, spare)
        block, block_tokens = self._block(injected, reported, tokenizer, available)
        floor = _window_floor(history, injected)
        window_proposal = await window.propose(
            replace(build, history=history[floor:]), available - block_tokens
        )
        summary_floor = _window_floor(history, [(n, p) for n, p in injected if p.covers_through is not None])
        if floor > summary_floor and available - block_tokens - window_proposal.tokens > REGROW_TOKENS:
            # Retrieved history stopped the window at its newest message with budget to spare: let the
            # window grow over those messages, and have the sections choose again from before it.
            grown = await window.propose(
                replace(build, history=history[summary_floor:]), available - block_tokens
            )
            if len(grown.messages) > len(window_proposal.messages):
                build = replace(build, window=grown.messages, above=[])
                injected, reported = await self._propose(build, wanted, planned, scale, spare)
                block, block_tokens = self._block(injected, reported, tokenizer, available)
                floor = _window_floor(history, injected)
                window_proposal = await window.propose(
                    replace(build, history=history[floor:]), available - block_tokens
                )
        available -= block_tokens
        state.summary_path_tokens = max(_covered_tokens(injected), _summarised_tokens(reported))

        messages: list[HistoryItem] = list(build.system)
        if block is not None:
            messages.append(HistoryItem(block, block_tokens))
        messages += window_proposal.messages
        messages += current
        sent = known_tokens(messages) + fixed_extra
        history_tokens = state.history_tokens - system_tokens - current_tokens - _covered_tokens(injected)
        # Summarised and retrieved messages are not "cut".
        shown = {i for _, p in injected for i in p.verbatim_ids}
        summarised = _window_floor(history, [(n, p) for n, p in injected if p.covers_through is not None])
        cut = [
            item
            for item in history[summarised : len(history) - len(window_proposal.messages)]
            if item.node_id not in shown
        ]
        sections: dict[str, JSONObject] = {
            "system": {"tokens": system_tokens, "messages": len(build.system)},
            **reported,
            "window": {"tokens": window_proposal.tokens, **window_proposal.detail},
            "current": {
                "tokens": current_tokens,
                "trimmed_messages": len(trimmed),
                "trimmed_tokens": known_tokens(trimmed),
                "message_ids": [i.node_id for i in current if i.node_id is not None],
            },
        }
        retrieved_tokens = known_tokens([i for i in history if i.node_id in shown])
        cut_tokens = history_tokens - window_proposal.tokens - retrieved_tokens
        state.sent_tokens = sent
        state.report = _report(
            budget, original, sent, unchanged=False, sections=sections,
            cut=_cut(cut, cut_tokens),
        )  # fmt: skip
        # What went, in order: stored messages by id (the block, kept whole, at its place).
        state.report["sent"] = {
            # A message the store does not hold (the system prompt, outside the chain) goes in whole.
            "ids": [
                item.node_id if item.node_id is not None else {"message": item.message}
                for item in messages
                if item.message is not block
            ],
            "context_at": len(build.system) if block is not None else None,
        }
        state.sent_context = block
        return ChatPayload({**body, "messages": [item.message for item in messages]})

    async def _added(
        self, call: ChatCall, tokenizer: Tokenizer, budget: Budget, original: int
    ) -> list[JSON] | None:
        """The messages of a history that fits, with the `always` sections' block added after its
        system prompt, within what the budget leaves; None when they have nothing to add."""
        state = call.state
        leading = _leading_system(state.items)
        history, current = split_current(state.items[leading:])
        build = BuildInput(call, tokenizer, state.items[:leading], history, current, window=history)
        room = budget.input_tokens - original
        wanted, planned = await _plan(build, self.always)
        injected, reported = await self._propose(build, wanted, planned, 1.0, room, self.always)
        block, block_tokens = self._block(injected, reported, tokenizer, room)
        if block is None:
            return None
        sent = original + block_tokens
        state.sent_tokens = sent
        sections: dict[str, JSONObject] = {
            "system": {"tokens": known_tokens(build.system), "messages": len(build.system)},
            **reported,
            "window": {"tokens": known_tokens(history), "messages": len(history)},
            "current": {"tokens": known_tokens(current)},
        }
        state.report = _report(budget, original, sent, unchanged=False, sections=sections, cut=_cut([], 0))
        state.report["history_unchanged"] = True
        state.report["sent"] = _as_sent(state.items, leading)  # the history whole, the block added
        state.sent_context = block
        messages: list[JSON] = [item.message for item in state.items[:leading]]
        return [*messages, block, *(item.message for item in state.items[leading:])]

    async def _propose(
        self,
        build: BuildInput,
        wanted: list[int],
        planned: list[float],
        scale: float,
        spare: int,
        sections: Sequence[Section] | None = None,
    ) -> tuple[list[tuple[str, Proposal]], dict[str, JSONObject]]:
        """Each section (of `sections`, else all) in priority order, within its scaled share plus what
        higher sections left."""
        carry = 0
        injected: list[tuple[str, Proposal]] = []
        reported: dict[str, JSONObject] = {}
        chosen = self.sections if sections is None else sections
        for section, want, plan_seconds in zip(chosen, wanted, planned, strict=True):
            # Its own scaled share (a `whole` section: its whole ask, up to half of what is spare) plus what
            # higher sections left; never the window's reserved share.
            share = int(want * scale)
            if section.whole:
                share = max(share, min(want, spare // 2))
            allowance = max(min(share + carry, spare), 0)
            started = time.perf_counter()
            with spanned(build.call.trace, f"build.{section.name}") as span:
                proposal = await section.propose(build, allowance)
                used = proposal.tokens if proposal.text and proposal.tokens <= allowance else 0
                span.set({"gateway.section.allowance": allowance, "gateway.section.tokens": used})
            seconds = plan_seconds + time.perf_counter() - started
            # Every section reports, even one that proposed nothing (its detail says why), and its time.
            reported[section.name] = {
                "tokens": used,
                "asked": want,
                "allowance": allowance,
                **proposal.detail,
                "ms": round(seconds * 1000, 3),
            }
            if used:
                injected.append((section.name, proposal))
                build.above.append(proposal.text or "")  # lower sections can avoid repeating it
            carry, spare = allowance - used, spare - used
        return injected, reported

    @staticmethod
    def _block(
        injected: list[tuple[str, Proposal]],
        reported: dict[str, JSONObject],
        tokenizer: Tokenizer,
        available: int,
    ) -> tuple[JSONObject | None, int]:
        """The delimited system message holding every injected section, and its tokens (counted from the
        sections' own counts: counted whole, the retrieved lines went through the tokenizer's line cache
        again, which the old messages of many conversations keep turning over)."""
        block = _injected_block(injected)
        block_tokens = 0
        if block is not None:
            parts: list[tuple[str, int | None]] = [(_OPENING, None)]
            for number, (_, proposal) in enumerate(injected):
                if number:
                    parts.append((_BETWEEN, None))
                parts.append((proposal.text or "", proposal.tokens))
            parts.append((_CLOSING, None))
            empty = tokenizer.count_message({"role": "system", "content": ""})
            block_tokens = empty + tokenizer.count_concat(parts)
        if block_tokens > available:  # the framing does not fit a tiny budget: drop it
            injected.clear()
            for detail in reported.values():
                detail.update(tokens=0, dropped="no room for the injected block")
            return None, 0
        return block, block_tokens


REGROW_TOKENS = 200  # leftover budget worth a second pass (see `__call__`)


def _as_sent(items: list[HistoryItem], context_at: int | None) -> JSONObject:
    """The layout of a history sent as the client sent it: the stored path, after the leading messages
    the store does not hold (the system prompt, outside the chain), which go in whole."""
    leading = _leading_system(items)
    unstored: list[JSON] = [item.message for item in items[:leading] if item.node_id is None]
    return {"as_sent": True, "context_at": context_at, "leading": unstored}


def _framing_tokens(tokenizer: Tokenizer, sections: int) -> int:
    """Tokens of the injected block around its sections' texts: header, delimiters and message
    overhead, and a separator per section."""
    empty = _injected_block([("", Proposal(text=""))])
    return (tokenizer.count_message(empty) if empty is not None else 0) + sections


_OPENING = f"<gateway_context>\n{INJECTED_HEADER}\n\n"
_BETWEEN = "\n\n"
_CLOSING = "\n</gateway_context>"


def _injected_block(injected: list[tuple[str, Proposal]]) -> JSONObject | None:
    """All injected sections in one delimited system message, so the model can tell memory from
    instructions."""
    if not injected:
        return None
    text = _BETWEEN.join(p.text or "" for _, p in injected)
    return {"role": "system", "content": f"{_OPENING}{text}{_CLOSING}"}


def _window_floor(history: list[HistoryItem], injected: list[tuple[str, Proposal]]) -> int:
    """Index in `history` where the window may start: right after the deepest summarised node and after
    the newest message another section shows verbatim."""
    after = {p.covers_through for _, p in injected if p.covers_through is not None}
    after.update(i for _, p in injected for i in p.verbatim_ids)
    if not after:
        return 0
    return max((index + 1 for index, item in enumerate(history) if item.node_id in after), default=0)


def _covered_tokens(injected: list[tuple[str, Proposal]]) -> int:
    covered = [p.detail.get("covers_tokens") for _, p in injected if p.covers_through is not None]
    return max((c for c in covered if isinstance(c, int)), default=0)


def _summarised_tokens(reported: dict[str, JSONObject]) -> int:
    """Tokens of the path that the newest stored summary on it covers, whether it was sent or not (one
    over its allowance is not sent, yet a compaction finds nothing new to fold until the path grows past
    it: judged by what was sent, every answer queued a compaction job that read the whole path and
    stopped there, 82 % of them in a benchmark of long conversations, BENCHMARKS.md issue 16)."""
    covered = [detail.get("covers_tokens") for detail in reported.values()]
    return max((c for c in covered if isinstance(c, int) and not isinstance(c, bool)), default=0)


def known_tokens(items: list[HistoryItem]) -> int:
    return sum(item.tokens or 0 for item in items)


async def _plan(build: BuildInput, sections: Sequence[Section]) -> tuple[list[int], list[float]]:
    """What each section asks for, and how long it took to find out (its searches run here)."""
    wanted: list[int] = []
    seconds: list[float] = []
    for section in sections:
        started = time.perf_counter()
        wanted.append(await section.plan(build))
        seconds.append(time.perf_counter() - started)
    return wanted, seconds


def _leading_system(items: list[HistoryItem]) -> int:
    count = 0
    for item in items:
        if item.message.get("role") not in ("system", "developer"):
            break
        count += 1
    return count


def _cut(items: list[HistoryItem], tokens: int) -> JSONObject:
    """The cut messages form one stretch of the path (oldest first): kept as a range, not a list."""
    return {
        "messages": len(items),
        "tokens": tokens,
        "from_id": next((i.node_id for i in items if i.node_id is not None), None),
        "to_id": next((i.node_id for i in reversed(items) if i.node_id is not None), None),
    }


def _report(
    budget: Budget,
    original: int,
    sent: int,
    *,
    unchanged: bool,
    sections: dict[str, JSONObject],
    cut: JSONObject,
) -> JSONObject:
    return {
        "unchanged": unchanged,
        "budget_tokens": budget.input_tokens,
        "context_window": budget.context_window,
        "reserve_tokens": budget.reserve_tokens,
        "original_tokens": original,
        "sent_tokens": sent,
        "over_budget": sent > budget.input_tokens,
        "sections": sections,  # type: ignore[dict-item]
        "cut": cut,
    }
