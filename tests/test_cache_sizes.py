"""The cache-size registry behind `gateway_cache_bytes`: summed by cache and owner, a part shared by
tenants counted once, a part whose engine fails left out of one reading without failing it."""

from __future__ import annotations

import logging

import pytest

from gateway.pipeline.call import HistoryItem
from gateway.pipeline.history_memo import HistoryMemo, Seen
from gateway.telemetry.cache_sizes import PROCESS, CacheSizes


class Failing:
    def cache_bytes(self) -> dict[str, int]:
        raise RuntimeError("engine gone")


class Fixed:
    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def cache_bytes(self) -> dict[str, int]:
        return self.sizes


def test_sizes_are_summed_by_cache_and_owner_and_a_failing_part_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sizes = CacheSizes()
    shared = Fixed({"vectors": 1_000, "lancedb": 200})
    sizes.add(PROCESS, shared)
    sizes.add("acme", shared)  # the same index reached from a second tenant: counted once
    sizes.add("acme", Fixed({"history_memo": 30}))
    sizes.add("beta", Fixed({"history_memo": 12}))
    sizes.add("beta", Failing())
    sizes.add("beta", object())  # keeps no cache: not registered
    with caplog.at_level(logging.WARNING):
        held = sizes.read()
    assert held == {
        ("vectors", PROCESS): 1_000,
        ("lancedb", PROCESS): 200,
        ("history_memo", "acme"): 30,
        ("history_memo", "beta"): 12,
    }
    assert "cannot read the cache sizes" in caplog.text
    shared.sizes["vectors"] = 5_000  # read afresh each time
    assert sizes.read()[("vectors", PROCESS)] == 5_000


def test_a_real_memo_reports_what_it_holds() -> None:
    memo = HistoryMemo(1 << 20)
    sizes = CacheSizes()
    sizes.add("acme", memo)
    assert sizes.read() == {("history_memo", "acme"): 0}
    message = {"role": "user", "content": "hello"}
    memo.keep("c1", Seen([message], ["h1"], [HistoryItem(message, 2, "n1")], [700]))
    assert sizes.read() == {("history_memo", "acme"): 700} and memo.bytes_held == 700
