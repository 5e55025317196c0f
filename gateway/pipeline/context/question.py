"""What the current question asks of the past: a time range ("last week", "in March"; "上周", "3月",
"지난주" too), exact terms (file names, codes, numbers, quoted text), and whether it asks about earlier
turns at all.

Pure functions over the question text; the retrieval section turns them into filters and weights.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gateway.text import CJK, mostly_cjk

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
# Words of _PAST that point near the past without asking about it ("check before deploying").
_NEAR_PAST = frozenset(["earlier", "before", "again"])
# Identifier-like terms searched verbatim: with a digit, dot, underscore, slash or inner capital, or quoted.
# An identifier is a run of these characters holding a digit, an inner dot, underscore or slash, or a
# camelCase hump. Runs are found first and tested apart (one pass, linear): one pattern doing both
# backtracked over every start of a long run without such a mark (16 KB of "x": 7 s).
_RUN = re.compile(r"[A-Za-z0-9_./:-]+")
_MARK = re.compile(r"\d|[._/]\w|[a-z][A-Z]")
_LONGEST_TERM = 200
# Double quotes and backticks anywhere; a single quote only where no letter touches it on the outside
# (the apostrophes of "I'm ... I'm" are no quotes).
_QUOTED = re.compile(r"[\"“`]([^\"”`]{3,80})[\"”`]|(?<!\w)['\u2018]([^'\u2018\u2019]{3,80})['\u2019](?!\w)")


# A CJK letter does not end an English identifier ("parse_config.py里的" names the file).
_WORD_CHAR = rf"[^\W{CJK}]"
_ONE_WORD_CHAR = re.compile(_WORD_CHAR)
# A whole Latin word, not a piece of a longer identifier ("ledger" of "ledger-api", "parse_config" of ".py").
_LATIN_WORD = re.compile(r"(?<![\w./:-])[A-Za-z][A-Za-z0-9_]{2,}(?![\w/:-]|\.\w)", re.ASCII)
# Kebab-case names ("ledger-api", "session-broker"): how services, hosts and packages are spelled.
_KEBAB = re.compile(rf"(?<!{_WORD_CHAR}|-)[A-Za-z][a-z0-9]+(?:-[a-z0-9]{{2,}})+(?!{_WORD_CHAR}|-)")

# Chinese and Korean time phrases, rewritten to the English ones below before they are read. Order
# matters: "3个月前" (3 months ago) before "3月" (March), "十二月" before "二月".
_CN_DIGITS = {
    "一": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
    "十": 10,
}
_CN_MONTHS = {"十一": 11, "十二": 12, **{k: v for k, v in _CN_DIGITS.items() if k != "两"}}
_MONTH_NAMES = [next(name for name, number in _MONTHS.items() if number == m) for m in range(1, 13)]
# Digits start where a number starts and stop at four (a run of digits is not tried from each place).
_DIGITS = r"(?<!\d)(\d{1,4})"
_NUM = r"((?<!\d)\d{1,4}|[一二两三四五六七八九十])"


def _number(raw: str) -> int:
    return int(raw) if raw.isdigit() else _CN_DIGITS[raw]


def _month(raw: str) -> str:
    month = int(raw) if raw.isdigit() else _CN_MONTHS.get(raw, 0)
    return f" in {_MONTH_NAMES[month - 1]} " if 1 <= month <= 12 else raw


_LOCAL_AGO: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"{_NUM}\s*(?:天|日)\s*(?:前|之前|以前)|{_DIGITS}\s*일\s*전"), "day"),
    (
        re.compile(rf"{_NUM}\s*(?:个|個)?\s*(?:星期|礼拜|禮拜|周|週)\s*(?:前|之前|以前)|{_DIGITS}\s*주\s*전"),
        "week",
    ),
    (re.compile(rf"{_NUM}\s*(?:个|個)\s*月\s*(?:前|之前|以前)|{_DIGITS}\s*(?:개월|달)\s*전"), "month"),
    (re.compile(rf"{_NUM}\s*年\s*(?:前|之前|以前)|{_DIGITS}\s*년\s*전"), "year"),
]
_LOCAL_PHRASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"今天|今日|오늘"), " today "),
    (re.compile(r"昨天|昨日|어제"), " yesterday "),
    (re.compile(r"前天|그제|그저께"), " 2 days ago "),
    (re.compile(r"(?:这|這|本)(?:个|個)?(?:星期|礼拜|禮拜|周|週)|이번\s*주"), " this week "),
    (re.compile(r"上(?:个|個)?(?:星期|礼拜|禮拜|周|週)|지난\s*주"), " last week "),
    (re.compile(r"(?:这|這)(?:个|個)月|本月|이번\s*달"), " this month "),
    (re.compile(r"上(?:个|個)?月|지난\s*달"), " last month "),
    (re.compile(r"今年|올해"), " this year "),
    (re.compile(r"去年|작년|지난해"), " last year "),
]
_LOCAL_MONTH = re.compile(r"(?:(\d{4})\s*[年년]\s*)?(\d{1,2}|十[一二]|[一二三四五六七八九十])\s*[月월]")


def _localised(lowered: str) -> str:
    """The question with its Chinese and Korean time phrases written as the English ones."""
    if not re.search(f"[{CJK}]", lowered):
        return lowered
    for pattern, unit in _LOCAL_AGO:

        def ago(match: re.Match[str], unit: str = unit) -> str:
            return f" {_number(next(g for g in match.groups() if g))} {unit}s ago "

        lowered = pattern.sub(ago, lowered)
    for pattern, english in _LOCAL_PHRASES:
        lowered = pattern.sub(english, lowered)

    def month(match: re.Match[str]) -> str:
        named = _month(match.group(2))
        return f"{named.rstrip()} {match.group(1)} " if match.group(1) and named != match.group(2) else named

    return _LOCAL_MONTH.sub(month, lowered)


# Past-pointing phrasing in Chinese and Korean ("之前说过", "上次", "아까 말했던").
_LOCAL_PAST = re.compile(
    r"之前|以前|刚才|剛才|上次|记得|記得|说过|說過|提到|提过|决定|決定|讨论过|討論過|"
    r"전에|아까|지난번|기억|말했|얘기했|이야기했|했었|결정했"
)


_WHY = re.compile(
    r"\bwhy\b|\bhow come\b|\breasons?\b|\bwhat (?:made|drove|led)\b|为什么|為什麼|为何|為何|原因|理由|왜|이유"
)


@dataclass(frozen=True, slots=True)
class TimeRange:
    since: datetime | None
    until: datetime | None
    phrase: str


# Asks for where something stands now ("the current timeout", "what did we end up with", "目前", "최종"):
# a value said several times, revised, whose newest statement answers.
_CURRENT = re.compile(
    r"\b(?:current(?:ly)?|now|latest|final(?:ly)?|end(?:ed)? up|settled? on|landed|at the moment|these days|"
    r"still)\b|现在|現在|目前|当前|當前|最终|最終|最后|最後|最新|定下来|定下來|지금|현재|최종|최근"
)


# Asks on which day something was done ("when did we actually cut DNS over?", "最后是哪天回填的"): the
# answer is the later report that it was, often in words of its own ("the DNS cutover: shipped").
_WHEN_DONE = re.compile(
    r"\bwhen (?:did|was|were)\b|\b(?:which|what) (?:day|date)\b|哪天|哪一天|什么时候|什麼時候|何时|何時|几号|幾號|"
    r"언제"
)


@dataclass(frozen=True, slots=True)
class QuestionFacts:
    about_past: bool
    time_range: TimeRange | None
    terms: tuple[str, ...]  # exact terms to look for verbatim (lower-cased)
    asks_why: bool = False  # asks for a reason ("why", "what was the reason", "为什么", "왜")
    asks_current: bool = False  # asks where something stands now ("current", "end up with", "目前")
    asks_when_done: bool = False  # asks on which day something was done ("when did we ...", "哪天")
    acronyms: tuple[str, ...] = ()  # what its phrases would be written as in capitals ("dlq")
    # Said in the past tense or of what was said ("did", "was", "we decided", "记得"), not only beside the
    # past ("check before deploying", "try again"): such a question recalls however old messages score.
    in_past_tense: bool = False


def analyse(question: str, now: datetime) -> QuestionFacts:
    lowered = question.lower()
    time_range = time_range_of(lowered, now)
    marks = {m.group(1) for m in _PAST.finditer(lowered)}
    local = _LOCAL_PAST.search(lowered) is not None
    tense = bool(marks - _NEAR_PAST) or local
    past = bool(marks) or local
    return QuestionFacts(
        about_past=time_range is not None or past,
        time_range=time_range,
        terms=exact_terms(question),
        asks_why=_WHY.search(lowered) is not None,
        asks_current=_CURRENT.search(lowered) is not None,
        asks_when_done=_WHEN_DONE.search(lowered) is not None,
        acronyms=acronyms(question),
        in_past_tense=tense,
    )


def exact_terms(question: str) -> tuple[str, ...]:
    terms = [(m.group(1) or m.group(2)).strip() for m in _QUOTED.finditer(question)]
    terms += [
        m.group(0).strip(".,:;/-")
        for m in _RUN.finditer(question)
        if len(m.group(0)) <= _LONGEST_TERM and _MARK.search(m.group(0))
    ]
    terms += [m.group(0) for m in _KEBAB.finditer(question)]
    if mostly_cjk(question):
        # A Latin word in a Chinese, Japanese or Korean question names something ("存 refunds 的数据库":
        # the table), as a mark would in an English one.
        terms += [m.group(0) for m in _LATIN_WORD.finditer(question)]
    seen: dict[str, None] = {}
    for term in terms:
        # "10" or "e.g" would match nearly anything: a term needs three characters.
        if len(re.sub(r"[\W_]", "", term)) >= 3 and not term.startswith("<"):
            seen.setdefault(term.lower(), None)
    return tuple(seen)


# A plain word of an English question (four letters or more) that the conversation writes as a piece of a
# snake_case, dotted or path identifier ("/v1/payouts", "payouts_external_ref_idx") names a thing there, as
# a Latin word of a Chinese question does. Hyphens do not count: prose joins words with them
# ("pet-friendly").
_PLAIN_WORD = re.compile(r"(?<![\w./:-])[a-z][a-z0-9]{3,}(?![\w/:-]|\.\w)")


def identifier_words(question: str, texts: Iterable[str], terms: tuple[str, ...]) -> tuple[str, ...]:
    """The plain words of `question` (not part of its `terms`) that one of `texts` (lower case) writes
    inside an identifier: exact terms of the question too (the table "payouts" of "which database holds
    payouts?")."""
    if mostly_cjk(question):
        return ()  # its Latin words are terms already (`exact_terms`)
    words = [
        w
        for w in dict.fromkeys(_PLAIN_WORD.findall(question.lower()))
        if w not in _ASKING and w not in _NOT_NAMES and not any(w in t for t in terms)
    ]
    if not words:
        return ()
    either = "|".join(words)
    piece = re.compile(rf"[a-z0-9][_/.]({either})(?![a-z0-9])|(?<![a-z0-9])({either})[_/.][a-z0-9]")
    found: set[str] = set()
    for text in texts:
        found.update(m.group(1) or m.group(2) for m in piece.finditer(text))
        if len(found) == len(words):
            break
    return tuple(w for w in words if w in found)


# Capitalised words that start sentences rather than name anyone.
_STARTERS = (
    "a an and also any are as at be but by can could did do does for from got good had has have he her "
    "here his how i if in is it its just let lets maybe me my no noted now of ok okay on or our she so "
    "sure thanks thank that the their then there these they this those to up us was we were what when "
    "where which who why will with would yes yet you your fyi heads reminder update scratch change "
    "great hi hey hello please right well monday tuesday wednesday thursday friday saturday sunday"
)
_NOT_NAMES = frozenset(_STARTERS.split()) | frozenset(_MONTHS)
_CAPITALISED = re.compile(r"(?<![\w-])[A-Z][^\W\d_]{2,}(?:\s+[A-Z][^\W\d_]{2,})*(?!['\u2019]t\b)")


# A number, time, date, size or duration ("8443", "06:09", "2026-05-08", "45s", "12%"): a value a message
# states, not a name that another message picks up.
_VALUE = re.compile(r"[v#]?[\d:.,/%+-]+(?:t[\d:.,+-]+)?(?:am|pm|utc|z|ms|s|m|h|d|k|x|[kmgt]i?b?)?", re.I)


def capitalised_names(text: str) -> tuple[str, ...]:
    """The capitalised names a message holds, lower-cased ("Priya", "Chen Jie")."""
    names = []
    for match in _CAPITALISED.finditer(text):
        words = match.group(0).lower().split()
        while words and words[0] in _NOT_NAMES:  # "Then Chen Jie": the name is "chen jie"
            words.pop(0)
        if words:
            names.append(" ".join(words))
    return tuple(dict.fromkeys(names))


# Where a sentence starts, with its opening quotes or brackets: a capital there names no one by itself.
_SENTENCE_START = re.compile(r"(^|[.!?\n]\s*)([\"'(\[]*)([A-Z])")


def inner_names(text: str) -> tuple[str, ...]:
    """`capitalised_names` of `text` but for words capitalised only because a sentence starts with them
    ("Write a note to Priya." names "priya", not "write")."""
    return capitalised_names(
        _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2) + m.group(3).lower(), text)
    )


def kebab_names(text: str) -> set[str]:
    """The kebab-case names `text` holds ("ledger-api"), a channel's ("#ops-alerts") left out: a
    decision's value, not what it is about."""
    return {m.group(0) for m in _KEBAB.finditer(text) if text[m.start() - 1 : m.start()] != "#"}


def named_terms(text: str) -> tuple[str, ...]:
    """What a message names (lower-cased): its exact terms, then its capitalised names, the leads of a
    second search; values (numbers, times, dates) are no leads."""
    terms = [t for t in exact_terms(text) if not _VALUE.fullmatch(t)]
    return tuple(dict.fromkeys([*terms, *capitalised_names(text)]))


_SENTENCE_END = re.compile(r"(?<=[.!?\uff1f\u3002\uff01])\s+|\n+")


def states(lowered: str, term: str) -> bool:
    """Whether a message holds `term` in a sentence that is not a question."""
    return any(
        contains_term(sentence, term) and not sentence.rstrip().endswith(("?", "\uff1f"))
        for sentence in _SENTENCE_END.split(lowered)
        if term in sentence
    )


def contains_term(text: str, term: str) -> bool:
    """`term` in `text` (both lower-cased) as a whole token: "10" is not found in "2010".

    The same test as the pattern `(?<!W)term(?!W)` (W: one word character), done with `str.find` and
    a one-character check on each side: compiling a pattern per term cost more than the searches (a
    32-conversation run met thousands of distinct terms a second, more than any cache of patterns
    held, and spent ~6 % of a core in `re`'s compiler)."""
    at = text.find(term)
    while at >= 0:
        starts = at == 0 or _ONE_WORD_CHAR.match(text, at - 1) is None
        if starts and _ONE_WORD_CHAR.match(text, at + len(term)) is None:
            return True
        at = text.find(term, at + 1)
    return False


def time_range_of(lowered: str, now: datetime) -> TimeRange | None:
    """The first time reference in the (lower-cased) question as a [since, until) range around `now`;
    None when there is none or it lies outside the calendar ("3000 years ago", "in May 0000")."""
    try:
        return _time_range(_localised(lowered), now)
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


# The topic of a question: its words other than the names it asks about and the asking itself.
_WORD = re.compile(r"[a-z][a-z0-9]{2,}")
_CJK_WORDS = re.compile(f"[{CJK}]+")
# Words of the asking, not of the topic ("what is the current X", "X 最后定的是什么").
_ASKING_WORDS = (
    "what which who whom how when where why did does do is are was were the for with and our we you current "
    "currently now latest final finally end ended settled settle landed moment these days still use used "
    "using have has had there that this right today going actually"
)
_ASKING = frozenset(_ASKING_WORDS.split())
_ASKING_CJK = frozenset("的是什么现在目前当前最后终定了哪个呢吗在用还")
STEM = 4  # "retry" and "retries", "log" and "logs": words are compared by their first four letters


def topic(question: str, names: tuple[str, ...]) -> frozenset[str]:
    """The question's topic words, lower case: Latin words by their stems, CJK runs by their bigrams,
    without the names it asks about (`names`, its exact terms) and the words of asking."""
    lowered = question.lower()
    for name in names:
        lowered = lowered.replace(name, " ")
    words = {w[:STEM] for w in _WORD.findall(lowered) if w not in _ASKING}
    for run in _CJK_WORDS.findall(lowered):
        words |= {run[i : i + 2] for i in range(len(run) - 1) if not _ASKING_CJK & set(run[i : i + 2])}
    return frozenset(words)


def shared_words(text: str, words: frozenset[str]) -> int:
    """How many of the topic `words` (from `topic`) the lower-cased `text` holds."""
    found = _WORD.findall(text)
    # A three-letter word ("log", "fix") is found by the first three letters of a longer one.
    stems = {w[:STEM] for w in found} | {w[:3] for w in found}
    return sum(w in stems or (len(w) == 2 and w in text) for w in words)


# Latin words joined by spaces or hyphens only: an acronym's letters never cross punctuation or CJK text.
_LATIN_PHRASE = re.compile(r"[A-Za-z]+(?:[ \t-]+[A-Za-z]+)*")
# Written inside an acronym's phrase and sometimes lettered ("time to live": TTL), never first or last.
_GLUE = frozenset(["of", "to", "in", "on", "for", "and", "a", "an", "by", "at", "as"])
_ACRONYM_WORDS = (3, 5)


def acronyms(question: str) -> tuple[str, ...]:
    """The initials (lower case) of each stretch of 3 to 5 words and hyphenated parts of the question
    that neither starts nor ends with a small word nor holds more than one, nor a word of asking: "dead-
    letter queue" -> "dlq", said in a chat as "killing the DLQ". Most are no acronym at all; only those
    the conversation writes in capitals count (`ranking.acronyms_held`)."""
    lowest, highest = _ACRONYM_WORDS
    found: dict[str, None] = {}
    for phrase in _LATIN_PHRASE.finditer(question):
        pieces = re.split(r"[ \t-]+", phrase.group(0).lower())
        for start in range(len(pieces)):
            for end in range(start + lowest, min(start + highest, len(pieces)) + 1):
                window = pieces[start:end]
                if window[0] in _GLUE or window[-1] in _GLUE or sum(w in _GLUE for w in window) > 1:
                    continue
                if any(w in _ASKING for w in window):
                    continue
                found.setdefault("".join(w[0] for w in window), None)
    words = set(_WORD.findall(question.lower()))
    return tuple(a for a in found if a not in words)
