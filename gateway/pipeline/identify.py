"""Identify step, explicit part: conversation, user and branch point named by headers or the body."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gateway.ports import Headers, JSONObject

CONVERSATION_HEADER = "x-conversation-id"
# Open WebUI always resends the whole history: its chat id names the conversation but never means thin
# mode (an edited first message, sent alone, must branch from the root, not continue the chat).
OPENWEBUI_CHAT_HEADER = "x-openwebui-chat-id"
USER_HEADERS = ("x-user-id", "x-openwebui-user-id")
PARENT_HEADER = "x-parent-message-id"
# Incognito: the call neither reads nor feeds long-term memory (its turns are stored marked so).
MEMORY_HEADER = "x-gateway-memory"
MEMORY_OFF_VALUES = frozenset({"off", "false", "0", "no", "incognito"})


@dataclass(frozen=True, slots=True)
class Identity:
    conversation_id: str | None = None
    user_id: str | None = None
    parent_id: str | None = None
    thin_capable: bool = False  # named by a client that may send only its new turns
    memory_off: bool = False  # X-Gateway-Memory: off


MAX_ID_CHARS = 200  # the store's id columns; longer client ids are replaced by their digest


def header_text(value: str) -> str:
    """Header values arrive decoded as latin-1 (HTTP's bytes as they came); a client that sent UTF-8
    (a non-ASCII id) means the text those bytes spell, as the same id in the body would be."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def bounded_id(value: str | None) -> str | None:
    """A client's id as the store can keep it: longer ones, and ones holding a NUL character (which
    Postgres's text columns refuse), are replaced by their digest, the same for the same id."""
    if value is None or (len(value) <= MAX_ID_CHARS and "\x00" not in value):
        return value
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def _first(headers: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = headers.get(name, "").strip()
        if value:
            return header_text(value)
    return None


def _body_string(body: JSONObject, *path: str) -> str | None:
    value: object = body
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value.strip() or None if isinstance(value, str) else None


def memory_off(headers: Headers) -> bool:
    value = next((v for k, v in headers if k.lower() == MEMORY_HEADER), "")
    return value.strip().lower() in MEMORY_OFF_VALUES


def explicit_identity(headers: Headers, body: JSONObject) -> Identity:
    by_name = {name.lower(): value for name, value in headers}
    explicit = _first(by_name, (CONVERSATION_HEADER,)) or _body_string(body, "metadata", "conversation_id")
    return _bounded_identity(
        conversation_id=explicit or _first(by_name, (OPENWEBUI_CHAT_HEADER,)),
        thin_capable=explicit is not None,
        user_id=_first(by_name, USER_HEADERS)
        or _body_string(body, "user")
        or _body_string(body, "safety_identifier"),
        parent_id=by_name.get(PARENT_HEADER, "").strip()
        or _body_string(body, "metadata", "parent_message_id"),
        memory_off=by_name.get(MEMORY_HEADER, "").strip().lower() in MEMORY_OFF_VALUES,
    )


def _bounded_identity(
    *,
    conversation_id: str | None,
    thin_capable: bool,
    user_id: str | None,
    parent_id: str | None,
    memory_off: bool,
) -> Identity:
    return Identity(
        bounded_id(conversation_id), bounded_id(user_id), bounded_id(parent_id), thin_capable, memory_off
    )
