"""What the read-only CLI commands print: plain text built from store records (no I/O here)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gateway.cache_cost import ConversationCost
from gateway.cache_usage import CacheUsage, normalise
from gateway.inbound.chat_form import calls_of, text_of
from gateway.ports import JSON
from gateway.records import Conversation, JobState, RequestRecord, StoredMessage
from gateway.sent import sent_messages

PREVIEW = 70


def _preview(message: StoredMessage) -> str:
    data = message.data
    text = " ".join(text_of(data.get("content")).split())
    calls = [c.name for c in calls_of(data)]
    if calls:
        text = (text + " " if text else "") + "-> " + ", ".join(calls)
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def conversation_rows(conversations: Sequence[Conversation]) -> Iterator[str]:
    yield f"{'conversation':<32}  {'user':<20}  {'messages':>8}  updated"
    for c in conversations:
        user = c.user_id or "-"
        yield f"{c.id:<32}  {user[:20]:<20}  {c.message_count:>8}  {c.updated_at:%Y-%m-%d %H:%M}"


def tree_lines(conversation: Conversation, messages: Sequence[StoredMessage]) -> Iterator[str]:
    """The message tree, branches drawn: each node's role, short id, tokens and text."""
    yield f"conversation {conversation.id}  user {conversation.user_id or '-'}  {len(messages)} messages"
    children: dict[str | None, list[StoredMessage]] = {}
    for message in sorted(messages, key=lambda m: (m.node.depth, m.created_at)):
        children.setdefault(message.node.parent_id, []).append(message)
    known = {m.node.id for m in messages}
    roots = [m for m in messages if m.node.parent_id is None or m.node.parent_id not in known]
    stack: list[tuple[StoredMessage, str, bool]] = [(m, "", i == len(roots) - 1) for i, m in enumerate(roots)]
    stack.reverse()
    while stack:
        message, prefix, last = stack.pop()
        node = message.node
        branch = "└─ " if last else "├─ "
        yield f"{prefix}{branch}{node.role:<9} {node.id[:8]} ({node.token_count} tok) {_preview(message)}"
        below = children.get(node.id, [])
        inner = prefix + ("   " if last else "│  ")
        # A single child continues the line: only branch points indent.
        if len(below) == 1:
            stack.append((below[0], prefix, last))
        else:
            stack.extend((child, inner, i == len(below) - 1) for i, child in reversed(list(enumerate(below))))


def _ids(value: JSON) -> int:
    return len(value) if isinstance(value, list) else 0


def context_lines(record: RequestRecord) -> Iterator[str]:
    """What a request sent upstream and why: the ContextReport, section by section."""
    yield f"request {record.id}  {record.status} ({record.http_status})  model {record.model or '-'}"
    yield f"conversation {record.conversation_id or '-'}  user {record.user_id or '-'}  stream {record.stream}"
    report = record.report
    if not report:
        yield "no context report: the request was forwarded as sent (pass-through, or a step failed open)"
        return
    original, sent = report.get("original_tokens"), report.get("sent_tokens")
    if isinstance(original, int) and isinstance(sent, int):
        saved = f", {100 * (original - sent) / original:.0f}% saved" if original > sent > 0 else ""
        yield f"tokens: {original} in the history, {sent} sent (budget {report.get('budget_tokens')}{saved})"
    if report.get("unchanged"):
        yield "the history fit the budget: sent as the client sent it"
    sections = report.get("sections")
    for name, detail in sections.items() if isinstance(sections, dict) else ():
        if not isinstance(detail, dict):
            continue
        parts = [f"{detail.get('tokens', 0)} tok"]
        if _ids(detail.get("message_ids")):
            label = "retrieved messages" if name == "retrieval" else "messages"
            parts.append(f"{_ids(detail.get('message_ids'))} {label}")
        elif isinstance(detail.get("messages"), int):
            parts.append(f"{detail['messages']} messages")
        if _ids(detail.get("memory_ids")):
            parts.append(f"{_ids(detail.get('memory_ids'))} memories")
        if isinstance(detail.get("ms"), int | float):
            parts.append(f"{detail['ms']} ms")
        for key in ("skipped", "reason"):
            if isinstance(detail.get(key), str):
                parts.append(str(detail[key]))
        yield f"  {name:<10} " + ", ".join(parts)
    cut = report.get("cut")
    if isinstance(cut, dict) and cut.get("messages"):
        yield f"cut: {cut['messages']} older messages ({cut.get('tokens')} tok) left out"
    if record.usage:
        yield f"usage: {record.usage.get('prompt_tokens')} prompt, {record.usage.get('completion_tokens')} completion"
    reading = normalise(record.usage)
    if reading is not None:
        yield "cache: " + _cache_text(reading)


def _cache_text(usage: CacheUsage) -> str:
    share = f" ({100 * usage.hit_share:.0f}% cached)" if usage.hit_share is not None else ""
    return (
        f"{usage.cached_tokens} cached, {usage.cache_write_tokens} written, {usage.uncached_tokens} uncached "
        f"of {usage.input_tokens} input tokens{share}"
    )


def conversation_cost_lines(conversation_id: str, cost: ConversationCost) -> Iterator[str]:
    """A conversation's requests, oldest first, each with what the provider's cache did and its cost;
    then the conversation's cache-hit share and effective cost against full replay."""
    yield f"conversation {conversation_id}  {len(cost.turns)} requests  costs in {cost.unit}"
    yield (
        f"{'request':<32}  {'time':<19}  {'status':<8}  {'history':>7}  {'sent':>7}  {'input':>7}  "
        f"{'cached':>7}  {'written':>7}  {'uncached':>8}  {'cost':>12}  {'replay':>12}"
    )
    for turn in cost.turns:
        r, usage = turn.record, turn.usage
        counts = (
            (usage.input_tokens, usage.cached_tokens, usage.cache_write_tokens, usage.uncached_tokens)
            if usage is not None
            else ("-", "-", "-", "-")
        )
        money = [cost.text(v) if v is not None else "-" for v in (turn.cost, turn.replay_cost)]
        yield (
            f"{r.id:<32}  {r.created_at:%Y-%m-%d %H:%M:%S}  {r.status:<8}  {_or_dash(r.original_tokens):>7}  "
            f"{_or_dash(r.sent_tokens):>7}  {counts[0]:>7}  {counts[1]:>7}  {counts[2]:>7}  {counts[3]:>8}  "
            f"{money[0]:>12}  {money[1]:>12}"
        )
    share = cost.hit_share
    if share is None:
        yield "cache: no usage reported"
        return
    yield f"cache hits: {100 * share:.0f}% of {cost.input_tokens} input tokens read from the provider's cache"
    ratio = f" ({100 * cost.ratio:.0f}% of it)" if cost.ratio is not None else ""
    yield f"effective cost {cost.text(cost.cost)} against {cost.text(cost.replay_cost)} for full replay{ratio}"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


_SENT_LABELS = {
    "context": " [the gateway's context block]",
    "forgotten": " [the context block: removed when something it held was deleted]",
    "missing": " [no longer stored]",
}


def sent_lines(record: RequestRecord, path: Sequence[StoredMessage], *, whole: bool) -> Iterator[str]:
    """The messages the request sent, in order: a line each, or (`whole`) each message in full."""
    rows = sent_messages(record.report or {}, list(path), record.sent_context)
    if rows is None:
        return
    yield f"sent, in order ({len(rows)} messages):"
    for number, row in enumerate(rows, 1):
        tokens = f" ({row['tokens']} tok)" if row["tokens"] is not None else ""
        label = _SENT_LABELS.get(str(row["kind"]), "")
        text = str(row["text"])
        if whole:
            yield f"  {number}. {row['role']}{tokens}{label}"
            yield from (f"     {line}" for line in text.splitlines())
        else:
            flat = " ".join(text.split())
            flat = flat if len(flat) <= PREVIEW else flat[: PREVIEW - 1] + "…"
            yield f"  {number}. {row['role']:<9}{tokens}{label} {flat}"


def job_lines(counts: dict[str, int], failures: Sequence[JobState]) -> Iterator[str]:
    yield "jobs: " + ", ".join(f"{status} {count}" for status, count in counts.items())
    if failures:
        yield "failed for good (newest first):"
    for job in failures:
        yield f"  {job.updated_at:%Y-%m-%d %H:%M}  {job.kind:<15} {job.tenant:<12} {job.attempts} tries  {job.last_error}"
