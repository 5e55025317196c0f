"""Factories for real servers on loopback: a fake OpenAI-compatible upstream and the gateway itself."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from anthropic import Anthropic, AsyncAnthropic
from openai import AsyncOpenAI, OpenAI

from gateway.app import create_app
from gateway.config import GatewayConfig, parse_config
from gateway.fakes.openai_upstream import FakeUpstream
from gateway.fakes.server import BackgroundServer
from gateway.services import Deps
from gateway.wiring import build_deps

GATEWAY_KEY = "sk-gw-acme"


class Clock:
    """A settable clock for `make_gateway(..., clock=...)`: stored messages are dated by `now`."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


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

    def anthropic(self, api_key: str = GATEWAY_KEY, **kwargs: Any) -> Anthropic:
        """The official Anthropic SDK pointed at the gateway (it adds /v1 itself; the key goes in x-api-key)."""
        return Anthropic(base_url=self.server.url, api_key=api_key, max_retries=0, **kwargs)

    def async_anthropic(self, api_key: str = GATEWAY_KEY, **kwargs: Any) -> AsyncAnthropic:
        return AsyncAnthropic(base_url=self.server.url, api_key=api_key, max_retries=0, **kwargs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_healthy(url: str, process: subprocess.Popen[Any], timeout: float = 120.0) -> None:
    """Until a gateway started as a process answers `/healthz` (it fails at once if the process died)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, f"the gateway exited with {process.returncode}"
        assert time.monotonic() < deadline, f"the gateway did not answer within {timeout:.0f} s"
        time.sleep(0.2)


def api(gateway: Gateway, path: str, key: str = GATEWAY_KEY) -> Any:
    response = httpx.get(f"{gateway.server.url}/api{path}", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def wait_for_jobs(gateway: Gateway, timeout: float = 60.0) -> dict[str, int]:
    """Until the background queue is idle (embedding, compaction)."""
    deadline = time.monotonic() + timeout
    jobs: dict[str, int] = {}
    while time.monotonic() < deadline:
        jobs = httpx.get(f"{gateway.server.url}/healthz").json()["jobs"]
        if jobs.get("queued", 0) == 0 and jobs.get("running", 0) == 0:
            return jobs
        time.sleep(0.05)
    raise AssertionError(f"jobs still pending after {timeout}s: {jobs}")


def recorded(gateway: Gateway, request_id: str, key: str = GATEWAY_KEY) -> None:
    """Until the request's record is stored: its jobs are queued in the same transaction, after the last
    byte (so `wait_for_jobs` cannot miss them)."""
    for _ in range(500):
        response = httpx.get(
            f"{gateway.server.url}/api/requests/{request_id}", headers={"Authorization": f"Bearer {key}"}
        )
        if response.status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError(f"request {request_id} was never recorded")


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    fake = FakeUpstream()
    with BackgroundServer(fake.app()) as server:
        yield Upstream(fake, server)


def tenant(name: str, base_url: str, **upstream: Any) -> dict[str, Any]:
    """A tenant config; tenant-level keys go to the tenant, the rest to its upstream."""
    tenant_keys = (
        "context",
        "identity",
        "compaction",
        "retrieval",
        "memory",
        "store_conversations",
        "limits",
    )
    extra = {key: upstream.pop(key) for key in tenant_keys if key in upstream}
    # Memory is on by default; tests of other features leave it out unless they ask for it.
    extra.setdefault("memory", {"enabled": False})
    keys = upstream.pop("api_keys", [f"sk-gw-{name}"])
    upstream = {"base_url": base_url, "api_key": "sk-upstream", **upstream}
    return {"name": name, "api_keys": keys, "upstream": upstream, **extra}


def real_parts(request: pytest.FixtureRequest) -> bool:
    """Tests marked `real` (or in a module marked so) run on the ONNX model and LanceDB; the rest on
    the shipped fakes, chosen by config as a user would (`embedder: {provider: fake}`, `index: memory`)."""
    return request.node.get_closest_marker("real") is not None


def with_fakes(tenants: list[dict[str, Any]], sections: dict[str, Any]) -> None:
    """The fake embedder for tenants that name no embedder, and the in-process index, unless set."""
    for t in tenants:
        embedder = t.setdefault("retrieval", {}).setdefault("embedder", {})
        if "provider" not in embedder and "model" not in embedder:
            embedder["provider"] = "fake"
    advanced = sections.setdefault("advanced", {}).setdefault("storage", {})
    if "index" not in sections.get("storage", {}):
        advanced.setdefault("index", "memory")


@pytest.fixture
def make_gateway(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Gateway]]:
    started: list[BackgroundServer] = []
    owned: list[Deps] = []
    fakes = not real_parts(request)

    def factory(
        tenants: list[dict[str, Any]], clock: Callable[[], datetime] | None = None, **sections: Any
    ) -> Gateway:
        """A gateway on loopback; with `clock`, stored messages are dated by it (a settable clock)."""
        sections.setdefault(
            "storage",
            {"database_url": f"sqlite:///{tmp_path}/gateway.db", "data_dir": str(tmp_path / "data")},
        )
        if fakes:
            with_fakes(tenants, sections)
        config = parse_config({"tenants": tenants, **sections}, {})
        deps = None
        if clock is not None:
            deps = build_deps(config, clock=clock)
            owned.append(deps)
        server = BackgroundServer(
            create_app(config, deps), keep_alive_seconds=config.server.keep_alive_seconds
        ).start()
        started.append(server)
        return Gateway(server, config)

    yield factory
    for server in started:
        server.stop()
    for deps in owned:  # the app's lifespan closes only what it built itself
        asyncio.run(deps.aclose())


@pytest.fixture
def gateway(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway([tenant("acme", upstream.base_url)])


POSTGRES_URL = os.environ.get(
    "GATEWAY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def postgres_available() -> bool:
    try:
        with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: a SQLite file, or a schema of its own on this machine's Postgres.

    Postgres tests skip only outside CI when no server is reachable; in CI they must run."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/store.db"
        return
    if not postgres_available():
        if os.environ.get("CI"):
            pytest.fail(f"Postgres is not reachable at {POSTGRES_URL} (CI must run the Postgres tests)")
        pytest.skip(f"Postgres is not reachable at {POSTGRES_URL}")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = POSTGRES_URL.replace("+psycopg", "")
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')
