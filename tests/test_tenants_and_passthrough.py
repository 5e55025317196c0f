"""Gateway keys pick the tenant and its upstream; other /v1 paths pass straight through."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.config import hash_key
from gateway.fakes.openai_upstream import FakeUpstream
from gateway.fakes.server import BackgroundServer
from tests.conftest import Gateway, Upstream, tenant

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def second_upstream() -> Iterator[Upstream]:
    fake = FakeUpstream(model="other-model")
    with BackgroundServer(fake.app()) as server:
        yield Upstream(fake, server)


def test_each_key_reaches_its_own_tenants_upstream(
    upstream: Upstream, second_upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [
            tenant("acme", upstream.base_url, api_key="sk-acme-provider"),
            tenant(
                "globex",
                second_upstream.base_url,
                api_key="sk-globex-provider",
                api_keys=[f"sha256:{hash_key('sk-gw-globex')}", "sk-gw-globex-2"],
            ),
        ]
    )
    gateway.client("sk-gw-acme").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    for key in ("sk-gw-globex", "sk-gw-globex-2"):
        gateway.client(key).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert [r.headers["authorization"] for r in upstream.fake.received] == ["Bearer sk-acme-provider"]
    assert [r.headers["authorization"] for r in second_upstream.fake.received] == [
        "Bearer sk-globex-provider"
    ] * 2
    assert gateway.client("sk-gw-globex").models.list().data[0].id == "other-model"


def test_pass_through_tenant_forwards_the_clients_own_key(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [tenant("open", upstream.base_url, api_keys=[], api_key=None, pass_through_client_key=True)]
    )
    gateway.client("sk-users-own-openai-key").chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert upstream.fake.last().headers["authorization"] == "Bearer sk-users-own-openai-key"


def test_gateway_key_header_names_tenant_and_bearer_goes_upstream(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway([tenant("byok", upstream.base_url, api_key=None, pass_through_client_key=True)])
    client = gateway.client("sk-provider-key", default_headers={"X-Gateway-Key": "sk-gw-byok"})
    client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    received = upstream.fake.last()
    assert received.headers["authorization"] == "Bearer sk-provider-key"
    assert "x-gateway-key" not in received.headers
    bad = gateway.client("sk-provider-key", default_headers={"X-Gateway-Key": "wrong"})
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]


def test_embeddings_and_models_pass_through_unchanged(gateway: Gateway, upstream: Upstream) -> None:
    direct = OpenAI(base_url=upstream.base_url, api_key="sk-upstream", max_retries=0)
    want = direct.embeddings.create(model="emb", input=["a", "bcd"])
    got = gateway.client().embeddings.create(model="emb", input=["a", "bcd"])
    assert got.model_dump() == want.model_dump()
    assert gateway.client().models.list().model_dump() == direct.models.list().model_dump()
    received = upstream.fake.last()
    assert received.path == "/v1/models"
    assert received.headers["authorization"] == "Bearer sk-upstream"


def test_unknown_upstream_path_keeps_the_upstreams_status(gateway: Gateway) -> None:
    response = httpx.get(
        f"{gateway.base_url}/no/such/thing?x=1", headers={"Authorization": "Bearer sk-gw-acme"}
    )
    assert response.status_code == 404
    assert response.text == "Not Found"
    assert "x-gateway-overhead-ms" in response.headers
