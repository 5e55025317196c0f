"""Resident memory and time of the local MiniLM embedder (issue 29): load, embed `--texts` LoCoMo dev
turns in background batches and `--queries` single queries, then print the process's resident memory
at each step and the time the batches and queries took.

    python benchmarks/embedder_memory.py                       # this checkout
    PYTHONPATH=/work/before python benchmarks/embedder_memory.py   # another, side by side

The data is CC BY-NC 4.0: read from its path, never copied into this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from gateway.adapters.onnx_embedder import OnnxEmbedder

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "locomo" / "locomo-dev.json"


def rss_mb() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) // 1024


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    texts: list[str] = []
    for sample in json.loads(args.data.read_text()):
        conversation = sample["conversation"]
        for key, session in conversation.items():
            if key.startswith("session_") and isinstance(session, list):
                texts += [turn["text"] for turn in session]
    texts = texts[: args.texts]
    start = rss_mb()
    embedder = OnnxEmbedder.load()
    loaded = rss_mb()
    began = time.perf_counter()
    for at in range(0, len(texts), 64):
        await embedder.embed(texts[at : at + 64])
    batches = time.perf_counter() - began
    after_batches = rss_mb()
    began = time.perf_counter()
    for text in texts[: args.queries]:
        await embedder.embed_query(text)
    queries = time.perf_counter() - began
    print(
        f"rss MB: start {start}, loaded {loaded}, after {len(texts)} texts {after_batches}, "
        f"after {args.queries} queries {rss_mb()}; batches {batches:.1f} s, queries "
        f"{queries / max(args.queries, 1) * 1000:.1f} ms each"
    )
    await embedder.aclose()


if __name__ == "__main__":
    asyncio.run(main())
