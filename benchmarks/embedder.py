"""Throughput and latency of the local embedder (OnnxEmbedder), for each batch size and thread count.

    python benchmarks/embedder.py               # full run, about 1 minute
    python benchmarks/embedder.py --rounds 1    # smoke run
    python benchmarks/embedder.py --compare-models   # MiniLM int8 and multilingual-e5-small side by side

What runs, all in this process: one `OnnxEmbedder` per (threads, batch_size) in threads 1, 2 x batch
sizes 1, 8, 16, 32, 64, each with its own ONNX session, over ~200 generated chat messages of 10-60 words.
Side by side: every round embeds the whole set once with each configuration, in a rotating order, so
background load on a shared machine hits all configurations alike; the median round is reported. A
one-text query (the request path's cost) is timed the same way, interleaved across thread counts.
While the embedders run, a ticker on the event loop records its worst wake-up delay ("loop lag"):
inference happens in a worker thread, and the loop must stay responsive.

Columns: texts/s over the whole set; ms per call = one `session.run` of one batch (the set's time /
its number of batches); CPU ms per text = this process's CPU time (all threads) per text; loop lag =
the worst ticker delay seen during that configuration's runs. Results: a table on stdout and
benchmarks/results/embedder.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from gateway.adapters.onnx_embedder import OnnxEmbedder

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "embedder.json"
BATCH_SIZES = (1, 8, 16, 32, 64)
THREADS = (1, 2)
QUERY = "What did we decide about the budget for the Lisbon offsite in March?"

_OPENERS = [
    "Can you help me",
    "I was wondering whether",
    "Thanks, that worked, but",
    "Quick question:",
    "Sure, here is what I found:",
    "Based on our earlier conversation,",
    "To summarise the main points,",
    "One more thing:",
]
# Mixed topics, as in real chats; each message is a run of words from a random point (wrapping around).
_TEXT = (
    "the deployment database migration timed out after thirty seconds and the team rolled back the "
    "release before the customer noticed anything unusual in the dashboard while we were reviewing "
    "budget numbers for the Lisbon offsite in March including flights hotels and a dinner for twelve "
    "people please remind me tomorrow morning to call the dentist about moving my appointment to "
    "Thursday because the kids have a football match on Wednesday afternoon the python service uses "
    "asyncio and a connection pool so blocking calls must run in a worker thread otherwise latency "
    "spikes for every other request my grandmother's recipe needs two cups of flour one egg a pinch "
    "of salt and butter that has been left out overnight so it is soft enough to mix by hand"
)


def chat_messages(count: int, seed: int = 7) -> list[str]:
    """Chat-like messages of 10-60 words: an opener, then a run of words from a mixed-topic text."""
    rng = random.Random(seed)
    words = _TEXT.split()
    messages = []
    for _ in range(count):
        length = rng.randint(10, 60)
        opener = rng.choice(_OPENERS)
        start = rng.randrange(len(words))
        body = [words[(start + i) % len(words)] for i in range(length - len(opener.split()))]
        end = rng.choice([".", "?", "!", "."])
        messages.append(f"{opener} {' '.join(body)}{end}")
    return messages


@dataclass
class Series:
    threads: int
    batch_size: int
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    loop_lag_ms: float = 0.0


class LagMeter:
    """A 1 ms ticker on the event loop; `worst` is the largest delay beyond the requested sleep."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - before - 0.001)

    def start(self) -> None:
        self.worst = 0.0
        self._task = asyncio.create_task(self._tick())

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.worst * 1000


async def measure(rounds: int, texts: list[str], queries: int) -> dict[str, object]:
    embedders = {
        (threads, batch): OnnxEmbedder.load(threads=threads, batch_size=batch)
        for threads in THREADS
        for batch in BATCH_SIZES
    }
    series = {key: Series(*key) for key in embedders}
    lag = LagMeter()
    keys = list(embedders)
    for embedder in embedders.values():  # warm-up: first runs allocate the arenas
        await embedder.embed(texts[:64])
    for number in range(rounds):
        shift = number % len(keys)
        for key in keys[shift:] + keys[:shift]:
            lag.start()
            cpu, wall = time.process_time(), time.perf_counter()
            vectors = await embedders[key].embed(texts)
            series[key].seconds.append(time.perf_counter() - wall)
            series[key].cpu_seconds.append(time.process_time() - cpu)
            series[key].loop_lag_ms = max(series[key].loop_lag_ms, await lag.stop())
            assert len(vectors) == len(texts)
        print(f"round {number + 1}/{rounds} done", flush=True)

    query_ms: dict[int, list[float]] = {threads: [] for threads in THREADS}
    for number in range(queries):
        for threads in THREADS if number % 2 else THREADS[::-1]:
            started = time.perf_counter()
            await embedders[(threads, 1)].embed([QUERY])
            query_ms[threads].append((time.perf_counter() - started) * 1000)

    rows = []
    for (threads, batch), s in series.items():
        middle = statistics.median(s.seconds)
        calls = math.ceil(len(texts) / batch)
        rows.append(
            {
                "threads": threads,
                "batch_size": batch,
                "texts_per_s": len(texts) / middle,
                "ms_per_call": middle / calls * 1000,
                "cpu_ms_per_text": statistics.median(s.cpu_seconds) / len(texts) * 1000,
                "loop_lag_max_ms": s.loop_lag_ms,
                "seconds": s.seconds,
            }
        )
    query = {
        threads: {
            "p50_ms": statistics.median(values),
            "p99_ms": sorted(values)[min(len(values) - 1, int(len(values) * 0.99))],
        }
        for threads, values in query_ms.items()
    }
    for embedder in embedders.values():
        await embedder.aclose()
    return {"rows": rows, "query": query}


async def compare_models(rounds: int, texts: list[str], queries: int) -> str:
    """Both local models at the gateway's defaults, side by side: single messages and the three-message
    windows the index also embeds, the request path's `embed_query`, and the memory each load added."""
    from gateway.adapters.e5_embedder import E5Embedder
    from gateway.config import LocalEmbedderConfig

    defaults = LocalEmbedderConfig()
    windows = ["\n".join(texts[i : i + 3]) for i in range(len(texts))]
    loaders = {
        "all-MiniLM-L6-v2-int8": lambda: OnnxEmbedder.load(defaults.threads, defaults.batch_size),
        "multilingual-e5-small-q4": lambda: E5Embedder.load(defaults.threads, defaults.batch_size),
    }
    models: dict[str, Any] = {}
    rss: dict[str, float] = {}
    for name, load in loaders.items():
        before = _rss_mb()
        models[name] = load()
        await models[name].embed(texts[:16])  # warm-up
        rss[name] = _rss_mb() - before
    seconds: dict[tuple[str, str], list[float]] = {(m, k): [] for m in models for k in ("single", "window")}
    query_ms: dict[str, list[float]] = {m: [] for m in models}
    names = list(models)
    for number in range(rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            for kind, batch in (("single", texts), ("window", windows)):
                started = time.perf_counter()
                await models[name].embed(batch)
                seconds[(name, kind)].append(time.perf_counter() - started)
    for number in range(queries):
        for name in names if number % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            await models[name].embed_query(QUERY)
            query_ms[name].append((time.perf_counter() - started) * 1000)
    lines = [
        f"threads {defaults.threads}, batch {defaults.batch_size}; {len(texts)} messages and as many "
        f"3-message windows; {rounds} rounds (median), {queries} queries each, interleaved",
        "",
        "| model | messages/s | windows/s | query p50 ms | query p95 ms | RSS added MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in names:
        values = sorted(query_ms[name])
        lines.append(
            f"| {name} | {len(texts) / statistics.median(seconds[(name, 'single')]):.0f} "
            f"| {len(windows) / statistics.median(seconds[(name, 'window')]):.0f} "
            f"| {statistics.median(values):.2f} | {values[int(len(values) * 0.95)]:.2f} | {rss[name]:.0f} |"
        )
    for model in models.values():
        await model.aclose()
    return "\n".join(lines)


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def table(results: dict[str, object], texts: list[str]) -> str:
    words = [len(t.split()) for t in texts]
    lines = [
        f"{len(texts)} chat messages, {min(words)}-{max(words)} words (mean {statistics.mean(words):.0f}); "
        f"{results['rounds']} rounds, median round; {results['cpus']} CPUs; onnxruntime {results['onnxruntime']}",
        "",
        "| threads | batch | texts/s | ms per call | CPU ms per text | loop lag max ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = results["rows"]
    assert isinstance(rows, list)
    for row in rows:
        lines.append(
            f"| {row['threads']} | {row['batch_size']} | {row['texts_per_s']:.0f} | {row['ms_per_call']:.1f} "
            f"| {row['cpu_ms_per_text']:.2f} | {row['loop_lag_max_ms']:.1f} |"
        )
    query = results["query"]
    assert isinstance(query, dict)
    lines.append("")
    lines.append(f"one query ({len(QUERY.split())} words), batch of 1:")
    for threads, q in query.items():
        lines.append(f"  threads {threads}: p50 {q['p50_ms']:.2f} ms, p99 {q['p99_ms']:.2f} ms")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--queries", type=int, default=200, help="one-text calls per thread count")
    parser.add_argument(
        "--compare-models", action="store_true", help="both local models side by side at the defaults"
    )
    args = parser.parse_args()
    texts = chat_messages(args.texts)
    if args.compare_models:
        print(asyncio.run(compare_models(args.rounds, texts, args.queries)))
        return
    results = asyncio.run(measure(args.rounds, texts, args.queries))
    results.update(
        rounds=args.rounds,
        cpus=os.cpu_count(),
        onnxruntime=metadata.version("onnxruntime"),
        machine=platform.processor() or platform.machine(),
    )
    print(table(results, texts))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(asdict_safe(results), indent=2))
    print(f"\nraw results: {RESULTS.relative_to(HERE.parent)}")


def asdict_safe(results: dict[str, object]) -> dict[str, object]:
    """JSON wants string keys (the query figures are keyed by thread count)."""
    query = results["query"]
    assert isinstance(query, dict)
    return {**results, "query": {str(k): v for k, v in query.items()}}


if __name__ == "__main__":
    main()
