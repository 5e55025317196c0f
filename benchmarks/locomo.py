"""Evidence recall on LoCoMo through the real gateway server (issue 5's benchmark).

Replays each LoCoMo conversation through the gateway the way a chat app would (the official SDK resending
the whole history; speaker A as the user, speaker B's turns as the upstream's answers; the gateway's clock
set to each session's date), waits for the background jobs (embedding), then asks every question of
categories 1-4 as a branch at the end of the conversation, once per budget, and scores what the gateway
actually forwarded to the (fake) upstream: the share of each question's evidence turns present verbatim.
Also prints retrieval latency (the retrieval section's own time per request, from its ContextReport),
the gateway's whole time per question (its `x-gateway-overhead-ms` header) and tokens sent.
`--dump FILE` writes each question's evidence, what was found and the retrieval report (per variant).

    python benchmarks/locomo.py [--data ../shared/locomo/locomo-dev.json] [--budgets 2000,4000,8000]
    python benchmarks/locomo.py --at-once     # each history in one request, as an app joining mid-way
    python benchmarks/locomo.py --at-once --door messages   # through /v1/messages, Anthropic's blocks

The data is CC BY-NC 4.0: read it from its path, never copy it into this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
from locomo_doors import DOORS, ChatDoor, Door
from openai import OpenAI

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer
from gateway.app import create_app
from gateway.config import parse_config
from gateway.fakes.openai_upstream import FakeUpstream, Reply
from gateway.fakes.server import BackgroundServer
from gateway.text import cjk_terms
from gateway.wiring import build_deps

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "locomo" / "locomo-dev.json"
KEY = "sk-gw-bench"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_DATE = re.compile(r"(\d{1,2}):(\d{2})\s*(am|pm) on (\d{1,2}) (\w+),? (\d{4})", re.I)
_MONTHS = {m: i + 1 for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
     "november", "december"])}  # fmt: skip


class Clock:
    """The gateway's clock, set by the replay to each session's date."""

    def __init__(self) -> None:
        self.now = datetime(2023, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Sample:
    sample_id: str
    turns: list[tuple[str, str, str, datetime]]  # (dia_id, role, content, when)
    questions: list[tuple[str, list[str], str]]  # (question, evidence dia_ids, category name)
    skipped_evidence: int = 0
    repaired_evidence: int = 0


@dataclass
class Score:
    recall: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    tokens: list[int] = field(default_factory=list)
    retrieval_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)  # the gateway's whole time per question
    parts_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    shares: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    allowances: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    questions: list[dict[str, Any]] = field(default_factory=list)  # per question, for --dump
    # Recall by where in its epoch (design.md section 14) the question was asked: the window's share of
    # its room ("an epoch began" when the question made the window jump; "as sent" for a history that fit).
    phases: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # Questions whose rebuilding failed, forwarded as the client sent them: their whole history reached
    # the upstream, so they score as found without any retrieval.
    failed_open: int = 0


def session_date(text: str) -> datetime:
    match = _DATE.search(text)
    if match is None:
        raise ValueError(f"unparsed session date: {text!r}")
    hour, minute, half, day, month, year = match.groups()
    hour_24 = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    return datetime(int(year), _MONTHS[month.lower()], int(day), hour_24, int(minute), tzinfo=UTC)


def content_of(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def load(path: Path) -> list[Sample]:
    samples = []
    for raw in json.loads(path.read_text()):
        conversation = raw["conversation"]
        speaker_a = conversation["speaker_a"]
        turns = []
        sessions = sorted(
            (int(k.split("_")[1]), k)
            for k, v in conversation.items()
            if re.fullmatch(r"session_\d+", k) and isinstance(v, list)
        )
        for number, key in sessions:
            start = session_date(conversation[f"{key}_date_time"])
            for offset, turn in enumerate(conversation[key]):
                role = "user" if turn["speaker"] == speaker_a else "assistant"
                turns.append((turn["dia_id"], role, content_of(turn), start + timedelta(seconds=30 * offset)))
            del number
        known = {t[0] for t in turns}
        sample = Sample(raw["sample_id"], turns, [])
        # LoCoMo's categories 1-4, or the ones a file names (benchmarks/workchat.py's sets).
        names = {int(k): v for k, v in raw.get("category_names", {}).items()} or CATEGORIES
        for qa in raw["qa"]:
            if qa["category"] not in names:
                continue
            evidence = []
            for item in qa["evidence"]:
                # Obvious repairs: "D8:6; D9:17" (two ids in one), "D:11:26", "D30:05"; others are skipped.
                for part in re.split(r"[;,\s]+", item.strip()):
                    match = re.fullmatch(r"D:?(\d+):(\d+)", part)
                    fixed = f"D{int(match.group(1))}:{int(match.group(2))}" if match else part
                    if fixed in known:
                        evidence.append(fixed)
                        sample.repaired_evidence += fixed != item
                    elif part:
                        sample.skipped_evidence += 1
            if evidence:
                sample.questions.append((qa["question"], sorted(set(evidence)), names[qa["category"]]))
        samples.append(sample)
    return samples


def config(
    data_dir: Path,
    upstream: dict[str, Any],
    budget: int,
    retrieval: bool,
    tuning: dict[str, Any] | None = None,
) -> Any:
    tenant = {
        "name": "bench",
        "api_keys": [KEY],
        "upstream": upstream,
        "context": {"budget_tokens": budget},
        # Summaries carry no verbatim turns, so they cannot count as evidence: measured without them.
        "compaction": {"enabled": False},
        "retrieval": {"enabled": retrieval, **(tuning or {})},
        # Measured without memory too: its extraction jobs (queued 20 s after each question) would keep
        # `idle` waiting, and what it recalls is not verbatim evidence.
        "memory": {"enabled": False},
    }
    storage = {"database_url": f"sqlite:///{data_dir}/gateway.db", "data_dir": str(data_dir)}
    return parse_config({"tenants": [tenant], "storage": storage, "jobs": {"workers": 1}}, {})


def wait_for_jobs(url: str, timeout: float = 3600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = httpx.get(f"{url}/healthz").json()["jobs"] or {}
        if not jobs.get("queued") and not jobs.get("running"):
            if jobs.get("failed"):
                print(f"  warning: {jobs['failed']} failed jobs", file=sys.stderr)
            return
        time.sleep(0.5)
    raise TimeoutError("background jobs did not finish")


def send(door: Door, url: str, clock: Clock, sample: Sample, at_once: bool) -> list[dict[str, Any]]:
    """The conversation sent through `door`, at once (the gateway's clock at the end: nothing tells it
    when the turns were said) or turn by turn (chat completions only); the history as the app then
    holds it."""
    if not at_once:
        assert type(door) is ChatDoor, "turn by turn runs through chat completions only"
        client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        return replay(client, door.fake, clock, sample)
    clock.now = sample.turns[-1][3]
    return door.send(url, KEY, [(role, content) for _, role, content, _ in sample.turns], sample.sample_id)


def replay(client: OpenAI, fake: FakeUpstream, clock: Clock, sample: Sample) -> list[dict[str, Any]]:
    """Send the conversation turn by turn; returns the full history as the chat app holds it."""
    messages: list[dict[str, Any]] = []
    for _, role, content, when in sample.turns:
        clock.now = when
        if role == "user" or not messages or messages[-1]["role"] != "user":
            messages.append({"role": role, "content": content})  # sent with the next request
            continue
        fake.enqueue(Reply(content=content))
        answer = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, extra_headers={"X-User-Id": sample.sample_id}
        )
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    return messages


def request_record(http: httpx.Client, request_id: str, headers: dict[str, str]) -> dict[str, Any]:
    """The stored request record (written just after the response for a history-only client)."""
    for _ in range(200):
        response = http.get(f"/api/requests/{request_id}", headers=headers)
        if response.status_code == 200:
            record: dict[str, Any] = response.json()
            return record
        time.sleep(0.01)
    raise TimeoutError(f"request {request_id} was not recorded")


def idle(http: httpx.Client) -> None:
    """Until the background queue is empty: each question meets a quiet gateway, as a chat app's user
    (who asks every few seconds) would, and the previous question's indexing is not timed into it."""
    while True:
        jobs = http.get("/healthz").json()["jobs"] or {}
        if not jobs.get("queued") and not jobs.get("running"):
            return
        time.sleep(0.02)


def ask(
    http: httpx.Client,
    door: Door,
    sample: Sample,
    history: list[dict[str, Any]],
    score: Score,
    quiet: bool = True,
) -> None:
    """Each question as a branch at the end of the conversation. Sent as raw JSON on one keep-alive
    connection: the gateway runs in this process, and the SDK's per-request work on 600-message bodies
    (and a new TLS context per `httpx.get`) would otherwise compete with it for the GIL."""
    contents = {dia: content for dia, _, content, _ in sample.turns}
    headers = {"authorization": f"Bearer {KEY}", "x-user-id": sample.sample_id}
    for question, evidence, category in sample.questions:
        if quiet:  # else asked while the history is still being indexed
            idle(http)
        door.clear()
        path, body = door.question(history, question)
        response = http.post(path, content=orjson.dumps(body), headers=headers)
        response.raise_for_status()
        forwarded = door.forwarded()
        found = [e for e in evidence if contents[e] in forwarded]
        score.recall[category].append(len(found) / len(evidence))
        score.tokens.append(int(response.headers.get("x-context-tokens-sent", 0)))
        score.overhead_ms.append(float(response.headers["x-gateway-overhead-ms"]))
        record = request_record(http, response.headers["x-gateway-request-id"], headers)
        sections = (record.get("report") or {}).get("sections") or {}
        retrieval = sections.get("retrieval")
        score.phases[epoch_phase(record.get("report") or {})].append(score.recall[category][-1])
        score.shares["window tokens"].append(float((sections.get("window") or {}).get("tokens", 0)))
        score.shares["retrieved tokens"].append(float((retrieval or {}).get("tokens", 0)))
        score.shares["groups"].append(float(len((retrieval or {}).get("groups", []))))
        if retrieval and "search_ms" in retrieval:
            score.retrieval_ms.append(float(retrieval["search_ms"]))
            for part, ms in (retrieval.get("timings_ms") or {}).items():
                score.parts_ms[part].append(float(ms))
        if retrieval and "skipped" in retrieval:
            score.skipped[str(retrieval["skipped"])] += 1
        if retrieval:
            score.allowances[int(retrieval.get("asked", 0))] += 1
        score.questions.append(
            {
                "sample": sample.sample_id,
                "question": question,
                "category": category,
                "evidence": evidence,
                "found": found,
                "window_tokens": (sections.get("window") or {}).get("tokens", 0),
                "retrieval": {k: v for k, v in (retrieval or {}).items() if k != "message_ids"},
            }
        )


_WORD = re.compile(r"\w+")


def bm25_ranking(sample: Sample) -> Callable[[str], list[float]]:
    """Plain BM25 (k1 1.2, b 0.75) over the sample's single turns, CJK text as character bigrams: the
    scores of every turn for a question."""
    docs = [
        Counter(_WORD.findall(cjk_terms(content, singles=False).lower())) for _, _, content, _ in sample.turns
    ]
    lengths = [sum(d.values()) for d in docs]
    average = statistics.fmean(lengths)
    frequency: Counter[str] = Counter(term for d in docs for term in d)
    idf = {t: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for t, n in frequency.items()}

    def scores(question: str) -> list[float]:
        terms = set(_WORD.findall(cjk_terms(question, singles=False).lower()))
        return [
            sum(
                idf[t] * d[t] * 2.2 / (d[t] + 1.2 * (0.25 + 0.75 * length / average)) for t in terms if t in d
            )
            for d, length in zip(docs, lengths, strict=True)
        ]

    return scores


def bm25_baseline(samples: list[Sample], budget: int, window_share: float = 0.0) -> Score:
    """The baseline the issue compares with: plain BM25 over single turns (`bm25_ranking`), each hit
    sent with the turn either side, best first, until `budget` tokens (the gateway's tokenizer) are
    full. No recent window, no dates: only what ranks.

    With `window_share` (0.5: "half window + half BM25"), the newest turns up to that share of the
    budget are sent verbatim first, and BM25 ±1 fills the rest with turns not already in the window."""
    count = TiktokenTokenizer.for_model("gpt-4o-mini").count
    score = Score()
    for sample in samples:
        ranking = bm25_ranking(sample)
        tokens = [count(content) + 1 for _, _, content, _ in sample.turns]
        ids = [dia for dia, _, _, _ in sample.turns]
        window: set[int] = set()
        window_room = int(budget * window_share)
        for at in range(len(tokens) - 1, -1, -1):  # the recent window: newest turns that fit, in a row
            if tokens[at] > window_room:
                break
            window.add(at)
            window_room -= tokens[at]
        window_tokens = sum(tokens[i] for i in window)
        for question, evidence, category in sample.questions:
            scores = ranking(question)
            room = budget - window_tokens - count(question)
            taken = set(window)
            for at in sorted(range(len(tokens)), key=lambda i: scores[i], reverse=True):
                if scores[at] <= 0 or room <= 0:
                    break
                span = [i for i in (at - 1, at, at + 1) if 0 <= i < len(tokens) and i not in taken]
                cost = sum(tokens[i] for i in span)
                if cost <= room:
                    taken.update(span)
                    room -= cost
            found = [e for e in evidence if ids.index(e) in taken]
            score.recall[category].append(len(found) / len(evidence))
            score.tokens.append(budget - room)
    return score


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def epoch_phase(report: dict[str, Any]) -> str:
    """Where in its epoch a question was asked: the window's tokens against the limit it may fill."""
    epoch = report.get("epoch")
    if not isinstance(epoch, dict) or report.get("history_unchanged") or report.get("unchanged"):
        return "as sent"
    if epoch.get("new"):
        return "an epoch began"
    window = ((report.get("sections") or {}).get("window") or {}).get("tokens", 0)
    share = window / max(int(epoch.get("limit_tokens") or 1), 1)
    return "window under 1/3 of the budget" if share < 1 / 3 else "window 1/3 of the budget or more"


def report(name: str, score: Score, brief: bool = False) -> dict[str, Any]:
    every = [v for values in score.recall.values() for v in values]
    row: dict[str, Any] = {
        "variant": name,
        "questions": len(every),
        "overall": 100 * statistics.fmean(every),
        **{c: 100 * statistics.fmean(v) for c, v in sorted(score.recall.items())},
        "tokens_mean": statistics.fmean(score.tokens),
        "tokens_max": max(score.tokens),
        "retrieval_p50_ms": percentile(score.retrieval_ms, 0.5),
        "retrieval_p95_ms": percentile(score.retrieval_ms, 0.95),
        "overhead_p50_ms": percentile(score.overhead_ms, 0.5),
        "overhead_p95_ms": percentile(score.overhead_ms, 0.95),
        "counts": {c: len(v) for c, v in sorted(score.recall.items())},
    }
    for part, values in score.parts_ms.items():
        row[f"{part}_p50_ms"] = percentile(values, 0.5)
        row[f"{part}_p95_ms"] = percentile(values, 0.95)
    if score.skipped:
        row["skipped"] = dict(score.skipped)
    cats = " ".join(f"{c} {100 * statistics.fmean(v):5.1f}" for c, v in sorted(score.recall.items()))
    print(
        f"{name:<22} recall {row['overall']:5.1f} %  ({cats})  tokens mean {row['tokens_mean']:.0f} "
        f"max {row['tokens_max']}  retrieval p50 {row['retrieval_p50_ms']:.1f} ms "
        f"p95 {row['retrieval_p95_ms']:.1f} ms" + (f"  skipped {row['skipped']}" if score.skipped else "")
        if not brief
        else f"{name:<22} recall {row['overall']:5.1f} %  ({cats})  tokens mean {row['tokens_mean']:.0f}"
    )
    if score.failed_open:
        row["failed_open"] = score.failed_open
        print(
            f"{'':<22} WARNING: {score.failed_open} questions failed open (the gateway's log says why) and "
            "were forwarded with their whole history: this recall is not retrieval's"
        )
    if brief:
        return row
    row["phases"] = {p: (len(v), 100 * statistics.fmean(v)) for p, v in sorted(score.phases.items())}
    phases = ", ".join(f"{p}: {n} questions, {r:.1f} %" for p, (n, r) in row["phases"].items())
    print(f"{'':<22} recall by epoch phase: {phases}")
    row["allowances"] = dict(sorted(score.allowances.items()))
    print(f"{'':<22} retrieval asked for (tokens: questions): {row['allowances']}")
    shares = ", ".join(f"{name} {statistics.fmean(v):.0f}" for name, v in score.shares.items() if v)
    print(f"{'':<22} mean per question: {shares}")
    print(
        f"{'':<22} gateway overhead per question (everything but the upstream) p50 "
        f"{row['overhead_p50_ms']:.1f} ms p95 {row['overhead_p95_ms']:.1f} ms"
    )
    if score.parts_ms:
        parts = ", ".join(
            f"{part} {row[f'{part}_p50_ms']:.1f}/{row[f'{part}_p95_ms']:.1f}" for part in score.parts_ms
        )
        print(f"{'':<22} retrieval parts p50/p95 ms: {parts}")
    return row


def measure(
    args: argparse.Namespace, samples: list[Sample], budgets: list[int], tuning: dict[str, Any], tag: str
) -> list[dict[str, Any]]:
    """Replay the samples through the gateway and ask every question, once per variant (`tag`: the
    set's name when several are measured, for its own --keep and --dump paths)."""
    door = DOORS[args.door]()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, BackgroundServer(door.app()) as upstream:
        data_dir = (args.keep / tag if tag and args.keep else args.keep) or Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        through = "" if door.name == "chat" else f"-{door.name}"
        saved = data_dir / (f"sent-at-once{through}.json" if args.at_once else "replayed.json")
        variants = [(f"budget {b}", b, True) for b in budgets]
        if args.window_only:
            variants += [(f"window only {b}", b, False) for b in budgets]
        clock = Clock()
        histories: dict[str, list[dict[str, Any]]] = json.loads(saved.read_text()) if saved.exists() else {}
        for index, (name, budget, retrieval) in enumerate(variants):
            cfg = config(data_dir, door.upstream(upstream.url), budget, retrieval, tuning)
            deps = build_deps(cfg, clock=clock)
            with BackgroundServer(create_app(cfg, deps)) as gateway:
                if index == 0 and not histories:
                    started = time.perf_counter()
                    early = Score()
                    for sample in samples:
                        histories[sample.sample_id] = send(door, gateway.url, clock, sample, args.at_once)
                        print(f"  sent {sample.sample_id}: {len(sample.turns)} turns", flush=True)
                        if args.right_after:
                            clock.now = sample.turns[-1][3] + timedelta(minutes=5)
                            failed = deps.counters.fail_open
                            with httpx.Client(base_url=gateway.url, timeout=120) as http:
                                ask(http, door, sample, histories[sample.sample_id], early, quiet=False)
                            early.failed_open += deps.counters.fail_open - failed
                    if args.right_after:
                        rows.append(report(f"{name} right after", early))
                        if args.dump:
                            dumped = args.dump.with_name(
                                f"{args.dump.stem}{'-' + tag if tag else ''}-right-after{args.dump.suffix}"
                            )
                            dumped.write_text(json.dumps(early.questions, indent=1))
                    replayed = time.perf_counter() - started
                    wait_for_jobs(gateway.url)
                    print(
                        f"  replay {replayed:.0f} s, indexing done after {time.perf_counter() - started:.0f} s"
                    )
                    saved.write_text(json.dumps(histories))
                wait_for_jobs(gateway.url)  # a kept directory may hold jobs a stopped run left queued
                score = Score()
                failed = deps.counters.fail_open
                with httpx.Client(base_url=gateway.url, timeout=120) as http:
                    for sample in samples:
                        # Asked right after the last session ("last week" means the week before it).
                        clock.now = sample.turns[-1][3] + timedelta(minutes=5)
                        ask(http, door, sample, histories[sample.sample_id], score)
                score.failed_open = deps.counters.fail_open - failed
                rows.append(report(name, score))
                if args.dump:
                    dumped = args.dump.with_name(
                        f"{args.dump.stem}{'-' + tag if tag else ''}-{name.replace(' ', '-')}{args.dump.suffix}"
                    )
                    dumped.write_text(json.dumps(score.questions, indent=1))
            asyncio.run(deps.aclose())  # the app's lifespan did not build these deps, so it leaves them
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", action="append", default=[],
        help=f"a LoCoMo-format file (repeatable, or comma-separated; default {DEFAULT_DATA})",
    )  # fmt: skip
    parser.add_argument("--budgets", default="2000,4000,8000")
    parser.add_argument("--conversations", type=int, default=0, help="only the first N (0: all)")
    parser.add_argument("--window-only", action="store_true", help="also measure without retrieval")
    parser.add_argument(
        "--at-once",
        action="store_true",
        help="send each conversation's whole history in one request (an app that starts using the "
        "gateway mid-conversation) instead of turn by turn",
    )
    parser.add_argument(
        "--bm25",
        action="store_true",
        help="also score the offline baselines at each budget: BM25 ±1, and half window + half BM25 ±1",
    )
    parser.add_argument(
        "--baselines-only",
        action="store_true",
        help="only the offline baselines of --bm25, for every set; no gateway is started",
    )
    parser.add_argument(
        "--right-after",
        action="store_true",
        help="also ask each conversation's questions right after its history arrived, while it is being "
        "indexed (needs a fresh --keep directory; with the first budget)",
    )
    parser.add_argument(
        "--door",
        choices=sorted(DOORS),
        default="chat",
        help="the front door histories and questions go through, by the official SDKs (locomo_doors.py; "
        "messages and responses need --at-once)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument(
        "--dump",
        type=Path,
        help="write every question's evidence, what was found and the retrieval report, one file per variant "
        "(q.json -> q-budget-4000.json)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="replay into this directory and keep it; a later run with it skips the replay",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a retrieval setting for every variant, e.g. --set candidates=120 (repeatable)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.door != "chat" and not args.at_once:
        parser.error(f"--door {args.door} needs --at-once (turn by turn runs through chat completions only)")
    paths = [Path(p) for item in args.data or [str(DEFAULT_DATA)] for p in item.split(",") if p]
    for path in paths:
        if not path.exists():
            sys.exit(f"data not found at {path} (pass --data)")
    budgets = [int(b) for b in args.budgets.split(",")]
    tuning = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    names = [path.stem for path in paths]
    if len(set(names)) < len(names):
        names = [str(path) for path in paths]
    results: dict[str, list[dict[str, Any]]] = {}
    for name, path in zip(names, paths, strict=True):
        samples = load(path)
        if args.conversations:
            samples = samples[: args.conversations]
        questions = sum(len(s.questions) for s in samples)
        print(
            f"{name}: {len(samples)} conversations, {sum(len(s.turns) for s in samples)} turns, {questions} "
            f"questions; evidence ids repaired {sum(s.repaired_evidence for s in samples)}, "
            f"skipped {sum(s.skipped_evidence for s in samples)}"
        )
        rows = []
        if args.bm25 or args.baselines_only:
            for budget in budgets:
                rows.append(report(f"bm25 ±1 {budget}", bm25_baseline(samples, budget), args.baselines_only))
                half = bm25_baseline(samples, budget, window_share=0.5)
                rows.append(report(f"half window+bm25 {budget}", half, args.baselines_only))
        if not args.baselines_only:
            rows += measure(args, samples, budgets, tuning, name if len(paths) > 1 else "")
        results[name] = rows
    side_by_side(results)
    if args.json:
        every = [{"set": name, **row} for name, rows in results.items() for row in rows]
        args.json.write_text(json.dumps(every if len(paths) > 1 else results[names[0]], indent=2))


def side_by_side(results: dict[str, list[dict[str, Any]]]) -> None:
    """The final table: every set's recall by category (questions in brackets) for every variant."""
    variants = list(dict.fromkeys(row["variant"] for rows in results.values() for row in rows))
    if not variants:
        return
    width = max(24, *(len(v) + 2 for v in variants))
    for name, rows in results.items():
        by_variant = {row["variant"]: row for row in rows}
        first = rows[0]
        columns = ["overall", *first["counts"]]
        counts = {"overall": first["questions"], **first["counts"]}
        print(f"\n{name}")
        print(f"{'':<{width}}" + "".join(f"{f'{c} ({counts[c]})':>22}" for c in columns))
        for variant in variants:
            row = by_variant.get(variant)
            if row:
                print(f"{variant:<{width}}" + "".join(f"{row.get(c, float('nan')):>22.1f}" for c in columns))
    print("\nside by side, overall recall %")
    print(f"{'':<{width}}" + "".join(f"{name[:28]:>30}" for name in results))
    for variant in variants:
        cells = []
        for rows in results.values():
            row = next((r for r in rows if r["variant"] == variant), None)
            cells.append(f"{row['overall']:>30.1f}" if row else f"{'':>30}")
        print(f"{variant:<{width}}" + "".join(cells))


if __name__ == "__main__":
    main()
