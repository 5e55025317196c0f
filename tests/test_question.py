"""The question's time references, exact terms and past-pointing phrasing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.pipeline.context.question import analyse, exact_terms, time_range_of

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


def test_past_pointing_questions() -> None:
    assert analyse("What exact function did we blame for the CPU spike?", NOW).about_past
    assert analyse("remember the name we chose?", NOW).about_past
    assert analyse("show me last week's numbers", NOW).about_past  # a time reference counts
    assert not analyse("Write a haiku about autumn leaves", NOW).about_past
