"""Factories for real servers on loopback: a fake OpenAI-compatible upstream and the gateway itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI

from gateway.app import create_app
from gateway.config import GatewayConfig, parse_config
from gateway.fakes.openai_upstream import FakeUpstream
from gateway.fakes.server import BackgroundServer

GATEWAY_KEY = "sk-gw-acme"


@dataclass
class Upstream:
    fake: FakeUpstream
    server: BackgroundServer

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"


@dataclass
class Gateway:
    server: BackgroundServer
    config: GatewayConfig

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"

    def client(self, api_key: str = GATEWAY_KEY, **kwargs: Any) -> OpenAI:
        return OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, **kwargs)

    def async_client(self, api_key: str = GATEWAY_KEY, **kwargs: Any) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, **kwargs)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    fake = FakeUpstream()
    with BackgroundServer(fake.app()) as server:
        yield Upstream(fake, server)


def tenant(name: str, base_url: str, **upstream: Any) -> dict[str, Any]:
    keys = upstream.pop("api_keys", [f"sk-gw-{name}"])
    return {
        "name": name,
        "api_keys": keys,
        "upstream": {"base_url": base_url, "api_key": "sk-upstream", **upstream},
    }


@pytest.fixture
def make_gateway(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    started: list[BackgroundServer] = []

    def factory(tenants: list[dict[str, Any]], **sections: Any) -> Gateway:
        sections.setdefault(
            "storage",
            {"database_url": f"sqlite:///{tmp_path}/gateway.db", "data_dir": str(tmp_path / "data")},
        )
        config = parse_config({"tenants": tenants, **sections}, {})
        server = BackgroundServer(create_app(config)).start()
        started.append(server)
        return Gateway(server, config)

    yield factory
    for server in started:
        server.stop()


@pytest.fixture
def gateway(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway([tenant("acme", upstream.base_url)])
