"""How much room the retrieval section asks for (`RetrievalSection.plan`), without a gateway: the shipped
in-memory index, keyword search only (no embedder, so nothing is close by meaning and no other reason for
room can hide the one under test)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer
from gateway.config import RetrievalConfig
from gateway.fakes.memory_index import MemoryIndex
from gateway.pipeline.call import CallState, ChatCall, HistoryItem
from gateway.pipeline.context.retrieval import RetrievalSection
from gateway.pipeline.context.section import BuildInput
from gateway.records import IndexRow

DAY = datetime(2026, 5, 8, 9, 0, tzinfo=UTC)
TOKENIZER = TiktokenTokenizer.for_model("gpt-4o")
CHATTER = [
    "the weather in Lisbon was mild and sunny all week",
    "we compared three sourdough recipes and their hydration",
    "the football match went to extra time before a late goal",
    "a podcast episode about the history of Roman roads",
]
WINDOW = 3  # the newest messages before the question


def chatter(count: int) -> list[str]:
    return [f"Let us talk about this: {CHATTER[i % len(CHATTER)]}." for i in range(count)]


def planned(texts: list[str], question: str) -> tuple[int, dict[str, Any]]:
    """The room `plan` asks for with `texts` (user and assistant in turn) as the history, the last
    WINDOW of them in the recent window, every one indexed, then `question`; and the section's report."""
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t}
        for i, t in enumerate([*texts, question])
    ]
    items = [HistoryItem(m, None, f"n{i}") for i, m in enumerate(messages)]
    index = MemoryIndex()
    rows = [
        IndexRow(f"n{i}:m", "t1", None, "c1", f"n{i}", "m", i, DAY + timedelta(minutes=i), text)
        for i, text in enumerate(texts)
    ]
    asyncio.run(index.add(rows))
    state = CallState(
        conversation_id="c1", leaf_id=items[-1].node_id, items=items, leaf_depth=len(items) - 1, appended=1
    )
    section = RetrievalSection(
        index, None, cast(Any, None), RetrievalConfig(), lambda: DAY + timedelta(days=1)
    )
    build = BuildInput(
        call=ChatCall("r1", "t1", {}, b"", {}, 0.0, state),
        tokenizer=TOKENIZER,
        system=[],
        history=items[:-1],
        current=items[-1:],
        window=items[-1 - WINDOW : -1],
    )
    room = asyncio.run(section.plan(build))
    memo = build.memo[section.name]
    return room, cast(Any, memo).detail


SOURCE = "Root cause of INC-4666: shipment-svc, after the config push."
LINK = "Ines is on call for shipment-svc this rotation."
# The window names the incident: no term of the question is said only by old messages.
NEWEST = [
    "The postmortem for INC-4666 is due Friday.",
    "I will draft the INC-4666 timeline.",
    "Thanks.",
]
QUESTION = "Who is on call for the service behind INC-4666?"


def test_a_question_whose_second_hop_confirms_a_link_only_old_messages_state_gets_room() -> None:
    texts = [SOURCE, "Noted.", *chatter(20), LINK, "Good to know.", *chatter(20), *NEWEST]
    room, detail = planned(texts, QUESTION)
    assert detail["hop"] == ["shipment-svc"] and detail["hop_confirmed"] == 1
    assert detail["why"] == "a link only old messages state"
    assert room == RetrievalConfig().allowance_tokens


def test_without_the_link_in_old_messages_the_same_question_gets_no_room() -> None:
    # The hop still follows shipment-svc, but nothing it finds says who is on call.
    unlinked = "shipment-svc moved to the new cluster this rotation."
    texts = [SOURCE, "Noted.", *chatter(20), unlinked, "Good to know.", *chatter(20), *NEWEST]
    room, detail = planned(texts, QUESTION)
    assert detail["hop"] == ["shipment-svc"] and "hop_confirmed" not in detail
    assert room == 0 and detail["skipped"] == "terms in the window"
