"""Pass-through overhead of the gateway, measured side by side against the same fake upstream called directly.

    python benchmarks/overhead.py            # full run, ~4-6 minutes
    python benchmarks/overhead.py --quick    # smoke run, under a minute

Three kinds of process, all on 127.0.0.1:
  * the fake OpenAI-compatible upstream (`benchmarks/fake_upstream_server.py`: uvicorn + uvloop + httptools,
    record=False);
  * two gateways started through the real CLI (`python -m gateway serve --config ... --port ...`), one per
    upstream client (`upstream.http_client: httpx` and `httpx-aiohttp`), both pointing at that fake;
  * this process, the load generator: raw keep-alive HTTP/1.1 connections with pre-built request bytes and
    the httptools parser (`benchmarks/loadgen.py`), and `wrk` (C, epoll) for throughput when it is installed.

Measured:
  1. latency at 1 connection, non-stream: direct and through each gateway, requests interleaved
     round-robin on three connections so that all three see the same machine state;
  2. time to first token (first SSE body bytes) of streams at 1 connection, interleaved the same way;
  3. 32 concurrent keep-alive connections: requests/s and latency percentiles, with the CPU time each
     process used per request (from /proc), with wrk and with the Python generator;
  4. N simultaneous paced streams through each gateway (20 SSE chunks + [DONE], `chunk_delay` apart):
     every frame of every stream is checked for loss, duplication, order and cross-talk.
Figures are printed as a table and written to benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import Conn, build_request, connect, pct, perf  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "overhead.json"
HOST = "127.0.0.1"
GATEWAY_KEY = "sk-bench-gateway"
UPSTREAM_KEY = "sk-bench-upstream"
CLIENTS = ("httpx", "httpx-aiohttp")
DEFAULT_CLIENT = "httpx-aiohttp"  # gateway/config.py default
CLK_TCK = os.sysconf("SC_CLK_TCK")

GOALS = {
    "added_p50_ms": 0.5,
    "added_p99_ms": 2.0,
    "ttft_added_p99_ms": 2.0,
    "rps_32": 2000.0,
    "streams": 1000,
}


@dataclass(frozen=True)
class Settings:
    quick: bool
    seq_requests: int
    seq_warmup: int
    ttft_requests: int
    conc_connections: int
    conc_seconds: float
    conc_warmup_seconds: float
    stream_levels: tuple[int, ...]
    stream_chunk_delay: float
    stream_clients: tuple[str, ...]
    python_generator_for_throughput: bool

    @staticmethod
    def make(quick: bool) -> Settings:
        if quick:
            return Settings(
                quick=True,
                seq_requests=500,
                seq_warmup=100,
                ttft_requests=300,
                conc_connections=32,
                conc_seconds=2.0,
                conc_warmup_seconds=0.5,
                stream_levels=(1000,),
                stream_chunk_delay=0.1,
                stream_clients=(DEFAULT_CLIENT,),
                python_generator_for_throughput=False,
            )
        return Settings(
            quick=False,
            seq_requests=3000,
            seq_warmup=300,
            ttft_requests=2000,
            conc_connections=32,
            conc_seconds=10.0,
            conc_warmup_seconds=1.0,
            stream_levels=(1000, 2000, 4000),
            stream_chunk_delay=0.1,
            stream_clients=CLIENTS,
            python_generator_for_throughput=True,
        )


# --------------------------------------------------------------------------------------------- processes


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the child processes
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a live process, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Child:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Children:
    items: list[Child] = field(default_factory=list)

    def start(self, name: str, port: int, argv: list[str], workdir: Path) -> Child:
        log = workdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir
            )
        child = Child(name, port, proc, log)
        self.items.append(child)
        return child

    def stop(self) -> None:
        for child in self.items:
            if child.alive():
                child.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        for child in self.items:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if child.alive():
                child.proc.kill()
                child.proc.wait(timeout=5)


def wait_ready(child: Child, path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://{HOST}:{child.port}{path}"
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited during start-up:\n{child.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{child.name} not ready on {url} after {timeout:.0f}s")


def gateway_config(upstream_port: int, client: str, workdir: Path) -> dict[str, Any]:
    return {
        "server": {"host": HOST, "log_level": "warning"},
        "storage": {"database_url": f"sqlite:///{workdir}/gateway.db", "data_dir": str(workdir / "data")},
        "tenants": [
            {
                "name": "bench",
                "api_keys": [GATEWAY_KEY],
                "upstream": {
                    "base_url": f"http://{HOST}:{upstream_port}/v1",
                    "api_key": UPSTREAM_KEY,
                    "http_client": client,
                },
            }
        ],
    }


# ------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Target:
    name: str  # "direct" or the gateway's http_client
    port: int
    key: str
    pid: int

    def request(self, body: dict[str, Any]) -> bytes:
        payload = orjson.dumps(body)
        return build_request(HOST, self.port, "/v1/chat/completions", payload, {"Authorization": f"Bearer {self.key}"})


CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "Say hello to the benchmark."}]}
CHAT_STREAM = {**CHAT, "stream": True}


def ms(seconds: float) -> float:
    return round(seconds * 1000, 4)


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "n": len(values),
        "p50_ms": ms(pct(values, 50)),
        "p90_ms": ms(pct(values, 90)),
        "p99_ms": ms(pct(values, 99)),
        "max_ms": ms(values[-1]) if values else float("nan"),
    }


async def watchdog(conns: list[Conn], seconds: float) -> None:
    """Bound a phase in time: close every connection when the deadline passes (pending requests fail)."""
    await asyncio.sleep(seconds)
    for conn in conns:
        conn.close()


# ------------------------------------------------------------------------- 1 + 2: one connection, interleaved


async def interleaved(
    targets: list[Target], body: dict[str, Any], count: int, warmup: int, *, stream: bool, budget: float
) -> dict[str, Any]:
    conns = [await connect(HOST, t.port, header=b"x-gateway-overhead-ms") for t in targets]
    requests = [t.request(body) for t in targets]
    total: dict[str, list[float]] = {t.name: [] for t in targets}
    first: dict[str, list[float]] = {t.name: [] for t in targets}
    self_reported: dict[str, list[float]] = {t.name: [] for t in targets}
    errors = dict.fromkeys(total, 0)
    guard = asyncio.ensure_future(watchdog(conns, budget))
    started = perf()
    try:
        for i in range(warmup + count):
            # rotate the order so no target always goes first (or right after another one)
            for j in range(len(targets)):
                k = (i + j) % len(targets)
                conn, target = conns[k], targets[k]
                t0 = perf()
                done = await conn.send(requests[k])
                if i < warmup:
                    continue
                if conn.status != 200:
                    errors[target.name] += 1
                    continue
                total[target.name].append(done - t0)
                if stream:
                    first[target.name].append(conn.first - t0)
                if conn.header_value is not None:
                    self_reported[target.name].append(float(conn.header_value) / 1000)
    finally:
        guard.cancel()
        for conn in conns:
            conn.close()
    out: dict[str, Any] = {"seconds": round(perf() - started, 2)}
    for target in targets:
        row: dict[str, Any] = {"total": summary(total[target.name]), "errors": errors[target.name]}
        if stream:
            row["ttft"] = summary(first[target.name])
        if self_reported[target.name]:
            row["self_reported_overhead"] = summary(self_reported[target.name])
        out[target.name] = row
    key = "ttft" if stream else "total"
    direct = out["direct"][key]
    for target in targets[1:]:
        mine = out[target.name][key]
        out[target.name]["added"] = {
            "p50_ms": round(mine["p50_ms"] - direct["p50_ms"], 4),
            "p99_ms": round(mine["p99_ms"] - direct["p99_ms"], 4),
        }
    return out


# -------------------------------------------------------------------------------- 3: 32 connections


async def concurrent_python(target: Target, others: list[int], settings: Settings) -> dict[str, Any]:
    n = settings.conc_connections
    conns = [await connect(HOST, target.port) for _ in range(n)]
    request = target.request(CHAT)
    warm_end = perf() + settings.conc_warmup_seconds
    end = warm_end + settings.conc_seconds
    latencies: list[float] = []
    errors = 0
    cpu_at: dict[str, list[float]] = {}

    def snapshot(label: str) -> None:
        cpu_at[label] = [own_cpu_seconds(), *(cpu_seconds(pid) for pid in others)]

    async def worker(conn: Conn) -> None:
        nonlocal errors
        while (t0 := perf()) < end:
            done = await conn.send(request)
            if conn.status != 200:
                errors += 1
            elif t0 >= warm_end:
                latencies.append(done - t0)

    async def meter() -> None:
        await asyncio.sleep(max(0.0, warm_end - perf()))
        snapshot("start")
        await asyncio.sleep(max(0.0, end - perf()))
        snapshot("end")

    guard = asyncio.ensure_future(watchdog(conns, settings.conc_warmup_seconds + settings.conc_seconds + 30))
    try:
        await asyncio.gather(meter(), *(worker(c) for c in conns))
    finally:
        guard.cancel()
        for conn in conns:
            conn.close()
    rps = len(latencies) / settings.conc_seconds
    cpu = [b - a for a, b in zip(cpu_at["start"], cpu_at["end"], strict=True)]
    return {
        "generator": "python",
        "requests": len(latencies),
        "errors": errors,
        "rps": round(rps, 1),
        "latency": summary(latencies),
        "cpu": cpu_breakdown(cpu, len(latencies), settings.conc_seconds, target.name),
    }


def cpu_breakdown(cpu: list[float], requests: int, seconds: float, target: str) -> dict[str, Any]:
    """cpu = [load generator, fake upstream, gateway (absent for direct)] CPU seconds over the window."""
    names = ["load_generator", "fake_upstream"] + ([] if target == "direct" else ["gateway"])
    out: dict[str, Any] = {}
    for name, used in zip(names, cpu, strict=True):
        out[name] = {
            "cores": round(used / seconds, 2),
            "us_per_request": round(used / requests * 1e6, 1) if requests else None,
        }
    return out


WRK_LUA = """
wrk.method = "POST"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {{"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def run_wrk(target: Target, seconds: float, connections: int, script: Path, others: list[int]) -> dict[str, Any]:
    script.write_text(WRK_LUA.format(body=orjson.dumps(CHAT).decode(), key=target.key))
    url = f"http://{HOST}:{target.port}/v1/chat/completions"
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script), url]
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = [cpu_seconds(pid) for pid in others]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
    after = [cpu_seconds(pid) for pid in others]
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"WRKJSON (\{.*\})", done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    raw = json.loads(match.group(1))
    duration = raw["duration_us"] / 1e6
    wrk_cpu = (after_children.ru_utime + after_children.ru_stime) - (
        before_children.ru_utime + before_children.ru_stime
    )
    cpu = [wrk_cpu] + [b - a for a, b in zip(before, after, strict=True)]
    errors = sum(raw[k] for k in ("connect", "read", "write", "status", "timeout"))
    return {
        "generator": "wrk",
        "requests": raw["requests"],
        "errors": errors,
        "rps": round(raw["requests"] / duration, 1),
        "latency": {
            "n": raw["requests"],
            "p50_ms": raw["p50_us"] / 1000,
            "p90_ms": raw["p90_us"] / 1000,
            "p99_ms": raw["p99_us"] / 1000,
            "max_ms": raw["max_us"] / 1000,
        },
        "cpu": cpu_breakdown(cpu, raw["requests"], duration, target.name),
    }


async def concurrency(targets: list[Target], fake_pid: int, settings: Settings, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    generators = []
    if shutil.which("wrk"):
        generators.append("wrk")
    if settings.python_generator_for_throughput or not generators:
        generators.append("python")
    for generator in generators:
        rows: dict[str, Any] = {}
        for target in targets:
            others = [fake_pid] + ([] if target.name == "direct" else [target.pid])
            if generator == "wrk":
                script = workdir / "post.lua"
                run_wrk(target, settings.conc_warmup_seconds, settings.conc_connections, script, others)
                rows[target.name] = run_wrk(
                    target, settings.conc_seconds, settings.conc_connections, script, others
                )
            else:
                rows[target.name] = await concurrent_python(target, others, settings)
            await asyncio.sleep(0.3)
        out[generator] = rows
    out["primary"] = generators[0]
    return out


# ---------------------------------------------------------------------------- 4: concurrent paced streams

STREAM_WORDS = 12  # the fake answers "(fake model) I read 1 messages. You said: <text>": 8 + 12 words


def stream_body(number: int, chunk_delay: float) -> tuple[dict[str, Any], list[str]]:
    text = " ".join(f"s{number}w{j}" for j in range(STREAM_WORDS))
    answer = f"(fake model) I read 1 messages. You said: {text}"
    words = answer.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    body = {
        "model": "fake-model",
        "stream": True,
        "messages": [{"role": "user", "content": text}],
        "metadata": {"bench_chunk_delay": str(chunk_delay)},
    }
    return body, pieces


@dataclass
class StreamCheck:
    expected: int = 0
    received: int = 0
    lost: int = 0
    reordered: int = 0
    duplicated: int = 0
    unexpected: int = 0
    ended_with_done: bool = False


def check_stream(raw: bytes, pieces: list[str]) -> StreamCheck:
    """Frames expected: role chunk, one chunk per word, finish chunk, [DONE] (the gateway strips the usage
    chunk it asked for on its own). Each frame is mapped to its position; words are unique per stream,
    so a frame from another stream counts as unexpected."""
    position = {piece: i + 1 for i, piece in enumerate(pieces)}
    finish_at, done_at = len(pieces) + 1, len(pieces) + 2
    check = StreamCheck(expected=done_at + 1)
    seen: list[int] = []
    for frame in raw.split(b"\n\n"):
        if not frame.strip():
            continue
        if not frame.startswith(b"data: "):
            check.unexpected += 1
            continue
        data = frame[6:]
        if data == b"[DONE]":
            seen.append(done_at)
            continue
        try:
            chunk = orjson.loads(data)
            choice = chunk["choices"][0]
            delta = choice["delta"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            check.unexpected += 1  # error frames, usage-only chunks, garbage
            continue
        if choice.get("finish_reason"):
            seen.append(finish_at)
        elif "role" in delta:
            seen.append(0)
        elif delta.get("content") in position:
            seen.append(position[delta["content"]])
        else:
            check.unexpected += 1
    check.received = len(seen)
    check.lost = check.expected - len(set(seen))
    check.duplicated = len(seen) - len(set(seen))
    check.reordered = sum(1 for a, b in zip(seen, seen[1:], strict=False) if b < a)
    check.ended_with_done = bool(seen) and seen[-1] == done_at
    return check


async def concurrent_streams(target: Target, count: int, chunk_delay: float, budget: float) -> dict[str, Any]:
    live = 0
    peak = 0
    failures: dict[str, int] = {}
    checks: list[StreamCheck] = []
    ttft: list[float] = []
    durations: list[float] = []
    conns: list[Conn] = []
    connecting = asyncio.Semaphore(200)  # stay under the listen backlogs while opening thousands

    def opened() -> None:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)

    async def one(number: int) -> None:
        nonlocal live
        body, pieces = stream_body(number, chunk_delay)
        request = target.request(body)
        try:
            async with connecting:
                conn = await connect(HOST, target.port, keep_body=True)
        except OSError as exc:
            failures[f"connect: {type(exc).__name__}"] = failures.get(f"connect: {type(exc).__name__}", 0) + 1
            return
        conns.append(conn)
        conn.on_first = opened
        t0 = perf()
        try:
            done = await conn.send(request)
        except (ConnectionError, OSError) as exc:
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
            if conn.first:
                live -= 1
            return
        finally:
            conn.close()
        live -= 1
        if conn.status != 200:
            failures[f"http {conn.status}"] = failures.get(f"http {conn.status}", 0) + 1
            return
        ttft.append(conn.first - t0)
        durations.append(done - t0)
        checks.append(check_stream(b"".join(conn.body), pieces))

    started = perf()
    tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
    _, pending = await asyncio.wait(tasks, timeout=budget)
    for conn in conns:
        conn.close()
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=10)
        failures["unfinished at deadline"] = len(pending)
    wall = perf() - started
    frames_expected = count * (STREAM_WORDS + 8 + 3)
    frames_ok = sum(c.received - c.duplicated for c in checks)
    result = {
        "streams": count,
        "completed": len(checks),
        "peak_simultaneous": peak,
        "frames_expected": frames_expected,
        "frames_received": frames_ok,
        "lost_frames": frames_expected - frames_ok,  # includes every frame of failed/unfinished streams
        "reordered_frames": sum(c.reordered for c in checks),
        "duplicated_frames": sum(c.duplicated for c in checks),
        "unexpected_frames": sum(c.unexpected for c in checks),
        "streams_without_done": sum(1 for c in checks if not c.ended_with_done) + count - len(checks),
        "failures": failures,
        "ttft": summary(ttft),
        "duration": summary(durations),
        "ideal_duration_ms": ms(chunk_delay * (STREAM_WORDS + 8 + 1)),
        "wall_seconds": round(wall, 2),
    }
    result["zero_loss"] = (
        result["completed"] == count
        and result["lost_frames"] == 0
        and result["reordered_frames"] == 0
        and result["duplicated_frames"] == 0
        and result["unexpected_frames"] == 0
        and result["streams_without_done"] == 0
    )
    return result


async def streams(targets: list[Target], settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in targets:
        if target.name not in settings.stream_clients:
            continue
        levels = []
        for count in settings.stream_levels:
            levels.append(await concurrent_streams(target, count, settings.stream_chunk_delay, budget=90))
            await asyncio.sleep(1.0)
            if not levels[-1]["zero_loss"]:
                break
        held = [lv["peak_simultaneous"] for lv in levels if lv["zero_loss"]]
        out[target.name] = {"levels": levels, "max_held_zero_loss": max(held) if held else 0}
    return out


# ------------------------------------------------------------------------------------------- reporting


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for package in ("uvicorn", "uvloop", "httptools", "starlette", "httpx", "httpx-aiohttp", "aiohttp", "orjson"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    wrk = shutil.which("wrk")
    if wrk:
        head = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
        versions["wrk"] = (head.stdout or head.stderr).split("[")[0].replace("wrk", "").strip()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "packages": versions,
        "note": "the load generator, the gateway and the fake upstream share these cores",
    }


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def goals(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conc = results["concurrency"]
    primary = conc[conc["primary"]]
    for client in CLIENTS:
        seq = results["latency_1conn"][client]["added"]
        ttft = results["ttft_1conn"][client]["added"]
        rows = {
            "added_p50_ms": (seq["p50_ms"], seq["p50_ms"] <= GOALS["added_p50_ms"]),
            "added_p99_ms": (seq["p99_ms"], seq["p99_ms"] <= GOALS["added_p99_ms"]),
            "ttft_added_p99_ms": (ttft["p99_ms"], ttft["p99_ms"] <= GOALS["ttft_added_p99_ms"]),
            "rps_32": (primary[client]["rps"], primary[client]["rps"] >= GOALS["rps_32"]),
        }
        if client in results["streams"]:
            held = results["streams"][client]["max_held_zero_loss"]
            rows["streams"] = (held, held >= GOALS["streams"])
        out[client] = {k: {"measured": v, "goal": GOALS[k], "verdict": verdict(ok)} for k, (v, ok) in rows.items()}
    return out


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    seq, ttft = results["latency_1conn"], results["ttft_1conn"]
    names = ["direct", *CLIENTS]
    add("1 connection, non-stream (ms)        p50      p99   added p50  added p99  self-reported p50/p99")
    for name in names:
        row = seq[name]["total"]
        added = seq[name].get("added")
        extra = (
            f"  {added['p50_ms']:9.3f}  {added['p99_ms']:9.3f}" if added else "          -          -"
        )
        own = seq[name].get("self_reported_overhead")
        own_s = f"  {own['p50_ms']:.3f} / {own['p99_ms']:.3f}" if own else ""
        add(f"  {name:<34}{row['p50_ms']:7.3f}  {row['p99_ms']:7.3f}{extra}{own_s}")
    add("")
    add("1 connection, stream TTFT (ms)       p50      p99   added p50  added p99")
    for name in names:
        row = ttft[name]["ttft"]
        added = ttft[name].get("added")
        extra = f"  {added['p50_ms']:9.3f}  {added['p99_ms']:9.3f}" if added else "          -          -"
        add(f"  {name:<34}{row['p50_ms']:7.3f}  {row['p99_ms']:7.3f}{extra}")
    conc = results["concurrency"]
    for generator in ("wrk", "python"):
        if generator not in conc:
            continue
        add("")
        add(
            f"{results['settings']['conc_connections']} connections, {generator:<6} req/s    p50 ms   p99 ms"
            "   CPU us/req: loadgen  fake  gateway"
        )
        for name in names:
            row = conc[generator][name]
            cpu = row["cpu"]
            gw = cpu.get("gateway", {}).get("us_per_request")
            add(
                f"  {name:<26}{row['rps']:9.0f}  {row['latency']['p50_ms']:7.2f}  {row['latency']['p99_ms']:7.2f}"
                f"   {cpu['load_generator']['us_per_request']:19}  {cpu['fake_upstream']['us_per_request']:5}"
                f"  {gw if gw is not None else '-':>7}"
                + (f"  errors={row['errors']}" if row["errors"] else "")
            )
    add("")
    add("concurrent streams   streams  done  peak  lost  reord  dup  unexp  noDONE  TTFT p50/p99 ms   dur p50/p99 ms")
    for client, data in results["streams"].items():
        for lv in data["levels"]:
            add(
                f"  {client:<18}{lv['streams']:7d} {lv['completed']:5d} {lv['peak_simultaneous']:5d}"
                f" {lv['lost_frames']:5d} {lv['reordered_frames']:6d} {lv['duplicated_frames']:4d}"
                f" {lv['unexpected_frames']:6d} {lv['streams_without_done']:7d}"
                f"  {lv['ttft']['p50_ms']:7.1f} / {lv['ttft']['p99_ms']:7.1f}"
                f"  {lv['duration']['p50_ms']:6.0f} / {lv['duration']['p99_ms']:6.0f}"
                + (f"  {lv['failures']}" if lv["failures"] else "")
            )
        add(f"  {client}: max simultaneous streams held with zero loss: {data['max_held_zero_loss']}")
    add("")
    add("goals (design.md §11)")
    for client, rows in results["goals"].items():
        add(
            f"  {client:<14}"
            + "  ".join(f"{k}={v['measured']} ({v['verdict']})" for k, v in rows.items())
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- main


async def run(settings: Settings, workdir: Path, children: Children) -> dict[str, Any]:
    python = sys.executable
    fake_port = free_port()
    fake = children.start(
        "fake-upstream", fake_port, [python, str(HERE / "fake_upstream_server.py"), "--port", str(fake_port)], workdir
    )
    gateways: dict[str, Child] = {}
    for client in CLIENTS:
        config = workdir / f"gateway-{client}.yaml"
        config.write_text(json.dumps(gateway_config(fake_port, client, workdir), indent=2))  # JSON is YAML
        port = free_port()
        gateways[client] = children.start(
            f"gateway-{client}",
            port,
            [python, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
            workdir,
        )
    wait_ready(fake, "/v1/models")
    for child in gateways.values():
        wait_ready(child, "/healthz")
    targets = [Target("direct", fake_port, UPSTREAM_KEY, fake.proc.pid)] + [
        Target(client, gateways[client].port, GATEWAY_KEY, gateways[client].proc.pid) for client in CLIENTS
    ]
    results: dict[str, Any] = {"settings": settings.__dict__, "machine": machine()}
    phases = {}

    t = time.monotonic()
    print(f"[1/4] latency at 1 connection: {settings.seq_requests} requests per target, interleaved", flush=True)
    results["latency_1conn"] = await interleaved(
        targets, CHAT, settings.seq_requests, settings.seq_warmup, stream=False, budget=240
    )
    phases["latency_1conn"] = time.monotonic() - t

    t = time.monotonic()
    print(f"[2/4] stream TTFT at 1 connection: {settings.ttft_requests} streams per target", flush=True)
    results["ttft_1conn"] = await interleaved(
        targets, CHAT_STREAM, settings.ttft_requests, settings.seq_warmup // 3, stream=True, budget=240
    )
    phases["ttft_1conn"] = time.monotonic() - t

    t = time.monotonic()
    print(f"[3/4] {settings.conc_connections} connections, {settings.conc_seconds:g}s per target", flush=True)
    results["concurrency"] = await concurrency(targets, fake.proc.pid, settings, workdir)
    phases["concurrency"] = time.monotonic() - t

    t = time.monotonic()
    print(f"[4/4] concurrent paced streams: levels {settings.stream_levels}", flush=True)
    results["streams"] = await streams(targets[1:], settings)
    phases["streams"] = time.monotonic() - t

    health = {}
    for client, child in gateways.items():
        with urllib.request.urlopen(f"http://{HOST}:{child.port}/healthz", timeout=5) as response:
            health[client] = json.loads(response.read())["counters"]
    results["gateway_counters"] = health
    results["phase_seconds"] = {k: round(v, 1) for k, v in phases.items()}
    results["goals"] = goals(results)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short smoke run (under a minute)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()
    settings = Settings.make(args.quick)
    fds = raise_fd_limit()
    needed = max(settings.stream_levels) * 2 + 200
    if fds < needed:
        print(f"warning: open-file limit {fds} < {needed}; the largest stream levels may fail", file=sys.stderr)
    children = Children()
    started = time.monotonic()
    env_note = os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    del env_note
    with tempfile.TemporaryDirectory(prefix="gw-bench-") as tmp:
        try:
            results = uvloop.run(run(settings, Path(tmp), children))
        finally:
            children.stop()
        results["total_seconds"] = round(time.monotonic() - started, 1)
    print()
    print(table(results))
    print(f"\ntotal {results['total_seconds']} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
