"""What the `context-gateway` subcommands share: the config they run on and their common options."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import click

from gateway.config import GatewayConfig, load_config, parse_config
from gateway.errors import ConfigError

DEFAULT_UPSTREAM = "https://api.openai.com/v1"


def default_config(env: dict[str, str]) -> GatewayConfig:
    """No config file: one open tenant passing each client's own key through to OpenAI (or
    `OPENAI_BASE_URL`), on the embedded storage defaults; with `OPENAI_API_KEY` set, the gateway's own
    background calls (summaries, memory) use that key, so every feature is on."""
    upstream: dict[str, Any] = {
        "base_url": env.get("OPENAI_BASE_URL", DEFAULT_UPSTREAM),
        "pass_through_client_key": True,
    }
    if env.get("OPENAI_API_KEY"):
        upstream["api_key"] = env["OPENAI_API_KEY"]
    return parse_config({"tenants": [{"name": "default", "api_keys": [], "upstream": upstream}]}, env)


def resolve_config(path: str | None) -> GatewayConfig:
    path = path or os.environ.get("GATEWAY_CONFIG")
    if path:
        return load_config(path)
    return default_config(dict(os.environ))


CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (or $GATEWAY_CONFIG)."
)
TENANT_OPTION = click.option("--tenant", required=True, help="The tenant whose data to read.")


def config_of(config_path: str | None) -> GatewayConfig:
    try:
        return resolve_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def echo_all(lines: Iterable[str]) -> None:
    for line in lines:
        click.echo(line)
