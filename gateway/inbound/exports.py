"""Chat histories exported elsewhere, read into chat messages for `context-gateway import`.

Two shapes: the gateway's own (`{"conversations": [{"user": ..., "messages": [chat messages]}]}`, or a
bare list of such objects), and a ChatGPT data export's `conversations.json` (a list of conversations,
each a `mapping` of message nodes with parents; the path to `current_node` is the conversation as
last seen, other branches are left out). Anything else is refused with the place named.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import InvalidRequest
from gateway.ports import JSON, JSONObject

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


@dataclass(frozen=True, slots=True)
class Imported:
    messages: list[JSONObject]
    user: str | None = None
    title: str | None = None


def _fail(where: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {message}", param=where)


def _plain(item: JSONObject, where: str, user: str | None) -> Imported:
    messages = item.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail(f"{where}.messages", "a non-empty list of chat messages is needed")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise _fail(
                f"{where}.messages[{index}]", f"a chat message with a role ({', '.join(sorted(_ROLES))})"
            )
    owner, title = item.get("user"), item.get("title")
    return Imported(
        [m for m in messages if isinstance(m, dict)],
        owner if isinstance(owner, str) else user,
        title if isinstance(title, str) else None,
    )


def _text(content: JSON) -> str:
    if not isinstance(content, dict):
        return ""
    parts = content.get("parts")
    if isinstance(parts, list):
        return "\n".join(p for p in parts if isinstance(p, str) and p.strip())
    text = content.get("text")
    return text if isinstance(text, str) else ""


def _chatgpt(item: JSONObject, where: str, user: str | None) -> Imported:
    mapping = item.get("mapping")
    if not isinstance(mapping, dict):
        raise _fail(f"{where}.mapping", "expected an object of message nodes")
    node_id = item.get("current_node")
    path: list[JSONObject] = []
    seen: set[str] = set()
    while isinstance(node_id, str) and node_id in mapping and node_id not in seen:
        seen.add(node_id)
        node = mapping[node_id]
        if not isinstance(node, dict):
            break
        message = node.get("message")
        if isinstance(message, dict):
            author = message.get("author")
            role = author.get("role") if isinstance(author, dict) else None
            text = _text(message.get("content"))
            if role in ("user", "assistant", "system") and text.strip():
                path.append({"role": role, "content": text})
        node_id = node.get("parent")
    path.reverse()
    if not path:
        raise _fail(where, "no text messages on the path to current_node")
    title = item.get("title")
    return Imported(path, user, title if isinstance(title, str) else None)


def read_export(document: JSON, user: str | None = None) -> list[Imported]:
    """The conversations of an export; `user` owns those that do not name their own."""
    items = (
        document.get("conversations")
        if isinstance(document, dict) and "conversations" in document
        else document
    )
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        raise _fail("file", "expected a list of conversations, or {'conversations': [...]}")
    out: list[Imported] = []
    for index, item in enumerate(items):
        where = f"conversations[{index}]"
        if not isinstance(item, dict):
            raise _fail(where, "expected an object")
        out.append(_chatgpt(item, where, user) if "mapping" in item else _plain(item, where, user))
    return out
