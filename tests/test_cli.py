"""The read-only CLI commands against a store the real gateway filled (official SDK, real SQLite), and
README listing every command."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from gateway.cli import main
from gateway.fakes.openai_upstream import Reply
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, recorded, tenant, wait_for_jobs

README = Path(__file__).resolve().parent.parent / "README.md"


def test_conversations_show_context_and_jobs_read_what_the_gateway_stored(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], context={"budget_tokens": 300})]
    gateway = make_gateway(tenants)
    upstream.fake.enqueue(Reply("A1"), Reply("A2"), Reply("B2"))
    client = gateway.client(default_headers={"X-User-Id": "u-cli"})
    history: list[Any] = [{"role": "user", "content": "First question about the parcel PX-11."}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    history += [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    edited = [*history[:2], {"role": "user", "content": "Q2 edited"}]
    long_history = edited + [
        m
        for n in range(12)
        for m in (
            {"role": "assistant", "content": f"note {n}"},
            {"role": "user", "content": f"more {n} " * 20},
        )
    ]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=long_history)
    recorded(gateway, raw.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)
    conversation_id = raw.headers["x-conversation-id"]

    config = tmp_path / "cli.yaml"
    config.write_text(json.dumps({"storage": gateway.config.storage.model_dump(), "tenants": tenants}))
    runner = CliRunner()

    listed = runner.invoke(main, ["conversations", "--config", str(config), "--tenant", "acme"])
    assert listed.exit_code == 0, listed.output
    assert conversation_id in listed.output and "u-cli" in listed.output

    shown = runner.invoke(main, ["show", "--config", str(config), "--tenant", "acme", conversation_id])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    branches = [line for line in lines if "Q2" in line]
    assert len(branches) == 2  # the edit is a sibling of the original question
    assert branches[0].lstrip().startswith("├─") and "PX-11" in shown.output

    explained = runner.invoke(
        main, ["context", "--config", str(config), "--tenant", "acme", raw.headers["x-gateway-request-id"]]
    )
    assert explained.exit_code == 0, explained.output
    assert re.search(r"tokens: \d+ in the history, \d+ sent \(budget 300, \d+% saved\)", explained.output)
    assert "window" in explained.output and "retrieval" in explained.output

    queued = runner.invoke(main, ["jobs", "--config", str(config), "--tenant", "acme"])
    assert queued.exit_code == 0 and re.search(r"done [1-9]", queued.output), queued.output

    missing = runner.invoke(main, ["show", "--config", str(config), "--tenant", "acme", "nope"])
    assert missing.exit_code == 1 and "no conversation 'nope'" in missing.output
    other = runner.invoke(main, ["conversations", "--config", str(config), "--tenant", "globex"])
    assert conversation_id not in other.output  # another tenant sees none of it


def test_every_command_is_documented() -> None:
    text = README.read_text()
    documented = set(re.findall(r"context-gateway ([a-z]+)", text))
    assert set(main.commands) - documented == set(), "undocumented CLI commands"
