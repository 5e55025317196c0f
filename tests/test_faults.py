"""Faults injected for real, and what the gateway does about them: the database going away and coming
back (through a TCP relay in front of this machine's Postgres that is cut and restored), a gateway
process killed with SIGKILL in the middle of a stream and of a job, the index's directory turning
read-only, and the disk filling up (a small tmpfs). Upstream faults (refused, stalled, 429/500, dying
mid-stream, the client leaving) are in test_http_clients.py; SIGTERM in test_shutdown.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from openai import APIError, OpenAI

from gateway.cli import main
from gateway.fakes.openai_upstream import Reply
from tests.conftest import (
    GATEWAY_KEY,
    POSTGRES_URL,
    Gateway,
    Upstream,
    free_port,
    postgres_available,
    tenant,
    wait_for_jobs,
)

# The model and LanceDB are what these tests are about.
pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parent.parent


class TcpRelay:
    """A TCP relay on loopback to `target`: `cut()` closes every connection and refuses new ones (the
    database host gone), `restore()` listens again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        assert self._listener is not None
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._listener = None
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def postgres_schema() -> Iterator[str]:
    if not postgres_available():
        if os.environ.get("CI"):
            pytest.fail("Postgres is not reachable (CI must run the Postgres tests)")
        pytest.skip("Postgres is not reachable")
    schema = f"f_{uuid.uuid4().hex[:12]}"
    admin = POSTGRES_URL.replace("+psycopg", "")
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    yield schema
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _verify(storage: dict[str, Any], tenants: list[dict[str, Any]], tmp_path: Path) -> str:
    config = tmp_path / "verify.yaml"
    config.write_text(json.dumps({"storage": storage, "tenants": tenants}))
    result = CliRunner().invoke(main, ["verify", "--config", str(config)])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_database_going_away_fails_open_and_the_gateway_recovers_without_a_restart(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path, postgres_schema: str
) -> None:
    relay = TcpRelay(("127.0.0.1", 5432))
    url = POSTGRES_URL.replace("127.0.0.1:5432", f"127.0.0.1:{relay.port}")
    storage = {"database_url": f"{url}?options=-csearch_path%3D{postgres_schema}", "data_dir": str(tmp_path)}
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])]
    gateway = make_gateway(tenants, storage=storage)
    client = gateway.client(default_headers={"X-User-Id": "u-outage"})
    history: list[Any] = [{"role": "user", "content": "Before the outage: the ticket is T-100."}]
    first = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    conversation_id = first.headers["x-conversation-id"]
    history.append({"role": "assistant", "content": first.parse().choices[0].message.content})
    wait_for_jobs(gateway)

    relay.cut()
    for n in range(3):  # answered all the same, plain and streamed: the store is not on the answer's path
        history.append({"role": "user", "content": f"During the outage, question {n}."})
        if n % 2:
            stream = client.chat.completions.create(model="gpt-4o", messages=history, stream=True)
            answer = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        else:
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
            assert "x-conversation-id" not in raw.headers  # forwarded as it came: no context, nothing stored
            answer = raw.parse().choices[0].message.content or ""
        assert answer.startswith("(fake model)")
        history.append({"role": "assistant", "content": answer})
    health = httpx.get(f"{gateway.server.url}/healthz").json()
    assert health["counters"]["fail_open"] >= 3

    relay.restore()  # no restart: the pool's next connections work again
    history.append({"role": "user", "content": "After the outage."})
    after = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    # The client resent the whole history: what the outage kept from the store is stored now, in the
    # same conversation (recognised from its stored start).
    assert after.headers["x-conversation-id"] == conversation_id
    wait_for_jobs(gateway)
    headers = {"Authorization": f"Bearer {GATEWAY_KEY}"}
    messages = httpx.get(
        f"{gateway.server.url}/api/conversations/{conversation_id}/messages", headers=headers
    ).json()["data"]
    stored = {m["message"]["content"] for m in messages}
    assert {m["content"] for m in history} <= stored
    assert len(messages) == len(history) + 1
    gateway.server.stop()
    relay.cut()
    storage["database_url"] = f"{POSTGRES_URL}?options=-csearch_path%3D{postgres_schema}"
    assert "consistent" in _verify(storage, tenants, tmp_path)


def _serve(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        time.sleep(0.2)
    process.kill()
    raise AssertionError("the gateway did not start")


def test_sigkill_mid_stream_keeps_the_question_and_the_next_turn_stores_what_the_client_got(
    upstream: Upstream, tmp_path: Path
) -> None:
    storage = {"database_url": f"sqlite:///{tmp_path}/kill.db", "data_dir": str(tmp_path / "data")}
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])]
    config = tmp_path / "kill.yaml"
    jobs = {"unanswered_index_seconds": 3, "poll_seconds": 0.2}
    config.write_text(json.dumps({"storage": storage, "tenants": tenants, "jobs": jobs}))
    port = free_port()
    process = _serve(config, port, tmp_path / "gateway.log")
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=GATEWAY_KEY, max_retries=0)
    upstream.fake.enqueue(Reply("one two three four five six seven eight", chunk_delay=0.3))
    question = {"role": "user", "content": "Tell me the eight words slowly."}
    stream = client.chat.completions.create(model="gpt-4o", messages=[question], stream=True)
    got: list[str] = []
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError, APIError)):  # dies with the process
        for chunk in stream:
            got.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
            if len("".join(got).split()) >= 2:
                process.send_signal(signal.SIGKILL)
    process.wait()
    partial = "".join(got)
    assert partial and "eight" not in partial

    process = _serve(config, port, tmp_path / "gateway.log")  # a new process on the same store
    try:
        history = [question, {"role": "assistant", "content": partial}, {"role": "user", "content": "Go on."}]
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
        conversation_id = raw.headers["x-conversation-id"]
        messages = httpx.get(
            f"http://127.0.0.1:{port}/api/conversations/{conversation_id}/messages",
            headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
        ).json()["data"]
        # The question was stored before the killed request went upstream; the part of the answer the
        # client kept came back with its next turn, under the same question: one conversation, no loss.
        contents = [m["message"]["content"] for m in sorted(messages, key=lambda m: m["depth"])]
        assert contents == [question["content"], partial, "Go on.", raw.parse().choices[0].message.content]
        # The killed request's question is indexed too: by the delayed job queued with it.
        deadline = time.monotonic() + 30
        while (
            httpx.get(f"http://127.0.0.1:{port}/healthz").json()["jobs"].get("queued")
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert "consistent" in _verify(storage, tenants, tmp_path)


def test_sigkill_mid_job_the_job_is_leased_again_and_runs_once(upstream: Upstream, tmp_path: Path) -> None:
    """A compaction job is running (its summary call is held by the upstream) when its process is
    killed; the next process leases it again once the lease runs out and runs it to the end: one
    summary, the job done after two attempts' leases, none failed."""
    storage = {"database_url": f"sqlite:///{tmp_path}/job.db", "data_dir": str(tmp_path / "data")}
    tenants = [
        tenant(
            "acme",
            upstream.base_url,
            api_keys=[GATEWAY_KEY],
            context={"budget_tokens": 400, "recent_tokens": 200},
            compaction={"model": "cheap", "threshold_tokens": 200, "chunk_tokens": 400},
            retrieval={"enabled": False},
        )
    ]
    config = tmp_path / "job.yaml"
    config.write_text(
        json.dumps(
            {"storage": storage, "tenants": tenants, "jobs": {"lease_seconds": 3, "poll_seconds": 0.2}}
        )
    )
    port = free_port()
    process = _serve(config, port, tmp_path / "gateway.log")
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=GATEWAY_KEY, max_retries=0)
    upstream.fake.enqueue_summary(Reply("SUMMARY: the held one.", delay=30))
    history: list[Any] = []
    for n in range(6):
        history.append({"role": "user", "content": f"Turn {n}: " + "words about the plan " * 20})
        answer = client.chat.completions.create(model="gpt-4o", messages=history).choices[0].message.content
        history.append({"role": "assistant", "content": answer})
    deadline = time.monotonic() + 30
    while not upstream.fake.summary_requests() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert upstream.fake.summary_requests(), "no compaction started"
    process.send_signal(signal.SIGKILL)
    process.wait()

    upstream.fake.enqueue_summary(Reply("SUMMARY: written by the second process."))
    process = _serve(config, port, tmp_path / "gateway.log")
    try:
        deadline = time.monotonic() + 60
        jobs: dict[str, int] = {}
        while time.monotonic() < deadline:
            jobs = httpx.get(f"http://127.0.0.1:{port}/healthz").json()["jobs"]
            if jobs.get("queued", 0) == 0 and jobs.get("running", 0) == 0:
                break
            time.sleep(0.3)
        assert jobs.get("failed", 0) == 0 and jobs.get("done", 0) >= 1, jobs
        conversations = httpx.get(
            f"http://127.0.0.1:{port}/api/conversations", headers={"Authorization": f"Bearer {GATEWAY_KEY}"}
        ).json()["data"]
        summaries = httpx.get(
            f"http://127.0.0.1:{port}/api/conversations/{conversations[0]['id']}/summaries",
            headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
        ).json()
        texts = [s["content"] for level in ("global", "chunk") for s in summaries[level]]
        assert any("second process" in t for t in texts), summaries
        assert not any("held one" in t for t in texts)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """A small tmpfs of its own at tmp_path/fs (root only: mount); the callable remounts it ("ro", "rw")."""
    mount = tmp_path / "fs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)

    def remount(mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)

    try:
        yield remount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _turns(client: OpenAI, history: list[Any], texts: list[str]) -> None:
    for text in texts:
        history.append({"role": "user", "content": text})
        answer = client.chat.completions.create(model="gpt-4o", messages=history).choices[0].message.content
        assert answer and answer.startswith("(fake model)")
        history.append({"role": "assistant", "content": answer})


def test_a_read_only_index_directory_fails_the_embed_jobs_until_it_is_writable_again(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path, tmpfs: Callable[[str], None]
) -> None:
    storage = {
        "database_url": f"sqlite:///{tmp_path}/ro.db",
        "data_dir": str(tmp_path / "data"),
        "index_uri": str(tmp_path / "fs" / "lancedb"),
    }
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])]
    jobs = {"retry_base_seconds": 1, "poll_seconds": 0.2}
    gateway = make_gateway(tenants, storage=storage, jobs=jobs)
    client = gateway.client(default_headers={"X-User-Id": "u-ro"})
    history: list[Any] = []
    _turns(client, history, ["The locker code is 4417."])
    wait_for_jobs(gateway)

    tmpfs("ro")
    _turns(client, history, ["A question while the index is read-only.", "And another one."])
    deadline = time.monotonic() + 20  # the jobs fail and wait for their retry; the answers did not wait
    while httpx.get(f"{gateway.server.url}/healthz").json()["workers"]["retried"] < 2:
        assert time.monotonic() < deadline, "the embed jobs did not fail on the read-only directory"
        time.sleep(0.2)
    tmpfs("rw")
    wait_for_jobs(gateway, timeout=60)
    assert httpx.get(f"{gateway.server.url}/healthz").json()["jobs"].get("failed", 0) == 0
    gateway.server.stop()
    out = _verify(storage, tenants, tmp_path)
    assert "0 without their vector yet" in out and out.rstrip().endswith("consistent")


def test_a_full_disk_fails_open_and_storing_resumes_once_there_is_room(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path, tmpfs: Callable[[str], None]
) -> None:
    fs = tmp_path / "fs"
    storage = {"database_url": f"sqlite:///{fs}/full.db", "data_dir": str(tmp_path / "data")}
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], retrieval={"enabled": False})]
    gateway = make_gateway(tenants, storage=storage)
    client = gateway.client(default_headers={"X-User-Id": "u-full"})
    history: list[Any] = []
    _turns(client, history, ["Before the disk filled up."])
    filler = fs / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as f:  # fill it to the last block
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    big = "x" * 200_000  # bigger than any room left: its insert cannot fit
    _turns(client, history, [f"While the disk is full: {big}"])
    health = httpx.get(f"{gateway.server.url}/healthz").json()["counters"]
    assert health["fail_open"] + health["complete_errors"] >= 1
    filler.unlink()
    _turns(client, history, ["After there is room again."])
    messages = httpx.get(
        f"{gateway.server.url}/api/conversations", headers={"Authorization": f"Bearer {GATEWAY_KEY}"}
    ).json()["data"]
    assert len(messages) == 1  # one conversation: recognised again from its stored start
    conversation = httpx.get(
        f"{gateway.server.url}/api/conversations/{messages[0]['id']}/messages",
        headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
    ).json()["data"]
    # The resent history caught up on what the full disk kept out: every message stored once.
    assert sorted(m["message"]["content"] for m in conversation) == sorted(m["content"] for m in history)
    gateway.server.stop()
    assert _verify(storage, tenants, tmp_path).rstrip().endswith("consistent")
