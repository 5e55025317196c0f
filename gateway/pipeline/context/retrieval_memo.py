"""What retrieval keeps per stored message between requests: its text in lower case (for the exact-term
checks), the words it writes in capitals (the question's acronyms are searched only where the
conversation writes them) and the tokens of its line (for fitting the allowance). Stored messages never
change and the same old messages come back request after request, so each is made once. The three maps
together hold at most `MEMO_BYTES` (texts at their size in memory, each entry's slot and key at
`ENTRY_BYTES`), and are forgotten all at once when the next entry would pass it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.context.tail_lines import line_of
from gateway.ports import Tokenizer
from gateway.text import message_text

MEMO_BYTES = 16 * 2**20
# A dict slot, its key (a message id of ~40 characters, or a tuple of two strings) and a small int.
ENTRY_BYTES = 200
WORD_BYTES = 60  # a short str and its slot in a frozenset
_CAPITALS = re.compile(r"(?<![\w-])[A-Z]{3,5}(?![\w-])")


@dataclass(slots=True)
class MessageMemo:
    limit: int = MEMO_BYTES
    # (encoding, message id) -> tokens of the message's line and the line break after it: the
    # tokenizer's own cache kept turning over on the old messages retrieval reaches.
    line_tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    lowered_texts: dict[str, str] = field(default_factory=dict)  # message id -> its text in lower case
    # message id -> the words it writes in capitals, lower-cased ("DLQ" -> "dlq")
    capitals_of: dict[str, frozenset[str]] = field(default_factory=dict)
    held: int = 0  # bytes counted in the maps

    def cache_bytes(self) -> dict[str, int]:
        return {"retrieval_memo": self.held}

    def lowered(self, item: HistoryItem) -> str:
        """The message's text in lower case."""
        if item.node_id is None:
            return message_text(item.message).lower()
        text = self.lowered_texts.get(item.node_id)
        if text is None:
            text = message_text(item.message).lower()
            self._make_room(size := sys.getsizeof(text) + ENTRY_BYTES)
            self.lowered_texts[item.node_id] = text
            self.held += size
        return text

    def capitals(self, item: HistoryItem) -> frozenset[str]:
        """The words of three to five capital letters the message writes, lower-cased."""
        if item.node_id is None:
            return _capitals(message_text(item.message))
        found = self.capitals_of.get(item.node_id)
        if found is None:
            found = _capitals(message_text(item.message))
            self._make_room(size := ENTRY_BYTES + WORD_BYTES * len(found))
            self.capitals_of[item.node_id] = found
            self.held += size
        return found

    def item_tokens(self, tokenizer: Tokenizer, item: HistoryItem) -> int:
        """Tokens of one message's line and the line break after it."""
        if item.node_id is None:
            return tokenizer.count(line_of(item) + "\n")
        count = self.line_tokens.get((tokenizer.name, item.node_id))
        return count if count is not None else self.counted(tokenizer, line_of(item), item.node_id)

    def counted(self, tokenizer: Tokenizer, line: str, node_id: str) -> int:
        """Tokens of `line` (message `node_id`'s) and a line break."""
        key = (tokenizer.name, node_id)
        count = self.line_tokens.get(key)
        if count is None:
            count = tokenizer.count(line + "\n")
            self._make_room(ENTRY_BYTES)
            self.line_tokens[key] = count
            self.held += ENTRY_BYTES
        return count

    def _make_room(self, size: int) -> None:
        if self.held + size > self.limit:
            self.lowered_texts.clear()
            self.line_tokens.clear()
            self.capitals_of.clear()
            self.held = 0


def _capitals(text: str) -> frozenset[str]:
    return frozenset(word.lower() for word in _CAPITALS.findall(text))
