"""Prefetch step: start embedding the question as soon as the request arrives.

The question's embedding is the only model call on the request path and the largest part of the
retrieval section's time. It needs nothing but the request, so it runs (in the embedder's worker
thread) while the conversation is identified and stored, and the retrieval section picks it up
(`CallState.question`). A request that can hold no more tokens than its budget (a token is at least one
byte, so a body smaller than the budget fits) and names no stored conversation is sent unchanged:
nothing would be retrieved for it, and nothing is embedded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from gateway.pipeline.call import ChatCall, QuestionVector
from gateway.pipeline.context.ranking import READ_FOR_SPEAKERS, for_meaning
from gateway.pipeline.identify import explicit_identity
from gateway.ports import ChatPayload, Embedder, JSONObject
from gateway.text import message_text


@dataclass(slots=True)
class QuestionPrefetch:
    span_name: ClassVar[str] = "prefetch"  # its span in a request trace

    embedder: Embedder
    budget_tokens: int  # the tenant's input budget: the model's window can only lower it
    # Says whether memory will be searched for this call even if its history fits (then the question
    # is embedded whatever its size).
    remembers: Callable[[ChatCall], bool] | None = None

    async def __call__(self, call: ChatCall, payload: ChatPayload) -> ChatPayload:
        body = payload.data
        if len(call.raw) <= self.budget_tokens and not (self.remembers and self.remembers(call)):
            ident = explicit_identity(call.headers, body)
            if not ident.thin_capable and ident.parent_id is None:
                return payload  # the whole history is here and fits: the request goes out unchanged
        question = last_question(body)
        if question.strip():
            meant = for_meaning(question, recent_texts(body))  # as the retrieval section will read it
            written = None if meant == question else QuestionVector(question, self._embedding(question))
            call.state.question = QuestionVector(meant, self._embedding(meant), written)
        return payload

    def _embedding(self, text: str) -> asyncio.Future[list[float]]:
        future = asyncio.ensure_future(self.embedder.embed_query(text))
        future.add_done_callback(_consume)
        return future


def last_question(body: JSONObject) -> str:
    """The text of the request's last user message: the current exchange's question."""
    messages = body.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message)
    return ""


def recent_texts(body: JSONObject) -> list[str]:
    """The lower-cased texts of the request's last messages, where a transcript's participants are read
    from (the retrieval section reads its path's last messages)."""
    messages = body.get("messages")
    tail = messages[-READ_FOR_SPEAKERS:] if isinstance(messages, list) else []
    return [message_text(m).lower() for m in tail if isinstance(m, dict)]


def _consume(future: asyncio.Future[list[float]]) -> None:
    """A failure nobody awaited (the request fitted its budget after all) is not logged as unretrieved;
    the retrieval section reports its own."""
    if not future.cancelled():
        future.exception()
