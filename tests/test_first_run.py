"""A newcomer's first run: `context-gateway serve` with no config and only OPENAI_API_KEY and
OPENAI_BASE_URL set (here: the shipped fake upstream), driven by the official SDK with the client's own
key. The start-up block says every feature is on; the gateway's own background calls carry its key;
it summarises, learns memories (read back by the real CLI) and retrieves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from gateway.fakes.openai_upstream import Reply
from tests.conftest import Upstream, free_port, wait_until_healthy

OWN_KEY = "sk-gateway-own"
CLIENT_KEY = "sk-client"


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def first_run(upstream: Upstream, tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OPENAI_"))}
    env |= {"OPENAI_API_KEY": OWN_KEY, "OPENAI_BASE_URL": upstream.base_url}
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        yield url, env, tmp_path
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_serve_with_only_openai_api_key_set_summarises_learns_memories_and_retrieves(
    first_run: tuple[str, dict[str, str], Path], upstream: Upstream
) -> None:
    url, env, cwd = first_run
    block = (cwd / "serve.log").read_text()
    for line in ("context     on", "retrieval   on", "summaries   on", "memory      on"):
        assert line in block, block
    client = OpenAI(base_url=f"{url}/v1", api_key=CLIENT_KEY)
    history = [
        {"role": "user", "content": "I live in Lisbon and my deploy key for ledger-api is LK-4471-ZQ."},
        {"role": "assistant", "content": "Noted."},
    ]
    for turn in range(80):  # ~24k tokens: over the default budget of 16,000
        history += [
            {"role": "user", "content": f"Status update {turn}: " + "the build queue moved along. " * 50},
            {"role": "assistant", "content": f"Logged update {turn}."},
        ]
    history.append({"role": "user", "content": "Thanks, that is all for now."})
    upstream.fake.enqueue(Reply(content="Anytime."))
    client.chat.completions.create(model="gpt-4o", messages=history, user="ana")  # type: ignore[arg-type]
    assert upstream.fake.last_chat().headers["authorization"] == f"Bearer {CLIENT_KEY}"

    # The gateway's own calls (a summary, memory extraction after its delay) carry its own key.
    deadline = time.monotonic() + 180
    while not (upstream.fake.summary_requests() and upstream.fake.memory_requests()):
        assert time.monotonic() < deadline, "no summary or memory call reached the upstream"
        time.sleep(0.5)
    own = [*upstream.fake.summary_requests(), *upstream.fake.memory_requests()]
    assert {r.headers["authorization"] for r in own} == {f"Bearer {OWN_KEY}"}
    listed = ""
    while "Lisbon" not in listed:
        assert time.monotonic() < deadline, listed
        listed = _cli("memories", "list", "--tenant", "default", "--user", "ana", cwd=cwd, env=env).stdout
        time.sleep(1)

    # Retrieval: the old key comes back in the tail for a question about it.
    history += [
        {"role": "assistant", "content": "Anytime."},
        {"role": "user", "content": "What was my deploy key for ledger-api?"},
    ]
    upstream.fake.enqueue(Reply(content="LK-4471-ZQ"))
    client.chat.completions.create(model="gpt-4o", messages=history, user="ana")  # type: ignore[arg-type]
    sent = upstream.fake.last_chat().body["messages"]
    assert len(sent) < len(history)  # bounded
    assert any("LK-4471-ZQ" in str(m["content"]) for m in sent[:-1] if m["role"] == "system")
