"""`context-gateway` command line: serve the gateway, or play the built-in demo."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import click

from gateway.config import GatewayConfig, load_config, parse_config
from gateway.errors import ConfigError
from gateway.telemetry.logs import configure as configure_logging

DEFAULT_UPSTREAM = "https://api.openai.com/v1"


def default_config(env: dict[str, str]) -> GatewayConfig:
    """No config file: one open tenant passing each client's own key through to OpenAI (or
    `OPENAI_BASE_URL`), on the embedded storage defaults."""
    return parse_config(
        {
            "tenants": [
                {
                    "name": "default",
                    "api_keys": [],
                    "upstream": {
                        "base_url": env.get("OPENAI_BASE_URL", DEFAULT_UPSTREAM),
                        "pass_through_client_key": True,
                    },
                }
            ]
        },
        env,
    )


def resolve_config(path: str | None) -> GatewayConfig:
    path = path or os.environ.get("GATEWAY_CONFIG")
    if path:
        return load_config(path)
    return default_config(dict(os.environ))


@click.group()
@click.version_option(package_name="context-gateway")
def main() -> None:
    """context-gateway: an OpenAI-compatible proxy with bounded prompts and long-term memory."""


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (or $GATEWAY_CONFIG)."
)
@click.option("--host", default=None, help="Interface to bind (default: server.host, 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port (default: server.port, 8080).")
def serve(config_path: str | None, host: str | None, port: int | None) -> None:
    """Run the gateway."""
    import uvicorn

    from gateway.app import create_app

    try:
        config = resolve_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    configure_logging(config.server.log_level, config.server.log_format)
    if not (config_path or os.environ.get("GATEWAY_CONFIG")):
        click.echo("No --config given: forwarding to OpenAI with each client's own API key.", err=True)
    uvicorn.run(
        create_app(config),
        host=host or config.server.host,
        port=port or config.server.port,
        log_level=config.server.log_level,
        log_config=None,  # uvicorn's own loggers go through the gateway's handler (text or json)
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (or $GATEWAY_CONFIG)."
)
@click.option("--tenant", required=True, help="Tenant that owns the conversation.")
@click.option("--model", default=None, help="Model for the summarisation calls (default: compaction.model).")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for the summary.")
@click.argument("conversation_id")
def compact(
    config_path: str | None, tenant: str, model: str | None, timeout: float, conversation_id: str
) -> None:
    """Summarise a conversation now: fold what left the recent window (e.g. before a hand-off)."""
    from gateway.ops import compact_now

    try:
        config = resolve_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    try:
        summary = asyncio.run(compact_now(config, tenant, conversation_id, model, timeout, click.echo))
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    if summary is None:
        click.echo("Nothing to summarise: everything is still inside the recent window.")
    else:
        click.echo(summary)


@main.command()
@click.option("--turns", default=6, show_default=True, help="How many scripted user turns to play.")
def demo(turns: int) -> None:
    """Play a scripted chat through the gateway against a built-in local stand-in model."""
    from gateway.demo import run_demo

    sys.exit(run_demo(turns, click.echo))
