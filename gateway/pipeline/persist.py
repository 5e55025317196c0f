"""Persist step: store the answer as a child of the request's newest message, and the request record
(with what the provider's prompt cache did, read from the usage and counted for /metrics).

Runs after the last byte (or the disconnect, or the failure), so every request leaves a record with its
status: complete, partial or failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import ClassVar

from gateway.cache_usage import CacheUsage, miss_reason, normalise, stored_usage
from gateway.metrics import Counters
from gateway.pipeline.call import ChatCall, ChatOutcome
from gateway.pipeline.canonical import chain_hashes
from gateway.pipeline.compaction import CompactionPolicy
from gateway.ports import JSONObject, MessageStore, Tokenizers
from gateway.prefix_ledger import PrefixLedger, client_prefix
from gateway.records import (
    EMBED,
    TITLE_EVERY_MESSAGES,
    AppendRequest,
    EmbedWork,
    MemoryWork,
    NewJob,
    NewMessage,
    RequestRecord,
    compact_job,
    title_job,
    unanswered_embed_key,
)


@dataclass(slots=True)
class PersistStep:
    span_name: ClassVar[str] = "persist"  # its span in a request trace

    store: MessageStore
    tokenizers: Tokenizers
    compaction: CompactionPolicy | None = None
    index: bool = False  # enqueue an embed job for the exchange's new messages (retrieval is on)
    # Seconds before memory extraction reads the exchange's new user turns; None: memory is not learnt.
    extract_delay: float | None = None
    titles: bool = False  # queue title jobs (the memory section's digest of recent conversations)
    counters: Counters | None = None  # where the upstream's input tokens are counted by cache kind
    ledger: PrefixLedger | None = None  # each conversation's previous turn: why a cache miss happened

    async def __call__(self, call: ChatCall, outcome: ChatOutcome) -> None:
        state = call.state
        answer = self._with_later_jobs(call, self._exchange(call, outcome))
        stored = await self.store.complete(self._record(call, outcome), answer)
        if stored and answer is not None and answer.messages:
            state.answer_id = answer.messages[0].id
        elif not stored:
            state.conversation_id, state.conversation_deleted = None, True

    def _exchange(self, call: ChatCall, outcome: ChatOutcome) -> AppendRequest | None:
        """The answer as the child of the request's newest message, with its jobs; with no answer (the
        upstream failed), the question's embed job alone."""
        state = call.state
        message = _answer_message(outcome)
        # The ingest's fallback job for this request's new messages: the jobs queued here cover them.
        cancel = (
            ((EMBED, unanswered_embed_key(state.leaf_id)),)
            if self.index and state.appended and state.leaf_id is not None
            else ()
        )
        if message is not None and state.leaf_id is not None and state.conversation_id is not None:
            new = self._answer_node(call, message, state.leaf_id)
            jobs = self._answer_jobs(call, state.conversation_id, new)
            return AppendRequest(
                call.tenant,
                state.conversation_id,
                state.user_id,
                None,
                (new,),
                jobs,
                state.appended > 0,
                cancel,
            )
        if self.index and state.appended and state.leaf_id is not None and state.conversation_id is not None:
            # No answer: the question is indexed all the same, in the same transaction.
            jobs = (EmbedWork(state.conversation_id, state.leaf_id, state.appended).job(call.tenant),)
            return AppendRequest(
                call.tenant, state.conversation_id, state.user_id, None, (), jobs, True, cancel
            )
        return None

    def _answer_node(self, call: ChatCall, message: JSONObject, leaf_id: str) -> NewMessage:
        state = call.state
        tokens = self.tokenizers.for_model(str(call.body.get("model"))).count_message(message)
        return NewMessage(
            id=next(chain_hashes(bytes.fromhex(leaf_id), [message])).hex(),
            parent_id=leaf_id,
            depth=state.leaf_depth + 1,
            role="assistant",
            data=message,
            token_count=tokens,
            path_tokens=state.leaf_path_tokens + tokens,
            remember=not state.incognito,
        )

    def _answer_jobs(self, call: ChatCall, conversation_id: str, new: NewMessage) -> tuple[NewJob, ...]:
        """A compaction when the path has grown past its policy, the exchange's embed job."""
        state = call.state
        jobs: tuple[NewJob, ...] = ()
        policy = self.compaction
        if (
            policy is not None
            and not state.provider_compaction
            and policy.due(new.path_tokens, state.summary_path_tokens)
        ):
            jobs = (compact_job(call.tenant, conversation_id, new.id, call.body.get("model")),)
        if self.index:
            jobs += (EmbedWork(conversation_id, new.id, state.appended + 1).job(call.tenant),)
        return jobs

    def _with_later_jobs(self, call: ChatCall, answer: AppendRequest | None) -> AppendRequest | None:
        """The memory extraction and title jobs this request makes due, on the same append."""
        state = call.state
        learn = self._memory_job(call)
        if learn is not None and state.conversation_id is not None:
            if answer is None:
                answer = AppendRequest(call.tenant, state.conversation_id, state.user_id, None, (), ())
            answer = replace(answer, jobs=(*answer.jobs, learn))
        if answer is not None and answer.messages and self._titles_due(call):
            model = call.body.get("model")
            name = model if isinstance(model, str) else None
            title = title_job(call.tenant, answer.conversation_id or "", name, self.extract_delay or 0.0)
            answer = replace(answer, jobs=(*answer.jobs, title))
        return answer

    def _record(self, call: ChatCall, outcome: ChatOutcome) -> RequestRecord:
        """The request record, with what the provider's prompt cache did: kept with the usage, in the
        report, and counted."""
        state = call.state
        model = call.body.get("model")
        reading = normalise(outcome.usage)
        report = state.report
        if reading is not None:
            if report is not None:
                report = {**report, "cache": self._cache_report(call, report, reading)}
            if self.counters is not None:
                self.counters.count_input(call.tenant, reading)
        return RequestRecord(
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
            report=report,
            sent_context=state.sent_context,
            usage=stored_usage(outcome.usage, reading),
            error=outcome.error,
            latency_ms=(time.perf_counter() - call.started) * 1000,
            created_at=datetime.now(UTC),
        )

    def _cache_report(self, call: ChatCall, report: JSONObject, reading: CacheUsage) -> JSONObject:
        """The cache's reading for the report, with why it missed (against the conversation's last turn)."""
        state = call.state
        cache = reading.report()
        previous = (
            self.ledger.turn(state.conversation_id, client_prefix(call.body))
            if self.ledger is not None and state.conversation_id is not None
            else None
        )
        if (miss := miss_reason(report, reading, previous)) is not None:
            cache["miss"] = miss
        return cache

    def _titles_due(self, call: ChatCall) -> bool:
        """After a conversation's first exchange, and whenever this exchange crossed a multiple of
        TITLE_EVERY_MESSAGES (a long history sent at once crosses one too)."""
        state = call.state
        if not self.titles or state.memory is None or state.conversation_id is None:
            return False
        answer_depth = state.leaf_depth + 1
        before = answer_depth - state.appended - 1  # the depth of the last message stored before this
        return before < 1 or answer_depth // TITLE_EVERY_MESSAGES != before // TITLE_EVERY_MESSAGES

    def _memory_job(self, call: ChatCall) -> NewJob | None:
        """Extraction of the user turns this request brought (one pending job per conversation reads
        them all)."""
        state = call.state
        if self.extract_delay is None or state.memory is None or state.conversation_id is None:
            return None
        if not state.appended:
            return None  # nothing new was said (a retry, a regeneration)
        model = call.body.get("model")
        work = MemoryWork(
            state.conversation_id,
            state.memory.user_id,
            state.memory.scope,
            model if isinstance(model, str) else None,
        )
        return work.job(call.tenant, self.extract_delay)


def _answer_message(outcome: ChatOutcome) -> JSONObject | None:
    """The first choice's message, as a client would send it back (other choices stay in the record)."""
    if not outcome.choices:
        return None
    message = outcome.choices[0].get("message")
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    calls = message.get("tool_calls")
    if not content and not calls and not any(message.get(k) for k in ("response_items", "compaction_blocks")):
        return None  # nothing the client would send back (a compaction alone is: it paused after it)
    out: JSONObject = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    for key in _KEPT:
        value = message.get(key)
        if isinstance(value, list) and value:
            out[key] = value
    return out


# What a front door's chat form keeps beside the chat fields (inbound/chat_form.py): Anthropic's signed
# thinking blocks and its compaction, Responses items with no chat message (reasoning, built-in tool
# calls, compaction). The provider wants them back on the next turn.
_KEPT = ("thinking_blocks", "compaction_blocks", "response_items", "trailing_items")
