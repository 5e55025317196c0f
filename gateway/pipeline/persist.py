"""Persist step: store the answer as a child of the request's newest message, and the request record.

Runs after the last byte (or the disconnect, or the failure), so every request leaves a record with its
status: complete, partial or failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.config import CompactionConfig, ContextConfig
from gateway.jobs.embed import embed_job
from gateway.pipeline.call import ChatCall, ChatOutcome
from gateway.pipeline.canonical import chain_hashes
from gateway.ports import JSON, JSONObject, MessageStore, Tokenizers
from gateway.records import AppendRequest, NewJob, NewMessage, RequestRecord

COMPACT = "compact"


def compaction_job_key(conversation_id: str) -> str:
    """One pending compaction per conversation: it folds up to the newest answer when it runs."""
    return f"{COMPACT}:{conversation_id}"


def compact_job(
    tenant: str, conversation_id: str, leaf_id: str, model: JSON, *, force: bool = False
) -> NewJob:
    """Summarise the conversation up to `leaf_id` with `model`; `force`: whatever the threshold says."""
    payload: JSONObject = {"conversation_id": conversation_id, "leaf_id": leaf_id, "model": model}
    if force:
        payload["force"] = True
    return NewJob(COMPACT, tenant, payload, key=compaction_job_key(conversation_id))


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When an answer makes a conversation worth compacting (design.md §5)."""

    budget_tokens: int
    recent_tokens: int
    threshold_tokens: int

    @classmethod
    def for_tenant(cls, context: ContextConfig, compaction: CompactionConfig) -> CompactionPolicy:
        """The window's share and the threshold scale down with a budget smaller than the allowances,
        as the builder scales them, so a small budget still gets summaries."""
        budget = context.budget_tokens
        scale = min(1.0, budget / (context.recent_tokens + compaction.summary_tokens))
        recent = int(context.recent_tokens * scale)
        return cls(budget, recent, min(compaction.threshold_tokens, max(budget // 4, 1)))

    def due(self, history_tokens: int, summary_path_tokens: int) -> bool:
        # Only histories that (nearly) overflow the budget need a summary; a chat that fits is sent whole.
        if history_tokens <= self.budget_tokens - self.threshold_tokens:
            return False
        return history_tokens - self.recent_tokens - summary_path_tokens > self.threshold_tokens


@dataclass(slots=True)
class PersistStep:
    store: MessageStore
    tokenizers: Tokenizers
    compaction: CompactionPolicy | None = None
    index: bool = False  # enqueue an embed job for the exchange's new messages (retrieval is on)

    async def __call__(self, call: ChatCall, outcome: ChatOutcome) -> None:
        state = call.state
        model = call.body.get("model")
        answer = None
        jobs: tuple[NewJob, ...] = ()
        message = _answer_message(outcome)
        if message is not None and state.leaf_id is not None and state.conversation_id is not None:
            tokenizer = self.tokenizers.for_model(str(model))
            node_id = next(chain_hashes(bytes.fromhex(state.leaf_id), [message])).hex()
            tokens = tokenizer.count_message(message)
            new = NewMessage(
                id=node_id,
                parent_id=state.leaf_id,
                depth=state.leaf_depth + 1,
                role="assistant",
                data=message,
                token_count=tokens,
                path_tokens=state.leaf_path_tokens + tokens,
            )
            policy = self.compaction
            if policy is not None and policy.due(new.path_tokens, state.summary_path_tokens):
                jobs = (compact_job(call.tenant, state.conversation_id, new.id, model),)
            if self.index:
                jobs += (embed_job(call.tenant, new.id, state.appended + 1),)
            answer = AppendRequest(call.tenant, state.conversation_id, state.user_id, None, (new,), jobs)
        elif (
            self.index and state.appended and state.leaf_id is not None and state.conversation_id is not None
        ):
            # No answer (the upstream failed): the question is indexed all the same, in the same transaction.
            jobs = (embed_job(call.tenant, state.leaf_id, state.appended),)
            answer = AppendRequest(call.tenant, state.conversation_id, state.user_id, None, (), jobs)
        record = RequestRecord(
            id=call.request_id,
            tenant=call.tenant,
            conversation_id=state.conversation_id,
            user_id=state.user_id,
            parent_message_id=state.leaf_id,
            model=model if isinstance(model, str) else None,
            stream=call.stream,
            status=outcome.status,
            http_status=outcome.http_status,
            original_tokens=state.original_tokens,
            sent_tokens=state.sent_tokens,
            report=state.report,
            usage=outcome.usage,
            error=outcome.error,
            latency_ms=(time.perf_counter() - call.started) * 1000,
            created_at=datetime.now(UTC),
        )
        await self.store.complete(record, answer)


def _answer_message(outcome: ChatOutcome) -> JSONObject | None:
    """The first choice's message, as a client would send it back (other choices stay in the record)."""
    if not outcome.choices:
        return None
    message = outcome.choices[0].get("message")
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    calls = message.get("tool_calls")
    if not content and not calls:
        return None
    out: JSONObject = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    return out
