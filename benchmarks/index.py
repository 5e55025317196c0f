"""The message index (LanceDB) on its own: search latency of the retrieval step and write throughput.

    python benchmarks/index.py            # 100k rows, 384-d, ~2 minutes
    python benchmarks/index.py --quick    # 20k rows, smoke run

Builds one table like production's: random unit vectors, chat-like text with rare tokens (error codes,
ports, file names, identifiers), 30 conversations (~3,300 rows each) across 3 tenants. Then, for one
conversation, as the retrieval step asks it (tenant + conversation, depth below the recent window):
  semantic only / keyword only / both concurrently (LanceIndex.search) / both one after the other /
  both through the blocking API on two worker threads (the alternative this adapter was measured
  against) / a user-wide search (every conversation of the user but this one);
and write throughput: bulk adds, then small embed-job-sized writes (add text, then set_vectors), with
latency measured on the fragmented table, after `optimize()`, and with the adapter's own automatic
compaction (LanceDB's optimize()).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import lancedb
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.adapters.lance_index import OPTIMIZE_EVERY_WRITES, LanceIndex, keyword_query  # noqa: E402
from gateway.records import IndexRow, SearchQuery  # noqa: E402

WORDS = [
    "i",
    "we",
    "you",
    "the",
    "a",
    "it",
    "this",
    "that",
    "should",
    "could",
    "maybe",
    "just",
    "really",
    "think",
    "need",
    "want",
    "check",
    "try",
    "run",
    "fix",
    "deploy",
    "build",
    "test",
    "restart",
    "update",
    "config",
    "server",
    "client",
    "request",
    "response",
    "database",
    "query",
    "index",
    "cache",
    "memory",
    "latency",
    "timeout",
    "retry",
    "token",
    "budget",
    "summary",
    "window",
    "message",
    "branch",
    "merge",
    "commit",
    "release",
    "docker",
    "kubernetes",
    "pod",
    "node",
    "cluster",
    "service",
    "endpoint",
    "logs",
    "metrics",
    "error",
    "warning",
    "failed",
    "works",
    "again",
    "yesterday",
    "today",
    "tomorrow",
    "morning",
    "after",
    "before",
    "because",
    "since",
    "still",
    "also",
    "only",
    "very",
    "slow",
    "fast",
]
RARE = [
    "ECONNRESET",
    "ETIMEDOUT",
    "ECONNREFUSED",
    "E1234",
    "E4012",
    "E0427",
    "port",
    "8443",
    "port",
    "5432",
    "port",
    "6379",
    "parse_config.py",
    "user_profile_cache",
    "settings_loader.ts",
    "build_index.rs",
    "10.0.4.17",
    "v2.3.1",
    "OOMKilled",
    "SIGTERM",
]


def chat_text(rng: np.random.Generator) -> str:
    words = list(rng.choice(WORDS, size=int(rng.integers(8, 40))))
    if rng.random() < 0.05:
        words.insert(int(rng.integers(0, len(words))), str(rng.choice(RARE)))
    return " ".join(words)


def unit_vectors(rng: np.random.Generator, count: int, dims: int) -> np.ndarray:
    values = rng.standard_normal((count, dims)).astype(np.float32)
    values /= np.linalg.norm(values, axis=1, keepdims=True)
    return values


def build_rows(
    rng: np.random.Generator, total: int, conversations: int, tenants: int, dims: int
) -> list[IndexRow]:
    per = total // conversations
    start = datetime(2025, 1, 1, tzinfo=UTC)
    vectors = unit_vectors(rng, total, dims)
    rows = []
    for i in range(total):
        conversation = min(i // per, conversations - 1)
        depth = i - conversation * per
        rows.append(
            IndexRow(
                id=f"c{conversation}-n{depth}:m",
                tenant=f"t{conversation % tenants}",
                user_id=f"u{conversation % (tenants * 2)}",
                conversation_id=f"c{conversation}",
                node_id=f"c{conversation}-n{depth}",
                view="m",
                depth=depth,
                created_at=start + timedelta(minutes=i),
                text=chat_text(rng),
                vector=vectors[i].tolist(),
            )
        )
    return rows


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2] * 1000
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000
    return f"p50 {p50:6.2f} ms   p95 {p95:6.2f} ms"


async def timed(fn: Callable[[], Awaitable[object]], iterations: int) -> list[float]:
    for _ in range(max(10, iterations // 10)):  # warm the caches
        await fn()
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - started)
    return samples


class Searches:
    """The measured queries against one conversation of tenant t1."""

    def __init__(
        self, index: LanceIndex, uri: str, rng: np.random.Generator, dims: int, per_conversation: int
    ):
        self.index = index
        self.rng = rng
        self.dims = dims
        self.questions = [
            "why did ECONNRESET happen on port 8443 again after the deploy",
            "what was wrong in parse_config.py yesterday",
            "remind me what we decided about the cache timeout",
            "the E1234 error is back, what did we try before?",
        ]
        self.turn = 0
        self.max_depth = per_conversation - 20  # the newest 20 messages are the recent window
        sync_table = lancedb.connect(uri, read_consistency_interval=timedelta(0)).open_table(index.name)
        self.sync_table = sync_table

    def query(self, *, vector: bool = True, text: bool = True, user_wide: bool = False) -> SearchQuery:
        self.turn += 1
        return SearchQuery(
            tenant="t1",
            text=self.questions[self.turn % len(self.questions)] if text else "",
            vector=unit_vectors(self.rng, 1, self.dims)[0].tolist() if vector else None,
            limit=20,
            conversation_id=None if user_wide else "c1",
            user_id="u1" if user_wide else None,
            exclude_conversation_id="c1" if user_wide else None,
            max_depth=None if user_wide else self.max_depth,
        )

    async def semantic(self) -> object:
        return await self.index.search(self.query(text=False))

    async def keyword(self) -> object:
        return await self.index.search(self.query(vector=False))

    async def both(self) -> object:
        return await self.index.search(self.query())

    async def sequential(self) -> object:
        query = self.query()
        await self.index.search(_only(query, text=False))
        return await self.index.search(_only(query, vector=False))

    async def user_wide(self) -> object:
        return await self.index.search(self.query(user_wide=True))

    async def blocking_threads(self) -> object:
        """Both rankings through LanceDB's blocking API, each on a worker thread."""
        query = self.query()
        where = f"tenant = 't1' AND conversation_id = 'c1' AND depth < {self.max_depth}"
        columns = ["node_id", "conversation_id", "view", "depth", "created_at"]
        text = keyword_query(query.text)
        assert query.vector is not None and text is not None

        def semantic() -> object:
            search: Any = self.sync_table.search(query.vector)  # typed as the generic builder
            search = search.distance_type("cosine").where(where)
            return search.limit(20).select([*columns, "_distance"]).to_arrow()

        def keyword() -> object:
            search = self.sync_table.search(text).where(where)
            return search.limit(20).select([*columns, "_score"]).to_arrow()

        async with anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, semantic)
            group.start_soon(anyio.to_thread.run_sync, keyword)
        return None

    async def report(self, label: str, iterations: int, *, full: bool = False) -> None:
        print(f"  [{label}]")
        cases: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("semantic only", self.semantic),
            ("keyword only", self.keyword),
            ("both, concurrently (search)", self.both),
            ("both, sequentially", self.sequential),
        ]
        if full:
            cases += [
                ("both, blocking API on 2 threads", self.blocking_threads),
                ("user-wide (other conversations)", self.user_wide),
            ]
        for name, fn in cases:
            print(f"    {name:34s} {percentiles(await timed(fn, iterations))}")


def _only(query: SearchQuery, *, vector: bool = True, text: bool = True) -> SearchQuery:
    return SearchQuery(
        tenant=query.tenant,
        text=query.text if text else "",
        vector=query.vector if vector else None,
        limit=query.limit,
        conversation_id=query.conversation_id,
        user_id=query.user_id,
        exclude_conversation_id=query.exclude_conversation_id,
        max_depth=query.max_depth,
    )


async def small_writes(
    index: LanceIndex,
    rng: np.random.Generator,
    dims: int,
    jobs: int,
    batch: int,
    offset: int,
    searches: Searches | None = None,
) -> tuple[float, float, list[float]]:
    """Embed-job-sized writes into tenant t0's conversations: add the text, then the vectors. Returns
    (add rows/s, set_vectors rows/s, search latencies measured between the jobs when `searches` is
    given), compaction included when the index does it on its own."""
    add_time = vector_time = 0.0
    latencies: list[float] = []
    start = datetime(2025, 6, 1, tzinfo=UTC)
    for job in range(jobs):
        rows = [
            IndexRow(
                id=f"new{offset + job}-{k}:m",
                tenant="t0",
                user_id="u0",
                conversation_id=f"c{(job % 10) * 3}",
                node_id=f"new{offset + job}-{k}",
                view="m",
                depth=100_000 + job * batch + k,
                created_at=start + timedelta(seconds=job * batch + k),
                text=chat_text(rng),
            )
            for k in range(batch)
        ]
        started = time.perf_counter()
        await index.add(rows)
        add_time += time.perf_counter() - started
        vectors = unit_vectors(rng, batch, dims)
        started = time.perf_counter()
        await index.set_vectors("t0", {row.id: vectors[k].tolist() for k, row in enumerate(rows)})
        vector_time += time.perf_counter() - started
        if searches is not None:
            for _ in range(5):
                started = time.perf_counter()
                await searches.both()
                latencies.append(time.perf_counter() - started)
    total = jobs * batch
    return total / add_time, total / vector_time, latencies


def fragment_count(index: LanceIndex) -> int:
    stats: object = lancedb.connect(index.uri).open_table(index.name).stats()
    assert isinstance(stats, dict)
    return int(stats["fragment_stats"]["num_fragments"])


async def main(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="index-bench-") as tmp:
        uri = str(Path(tmp) / "lancedb")
        never = 10**9
        index = LanceIndex.open(
            uri,
            "messages_bench",
            args.dims,
            optimize_every_writes=never,
            optimize_every_rows=never,
        )
        print(f"{args.rows:,} rows, {args.dims}-d, {args.conversations} conversations, 3 tenants")

        rows = build_rows(rng, args.rows, args.conversations, 3, args.dims)
        started = time.perf_counter()
        for i in range(0, len(rows), args.bulk_batch):
            await index.add(rows[i : i + args.bulk_batch])
        elapsed = time.perf_counter() - started
        print(
            f"bulk add ({args.bulk_batch}-row batches, with vectors): {len(rows) / elapsed:,.0f} rows/s ({elapsed:.1f} s)"
        )
        started = time.perf_counter()
        await index.optimize()
        print(f"optimize() after the bulk load: {time.perf_counter() - started:.2f} s")

        per_conversation = args.rows // args.conversations
        searches = Searches(index, uri, rng, args.dims, per_conversation)
        print(
            f"search: tenant t1, conversation c1 ({per_conversation:,} rows), depth < {searches.max_depth}, top 20"
        )
        await searches.report("compacted", args.iterations, full=True)

        # Embed jobs as the worker runs them, with a search after each (the latency a request sees
        # meanwhile): first with compaction off, then on, as production paces it.
        add_rate, vector_rate, during = await small_writes(
            index, rng, args.dims, args.jobs, args.job_batch, 0, searches
        )
        print(
            f"{args.jobs} embed jobs of {args.job_batch} rows, compaction off: add {add_rate:,.0f} rows/s, "
            f"set_vectors {vector_rate:,.0f} rows/s; {fragment_count(index)} fragments at the end"
        )
        print(f"    both, searched between the jobs    {percentiles(during)}")
        await searches.report(f"after {2 * args.jobs} small writes, no compaction", args.iterations)
        started = time.perf_counter()
        await index.optimize()
        print(f"optimize(): {time.perf_counter() - started:.2f} s; {fragment_count(index)} fragments")
        await searches.report("after optimize()", args.iterations)
        await index.aclose()

        auto = LanceIndex.open(uri, "messages_bench", args.dims)
        searches.index = auto
        started = time.perf_counter()
        add_rate, vector_rate, during = await small_writes(
            auto, rng, args.dims, args.jobs, args.job_batch, args.jobs, searches
        )
        print(
            f"{args.jobs} embed jobs, automatic compaction (every {OPTIMIZE_EVERY_WRITES} writes): "
            f"add {add_rate:,.0f} rows/s, set_vectors {vector_rate:,.0f} rows/s (compaction included), "
            f"{time.perf_counter() - started:.1f} s; {fragment_count(auto)} fragments at the end"
        )
        print(f"    both, searched between the jobs    {percentiles(during)}")
        await auto.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20k rows, fewer iterations")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--conversations", type=int, default=30)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--bulk-batch", type=int, default=2_000)
    parser.add_argument("--jobs", type=int, default=100, help="small writes: embed jobs of --job-batch rows")
    parser.add_argument("--job-batch", type=int, default=60)
    parsed = parser.parse_args()
    if parsed.quick:
        parsed.rows, parsed.iterations, parsed.jobs = 20_000, 100, 40
    asyncio.run(main(parsed))
