"""What the dashboard's templates show, shaped from stored records: message previews, the conversation
tree, the memories a request sent."""

from __future__ import annotations

from gateway.inbound.chat_form import calls_of, text_of
from gateway.records import StoredMessage
from gateway.services import Deps

PREVIEW = 160


def preview(message: StoredMessage) -> str:
    text = " ".join(text_of(message.data.get("content")).split())
    calls = [c.name for c in calls_of(message.data)]
    if calls:
        text = (text + " " if text else "") + "→ " + ", ".join(calls)
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def memory_detail(sections: object) -> dict[str, object]:
    """The memory the request sent, both parts of it: standing (the stable block) and relevant (the tail)."""
    if not isinstance(sections, dict):
        return {}
    parts = [sections.get(name) for name in ("memory", "memory_relevant")]
    found = [p for p in parts if isinstance(p, dict)]
    return {
        "standing": [i for p in found for i in p.get("standing") or []],
        "relevant": [r for p in found for r in p.get("relevant") or []],
    }


async def injected_memories(deps: Deps, tenant: str, detail: object) -> list[dict[str, object]]:
    """The memories a request's memory section sent, with why (standing, or relevant: score, similarity,
    reason) and their text as it is now (None: deleted since)."""
    if not isinstance(detail, dict):
        return []
    standing = [i for i in detail.get("standing") or [] if isinstance(i, str)]
    relevant = [
        r for r in detail.get("relevant") or [] if isinstance(r, dict) and isinstance(r.get("id"), str)
    ]
    ids = [*standing, *(str(r["id"]) for r in relevant)]
    if not ids or deps.memories is None:
        return []
    now = {m.id: m for m in await deps.memories.many(tenant, ids)}
    rows: list[dict[str, object]] = [
        {"id": i, "why": "standing preference or fact", "score": None, "similarity": None} for i in standing
    ]
    rows += [
        {"id": r["id"], "why": r.get("why"), "score": r.get("score"), "similarity": r.get("similarity")}
        for r in relevant
    ]
    for row in rows:
        found = now.get(str(row["id"]))
        row["content"] = found.content if found is not None else None
    return rows


def message_tree(messages: list[StoredMessage], leaf: str | None) -> list[dict[str, object]]:
    """Nested nodes for the template: each with its children; `on_path` marks the root-to-leaf path."""
    by_id = {m.node.id: m for m in messages}
    path: set[str] = set()
    node_id = leaf if leaf in by_id else None
    while node_id is not None and node_id in by_id:
        path.add(node_id)
        node_id = by_id[node_id].node.parent_id
    children: dict[str | None, list[StoredMessage]] = {}
    for message in sorted(messages, key=lambda m: (m.node.depth, m.created_at)):
        parent = message.node.parent_id if message.node.parent_id in by_id else None
        children.setdefault(parent, []).append(message)

    def build(parent: str | None) -> list[dict[str, object]]:
        return [
            {
                "id": m.node.id,
                "role": m.node.role,
                "tokens": m.node.token_count,
                "text": preview(m),
                "on_path": m.node.id in path,
                "children": build(m.node.id),
            }
            for m in children.get(parent, [])
        ]

    return build(None)
