"""`context-gateway verify` on a store the real gateway filled: consistent as written, and each kind of
damage (content changed, a count off, an index row lost or doubled) found and named."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lancedb
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from gateway.adapters.sql.store import normalise_url
from gateway.cli import main
from gateway.config import LOCAL_MODELS
from gateway.fakes.openai_upstream import Reply
from gateway.wiring import index_table
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, tenant, wait_for_jobs

# The model and LanceDB are what these tests are about.
pytestmark = pytest.mark.real


def _chat(gateway: Gateway, upstream: Upstream) -> str:
    client = gateway.client(default_headers={"X-User-Id": "u-verify"})
    upstream.fake.enqueue(Reply("The port is 8443."), Reply("Yes."), Reply("It is 9443 then."), Reply("Ok"))
    history: list[Any] = [{"role": "user", "content": "Which port does the staging proxy use?"}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    history += [{"role": "assistant", "content": "The port is 8443."}, {"role": "user", "content": "Sure?"}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    edited = [*history[:2], {"role": "user", "content": "And in production?"}]  # a branch
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=edited)
    stream = client.chat.completions.create(  # a second conversation, streamed
        model="gpt-4o", messages=[{"role": "user", "content": "Another topic entirely."}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Ok"
    wait_for_jobs(gateway)
    return raw.headers["x-conversation-id"]


def test_verify_finds_a_store_the_gateway_wrote_consistent_and_names_each_fault(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path, database_url: str
) -> None:
    storage = {"database_url": database_url, "data_dir": str(tmp_path / "data")}
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])]
    gateway = make_gateway(tenants, storage=storage)
    conversation_id = _chat(gateway, upstream)
    gateway.server.stop()
    config = tmp_path / "verify.yaml"
    config.write_text(json.dumps({"storage": storage, "tenants": tenants}))
    runner = CliRunner()

    def verify() -> Any:
        return runner.invoke(main, ["verify", "--config", str(config)])

    clean = verify()
    assert clean.exit_code == 0, clean.output
    # 4 messages, a branch of 2 more, and a second conversation of 2
    assert "acme: 2 conversations, 8 messages" in clean.output
    assert "0 without their vector yet" in clean.output
    assert clean.output.rstrip().endswith("consistent")

    engine = sa.create_engine(normalise_url(database_url))
    with engine.begin() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT id, parent_id, path_tokens FROM messages WHERE conversation_id = :c ORDER BY depth"
            ),
            {"c": conversation_id},
        ).all()
        child = next(r for r in rows if r.parent_id is not None)
        content = json.dumps({"role": "user", "content": "something else was stored"})
        connection.execute(
            sa.text("UPDATE messages SET content = :content WHERE id = :id").bindparams(
                sa.bindparam("content", type_=sa.JSON)
            ),
            {"content": json.loads(content), "id": child.id},
        )
        connection.execute(
            sa.text("UPDATE messages SET path_tokens = path_tokens + 7 WHERE id = :id"), {"id": rows[-1].id}
        )
        connection.execute(
            sa.text("UPDATE conversations SET message_count = message_count + 1 WHERE id = :c"),
            {"c": conversation_id},
        )
    table = lancedb.connect(str(tmp_path / "data" / "lancedb")).open_table(index_table(LOCAL_MODELS[0]))
    dropped = f"{rows[0].id}:m"
    doubled = table.search().where(f"id = '{rows[-1].id}:m'").limit(1).to_arrow()
    table.delete(f"id = '{dropped}'")
    table.add(doubled)

    damaged = verify()
    assert damaged.exit_code == 1, damaged.output
    faults = [line for line in damaged.output.splitlines() if "FAULT" in line]
    text = "\n".join(faults)
    assert f"{child.id}: id is not the chain hash" in text
    assert "path_tokens" in text and rows[-1].id in text
    assert "message_count 6, 5 stored" in text or "message_count" in text
    assert "1 index rows missing" in text and dropped in text
    assert f"{rows[-1].id}:m: index row held 2 times" in text
    assert "faults found" in damaged.output


def test_a_next_turn_sent_before_the_answer_was_stored_leaves_nothing_unindexed(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """The next turn (holding the answer) arrives while that answer still streams: the next request
    stores the answer first. The question of the first request must be indexed all the same (its job
    was dropped because the answer was "stored already": found by verify)."""
    storage = {"database_url": f"sqlite:///{tmp_path}/race.db", "data_dir": str(tmp_path / "data")}
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])]
    gateway = make_gateway(tenants, storage=storage)
    client = gateway.client(default_headers={"X-User-Id": "u-race"})
    first_answer = "The invoice total was 4,210 euros."
    upstream.fake.enqueue(Reply(first_answer, chunk_delay=0.2), Reply("Paid on May 2."))
    question = {"role": "user", "content": "What was the invoice total for the Lisbon office?"}
    stream = client.chat.completions.create(model="gpt-4o", messages=[question], stream=True)
    chunks = iter(stream)
    next(chunks)  # the answer is on its way
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            question,
            {"role": "assistant", "content": first_answer},
            {"role": "user", "content": "Paid?"},
        ],
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).endswith("euros.")
    wait_for_jobs(gateway)
    gateway.server.stop()
    config = tmp_path / "race.yaml"
    config.write_text(json.dumps({"storage": storage, "tenants": tenants}))
    result = CliRunner().invoke(main, ["verify", "--config", str(config), "--tenant", "acme"])
    assert "acme: 1 conversations, 4 messages" in result.output, result.output
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("consistent")
