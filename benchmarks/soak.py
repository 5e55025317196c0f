"""Soak: real gateway processes under a steady mix of requests, then a check of everything stored.

    python benchmarks/soak.py --duration 600 --rate 12                 # the RELIABILITY.md soak (SQLite)
    python benchmarks/soak.py --duration 60 --rate 8 --out r.json       # the short one CI runs
    python benchmarks/soak.py --replicas 3 --postgres --closed 24 --duration 60   # scale-out throughput
    python benchmarks/soak.py --duration 600 --rate 3 --worker          # jobs in `context-gateway worker`

What runs (127.0.0.1 only): the fake upstream (`benchmarks/fake_upstream_server.py`: it echoes the
question, writes summaries and answers memory calls), and `--replicas` gateway processes started through
the real CLI (`python -m gateway serve`) on one store: SQLite by default, or a fresh schema on this
machine's Postgres (`--postgres`; needed for more than one replica), one LanceDB directory shared by all.
With `--worker`, the gateways run no jobs (`jobs.workers: 0`) and one `context-gateway worker` process
runs them all.
Every feature is on: storage, recognition, window, summaries (compaction every ~1,500 tokens), retrieval
with the local MiniLM embedder, memory extraction and recall.

The load: `--users` users with `--conversations` conversations each. A turn resends the conversation's
whole history (with a system prompt) plus a new question holding a unique code, streamed or not (half
each), through the replicas in turn, so consecutive turns of one conversation land on different
replicas. One turn in twenty edits the previous question instead (a branch). A conversation has one turn
in flight at a time, as a person waits for the answer. Open loop at `--rate` turns a second (a turn
whose conversations are all busy is counted as skipped), or closed loop with `--closed N` conversations
sending back to back (throughput).

Afterwards: wait until every background job has run; read each conversation's stored path back through
the REST API and compare it with what the client sent and received, message by message; count the
tenant's stored messages against the distinct messages the clients made (every message exactly once);
run `context-gateway verify` (trees, chain hashes, counts, index rows once per view with vectors, jobs);
grep every log line for the upstream key and the gateway key. RSS of each gateway process (and of the
worker) is sampled every 5 s, and each one's CPU time over the load is divided by the turns. Prints a report; `--out` writes it as JSON. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
GATEWAY_KEY = "sk-gw-soak-" + secrets.token_hex(8)
UPSTREAM_KEY = "sk-upstream-soak-" + secrets.token_hex(8)
SYSTEM = {"role": "system", "content": "You are a careful assistant for the operations team."}
TOPICS = ["invoice", "deploy", "vacation", "database", "contract", "printer", "budget", "release"]
POSTGRES_URL = os.environ.get(
    "GATEWAY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


# --small-caches: bounds this load fills within its first minutes, so that what grows after them is not
# a cache filling (the defaults take hours of this load to fill).
CACHE_EVERY = 6  # RSS samples (5 s apart) between readings of the gateways' caches
SMALL_CACHES = {
    "node_cache_size": 1_500,
    "history_memo_bytes": 1024 * 1024,
    "body_memo_bytes": 1024 * 1024,
    "vector_cache_mb": 8,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a live process so far (/proc/PID/stat), 0 once it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def rss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@dataclass
class Conversation:
    user: str
    index: int
    history: list[dict[str, Any]] = field(default_factory=list)
    conversation_id: str | None = None
    question_id: str | None = None  # the last question's stored id (x-message-id): its answer is the leaf
    paths: set[tuple[str, ...]] = field(default_factory=set)  # every prefix sent or answered (distinct nodes)
    busy: bool = False
    turns: int = 0

    def remember(self, messages: list[dict[str, Any]]) -> None:
        chain: tuple[str, ...] = ()
        for m in messages:
            chain = (*chain, f"{m['role']}\x1f{m['content']}")
            self.paths.add(chain)


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"stream": [], "json": []})
    # (monotonic time, the gateway's own ms: x-gateway-overhead-ms): the latency the gateway adds.
    added: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: int = 0
    turns: int = 0
    branches: int = 0


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.rng = random.Random(args.seed)
        self.stats = Stats()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.gateways: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.worker: subprocess.Popen[bytes] | None = None  # --worker: the process that runs the jobs
        self.worker_argv: list[str] = []
        self.logs: list[Path] = []
        self.rss: list[dict[str, Any]] = []
        # Each gateway's caches (`/healthz` caches_mb) every CACHE_EVERY samples: {"t", "mb": [by cache]}.
        self.caches: list[dict[str, Any]] = []
        self.conversations = [
            Conversation(f"user-{u:03d}", c) for u in range(args.users) for c in range(args.conversations)
        ]
        self.next_replica = 0
        self.schema: str | None = None

    # -- processes --------------------------------------------------------------------------------

    def start(self) -> None:
        upstream_port = self._start_upstream()
        self.config = self.workdir / "soak.yaml"
        self.config.write_text(json.dumps(self._config(upstream_port)))
        for n in range(self.args.replicas):
            self.gateways.append(self._gateway(f"gateway-{n}"))
        if self.args.worker or self.args.jobs_after:  # the config, with the workers the gateways go without
            worker_config = self.workdir / "worker.yaml"
            settings = self._config(upstream_port, reuse_schema=True)
            worker_config.write_text(json.dumps({**settings, "jobs": {**settings["jobs"], "workers": 2}}))
            self.worker_argv = [sys.executable, "-m", "gateway", "worker", "--config", str(worker_config)]
            if self.args.worker_nice:
                self.worker_argv = ["nice", "-n", str(self.args.worker_nice), *self.worker_argv]
            if self.args.worker:
                self.start_worker()
        deadline = time.monotonic() + 120
        for n in range(len(self.gateways)):
            retries = 3
            while True:
                url, process = self.gateways[n]
                if process.poll() is not None:
                    log = self.logs[self.processes.index(process)]
                    tail = log.read_text(errors="replace")[-3000:]  # the cause, where CI prints it
                    if "address already in use" in tail and retries:
                        # The free port was taken before the gateway bound it (another test's
                        # connection): start it again on another.
                        retries -= 1
                        self.gateways[n] = self._gateway(f"gateway-{n}-retry{3 - retries}")
                        continue
                    raise SystemExit(f"gateway at {url} exited at start ({log}):\n{tail}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"gateway at {url} did not start in 120 s")
                time.sleep(0.3)

    def _start_upstream(self) -> int:
        """Start the fake upstream and wait until it accepts connections; another port if its was taken."""
        deadline = time.monotonic() + 60
        for attempt in range(4):
            port = free_port()
            argv = [sys.executable, str(ROOT / "benchmarks" / "fake_upstream_server.py"), "--port", str(port)]
            process = self._spawn(argv, f"upstream-{attempt}" if attempt else "upstream")
            while process.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    return port
                time.sleep(0.2)
            if process.poll() is None:
                break
            # It exited at start: most likely the free port was taken before it bound it.
        tail = self.logs[-1].read_text(errors="replace")[-3000:]
        raise SystemExit(f"the fake upstream did not start ({self.logs[-1]}):\n{tail}")

    def start_worker(self) -> None:
        self.worker = self._spawn(self.worker_argv, "worker")

    def _gateway(self, name: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        argv = [sys.executable, "-m", "gateway", "serve", "--config", str(self.config), "--port", str(port)]
        return f"http://127.0.0.1:{port}", self._spawn(argv, name)

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{name}.log"
        self.logs.append(log)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "UPSTREAM_KEY": UPSTREAM_KEY}
        if self.args.heap:  # gateway/heap_probe.py: tracemalloc, a snapshot on each SIGUSR2
            env["GATEWAY_HEAP_SNAPSHOTS"] = str(self.workdir / "heap")
        process = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.processes.append(process)
        return process

    def _config(self, upstream_port: int, reuse_schema: bool = False) -> dict[str, Any]:
        if self.args.postgres:
            if not reuse_schema:
                import psycopg

                self.schema = f"soak_{uuid.uuid4().hex[:10]}"
                with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), autocommit=True) as connection:
                    connection.execute(f'CREATE SCHEMA "{self.schema}"')
            database_url = f"{POSTGRES_URL}?options=-csearch_path%3D{self.schema}"
        else:
            database_url = f"sqlite:///{self.workdir}/soak.db"
        return {
            "server": {"log_format": "json", "log_level": "info", "shutdown_grace_seconds": 20},
            "storage": {
                "database_url": database_url,
                "data_dir": str(self.workdir / "data"),
                "index_uri": str(self.workdir / "lancedb"),  # one directory for every replica
                **(SMALL_CACHES if self.args.small_caches else {}),
            },
            "jobs": {"workers": 0 if self.args.worker or self.args.jobs_after else 2, "poll_seconds": 0.5},
            "tenants": [
                {
                    "name": "soak",
                    "api_keys": [GATEWAY_KEY],
                    # From the environment, as a deployment would: the key must never reach a log.
                    "upstream": {
                        "base_url": f"http://127.0.0.1:{upstream_port}/v1",
                        "api_key": "${UPSTREAM_KEY}",
                    },
                    "context": {"budget_tokens": 3000, "recent_tokens": 1200},
                    "compaction": {"model": "fake-cheap", "threshold_tokens": 1500, "chunk_tokens": 1500},
                    "memory": {"extract_delay_seconds": 2, "profile_delay_seconds": 5},
                }
            ],
        }

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()

    def drop_schema(self) -> None:
        if self.schema is not None:
            import psycopg

            with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), autocommit=True) as connection:
                connection.execute(f'DROP SCHEMA "{self.schema}" CASCADE')

    # -- load -------------------------------------------------------------------------------------

    def _replica(self) -> str:
        url = self.gateways[self.next_replica % len(self.gateways)][0]
        self.next_replica += 1
        return url

    async def turn(self, client: httpx.AsyncClient, conversation: Conversation) -> None:
        conversation.busy = True
        try:
            conversation.turns += 1
            code = f"{self.rng.choice(TOPICS)}-{conversation.user[-3:]}-{conversation.index}-{conversation.turns}"
            question = {
                "role": "user",
                "content": f"Turn {conversation.turns}: what should I do about {code}? "
                + " ".join(self.rng.choice(TOPICS) for _ in range(self.rng.randint(5, 40))),
            }
            history = conversation.history
            branch = len(history) >= 4 and self.rng.random() < 0.05
            if branch:  # edit the previous question: a branch from the answer before it
                history = history[:-2]
                self.stats.branches += 1
            messages = [*history, question]
            stream = self.rng.random() < 0.5
            body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [SYSTEM, *messages], "stream": stream}
            headers = {"Authorization": f"Bearer {GATEWAY_KEY}", "X-User-Id": conversation.user}
            started = time.perf_counter()
            answer, response_headers = await self._send(client, body, headers, stream)
            self.stats.latencies["stream" if stream else "json"].append(time.perf_counter() - started)
            overhead = response_headers.get("x-gateway-overhead-ms")
            if overhead is not None:
                self.stats.added.append((time.monotonic(), float(overhead)))
            self.stats.turns += 1
            reply = {"role": "assistant", "content": answer}
            conversation.history = [*messages, reply]
            conversation.remember(conversation.history)
            cid = response_headers.get("x-conversation-id")
            if conversation.conversation_id is None:
                conversation.conversation_id = cid
            elif cid != conversation.conversation_id:
                self.stats.errors.append(
                    f"{conversation.user}/{conversation.index}: conversation {cid}, was {conversation.conversation_id}"
                )
            conversation.question_id = response_headers.get("x-message-id")
        except Exception as exc:  # counted, never fatal: the soak goes on
            self.stats.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        finally:
            conversation.busy = False

    async def _send(
        self, client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], stream: bool
    ) -> tuple[str, httpx.Headers]:
        url = f"{self._replica()}/v1/chat/completions"
        if not stream:
            response = await client.post(url, json=body, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
            return str(response.json()["choices"][0]["message"]["content"]), response.headers
        parts: list[str] = []
        done = False
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"in-band error: {chunk['error']}")
                for choice in chunk.get("choices", []):
                    parts.append(choice.get("delta", {}).get("content") or "")
            headers_out = response.headers
        if not done:
            raise RuntimeError("stream ended without [DONE]")
        return "".join(parts), headers_out

    async def run_load(self) -> None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            sampler = asyncio.create_task(self._sample_rss())
            end = time.monotonic() + self.args.duration
            tasks: set[asyncio.Task[None]] = set()
            if self.args.closed:
                chosen = self.conversations[: self.args.closed]

                async def loop(conversation: Conversation) -> None:
                    while time.monotonic() < end:
                        await self.turn(client, conversation)

                await asyncio.gather(*(loop(c) for c in chosen))
            else:
                interval = 1.0 / self.args.rate
                next_at = time.monotonic()
                while next_at < end:
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    next_at += interval
                    idle = [c for c in self.conversations if not c.busy]
                    if not idle:
                        self.stats.skipped += 1
                        continue
                    task = asyncio.create_task(self.turn(client, self.rng.choice(idle)))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*tasks)
            sampler.cancel()

    async def _sample_rss(self) -> None:
        started = time.monotonic()
        # Heap snapshots (--heap): the baseline after a quarter of the load, then at five eighths and the end.
        marks = [self.args.duration * f for f in (0.25, 0.625)] if self.args.heap else []
        async with httpx.AsyncClient(timeout=5) as http:
            for n in itertools.count():
                elapsed = time.monotonic() - started
                self.rss.append({"t": round(elapsed, 1), "kb": [rss_kb(p.pid) for p in self.measured()]})
                if n % CACHE_EVERY == 0:
                    with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                        held = [
                            (await http.get(f"{url}/healthz")).json()["caches_mb"] for url, _ in self.gateways
                        ]
                        self.caches.append({"t": round(elapsed, 1), "mb": held})
                if marks and elapsed >= marks[0]:
                    marks.pop(0)
                    self.heap_snapshot()
                await asyncio.sleep(5)

    def measured(self) -> list[subprocess.Popen[bytes]]:
        """The processes whose memory and CPU are reported: each gateway, then the worker if any."""
        return [p for _, p in self.gateways] + ([self.worker] if self.worker is not None else [])

    def heap_snapshot(self) -> None:
        for _, process in self.gateways:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGUSR2)

    def heap_diffs(self) -> dict[str, list[str]]:
        """The snapshot files the gateways wrote, by name, the growth lines first."""
        folder = self.workdir / "heap"
        if not folder.exists():
            return {}
        return {f.name: f.read_text().splitlines()[:16] for f in sorted(folder.iterdir())}

    # -- checks -----------------------------------------------------------------------------------

    def wait_for_jobs(self, timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        counts: dict[str, int] = {}
        while time.monotonic() < deadline:
            if self.worker is not None and self.worker.poll() is not None:
                raise SystemExit(f"the worker exited ({self.workdir / 'worker.log'})")
            counts = httpx.get(f"{self.gateways[0][0]}/healthz", timeout=10).json()["jobs"]
            if counts.get("queued", 0) == 0 and counts.get("running", 0) == 0:
                return counts
            time.sleep(1)
        return counts

    def check_paths(self) -> dict[str, Any]:
        """Each conversation's stored path, up to the answer to its last question, is what the client holds."""
        auth = {"Authorization": f"Bearer {GATEWAY_KEY}"}
        url = self.gateways[-1][0]
        mismatches: list[str] = []
        checked = 0
        with httpx.Client(timeout=30, headers=auth) as client:
            for c in self.conversations:
                if c.conversation_id is None or c.question_id is None:
                    continue
                messages = client.get(f"{url}/api/conversations/{c.conversation_id}/messages").json()["data"]
                answer = next(
                    (m for m in messages if m["parent_id"] == c.question_id and m["role"] == "assistant"),
                    None,
                )
                if answer is None:
                    mismatches.append(f"{c.conversation_id}: the last answer is not stored")
                    continue
                path = client.get(f"{url}/api/conversations/{c.conversation_id}/path/{answer['id']}").json()[
                    "data"
                ]
                stored = [(m["message"]["role"], m["message"]["content"]) for m in path]
                sent = [(m["role"], m["content"]) for m in c.history]
                checked += 1
                if stored != sent:
                    first = next(
                        (i for i, (a, b) in enumerate(zip(stored, sent, strict=False)) if a != b), None
                    )
                    mismatches.append(
                        f"{c.conversation_id}: stored path of {len(stored)} != sent {len(sent)} (first difference at {first})"
                    )
        expected = sum(len(c.paths) for c in self.conversations)
        return {
            "conversations_checked": checked,
            "mismatches": mismatches,
            "distinct_messages_sent": expected,
        }

    def verify(self) -> dict[str, Any]:
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "verify", "--config", str(self.config)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "UPSTREAM_KEY": UPSTREAM_KEY},
            timeout=900,
        )
        lines = result.stdout.splitlines()
        summary = next((line for line in lines if line.startswith("soak:")), "")
        messages = int(summary.split(" messages")[0].rsplit(" ", 1)[1]) if " messages" in summary else -1
        return {
            "exit": result.returncode,
            "summary": summary,
            "verdict": lines[-1] if lines else result.stderr[-300:],
            "faults": [line.strip() for line in lines if "FAULT" in line][:20],
            "stored_messages": messages,
        }

    def secrets_in_logs(self) -> dict[str, int]:
        found = {"upstream_key": 0, "gateway_key": 0, "log_lines": 0}
        for log in self.logs:
            for line in log.read_text(errors="replace").splitlines():
                found["log_lines"] += 1
                found["upstream_key"] += UPSTREAM_KEY in line
                found["gateway_key"] += GATEWAY_KEY in line
        return found


def added_after(added: list[tuple[float, float]], since: float) -> dict[str, float]:
    kept = [ms / 1000 for at, ms in added if at >= since]  # percentile() takes seconds
    return {"n": len(kept), "p50": round(percentile(kept, 0.5), 1), "p99": round(percentile(kept, 0.99), 1)}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600, help="seconds of load")
    parser.add_argument("--rate", type=float, default=12, help="turns a second (open loop)")
    parser.add_argument(
        "--closed", type=int, default=0, help="N conversations back to back instead of --rate"
    )
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--conversations", type=int, default=3, help="per user")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--postgres", action="store_true", help="a fresh schema on this machine's Postgres")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--warmup", type=float, default=30, help="seconds of load left out of the added-latency figures"
    )
    parser.add_argument("--jobs-timeout", type=float, default=600)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, store)")
    parser.add_argument(
        "--small-caches", action="store_true", help="cache bounds the load fills in minutes (SMALL_CACHES)"
    )
    parser.add_argument(
        "--worker",
        action="store_true",
        help="jobs in a `context-gateway worker` process, none in the gateways",
    )
    parser.add_argument(
        "--worker-nice", type=int, default=0, help="with --worker: run the worker under `nice -n N`"
    )
    parser.add_argument(
        "--jobs-after",
        action="store_true",
        help="no jobs during the load: a `context-gateway worker` runs them all once it ends (what the "
        "request path costs alone)",
    )
    parser.add_argument(
        "--heap", action="store_true", help="heap snapshot diffs (tracemalloc) at 25/62.5/100 %%"
    )
    args = parser.parse_args()
    if args.replicas > 1 and not args.postgres:
        parser.error("more than one replica needs --postgres (one SQLite file is not shared across hosts)")
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    soak = Soak(args, workdir)
    load1 = os.getloadavg()[0]
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "load_before": load1}
    try:
        soak.start()
        t0 = time.monotonic()
        cpu_before = [cpu_seconds(p.pid) for p in soak.measured()]
        asyncio.run(soak.run_load())
        load_time = time.monotonic() - t0
        cpu_load = [  # 0 for a process gone meanwhile (its time is unknown)
            max(cpu_seconds(p.pid) - before, 0.0)
            for p, before in zip(soak.measured(), cpu_before, strict=True)
        ]
        if args.heap:
            soak.heap_snapshot()  # the end of the load: growth since the baseline
            time.sleep(20)  # a snapshot of a large heap takes seconds; the files are read at the end
        jobs_started = time.monotonic()
        if args.jobs_after:
            soak.start_worker()
        jobs = soak.wait_for_jobs(args.jobs_timeout)
        report["jobs_drain_seconds"] = round(time.monotonic() - jobs_started, 1)
        report["jobs"] = jobs
        report["paths"] = soak.check_paths()
        soak.stop()
        report["verify"] = soak.verify()
        report["secrets_in_logs"] = soak.secrets_in_logs()
        report["heap"] = soak.heap_diffs()
    finally:
        soak.stop()
        with contextlib.suppress(Exception):
            soak.drop_schema()
    stats = soak.stats
    every = stats.latencies["stream"] + stats.latencies["json"]
    report.update(
        {
            "load_seconds": round(load_time, 1),
            "turns": stats.turns,
            "turns_per_second": round(stats.turns / load_time, 2),
            "branches": stats.branches,
            "skipped": stats.skipped,
            "errors": len(stats.errors),
            "error_samples": stats.errors[:10],
            "latency_ms": {
                kind: {"n": len(v), "p50": round(percentile(v, 0.5), 1), "p99": round(percentile(v, 0.99), 1)}
                for kind, v in {**stats.latencies, "all": every}.items()
            },
            # The gateway's own time a turn, past the warm-up (the model's first load is not the load's).
            "added_ms_after_warmup": added_after(stats.added, t0 + args.warmup),
            "rss_mb": [{"t": s["t"], "mb": [round(kb / 1024, 1) for kb in s["kb"]]} for s in soak.rss],
            "rss_slope_mb_per_min_last_half": rss_slopes(soak.rss),
            "caches_mb": soak.caches,
            # The same slope with each gateway's caches taken off (what the bounded caches do not explain).
            "rss_less_caches_slope_mb_per_min_last_half": rss_slopes(less_caches(soak.rss, soak.caches)),
            # Each process's CPU time during the load a turn (gateways, then the worker with --worker).
            "cpu_ms_per_turn": [round(1000 * c / max(stats.turns, 1), 1) for c in cpu_load],
            "load_after": os.getloadavg()[0],
        }
    )
    stored = report["verify"]["stored_messages"]
    expected = report["paths"]["distinct_messages_sent"]
    report["checks"] = {
        "no_errors": stats.turns > 0 and not stats.errors,
        "paths_match": not report["paths"]["mismatches"],
        "every_message_once": stored == expected,
        "verify_consistent": report["verify"]["exit"] == 0 and report["verify"]["verdict"] == "consistent",
        "jobs_drained": jobs.get("queued", 0) == 0
        and jobs.get("running", 0) == 0
        and jobs.get("failed", 0) == 0,
        "no_secrets_logged": report["secrets_in_logs"]["upstream_key"] == 0
        and report["secrets_in_logs"]["gateway_key"] == 0,
    }
    print_report(report, stored, expected)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    if args.keep:
        print(f"work directory kept: {workdir}")
    else:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    return 0 if all(report["checks"].values()) else 1


def less_caches(rss: list[dict[str, Any]], caches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RSS samples taken with a cache reading, less each gateway's caches (the worker's as it was)."""
    by_time = {c["t"]: c["mb"] for c in caches}
    out = []
    for sample in rss:
        held = by_time.get(sample["t"])
        if held is not None:
            kb = [
                k - (sum(held[i].values()) * 1024 if i < len(held) else 0) for i, k in enumerate(sample["kb"])
            ]
            out.append({"t": sample["t"], "kb": kb})
    return out


def rss_slopes(samples: list[dict[str, Any]]) -> list[float]:
    """Each gateway's resident memory trend over the last half of the load, in MB a minute (least squares)."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2:
        return []
    ts = [s["t"] / 60 for s in half]
    mean_t = sum(ts) / len(ts)
    spread = sum((t - mean_t) ** 2 for t in ts) or 1.0
    slopes = []
    for i in range(len(half[0]["kb"])):
        mb = [s["kb"][i] / 1024 for s in half]
        mean_mb = sum(mb) / len(mb)
        slopes.append(
            round(sum((t - mean_t) * (m - mean_mb) for t, m in zip(ts, mb, strict=True)) / spread, 3)
        )
    return slopes


def print_report(report: dict[str, Any], stored: int, expected: int) -> None:
    lat = report["latency_ms"]
    print(
        f"turns {report['turns']} in {report['load_seconds']} s ({report['turns_per_second']}/s), "
        f"branches {report['branches']}, skipped {report['skipped']}, errors {report['errors']}"
    )
    for kind in ("json", "stream", "all"):
        print(
            f"  {kind:6} n={lat[kind]['n']:5}  p50 {lat[kind]['p50']:8.1f} ms  p99 {lat[kind]['p99']:8.1f} ms"
        )
    added = report["added_ms_after_warmup"]
    print(
        f"  added by the gateway after {report['args']['warmup']} s: n={added['n']:5}  "
        f"p50 {added['p50']:8.1f} ms  p99 {added['p99']:8.1f} ms"
    )
    samples = report["rss_mb"]
    if samples:
        warm = samples[len(samples) // 4]
        print(f"  RSS MB at {warm['t']} s: {warm['mb']}; at {samples[-1]['t']} s: {samples[-1]['mb']}")
        print(f"  RSS slope over the last half, MB a minute: {report['rss_slope_mb_per_min_last_half']}")
    held = report.get("caches_mb") or []
    if held:
        warm = held[len(held) // 4]
        for label, sample in (("at", warm), ("at", held[-1])):
            shown = "; ".join(", ".join(f"{k} {v:.1f}" for k, v in g.items()) for g in sample["mb"])
            print(f"  caches MB {label} {sample['t']} s: {shown}")
        print(
            f"  RSS less caches, slope over the last half: {report['rss_less_caches_slope_mb_per_min_last_half']}"
        )
    who = "gateways, then the worker" if report["args"]["worker"] == "True" else "gateways"
    print(f"  CPU ms a turn during the load ({who}): {report['cpu_ms_per_turn']}")
    for name, lines in report.get("heap", {}).items():
        print(f"  heap {name}:")
        for line in lines[:11]:
            print(f"    {line}")
    print(f"  jobs after the load: {report['jobs']} (drained in {report['jobs_drain_seconds']} s)")
    print(f"  stored messages {stored}, distinct messages sent {expected}")
    print(
        f"  paths checked {report['paths']['conversations_checked']}, mismatches {len(report['paths']['mismatches'])}"
    )
    print(f"  verify: {report['verify']['summary']} -> {report['verify']['verdict']}")
    for fault in report["verify"]["faults"]:
        print(f"    {fault}")
    print(f"  secrets in logs: {report['secrets_in_logs']}")
    print("  checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in report["checks"].items()))
    for sample in report["error_samples"]:
        print(f"  error: {sample}")


if __name__ == "__main__":
    sys.exit(main())
