"""Compaction job: fold the stretch of a conversation path outside the recent window into task state.

Hierarchical: the unsummarised messages are split at exchange boundaries into chunks of at most
`chunk_tokens`; each chunk gets its own summary ("chunk" level, retrievable later), and the rolling
"global" summary is merged from the previous global summary and the chunk summary, so the summariser
never reads an ever-growing input. A global summary that passes its allowance is condensed by the merge
prompt's limit. Summaries are keyed by the node they cover up to, so every branch through that node can
use them. Nothing is stored until every call succeeded; the cursor's version makes a racing worker's
result a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

from gateway.config import CompactionConfig
from gateway.errors import UpstreamError
from gateway.jobs.prompts import chunk_request, condense_request, merge_request, render_message
from gateway.pipeline.compaction import CompactionPolicy
from gateway.ports import ChatPayload, JSONObject, MessageStore, SummaryStore, Tokenizers, Upstream
from gateway.records import Job, NewSummary, StoredMessage, StoredNode, Summary

log = logging.getLogger(__name__)


MAX_CHUNKS_PER_JOB = 3


class CompactionFailed(Exception):
    """A summarisation call failed; the job is retried, the stored summaries are untouched."""


@dataclass(frozen=True, slots=True)
class CompactionTarget:
    """What one tenant's compaction needs: its upstream, its settings and its recent-window allowance."""

    upstream: Upstream
    config: CompactionConfig
    policy: CompactionPolicy


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(slots=True)
class CompactHandler:
    store: MessageStore
    summaries: SummaryStore
    tokenizers: Tokenizers
    targets: Callable[[str], CompactionTarget | None]

    async def __call__(self, job: Job) -> None:
        conversation_id = str(job.payload["conversation_id"])
        leaf_id = str(job.payload["leaf_id"])
        model = str(job.payload.get("model") or "")
        target = self.targets(job.tenant)
        if target is None or not target.config.enabled:
            log.info("compaction of %s skipped: tenant %s has it disabled", conversation_id, job.tenant)
            return
        model = target.config.model or model
        _, version = await self.summaries.cursor(job.tenant, conversation_id)
        path = await self.store.path(job.tenant, leaf_id)
        if not path:
            return
        base = await self._base_summary(job.tenant, conversation_id, path)
        start = 0 if base is None else next(i for i, m in enumerate(path) if m.node.id == base.node_id) + 1
        base_tokens = 0 if base is None else base.path_tokens
        base_depth = -1 if base is None else base.depth
        # Bound one job's work (it must finish within its lease): at most MAX_CHUNKS_PER_JOB chunks; the
        # next answer queues the rest of a long backlog.
        limit = min(
            path[-1].node.path_tokens - target.policy.recent_tokens,
            base_tokens + MAX_CHUNKS_PER_JOB * target.config.chunk_tokens,
        )
        end = _fold_end(path, start, limit)
        # On demand (force), anything outside the window is folded; otherwise only past the threshold.
        threshold = 1 if job.payload.get("force") is True else target.policy.threshold_tokens
        if end < start or path[end].node.path_tokens - base_tokens < threshold:
            return  # not enough outside the window yet (another worker may have compacted already)
        on_path = {m.node.id for m in path}
        earlier = [
            c
            for c in await self.summaries.summaries(job.tenant, conversation_id, "chunk")
            if c.node_id in on_path
        ]
        chunk_texts = [c.content for c in sorted(earlier, key=lambda c: c.depth) if c.depth <= base_depth]
        rows = await self._fold(job, target, model, conversation_id, base, path, start, end, chunk_texts)
        if not await self.summaries.save(job.tenant, conversation_id, version, rows):
            log.info("compaction of %s lost a race: another worker moved the cursor first", conversation_id)

    async def _base_summary(
        self, tenant: str, conversation_id: str, path: list[StoredMessage]
    ) -> Summary | None:
        """The deepest global summary on this path (never another branch's)."""
        on_path = {m.node.id for m in path}
        for summary in await self.summaries.summaries(tenant, conversation_id, "global"):
            if summary.node_id in on_path:
                return summary
        return None

    async def _fold(
        self,
        job: Job,
        target: CompactionTarget,
        model: str,
        conversation_id: str,
        base: Summary | None,
        path: list[StoredMessage],
        start: int,
        end: int,
        chunk_texts: list[str],
    ) -> list[NewSummary]:
        tokenizer = self.tokenizers.for_model(model)
        rows: list[NewSummary] = []
        state = base.content if base is not None else None
        previous_id = base.node_id if base is not None else None
        for chunk in _chunks(path[start : end + 1], target.config.chunk_tokens):
            usage = Usage()
            rendered = [render_message(m.node.depth, m.data, m.created_at) for m in chunk]
            chunk_text = await self._complete(target.upstream, chunk_request(model, rendered), usage)
            last = chunk[-1].node
            folded = sum(m.node.token_count for m in chunk)
            rows.append(
                _summary(job.tenant, conversation_id, last, model, "chunk", chunk_text, tokenizer.count(chunk_text),
                         folded, usage, from_node_id=previous_id)
            )  # fmt: skip
            chunk_texts.append(chunk_text)
            merge_usage = Usage()
            limit = target.config.summary_tokens
            if state is None:
                state = chunk_text
            else:
                state = await self._complete(
                    target.upstream, merge_request(model, state, chunk_text, limit), merge_usage
                )
            if tokenizer.count(state) > limit:
                # Outgrew its allowance: rebuild it from this path's chunk summaries, hierarchically.
                state = await self._recompact(target, model, list(chunk_texts), merge_usage)
            rows.append(
                _summary(job.tenant, conversation_id, last, model, "global", state, tokenizer.count(state),
                         last.path_tokens, merge_usage, from_node_id=None)
            )  # fmt: skip
            previous_id = last.id
        return rows

    async def _recompact(self, target: CompactionTarget, model: str, parts: list[str], usage: Usage) -> str:
        """Condense chunk summaries in batches of at most `chunk_tokens` each, level by level, until one
        remains: no call reads more than a chunk's worth, however long the conversation."""
        tokenizer = self.tokenizers.for_model(model)
        limit = target.config.summary_tokens
        while True:
            batches: list[list[str]] = []
            size = 0
            for part in parts:
                cost = tokenizer.count(part)
                if batches and size + cost <= target.config.chunk_tokens:
                    batches[-1].append(part)
                    size += cost
                else:
                    batches.append([part])
                    size = cost
            if len(batches) == len(parts) > 1:  # every part is big: pair them so each level halves
                batches = [parts[i : i + 2] for i in range(0, len(parts), 2)]
            parts = [
                await self._complete(target.upstream, condense_request(model, b, limit), usage)
                for b in batches
            ]
            if len(parts) == 1:
                return parts[0]

    async def _complete(self, upstream: Upstream, request: JSONObject, usage: Usage) -> str:
        try:
            response = await upstream.chat_completions(ChatPayload(request), [], None)
            try:
                body = await response.read()
            finally:
                await response.close()
        except UpstreamError as exc:
            raise CompactionFailed(f"summarisation call failed: {exc.message}") from exc
        if response.status != 200:
            raise CompactionFailed(f"summarisation call answered {response.status}: {body[:500]!r}")
        data = orjson.loads(body)
        content = data["choices"][0]["message"]["content"]
        if not isinstance(content, str) or not content.strip():
            raise CompactionFailed("summarisation call returned no text")
        reported = data.get("usage")
        if isinstance(reported, dict):
            usage.input_tokens += int(reported.get("prompt_tokens") or 0)
            usage.output_tokens += int(reported.get("completion_tokens") or 0)
        return content.strip()


def _summary(
    tenant: str,
    conversation_id: str,
    node: StoredNode,
    model: str,
    level: str,
    content: str,
    tokens: int,
    source_tokens: int,
    usage: Usage,
    *,
    from_node_id: str | None,
) -> NewSummary:
    return NewSummary(
        tenant=tenant,
        conversation_id=conversation_id,
        node_id=node.id,
        from_node_id=from_node_id,
        level=level,
        depth=node.depth,
        path_tokens=node.path_tokens,
        content=content,
        token_count=tokens,
        source_tokens=source_tokens,
        model=model,
        llm_input_tokens=usage.input_tokens,
        llm_output_tokens=usage.output_tokens,
    )


def _fold_end(path: list[StoredMessage], start: int, limit_tokens: int) -> int:
    """Index of the last message to fold: within `limit_tokens` of path, and ending a whole exchange
    (the next message is a user turn), so a question is never summarised apart from its answer."""
    end = start - 1
    for index in range(start, len(path) - 1):
        if path[index].node.path_tokens > limit_tokens:
            break
        if path[index + 1].node.role == "user":
            end = index
    return end


def _chunks(messages: list[StoredMessage], chunk_tokens: int) -> list[list[StoredMessage]]:
    """Split at exchange boundaries into chunks of at most `chunk_tokens` (one exchange may exceed it)."""
    exchanges: list[list[StoredMessage]] = []
    for message in messages:
        if message.node.role == "user" or not exchanges:
            exchanges.append([message])
        else:
            exchanges[-1].append(message)
    chunks: list[list[StoredMessage]] = []
    size = 0
    for exchange in exchanges:
        cost = sum(m.node.token_count for m in exchange)
        if chunks and size + cost <= chunk_tokens:
            chunks[-1] += exchange
            size += cost
        else:
            chunks.append(list(exchange))
            size = cost
    return chunks


def targets_from(tenants: Mapping[str, CompactionTarget]) -> Callable[[str], CompactionTarget | None]:
    return tenants.get
