"""The context builder's steps on their own: fake sections, a real tokenizer, no store or upstream."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizers
from gateway.config import ContextConfig
from gateway.pipeline.call import CallState, ChatCall, HistoryItem
from gateway.pipeline.context.builder import ContextBuilder
from gateway.pipeline.context.section import BuildInput, Proposal
from gateway.ports import ChatPayload, JSONObject

TOKENIZERS = TiktokenTokenizers()
TOKENIZER = TOKENIZERS.for_model("gpt-4o")


class Catalog:
    def context_window(self, model: str) -> int | None:
        return None


class Epochs:
    def __init__(self) -> None:
        self.pinned: dict[str, tuple[int, JSONObject]] = {}

    async def epochs(self, tenant: str, conversation_id: str) -> list[tuple[str, JSONObject]]:
        rows = sorted(self.pinned.items(), key=lambda row: -row[1][0])
        return [(node_id, pins) for node_id, (_, pins) in rows]

    async def pin_epoch(
        self, tenant: str, conversation_id: str, node_id: str, depth: int, pins: JSONObject
    ) -> None:
        self.pinned.setdefault(node_id, (depth, pins))


@dataclass
class Summary:
    """A stable section: one line naming the newest message before the window."""

    name: str = "summary"
    allowance: int = 100
    whole: bool = True

    async def plan(self, build: BuildInput) -> int:
        return self.allowance if build.history else 0

    async def propose(self, build: BuildInput, allowance: int) -> Proposal:
        if not build.history:
            return Proposal(detail={"skipped": "nothing before the window"})
        last = build.history[-1].node_id
        text = f"Summary up to {last}."
        return Proposal(TOKENIZER.count(text), text=text, covers_through=last, pin={"through": last})

    async def restore(self, build: BuildInput, pin: JSONObject) -> Proposal:
        text = f"Summary up to {pin['through']}."
        return Proposal(TOKENIZER.count(text), text=text, pin=pin)


@dataclass
class Retrieval:
    """A tail section: asks twenty times its allowance for a question about the past, and shows the oldest
    messages before the window that fit."""

    name: str = "retrieval"
    allowance: int = 60
    whole: bool = False

    async def plan(self, build: BuildInput) -> int:
        question = str(build.current[0].message["content"])
        return self.allowance * 20 if question.startswith("Earlier") else 0

    async def propose(self, build: BuildInput, allowance: int) -> Proposal:
        before = build.history[: len(build.history) - len(build.window)]
        shown: list[HistoryItem] = []
        for item in before:
            if sum(i.tokens or 0 for i in [*shown, item]) > allowance - 10:
                break
            shown.append(item)
        if not shown:
            return Proposal(detail={"skipped": "nothing fits"})
        text = "\n".join(str(item.message["content"]) for item in shown)
        ids = tuple(item.node_id for item in shown if item.node_id is not None)
        return Proposal(TOKENIZER.count(text), text=text, verbatim_ids=ids)


def words(seed: int, count: int) -> str:
    return " ".join(f"w{(seed * 7 + i) % 50}" for i in range(count))


def history(exchanges: int, answer_words: int = 80) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be terse."}]
    for turn in range(exchanges):
        messages.append({"role": "user", "content": f"Question {turn}: {words(turn, 10)}"})
        messages.append({"role": "assistant", "content": words(turn + 100, answer_words)})
    return messages


def build(
    builder: ContextBuilder, messages: list[dict[str, Any]], question: str
) -> tuple[ChatPayload, CallState]:
    messages = [*messages, {"role": "user", "content": question}]
    items = [
        HistoryItem(m, TOKENIZER.count_message(m), None if m["role"] == "system" else f"n{i}")
        for i, m in enumerate(messages)
    ]
    state = CallState(
        conversation_id="c1",
        items=items,
        history_tokens=sum(item.tokens or 0 for item in items),
        leaf_depth=len(messages) - 2,
        appended=1,
    )
    call = ChatCall("r1", "t1", {}, b"", {}, 0.0, state)
    payload = asyncio.run(builder(call, ChatPayload({"model": "gpt-4o", "messages": messages})))
    return payload, state


def builder(budget: int, epochs: Epochs | None = None, **config: int) -> ContextBuilder:
    context = ContextConfig(budget_tokens=budget, response_reserve_tokens=0, **config)
    return ContextBuilder(context, TOKENIZERS, Catalog(), [Summary()], [Retrieval()], epochs)


def test_a_history_that_fits_goes_out_as_the_client_sent_it() -> None:
    payload, state = build(builder(20_000), history(3), "And now?")
    assert state.report is not None and state.report["unchanged"] is True
    assert state.sent_tokens == state.original_tokens
    assert payload.data["messages"][-1] == {"role": "user", "content": "And now?"}
    assert state.report["cache_prefix_tokens"] > 0  # its stored prefix went upstream before


def test_a_new_epoch_is_pinned_and_the_next_turn_restores_its_stable_block() -> None:
    epochs = Epochs()
    gateway = builder(900, epochs, recent_tokens=400)
    first, state = build(gateway, history(12), "What next?")
    assert state.report is not None
    epoch = state.report["epoch"]
    assert list(epoch) == ["start_id", "new", "pinned", "window_start", "limit_tokens"]
    assert epoch["new"] is True and len(epochs.pinned) == 1
    assert state.sent_tokens is not None and state.sent_tokens <= 900
    assert state.summary_path_tokens == 0  # the fake summary reports no covered tokens

    second, state = build(
        gateway,
        [*history(12), *first.data["messages"][-1:], {"role": "assistant", "content": "Ok."}],
        "Then?",
    )
    assert state.report is not None
    assert list(state.report["epoch"]) == ["start_id", "new", "window_start", "limit_tokens"]
    assert state.report["epoch"]["start_id"] == epoch["start_id"]
    assert state.report["sections"]["summary"]["pinned"] is True
    # Append-only: the second prompt begins with the first one's up to its question.
    assert second.data["messages"][: len(first.data["messages"]) - 1] == first.data["messages"][:-1]
    layout = state.report["sent"]
    assert layout["context_at"] == 1 and layout["tail_at"] is None
    assert state.cache_breaks == (1, len(second.data["messages"]) - 2)


def test_a_question_about_the_past_borrows_the_windows_room_for_its_turn_alone() -> None:
    epochs = Epochs()
    gateway = builder(500, epochs, recent_tokens=300, min_recent_exchanges=0)
    _, state = build(gateway, history(12, answer_words=40), "Earlier, what did we say?")
    assert state.report is not None
    epoch = state.report["epoch"]
    assert list(epoch) == ["start_id", "new", "pinned", "borrowed", "window_start", "limit_tokens"]
    borrowed = epoch["borrowed"]
    assert borrowed["window_start"] > epoch["window_start"] and borrowed["tokens"] > 0
    assert state.report["sections"]["retrieval"]["tokens"] > 0
    # Only the breakpoint after the stable block: this turn's window is not the next turn's.
    assert state.cache_breaks == (1,)
    assert state.report["sent"]["cache_breaks"] == [1]


def test_a_question_about_the_past_takes_the_room_the_window_and_the_summary_left() -> None:
    # The default recent share (6,000) scales every allowance down to a third at this budget, while the
    # window fills half its room: the tail gets the rest, not a third of its ask.
    gateway = builder(2_000, Epochs())
    _, state = build(gateway, history(60, answer_words=40), "Earlier, what did we say?")
    assert state.report is not None and state.sent_tokens is not None
    retrieval = state.report["sections"]["retrieval"]
    assert retrieval["allowance"] > retrieval["asked"] * 2_000 / 6_000
    assert state.sent_tokens > 1_900
