"""Where LoCoMo recall is lost: ranking variants replayed offline through the real grouping code.

    python benchmarks/locomo_ranking.py --keep DIR [--data PATH] [--capture FILE]

1. Runs `locomo.py --budgets 4000 --keep DIR` once (the replay is made in DIR if it is not there yet),
   capturing for every question what the retrieval section worked from: both rankings, the path, the
   window, the allowance, the summary text above. The capture hooks the section's private methods, so
   this script follows `gateway/pipeline/context/retrieval.py` and fails loudly when that changes.
   With `--capture FILE` the capture is kept there, and a later run with the same FILE skips step 1.
2. Replays each ranking variant over the captured questions through `RetrievalSection._groups` (the same
   tokenizer and allowance), and scores evidence as the benchmark does: present verbatim in a group or
   in the window. The replay leaves out the builder's second pass, so the shipped ranking scores a few
   tenths below the benchmark's own figure.
3. Prints recall per variant and where the evidence ranks in the shipped fused ranking.

The data is CC BY-NC 4.0: read it from its path, never copy it into this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lancedb
import locomo
import numpy as np

import gateway.pipeline.context.ranking as ranking
import gateway.pipeline.context.retrieval as retrieval
import gateway.pipeline.context.tail_lines as tail_lines
from gateway.adapters.onnx_embedder import OnnxEmbedder
from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer
from gateway.config import RetrievalConfig
from gateway.pipeline.call import HistoryItem
from gateway.records import IndexHit, SearchResult
from gateway.wiring import index_table

Ranker = Callable[[dict[str, Any], list[HistoryItem], dict[str, int], set[str]], list[Any]]


def capture(keep: Path, data: Path, at_once: bool = False, conversations: int = 0) -> list[dict[str, Any]]:
    """Run the benchmark at 4,000 tokens with hooks; one record per question, in the benchmark's order."""
    records: list[dict[str, Any]] = []
    section = retrieval.RetrievalSection
    find, search, groups = section._find, section._search, section._groups
    last: dict[str, Any] = {}

    async def hooked_search(
        self: Any, query: Any, other: Any, early: Any = None, keywords: Any = (), meant: str = ""
    ) -> Any:
        out = await search(self, query, other, early, keywords, meant)
        last["result"] = out[0]
        return out

    async def hooked_find(self: Any, build: Any) -> Any:
        found = await find(self, build)
        records.append(
            {
                "facts": found.facts,
                "result": last.pop("result", None),
                "path": [
                    (item.node_id, tail_lines.line_of(item), item.message.get("role")) for item in found.path
                ],
            }
        )
        return found

    def hooked_groups(
        self: Any,
        build: Any,
        path: Any,
        positions: Any,
        ranked: Any,
        recent: Any,
        allowance: int,
        dates: Any,
        after: int | None = None,
        grouped: int | None = None,
    ) -> Any:
        out = groups(self, build, path, positions, ranked, recent, allowance, dates, after, grouped)
        # The builder may propose twice (its second pass): the last proposal is the one sent.
        records[-1].update(
            recent=sorted(recent),
            allowance=allowance,
            above=list(build.above),
            ranked=[c.node_id for c in ranked],  # the section's own ranking, hop and boosts included
        )
        return out

    section._find, section._search, section._groups = hooked_find, hooked_search, hooked_groups
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "questions.json"
        sys.argv = [
            "locomo.py",
            "--budgets",
            "4000",
            "--keep",
            str(keep),
            "--data",
            str(data),
            "--dump",
            str(dump),
            *(["--at-once"] if at_once else []),
            *(["--conversations", str(conversations)] if conversations else []),
        ]
        locomo.main()
        questions = json.loads((Path(tmp) / "questions-budget-4000.json").read_text())
    section._find, section._search, section._groups = find, search, groups
    if at_once:  # each history's own request searched too, before any question
        records = records[len(records) - len(questions) :]
    if len(questions) != len(records):
        raise SystemExit(f"captured {len(records)} searches for {len(questions)} questions")
    for record, question in zip(records, questions, strict=True):
        record["question"] = question
    return records


def shipped(**changes: Any) -> Ranker:
    """The section's ranking (`_fuse`, `_smoothed`, term and recency boosts) with some of its parts changed:
    kind "rrf" (k, weights per ranking, views summed or the best one) or "mix" (a convex mix of min-max
    normalised scores, `alpha` for meaning), the neighbour share and how many steps it spreads."""
    kind = changes.get("kind", "rrf")
    k, share, spread = (
        changes.get("k", ranking.RRF_K),
        changes.get("share", ranking.NEIGHBOUR_SHARE),
        changes.get("spread", 1),
    )
    weights = (changes.get("semantic", 1.0), changes.get("keyword", 1.0))
    best_view = changes.get("views") == "best"

    def rank(
        record: dict[str, Any], path: list[HistoryItem], positions: dict[str, int], recent: set[str]
    ) -> list[Any]:
        result: SearchResult = changes.get("result", {}).get(id(record)) or record["result"]
        if changes.get("keyword_only"):  # as right after a history arrived: nothing embedded yet
            result = SearchResult([], result.keyword)
        if changes.get("keyword_views"):
            result = SearchResult(
                result.semantic, [h for h in result.keyword if h.view in changes["keyword_views"]]
            )
        score: dict[str, float] = defaultdict(float)
        created: dict[str, Any] = {}
        if kind == "rrf":
            for weight, hits in zip(weights, (result.semantic, result.keyword), strict=True):
                per: dict[str, list[float]] = defaultdict(list)
                for position, hit in enumerate(hits):
                    per[hit.node_id].append(weight / (k + position))
                    created.setdefault(hit.node_id, hit.created_at)
                for node, values in per.items():
                    score[node] += max(values) if best_view else sum(values)
        else:
            alpha = changes["alpha"]
            sem: dict[str, float] = {}
            kw: dict[str, float] = {}
            for hit in result.semantic:
                sem[hit.node_id] = max(sem.get(hit.node_id, -1.0), hit.score)
                created.setdefault(hit.node_id, hit.created_at)
            for hit in result.keyword:
                kw[hit.node_id] = max(kw.get(hit.node_id, 0.0), hit.score)
                created.setdefault(hit.node_id, hit.created_at)
            low, high = min(sem.values(), default=0.0), max(sem.values(), default=1.0)
            top = max(kw.values(), default=1.0) or 1.0
            for node in sem.keys() | kw.keys():
                meaning = (sem[node] - low) / max(high - low, 1e-9) if node in sem else 0.0
                score[node] = alpha * meaning + (1 - alpha) * kw.get(node, 0.0) / top
        unit = 1.0 / k if kind == "rrf" else 0.1
        by_position: dict[int, Any] = {}
        for node, value in score.items():
            if node not in positions or node in recent:
                continue
            at = positions[node]
            here = by_position.setdefault(at, ranking.Candidate(node, created_at=created.get(node)))
            here.score += value
            for step in range(1, spread + 1):
                for near in (at - step, at + step):
                    near_id = path[near].node_id if 0 <= near < len(path) else None
                    if near_id is None or near_id in recent:
                        continue
                    neighbour = by_position.setdefault(
                        near, ranking.Candidate(near_id, created_at=created.get(node))
                    )
                    neighbour.score += share**step * value
        ranked = list(by_position.values())
        for candidate in ranked:
            text = str(path[positions[candidate.node_id]].message["content"]).lower()
            candidate.score += sum(
                2.0 * unit for t in record["facts"].terms if retrieval.contains_term(text, t)
            )
            candidate.score += 0.1 * unit * positions[candidate.node_id] / max(len(path), 1)
        ranked.sort(key=lambda c: c.score, reverse=True)
        return ranked

    return rank


class _Build:
    """The parts of BuildInput that `_groups` reads."""

    def __init__(self, tokenizer: TiktokenTokenizer, above: list[str]) -> None:
        self.tokenizer, self.above = tokenizer, above


def replay(
    records: list[dict[str, Any]],
    samples: dict[str, locomo.Sample],
    rank: Ranker,
    room: float = 1.0,
    neighbours: int = 1,
) -> tuple[dict[str, list[float]], list[int]]:
    """Recall per category, and each evidence message's place in the ranking (9999: not ranked)."""
    section = retrieval.RetrievalSection(None, None, None, RetrievalConfig(neighbours=neighbours), None)
    tokenizer = TiktokenTokenizer.for_model("gpt-4o-mini")
    recall: dict[str, list[float]] = defaultdict(list)
    places: list[int] = []
    for record in records:
        question = record["question"]
        evidence, found = question["evidence"], question["found"]
        if "allowance" not in record:  # nothing was retrieved for it: the benchmark's own score stands
            recall[question["category"]].append(len(found) / len(evidence))
            continue
        path = [
            HistoryItem({"role": role, "content": line.split(": ", 1)[1]}, None, node)
            for node, line, role in record["path"]
        ]
        positions = {node: i for i, (node, _, _) in enumerate(record["path"])}
        recent_positions = set(record["recent"])
        recent = {record["path"][i][0] for i in recent_positions}
        ranked = rank(record, path, positions, recent)
        build = _Build(tokenizer, record["above"])
        groups = section._groups(
            build, path, positions, ranked, recent_positions, int(record["allowance"] * room), {}
        )
        shown = recent_positions | {i for g in groups for i in range(g.start, g.end + 1)}
        contents = {dia: content for dia, _, content, _ in samples[question["sample"]].turns}
        place = {c.node_id: i for i, c in enumerate(ranked)}
        hits = 0
        for dia in evidence:
            at = [i for i, (_, line, _) in enumerate(record["path"]) if line.endswith(contents[dia])]
            hits += any(i in shown for i in at)
            if at:
                places.append(min(place.get(record["path"][i][0], 9999) for i in at))
        recall[question["category"]].append(hits / len(evidence))
    return recall, places


def feedback(records: list[dict[str, Any]], keep: Path, beta: float, top: int = 5) -> dict[int, SearchResult]:
    """Pseudo-relevance feedback: the query vector plus `beta` times the mean of the top hits' own vectors,
    searched again over the same messages (the conversation's rows outside the window)."""
    model = OnnxEmbedder(threads=2)
    table = lancedb.connect(str(keep / "lancedb")).open_table(index_table(model.model)).to_arrow()
    nodes = np.array(table["node_id"].to_pylist())
    views = np.array(table["view"].to_pylist())
    vectors = np.array(table["vector"].to_pylist(), dtype=np.float32)
    usable = np.isfinite(vectors).all(axis=1) & (np.abs(vectors).sum(axis=1) > 0)
    own = {str(nodes[i]): int(i) for i in np.where(usable & (views == "m"))[0]}
    out: dict[int, SearchResult] = {}
    for record in records:
        if "allowance" not in record:
            continue
        query = np.array(asyncio.run(model.embed_query(record["question"]["question"])), dtype=np.float32)
        hits = [own[h.node_id] for h in record["result"].semantic if h.view == "m" and h.node_id in own][:top]
        if hits:
            query = query + beta * vectors[hits].mean(axis=0)
            query /= np.linalg.norm(query)
        path = {node for node, _, _ in record["path"]}
        recent = {record["path"][i][0] for i in record["recent"]}
        rows = np.where(usable & np.isin(nodes, list(path - recent)))[0]
        similarity = vectors[rows] @ query
        best = rows[np.argsort(-similarity)[:120]]
        semantic = [
            IndexHit(str(nodes[i]), "", str(views[i]), 0, None, float(vectors[i] @ query)) for i in best
        ]
        out[id(record)] = SearchResult(semantic, record["result"].keyword)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--keep", type=Path, required=True, help="the kept replay directory (locomo.py --keep)"
    )
    parser.add_argument("--data", type=Path, default=locomo.DEFAULT_DATA)
    parser.add_argument("--capture", type=Path, help="keep the capture here; reused when it exists")
    parser.add_argument("--at-once", action="store_true", help="replay each history in one request")
    parser.add_argument("--conversations", type=int, default=0, help="only the first N (0: all)")
    args = parser.parse_args()
    if args.capture and args.capture.exists():
        records = pickle.loads(args.capture.read_bytes())
    else:
        records = capture(args.keep, args.data, args.at_once, args.conversations)
        if args.capture:
            args.capture.write_bytes(pickle.dumps(records))
    samples = {s.sample_id: s for s in locomo.load(args.data)}

    def show(name: str, rank: Ranker, **options: Any) -> None:
        recall, places = replay(records, samples, rank, **options)
        every = [v for values in recall.values() for v in values]
        cats = " ".join(f"{c} {100 * statistics.fmean(v):.1f}" for c, v in sorted(recall.items()))
        print(f"{name:<58} {100 * statistics.fmean(every):5.1f} %  ({cats})", flush=True)
        if name == "shipped":
            top = {n: 100 * sum(p < n for p in places) / len(places) for n in (20, 40, 80)}
            print(
                f"{'':<58} evidence in the fused top 20 / 40 / 80: {top[20]:.0f} / {top[40]:.0f} / {top[80]:.0f} %"
            )
            unranked = sum(p == 9999 for p in places)
            print(
                f"{'':<58} evidence not ranked at all (no hit, nor next to one): {unranked} of {len(places)}"
            )

    print(f"{len(records)} questions; recall at 4,000 tokens, replayed:")
    show("shipped", shipped())
    show("keyword only (nothing embedded yet)", shipped(keyword_only=True))
    show("keyword only, each message's own view", shipped(keyword_only=True, keyword_views="m"))
    show("keyword only, own view, best view", shipped(keyword_only=True, keyword_views="m", views="best"))
    for share in (0.0, 0.25):
        show(
            f"keyword only, own view, neighbours share {share}",
            shipped(keyword_only=True, keyword_views="m", share=share),
        )
    show("keyword ranking over each message's own view", shipped(keyword_views="m"))
    show("views: the best one instead of the sum", shipped(views="best"))
    show("keyword ranking weighted 0.5", shipped(keyword=0.5))
    show("semantic ranking weighted 0.5", shipped(semantic=0.5))
    for share in (0.3, 0.7):
        show(f"neighbours share {share}", shipped(share=share))
    show("reciprocal rank k = 60", shipped(k=60))
    for alpha in (0.5, 0.7, 0.85):
        show(f"convex mix of normalised scores, meaning weighted {alpha}", shipped(kind="mix", alpha=alpha))
    for share in (0.5, 0.7):
        show(f"hits alone (± 0 neighbours), neighbours share {share}", shipped(share=share), neighbours=0)
    show("hits alone, neighbours share 0.8 over two steps", shipped(share=0.8, spread=2), neighbours=0)
    for beta in (0.0, 0.3, 0.6):
        show(f"feedback on the query vector, beta {beta}", shipped(result=feedback(records, args.keep, beta)))
    for room in (1.1, 1.2, 1.5):
        show(f"the same ranking with {room}x the room", shipped(), room=room)


if __name__ == "__main__":
    main()
