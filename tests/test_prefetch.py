"""The question is embedded as the request arrives, and only when retrieval can follow (the step, with the
shipped hashing embedder; end to end, the paraphrase test in test_retrieval.py checks the vector is used)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.errors import EmbeddingError
from gateway.fakes.embedder import HashingEmbedder
from gateway.pipeline.call import ChatCall
from gateway.pipeline.context.prefetch import QuestionPrefetch
from gateway.ports import ChatPayload
from tests.test_retrieval import filler

QUESTION = "Which port did we pick for the staging proxy?"


def prefetched(body: dict[str, Any], headers: list[tuple[str, str]], embedder: HashingEmbedder) -> Any:
    """Run the step on one request; the call's early vector (None when nothing was started), awaited."""

    async def main() -> Any:
        raw = orjson.dumps(body)
        call = ChatCall("req-1", "acme", body, raw, headers, 0.0)
        await QuestionPrefetch(embedder, budget_tokens=400)(call, ChatPayload(body, raw))
        if call.state.question is None:
            return None
        return call.state.question.text, await call.state.question.future

    return asyncio.run(main())


def test_a_request_that_fits_its_budget_embeds_nothing() -> None:
    embedder = HashingEmbedder()
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": QUESTION}]}
    assert prefetched(body, [], embedder) is None
    assert embedder.calls == []


def test_a_long_history_has_its_last_question_embedded_early() -> None:
    embedder = HashingEmbedder()
    # The agent loop after the question (a tool call and its result) is not the question.
    messages = [
        *filler(10),
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ports", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "8443"},
    ]  # fmt: skip
    text, vector = prefetched({"model": "gpt-4o", "messages": messages}, [], embedder)
    assert text == QUESTION
    assert vector == embedder.vector(QUESTION)
    assert embedder.calls == [[QUESTION]]


def test_a_short_request_naming_a_stored_conversation_is_embedded_early() -> None:
    """A thin client sends one message; its history is in the store, so retrieval may follow."""
    embedder = HashingEmbedder()
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": QUESTION}]}
    for header in ("X-Conversation-Id", "X-Parent-Message-Id"):
        text, _ = prefetched(body, [(header, "c-1")], embedder)
        assert text == QUESTION


def test_a_failed_early_embedding_reaches_whoever_awaits_it() -> None:
    embedder = HashingEmbedder()
    embedder.fail = True
    body = {"model": "gpt-4o", "messages": [*filler(10), {"role": "user", "content": QUESTION}]}
    with pytest.raises(EmbeddingError):
        prefetched(body, [], embedder)


def test_a_question_naming_a_transcripts_participant_is_embedded_with_and_without_the_name() -> None:
    embedder = HashingEmbedder()
    said = [
        {"role": r, "content": f"{who}: hello"}
        for r, who in [("user", "Caroline"), ("assistant", "Melanie")] * 8
    ]
    question = "Where has Melanie camped?"
    body = {"model": "gpt-4o", "messages": [*filler(10), *said, {"role": "user", "content": question}]}

    async def main() -> Any:
        raw = orjson.dumps(body)
        call = ChatCall("req-1", "acme", body, raw, [], 0.0)
        await QuestionPrefetch(embedder, budget_tokens=400)(call, ChatPayload(body, raw))
        early = call.state.question
        return early.text, early.written.text, await early.future, await early.written.future

    meant, written, vector, whole = asyncio.run(main())
    assert (meant, written) == ("Where has camped?", question)
    assert vector == embedder.vector("Where has camped?")
    assert whole == embedder.vector(question)
