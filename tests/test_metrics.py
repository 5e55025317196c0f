"""`GET /metrics`: scraped from a real gateway and parsed with prometheus_client's own parser; its numbers
must move with the traffic the official SDKs send, and docs/operations.md must list every metric."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.fakes.openai_upstream import Reply
from gateway.metrics import Counters
from gateway.telemetry.logs import JsonFormatter
from gateway.telemetry.metrics import Metrics
from tests.conftest import Gateway, Upstream, recorded, tenant, wait_for_jobs

METRICS_DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def scrape(gateway: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{gateway.server.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_with_traffic_through_every_door(gateway: Gateway, upstream: Upstream) -> None:
    before = scrape(gateway)
    chat = {"route": "/v1/chat/completions", "tenant": "acme"}
    assert value(before, "gateway_requests_total", **chat, status="200", stream="false") == 0

    client = gateway.client()
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Count me."}]
    )
    recorded(gateway, raw.headers["x-gateway-request-id"])
    for _ in client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Stream me."}], stream=True
    ):
        pass
    gateway.anthropic(api_key="sk-gw-acme").messages.create(
        model="claude-x", max_tokens=20, messages=[{"role": "user", "content": "And me."}]
    )
    client.responses.create(model="gpt-4o", input="Me too.")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o", messages=[])
    upstream.fake.enqueue(Reply(status=503, error={"message": "busy", "type": "server_error"}))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Fail."}])
    wait_for_jobs(gateway)

    after = scrape(gateway)
    assert value(after, "gateway_requests_total", **chat, status="200", stream="false") == 1
    assert value(after, "gateway_requests_total", **chat, status="200", stream="true") == 1
    assert value(after, "gateway_requests_total", **chat, status="400", stream="false") == 1
    assert value(after, "gateway_requests_total", **chat, status="503", stream="false") == 1
    for route in ("/v1/messages", "/v1/responses"):
        assert (
            value(after, "gateway_requests_total", route=route, tenant="acme", status="200", stream="false")
            == 1
        )
    # The stream is counted when it closes, with its own timings.
    assert value(after, "gateway_overhead_seconds_count", route="/v1/chat/completions") == 3
    assert value(after, "gateway_upstream_seconds_count", route="/v1/messages") == 1
    assert value(after, "gateway_overhead_seconds_sum", route="/v1/chat/completions") > 0
    sent = value(after, "gateway_context_tokens_total", tenant="acme", kind="sent")
    original = value(after, "gateway_context_tokens_total", tenant="acme", kind="original")
    assert sent > 0 and original >= sent
    # Background work: the embed jobs the exchanges queued ran, and the queue is reported by status.
    assert value(after, "gateway_job_runs_total", kind="embed", outcome="done") >= 1
    assert value(after, "gateway_job_seconds_count", kind="embed") >= 1
    assert value(after, "gateway_jobs", status="done") >= 1
    assert (
        value(after, "gateway_upstream_errors_total") == 0
    )  # a 503 answer is the provider's, not a failure to reach it
    assert ("gateway_fail_open_total", ()) in after


def parcel_notes(count: int) -> list[dict[str, str]]:
    """A history of `count` exchanges, each naming a parcel code: long enough to outgrow a small budget."""
    history: list[dict[str, str]] = []
    for n in range(count):
        history += [
            {"role": "user", "content": f"Note {n}: the parcel code for the warehouse order is PX-{n * 37}."},
            {"role": "assistant", "content": f"Noted {n}, the parcel code is filed with the order."},
        ]
    return history


def test_context_sections_report_their_time(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, context={"budget_tokens": 400})])
    client = gateway.client()
    history = parcel_notes(40)
    history.append({"role": "user", "content": "Which parcel code was note 3?"})
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    recorded(gateway, raw.headers["x-gateway-request-id"])
    samples = scrape(gateway)
    for section in ("summary", "retrieval"):  # the history is over budget: the sections were asked
        assert value(samples, "gateway_context_section_seconds_count", section=section) == 1
    assert value(samples, "gateway_context_section_seconds_sum", section="retrieval") > 0


@pytest.mark.real
def test_what_each_cache_holds_is_shown_as_it_fills(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """A long history asked about fills the node cache, the history memo, retrieval's memo, the token
    counts, and once indexed the vector cache and LanceDB's: /metrics shows each by owner, /healthz
    their totals."""
    gateway = make_gateway([tenant("acme", upstream.base_url, context={"budget_tokens": 400})])
    empty = httpx.get(f"{gateway.server.url}/healthz").json()["caches_mb"]
    assert empty.get("vectors", 0) == 0 and empty.get("history_memo", 0) == 0
    client = gateway.client()
    ask = [*parcel_notes(40), {"role": "user", "content": "Which parcel code was note 3?"}]
    client.chat.completions.create(model="gpt-4o", messages=ask)
    wait_for_jobs(gateway)
    client.chat.completions.create(
        model="gpt-4o", messages=[*ask[:-1], {"role": "user", "content": "And 5?"}]
    )
    samples = scrape(gateway)
    for cache, owner in [
        ("nodes", "process"),
        ("token_counts", "process"),
        ("vectors", "process"),
        ("lancedb", "process"),
        ("history_memo", "acme"),
        ("retrieval_memo", "acme"),
    ]:
        assert value(samples, "gateway_cache_bytes", cache=cache, owner=owner) > 0, cache
    # 80 stored messages at the documented ~560 bytes a node; three views each in the vector cache.
    assert value(samples, "gateway_cache_bytes", cache="nodes", owner="process") >= 80 * 560
    assert value(samples, "gateway_cache_bytes", cache="vectors", owner="process") >= 80 * 4 * 384
    totals = httpx.get(f"{gateway.server.url}/healthz").json()["caches_mb"]
    assert totals["vectors"] > 0 and totals["history_memo"] > 0 and totals["lancedb"] > 0


def test_every_metric_is_documented() -> None:
    """docs/operations.md's "Metrics and logs" section names each metric family the gateway exports."""
    text = METRICS_DOC.read_text()
    section = text.split("## Metrics and logs", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(gateway_[a-z_]+)`", section))
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in Metrics(Counters()).registry.collect()
    }
    assert exported, "no metrics exported"
    assert exported - documented == set(), "undocumented metrics"
    assert documented - exported == set(), "documented metrics that do not exist"


def test_one_log_line_per_request_with_ids_and_numbers_but_no_keys_or_text(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.requests")
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "My secret plan is AZURE-FALCON."}],
        extra_headers={"X-User-Id": "u-log"},
    )
    recorded(gateway, raw.headers["x-gateway-request-id"])
    lines = [r for r in caplog.records if r.name == "gateway.requests"]
    assert len(lines) == 1
    line = json.loads(JsonFormatter().format(lines[0]))
    assert line["message"] == "request" and line["level"] == "info"
    assert line["id"] == raw.headers["x-gateway-request-id"]
    assert line["tenant"] == "acme" and line["route"] == "/v1/chat/completions" and line["status"] == 200
    assert line["conversation"] == raw.headers["x-conversation-id"] and line["user"] == "u-log"
    assert line["tokens_sent"] > 0 and line["overhead_ms"] >= 0 and line["upstream_ms"] >= 0
    text = json.dumps(line) + lines[0].getMessage()
    assert "AZURE-FALCON" not in text and "sk-gw-acme" not in text and "sk-upstream" not in text


def test_the_served_gateway_writes_json_log_lines(upstream: Upstream, tmp_path: Path) -> None:
    """`context-gateway serve` with `server.log_format: json`: every line on stderr is a JSON object, and
    the request's line carries its fields."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = {
        "server": {"log_format": "json", "log_level": "info"},
        "storage": {"database_url": f"sqlite:///{tmp_path}/g.db", "data_dir": str(tmp_path / "data")},
        "tenants": [tenant("acme", upstream.base_url)],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port)]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as process:
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-gw-acme", max_retries=0
            )
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Log me."}])
        finally:
            process.send_signal(signal.SIGINT)
            _, errors = process.communicate(timeout=30)
    lines = [json.loads(line) for line in errors.splitlines() if line.strip()]
    requests = [line for line in lines if line.get("logger") == "gateway.requests"]
    assert len(requests) == 1 and requests[0]["status"] == 200 and requests[0]["tenant"] == "acme"
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
