"""The kind of value a question asks for (an address, a port, a size, a version, a schedule, a span of
time) and whether a text holds one. A find of the second hop that holds a value of the asked kind says
what was asked even where it shares no word with the question: the hosts file that gives the box's
address for "what's the private IP of the box forecast-trainer runs on?", the manifest's `memory: 2Gi`
for "最多能用多少内存"."""

from __future__ import annotations

import re

# (what a question asking for the kind says, what a value of it looks like), both read in lower case. Not
# a disk: "how full" is answered by a share ("81%"), and sizes beside it misled (BENCHMARKS.md).
_KINDS: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...] = tuple(
    (re.compile(asked), re.compile(value))
    for asked, value in (
        (r"\bip\b|\baddress\b|地址", r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])"),
        (r"\bports?\b|端口", r"\bport\w*\W{1,3}\d{2,5}\b|(?<![\w.:]):\d{2,5}\b"),
        (r"\bmemory\b|\bram\b|\bheap\b|内存", r"\b\d+(?:\.\d+)?\s?(?:[kmgt]i|[kmgt]b)\b"),
        (r"\bversions?\b|版本", r"\bv?\d+\.\d+(?:\.\d+)*\b"),
        (r"\bcron\b|\bschedule\b|定时|调度", r"(?:^|[\s\"'])(?:[\d*/,-]+[ \t]+){4}[\d*/,-]+"),
        (
            r"\btimeouts?\b|\bhow long\b|\blatency\b|超时|多久|多长时间",
            r"\b\d+(?:\.\d+)?\s?(?:ms|s|secs?|seconds?|mins?|minutes?|h|hours?|days?)\b|\d+\s?(?:毫秒|秒|分钟|小时|天)",
        ),
    )
)


def asked_kinds(question: str) -> tuple[re.Pattern[str], ...]:
    """The value patterns of the kinds the (lower-cased) `question` asks for; none for most questions."""
    return tuple(value for asked, value in _KINDS if asked.search(question))


def holds_kind(text: str, kinds: tuple[re.Pattern[str], ...]) -> bool:
    """Whether the lower-cased `text` holds a value of one of `kinds`."""
    return any(kind.search(text) for kind in kinds)
