"""A long history indexed by the real server while it serves another chat: how soon the history is
searchable, and what the indexing costs the request path (issue 28).

    python benchmarks/index_while_serving.py                                # LoCoMo dev, 2,500 messages
    python benchmarks/index_while_serving.py --data benchmarks/data/workchat-en.json --before /tmp/before

`python -m gateway serve` (default settings, a key of its own so summaries and memory run) in its own
process, on a fake upstream. Per round:
  1. idle: a second chat of short turns at `--rate` requests a second, `--requests` of them; the
     gateway's own time per request (`x-gateway-overhead-ms`) is kept;
  2. the history (`--messages` turns of the set's conversations, end to end) in one request, then the
     same chat again while the history is indexed, until it is or `--requests` have gone;
  3. `GET /api/conversations/{id}` every 0.5 s: when every message was findable by keyword, by meaning,
     and with its neighbours' views (those the server reports; before that split, by meaning is all);
  4. the same chat on for `--after` seconds more (the history's memory extraction, summaries).
Prints the latency rows (p50, p99) and their ratio, the times, and the server's resident memory
before the history and at its peak (VmHWM: the bulk import's); `--before CHECKOUT` runs the same from
another checkout in the same session, alternating, `--preload LIB` this tree again with LIB
preloaded (jemalloc: `/usr/lib/x86_64-linux-gnu/libjemalloc.so.2`), and `--env KEY=VALUE` this tree
again with that variable set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bulk_index import LOCOMO, history  # noqa: E402
from cache import KEY, GatewayProcess  # noqa: E402

from gateway.fakes.openai_upstream import FakeUpstream  # noqa: E402
from gateway.fakes.server import BackgroundServer  # noqa: E402

AUTH = {"authorization": f"Bearer {KEY}"}
SEGMENT = 200  # turns of one chat (the idle phase's length)


def chat(
    http: httpx.Client,
    rate: float,
    requests: int,
    stop: threading.Event | None = None,
    sent_at: list[float] | None = None,
) -> list[float]:
    """Short turns of one chat at `rate` a second; the gateway's own milliseconds for each (and, into
    `sent_at`, when each was sent). Past SEGMENT turns a new chat starts: a request's cost grows with
    its chat's length, and the phases compare turns of the same lengths."""
    messages: list[dict[str, str]] = []
    overheads: list[float] = []
    for turn in range(requests):
        if stop is not None and stop.is_set():
            break
        if turn % SEGMENT == 0:
            chat_number = f" (chat {turn // SEGMENT})" if turn else ""
            messages = [{"role": "system", "content": f"You are a helpful assistant{chat_number}."}]
        started = time.perf_counter()
        if sent_at is not None:
            sent_at.append(started)
        messages.append({"role": "user", "content": f"Turn {turn}: what should I cook with leeks tonight?"})
        response = http.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": messages},
            headers={**AUTH, "x-user-id": "chatter"},
        )
        response.raise_for_status()
        overheads.append(float(response.headers["x-gateway-overhead-ms"]))
        messages.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
        time.sleep(max(1 / rate - (time.perf_counter() - started), 0))
    return overheads


def watch(http: httpx.Client, conversation_id: str, started: float, limit: float) -> dict[str, float]:
    """Seconds from the history's request until all of it was searchable, embedded, with neighbours."""
    times: dict[str, float] = {}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        index = http.get(f"/api/conversations/{conversation_id}", headers=AUTH).json()["index"]
        elapsed = time.perf_counter() - started
        for key in ("searchable", "embedded", "with_neighbours"):
            if key not in times and index.get(key) == index["messages"]:
                times[key] = elapsed
        if index["complete"]:
            times.setdefault("with_neighbours", elapsed)  # a server without the split
            return times
        time.sleep(0.5)
    return times


def memory(pid: int) -> dict[str, float]:
    """The process's resident MB now (VmRSS) and at its peak so far (VmHWM)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def run(
    name: str,
    checkout: Path,
    turns: list[dict[str, str]],
    args: argparse.Namespace,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    fake = FakeUpstream(record=False)
    with tempfile.TemporaryDirectory() as tmp, BackgroundServer(fake.app()) as upstream:
        gateway = GatewayProcess(checkout, Path(tmp), f"{upstream.url}/v1", env)
        try:
            with httpx.Client(base_url=gateway.url, timeout=600) as http:
                chat(http, args.rate, 5)  # warm-up: connections, the first embedding, the first store
                idle = chat(http, args.rate, args.requests)
                before = memory(gateway.process.pid)["VmRSS"]
                started = time.perf_counter()
                body = {"model": "gpt-4o-mini", "messages": turns}
                response = http.post("/v1/chat/completions", json=body, headers={**AUTH, "x-user-id": "bulk"})
                response.raise_for_status()
                conversation_id = response.headers["x-conversation-id"]
                stop = threading.Event()
                busy: list[float] = []
                sent_at: list[float] = []
                chatter = threading.Thread(
                    # Through the indexing and the jobs after it, each phase up to `--requests` or so.
                    target=lambda: busy.extend(chat(http, args.rate, 3 * args.requests, stop, sent_at))
                )
                chatter.start()
                with httpx.Client(base_url=gateway.url, timeout=60) as watcher:
                    times = watch(watcher, conversation_id, started, args.limit)
                    indexed = time.perf_counter()
                    time.sleep(args.after if times else 0)
                stop.set()
                chatter.join()
                peak = memory(gateway.process.pid)["VmHWM"]
        finally:
            gateway.close()
    # The slowest requests while indexing, each with its seconds since the history was sent.
    sent = [at - started for at in sent_at]
    slowest = sorted(zip(busy, sent, strict=False), reverse=True)[:5]
    indexing = [ms for ms, at in zip(busy, sent_at, strict=False) if at < indexed]
    return {
        "name": name,
        "idle": idle,
        "busy": indexing,
        "after": [ms for ms, at in zip(busy, sent_at, strict=False) if at >= indexed],
        "times": times,
        "rss": (before, peak),
        "slowest": slowest,
    }


def q(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=LOCOMO, help="a LoCoMo-format file")
    parser.add_argument("--messages", type=int, default=2500)
    parser.add_argument("--rate", type=float, default=2.0, help="the other chat's requests a second")
    parser.add_argument(
        "--requests", type=int, default=200, help="the other chat's requests per phase at most"
    )
    parser.add_argument("--limit", type=float, default=900, help="seconds to wait for the index")
    parser.add_argument(
        "--after", type=float, default=60, help="seconds the other chat goes on once the history is indexed"
    )
    parser.add_argument("--before", type=Path, help="another checkout, run alternately")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--preload", help="a library for LD_PRELOAD: this tree again with it, alternately")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="this tree again with these set"
    )
    args = parser.parse_args()
    turns = history(args.data, args.messages)
    if turns[-1]["role"] == "assistant":
        turns.append({"role": "user", "content": "Thanks, talk soon."})
    checkouts: list[tuple[str, Path, dict[str, str] | None]] = [("this tree", ROOT, None)]
    if args.before:
        checkouts.append(("before", args.before, None))
    if args.preload:
        checkouts.append((f"preloaded {Path(args.preload).name}", ROOT, {"LD_PRELOAD": args.preload}))
    if args.env:
        checkouts.append((" ".join(args.env), ROOT, dict(pair.split("=", 1) for pair in args.env)))
    print(f"{len(turns)} messages from {args.data.name}; the other chat at {args.rate}/s")
    for round_ in range(args.rounds):
        for name, checkout, env in checkouts:
            out = run(name, checkout, turns, args, env)
            idle, busy, times = out["idle"], out["busy"], out["times"]
            shown = ", ".join(f"{k} after {v:.0f} s" for k, v in times.items()) or "not indexed in time"
            print(
                f"round {round_ + 1}, {name}: {shown} | gateway ms idle p50 {q(idle, 0.5):.1f} "
                f"p99 {q(idle, 0.99):.1f} ({len(idle)}) | while indexing p50 {q(busy, 0.5):.1f} "
                f"p99 {q(busy, 0.99):.1f} ({len(busy)}) | p99 ratio {q(busy, 0.99) / q(idle, 0.99):.2f}x, "
                f"mean {statistics.fmean(busy) / statistics.fmean(idle):.2f}x | "
                f"RSS before the history {out['rss'][0]:.0f} MB, peak {out['rss'][1]:.0f} MB",
                flush=True,
            )
            after = out["after"]
            if after:
                print(
                    f"    the {args.after:.0f} s after indexing: p50 {q(after, 0.5):.1f} p99 "
                    f"{q(after, 0.99):.1f} ({len(after)}) | p99 ratio {q(after, 0.99) / q(idle, 0.99):.2f}x, "
                    f"mean {statistics.fmean(after) / statistics.fmean(idle):.2f}x",
                    flush=True,
                )
            slowest = ", ".join(f"{ms:.0f} ms at {at:.1f} s" for ms, at in out["slowest"])
            print(f"    slowest since the history was sent: {slowest}", flush=True)


if __name__ == "__main__":
    main()
