"""Reading back what a request sent upstream: its report's `sent` layout (stored messages by id, the
injected block's place) over the request's path and the block kept with its record. Used by the
dashboard's request page and `context-gateway context`."""

from __future__ import annotations

from gateway.inbound.chat_form import calls_of, text_of
from gateway.ports import JSON, JSONObject
from gateway.records import StoredMessage


def shown_text(message: JSONObject) -> str:
    """A message's whole text, its tool calls after it (the request page shows what was sent)."""
    text = text_of(message.get("content"))
    calls = [f"→ {c.name}({c.arguments})" for c in calls_of(message)]
    return "\n".join([text, *calls]) if calls else text


def sent_messages(
    report: JSONObject, path: list[StoredMessage], context: JSONObject | None
) -> list[dict[str, object]] | None:
    """The messages a request sent, in order, from its report's `sent` layout: stored messages read back
    by id from the request's path, and the injected block as kept with the record. None when the report
    has no layout (pass-through, or a record from before it was kept)."""
    layout = report.get("sent")
    if not isinstance(layout, dict):
        return None
    by_id = {m.node.id: m for m in path}
    ids = layout.get("ids")
    leading = layout.get("leading")
    entries: list[JSON] = (
        list(ids)
        if isinstance(ids, list)
        else [
            *({"message": m} for m in (leading if isinstance(leading, list) else [])),
            *(m.node.id for m in path),
        ]
    )
    rows: list[dict[str, object]] = []
    for entry in entries:
        found = by_id.get(entry) if isinstance(entry, str) else None
        inline = entry.get("message") if isinstance(entry, dict) else None
        if found is not None:
            rows.append(
                {
                    "kind": "stored",
                    "role": found.node.role,
                    "tokens": found.node.token_count,
                    "text": shown_text(found.data),
                }
            )
        elif isinstance(inline, dict):  # sent as it came (the system prompt is not in the stored chain)
            rows.append(
                {
                    "kind": "inline",
                    "role": str(inline.get("role")),
                    "tokens": None,
                    "text": shown_text(inline),
                }
            )
        else:
            rows.append({"kind": "missing", "role": "?", "tokens": None, "text": ""})
    # Each block's place counts the blocks before it: the stable block goes in first.
    tail = context.get("tail") if context is not None else None
    for key, message in (("context_at", context), ("tail_at", tail)):
        at = layout.get(key)
        if isinstance(at, int):
            rows.insert(min(at, len(rows)), _block(message))
    return rows


def _block(message: JSON) -> dict[str, object]:
    """An injected block as kept with the record, or its place once forgotten (a memory it held was
    deleted)."""
    if isinstance(message, dict) and "content" in message:
        return {"kind": "context", "role": "system", "tokens": None, "text": shown_text(message)}
    return {"kind": "forgotten", "role": "system", "tokens": None, "text": ""}


def retrieved_groups(report: JSONObject, path: list[StoredMessage]) -> list[dict[str, object]]:
    """The retrieval section's groups of this conversation, as the request page lists them: depth range,
    score, the day of their first message (None: undated, history that arrived at once) and each
    message's role and text."""
    sections = report.get("sections")
    retrieval = sections.get("retrieval") if isinstance(sections, dict) else None
    groups = retrieval.get("groups") if isinstance(retrieval, dict) else None
    rows: list[dict[str, object]] = []
    for group in groups if isinstance(groups, list) else []:
        if not isinstance(group, dict):
            continue
        start, end = group.get("from"), group.get("to")
        if not isinstance(start, int) or not isinstance(end, int):
            continue
        messages = [m for m in path[start : end + 1] if start <= m.node.depth <= end]
        first = messages[0] if messages else None
        rows.append(
            {
                "from": start,
                "to": end,
                "score": group.get("score"),
                "day": None if first is None or first.meta.get("undated") else first.created_at,
                "messages": [(m.node.role, shown_text(m.data)) for m in messages],
            }
        )
    return rows
