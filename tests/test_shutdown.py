"""A real gateway process's connection handling: SIGTERM lets streams in flight finish and stores them,
then the process exits; idle client connections outlive the SDKs' own pool expiry."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionChunk

from gateway.fakes.openai_upstream import Reply
from tests.conftest import GATEWAY_KEY, Upstream, tenant


def start_gateway(
    tmp_path: Path, upstream: Upstream, grace: float = 30, workers: int = 1
) -> tuple[subprocess.Popen[str], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    config = {
        "server": {"shutdown_grace_seconds": grace},
        "storage": {"database_url": f"sqlite:///{tmp_path}/g.db", "data_dir": str(tmp_path / "data")},
        "tenants": [
            tenant("acme", upstream.base_url, retrieval={"enabled": False}, memory={"enabled": False})
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port)]
    argv += ["--workers", str(workers)]
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return process, port
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the gateway did not come up"
            time.sleep(0.2)


def open_stream(port: int, question: str) -> Iterator[ChatCompletionChunk]:
    """A chat stream through the gateway on `port`, by the official SDK."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=GATEWAY_KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": question}], stream=True
    )
    return iter(stream)


def test_sigterm_lets_streams_in_flight_finish_and_stores_them(tmp_path: Path, upstream: Upstream) -> None:
    words = [f"word{i}" for i in range(20)]
    upstream.fake.enqueue(Reply(" ".join(words), chunk_delay=0.1))  # about two seconds of stream
    process, port = start_gateway(tmp_path, upstream, grace=30)
    try:
        chunks = open_stream(port, "Count slowly.")
        received = [next(chunks)]
        while not any(c.choices and c.choices[0].delta.content for c in received):
            received.append(next(chunks))
        process.send_signal(signal.SIGTERM)  # mid-stream
        refused = threading.Event()

        def new_request() -> None:  # sent after the signal: it must not be served half-way
            time.sleep(0.3)
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            except httpx.TransportError:
                refused.set()

        probe = threading.Thread(target=new_request)
        probe.start()
        received += list(chunks)
        probe.join()
        text = "".join(c.choices[0].delta.content or "" for c in received if c.choices)
        assert text == " ".join(words)
        assert received[-1].choices[0].finish_reason == "stop"
        # uvicorn re-raises the signal once it has shut down: the exit status says "terminated".
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
        assert refused.is_set()  # the listening socket closed as the drain began
    finally:
        if process.poll() is None:
            process.kill()
        _, errors = process.communicate(timeout=30)
    with sqlite3.connect(tmp_path / "g.db") as db:
        stored = [json.loads(row[0]) for row in db.execute("SELECT content FROM messages ORDER BY depth")]
        statuses = [row[0] for row in db.execute("SELECT status FROM requests")]
    assert stored == [
        {"role": "user", "content": "Count slowly."},
        {"role": "assistant", "content": " ".join(words)},
    ], errors[-2000:]
    assert statuses == ["complete"]
    assert "Application shutdown complete" in errors  # the lifespan ran: workers stopped, stores closed


def test_sigterm_cancels_streams_that_outlive_the_grace_period(tmp_path: Path, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply(" ".join(f"w{i}" for i in range(40)), chunk_delay=0.25))  # ten seconds
    process, port = start_gateway(tmp_path, upstream, grace=1)
    try:
        chunks = open_stream(port, "Take your time.")
        next(chunks)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            rest = list(chunks)
        except (openai.APIError, httpx.HTTPError):
            rest = None  # cut: the grace period ended first
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
        assert time.monotonic() - signalled < 8  # did not wait for the whole ten-second stream
        assert rest is None or not rest or rest[-1].choices[0].finish_reason != "stop"
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def test_an_idle_client_connection_outlives_the_sdks_pool_expiry(tmp_path: Path, upstream: Upstream) -> None:
    """httpx (under the OpenAI and Anthropic SDKs) reuses a connection idle for up to 5 s: a server that
    closes idle connections after 5 s (uvicorn's default) races that reuse, and the request is reset."""
    process, port = start_gateway(tmp_path, upstream)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/healthz")
        first = connection.getresponse()
        first.read()
        sock = connection.sock
        time.sleep(6)  # past uvicorn's 5 s default and httpx's 5 s expiry
        connection.request("GET", "/healthz")  # on the same socket: http.client reconnects only if closed
        second = connection.getresponse()  # RemoteDisconnected if the server had closed it
        assert (first.status, second.status) == (200, 200)
        assert connection.sock is sock
        connection.close()
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_several_worker_processes_serve_one_port_and_share_the_store(
    tmp_path: Path, upstream: Upstream
) -> None:
    """`serve --workers 2`: two processes answer on the port, a conversation continued across them is
    one conversation, and SIGTERM stops them all."""
    process, port = start_gateway(tmp_path, upstream, workers=2)
    try:
        answered_by: set[int] = set()
        for _ in range(200):  # a new connection each time: the kernel hands each to a waiting process
            answered_by.add(httpx.get(f"http://127.0.0.1:{port}/healthz").json()["process"])
            if len(answered_by) == 2:
                break
        assert len(answered_by) == 2, answered_by
        messages: list[Any] = [{"role": "user", "content": "Turn one."}]
        for turn in range(6):  # each request on a new connection, so on either process
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=GATEWAY_KEY, max_retries=0)
            reply = client.chat.completions.create(model="gpt-4o", messages=messages)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"Turn {turn + 2}."},
            ]
            client.close()
        listed = httpx.get(
            f"http://127.0.0.1:{port}/api/conversations", headers={"Authorization": f"Bearer {GATEWAY_KEY}"}
        ).json()["data"]
        assert len(listed) == 1 and listed[0]["message_count"] == 12
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0
