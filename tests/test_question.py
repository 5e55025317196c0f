"""The question's time references, exact terms and past-pointing phrasing."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.pipeline.context.question import (
    _WORD_CHAR,
    acronyms,
    analyse,
    contains_term,
    exact_terms,
    identifier_words,
    inner_names,
    named_terms,
    states,
    time_range_of,
)

NOW = datetime(2026, 3, 18, 15, 30, tzinfo=UTC)  # a Wednesday


@pytest.mark.parametrize(
    ("question", "since", "until"),
    [
        ("what did we say yesterday?", datetime(2026, 3, 17, tzinfo=UTC), datetime(2026, 3, 18, tzinfo=UTC)),
        ("anything today?", datetime(2026, 3, 18, tzinfo=UTC), None),
        (
            "which port did we pick last week",
            datetime(2026, 3, 9, tzinfo=UTC),
            datetime(2026, 3, 16, tzinfo=UTC),
        ),
        ("this week's plan", datetime(2026, 3, 16, tzinfo=UTC), None),
        ("the bug from last month", datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)),
        ("the decision in November", datetime(2025, 11, 1, tzinfo=UTC), datetime(2025, 12, 1, tzinfo=UTC)),
        ("back in march 2024?", datetime(2024, 3, 1, tzinfo=UTC), datetime(2024, 4, 1, tzinfo=UTC)),
        ("during December 2025", datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)),
        ("two weeks ago", datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 8, tzinfo=UTC)),
    ],
)
def test_time_references_become_ranges(question: str, since: datetime, until: datetime | None) -> None:
    found = time_range_of(question.lower(), NOW)
    assert found is not None
    assert (found.since, found.until) == (since, until)


@pytest.mark.parametrize(
    "question", ["may I ask you something?", "we march on", "write a poem about spring", "how are you"]
)
def test_no_time_reference_where_there_is_none(question: str) -> None:
    assert time_range_of(question.lower(), NOW) is None


def test_exact_terms_are_identifiers_numbers_and_quotes() -> None:
    terms = exact_terms('Why did parse_config.py raise E1234 on port 8443 after "the big refactor"?')
    assert {"parse_config.py", "e1234", "8443", "the big refactor"} <= set(terms)
    assert "why" not in terms and "port" not in terms
    assert "the old cache" in exact_terms("What did 'the old cache' do?")
    assert "the old cache" in exact_terms("What did \u2018the old cache\u2019 do?")


def test_a_phrase_of_three_to_five_words_or_parts_gives_its_initials() -> None:
    assert "dlq" in acronyms("What concerns were raised about dropping the dead-letter queue of ledgerd?")
    assert acronyms("What is the time to live of the cache?") == ("ttl",)  # one small word inside
    assert "dlq" in analyse("去掉 courier 的 dead letter queue 有哪些风险？", NOW).acronyms
    # Never across punctuation or CJK text, never from the words of asking, never a word it says.
    assert acronyms("Which one: dead, letter, queue?") == ()
    assert acronyms("What activities does Melanie partake in?") == ()
    assert "cat" not in acronyms("Is the cat a tenant here, cat?")


def test_apostrophes_are_no_quotes() -> None:
    """Between the apostrophes of "I'm ... I'm" lies no quoted term (it was one, and the hop searched it)."""
    text = "Hi! I'm planning a trip to Lisbon in May. I'm vegetarian and we'd rather not fly early."
    assert exact_terms(text) == ()
    assert named_terms(text) == ("lisbon",)
    assert exact_terms("the users' 'export job' failed") == ("export job",)


def test_names_and_reasons() -> None:
    assert named_terms("Then Chen Jie owns ledger-api, says Priya.") == ("ledger-api", "chen jie", "priya")
    assert named_terms("The build is green. Okay.") == ()
    # In a Chinese question a plain English word is a name too (not in an English one).
    assert exact_terms("存 refunds 的那个数据库跑的是哪个 Postgres 版本？") == ("refunds", "postgres")
    assert exact_terms("Which database stores refunds?") == ()
    # Values are no leads: a time, a date, a year, a port, a duration, a share.
    text = "At 06:09 on 2026-05-08 the cache-01 warm-up (port 8443) took 45s, 12% slower than in 2025."
    assert named_terms(text) == ("cache-01", "warm-up")
    assert named_terms("Don't page anyone: 2024-03-10T18:46:57Z webhooks.retry lag 3Gi, Ines says.") == (
        "webhooks.retry",
        "ines",
    )
    assert analyse("Why did we drop Redis?", NOW).asks_why
    assert analyse("我们为什么决定用 Kafka？", NOW).asks_why
    assert analyse("Redis를 왜 뺐지?", NOW).asks_why
    assert not analyse("Which port does ledger-api use?", NOW).asks_why


def test_kebab_case_names_are_exact_terms() -> None:
    """Services, hosts and packages are spelled like this; a hyphen alone (e-mail) is no name."""
    assert exact_terms("Which port does ledger-api listen on?") == ("ledger-api",)
    assert exact_terms("Is session-broker's pool full?") == ("session-broker",)
    assert exact_terms("send an e-mail about the x-ray") == ()
    assert exact_terms("ledger-api里的端口是多少？") == ("ledger-api",)
    assert "k8s-node-12" in exact_terms("what runs on k8s-node-12")


def test_a_plain_word_the_conversation_writes_inside_an_identifier_is_a_term() -> None:
    """The word "payouts" of "which database holds payouts?" is the table a chat writes as /v1/payouts or
    payouts_external_ref_idx; a word only prose joins with a hyphen, or says alone, is none."""
    question = "Which Postgres version runs the database that holds payouts?"
    texts = ["get /v1/payouts?limit=100 returns 100 rows.", "the payouts table is in pg-ledger-2."]
    assert identifier_words(question, texts, ()) == ("payouts",)
    assert identifier_words(question, ["create index payouts_external_ref_idx on payouts"], ()) == (
        "payouts",
    )
    assert identifier_words(question, ["the payouts table is in pg-ledger-2. postgres 16 runs it."], ()) == ()
    assert identifier_words("Where are the pet-friendly parks?", ["a pet-friendly park/cafe"], ()) == ()
    # Words of the asking are none, wherever a chat writes them ("from_date", "update_at").
    assert identifier_words("What did we update from there?", ["from_date", "update_at"], ()) == ()
    # Part of a term already, or a question in Chinese (its Latin words are terms): nothing more.
    assert identifier_words("Where is payouts_idx used?", ["payouts_idx"], ("payouts_idx",)) == ()
    assert identifier_words("payouts 存在哪个数据库？", ["/v1/payouts"], ("payouts",)) == ()


def test_a_word_capitalised_only_because_a_sentence_starts_with_it_names_no_one() -> None:
    assert inner_names("Write a two-line thank-you note to Priya.") == ("priya",)
    assert inner_names("Explain how this works") == ()
    assert inner_names('Ok. "Tell Sam" about it? Then ask Wang Fang.') == ("sam", "wang fang")
    assert inner_names("Priya, can you check?") == ()  # a name that starts the request is missed


def test_past_pointing_questions() -> None:
    assert analyse("What exact function did we blame for the CPU spike?", NOW).about_past
    assert analyse("remember the name we chose?", NOW).about_past
    assert analyse("show me last week's numbers", NOW).about_past  # a time reference counts
    assert not analyse("Write a haiku about autumn leaves", NOW).about_past
    assert analyse("What did the pen testers flag?", NOW).in_past_tense
    assert analyse("我们之前定的端口是多少？", NOW).in_past_tense
    # Beside the past, not in it: about the past only where old messages match it (retrieval.py).
    assert analyse("What should I check before deploying?", NOW).about_past
    assert not analyse("What should I check before deploying?", NOW).in_past_tense
    assert not analyse("Can you try that again?", NOW).in_past_tense


@pytest.mark.parametrize("question", ["what happened 3000 years ago?", "in may 0000", "99999999999 days ago"])
def test_references_outside_the_calendar_are_ignored(question: str) -> None:
    assert time_range_of(question, NOW) is None
    assert analyse(question, NOW).time_range is None  # and the build does not fail


def test_terms_match_whole_tokens_only() -> None:
    assert exact_terms("give me 10 ideas, e.g. five") == ()  # too short to mean an exact reference
    assert contains_term("we opened port 8443 today", "8443")
    assert not contains_term("released in 2010", "010")
    assert contains_term("see parse_config.py line 3", "parse_config.py")
    assert not contains_term("see parse_config.pyc", "parse_config.py")
    assert contains_term("中文8443", "8443")  # a CJK character is no word character: a boundary
    assert not contains_term("port 8443x", "8443") and contains_term("8443", "8443")


_LETTERS = "ab1 ._-é中ü/A"  # word characters, separators, a CJK letter, non-ASCII letters


@given(st.text(alphabet=_LETTERS, max_size=14), st.text(alphabet=_LETTERS, min_size=1, max_size=4))
def test_whole_token_match_is_the_boundary_pattern(text: str, term: str) -> None:
    """contains_term finds by str.find plus a check on each side; the definition is the pattern."""
    pattern = re.compile(rf"(?<!{_WORD_CHAR}){re.escape(term)}(?!{_WORD_CHAR})")
    assert contains_term(text, term) == (pattern.search(text) is not None)


@pytest.mark.parametrize(
    ("question", "since", "until"),
    [
        ("上周我们把端口改成什么了？", datetime(2026, 3, 9, tzinfo=UTC), datetime(2026, 3, 16, tzinfo=UTC)),
        ("昨天说的那个版本号", datetime(2026, 3, 17, tzinfo=UTC), datetime(2026, 3, 18, tzinfo=UTC)),
        ("3月的时候决定了什么", datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC)),
        ("十二月的迁移计划", datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)),
        ("2024年3月发生了什么", datetime(2024, 3, 1, tzinfo=UTC), datetime(2024, 4, 1, tzinfo=UTC)),
        ("两周前说过的方案", datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 8, tzinfo=UTC)),
        ("上个月的事故", datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)),
        ("지난주에 배포한 버전은?", datetime(2026, 3, 9, tzinfo=UTC), datetime(2026, 3, 16, tzinfo=UTC)),
        ("어제 말했던 포트", datetime(2026, 3, 17, tzinfo=UTC), datetime(2026, 3, 18, tzinfo=UTC)),
        ("3월에 결정한 것", datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC)),
        ("2025년 12월에 바꾼 설정", datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)),
        ("지난달 장애", datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)),
    ],
)
def test_chinese_and_korean_time_references(question: str, since: datetime, until: datetime | None) -> None:
    found = time_range_of(question.lower(), NOW)
    assert found is not None
    assert (found.since, found.until) == (since, until)
    assert analyse(question, NOW).about_past


@pytest.mark.parametrize("question", ["3个月的预算是多少", "每月的报告", "写一首关于春天的诗", "한 달 동안"])
def test_no_time_reference_in_these_chinese_and_korean_questions(question: str) -> None:
    assert time_range_of(question.lower(), NOW) is None


def test_identifiers_inside_chinese_and_korean_text() -> None:
    assert exact_terms("我们之前提到的parse_config.py里的超时是多少？") == ("parse_config.py",)
    assert "parse_config.py" in exact_terms("parse_config.py에서 타임아웃이 몇 초였지?")
    assert contains_term("把 parse_config.py里的超时改成30秒", "parse_config.py")
    assert contains_term("포트는 8443으로 바꿨어요", "8443")
    assert not contains_term("端口是18443", "8443")
    assert analyse("我们之前讨论过的方案", NOW).about_past
    assert analyse("아까 말했던 포트 번호", NOW).about_past


def test_a_turn_that_asks_about_a_term_does_not_state_it() -> None:
    asked = "is p99 fine? what is the current retry policy for fx-rates? i keep forgetting."
    assert not states(asked, "fx-rates")
    assert states("update: fx-rates goes to 2 retries. does that work?", "fx-rates")
    assert not states("fx-rates 的重试策略现在是什么？", "fx-rates")


@pytest.mark.parametrize(
    ("question", "current"),
    [
        ("What is the current retry policy for fx-rates?", True),
        ("Which alert routing did we end up with for doc-render?", True),
        ("doc-render 目前的告警路由是什么？", True),
        ("When did we roll back courier?", False),
        ("What did Melanie paint last year?", False),
    ],
)
def test_a_question_about_how_things_stand_now_is_told_apart(question: str, current: bool) -> None:
    assert analyse(question, NOW).asks_current is current


@pytest.mark.parametrize(
    ("question", "when_done"),
    [
        ("When did we actually cut DNS for plan-api over?", True),
        ("On which day did we finally backfill invoices back to 2021?", True),
        ("最后是哪天把 invoices 回填到 2021 年的？", True),
        ("When will we cut DNS over?", False),
        ("What did Melanie paint last year?", False),
    ],
)
def test_a_question_asking_when_something_was_done_is_told_apart(question: str, when_done: bool) -> None:
    assert analyse(question, NOW).asks_when_done is when_done
