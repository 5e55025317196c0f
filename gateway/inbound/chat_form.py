"""The pipeline's chat form and what a chat upstream may be sent of it.

The store keeps what each front door's client sent, losslessly: besides the chat fields, `thinking_blocks`
(Anthropic thinking, signed), `is_error` on tool results and `cache_control` on content parts (Anthropic),
`response_items` and `trailing_items` (Responses items with no chat message: reasoning, built-in tool calls). A plain OpenAI-compatible server may refuse those, so `plain_chat` drops
them before a request goes to one.
"""

from __future__ import annotations

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
