"""`GET /metrics`: scraped from a real gateway and parsed with prometheus_client's own parser; its numbers
must move with the traffic the official SDKs send, and README must list every metric."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.fakes.openai_upstream import Reply
from gateway.metrics import Counters
from gateway.telemetry.metrics import Metrics
from tests.conftest import Gateway, Upstream, recorded, tenant, wait_for_jobs

README = Path(__file__).resolve().parent.parent / "README.md"


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


def test_context_sections_report_their_time(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, context={"budget_tokens": 400})])
    client = gateway.client()
    history: list[dict[str, str]] = []
    for n in range(40):
        history += [
            {"role": "user", "content": f"Note {n}: the parcel code is PX-{n * 37}."},
            {"role": "assistant", "content": f"Noted {n}."},
        ]
    history.append({"role": "user", "content": "Which parcel code was note 3?"})
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    recorded(gateway, raw.headers["x-gateway-request-id"])
    samples = scrape(gateway)
    for section in ("summary", "retrieval"):  # the history is over budget: the sections were asked
        assert value(samples, "gateway_context_section_seconds_count", section=section) == 1
    assert value(samples, "gateway_context_section_seconds_sum", section="retrieval") > 0


def test_every_metric_is_documented() -> None:
    """README's "Metrics" section names each metric family the gateway exports."""
    text = README.read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(gateway_[a-z_]+)`", section))
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in Metrics(Counters()).registry.collect()
    }
    assert exported, "no metrics exported"
    assert exported - documented == set(), "undocumented metrics"
    assert documented - exported == set(), "documented metrics that do not exist"
