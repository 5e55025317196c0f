"""A message's readable text: what the summariser reads, the index searches and retrieval shows."""

from __future__ import annotations

from gateway.ports import JSONObject


def message_text(message: JSONObject) -> str:
    """Text parts joined (attachments as `<type>`), tool calls as `<tool call name(arguments)>`."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(str(part["text"]))
            elif isinstance(part, dict):
                parts.append(f"<{part.get('type', 'attachment')}>")
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                parts.append(f"<tool call {function.get('name')}({function.get('arguments')})>")
    return "\n".join(parts)
