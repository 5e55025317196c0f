"""The views with neighbours' vectors composed from their members' vectors, all of a job's at once."""

from __future__ import annotations

import math

from gateway.jobs.neighbour_vectors import composed_all


def unit(*values: float) -> list[float]:
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def test_each_view_gets_the_normalised_sum_of_the_members_it_names() -> None:
    vectors = [unit(1, 0, 0), unit(0, 1, 0), unit(0, 0, 1), unit(1, 1, 0)]
    got = composed_all(vectors, [[0, 1], [0, 1, 2], [3], [1, 3]])
    expected = [unit(1, 1, 0), unit(1, 1, 1), unit(1, 1, 0), unit(0.5**0.5, 1 + 0.5**0.5, 0)]
    for view, want in zip(got, expected, strict=True):
        assert max(abs(a - b) for a, b in zip(view, want, strict=True)) < 1e-6


def test_a_sum_that_cancels_out_gives_way_to_its_first_member_and_one_member_stays_as_it_is() -> None:
    left, right, up = unit(1, 0, 0), unit(-1, 0, 0), unit(0, 1, 0)
    assert composed_all([left, right, up], [[0, 1], [2], [1, 0]]) == [left, up, right]


def test_no_views_compose_to_nothing() -> None:
    assert composed_all([unit(1, 0)], []) == []
