"""Per-tenant limits: a request rate (429 in the door's shape with Retry-After) and a body size (413)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import anthropic
import httpx
import openai
import pytest

from gateway.limits import RateLimiter, retry_after_header
from tests.conftest import Gateway, Upstream, api, tenant

HELLO = [{"role": "user", "content": "hello"}]


def test_the_bucket_refills_at_the_rate_and_holds_at_most_the_burst() -> None:
    now = [100.0]
    limiter = RateLimiter(60, burst=2, clock=lambda: now[0])
    assert limiter.take() is None
    assert limiter.take() is None
    wait = limiter.take()
    assert wait == pytest.approx(1.0)  # one a second
    now[0] += 0.5
    assert limiter.take() == pytest.approx(0.5)
    now[0] += 0.5
    assert limiter.take() is None
    now[0] += 3600  # a quiet hour fills the bucket to its size, no more
    assert [limiter.take() for _ in range(3)][:2] == [None, None]
    assert retry_after_header(0.2) == b"1"
    assert retry_after_header(2.01) == b"3"


@pytest.fixture
def limited(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> Iterator[Gateway]:
    yield make_gateway(
        [
            tenant("acme", upstream.base_url, limits={"requests_per_minute": 6, "burst": 2}),
            tenant("other", upstream.base_url),
        ]
    )


def test_a_tenant_over_its_rate_gets_429_with_retry_after_and_nothing_goes_upstream(
    limited: Gateway, upstream: Upstream
) -> None:
    client = limited.client("sk-gw-acme")
    for _ in range(2):
        client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    response = caught.value.response
    assert response.status_code == 429
    assert response.headers["retry-after"] == "10"  # 6 a minute: one every 10 s
    error = response.json()["error"]
    assert error["type"] == "requests"
    assert error["code"] == "rate_limit_exceeded"
    assert "'acme'" in error["message"] and "6 requests a minute" in error["message"]
    assert len(upstream.fake.chat_requests()) == 2

    # The REST API counts too; the refusal is JSON in OpenAI's shape.
    refused = httpx.get(
        f"{limited.server.url}/api/conversations", headers={"Authorization": "Bearer sk-gw-acme"}
    )
    assert refused.status_code == 429 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"

    # Another tenant has its own bucket (none here).
    other = limited.client("sk-gw-other")
    for _ in range(5):
        other.chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    assert api(limited, "/conversations", key="sk-gw-other")["data"]


def test_the_messages_door_refuses_in_anthropics_shape(limited: Gateway) -> None:
    client = limited.anthropic("sk-gw-acme")
    for _ in range(2):
        client.messages.create(model="claude-x", max_tokens=10, messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="claude-x", max_tokens=10, messages=HELLO)  # type: ignore[arg-type]
    body = caught.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert caught.value.response.headers["retry-after"] == "10"


def test_a_tenants_body_limit_holds_on_chat_and_on_the_rest_api(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [
            tenant("acme", upstream.base_url, limits={"max_body_bytes": 2000}, memory={"enabled": True}),
            tenant("other", upstream.base_url),
        ]
    )
    big = [{"role": "user", "content": "x" * 3000}]
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.client("sk-gw-acme").chat.completions.create(model="m", messages=big)  # type: ignore[arg-type]
    assert caught.value.status_code == 413
    assert caught.value.response.json()["error"]["code"] == "payload_too_large"
    assert upstream.fake.chat_requests() == []
    gateway.client("sk-gw-other").chat.completions.create(model="m", messages=big)  # type: ignore[arg-type]
    assert len(upstream.fake.chat_requests()) == 1

    url = f"{gateway.server.url}/api/users/ann/memories"
    auth = {"Authorization": "Bearer sk-gw-acme", "Content-Type": "application/json"}
    body = b'{"content": "' + b"y" * 3000 + b'"}'
    declared = httpx.post(url, content=body, headers=auth)
    assert declared.status_code == 413, declared.text
    assert declared.json()["error"]["code"] == "payload_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted while read
        yield body[:1000]
        yield body[1000:]

    streamed = httpx.post(url, content=chunked(), headers=auth)
    assert streamed.status_code == 413, streamed.text
    assert api(gateway, "/users/ann/memories", key="sk-gw-acme")["data"] == []
    small = httpx.post(url, json={"content": "Ann likes tea."}, headers=auth)
    assert small.status_code in (200, 201), small.text
