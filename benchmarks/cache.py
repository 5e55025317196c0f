"""What a long chat costs through the gateway against resending it whole, both on a provider that caches
prompt prefixes (issue 27, design.md section 14).

A chat app resends its whole history every turn (the official `openai` SDK): user turns and ~270-token
answers made from LoCoMo's dev conversations. The same turns go (a) straight to a caching fake upstream
(full replay, the baseline) and (b) through the real gateway server (`python -m gateway serve`, default
settings, its own process) to another caching fake. Both fakes simulate OpenAI's automatic prefix cache
(1,024 tokens, 128-token steps) and report it in `usage`. Printed per stretch of turns and in total: the
effective cost (uncached input + cached price x cached input) at cached prices of 10, 25 and 50 %, the
cache-hit share, uncached tokens per turn, raw input tokens, and the gateway's own background calls.

    python benchmarks/cache.py --turns 150,300                  # no user, then a user with memories
    python benchmarks/cache.py --turns 150 --before /work/before  # the code before, side by side

`--before DIR` runs a checkout's gateway (PYTHONPATH=DIR) in the same run. The data is CC BY-NC 4.0:
read from its path, never copied into this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer, load_encoding
from gateway.fakes.openai_upstream import FakeUpstream, Reply
from gateway.fakes.server import BackgroundServer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "locomo" / "locomo-dev.json"
KEY = "sk-gw-bench"
MODEL = "gpt-4o-mini"
SYSTEM = "You are a helpful, friendly assistant. Answer in a few short paragraphs."
PRICES = (0.10, 0.25, 0.50)
MEMORIES = [
    ("preference", "The user prefers short answers with concrete examples."),
    ("preference", "The user likes hiking and photography on weekends."),
    ("profile", "The user works as a nurse in Chicago."),
    ("profile", "The user has two kids, Mia and Leo."),
    ("constraint", "The user is vegetarian."),
    ("stable_fact", "The user adopted a dog named Biscuit in March."),
    ("stable_fact", "The user is learning to play the cello."),
    ("stable_fact", "The user's sister Ana lives in Lisbon."),
    ("stable_fact", "The user ran a half marathon last autumn in 2 hours 5 minutes."),
    ("stable_fact", "The user is planning a trip to Japan next spring."),
]


@dataclass(slots=True)
class Turn:
    prompt: int
    cached: int
    sent: int = 0  # the gateway's own count of what it sent (0 for replay)
    tail: int = 0  # tokens of the volatile tail (retrieved groups, relevant memories)
    epoch: bool = False  # this turn began an epoch (the window jumped, the stable block was rebuilt)
    why: str = ""  # why retrieval went in the tail
    retrieved: int = 0  # tokens of the tail's retrieved history
    retrieved_ids: list[str] = field(default_factory=list)  # the stored messages it showed
    epoch_id: str = ""  # the stored message the turn's epoch starts at

    @property
    def uncached(self) -> int:
        return self.prompt - self.cached

    def cost(self, price: float) -> float:
        return self.uncached + price * self.cached


@dataclass(slots=True)
class Run:
    name: str
    turns: list[Turn] = field(default_factory=list)
    background: list[Turn] = field(default_factory=list)  # the gateway's summary and memory calls
    seconds: float = 0.0


def chat_turns(path: Path, count: int, answer_tokens: int) -> list[tuple[str, str]]:
    """(user message, answer) pairs from LoCoMo's turns in order: one turn as the question, the next
    turns joined as the answer until it reaches `answer_tokens` (neighbouring exchanges may share a few
    turns when the data is short for `count`)."""
    samples = json.loads(path.read_text())
    texts: list[str] = []
    for sample in samples:
        conversation = sample["conversation"]
        sessions = sorted(
            (k for k in conversation if k.startswith("session_") and not k.endswith("date_time")),
            key=lambda k: int(k.split("_")[1]),
        )
        for key in sessions:
            texts += [str(turn["text"]) for turn in conversation[key] if turn.get("text")]
    encoding = load_encoding("o200k_base")
    out: list[tuple[str, str]] = []
    # Each exchange starts `most` turns after the last at most, so a long chat never wraps around the
    # data (text said again verbatim is a true match for retrieval); a short one uses each turn once.
    most = max(len(texts) // count, 1)
    index = 0
    while len(out) < count:
        question = texts[index % len(texts)]
        answer: list[str] = []
        end = index + 1
        while len(encoding.encode_ordinary(" ".join(answer))) < answer_tokens:
            answer.append(texts[end % len(texts)])
            end += 1
        out.append((question, " ".join(answer)))
        index = min(end, index + most)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gateway_config(data_dir: Path, upstream_url: str) -> dict[str, Any]:
    """Default settings: only the tenant's upstream (with a key of the gateway's own, so summaries and
    memory run) and where the data goes."""
    return {
        "tenants": [
            {
                "name": "bench",
                "api_keys": [KEY],
                "upstream": {"base_url": upstream_url, "api_key": "sk-upstream"},
            }
        ],
        "storage": {"database_url": f"sqlite:///{data_dir}/gateway.db", "data_dir": str(data_dir)},
    }


class GatewayProcess:
    """`python -m gateway serve` from a checkout, in its own process."""

    def __init__(
        self, checkout: Path, data_dir: Path, upstream_url: str, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = data_dir / "config.yaml"
        config.write_text(json.dumps(gateway_config(data_dir, upstream_url)))  # JSON is YAML
        env = {**os.environ, **(env or {}), "PYTHONPATH": str(checkout)}
        self.log = (data_dir / "gateway.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(self.port)],
            cwd=checkout,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the gateway exited: see {data_dir / 'gateway.log'}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("the gateway did not start")

    def settle(self, limit: float = 3.0) -> None:
        """Until no job runs (a chat's user pauses between turns; jobs delayed on purpose stay queued)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            jobs = httpx.get(f"{self.url}/healthz").json().get("jobs") or {}
            if not jobs.get("running"):
                return
            time.sleep(0.05)

    def inspect(self, headers: dict[str, str]) -> Callable[[str, Turn], None]:
        """Reads each turn's ContextReport: its tail's tokens, whether it began an epoch."""
        auth = {"authorization": f"Bearer {KEY}", **headers}

        def read(request_id: str, turn: Turn) -> None:
            for _ in range(100):
                response = httpx.get(f"{self.url}/api/requests/{request_id}", headers=auth)
                if response.status_code == 200:
                    report = response.json().get("report") or {}
                    sections = report.get("sections") or {}
                    turn.tail = sum(
                        int((sections.get(name) or {}).get("tokens", 0))
                        for name in ("retrieval", "memory_relevant")
                    )
                    turn.epoch = bool((report.get("epoch") or {}).get("new")) and not report.get("unchanged")
                    retrieval = sections.get("retrieval") or {}
                    turn.why = str(retrieval.get("why", "")) if retrieval.get("tokens") else ""
                    turn.retrieved = int(retrieval.get("tokens", 0) or 0)
                    turn.retrieved_ids = (
                        [str(i) for i in retrieval.get("message_ids") or []] if turn.retrieved else []
                    )
                    turn.epoch_id = str((report.get("epoch") or {}).get("start_id") or "")
                    return
                time.sleep(0.02)

        return read

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()


def tail_policies(turns: list[Turn], price: float) -> tuple[float, float]:
    """The retrieved history's effective cost as built (each tail sent once, uncached) against keeping
    each retrieved message in the transcript where it was first sent: cached on every later turn of its
    epoch, and not retrieved again there. Each message's share of its tail's tokens is even."""
    sent_once = float(sum(t.retrieved for t in turns))
    kept_cost = 0.0
    kept: set[str] = set()
    kept_tokens = 0.0
    epoch = None
    for turn in turns:
        if turn.epoch_id != epoch:
            epoch, kept, kept_tokens = turn.epoch_id, set(), 0.0
        kept_cost += price * kept_tokens
        if not turn.retrieved_ids:
            continue
        share = turn.retrieved / len(turn.retrieved_ids)
        new = [i for i in turn.retrieved_ids if i not in kept]
        kept_cost += share * len(new)
        kept.update(new)
        kept_tokens += share * len(new)
    return sent_once, kept_cost


def usage_of(answer: Any) -> Turn:
    usage = answer.usage
    details = getattr(usage, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    return Turn(int(usage.prompt_tokens), cached)


def play(
    client: OpenAI,
    fake: FakeUpstream,
    turns: list[tuple[str, str]],
    headers: dict[str, str],
    pause: Callable[[], None] | None = None,
    inspect: Callable[[str, Turn], None] | None = None,
) -> list[Turn]:
    """The chat as an app sends it: the whole history resent every turn."""
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    out: list[Turn] = []
    for question, answer in turns:
        if pause is not None:
            pause()
        messages.append({"role": "user", "content": question})
        fake.enqueue(Reply(content=answer))
        response = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, extra_headers=headers
        )
        parsed = response.parse()
        turn = usage_of(parsed)
        turn.sent = int(response.headers.get("x-context-tokens-sent", 0) or 0)
        if inspect is not None:
            inspect(response.headers.get("x-gateway-request-id", ""), turn)
        out.append(turn)
        messages.append({"role": "assistant", "content": parsed.choices[0].message.content or ""})
    return out


def through_gateway(name: str, checkout: Path, turns: list[tuple[str, str]], user: str | None) -> Run:
    fake = FakeUpstream(record=False)
    run = Run(name)
    with tempfile.TemporaryDirectory() as tmp, BackgroundServer(fake.app()) as upstream:
        gateway = GatewayProcess(checkout, Path(tmp), f"{upstream.url}/v1")
        try:
            headers = {"X-User-Id": user} if user else {}
            if user:
                for kind, content in MEMORIES:
                    httpx.post(
                        f"{gateway.url}/api/memories",
                        json={"content": content, "type": kind},
                        headers={"authorization": f"Bearer {KEY}", **headers},
                    ).raise_for_status()
            client = OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0)
            started = time.perf_counter()
            run.turns = play(client, fake, turns, headers, gateway.settle, gateway.inspect(headers))
            run.seconds = time.perf_counter() - started
            cache = fake.prompt_cache
            run.background = [
                Turn(u.prompt_tokens, u.cached_tokens) for u in cache.records() if u.tag not in ("chat",)
            ]
        finally:
            gateway.close()
    return run


def full_replay(turns: list[tuple[str, str]]) -> Run:
    fake = FakeUpstream(record=False)
    with BackgroundServer(fake.app()) as upstream:
        client = OpenAI(base_url=f"{upstream.url}/v1", api_key="sk-upstream", max_retries=0)
        return Run("full replay", play(client, fake, turns, {}))


def effective(turns: list[Turn], price: float) -> float:
    return sum(t.cost(price) for t in turns)


def summarise(run: Run, replay: Run, stretch: int) -> None:
    turns, base = run.turns, replay.turns
    prompt = sum(t.prompt for t in turns)
    cached = sum(t.cached for t in turns)
    half = turns[len(turns) // 2 :]
    base_half = base[len(base) // 2 :]
    ratios = "  ".join(f"{int(p * 100)}%: {effective(turns, p) / effective(base, p):.2f}x" for p in PRICES)
    print(f"  {run.name}: effective cost vs full replay {ratios}")
    print(
        f"    cache hits {cached / max(prompt, 1):.1%} of {prompt:,} input tokens; raw input "
        f"{prompt / max(sum(t.prompt for t in base), 1):.2f}x of full replay's; uncached per turn, median of "
        f"the 2nd half {statistics.median(t.uncached for t in half):,.0f} vs "
        f"{statistics.median(t.uncached for t in base_half):,.0f} "
        f"({statistics.median(t.uncached for t in half) / max(statistics.median(t.uncached for t in base_half), 1):.1f}x)"
    )
    reasons = Counter(t.why for t in turns if t.tail)
    if reasons:
        print(
            f"    turns with a tail {sum(reasons.values())}: "
            + ", ".join(f"{w or '(reason not reported)'} {n}" for w, n in reasons.items())
        )
    if reasons:
        sent_once, kept = tail_policies(turns, 0.1)
        print(
            f"    retrieved history at 10%, sent once (as built) {sent_once:,.0f} against kept in the transcript "
            f"{kept:,.0f} (re-sent cached on the epoch's later turns, sent uncached only where new; the "
            "window's room it would take not counted)"
        )
    if run.background:
        bg = run.background
        print(
            f"    background calls {len(bg)}: {sum(t.prompt for t in bg):,} input tokens "
            f"({sum(t.cached for t in bg):,} cached); with them, at 10%: "
            f"{(effective(turns, 0.1) + effective(bg, 0.1)) / effective(base, 0.1):.2f}x"
        )
    print(
        f"    {'turns':>9} {'cost@10%':>9} {'replay':>9} {'ratio':>6} {'hit':>5} {'uncached/turn':>13} "
        f"{'epochs':>6} {'tails':>5} {'tail tokens':>11}"
    )
    for begin in range(0, len(turns), stretch):
        part, part_base = turns[begin : begin + stretch], base[begin : begin + stretch]
        p_prompt = sum(t.prompt for t in part)
        print(
            f"    {begin + 1:>4}-{begin + len(part):<4} {effective(part, 0.1):>9,.0f} "
            f"{effective(part_base, 0.1):>9,.0f} {effective(part, 0.1) / effective(part_base, 0.1):>6.2f} "
            f"{sum(t.cached for t in part) / max(p_prompt, 1):>5.0%} "
            f"{statistics.median(t.uncached for t in part):>13,.0f} {sum(t.epoch for t in part):>6} "
            f"{sum(t.tail > 0 for t in part):>5} {sum(t.tail for t in part):>11,}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--turns", default="150,300", help="chat lengths, comma-separated")
    parser.add_argument("--answer-tokens", type=int, default=270)
    parser.add_argument("--users", default="none,memories", help="none, memories, or both")
    parser.add_argument("--before", type=Path, help="a checkout of the code before, run side by side")
    parser.add_argument("--stretch", type=int, default=25, help="turns per printed row")
    parser.add_argument("--json", type=Path, help="write every turn's figures here too")
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(f"LoCoMo data not found at {args.data} (pass --data)")
    tokenizer = TiktokenTokenizer(load_encoding("o200k_base"))
    dump: dict[str, Any] = {}
    for count in (int(c) for c in args.turns.split(",")):
        turns = chat_turns(args.data, count, args.answer_tokens)
        history = sum(tokenizer.count(q) + tokenizer.count(a) for q, a in turns)
        print(f"\n{count} turns, ~{history:,} tokens of history")
        replay = full_replay(turns)
        dump[f"{count}/replay"] = [_row(t) for t in replay.turns]
        for user in args.users.split(","):
            who = None if user == "none" else "bench-user"
            label = "no user" if who is None else "a user with memories"
            checkouts = [("now", ROOT)] + ([("before", args.before)] if args.before else [])
            for name, checkout in checkouts:
                run = through_gateway(f"gateway {name}, {label}", checkout, turns, who)
                summarise(run, replay, args.stretch)
                dump[f"{count}/{user}/{name}"] = [_row(t) for t in run.turns]
    if args.json:
        args.json.write_text(json.dumps(dump))


def _row(turn: Turn) -> dict[str, int | bool | str]:
    return {
        "prompt": turn.prompt,
        "cached": turn.cached,
        "sent": turn.sent,
        "tail": turn.tail,
        "epoch": turn.epoch,
    }


if __name__ == "__main__":
    main()
