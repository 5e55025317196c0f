"""Resident memory of a fresh `context-gateway serve` with no config (issue 29): idle, then after one chat
request, and how long that first request took.

Each run starts `python -m gateway serve --port P` in an empty temporary directory (so `./data` is new)
with HOME there too, `OPENAI_BASE_URL` pointed at a fake upstream (`benchmarks/fake_upstream_server.py`,
its own process) and no `OPENAI_API_KEY`: the defaults, as a first-time user gets them. Once `/healthz`
answers it reads VmRSS from /proc/PID/status, sends one chat completion with a client key, reads VmRSS
again after the request and once more after `--settle` seconds (the request enqueues indexing: the
embedder runs in the background), then stops the gateway.

    python benchmarks/idle_memory.py                          # this checkout, 5 runs
    python benchmarks/idle_memory.py --before /tmp/before     # and another checkout, alternating A/B

`--before DIR` runs DIR's `gateway` package (DIR first on PYTHONPATH, e.g. from
`git archive HEAD | tar -x -C /tmp/before`) in alternate runs, and prints both medians side by side.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 120.0) -> float:
    began = time.monotonic()
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return time.monotonic() - began
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"the process exited with {process.returncode}")
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"no answer within {timeout:.0f} s")
        time.sleep(0.1)


@dataclass(slots=True)
class Run:
    label: str
    start_s: float  # from spawn to /healthz answering
    idle_mb: float
    first_ms: float  # the first chat request, end to end
    overhead_ms: float  # its x-gateway-overhead-ms: the gateway's own part of it
    after_mb: float  # just after it
    settled_mb: float  # `--settle` seconds later (background indexing done)


def one_run(label: str, pythonpath: Path, upstream: str, model: str, settle: float, quiet: bool) -> Run:
    with tempfile.TemporaryDirectory(prefix="idle-memory-") as work:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("OPENAI_API_KEY", "GATEWAY_CONFIG", "PYTHONPATH")
        }
        env.update(HOME=work, OPENAI_BASE_URL=upstream, PYTHONPATH=str(pythonpath))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
            cwd=work,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if quiet else None,
        )
        try:
            start_s = wait_healthy(url, process)
            idle = rss_mb(process.pid)
            body = {"model": model, "messages": [{"role": "user", "content": "Hello there!"}]}
            began = time.perf_counter()
            response = httpx.post(
                f"{url}/v1/chat/completions",
                json=body,
                headers={"Authorization": "Bearer sk-client-key"},
                timeout=60,
            )
            first_ms = (time.perf_counter() - began) * 1000
            response.raise_for_status()
            overhead_ms = float(response.headers.get("x-gateway-overhead-ms", "nan"))
            after = rss_mb(process.pid)
            time.sleep(settle)
            settled = rss_mb(process.pid)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return Run(label, start_s, idle, first_ms, overhead_ms, after, settled)


def start_upstream() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "fake_upstream_server.py"), "--port", str(port)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    url = f"http://127.0.0.1:{port}"
    began = time.monotonic()
    while True:
        try:
            httpx.get(f"{url}/v1/models", timeout=2)
            break
        except httpx.TransportError:
            if time.monotonic() - began > 30:
                raise
            time.sleep(0.1)
    # Its own first answer is slower (the first run's figure would carry it).
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "warm-up"}]}
    httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).raise_for_status()
    return process, f"{url}/v1"


def report(runs: list[Run]) -> None:
    print(
        f"{'code':8} {'runs':>4} {'start s':>8} {'idle MB':>8} {'first ms':>9} {'overhead ms':>12} "
        f"{'after MB':>9} {'settled MB':>11}"
    )
    for label in dict.fromkeys(r.label for r in runs):
        mine = [r for r in runs if r.label == label]

        def med(field: str, mine: list[Run] = mine) -> float:
            return float(statistics.median(getattr(r, field) for r in mine))

        print(
            f"{label:8} {len(mine):>4} {med('start_s'):>8.2f} {med('idle_mb'):>8.0f} "
            f"{med('first_ms'):>9.0f} {med('overhead_ms'):>12.1f} {med('after_mb'):>9.0f} {med('settled_mb'):>11.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per checkout (default 5)")
    parser.add_argument("--before", type=Path, help="another checkout's root, run alternately")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the request (default 3)")
    parser.add_argument("--model", default="gpt-4o-mini", help="the chat request's (default gpt-4o-mini)")
    parser.add_argument("--verbose", action="store_true", help="show the gateways' logs")
    args = parser.parse_args()
    checkouts = [("this", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    upstream, upstream_url = start_upstream()
    runs: list[Run] = []
    try:
        for number in range(args.runs):
            order = checkouts if number % 2 == 0 else checkouts[::-1]
            for label, path in order:
                run = one_run(label, path, upstream_url, args.model, args.settle, not args.verbose)
                runs.append(run)
                print(
                    f"{label:8} start {run.start_s:.2f} s, idle {run.idle_mb:.0f} MB, first request "
                    f"{run.first_ms:.0f} ms (overhead {run.overhead_ms:.1f} ms), after {run.after_mb:.0f} MB, settled {run.settled_mb:.0f} MB",
                    flush=True,
                )
    finally:
        upstream.send_signal(signal.SIGTERM)
        upstream.wait(10)
    print()
    report(runs)


if __name__ == "__main__":
    main()
