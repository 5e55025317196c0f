"""Where a history holds the provider's own compaction: Anthropic's `compaction` blocks (kept on the
chat message as `compaction_blocks`) and OpenAI's encrypted `compaction` items (kept among a message's
`response_items` or `trailing_items`).

The provider reads such a history from its newest compaction on, with its own summary of what came
before it; the gateway forwards it as sent and never folds a summary of its own across it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.ports import JSONObject

_RESPONSE_KEYS = ("response_items", "trailing_items")


def _holds(message: JSONObject) -> bool:
    blocks = message.get("compaction_blocks")
    if isinstance(blocks, list) and blocks:
        return True
    for key in _RESPONSE_KEYS:
        items = message.get(key)
        if isinstance(items, list) and any(
            isinstance(i, dict) and i.get("type") == "compaction" for i in items
        ):
            return True
    return False


def compacted_at(messages: Sequence[JSONObject]) -> int | None:
    """The index of the newest message holding a provider compaction, or None."""
    for index in range(len(messages) - 1, -1, -1):
        if _holds(messages[index]):
            return index
    return None
