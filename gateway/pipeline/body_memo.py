"""Parse a resent chat body without parsing again the history an earlier body already sent.

A chat app resends its whole history on every call, so `orjson.loads` of the body grows with the
conversation: about 12 ms for the 3.9 MB of a 10,000-message one on this machine, the largest cost left in
the request once the history memo (history_memo.py) stopped re-hashing it. This memo keeps, for recent
large bodies, the raw bytes of their `messages` array, the parsed messages and the byte offset at which
each of them ends. A new body whose array starts with the same bytes up to a message boundary is parsed
with that stretch cut out, and the messages parsed before are put back in front of the new ones. The
result equals `orjson.loads(raw)`; the reused messages are the very objects of the earlier parse, so the
history memo's comparison of the two requests stops at identity.

Why the result is the same: the stretch cut out is a byte-for-byte copy of complete array elements, each
followed by a comma, that parsed to exactly those values before; removing such a stretch from an array
leaves its other elements and the rest of the document as they were. The array must be the value of the
body's top-level `messages` key (checked by parsing what precedes it), and a later duplicate `messages`
key (which would win in orjson) is looked for in the part that is parsed.

Where each message ends is learnt by serialising it again with orjson and checking that the body holds
exactly those bytes. That holds for the compact JSON the OpenAI and Anthropic SDKs send (httpx, and
JSON.stringify in JavaScript); for other spellings (spaces after separators, `\\u00e9` escapes, a
pretty-printed body) the boundaries stop at the first message spelt differently, and the rest of such a
body is simply parsed in full: nothing is wrong, only less is saved.

Lookup: a body is filed under short samples of its array's bytes at a few fixed depths (16 KiB, 64 KiB,
... into the array); a new body is looked up from its deepest sample down, so conversations that share a
long system prompt still find their own entry. A wrong candidate costs one comparison and saves nothing.
Bounded by the bytes held; the entries used least recently go first. Bodies below `min_bytes` are parsed
as they are (their parse takes microseconds). Not thread-safe: one per tenant, on the event loop.
"""

from __future__ import annotations

import re
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import orjson

from gateway.metrics import Counters
from gateway.ports import JSON

_FIELD = re.compile(rb'"messages"\s*:\s*\[')
_DEPTHS = tuple(1 << (14 + 2 * i) for i in range(6))  # 16 KiB, 64 KiB, ... 16 MiB into the array
_SAMPLE = 512  # bytes ending at each depth, hashed as the key


@dataclass(slots=True)
class _Entry:
    prefix: bytes  # the array's bytes after `[`, through the comma after the last known message
    ends: list[int]  # ends[i]: offset in `prefix` just past the comma that follows message i
    messages: list[JSON]  # the parsed messages, one per offset
    keys: tuple[tuple[int, int], ...]


class BodyMemo:
    def __init__(self, max_bytes: int, counters: Counters, min_bytes: int = 32 * 1024) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be at least 0")
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._held = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._by_key: dict[tuple[int, int], _Entry] = {}
        self._counters = counters  # body_messages_reused: messages not parsed again

    def cache_bytes(self) -> dict[str, int]:
        return {"body_memo": self._held}

    @property
    def bytes_held(self) -> int:
        return self._held

    def __len__(self) -> int:
        return len(self._entries)

    def loads(self, raw: bytes) -> object:
        """`orjson.loads(raw)`, sparing the stretch of `messages` an earlier body sent. Raises what
        orjson raises on a body that is not JSON."""
        if len(raw) < self.min_bytes or self.max_bytes == 0:
            return orjson.loads(raw)
        found = _FIELD.search(raw)
        if found is None or not _top_level(raw, found.start()):
            return orjson.loads(raw)
        start = found.end()  # the first byte after `[`
        keys = _keys(raw, start)
        entry = next((self._by_key[k] for k in reversed(keys) if k in self._by_key), None)
        reused = _shared(entry, raw, start) if entry is not None else 0
        if entry is None or reused == 0:
            data = orjson.loads(raw)
            messages = data.get("messages") if isinstance(data, dict) else None
            if isinstance(messages, list):
                self._learn(raw, start, keys, [], 0, messages)
            return data
        cut = entry.ends[reused - 1]
        if raw.count(b'"messages"', start + cut) > 0:  # a second `messages` key would win: parse all
            return orjson.loads(raw)
        try:
            data = orjson.loads(raw[:start] + raw[start + cut :])
        except orjson.JSONDecodeError:
            return orjson.loads(raw)  # raises again, with the position in the body the client sent
        assert isinstance(data, dict)  # what precedes the array was checked to open an object
        fresh = data["messages"]
        assert isinstance(fresh, list)
        data["messages"] = entry.messages[:reused] + fresh
        self._counters.body_messages_reused += reused
        self._learn(raw, start, keys, entry.ends[:reused], cut, data["messages"], known=reused)
        return data

    def _learn(
        self,
        raw: bytes,
        start: int,
        keys: tuple[tuple[int, int], ...],
        ends: list[int],
        at: int,
        messages: list[JSON],
        known: int = 0,
    ) -> None:
        """File the body's messages whose bytes are verified: the first `known` ones are (their offsets
        are `ends`), the others are serialised again and compared with the body from offset `at`."""
        ends = ends + _boundaries(raw, start + at, messages[known:], at)
        if not ends:
            return
        entry = _Entry(raw[start : start + ends[-1]], ends, list(messages[: len(ends)]), keys)
        if len(entry.prefix) > self.max_bytes:
            return
        for key in keys:
            old = self._by_key.get(key)
            if old is not None:
                self._drop(old)
        self._entries[id(entry)] = entry
        self._held += len(entry.prefix)
        for key in keys:
            self._by_key[key] = entry
        while self._held > self.max_bytes:
            self._drop(next(iter(self._entries.values())))

    def _drop(self, entry: _Entry) -> None:
        if self._entries.pop(id(entry), None) is None:
            return
        self._held -= len(entry.prefix)
        for key in entry.keys:
            if self._by_key.get(key) is entry:
                del self._by_key[key]


def _top_level(raw: bytes, at: int) -> bool:
    """Whether the `"messages"` at `at` is a key of the top-level object: what precedes it, closed with
    an empty array, must parse as an object (`{` and complete members, each followed by a comma)."""
    try:
        head = orjson.loads(raw[:at] + b'"messages":[]}')
    except orjson.JSONDecodeError:
        return False
    return isinstance(head, dict) and head.get("messages") == []


def _keys(raw: bytes, start: int) -> tuple[tuple[int, int], ...]:
    view = memoryview(raw)
    return tuple(
        (depth, zlib.crc32(view[start + depth - _SAMPLE : start + depth]))
        for depth in _DEPTHS
        if start + depth <= len(raw)
    )


def _shared(entry: _Entry, raw: bytes, start: int) -> int:
    """How many of the entry's messages the new body's array starts with, byte for byte."""
    prefix = memoryview(entry.prefix)
    if raw.startswith(prefix, start):
        return len(entry.ends)
    same, differs = 0, len(entry.ends)  # messages[:same] match; messages[:differs] do not
    while differs - same > 1:
        middle = (same + differs) // 2
        if raw.startswith(prefix[: entry.ends[middle - 1]], start):
            same = middle
        else:
            differs = middle
    return same


def _boundaries(raw: bytes, at: int, messages: Sequence[JSON], offset: int) -> list[int]:
    """Offsets (counted from `at - offset`, the array's start) just past the comma after each of
    `messages`, read from `at` on, while each one's bytes are exactly its compact serialisation; stops at
    the first that is not, and at the last (followed by `]`)."""
    if not messages:
        return []
    spelt = list(map(orjson.dumps, messages))
    joined = b",".join(spelt)
    if raw.startswith(joined, at):  # the usual case: compact, every one known
        every = [offset + end for end in accumulate(len(piece) + 1 for piece in spelt)]
        if raw[at + len(joined) : at + len(joined) + 1] != b",":
            every.pop()  # the last message is followed by `]`, not a comma
        return every
    ends: list[int] = []
    position = at
    for piece in spelt:
        end = position + len(piece)
        if not raw.startswith(piece, position) or raw[end : end + 1] != b",":
            break
        position = end + 1
        ends.append(offset + position - at)
    return ends
