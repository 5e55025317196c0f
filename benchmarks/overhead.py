"""Pass-through overhead of the gateway, measured side by side against the same fake upstream called directly,
against the least a proxy can do (two floors) and against a peer (LiteLLM proxy).

    python benchmarks/overhead.py              # full run, 10-15 minutes (estimated)
    python benchmarks/overhead.py --quick      # smoke run, a few minutes
    python benchmarks/overhead.py --gateway-ref HEAD   # measure a commit's gateway/ (git archive), not the
                                                       # working tree
    python benchmarks/overhead.py --quick --targets aiohttp,floor,relay   # some targets only (and direct)
    python benchmarks/overhead.py --no-litellm          # without the LiteLLM peer
    python benchmarks/overhead.py --fake starlette      # the starlette fake upstream instead of the fast one

Processes, all on 127.0.0.1:
  * the fake OpenAI-compatible upstream. By default `benchmarks/fast_fake_upstream.py`: raw asyncio (uvloop)
    + httptools, the same chat-completion JSON and SSE frames as `gateway/fakes/openai_upstream.py`'s
    FakeUpstream, built once per distinct request body; it also paces phase 4's streams
    (`metadata.bench_chunk_delay`). The starlette fake (`benchmarks/fake_upstream_server.py`, uvicorn +
    uvloop + httptools, record=False) tops out near 4,700 req/s here, which would cap the floors; `--fake
    starlette` brings it back;
  * the gateway (aiohttp, its one upstream client), started through the real CLI
    (`python -m gateway serve --config <yaml> --port <p>`), pointing at that fake, as a pure pass-through
    (`store_conversations: false`, `context.enabled: false`), and one more aiohttp gateway per other front
    door (`/v1/messages`, `/v1/responses`: the same request converted both ways), for phases 1 and 2;
  * "aiohttp defaults": one more aiohttp gateway with the tenant's defaults (storage and context on), for
    phases 1-3;
  * "stack floor", `benchmarks/floor_proxy.py`: the least a proxy on our stack can do: uvicorn (uvloop,
    httptools), a raw ASGI app, an aiohttp ClientSession upstream, no JSON parsing;
  * "bare relay", `benchmarks/bare_relay.py`: the physical floor: raw asyncio (uvloop) + httptools, one
    upstream keep-alive connection per client connection, the bytes relayed as they arrive, no ASGI;
  * "litellm 1.108.7": the LiteLLM proxy as a plain pass-through to the same fake (one model, no database,
    no callbacks, its master key = the gateway key), from a virtualenv of its own that this script creates
    once under benchmarks/results/ (git-ignored; `pip install "litellm[proxy]==1.108.7"`). If the install
    or the start fails the target is skipped, with the reason printed; `--no-litellm` skips it;
  * this process, the load generator: raw keep-alive HTTP/1.1 connections with pre-built request bytes and
    the httptools parser (`benchmarks/loadgen.py`), and `wrk` (C, epoll) for throughput when installed.

Phases:
  1. latency at 1 connection, non-stream: direct and through each target, requests interleaved
     round-robin (rotating order) so that every target sees the same machine state;
  2. time to first token (first SSE body bytes) of streams at 1 connection, interleaved the same way;
  3. 32 keep-alive connections: req/s and latency, in short slices rotated across targets (background
     load on a shared machine then hits all targets alike), with the CPU each process used per request;
  4. simultaneous paced streams through each pass-through gateway (20 SSE chunks + [DONE],
     `--chunk-delay` apart): every frame of every stream is checked for loss, duplication, order and
     cross-talk.
Every phase reports the CPU each target process used per request (for "direct": the fake's). The CPU
used by processes that are not part of the benchmark is measured in every phase and reported: on a
shared 2-core machine it is the main source of noise. The closing table has one row per target (added
latency, added TTFT, req/s at 32 connections, CPU per request) and the ratios of the aiohttp pass-through
to the stack floor, issue 16's goals: within 1.5x of the floor's added p50 and p99, and at least the
floor's req/s / 1.5. Results: the tables on stdout and benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import Conn, build_request, connect, pct, perf

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "overhead.json"
HOST = "127.0.0.1"
GATEWAY_KEY = "sk-bench-gateway"
UPSTREAM_KEY = "sk-bench-upstream"
CLIENTS = ("aiohttp",)  # httpx and httpx-aiohttp were measured, lost on every figure and were removed
DEFAULT_CLIENT = "aiohttp"  # the gateway's one upstream client
CLK_TCK = os.sysconf("SC_CLK_TCK")

DEFAULTS = "aiohttp defaults"  # an aiohttp gateway with the tenant's defaults: storage and context on
STACK_FLOOR = "stack floor"  # benchmarks/floor_proxy.py
BARE_RELAY = "bare relay"  # benchmarks/bare_relay.py
LITELLM_VERSION = "1.108.7"
LITELLM = f"litellm {LITELLM_VERSION}"
LITELLM_VENV = HERE / "results" / f"litellm-{LITELLM_VERSION}-venv"  # git-ignored (benchmarks/results/)
LITELLM_INSTALL_LOG = HERE / "results" / f"litellm-{LITELLM_VERSION}-install.log"
# --targets: short names of the targets besides "direct" (always measured: every row is relative to it)
TARGET_KEYS = {
    "aiohttp": "aiohttp",
    "defaults": DEFAULTS,
    "floor": STACK_FLOOR,
    "relay": BARE_RELAY,
    "litellm": LITELLM,
    "messages": "aiohttp /v1/messages",
    "responses": "aiohttp /v1/responses",
}

GOALS = {  # design.md §11
    "added_p50_ms": 0.5,
    "added_p99_ms": 2.0,
    "ttft_added_p99_ms": 2.0,
    "rps_32": 2000.0,
    "streams_zero_loss": 1000,
    "door_ratio": 1.2,  # issue 13: a front door's added latency / the chat path's, same gateway, same run
    # issue 16: the aiohttp pass-through's added p50 and p99 / the stack floor's, and the floor's req/s at
    # 32 connections / the pass-through's
    "floor_ratio": 1.5,
}


@dataclass(frozen=True)
class Settings:
    quick: bool
    seq_requests: int
    seq_warmup: int
    ttft_requests: int
    connections: int
    rounds: int
    slice_seconds: float
    generators: tuple[str, ...]
    stream_levels: tuple[int, ...]
    chunk_delay: float
    stream_clients: tuple[str, ...]
    settle_seconds: float
    phase_seconds: float

    @staticmethod
    def make(args: argparse.Namespace) -> Settings:
        wrk = ("wrk",) if shutil.which("wrk") else ()
        if args.quick:
            return Settings(
                quick=True,
                seq_requests=500,
                seq_warmup=100,
                ttft_requests=300,
                connections=32,
                rounds=1,
                slice_seconds=2.0,
                generators=wrk or ("python",),
                stream_levels=(1000,),
                chunk_delay=args.chunk_delay or 0.5,
                stream_clients=(DEFAULT_CLIENT,),
                settle_seconds=1.0,
                phase_seconds=15.0,  # phases 1 and 2, after warm-up: ~300 rounds with LiteLLM's ~20 ms in each
            )
        return Settings(
            quick=False,
            seq_requests=3000,
            seq_warmup=300,
            ttft_requests=2000,
            connections=32,
            rounds=4,
            slice_seconds=2.5,
            generators=(*wrk, "python"),
            stream_levels=(1000, 1500),
            chunk_delay=args.chunk_delay or 0.5,
            stream_clients=CLIENTS,
            settle_seconds=15.0,
            phase_seconds=60.0,
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
    """user + system CPU time of a live process, from /proc/<pid>/stat (in clock ticks: 10 ms)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


HAS_SCHEDSTAT = Path("/proc/self/schedstat").exists()


def precise_cpu_seconds(pid: int) -> float:
    """CPU time of a live process to the nanosecond: the sum over its threads of /proc/<pid>/task/<tid>/
    schedstat's time on CPU (clock ticks would be too coarse for the few thousand requests of a phase at 1
    connection: 100 us a request, 10 ms a tick). A thread that exits takes its time with it: the processes
    measured keep their worker threads. Falls back to /proc/<pid>/stat without schedstat."""
    if not HAS_SCHEDSTAT:
        return cpu_seconds(pid)
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just exited
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


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

    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def start(
        self, name: str, port: int, argv: list[str], workdir: Path, env: dict[str, str] | None = None
    ) -> Child:
        log = workdir / f"{re.sub(r'[^A-Za-z0-9.-]+', '-', name)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                env=self.env if env is None else env,
            )
        child = Child(name, port, proc, log)
        self.items.append(child)
        return child

    def stop_one(self, child: Child) -> None:
        if child.alive():
            child.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=10)
        if child.alive():
            child.proc.kill()
            child.proc.wait(timeout=5)

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
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{child.name} not ready on {url} after {timeout:.0f}s")


def post_ok(port: int, key: str, body: dict[str, Any]) -> str | None:
    """One chat completion through a freshly started target: None when it answers 200, else why not."""
    request = urllib.request.Request(
        f"http://{HOST}:{port}/v1/chat/completions",
        data=orjson.dumps(body),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return None if response.status == 200 else f"HTTP {response.status}"
    except OSError as exc:  # urllib's HTTPError is an OSError
        return f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------- the LiteLLM peer

LITELLM_CONFIG = """# LiteLLM proxy as a plain pass-through to the benchmark's fake upstream: one model, no database
# (no DATABASE_URL), no callbacks, its master key = the benchmark's gateway key
model_list:
  - model_name: fake-model
    litellm_params:
      model: openai/fake-model
      api_base: http://{host}:{port}/v1
      api_key: {upstream_key}
general_settings:
  master_key: {master_key}
"""


def litellm_env() -> dict[str, str]:
    """The environment of LiteLLM's own virtualenv: nothing of ours on its path, no database."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "DATABASE_URL", "LITELLM_MASTER_KEY")
    }
    env["PATH"] = os.pathsep.join([str(LITELLM_VENV / "bin"), env.get("PATH", "/usr/bin:/bin")])
    return env


def litellm_executable() -> tuple[Path | None, str]:
    """The `litellm` CLI of benchmarks/results/litellm-<version>-venv, created (once) when missing:
    (path, how it was found), or (None, why it cannot be had)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    venv_python = LITELLM_VENV / "bin" / "python"
    probe = [str(venv_python), "-c", "from importlib.metadata import version; print(version('litellm'))"]

    def installed() -> bool:
        if not exe.exists() or not venv_python.exists():
            return False
        done = subprocess.run(
            probe, capture_output=True, text=True, timeout=120, check=False, env=litellm_env()
        )
        return done.returncode == 0 and done.stdout.strip() == LITELLM_VERSION

    if installed():
        return exe, f"cached in {LITELLM_VENV.relative_to(HERE.parent)}"
    ignored = subprocess.run(
        ["git", "-C", str(HERE.parent), "check-ignore", "-q", str(LITELLM_VENV)],
        capture_output=True,
        check=False,
    )
    if ignored.returncode != 0:
        return None, f"{LITELLM_VENV} is not git-ignored: not creating a virtualenv there"
    print(
        f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV.relative_to(HERE.parent)}"
        f" (once; log: {LITELLM_INSTALL_LOG.relative_to(HERE.parent)}) ...",
        flush=True,
    )
    shutil.rmtree(LITELLM_VENV, ignore_errors=True)
    LITELLM_VENV.parent.mkdir(parents=True, exist_ok=True)
    steps = (
        [sys.executable, "-m", "venv", str(LITELLM_VENV)],
        [str(venv_python), "-m", "pip", "install", f"litellm[proxy]=={LITELLM_VERSION}"],
    )
    with LITELLM_INSTALL_LOG.open("wb") as log:
        for argv in steps:
            try:
                done = subprocess.run(
                    argv, stdout=log, stderr=subprocess.STDOUT, timeout=1800, check=False, env=litellm_env()
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"`{' '.join(argv[-3:])}` failed: {exc}"
            if done.returncode != 0:
                log.flush()
                tail = LITELLM_INSTALL_LOG.read_text(errors="replace").strip().splitlines()[-3:]
                return None, f"`{' '.join(argv[-3:])}` exited {done.returncode}: {' | '.join(tail)}"
    if not installed():
        return None, f"installed, but {venv_python} does not report litellm {LITELLM_VERSION}"
    return exe, "installed"


def start_litellm(children: Children, exe: Path, fake_port: int, workdir: Path) -> Child:
    config = workdir / "litellm.yaml"
    config.write_text(
        LITELLM_CONFIG.format(host=HOST, port=fake_port, upstream_key=UPSTREAM_KEY, master_key=GATEWAY_KEY)
    )
    env = litellm_env()
    # the model cost map from the package, not fetched; WARNING as the gateways' log_level (uvicorn's access
    # log, one line per request, is off at that level)
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "WARNING"}
    port = free_port()
    argv = [
        str(exe),
        "--config",
        str(config),
        "--host",
        HOST,
        "--port",
        str(port),
        "--keepalive_timeout",
        "75",
    ]
    return children.start(LITELLM, port, argv, workdir, env=env)


def gateway_config(
    upstream_port: int, client: str, workdir: Path, under_test: dict[str, Any], label: str | None = None
) -> dict[str, Any]:
    label = label or client
    tenant: dict[str, Any] = {
        "name": "bench",
        "api_keys": [GATEWAY_KEY],
        "upstream": {
            "base_url": f"http://{HOST}:{upstream_port}/v1",
            "api_key": UPSTREAM_KEY,
        },
    }
    if under_test.get("max_connections"):
        tenant["upstream"]["max_connections"] = under_test["max_connections"]
    if under_test.get("has_store_switch") and not under_test.get("with_store"):
        tenant["store_conversations"] = False  # pass-through: a pure proxy, nothing stored
    if under_test.get("has_context_config"):
        tenant["context"] = {"enabled": False}  # pass-through: never rewrite the prompt
    return {
        "server": {"host": HOST, "log_level": "warning"},
        "storage": {
            "database_url": f"sqlite:///{workdir}/{label}.db",
            "data_dir": str(workdir / f"data-{label}"),
        },
        "tenants": [tenant],
    }


PROBE = """
import importlib.util, json
from gateway.config import TenantConfig
print(json.dumps({
    "has_context_config": "context" in TenantConfig.model_fields,
    "has_store_switch": "store_conversations" in TenantConfig.model_fields,
    "store_in_request_path": importlib.util.find_spec("gateway.pipeline.ingest") is not None,
}))
"""


def gateway_under_test(
    ref: str | None, workdir: Path, env: dict[str, str], with_store: bool
) -> dict[str, Any]:
    """Which gateway code runs: the working tree (the editable install), or `git archive <ref> gateway`
    unpacked into workdir and put first on the children's PYTHONPATH."""
    repo = HERE.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    info: dict[str, Any] = {}
    if ref is None:
        info["source"] = "working tree"
        info["commit"] = git("rev-parse", "--short", "HEAD")
        info["uncommitted_gateway_files"] = len(git("status", "--porcelain", "--", "gateway").splitlines())
    else:
        src = workdir / "src"
        src.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", ref, "gateway"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
        info["source"] = f"git archive {ref}"
        info["commit"] = git("rev-parse", "--short", ref)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=workdir,
        env=env,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        raise RuntimeError(f"the gateway under test does not import:\n{probe.stderr[-3000:]}")
    info.update(json.loads(probe.stdout.strip().splitlines()[-1]))
    info["with_store"] = with_store
    if info["has_store_switch"]:
        info["store_in_request_path"] = with_store
    info["context_rewrite"] = (
        "off (context.enabled: false)" if info["has_context_config"] else "none in this version"
    )
    return info


# ------------------------------------------------------------------------------------------ CPU meter


def _proc_stat() -> tuple[float, float]:
    """Machine-wide busy and steal CPU seconds since boot (all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


@dataclass
class CpuSample:
    wall: float
    busy: float
    steal: float
    mine: float  # this process and its reaped children (wrk)
    pids: dict[str, float]  # per thread, to the nanosecond (precise_cpu_seconds)
    ticks: dict[str, float] = field(default_factory=dict)  # per process, dead threads included (cpu_seconds)


class CpuMeter:
    """CPU seconds of each benchmark process, and of everything else on the machine (`others`)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.last: dict[str, tuple[float, float]] = dict.fromkeys(pids, (0.0, 0.0))

    def cpu(self, name: str) -> tuple[float, float]:
        with contextlib.suppress(OSError, ValueError, IndexError):  # a process that died keeps its last value
            pid = self.pids[name]
            self.last[name] = (precise_cpu_seconds(pid), cpu_seconds(pid))
        return self.last[name]

    def sample(self) -> CpuSample:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy, steal = _proc_stat()
        cpu = {name: self.cpu(name) for name in self.pids}
        return CpuSample(
            wall=perf(),
            busy=busy,
            steal=steal,
            mine=me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
            pids={name: v[0] for name, v in cpu.items()},
            ticks={name: v[1] for name, v in cpu.items()},
        )

    @staticmethod
    def process_used(a: CpuSample, b: CpuSample, name: str) -> float:
        """The per-thread count, unless threads that exited in between took more than two clock ticks
        with them: then the process-wide count."""
        precise = b.pids[name] - a.pids[name]
        ticks = b.ticks.get(name, 0.0) - a.ticks.get(name, 0.0)
        return ticks if ticks - precise > 2 / CLK_TCK else precise

    @staticmethod
    def used(a: CpuSample, b: CpuSample) -> dict[str, float]:
        """CPU seconds per process between two samples; `others` = machine busy minus ours."""
        out = {"load_generator": b.mine - a.mine}
        out.update({name: CpuMeter.process_used(a, b, name) for name in a.pids})
        out["others"] = max(0.0, (b.busy - a.busy) - sum(out.values()))
        out["steal"] = b.steal - a.steal
        out["wall"] = b.wall - a.wall
        return out


def cores(used: dict[str, float]) -> dict[str, float]:
    wall = used["wall"] or 1.0
    return {k: round(v / wall, 2) for k, v in used.items() if k != "wall"}


SETTLE_LOG: list[dict[str, Any]] = []


async def settle(meter: CpuMeter, label: str, max_wait: float, threshold: float = 0.35) -> None:
    """Wait (bounded) until the whole machine is nearly idle: our own processes finishing deferred work
    (a gateway persisting in the background) and other users' jobs would otherwise skew the next phase."""
    waited = 0.0
    busy = 0.0
    while True:
        before = meter.sample()
        await asyncio.sleep(0.5)
        used = meter.used(before, meter.sample())
        busy = sum(v for k, v in used.items() if k not in ("wall", "steal")) / used["wall"]
        waited += used["wall"]
        if busy <= threshold or waited >= max_wait:
            break
    SETTLE_LOG.append({"before": label, "waited_s": round(waited, 1), "busy_cores": round(busy, 2)})


# ------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Target:
    name: str  # "direct", the gateway ("aiohttp"), or a front door of the aiohttp gateway
    port: int
    key: str
    # "messages" / "responses": the same request as an Anthropic Messages call to /v1/messages, or as an
    # OpenAI Responses call to /v1/responses (store: false, as a stateless client sends it)
    door: str = "chat"

    def request(self, body: dict[str, Any]) -> bytes:
        if self.door == "messages":
            anthropic = {"model": body["model"], "max_tokens": 256, "messages": body["messages"]}
            if body.get("stream"):
                anthropic["stream"] = True
            headers = {"x-api-key": self.key, "anthropic-version": "2023-06-01"}
            return build_request(HOST, self.port, "/v1/messages", orjson.dumps(anthropic), headers)
        if self.door == "responses":
            responses = {"model": body["model"], "input": body["messages"], "store": False}
            if body.get("stream"):
                responses["stream"] = True
            auth = {"Authorization": f"Bearer {self.key}"}
            return build_request(HOST, self.port, "/v1/responses", orjson.dumps(responses), auth)
        payload = orjson.dumps(body)
        return build_request(
            HOST, self.port, "/v1/chat/completions", payload, {"Authorization": f"Bearer {self.key}"}
        )


# The other front doors, each on a gateway configured as the default (aiohttp) one, beside its
# chat-completions row.
DOORS = {"aiohttp /v1/messages": "messages", "aiohttp /v1/responses": "responses"}


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
    targets: list[Target],
    meter: CpuMeter,
    body: dict[str, Any],
    count: int,
    warmup: int,
    *,
    stream: bool,
    budget: float,
) -> dict[str, Any]:
    conns = [await connect(HOST, t.port, header=b"x-gateway-overhead-ms") for t in targets]
    requests = [t.request(body) for t in targets]
    total: dict[str, list[float]] = {t.name: [] for t in targets}
    first: dict[str, list[float]] = {t.name: [] for t in targets}
    self_reported: dict[str, list[float]] = {t.name: [] for t in targets}
    errors = dict.fromkeys(total, 0)
    guard = asyncio.ensure_future(watchdog(conns, 2 * budget + 60))
    before: CpuSample | None = None
    # a slow target gets fewer samples (every target the same number) rather than a longer run; the time
    # counts from the end of the warm-up, which a slow target (LiteLLM: ~20 ms a request) makes long too
    stop_at = float("inf")
    try:
        for i in range(warmup + count):
            if i == warmup:
                before = meter.sample()
                stop_at = perf() + budget
            elif i > warmup and perf() > stop_at:
                break
            # rotate the order so that no target always goes first (or right after another one)
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
    assert before is not None
    used = meter.used(before, meter.sample())
    out: dict[str, Any] = {
        "seconds": round(used["wall"], 1),
        "cpu_cores": cores(used),
        "time_limit_s": budget,
    }
    for target in targets:
        row: dict[str, Any] = {"total": summary(total[target.name]), "errors": errors[target.name]}
        if stream:
            row["ttft"] = summary(first[target.name])
        if self_reported[target.name]:
            row["self_reported_overhead"] = summary(self_reported[target.name])
        if target.name in used and total[target.name]:
            row["gateway_cpu_us_per_request"] = round(used[target.name] / len(total[target.name]) * 1e6)
        out[target.name] = row
    # CPU per request of each target's own process; for "direct", the fake's, over every request it served
    # in the phase (each target's request reaches it once)
    served = sum(len(total[t.name]) for t in targets)
    for target in targets:
        process, requests = (
            ("fake-upstream", served) if target.name == "direct" else (target.name, len(total[target.name]))
        )
        if process in used and requests:
            out[target.name]["cpu_us_per_request"] = round(used[process] / requests * 1e6)
    key = "ttft" if stream else "total"
    direct = out["direct"][key]
    for target in targets[1:]:
        mine = out[target.name][key]
        out[target.name]["added"] = {
            "p50_ms": round(mine["p50_ms"] - direct["p50_ms"], 3),
            "p99_ms": round(mine["p99_ms"] - direct["p99_ms"], 3),
        }
    return out


# -------------------------------------------------------------------------------- 3: 32 connections


async def python_slice(target: Target, connections: int, seconds: float, warmup: float) -> dict[str, Any]:
    """Closed loop on `connections` keep-alive connections; latencies of requests started after warm-up."""
    conns = [await connect(HOST, target.port) for _ in range(connections)]
    request = target.request(CHAT)
    warm_end = perf() + warmup
    end = warm_end + seconds
    latencies: list[float] = []
    errors = 0

    async def worker(conn: Conn) -> None:
        nonlocal errors
        while (t0 := perf()) < end:
            done = await conn.send(request)
            if conn.status != 200:
                errors += 1
            elif t0 >= warm_end:
                latencies.append(done - t0)

    guard = asyncio.ensure_future(watchdog(conns, warmup + seconds + 30))
    try:
        await asyncio.sleep(0)
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        guard.cancel()
        for conn in conns:
            conn.close()
    return {"latencies": latencies, "errors": errors, "seconds": perf() - warm_end}


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


def wrk_slice(target: Target, connections: int, seconds: float, workdir: Path) -> dict[str, Any]:
    script = workdir / f"post-{target.port}.lua"
    script.write_text(WRK_LUA.format(body=orjson.dumps(CHAT).decode(), key=target.key))
    url = f"http://{HOST}:{target.port}/v1/chat/completions"
    duration = max(1, round(seconds))
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--timeout", "10s", "-s", str(script), url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60, check=False)
    match = re.search(r"WRKJSON (\{.*\})", done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    raw: dict[str, Any] = json.loads(match.group(1))
    raw["errors"] = sum(raw[k] for k in ("connect", "read", "write", "status", "timeout"))
    raw["seconds"] = raw["duration_us"] / 1e6
    return raw


async def concurrency(
    targets: list[Target], meter: CpuMeter, settings: Settings, workdir: Path
) -> dict[str, Any]:
    out: dict[str, Any] = {"primary": settings.generators[0]}
    n = settings.connections
    for generator in settings.generators:
        slices: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
        used_by: dict[str, list[dict[str, float]]] = {t.name: [] for t in targets}
        for t in targets:  # warm-up: fill the gateways' upstream pools, JIT-free but cache-warm
            if generator == "wrk":
                wrk_slice(t, n, 1, workdir)
            else:
                await python_slice(t, n, 0.5, 0.2)
        for round_number in range(settings.rounds):
            shift = round_number % len(targets)
            for t in targets[shift:] + targets[:shift]:
                await settle(meter, f"{generator} round {round_number} {t.name}", settings.settle_seconds / 3)
                before = meter.sample()
                if generator == "wrk":
                    result = wrk_slice(t, n, settings.slice_seconds, workdir)
                else:
                    result = await python_slice(t, n, settings.slice_seconds, 0.3)
                used_by[t.name].append(meter.used(before, meter.sample()))
                slices[t.name].append(result)
        rows: dict[str, Any] = {}
        for t in targets:
            parts = slices[t.name]
            seconds = sum(p["seconds"] for p in parts)
            if generator == "wrk":
                requests = sum(p["requests"] for p in parts)
                latency = {
                    "p50_ms": statistics.median(p["p50_us"] for p in parts) / 1000,
                    "p90_ms": statistics.median(p["p90_us"] for p in parts) / 1000,
                    "p99_ms": statistics.median(p["p99_us"] for p in parts) / 1000,
                    "max_ms": max(p["max_us"] for p in parts) / 1000,
                    "note": "median over slices of wrk's per-slice percentiles",
                }
            else:
                everything = [x for p in parts for x in p["latencies"]]
                requests = len(everything)
                latency = summary(everything)
            per_slice = [
                round((p["requests"] if generator == "wrk" else len(p["latencies"])) / p["seconds"])
                for p in parts
            ]
            used = {k: sum(u[k] for u in used_by[t.name]) for k in used_by[t.name][0]}
            cpu_us = {
                k: round(v / requests * 1e6, 1)
                for k, v in used.items()
                if k in ("load_generator", "fake-upstream", t.name) and requests
            }
            rows[t.name] = {
                "rps": round(requests / seconds, 1),
                "rps_per_slice": per_slice,
                "requests": requests,
                "errors": sum(p["errors"] for p in parts),
                "latency": latency,
                "cpu_us_per_request": cpu_us,
                "cpu_cores": cores(used),
            }
        out[generator] = rows
    return out


# ---------------------------------------------------------------------------- 4: concurrent paced streams

STREAM_WORDS = 10  # the fake answers "(fake model) I read 1 messages. You said: <text>": 8 + 10 words
FRAMES_PER_STREAM = 1 + 8 + STREAM_WORDS + 1 + 1  # role, words, finish, [DONE] = 20 chunks + [DONE]


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
    """Expected: role chunk, one chunk per word, finish chunk, [DONE] (the gateway strips the usage chunk
    it asked for on its own). Each frame is mapped to its position; the words are unique to each stream,
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
            choice = orjson.loads(data)["choices"][0]
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
    check.reordered = sum(1 for a, b in itertools.pairwise(seen) if b < a)
    check.ended_with_done = bool(seen) and seen[-1] == done_at
    return check


async def concurrent_streams(
    target: Target, meter: CpuMeter, count: int, chunk_delay: float, budget: float
) -> dict[str, Any]:
    live = 0
    peak = 0
    failures: dict[str, int] = {}
    checks: list[StreamCheck] = []
    ttft: list[float] = []
    durations: list[float] = []
    conns: list[Conn] = []
    connecting = asyncio.Semaphore(200)  # stay well under the listen backlogs while opening thousands

    def fail(reason: str) -> None:
        failures[reason] = failures.get(reason, 0) + 1

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
            fail(f"connect: {type(exc).__name__}")
            return
        conns.append(conn)
        conn.on_first = opened
        t0 = perf()
        try:
            done = await conn.send(request)
        except (ConnectionError, OSError) as exc:
            fail(type(exc).__name__)
            return
        finally:
            conn.close()
            if conn.first:
                live -= 1
        if conn.status != 200:
            fail(f"http {conn.status}")
            return
        ttft.append(conn.first - t0)
        durations.append(done - t0)
        checks.append(check_stream(b"".join(conn.body), pieces))

    before = meter.sample()
    tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
    _, pending = await asyncio.wait(tasks, timeout=budget)
    for conn in conns:
        conn.close()
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=10)
        failures["unfinished at deadline"] = len(pending)
    used = meter.used(before, meter.sample())
    frames_expected = count * FRAMES_PER_STREAM
    frames_ok = sum(c.received - c.duplicated for c in checks)
    result: dict[str, Any] = {
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
        "ideal_duration_ms": ms(chunk_delay * (FRAMES_PER_STREAM - 2)),
        "wall_seconds": round(used["wall"], 2),
        "cpu_cores": cores(used),
    }
    if target.name in used and frames_ok:
        # the gateway's CPU per relayed frame, request set-up included (upstream sends one more frame)
        result["gateway_cpu_us_per_frame"] = round(used[target.name] / frames_ok * 1e6, 1)
    result["zero_loss"] = (
        result["completed"] == count
        and result["lost_frames"] == 0
        and result["reordered_frames"] == 0
        and result["duplicated_frames"] == 0
        and result["unexpected_frames"] == 0
        and result["streams_without_done"] == 0
    )
    return result


async def streams(targets: list[Target], meter: CpuMeter, settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in targets:
        if target.name not in settings.stream_clients:
            continue
        levels: list[dict[str, Any]] = []
        for count in settings.stream_levels:
            await settle(meter, f"streams {target.name} {count}", settings.settle_seconds)
            print(f"      {target.name}: {count} streams", flush=True)
            budget = 60 + 3 * settings.chunk_delay * FRAMES_PER_STREAM * max(1, count // 1000)
            level = await concurrent_streams(target, meter, count, settings.chunk_delay, budget)
            levels.append(level)
            if not level["zero_loss"] or level["peak_simultaneous"] < 0.95 * count:
                break  # lost frames, or the gateway no longer holds them all at once: stop escalating
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
    for package in (
        "uvicorn",
        "uvloop",
        "httptools",
        "starlette",
        "httpx",
        "aiohttp",
        "orjson",
    ):
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
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
        "note": "the load generator, the gateway and the fake upstream share these cores",
    }


def combined(results: dict[str, Any]) -> dict[str, Any]:
    """One row per target: what phases 1-3 measured of it, with the CPU its own process used per request
    (for "direct": the fake's)."""
    seq, ttft, conc = results["latency_1conn"], results["ttft_1conn"], results["concurrency"]
    primary = conc[conc["primary"]]
    rows: dict[str, Any] = {}
    for name in results["targets"] + results.get("door_targets", []):
        lat, first, at32 = seq[name], ttft[name], primary.get(name)
        added, ttft_added = lat.get("added", {}), first.get("added", {})
        process = "fake-upstream" if name == "direct" else name
        rows[name] = {
            "p50_ms": lat["total"]["p50_ms"],
            "added_p50_ms": added.get("p50_ms"),
            "added_p99_ms": added.get("p99_ms"),
            "ttft_p50_ms": first["ttft"]["p50_ms"],
            "ttft_added_p50_ms": ttft_added.get("p50_ms"),
            "ttft_added_p99_ms": ttft_added.get("p99_ms"),
            "rps_32": at32["rps"] if at32 else None,
            "cpu_us_per_request_1conn": lat.get("cpu_us_per_request"),
            "cpu_us_per_request_32": at32["cpu_us_per_request"].get(process) if at32 else None,
            "errors": lat["errors"] + first["errors"] + (at32["errors"] if at32 else 0),
        }
    return {"generator": conc["primary"], "connections": results["settings"]["connections"], "rows": rows}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b is not None and b > 0 else None


def floor_ratios(rows: dict[str, Any], gateway: str = DEFAULT_CLIENT) -> dict[str, Any]:
    """The pass-through gateway against each floor: added latency gateway / floor, req/s floor / gateway
    (so that every ratio is "how many times worse"; None where the floor's figure is not positive)."""
    out: dict[str, Any] = {}
    if gateway not in rows:
        return out
    mine = rows[gateway]
    for floor in (STACK_FLOOR, BARE_RELAY):
        if floor not in rows:
            continue
        theirs = rows[floor]
        out[floor] = {
            "gateway": gateway,
            "added_p50": _ratio(mine["added_p50_ms"], theirs["added_p50_ms"]),
            "added_p99": _ratio(mine["added_p99_ms"], theirs["added_p99_ms"]),
            "rps_32_floor_over_gateway": _ratio(theirs["rps_32"], mine["rps_32"]),
        }
    return out


def goals(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conc = results["concurrency"]
    primary = conc[conc["primary"]]
    names = [c for c in CLIENTS if c in results["latency_1conn"]]
    for client in names:
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
            rows["streams_zero_loss"] = (held, held >= GOALS["streams_zero_loss"])
        out[client] = {
            k: {"measured": v, "goal": GOALS[k], "verdict": "met" if ok else "MISSED"}
            for k, (v, ok) in rows.items()
        }
    # A converting front door may add at most 20 % to what the chat-completions path adds (issue 13).
    for door in results.get("door_targets", []) if "aiohttp" in results["latency_1conn"] else []:
        rows = {}
        for phase, key in (("latency_1conn", "added_p50_ms"), ("ttft_1conn", "ttft_added_p50_ms")):
            chat = results[phase]["aiohttp"]["added"]["p50_ms"]
            mine = results[phase][door]["added"]["p50_ms"]
            ratio = round(mine / chat, 3) if chat > 0 else float("inf")
            rows[f"{key}_vs_chat"] = {
                "measured": ratio,
                "goal": GOALS["door_ratio"],
                "verdict": "met" if ratio <= GOALS["door_ratio"] else "MISSED",
            }
        out[door] = rows
    # The pass-through within 1.5x of the stack floor: added p50 and p99, and req/s >= floor / 1.5 (issue 16).
    ratios = results.get("floor_ratios", {}).get(STACK_FLOOR)
    if ratios:
        limit = GOALS["floor_ratio"]
        out[f"{ratios['gateway']} / {STACK_FLOOR}"] = {
            key: {
                "measured": value,
                "goal": limit,
                "verdict": "n/a (floor figure not positive)"
                if value is None
                else ("met" if value <= limit else "MISSED"),
            }
            for key, value in ratios.items()
            if key != "gateway"
        }
    return out


def _dash(value: object, width: int, spec: str = "") -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def combined_table(results: dict[str, Any]) -> list[str]:
    data = results["combined"]
    lines = [
        "",
        f"all targets, ms ({data['connections']} connections: {data['generator']})"
        f"{'':<4}added p50  added p99  TTFT+ p50  TTFT+ p99    req/s  CPU us/req 1 conn / {data['connections']} conn",
    ]
    for name, row in data["rows"].items():
        label = "direct (the fake itself)" if name == "direct" else name
        lines.append(
            f"  {label:<34}{_dash(row['added_p50_ms'], 9, '.3f')}  {_dash(row['added_p99_ms'], 9, '.3f')}"
            f"  {_dash(row['ttft_added_p50_ms'], 9, '.3f')}  {_dash(row['ttft_added_p99_ms'], 9, '.3f')}"
            f"  {_dash(row['rps_32'], 7, '.0f')}  {_dash(row['cpu_us_per_request_1conn'], 17)}"
            f" / {_dash(row['cpu_us_per_request_32'], 7, '.0f')}"
            + (f"  errors={row['errors']}" if row["errors"] else "")
        )
    direct = data["rows"].get("direct")
    if direct:
        lines.append(f"  (direct: p50 {direct['p50_ms']:.3f} ms, TTFT p50 {direct['ttft_p50_ms']:.3f} ms)")
    for floor, ratios in results.get("floor_ratios", {}).items():
        lines.append(
            f"  {ratios['gateway']} pass-through / {floor}: added p50 {_dash(ratios['added_p50'], 0)}x,"
            f" added p99 {_dash(ratios['added_p99'], 0)}x, req/s {floor} / gateway"
            f" {_dash(ratios['rps_32_floor_over_gateway'], 0)}x"
            + (f" (goal <= {GOALS['floor_ratio']} each)" if floor == STACK_FLOOR else "")
        )
    return lines


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    add(f"gateway under test: {results['gateway_under_test']}")
    add(
        f"machine: {results['machine']['nproc']} cores, {results['machine']['cpu']}, Python {results['machine']['python']}"
    )
    if "fake_upstream" in results:
        add(f"fake upstream: {results['fake_upstream']}")
    for name, reason in results.get("skipped_targets", {}).items():
        add(f"skipped: {name}: {reason}")
    add("")
    if "latency_1conn" in results:  # not in a --streams-only run
        seq, ttft = results["latency_1conn"], results["ttft_1conn"]
        names = results["targets"]
        doors = results.get("door_targets", [])
        add(
            "1 connection, non-stream, ms      p50      p99  added p50  added p99     CPU us/req  self-reported p50/p99"
        )
        for name in names + doors:
            row, added = seq[name], seq[name].get("added", {})
            own = row.get("self_reported_overhead")
            add(
                f"  {name:<28}{row['total']['p50_ms']:7.3f}  {row['total']['p99_ms']:7.3f}"
                f"  {_dash(added.get('p50_ms'), 9, '.3f')}  {_dash(added.get('p99_ms'), 9, '.3f')}"
                f"  {_dash(row.get('cpu_us_per_request', row.get('gateway_cpu_us_per_request')), 13)}"
                + (f"  {own['p50_ms']:.3f} / {own['p99_ms']:.3f}" if own else "")
            )
        add(f"  CPU cores used during the phase: {seq['cpu_cores']}")
        add(
            "  (CPU us/req: the target's own process; for direct, the fake's, over all the requests it served)"
        )
        add("")
        add("1 connection, stream TTFT, ms     p50      p99  added p50  added p99")
        for name in names + doors:
            row, added = ttft[name], ttft[name].get("added", {})
            add(
                f"  {name:<28}{row['ttft']['p50_ms']:7.3f}  {row['ttft']['p99_ms']:7.3f}"
                f"  {_dash(added.get('p50_ms'), 9, '.3f')}  {_dash(added.get('p99_ms'), 9, '.3f')}"
            )
        add(f"  CPU cores used during the phase: {ttft['cpu_cores']}")
        conc = results["concurrency"]
        n = results["settings"]["connections"]
        for generator in ("wrk", "python"):
            if generator not in conc:
                continue
            add("")
            add(
                f"{n} connections ({generator}){'':<10}req/s   p50 ms   p99 ms  CPU us/req: loadgen  fake   target"
                "   others (cores)   req/s per slice"
            )
            for name in names:
                row = conc[generator][name]
                cpu = row["cpu_us_per_request"]
                add(
                    f"  {name:<26}{row['rps']:8.0f}  {row['latency']['p50_ms']:7.2f}  {row['latency']['p99_ms']:7.2f}"
                    f"  {cpu.get('load_generator', 0):18.0f}  {cpu.get('fake-upstream', 0):4.0f}"
                    f"  {_dash(cpu.get(name), 7, '.0f')}   {row['cpu_cores']['others']:14.2f}"
                    f"   {row['rps_per_slice']}" + (f"  errors={row['errors']}" if row["errors"] else "")
                )
    if "combined" in results:
        lines += combined_table(results)
    add("")
    add(
        "paced streams          streams  done  peak  lost reord dup unexp noDONE"
        "  TTFT p50/p99 ms   duration p50/p99 ms  gw us/frame  others"
    )
    for client, data in results["streams"].items():
        for lv in data["levels"]:
            add(
                f"  {client:<20}{lv['streams']:7d} {lv['completed']:5d} {lv['peak_simultaneous']:5d}"
                f" {lv['lost_frames']:5d} {lv['reordered_frames']:5d} {lv['duplicated_frames']:3d}"
                f" {lv['unexpected_frames']:5d} {lv['streams_without_done']:6d}"
                f"  {lv['ttft']['p50_ms']:7.0f} / {lv['ttft']['p99_ms']:6.0f}"
                f"   {lv['duration']['p50_ms']:7.0f} / {lv['duration']['p99_ms']:6.0f}"
                f"  {_dash(lv.get('gateway_cpu_us_per_frame'), 11)}  {lv['cpu_cores']['others']:6.2f}"
                + (f"  {lv['failures']}" if lv["failures"] else "")
            )
        add(f"  {client}: simultaneous streams held with zero loss: {data['max_held_zero_loss']}")
    add(
        f"  (ideal stream duration {results['streams_ideal_ms']:.0f} ms; chunk_delay {results['settings']['chunk_delay']} s)"
    )
    add("")
    add("goals (design.md §11)")
    width = max([18, *(len(name) + 2 for name in results["goals"])])
    for client, rows in results["goals"].items():
        add(
            f"  {client:<{width}}" + "  ".join(f"{k}={v['measured']} {v['verdict']}" for k, v in rows.items())
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- main


def gateway_counters(gateways: dict[str, Child]) -> dict[str, Any]:
    health = {}
    for client, child in gateways.items():
        with urllib.request.urlopen(f"http://{HOST}:{child.port}/healthz", timeout=5) as response:
            health[client] = json.loads(response.read()).get("counters")
    return health


async def run(
    settings: Settings,
    workdir: Path,
    children: Children,
    ref: str | None,
    with_store: bool,
    *,
    streams_only: bool = False,
    max_connections: int | None = None,
    selected: set[str] | None = None,
    fake_kind: str = "fast",
    with_litellm: bool = True,
) -> dict[str, Any]:
    python = sys.executable
    under_test = gateway_under_test(ref, workdir, children.env, with_store)
    if max_connections is not None:
        under_test["max_connections"] = max_connections
    print(f"gateway under test: {under_test}", flush=True)

    def wanted(name: str) -> bool:
        return selected is None or name in selected

    skipped: dict[str, str] = {}
    litellm_exe: Path | None = None
    if wanted(LITELLM) and not streams_only:  # before anything starts: the first install takes minutes
        if not with_litellm:
            skipped[LITELLM] = "--no-litellm"
        else:
            litellm_exe, how = litellm_executable()
            if litellm_exe is None:
                skipped[LITELLM] = how
                print(f"skipping {LITELLM}: {how}", flush=True)
            else:
                print(f"{LITELLM}: {how}", flush=True)

    fake_port = free_port()
    fake_script = "fast_fake_upstream.py" if fake_kind == "fast" else "fake_upstream_server.py"
    fake = children.start(
        "fake-upstream", fake_port, [python, str(HERE / fake_script), "--port", str(fake_port)], workdir
    )
    gateways: dict[str, Child] = {}

    def start_gateway(name: str, label: str, client: str, config_of: dict[str, Any]) -> None:
        config = workdir / f"gateway-{label}.yaml"
        config.write_text(
            json.dumps(gateway_config(fake_port, client, workdir, config_of, label))
        )  # JSON is YAML
        port = free_port()
        argv = [python, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
        gateways[name] = children.start(label, port, argv, workdir)

    for client in CLIENTS:
        if wanted(client):
            start_gateway(client, client, client, under_test)
    if wanted(DEFAULTS) and not streams_only:
        # the tenant's defaults: neither `store_conversations: false` nor `context.enabled: false`
        start_gateway(
            DEFAULTS,
            "aiohttp-defaults",
            "aiohttp",
            under_test | {"has_store_switch": False, "has_context_config": False},
        )
    # Each front door gets a gateway process of its own, configured as the aiohttp one: a request through
    # a process that has just served another one is answered faster (measured), which would favour a
    # door that shares its process with the chat row.
    for name in DOORS:
        if wanted(name):
            start_gateway(name, "aiohttp-" + DOORS[name], "aiohttp", under_test)
    proxies: dict[str, Child] = {}  # the floors and the peer: not gateways (no /healthz, no counters)
    for name, script in ((STACK_FLOOR, "floor_proxy.py"), (BARE_RELAY, "bare_relay.py")):
        if wanted(name) and not streams_only:
            port = free_port()
            argv = [python, str(HERE / script), "--port", str(port)]
            argv += ["--upstream", f"http://{HOST}:{fake_port}", "--upstream-key", UPSTREAM_KEY]
            proxies[name] = children.start(name, port, argv, workdir)

    # Up to ten processes import at once on two shared cores: a start can take a minute or more.
    wait_ready(fake, "/v1/models", timeout=180)
    for child in gateways.values():
        wait_ready(child, "/healthz", timeout=180)
    for child in proxies.values():
        wait_ready(child, "/v1/models", timeout=180)  # relayed to the fake
    # LiteLLM last, alone: its import alone takes ~10 s of CPU
    litellm = start_litellm(children, litellm_exe, fake_port, workdir) if litellm_exe else None
    if litellm is not None:
        try:
            wait_ready(litellm, "/health/liveliness", timeout=180)  # answered without calling the upstream
            problem = post_ok(litellm.port, GATEWAY_KEY, CHAT)
            if problem:
                raise RuntimeError(f"a first chat completion failed: {problem}")
        except (RuntimeError, TimeoutError) as exc:
            skipped[LITELLM] = f"did not start: {str(exc)[-800:]}"
            print(f"skipping {LITELLM}: {skipped[LITELLM]}", flush=True)
            children.stop_one(litellm)
        else:
            proxies[LITELLM] = litellm
    targets = [Target("direct", fake_port, UPSTREAM_KEY)]
    targets += [Target(name, c.port, GATEWAY_KEY) for name, c in gateways.items() if name not in DOORS]
    targets += [Target(name, c.port, GATEWAY_KEY) for name, c in proxies.items()]
    doors = [
        Target(name, gateways[name].port, GATEWAY_KEY, door)
        for name, door in DOORS.items()
        if name in gateways
    ]
    meter = CpuMeter(
        {"fake-upstream": fake.proc.pid} | {name: c.proc.pid for name, c in (gateways | proxies).items()}
    )
    results: dict[str, Any] = {
        "settings": asdict(settings),
        "machine": machine(),
        "gateway_under_test": under_test,
        "fake_upstream": (
            "fast: benchmarks/fast_fake_upstream.py (asyncio + httptools)"
            if fake_kind == "fast"
            else "starlette: benchmarks/fake_upstream_server.py (uvicorn + starlette)"
        ),
        "targets": [t.name for t in targets],
        "door_targets": [t.name for t in doors],
        "skipped_targets": skipped,
        "target_processes": {
            DEFAULTS: "python -m gateway serve, aiohttp, the tenant's defaults"
            " (store_conversations and context on)",
            STACK_FLOOR: "benchmarks/floor_proxy.py: uvicorn (uvloop, httptools) + raw ASGI + aiohttp ClientSession",
            BARE_RELAY: "benchmarks/bare_relay.py: asyncio (uvloop) + httptools, one upstream connection per client",
            LITELLM: f"litellm --config <one model, openai/fake-model> (litellm[proxy]=={LITELLM_VERSION},"
            f" {LITELLM_VENV.relative_to(HERE.parent)}), LITELLM_LOG=WARNING, LITELLM_LOCAL_MODEL_COST_MAP=True",
        },
    }
    phases = {}

    if not streams_only:
        t = time.monotonic()
        await settle(meter, "[1/4]", settings.settle_seconds)
        print(
            f"[1/4] latency at 1 connection: {settings.seq_requests} requests per target, interleaved",
            flush=True,
        )
        results["latency_1conn"] = await interleaved(
            targets + doors,
            meter,
            CHAT,
            settings.seq_requests,
            settings.seq_warmup,
            stream=False,
            budget=settings.phase_seconds,
        )
        phases["latency_1conn"] = time.monotonic() - t

        t = time.monotonic()
        await settle(meter, "[2/4]", settings.settle_seconds)
        print(
            f"[2/4] stream TTFT at 1 connection: {settings.ttft_requests} streams per target, interleaved",
            flush=True,
        )
        results["ttft_1conn"] = await interleaved(
            targets + doors,
            meter,
            CHAT_STREAM,
            settings.ttft_requests,
            settings.seq_warmup // 3,
            stream=True,
            budget=settings.phase_seconds,
        )
        phases["ttft_1conn"] = time.monotonic() - t

        t = time.monotonic()
        await settle(meter, "[3/4]", settings.settle_seconds)
        print(
            f"[3/4] {settings.connections} connections: {settings.rounds} x {settings.slice_seconds:g}s slices per target,"
            f" generators {settings.generators}",
            flush=True,
        )
        results["concurrency"] = await concurrency(targets, meter, settings, workdir)
        phases["concurrency"] = time.monotonic() - t

    t = time.monotonic()
    print(f"[4/4] simultaneous paced streams, levels {settings.stream_levels}", flush=True)
    results["streams"] = await streams(targets[1:], meter, settings)
    results["streams_ideal_ms"] = ms(settings.chunk_delay * (FRAMES_PER_STREAM - 2))
    phases["streams"] = time.monotonic() - t

    results["gateway_counters"] = gateway_counters(gateways)
    results["phase_seconds"] = {k: round(v, 1) for k, v in phases.items()}
    results["settle_log"] = SETTLE_LOG
    if not streams_only:
        results["combined"] = combined(results)
        results["floor_ratios"] = floor_ratios(results["combined"]["rows"])
    results["goals"] = goals(results) if not streams_only else {}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short smoke run (a few minutes)")
    parser.add_argument(
        "--chunk-delay",
        type=float,
        default=None,
        help="seconds between a stream's chunks (0.5)",
    )
    parser.add_argument("--gateway-ref", help="measure this commit's gateway/ instead of the working tree")
    parser.add_argument(
        "--with-store",
        action="store_true",
        help="keep store_conversations on (default: off, the tenant is a pure proxy when the gateway has the switch)",
    )
    parser.add_argument(
        "--streams-only", action="store_true", help="run part 4 alone (simultaneous paced streams)"
    )
    parser.add_argument(
        "--stream-levels", help="part 4: comma-separated stream counts, escalated until one fails (1000,1500)"
    )
    parser.add_argument(
        "--max-connections", type=int, help="the gateways' upstream.max_connections (their default: 1,000)"
    )
    parser.add_argument(
        "--targets",
        help="comma-separated targets to measure besides direct, of: " + ", ".join(TARGET_KEYS) + " (all)",
    )
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM proxy peer")
    parser.add_argument(
        "--fake",
        choices=("fast", "starlette"),
        default="fast",
        help="the fake upstream: fast (asyncio + httptools, the default) or starlette (the gateway's FakeUpstream)",
    )
    parser.add_argument("--show", type=Path, metavar="JSON", help="print the table of a saved run and exit")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()
    if args.show:
        print(table(json.loads(args.show.read_text())))
        return 0
    selected: set[str] | None = None
    if args.targets:
        keys = [k.strip() for k in args.targets.split(",") if k.strip()]
        unknown = [k for k in keys if k not in TARGET_KEYS]
        if unknown:
            parser.error(f"unknown targets {unknown}; choose from {', '.join(TARGET_KEYS)}")
        selected = {TARGET_KEYS[k] for k in keys}
    settings = Settings.make(args)
    if args.stream_levels:
        settings = replace(settings, stream_levels=tuple(int(n) for n in args.stream_levels.split(",")))
    fds = raise_fd_limit()
    needed = 3 * max(settings.stream_levels) + 200
    if fds < needed:
        print(
            f"warning: open-file limit {fds} < {needed}; the largest stream levels may fail", file=sys.stderr
        )
    children = Children()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gw-bench-") as tmp:
        try:
            results = uvloop.run(
                run(
                    settings,
                    Path(tmp),
                    children,
                    args.gateway_ref,
                    args.with_store,
                    streams_only=args.streams_only,
                    max_connections=args.max_connections,
                    selected=selected,
                    fake_kind=args.fake,
                    with_litellm=not args.no_litellm,
                )
            )
        finally:
            children.stop()
    results["total_seconds"] = round(time.monotonic() - started, 1)
    results["command"] = " ".join(["python", "benchmarks/overhead.py", *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print()
    print(table(results))
    print(f"\ntotal {results['total_seconds']} s")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
