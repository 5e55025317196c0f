"""What the current question asks of the past: a time range ("last week", "in March"), exact terms
(file names, codes, numbers, quoted text), and whether it asks about earlier turns at all.

Pure functions over the question text; the retrieval section turns them into filters and weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MONTHS = {
    name: index + 1
    for index, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ]
    )
    for name in names
}
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}

_AGO = re.compile(r"\b(\d+|a|an|one|two|three|four|five|six|seven)\s+(day|week|month|year)s?\s+ago\b")
_RELATIVE = re.compile(r"\b(today|yesterday|(?:this|last|past|previous)\s+(?:week|month|year))\b")
# "in March", "during march 2024", "back in Oct": the word before a month name must make it a date, so
# "may" the verb and "march" the verb do not become filters.
_IN_MONTH = re.compile(
    r"\b(?:in|during|since|from|back in|early|late|mid)\s+("
    + "|".join(sorted(_MONTHS, key=len, reverse=True))
    + r")\b\.?(?:\s+(\d{4}))?"
)
# Past-pointing phrasing: a question about what was said or done before, not a new task.
_PAST = re.compile(
    r"\b(did|was|were|had|earlier|before|previously|last time|remember|recall|again|"
    r"(?:we|you|i|they|he|she)\s+(?:said|told|mentioned|decided|agreed|picked|chose|discussed|talked|"
    r"asked|used|tried|found|blamed|settled|went|got|made|wrote|shared))\b"
)
# Identifier-like terms searched verbatim: with a digit, dot, underscore, slash or inner capital, or quoted.
_TERM = re.compile(r"[A-Za-z0-9_./:-]*(?:\d|[._/]\w|[a-z][A-Z])[A-Za-z0-9_./:-]*")
_QUOTED = re.compile(r"[\"“'`]([^\"”'`]{3,80})[\"”'`]")


@dataclass(frozen=True, slots=True)
class TimeRange:
    since: datetime | None
    until: datetime | None
    phrase: str


@dataclass(frozen=True, slots=True)
class QuestionFacts:
    about_past: bool
    time_range: TimeRange | None
    terms: tuple[str, ...]  # exact terms to look for verbatim (lower-cased)


def analyse(question: str, now: datetime) -> QuestionFacts:
    lowered = question.lower()
    time_range = time_range_of(lowered, now)
    return QuestionFacts(
        about_past=time_range is not None or _PAST.search(lowered) is not None,
        time_range=time_range,
        terms=exact_terms(question),
    )


def exact_terms(question: str) -> tuple[str, ...]:
    terms = [m.group(1).strip() for m in _QUOTED.finditer(question)]
    terms += [m.group(0).strip(".,:;/-") for m in _TERM.finditer(question)]
    seen: dict[str, None] = {}
    for term in terms:
        # "10" or "e.g" would match nearly anything: a term needs three characters.
        if len(re.sub(r"[\W_]", "", term)) >= 3 and not term.startswith("<"):
            seen.setdefault(term.lower(), None)
    return tuple(seen)


def contains_term(text: str, term: str) -> bool:
    """`term` in `text` (both lower-cased) as a whole token: "10" is not found in "2010"."""
    return re.search(rf"(?<![\w]){re.escape(term)}(?![\w])", text) is not None


def time_range_of(lowered: str, now: datetime) -> TimeRange | None:
    """The first time reference in the (lower-cased) question as a [since, until) range around `now`;
    None when there is none or it lies outside the calendar ("3000 years ago", "in May 0000")."""
    try:
        return _time_range(lowered, now)
    except (OverflowError, ValueError):
        return None


def _time_range(lowered: str, now: datetime) -> TimeRange | None:
    now = now.astimezone(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    match = _AGO.search(lowered)
    if match:
        amount = _NUMBERS.get(match.group(1)) or int(match.group(1))
        days = amount * _UNIT_DAYS[match.group(2)]
        slack = max(days // 4, 1)  # "three weeks ago" is a fuzzy point: a window around it
        center = midnight - timedelta(days=days)
        return TimeRange(center - timedelta(days=slack), center + timedelta(days=slack + 1), match.group(0))
    match = _RELATIVE.search(lowered)
    if match:
        phrase = " ".join(match.group(1).split())
        if phrase == "today":
            return TimeRange(midnight, None, phrase)
        if phrase == "yesterday":
            return TimeRange(midnight - timedelta(days=1), midnight, phrase)
        which, unit = phrase.split()
        start = _period_start(midnight, unit)
        if which == "this":
            return TimeRange(start, None, phrase)
        if which == "past":  # "the past week": a rolling period ending now
            return TimeRange(midnight - timedelta(days=_UNIT_DAYS[unit]), None, phrase)
        return TimeRange(_period_start(start - timedelta(days=1), unit), start, phrase)
    match = _IN_MONTH.search(lowered)
    if match:
        month = _MONTHS[match.group(1)]
        year = int(match.group(2)) if match.group(2) else now.year
        if match.group(2) is None and (year, month) > (now.year, now.month):
            year -= 1  # "in November" asked in March means last November
        start = datetime(year, month, 1, tzinfo=UTC)
        end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
        return TimeRange(start, end, match.group(0).strip())
    return None


def _period_start(day: datetime, unit: str) -> datetime:
    if unit == "week":
        return day - timedelta(days=day.weekday())  # weeks start on Monday
    if unit == "month":
        return day.replace(day=1)
    return day.replace(month=1, day=1)
