"""`context-gateway worker`: background jobs in a process of their own, beside a server that runs none
(`jobs.workers: 0`), both real CLI processes on one SQLite database and one LanceDB index."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from gateway.fakes.openai_upstream import Reply
from tests.conftest import GATEWAY_KEY, Upstream, free_port, tenant, wait_until_healthy


def _jobs(url: str) -> dict[str, int]:
    return dict(httpx.get(f"{url}/healthz").json()["jobs"])


def _niceness(pid: int) -> dict[int, int]:
    """Each thread's niceness (/proc, Linux); the model's batch thread lowers its own further."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            found[int(task.name)] = int(fields[16])  # stat's 19th field; [0] here is its 3rd (state)
    return found


def test_a_worker_process_runs_the_jobs_a_server_without_workers_queues(
    upstream: Upstream, tmp_path: Path
) -> None:
    base: dict[str, Any] = {
        "storage": {"database_url": f"sqlite:///{tmp_path / 'gw.db'}", "data_dir": str(tmp_path)},
        "tenants": [tenant("acme", upstream.base_url, compaction={"enabled": False})],
    }
    server_config, worker_config = tmp_path / "server.yaml", tmp_path / "worker.yaml"
    server_config.write_text(json.dumps({**base, "jobs": {"workers": 0}}))  # JSON is YAML
    worker_config.write_text(json.dumps({**base, "jobs": {"workers": 1, "poll_seconds": 0.2}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OPENAI_"))}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = [sys.executable, "-m", "gateway"]
    server = subprocess.Popen(
        [*cli, "serve", "--config", str(server_config), "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker: subprocess.Popen[bytes] | None = None
    try:
        wait_until_healthy(url, server)
        deadline = time.monotonic() + 120
        client = OpenAI(base_url=f"{url}/v1", api_key=GATEWAY_KEY)
        upstream.fake.enqueue(Reply(content="Noted."))
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "The deploy key is LK-4471-ZQ."}]
        )
        time.sleep(1.5)
        assert _jobs(url).get("queued", 0) >= 1  # the server itself runs nothing

        worker = subprocess.Popen(
            [*cli, "worker", "--config", str(worker_config)], env=env, stderr=subprocess.PIPE
        )
        while _jobs(url).get("queued", 0) or _jobs(url).get("running", 0):
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            assert time.monotonic() < deadline, _jobs(url)
            time.sleep(0.2)
        assert _jobs(url).get("done", 0) >= 1
        if sys.platform == "linux":  # it made way for the server: every thread of it is 10 nicer at least
            nicer = min(os.getpriority(os.PRIO_PROCESS, 0) + 10, 19)
            threads = _niceness(worker.pid)
            assert threads[worker.pid] == nicer and min(threads.values()) == nicer, threads
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        for process in (worker, server):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=60)
