"""Where each local model's cosine similarities fall, to set the retrieval section's per-model thresholds.

    python benchmarks/similarity_bands.py [--data ../shared/locomo/locomo-dev.json]

For every LoCoMo dev question (categories 1-4): its similarity to its best evidence turn, and the best
similarity to any other turn, and its similarity to turns unrelated to it (neither evidence nor within
two turns of it). The retrieval section asks for room when the best match reaches a threshold
(MiniLM's 0.35 "fair" and 0.5 "close" were set by hand); e5's similarities sit in a higher, narrower
band, so its thresholds are the values at the same quantiles of the unrelated-turn distribution (what
"nothing relevant" scores). Prints both models' quantiles and the matched thresholds. Dev file only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.locomo import DEFAULT_DATA, load  # noqa: E402
from gateway.adapters.e5_embedder import E5Embedder  # noqa: E402
from gateway.adapters.onnx_embedder import OnnxEmbedder  # noqa: E402
from gateway.ports import Embedder, Similarity  # noqa: E402


async def bands(embedder: Embedder, samples: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # type: ignore[type-arg]
    best, evidence_best, unrelated = [], [], []
    for sample in samples:
        ids = [dia for dia, _, _, _ in sample.turns]
        turns = np.asarray(await embedder.embed([content for _, _, content, _ in sample.turns]))
        where = {dia: i for i, dia in enumerate(ids)}
        for question, evidence, _ in sample.questions:
            scores = turns @ np.asarray(await embedder.embed_query(question))
            best.append(float(scores.max()))
            evidence_best.append(max(float(scores[where[e]]) for e in evidence if e in where))
            # Turns that are neither evidence nor next to it: what "nothing relevant" scores.
            near = {i + d for e in evidence if e in where for i in [where[e]] for d in (-2, -1, 0, 1, 2)}
            unrelated += [float(s) for i, s in enumerate(scores) if i not in near]
    return np.asarray(best), np.asarray(evidence_best), np.asarray(unrelated)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    samples = load(args.data)
    minilm, e5 = OnnxEmbedder.load(), E5Embedder.load()
    base_best, base_evidence, base_unrelated = await bands(minilm, samples)
    e5_best, e5_evidence, e5_unrelated = await bands(e5, samples)
    quantiles = [0.05, 0.25, 0.5, 0.75, 0.95]
    figures = (
        ("minilm", base_best, base_evidence, base_unrelated),
        ("e5", e5_best, e5_evidence, e5_unrelated),
    )
    for name, best, evidence, unrelated in figures:
        print(
            f"{name:7} best match q05..q95: {' '.join(f'{v:.3f}' for v in np.quantile(best, quantiles))} | "
            f"evidence: {' '.join(f'{v:.3f}' for v in np.quantile(evidence, quantiles))} | "
            f"unrelated turns q50 q90 q99: {' '.join(f'{v:.3f}' for v in np.quantile(unrelated, [0.5, 0.9, 0.99]))}"
        )
    for threshold in (Similarity().fair, Similarity().close, Similarity().tail):
        share = float((base_unrelated < threshold).mean())
        print(
            f"minilm {threshold:.2f}: {100 * share:.2f} % of unrelated turns below -> e5 at that quantile: "
            f"{np.quantile(e5_unrelated, share):.3f}; evidence below: minilm "
            f"{100 * float((base_evidence < threshold).mean()):.1f} %, e5 "
            f"{100 * float((e5_evidence < np.quantile(e5_unrelated, share)).mean()):.1f} %"
        )
    print(f"{len(base_best)} questions")
    await minilm.aclose()
    await e5.aclose()


if __name__ == "__main__":
    asyncio.run(main())
