"""Upstream errors pass through; broken, slow and abandoned streams end the way OpenAI clients expect."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from gateway.fakes.openai_upstream import Reply
from tests.conftest import Gateway, Upstream, tenant

MESSAGES = [{"role": "user", "content": "hi"}]
RATE_LIMIT = {
    "message": "Rate limit reached",
    "type": "requests",
    "param": None,
    "code": "rate_limit_exceeded",
}


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_error_passes_through_with_status_and_body(
    gateway: Gateway, upstream: Upstream, stream: bool
) -> None:
    upstream.fake.enqueue(Reply(status=429, error=RATE_LIMIT))
    with pytest.raises(openai.RateLimitError) as caught:
        gateway.client().chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
    assert caught.value.status_code == 429
    assert caught.value.body == RATE_LIMIT


def test_stream_broken_mid_way_ends_with_in_band_error(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply("one two three four five six seven", break_after_chunks=3))
    stream = gateway.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "one two"  # role chunk, "one", " two", then the break
    assert "upstream" in caught.value.message


def test_client_disconnect_cancels_the_upstream_request(gateway: Gateway, upstream: Upstream) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    upstream.fake.enqueue(Reply(words, chunk_delay=0.05))
    stream = gateway.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    for number, _ in enumerate(stream):
        if number == 2:
            break
    stream.close()
    assert wait_for(lambda: upstream.fake.disconnects == 1), "upstream never saw the cancellation"
    health = httpx.get(f"{gateway.server.url}/healthz").json()
    assert health["counters"]["client_disconnects"] == 1


def test_unreachable_upstream_is_502(make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", f"http://127.0.0.1:{free_port()}/v1")])
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as caught:
            gateway.client().chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
        assert caught.value.status_code == 502
        assert caught.value.body["code"] == "upstream_unreachable"  # type: ignore[index]
        assert caught.value.body["type"] == "upstream_error"  # type: ignore[index]


@pytest.mark.parametrize("http_client", ["httpx", "httpx-aiohttp"])
def test_slow_upstream_is_504(
    upstream: Upstream, make_gateway: Callable[..., Gateway], http_client: str
) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, timeout_seconds=0.3, http_client=http_client)])
    upstream.fake.enqueue(Reply("late", delay=1.5))
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.client().chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == 504
    assert caught.value.body["code"] == "upstream_timeout"  # type: ignore[index]


def test_stalled_stream_times_out_in_band(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, timeout_seconds=0.3)])
    upstream.fake.enqueue(Reply("first then a long silence", chunk_delay=1.0))
    stream = gateway.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError) as caught:
        for _ in stream:
            pass
    assert "timed out" in caught.value.message
