"""Tenant and user isolation on every read path, swept in one place: the context sent upstream (window,
retrieval across the user's conversations, memory), the REST API (conversations, messages, paths,
summaries, request records, memories, search, export, profiles, edits and deletes by id), the dashboard
(with a bearer key) and the metrics' labels. Two tenants; in one of them two users; the same user id in
both tenants. Each party's secret must reach that party (a positive control: the paths work) and never
anyone else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import Gateway, Upstream, recorded, tenant, wait_for_jobs

JOBS = {"poll_seconds": 0.05, "retry_base_seconds": 0.05}
FEATURES = {
    "memory": {"enabled": True, "extract_delay_seconds": 0, "profile_delay_seconds": 0},
    "retrieval": {"other_conversations": True},
    "context": {"budget_tokens": 2000, "recent_tokens": 300},
    "compaction": {"model": "cheap", "threshold_tokens": 300, "chunk_tokens": 600},
}
PARTIES = {  # (tenant key, user) -> the secret only they may see
    ("sk-gw-acme", "ana"): "ZEBRA-1111",
    ("sk-gw-acme", "bob"): "OTTER-2222",
    ("sk-gw-globex", "ana"): "LLAMA-3333",
}


def _get(gateway: Gateway, key: str, path: str, **params: str) -> httpx.Response:
    return httpx.get(f"{gateway.server.url}{path}", params=params, headers={"Authorization": f"Bearer {key}"})


@pytest.fixture
def filled(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> tuple[Gateway, dict[Any, Any]]:
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, **FEATURES), tenant("globex", upstream.base_url, **FEATURES)],
        jobs=JOBS,
    )
    ids: dict[Any, Any] = {}
    for (key, user), secret in PARTIES.items():
        client = gateway.client(api_key=key, default_headers={"X-User-Id": user})
        history: list[Any] = []
        for n, text in enumerate(
            [f"My locker code is {secret}.", "I like long walks " * 30, "Tell me about tides " * 30]
        ):
            history.append({"role": "user", "content": text})
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=history)
            history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
            if n == 0:
                ids[(key, user)] = {"conversation": raw.headers["x-conversation-id"]}
                ids[(key, user)]["request"] = raw.headers["x-gateway-request-id"]
                recorded(gateway, raw.headers["x-gateway-request-id"], key)
        wait_for_jobs(gateway)
    for (key, user), entry in ids.items():
        data = _get(gateway, key, f"/api/users/{user}/memories").json()["data"]
        entry["memory"] = next(m["id"] for m in data if PARTIES[(key, user)] in m["content"])
    return gateway, ids


def test_every_read_path_shows_each_party_its_own_data_only(
    filled: tuple[Gateway, dict[Any, Any]], upstream: Upstream
) -> None:
    gateway, ids = filled
    for (key, user), secret in PARTIES.items():
        others = [s for party, s in PARTIES.items() if party != (key, user)]
        tenant_others = [s for (k, _), s in PARTIES.items() if k != key]

        # The context sent upstream for a new conversation of this party: its own code comes back
        # (memory, and retrieval over the user's other conversations), no one else's.
        client = gateway.client(api_key=key, default_headers={"X-User-Id": user})
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "What is my locker code?"}]
        )
        sent = str(upstream.fake.last_chat().body)
        assert secret in sent, (key, user)
        assert not any(s in sent for s in others), (key, user)

        # The REST API: lists, reads by id, search, export.
        listed = _get(gateway, key, "/api/conversations").text
        assert not any(entry["conversation"] in listed for (k, _), entry in ids.items() if k != key), (
            "another tenant's conversation listed"
        )
        for party, entry in ids.items():
            mine = party[0] == key
            for path in (
                f"/api/conversations/{entry['conversation']}",
                f"/api/conversations/{entry['conversation']}/messages",
                f"/api/conversations/{entry['conversation']}/summaries",
                f"/api/requests/{entry['request']}",
                f"/api/memories/{entry['memory']}",
                f"/dashboard/conversations/{entry['conversation']}",
                f"/dashboard/requests/{entry['request']}",
            ):
                status = _get(gateway, key, path).status_code
                assert status == (200 if mine else 404), (key, path, status)
        for path in (
            f"/api/users/{user}/memories",
            f"/api/users/{user}/memories/export",
            f"/api/users/{user}/profile",
            "/dashboard/conversations",
            f"/dashboard/users/{user}",
        ):
            body = _get(gateway, key, path).text
            assert not any(s in body for s in others), (key, user, path)
        found = _get(gateway, key, f"/api/users/{user}/memories/search", q="locker code").text
        assert secret in found and not any(s in found for s in others)
        searched = _get(gateway, key, "/api/conversations", q=secret).json()["data"]
        assert [c["id"] for c in searched] == [ids[(key, user)]["conversation"]]
        for other in tenant_others:
            assert _get(gateway, key, "/api/conversations", q=other).json()["data"] == []
        # Another tenant's memory cannot be edited or deleted by id.
        for (k, _), entry in ids.items():
            if k == key:
                continue
            url = f"{gateway.server.url}/api/memories/{entry['memory']}"
            auth = {"Authorization": f"Bearer {key}"}
            assert httpx.patch(url, json={"content": "hijacked"}, headers=auth).status_code == 404
            assert httpx.delete(url, headers=auth).status_code == 404
        assert tenant_others  # the sweep had another tenant to look for

    # Every memory is still there, unchanged.
    for (key, user), secret in PARTIES.items():
        data = _get(gateway, key, f"/api/users/{user}/memories").json()["data"]
        assert any(secret in m["content"] for m in data)
        assert not any("hijacked" in m["content"] for m in data)

    # Metrics carry tenant names, routes and statuses as labels; no user id, conversation or text.
    metrics = httpx.get(f"{gateway.server.url}/metrics").text
    for (key, user), entry in ids.items():
        assert entry["conversation"] not in metrics and PARTIES[(key, user)] not in metrics
    assert 'user="' not in metrics and "bob" not in metrics
