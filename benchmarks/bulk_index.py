"""Bulk indexing: a long history stored at once, indexed by the real embed jobs, against the embedder alone.

    python benchmarks/bulk_index.py                  # the LoCoMo dev conversation as one history, 2 rounds
    python benchmarks/bulk_index.py --messages 700   # its first 700 messages

Each round, side by side on the same texts:
  model alone   the local embedder's `embed()` over exactly the texts the jobs embed (three views per
                message), in the same batches (one call per job), nothing else;
  pipeline      the embed jobs themselves (`EmbedHandler`) run one after another from the real SQLite job
                queue, as one in-process worker does: store reads, index rows, embedding, LanceDB writes
                (with the full-text index and the adapter's automatic compaction), continuation jobs.
Prints messages/s for both, the pipeline's cost on top of the model, and when the whole history became
findable by keyword (texts first) and by meaning. Nothing is downloaded; the model ships in a package.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.adapters.lance_index import LanceIndex  # noqa: E402
from gateway.adapters.onnx_embedder import OnnxEmbedder  # noqa: E402
from gateway.adapters.sql.store import SqlStore  # noqa: E402
from gateway.config import LocalEmbedderConfig  # noqa: E402
from gateway.jobs.embed import DEFAULT_BATCH_MESSAGES, EmbedHandler, IndexTarget, index_rows  # noqa: E402
from gateway.pipeline.canonical import chain_hashes, root_hash  # noqa: E402
from gateway.records import EMBED, AppendRequest, EmbedWork, NewMessage  # noqa: E402

LOCOMO = ROOT.parent / "shared" / "locomo" / "locomo-dev.json"


def history(limit: int | None) -> list[dict[str, str]]:
    """The dev conversation's turns as alternating user/assistant messages."""
    data = json.loads(LOCOMO.read_text())
    sample = data[0] if isinstance(data, list) else data
    conversation = sample["conversation"]
    speakers = [conversation["speaker_a"], conversation["speaker_b"]]
    out: list[dict[str, str]] = []
    sessions = sorted(
        (k for k in conversation if k.startswith("session_") and not k.endswith("date_time")),
        key=lambda k: int(k.split("_")[1]),
    )
    for key in sessions:
        for turn in conversation[key]:
            role = "user" if turn["speaker"] == speakers[0] else "assistant"
            out.append({"role": role, "content": f"{turn['speaker']}: {turn['text']}"})
    return out[:limit] if limit else out


def stored(messages: list[dict[str, str]], tenant: str) -> list[NewMessage]:
    hashes = [h.hex() for h in chain_hashes(root_hash(tenant, "user", "bench"), messages)]
    return [
        NewMessage(h, hashes[i - 1] if i else None, i, m["role"], dict(m), 10, 10 * (i + 1))
        for i, (h, m) in enumerate(zip(hashes, messages, strict=True))
    ]


async def model_alone(
    embedder: OnnxEmbedder, store: SqlStore, tenant: str, leaf: str, count: int, batch: int
) -> float:
    """The embedder over the jobs' own texts, one call per job's batch, nothing else."""
    path = await store.path(tenant, leaf)
    calls = []
    end = len(path)
    while end > len(path) - count:
        start = max(end - batch, len(path) - count)
        window = path[max(start - 2, 0) : end]
        calls.append([r.text for r in index_rows(tenant, None, window, end - start)])
        end = start
    started = time.perf_counter()
    for texts in calls:
        await embedder.embed(texts)
    return time.perf_counter() - started


async def pipeline(
    embedder: OnnxEmbedder,
    store: SqlStore,
    uri: str,
    tenant: str,
    leaf: str,
    conversation: str,
    count: int,
    batch: int,
) -> dict[str, float]:
    index = LanceIndex.open(uri, f"bench_{tenant}", embedder.dimensions)
    handler = EmbedHandler(store, {tenant: IndexTarget(embedder, index, batch)}.get, store.jobs)
    await store.jobs.enqueue(EmbedWork(conversation, leaf, count).job(tenant))
    started = time.perf_counter()
    searchable = 0.0
    jobs = 0
    while leased := await store.jobs.lease("bench", [EMBED], 600):
        await handler(leased[0])
        await store.jobs.complete(leased[0], "bench")
        jobs += 1
        if jobs == 1:
            searchable = time.perf_counter() - started
    total = time.perf_counter() - started
    await index.aclose()
    return {"seconds": total, "searchable_after": searchable, "jobs": jobs}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=None, help="first N messages (default: all)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH_MESSAGES, help="messages per embed job")
    defaults = LocalEmbedderConfig()
    parser.add_argument("--threads", type=int, default=defaults.threads, help="embedder threads")
    parser.add_argument("--model-batch", type=int, default=defaults.batch_size, help="texts per model call")
    args = parser.parse_args()
    messages = history(args.messages)
    embedder = OnnxEmbedder.load(args.threads, args.model_batch)
    await embedder.embed(["warm up"])
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlStore.open(f"sqlite:///{tmp}/bench.db")
        rows = []
        for round_ in range(args.rounds):
            tenant = f"t{round_}"
            new = stored(messages, tenant)
            conversation = await store.append(AppendRequest(tenant, None, "bench", None, tuple(new)))
            leaf, count = new[-1].id, len(new)
            alone = await model_alone(embedder, store, tenant, leaf, count, args.batch)
            piped = await pipeline(
                embedder, store, f"{tmp}/lancedb", tenant, leaf, conversation, count, args.batch
            )
            rows.append((alone, piped))
            print(
                f"round {round_ + 1}: {count} messages ({3 * count - 2} texts), {piped['jobs']:.0f} jobs | "
                f"model alone {alone:.1f} s ({count / alone:.0f} msg/s) | "
                f"pipeline {piped['seconds']:.1f} s ({count / piped['seconds']:.0f} msg/s), "
                f"+{100 * (piped['seconds'] / alone - 1):.0f} % over the model | "
                f"all findable by keyword after {piped['searchable_after']:.2f} s",
                flush=True,
            )
        await store.aclose()
    await embedder.aclose()
    overhead = [p["seconds"] / a - 1 for a, p in rows]
    print(
        f"pipeline cost over the model: {', '.join(f'{100 * o:.0f} %' for o in overhead)} (goal: at most 25 %)"
    )


if __name__ == "__main__":
    asyncio.run(main())
