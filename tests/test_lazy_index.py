"""The index and the memory vectors are opened by their first use, not at start-up (issue 29): an idle
gateway imports no LanceDB, concurrent first calls open once, and a failed open is tried again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.adapters.lazy_index import LazyMemoryVectors, LazyVectorIndex
from gateway.errors import SearchIndexError
from gateway.fakes.memory_index import MemoryIndex
from gateway.fakes.memory_vectors import InMemoryMemoryVectors
from gateway.memory.records import MemoryQuery, MemoryRow
from gateway.ports import VectorIndex
from gateway.records import IndexRow, SearchQuery

BASE = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def index_row(row_id: str, text: str) -> IndexRow:
    return IndexRow(row_id, "acme", "ann", "c1", row_id, "m", 0, BASE, text, [1.0, 0.0])


def test_the_index_opens_once_on_first_use_even_when_called_concurrently() -> None:
    opened: list[str] = []
    inner = MemoryIndex()

    def open_index() -> VectorIndex:
        opened.append(threading.current_thread().name)
        time.sleep(0.05)  # the callers arriving meanwhile wait for this open
        return inner

    async def scenario() -> None:
        index = LazyVectorIndex(open_index)
        assert not index.opened and opened == []
        query = SearchQuery("acme", "locker code", [1.0, 0.0], 5)
        await asyncio.gather(index.add([index_row("r1", "the locker code is 4417")]), index.search(query))
        assert index.opened and len(opened) == 1
        assert opened[0] != threading.current_thread().name  # opened off the event loop
        result = await index.search(query)
        assert [hit.node_id for hit in result.semantic] == ["r1"]
        assert await index.rows_of("acme", "c1") == [("r1", True)]
        await index.delete("acme", conversation_id="c1")
        assert await index.rows_of("acme", "c1") == []
        await index.aclose()
        assert len(opened) == 1

    asyncio.run(scenario())


def test_a_failed_open_raises_to_its_caller_and_the_next_call_tries_again() -> None:
    attempts: list[int] = []
    inner = InMemoryMemoryVectors()

    def open_vectors() -> InMemoryMemoryVectors:
        attempts.append(1)
        if len(attempts) == 1:
            raise SearchIndexError("cannot open index table 'memories_x': storage unreachable")
        return inner

    async def scenario() -> None:
        vectors = LazyMemoryVectors(open_vectors)
        with pytest.raises(SearchIndexError):
            await vectors.count("acme")
        assert not vectors.opened
        row = MemoryRow("m1", "acme", "ann", "user", "preference", "likes tea", BASE, vector=[1.0, 0.0])
        await vectors.upsert([row])
        assert vectors.opened and len(attempts) == 2
        assert await vectors.count("acme") == 1
        found = await vectors.search(MemoryQuery("acme", "ann", ("user",), "tea", [1.0, 0.0], 5))
        assert [hit.memory_id for hit in found.semantic] == ["m1"]
        await vectors.aclose()

    asyncio.run(scenario())


def test_an_unopened_index_closes_without_opening() -> None:
    def never() -> VectorIndex:
        raise AssertionError("opened")

    asyncio.run(LazyVectorIndex(never).aclose())


def test_the_default_config_builds_without_importing_lancedb(tmp_path: Path) -> None:
    script = (
        "import sys, asyncio\n"
        "from gateway.cli import default_config\n"
        "from gateway.wiring import build_deps\n"
        "deps = build_deps(default_config({}))\n"
        "assert deps.indexes and deps.memory, 'retrieval and memory are on by default'\n"
        "assert not {'lancedb', 'pyarrow'} & set(sys.modules), 'LanceDB imported at start-up'\n"
        "asyncio.run(deps.aclose())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "GATEWAY_CONFIG")}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "data" / "lancedb").exists()  # no table made yet


def test_a_close_during_the_first_open_closes_what_it_opened_and_nothing_opens_after() -> None:
    opened: list[MemoryIndex] = []
    started = threading.Event()

    def slow_open() -> VectorIndex:
        started.set()
        time.sleep(0.3)
        opened.append(MemoryIndex())
        return opened[-1]

    async def scenario() -> None:
        lazy = LazyVectorIndex(slow_open)
        first = asyncio.create_task(lazy.add([index_row("r1", "kept")]))
        await asyncio.to_thread(started.wait)
        await lazy.aclose()  # waits for the open under way, then closes it
        await first  # the call that opened it completed before the close
        assert len(opened) == 1 and not lazy.opened
        with pytest.raises(SearchIndexError, match="closed"):
            await lazy.add([index_row("r2", "after")])
        assert len(opened) == 1  # not opened again after the close

    asyncio.run(scenario())
