"""Resident memory of a LanceDB message index under a steady stream of small writes and searches, as a
long-running gateway makes them: LanceDB's default caches against the bounded ones the adapter now opens
its connection with (gateway/adapters/lance_table.py, INDEX_CACHE_BYTES and METADATA_CACHE_BYTES), and
those with glibc's heaps limited to two (`arenas`: gateway/collector.py, tune_malloc), and those
with glibc's free pages returned every TRIM_EVERY rounds (`trim`: collector.release_free_heap), with
the connection and table opened afresh every REOPEN_EVERY rounds (`reopen`, two heaps), and on jemalloc
(`jemalloc`: preloaded, glibc's settings left alone).

    python benchmarks/lance_memory.py --rounds 1500       # the three, one after the other, fresh processes

Each round adds one exchange's rows (3 views, 2 messages) to one of 100 conversations and runs the
search a request makes (vector + keyword, that conversation); the adapter compacts as it does in
service. Prints RSS every `--every` rounds and the slope over the last half, in MB per 1,000 rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
    "timeout",
    "backoff",
    "migration",
    "schema",
    "rollback",
    "canary",
]
DIMENSIONS = 384
TRIM_EVERY = 50  # rounds between malloc_trim calls in the `trim` variant
REOPEN_EVERY = 250  # rounds between fresh connections in the `reopen` variant
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"  # Debian's libjemalloc2, preloaded by `jemalloc`


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def slope(samples: list[tuple[int, float]]) -> float:
    """MB per 1,000 rounds over the last half (least squares)."""
    half = samples[len(samples) // 2 :]
    xs = [r / 1000 for r, _ in half]
    ys = [m for _, m in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs) or 1.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread


async def run(
    rounds: int, every: int, default_caches: bool, arenas: bool, trim: bool = False, reopen: int = 0
) -> list[tuple[int, float]]:
    if arenas:
        from gateway.collector import tune_malloc

        tune_malloc()
    import lancedb

    from gateway.adapters import lance_table
    from gateway.adapters.lance_index import LanceIndex
    from gateway.collector import release_free_heap
    from gateway.records import IndexRow, SearchQuery

    if default_caches:
        lance_table.bounded_session = lancedb.Session  # LanceDB's defaults (6 GB and 1 GB)
    rng = random.Random(7)
    samples: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        index = LanceIndex.open(tmp, "messages_bench", DIMENSIONS, cache_rows=0)

        def vector() -> list[float]:
            return [rng.uniform(-1, 1) for _ in range(DIMENSIONS)]

        def text() -> str:
            return " ".join(rng.choice(WORDS) for _ in range(30))

        for r in range(1, rounds + 1):
            conversation = f"c{rng.randrange(100)}"
            rows = [
                IndexRow(
                    f"{conversation}-{r}-{n}:{view}",
                    "t",
                    None,
                    conversation,
                    f"{conversation}-{r}-{n}",
                    view,
                    r,
                    datetime.now(UTC),
                    text(),
                    vector(),
                )
                for n in range(2)
                for view in ("m", "p", "w")
            ]
            await index.add(rows)
            query = SearchQuery("t", text(), vector(), 20, conversation_id=conversation)
            await index.prepare(query)
            await index.search(query)
            if trim and r % TRIM_EVERY == 0:
                release_free_heap()
            if reopen and r % reopen == 0:  # a fresh connection and table handle, the old one closed
                await index.aclose()
                index = LanceIndex.open(tmp, "messages_bench", DIMENSIONS, cache_rows=0)
            if r % every == 0:
                samples.append((r, rss_mb()))
                print(f"  round {r}: {samples[-1][1]:.0f} MB", flush=True)
        await index.aclose()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument(
        "--variant",
        choices=["bounded", "default", "arenas", "trim", "reopen", "jemalloc"],
        default=None,
        help="run one, in this process",
    )
    parser.add_argument("--variants", default="default,bounded,arenas,trim", help="which to run, in order")
    args = parser.parse_args()
    if args.variant:
        samples = asyncio.run(
            run(
                args.rounds,
                args.every,
                args.variant == "default",
                args.variant
                in ("arenas", "trim", "reopen", "jemalloc"),  # jemalloc: tune_malloc stands aside
                args.variant == "trim",
                REOPEN_EVERY if args.variant == "reopen" else 0,
            )
        )
        print(f"{args.variant}: {samples[-1][1]:.0f} MB after {args.rounds} rounds, "
              f"slope over the last half {slope(samples):+.1f} MB per 1,000 rounds")  # fmt: skip
        return 0
    for variant in args.variants.split(","):
        print(f"{variant}:", flush=True)
        argv = [sys.executable, __file__, "--rounds", str(args.rounds), "--every", str(args.every)]
        env = {**os.environ, "LD_PRELOAD": JEMALLOC} if variant == "jemalloc" else None
        subprocess.run([*argv, "--variant", variant], check=True, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
