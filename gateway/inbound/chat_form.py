"""The pipeline's chat form and what a chat upstream may be sent of it.

The store keeps what each front door's client sent, losslessly: besides the chat fields, `thinking_blocks`
(Anthropic thinking, signed), `compaction_blocks` (Anthropic's own summary of what came before), `is_error` on tool results and `cache_control` on content parts (Anthropic),
`response_items` and `trailing_items` (Responses items with no chat message: reasoning, built-in tool calls). A plain OpenAI-compatible server may refuse those, so `plain_chat` drops
them before a request goes to one.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.ports import JSON, JSONObject

CHAT_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "refusal"})


def _plain(message: JSON) -> JSON:
    if not isinstance(message, dict):
        return message
    plain: JSONObject = {k: v for k, v in message.items() if k in CHAT_MESSAGE_KEYS}
    content = plain.get("content")
    if isinstance(content, list):
        plain["content"] = [
            {k: v for k, v in part.items() if k != "cache_control"} if isinstance(part, dict) else part
            for part in content
        ]
    return plain


def plain_chat(body: JSONObject) -> JSONObject:
    """`body` with every message cut to the chat-completions fields."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body
    return {**body, "messages": [_plain(m) for m in messages]}


def text_of(content: JSON) -> str:
    """A chat content's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call of an assistant message (or one fragment of a streamed call)."""

    id: str | None
    name: str
    arguments: str


def _call(call: JSONObject) -> Call:
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
    return Call(
        call_id if isinstance(call_id, str) and call_id else None,
        name if isinstance(name, str) else "",
        arguments if isinstance(arguments, str) else "",
    )


def calls_of(message: JSONObject) -> list[Call]:
    """The tool calls of a chat message, in order."""
    calls = message.get("tool_calls")
    return [_call(c) for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def call_delta(part: JSONObject, known: int) -> tuple[int, Call]:
    """A streamed tool-call fragment: its position (`index`, else the next after `known`) and content."""
    position = part.get("index")
    return (position if isinstance(position, int) else known), _call(part)
