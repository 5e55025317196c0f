"""Errors the gateway itself produces: OpenAI's shape and a fitting status, before anything goes upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.config import parse_config
from gateway.fakes.server import BackgroundServer
from gateway.http.lanes import Lanes
from gateway.tenants import Tenant, TenantRegistry
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, tenant

AUTH = {"Authorization": f"Bearer {GATEWAY_KEY}"}


def post(gateway: Gateway, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=content,
        headers={**AUTH, "Content-Type": "application/json", **(headers or {})},
    )


def assert_error(response: httpx.Response, status: int, **expected: Any) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    for key, value in expected.items():
        assert error[key] == value, (key, error)
    return error  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, "invalid_json"),
        (b"[1, 2]", None, "invalid_json"),
        (b'{"model": "m"}', "messages", None),
        (b'{"model": "m", "messages": []}', "messages", None),
        (b'{"model": "m", "messages": "hi"}', "messages", None),
        (b'{"model": "m", "messages": ["hi"]}', "messages[0]", None),
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model", None),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream", None),
    ],
)
def test_bad_request_is_400_and_never_forwarded(
    gateway: Gateway, upstream: Upstream, body: bytes, param: str | None, code: str | None
) -> None:
    assert_error(post(gateway, body), 400, type="invalid_request_error", param=param, code=code)
    assert upstream.fake.chat_requests() == []


def test_body_over_the_limit_is_413(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url)], server={"max_body_bytes": 1000})
    big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 2000 + b'"}]}'
    assert_error(post(gateway, big), 413, code="payload_too_large")

    def chunked() -> Any:
        yield big[:500]
        yield big[500:]

    response = httpx.post(f"{gateway.base_url}/chat/completions", content=chunked(), headers=AUTH)
    assert_error(response, 413, code="payload_too_large")
    assert upstream.fake.chat_requests() == []


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer"}],
)
def test_unknown_or_missing_key_is_401(gateway: Gateway, upstream: Upstream, headers: dict[str, str]) -> None:
    response = httpx.post(f"{gateway.base_url}/chat/completions", json={"model": "m"}, headers=headers)
    assert_error(response, 401, code="invalid_api_key", type="invalid_request_error")
    response = httpx.get(f"{gateway.base_url}/models", headers=headers)
    assert_error(response, 401, code="invalid_api_key")
    assert upstream.fake.received == []


def test_unknown_route_and_method(gateway: Gateway) -> None:
    assert_error(httpx.get(f"{gateway.server.url}/nope"), 404, code="not_found")
    assert_error(httpx.post(f"{gateway.server.url}/healthz"), 405, code="method_not_allowed")


def test_healthz_needs_no_key(gateway: Gateway) -> None:
    response = httpx.get(f"{gateway.server.url}/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_an_error_answer_carries_its_request_id_once(gateway: Gateway) -> None:
    response = httpx.get(
        f"{gateway.server.url}/api/conversations/nope", headers={"Authorization": "Bearer sk-gw-acme"}
    )
    assert response.status_code == 404
    assert len(response.headers.get_list("x-gateway-request-id")) == 1


def test_a_door_that_fails_unexpectedly_answers_500_in_openai_shape() -> None:
    """The doors' own lane (gateway/http/lanes.py) does what Starlette's outer layer did for the routes:
    an unexpected error is a 500 in OpenAI's shape with the request id, or, once the answer has begun,
    a connection closed early; other methods and paths still go through the router."""

    async def fails(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("a bug")

    async def fails_midway(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("a bug after the first bytes")

    config = parse_config({"tenants": [tenant("acme", "http://127.0.0.1:9/v1", api_keys=[GATEWAY_KEY])]}, {})
    registry = TenantRegistry([Tenant("acme", config.tenants[0], None, None)])  # type: ignore[arg-type]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        yield {"deps": SimpleNamespace(tenants=registry)}

    routed = Starlette(
        routes=[Route("/v1/door", lambda request: PlainTextResponse("routed"), methods=["GET"])],
        lifespan=lifespan,
    )
    app = Lanes(routed, {"/v1/door": fails, "/v1/midway": fails_midway})
    with BackgroundServer(app) as server:
        failed = httpx.post(f"{server.url}/v1/door", headers=AUTH)
        assert_error(failed, 500, type="server_error")
        assert len(failed.headers["x-gateway-request-id"]) == 32
        assert_error(httpx.post(f"{server.url}/v1/door"), 401)  # the lane authenticates as the router did
        assert httpx.get(f"{server.url}/v1/door").text == "routed"
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{server.url}/v1/midway", headers=AUTH)
