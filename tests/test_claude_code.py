"""The real Claude Code CLI (`claude -p`, pinned in tests/clients/package.json) through the gateway.

Claude Code is the agent the cache-stable layout is built for (design.md section 14): about 11-20k tokens
of system prompt and tools on every turn, its own cache_control breakpoints, and `metadata.user_id`
naming its device, account and session. What counts is what the fake upstream received: the second
turn of a `--continue`d session still holds the first turn, the client's breakpoints arrive, and two
sessions of one machine are stored as one user. .ci/run installs the CLI (npm); only a machine without
node skips these tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.fakes.anthropic_upstream import FakeAnthropic
from gateway.fakes.server import BackgroundServer
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, tenant

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")

CLAUDE = Path(__file__).parent / "clients" / "node_modules" / ".bin" / "claude"
FIRST = "Remember: my locker code is 4417."
SECOND = "What is my locker code?"


@pytest.fixture
def claude_upstream() -> Iterator[tuple[FakeAnthropic, BackgroundServer]]:
    fake = FakeAnthropic()
    with BackgroundServer(fake.app()) as server:
        yield fake, server


class ClaudeCode:
    """`claude -p` runs of one machine (one HOME: one device id) in one project folder."""

    def __init__(self, gateway: Gateway, root: Path) -> None:
        if not CLAUDE.exists():
            pytest.fail(f"{CLAUDE} is missing: run `npm ci` in tests/clients (.ci/run does)")
        self.home = root / "home"
        self.project = root / "project"
        self.home.mkdir()
        self.project.mkdir()
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "ANTHROPIC_BASE_URL": gateway.server.url,
            "ANTHROPIC_API_KEY": GATEWAY_KEY,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
        }

    def run(self, prompt: str, *extra: str) -> dict[str, Any]:
        command = [str(CLAUDE), "-p", prompt, *extra, "--output-format", "json"]
        done = subprocess.run(
            command, cwd=self.project, env=self.env, capture_output=True, text=True, timeout=180, check=False
        )
        assert done.returncode == 0, f"claude failed ({done.returncode}): {done.stderr}\n{done.stdout}"
        result: dict[str, Any] = json.loads(done.stdout)
        assert result.get("is_error") is False, result
        return result


def _texts(value: Any) -> str:
    """Every text of a request body (Anthropic blocks or chat parts), joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_texts(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(_texts(value.get(k)) for k in ("text", "content") if k in value)
    return ""


def _marks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The cache_control blocks of an Anthropic request, tools, system and messages."""
    blocks: list[Any] = [*body.get("tools", []), *(body.get("system") or [])]
    for message in body["messages"]:
        if isinstance(message["content"], list):
            blocks += message["content"]
    return [b for b in blocks if isinstance(b, dict) and "cache_control" in b]


def _device(body: dict[str, Any]) -> str:
    user = json.loads(body["metadata"]["user_id"])
    assert user["session_id"] and user["device_id"]
    return str(user["account_uuid"] or user["device_id"])


def _conversations(gateway: Gateway) -> list[dict[str, Any]]:
    return list(api(gateway, "/conversations")["data"])


@pytest.mark.parametrize("budget", [16_000, 6_000], ids=["default-budget", "budget-below-its-prompt"])
def test_a_continued_claude_code_session_keeps_its_first_turn(
    claude_upstream: tuple[FakeAnthropic, BackgroundServer],
    make_gateway: Callable[..., Gateway],
    tmp_path: Path,
    budget: int,
) -> None:
    """The second turn's prompt holds the first turn, at the default budget and at one smaller than
    Claude Code's own system prompt and tools (design.md section 14: the budget yields to an agent's
    newest exchanges while they fit the model's window)."""
    fake, server = claude_upstream
    upstream = {"provider": "anthropic", "api_key": "sk-ant-tenant", "api_keys": [GATEWAY_KEY]}
    gateway = make_gateway([tenant("claude", server.url, context={"budget_tokens": budget}, **upstream)])
    claude = ClaudeCode(gateway, tmp_path)

    first = claude.run(FIRST)
    second = claude.run(SECOND, "--continue")

    assert first["session_id"] == second["session_id"]  # --continue resumed the session
    turns = [r.body for r in fake.received if r.path == "/v1/messages"]
    assert len(turns) == 2, [r.path for r in fake.received]
    sent = turns[-1]
    assert FIRST in _texts(sent["messages"]), (
        f"the first turn was cut from the second turn's prompt: {len(sent['messages'])} message(s) sent; "
        f"stored: {[(c['id'], c['message_count']) for c in _conversations(gateway)]}"
    )
    assert SECOND in _texts(sent["messages"][-1]["content"])
    # Claude Code's own breakpoints (system prompt, newest user turn) arrive, four at most in all.
    client_marks = [b["cache_control"] for b in _marks(turns[-1])]
    assert client_marks and len(client_marks) <= 4
    assert any("cache_control" in block for block in sent["system"])
    assert "cache_control" in sent["messages"][-1]["content"][-1]
    conversations = _conversations(gateway)
    assert len(conversations) == 1  # the resent history was recognised: one stored conversation
    assert conversations[0]["user_id"] == _device(sent)


def test_two_claude_code_sessions_are_one_user(
    claude_upstream: tuple[FakeAnthropic, BackgroundServer],
    make_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    fake, server = claude_upstream
    upstream = {"provider": "anthropic", "api_key": "sk-ant-tenant", "api_keys": [GATEWAY_KEY]}
    gateway = make_gateway([tenant("claude", server.url, **upstream)])
    claude = ClaudeCode(gateway, tmp_path)

    one = claude.run(FIRST)
    two = claude.run("Which shell am I using?")

    assert one["session_id"] != two["session_id"]
    bodies = [r.body for r in fake.received if r.path == "/v1/messages"]
    sessions = {json.loads(b["metadata"]["user_id"])["session_id"] for b in bodies}
    assert len(sessions) == 2
    conversations = _conversations(gateway)
    assert len(conversations) == 2
    users = {c["user_id"] for c in conversations}
    assert users == {_device(bodies[0])}  # the device (no account here), never the session
    assert not users & sessions


def test_claude_code_through_a_chat_completions_upstream(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """The Anthropic door in front of an OpenAI-compatible upstream: converted both ways, the history
    kept, one `prompt_cache_key` for the whole conversation, the user read from Claude Code's metadata."""
    gateway = make_gateway([tenant("chat", upstream.base_url, api_keys=[GATEWAY_KEY])])
    claude = ClaudeCode(gateway, tmp_path)

    first = claude.run(FIRST)
    second = claude.run(SECOND, "--continue")

    assert first["session_id"] == second["session_id"]
    assert second["result"]  # Claude Code read the converted stream
    turns = upstream.fake.chat_requests()
    assert len(turns) == 2
    sent = turns[-1].body
    assert FIRST in _texts(sent["messages"])
    assert SECOND in _texts(sent["messages"][-1]["content"])
    keys = {t.body.get("prompt_cache_key") for t in turns}
    assert len(keys) == 1 and None not in keys
    conversations = _conversations(gateway)
    assert len(conversations) == 1
    key = next(iter(keys))
    assert isinstance(key, str) and conversations[0]["id"] not in key  # a hash, not the stored id
    assert conversations[0]["user_id"] and conversations[0]["user_id"] == sent.get("user")
