"""The vector cache's bound is in bytes: `storage.vector_cache_mb` counts each held row's vector and what
else it keeps of the row (id, metadata, terms), measured with tracemalloc on rows like a chat's."""

from __future__ import annotations

import hashlib
import random
import tracemalloc
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from gateway.adapters.keyword_rank import Analyzer
from gateway.adapters.vector_cache import Entry, VectorCache, rows_within

WORDS = [
    "deploy",
    "queue",
    "retry",
    "ledger",
    "webhook",
    "shard",
    "replica",
    "cache",
    "index",
    "token",
    "budget",
    "window",
    "summary",
    "memory",
    "vector",
    "search",
    "tenant",
    "upstream",
    "stream",
    "latency",
    "the",
    "a",
    "of",
    "to",
    "and",
    "we",
    "should",
    "check",
    "port",
    "8443",
    "KX-4471",
]
DIMENSIONS = 384


def rows(conversation: int, count: int, rng: random.Random) -> pa.Table:
    nodes = [hashlib.sha256(f"{conversation}/{i}".encode()).hexdigest() for i in range(count)]
    views = [("m", "p", "w")[i % 3] for i in range(count)]
    vectors = np.asarray([rng.uniform(-1, 1) for _ in range(count * DIMENSIONS)], dtype=np.float32)
    return pa.table(
        {
            "id": [f"{n}:{v}" for n, v in zip(nodes, views, strict=True)],
            "user_id": ["u1"] * count,
            "node_id": nodes,
            "view": views,
            "depth": list(range(count)),
            "created_at": pa.array([datetime.now(UTC)] * count, pa.timestamp("us", tz="UTC")),
            "dated": [True] * count,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors), DIMENSIONS),
            "text": [
                " ".join(rng.choice(WORDS) for _ in range(rng.randrange(20, 150))) for _ in range(count)
            ],
        }
    )


def test_a_full_vector_cache_holds_about_the_megabytes_it_is_given() -> None:
    rng = random.Random(5)
    tables = [rows(c, 300, rng) for c in range(12)]
    cache = VectorCache(rows_within(4, DIMENSIONS))  # 4 MB: ~1,570 rows, five conversations of 300
    analyzer = Analyzer()
    Entry.empty("warm-up", DIMENSIONS).merged(tables[0], 1, analyzer)  # the analyzer's own caches
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n, table in enumerate(tables):
            cache.put(("t", f"c{n}"), Entry.empty(f"c{n}", DIMENSIONS).merged(table, 1, analyzer))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.rows == 1500  # the newest five conversations; the older seven were dropped
    # Near 1,500 rows' share of 4 MB: the bound counts more than the vectors (which alone would be
    # 2.3 MB, and before, the bound counted those alone: 4 MB then held 6.8 MB).
    share = 4 * 2**20 * cache.rows / cache.max_rows
    assert 0.75 * share < held < 1.25 * share, (held, share)
