"""Bulk indexing: a long history stored at once, indexed by the real embed jobs, against the embedder alone.

    python benchmarks/bulk_index.py                  # the LoCoMo dev conversation as one history, 2 rounds
    python benchmarks/bulk_index.py --messages 700   # its first 700 messages
    python benchmarks/bulk_index.py --data benchmarks/data/workchat-en.json --messages 2500
                                                     # conversations of a set end to end, 2,500 messages

Each round, side by side on the same texts:
  pipeline      the embed jobs themselves (`EmbedHandler`) run one after another from the real SQLite job
                queue, as one in-process worker does: store reads, index rows, embedding, LanceDB writes
                (with the full-text index and the adapter's automatic compaction), continuation jobs;
  model alone   the local embedder's `embed()` over exactly the texts the jobs embedded, in the same
                calls (recorded from the pipeline), nothing else.
Prints messages/s for both, the pipeline's cost on top of the model, and when the whole history became
findable by keyword (texts first), by meaning (each message alone) and with its neighbours' views (all
done). Nothing is downloaded; the model ships in a package.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.adapters.lance_index import LanceIndex  # noqa: E402
from gateway.adapters.onnx_embedder import OnnxEmbedder  # noqa: E402
from gateway.adapters.sql.store import SqlStore  # noqa: E402
from gateway.config import LocalEmbedderConfig  # noqa: E402
from gateway.config_sections import NeighbourVectors  # noqa: E402
from gateway.jobs.embed import DEFAULT_BATCH_MESSAGES, EmbedHandler, IndexTarget  # noqa: E402
from gateway.pipeline.canonical import chain_hashes, root_hash  # noqa: E402
from gateway.records import EMBED, AppendRequest, EmbedWork, NewMessage  # noqa: E402

LOCOMO = ROOT.parent / "shared" / "locomo" / "locomo-dev.json"


def history(data: Path, limit: int | None) -> list[dict[str, str]]:
    """The turns of a LoCoMo-format file's conversations, one after another, as user/assistant messages
    (the first conversation only when no `limit` is given)."""
    loaded = json.loads(data.read_text())
    samples = loaded if isinstance(loaded, list) else [loaded]
    out: list[dict[str, str]] = []
    for sample in samples if limit else samples[:1]:
        conversation = sample["conversation"]
        speakers = [conversation["speaker_a"], conversation["speaker_b"]]
        sessions = sorted(
            (k for k in conversation if k.startswith("session_") and not k.endswith("date_time")),
            key=lambda k: int(k.split("_")[1]),
        )
        for key in sessions:
            for turn in conversation[key]:
                role = "user" if turn["speaker"] == speakers[0] else "assistant"
                out.append({"role": role, "content": f"{turn['speaker']}: {turn['text']}"})
        if limit and len(out) >= limit:
            break
    return out[:limit] if limit else out


class Recorder:
    """The embedder, with the texts of each call kept (the model-alone run replays them)."""

    def __init__(self, embedder: OnnxEmbedder) -> None:
        self.embedder = embedder
        self.calls: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.embedder, name)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return await self.embedder.embed(texts)


def stored(messages: list[dict[str, str]], tenant: str) -> list[NewMessage]:
    hashes = [h.hex() for h in chain_hashes(root_hash(tenant, "user", "bench"), messages)]
    return [
        NewMessage(h, hashes[i - 1] if i else None, i, m["role"], dict(m), 10, 10 * (i + 1))
        for i, (h, m) in enumerate(zip(hashes, messages, strict=True))
    ]


async def model_alone(embedder: OnnxEmbedder, calls: list[list[str]]) -> float:
    """The embedder over the jobs' own texts, in the jobs' own calls, nothing else."""
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
    neighbour_vectors: NeighbourVectors = "composed",
) -> dict[str, float]:
    index = LanceIndex.open(uri, f"bench_{tenant}", embedder.dimensions)
    handler = EmbedHandler(
        store, {tenant: IndexTarget(embedder, index, batch, neighbour_vectors)}.get, store.jobs
    )  # type: ignore[arg-type]
    await store.jobs.enqueue(EmbedWork(conversation, leaf, count).job(tenant))
    started = time.perf_counter()
    searchable = by_meaning = 0.0
    jobs = 0
    while leased := await store.jobs.lease("bench", [EMBED], 600):
        if leased[0].payload.get("mode") == "context" and not by_meaning:
            by_meaning = time.perf_counter() - started  # every message embedded alone
        await handler(leased[0])
        await store.jobs.complete(leased[0], "bench")
        jobs += 1
        if jobs == 1:
            searchable = time.perf_counter() - started
    total = time.perf_counter() - started
    await index.aclose()
    return {
        "seconds": total,
        "searchable_after": searchable,
        "by_meaning_after": by_meaning or total,
        "jobs": jobs,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=LOCOMO, help="a LoCoMo-format file")
    parser.add_argument(
        "--messages",
        type=int,
        default=None,
        help="first N messages of its conversations (default: the first)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH_MESSAGES, help="messages per embed job")
    defaults = LocalEmbedderConfig()
    parser.add_argument("--threads", type=int, default=defaults.threads, help="embedder threads")
    parser.add_argument("--model-batch", type=int, default=defaults.batch_size, help="texts per model call")
    parser.add_argument("--pipeline-only", action="store_true", help="skip the model-alone replay")
    parser.add_argument(
        "--neighbour-vectors",
        choices=["composed", "model", "off"],
        default="composed",
        help="retrieval.neighbour_vectors: the views with neighbours composed from the messages' own vectors, "
        "embedded by the model, or texts only",
    )
    args = parser.parse_args()
    messages = history(args.data, args.messages)
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
            recorder = Recorder(embedder)
            piped = await pipeline(
                recorder,
                store,
                f"{tmp}/lancedb",
                tenant,
                leaf,
                conversation,
                count,
                args.batch,  # type: ignore[arg-type]
                args.neighbour_vectors,
            )
            alone = float("nan") if args.pipeline_only else await model_alone(embedder, recorder.calls)
            rows.append((alone, piped))
            texts = sum(len(c) for c in recorder.calls)
            print(
                f"round {round_ + 1}: {count} messages ({texts} texts), {piped['jobs']:.0f} jobs | "
                f"model alone {alone:.1f} s ({count / alone:.0f} msg/s) | "
                f"pipeline {piped['seconds']:.1f} s ({count / piped['seconds']:.0f} msg/s), "
                f"+{100 * (piped['seconds'] / alone - 1):.0f} % over the model | "
                f"all findable by keyword after {piped['searchable_after']:.2f} s, "
                f"by meaning after {piped['by_meaning_after']:.1f} s, "
                f"with neighbours after {piped['seconds']:.1f} s",
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
