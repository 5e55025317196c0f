"""What each conversation's last request sent, so a resent history is hashed only where it is new.

A chat app resends its whole history on every call: the previous call's messages plus the newest turns.
Chain-hashing all of them (canonical form + sha256 per message) made the identify step grow with the
conversation. The memo keeps, per conversation (keyed by the chain hash of its first message, which holds
the tenant and the user or conversation id), the messages last seen with their chain hashes and history
items; a new request compares its messages with them, and only the messages after the common prefix are
canonicalised and hashed. The comparison is Python's list equality, which runs in C (identity first, then
dict equality): a fraction of a microsecond per message instead of the ~10 µs of hashing one.

Chain hashes depend on content alone, so nothing the memo holds goes stale; a deleted conversation's
hashes are simply not found in the store and the messages are stored again as new. Python's equality
takes 1, 1.0 and true for one another, so two messages differing only in that way are taken for the same
one (the first one seen is kept): JSON values a client would not swap between resends of one message.
Bounded in bytes (an estimate: each message's text plus what holding it costs, ~430 bytes measured with
tracemalloc); the conversations used least recently go first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.pipeline.call import HistoryItem
from gateway.ports import JSONObject

# What holding one message costs besides its text: its dict, chain hash and history item (tracemalloc,
# 200 chats of 100 messages: 830 bytes a message of 400 characters).
MESSAGE_OVERHEAD_BYTES = 430


def message_bytes(message: JSONObject) -> int:
    """What the memo counts for one message: the length of every string in it (its text, tool-call
    arguments, an image's or audio's base64 data) plus MESSAGE_OVERHEAD_BYTES. Counted once, when the
    message is new."""
    size = MESSAGE_OVERHEAD_BYTES
    pending: list[object] = [message]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return size


@dataclass(frozen=True, slots=True)
class Seen:
    """A conversation's chain (its messages after the leading system ones) as last sent, with the chain
    hash, the history item and the running total of `message_bytes` of each message (the same length)."""

    messages: Sequence[JSONObject]
    hashes: Sequence[str]
    items: Sequence[HistoryItem]
    running_bytes: Sequence[int]

    @property
    def bytes(self) -> int:
        return self.running_bytes[-1] if self.running_bytes else 0


def running_bytes(before: Seen | None, shared: int, chain: Sequence[JSONObject]) -> list[int]:
    """The running total of `message_bytes` over `chain`, taken from `before` for the `shared` messages
    they begin with (counted once, when a message is new)."""
    totals = list(before.running_bytes[:shared]) if before is not None else []
    total = totals[-1] if totals else 0
    for message in chain[len(totals) :]:
        total += message_bytes(message)
        totals.append(total)
    return totals


def common_prefix(old: Sequence[JSONObject], new: Sequence[JSONObject]) -> int:
    """How many leading messages `old` and `new` share. Whole slices are compared (in C): first all of
    them, then by bisection down to the first difference, about twice the work of one comparison."""
    n = min(len(old), len(new))
    if old[:n] == new[:n]:
        return n
    same, differs = 0, n  # old[:same] == new[:same]; old[same:differs] != new[same:differs]
    while differs - same > 1:
        middle = (same + differs) // 2
        if old[same:middle] == new[same:middle]:
            same = middle
        else:
            differs = middle
    return same


class HistoryMemo:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be at least 0")
        self.max_bytes = max_bytes
        self._held = 0
        self._seen: OrderedDict[str, Seen] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def cache_bytes(self) -> dict[str, int]:
        return {"history_memo": self._held}

    @property
    def bytes_held(self) -> int:
        return self._held

    def recall(self, key: str, messages: Sequence[JSONObject]) -> tuple[Seen | None, int]:
        """What was last seen under `key` and how many of `messages` it shares from the start."""
        seen = self._seen.get(key)
        if seen is None:
            return None, 0
        self._seen.move_to_end(key)
        return seen, common_prefix(seen.messages, messages)

    def keep(self, key: str, seen: Seen) -> None:
        if seen.bytes > self.max_bytes:
            self.forget(key)  # larger than the whole memo: it would only push everything else out
            return
        self.forget(key)
        self._seen[key] = seen
        self._held += seen.bytes
        while self._held > self.max_bytes:
            _, oldest = self._seen.popitem(last=False)
            self._held -= oldest.bytes

    def forget(self, key: str) -> None:
        old = self._seen.pop(key, None)
        if old is not None:
            self._held -= old.bytes
