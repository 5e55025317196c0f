"""The shipped fakes are adapters like the others: the real server runs on a fake embedder and an
in-process index chosen by config, and retrieval, deletion and /healthz work through them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, tenant, wait_for_jobs


def chat(count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "user", "content": "The nightly job died again."},
        {"role": "assistant", "content": "ledger_sync.py failed with ECONNRESET-7731 at 02:14."},
    ]
    for i in range(count):
        out.append({"role": "user", "content": f"Let us plan the garden, bed number {i}."})
        out.append({"role": "assistant", "content": f"Bed {i} gets tomatoes and basil this summer."})
    return out


def test_the_server_retrieves_through_the_fake_embedder_and_memory_index(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": 400},
                compaction={"enabled": False},
                retrieval={"embedder": {"provider": "fake", "dimensions": 32}},
            )
        ],
        storage={"database_url": f"sqlite:///{tmp_path}/g.db", "data_dir": str(tmp_path / "data")},
        advanced={"storage": {"index": "memory"}},
    )
    history = chat(60)
    client = gateway.client()
    client.chat.completions.create(model="gpt-4o", messages=history)
    wait_for_jobs(gateway)
    history += [
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Which error code did ledger_sync.py fail with?"},
    ]
    client.chat.completions.create(model="gpt-4o", messages=history)
    sent = "\n".join(str(m["content"]) for m in upstream.fake.last_chat().body["messages"])
    assert "ECONNRESET-7731" in sent
    assert len(upstream.fake.last_chat().body["messages"]) < len(history)  # rebuilt, not resent

    conversations = api(gateway, "/conversations")["data"]
    detail = api(gateway, f"/conversations/{conversations[0]['id']}")
    assert detail["index"]["complete"] is True and detail["index"]["embedded"] == detail["message_count"]
    assert not (tmp_path / "data" / "lancedb").exists()  # nothing of LanceDB was opened
    health = httpx.get(f"{gateway.server.url}/healthz")
    assert health.status_code == 200 and health.json()["indexing"]["unembedded"] == 0
