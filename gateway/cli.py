"""`context-gateway` command line: serve the gateway, read what it stored (conversations, show, context,
jobs, memories), load exported histories (import), summarise now (compact), index again (reindex), or
play the built-in demo."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click
from starlette.types import ASGIApp

from gateway.cli_common import DEFAULT_UPSTREAM, default_config, resolve_config
from gateway.cli_data import import_file, memories, reindex
from gateway.cli_read import context, conversations, jobs, show, verify
from gateway.collector import trimming_heap, tune_for_serving, tune_malloc
from gateway.config import GatewayConfig
from gateway.errors import ConfigError
from gateway.heap_probe import install_from_env as heap_probe
from gateway.telemetry.logs import configure as configure_logging


@click.group()
@click.version_option(package_name="context-gateway")
def main() -> None:
    """context-gateway: an OpenAI-compatible proxy with bounded prompts and long-term memory."""


for _command in (conversations, show, context, jobs, import_file, reindex, verify, memories):
    main.add_command(_command)


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (or $GATEWAY_CONFIG)."
)
@click.option("--host", default=None, help="Interface to bind (default: server.host, 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port (default: server.port, 8080).")
@click.option(
    "--workers",
    default=1,
    type=click.IntRange(1, 64),
    help="Processes serving the port (default 1): each with its own caches and job workers, all on the "
    "same database and index. BENCHMARKS.md says when more help.",
)
def serve(config_path: str | None, host: str | None, port: int | None, workers: int) -> None:
    """Run the gateway."""
    tune_malloc()  # before any thread allocates
    import uvicorn

    from gateway.app import create_app

    try:
        config = resolve_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    configure_logging(config.server.log_level, config.server.log_format)
    if config.tracing.otlp_endpoint is not None:  # said now, not as a traceback from the lifespan
        try:
            import gateway.adapters.otel_tracer  # noqa: F401
        except ImportError as exc:
            raise click.ClickException(
                'tracing.otlp_endpoint is set but OpenTelemetry is not installed: pip install "context-gateway[otel]"'
            ) from exc
    _raise_open_file_limit(config)
    from gateway.startup import startup_block

    host, port = host or config.server.host, port or config.server.port
    block = startup_block(config, host, port)
    if not (config_path or os.environ.get("GATEWAY_CONFIG")):
        block = "No --config given: the defaults, forwarding to $OPENAI_BASE_URL or OpenAI.\n" + block
    if config.server.log_format == "json":
        logging.getLogger("gateway.startup").info(block)  # one JSON record, as every other line
    else:
        click.echo(block, err=True)
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": config.server.log_level,
        "log_config": None,  # uvicorn's own loggers go through the gateway's handler (text or json)
        "access_log": False,
        "loop": "uvloop",
        "http": "httptools",
        "timeout_graceful_shutdown": config.server.shutdown_grace_seconds,
        "timeout_keep_alive": config.server.keep_alive_seconds,
    }
    if workers == 1:
        app = create_app(config)
        tune_for_serving()
        heap_probe()
        uvicorn.run(app, **options)
        return
    if config_path:  # each worker process reads the same file (worker_app)
        os.environ["GATEWAY_CONFIG"] = str(Path(config_path).resolve())
    uvicorn.run("gateway.cli:worker_app", factory=True, workers=workers, **options)


def worker_app() -> ASGIApp:
    """The app of each `serve --workers N` process, built from $GATEWAY_CONFIG (or the defaults)."""
    tune_malloc()
    from gateway.app import create_app

    config = resolve_config(None)
    configure_logging(config.server.log_level, config.server.log_format)
    app = create_app(config)
    tune_for_serving()
    heap_probe()
    return app


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (or $GATEWAY_CONFIG)."
)
@click.option(
    "--nice",
    type=click.IntRange(0, 19),
    default=10,
    show_default=True,
    help="Added to the worker's CPU niceness: on cores it shares with the server, the requests come first "
    "(0: the same priority as the server).",
)
def worker(config_path: str | None, nice: int) -> None:
    """Run the background jobs only, no HTTP (summaries, embedding, memory), on the same database and
    index as `serve`: give background work cores of its own and run the server with `jobs.workers: 0`."""
    # First, before any thread starts: Linux keeps a niceness per thread, and new threads inherit it.
    os.nice(nice)
    tune_malloc()
    try:
        config = resolve_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    if config.jobs.workers < 1:
        raise click.ClickException("jobs.workers is 0: a worker process needs at least one job worker")
    configure_logging(config.server.log_level, config.server.log_format)
    asyncio.run(_work(config))


async def _work(config: GatewayConfig) -> None:
    """Until SIGTERM or SIGINT: jobs leased, run and stopped as the server's own workers would be."""
    import signal

    from gateway.wiring import build_deps

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    deps = build_deps(config)
    tune_for_serving()
    heap_probe()
    try:
        async with deps.workers.running(), trimming_heap():
            logging.getLogger("gateway.worker").info(
                "context-gateway worker: %d job workers on %s",
                config.jobs.workers,
                config.storage.database_url,
            )
            await stop.wait()
    finally:
        await deps.aclose()


def _raise_open_file_limit(config: GatewayConfig) -> None:
    """Every stream holds two sockets (client and upstream): lift the soft open-file limit to the hard
    one (often 1,024 soft), and say so when even that is below what the pools may open."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    needed = 2 * max((t.upstream.max_connections for t in config.tenants), default=0) + 256
    if soft != resource.RLIM_INFINITY and soft < needed:
        logging.getLogger("gateway").warning(
            "open-file limit %d is below %d (two sockets per stream at upstream.max_connections): "
            "streams beyond about %d will fail; raise it (ulimit -n)",
            soft,
            needed,
            max(soft - 256, 0) // 2,
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
@click.option(
    "--turns", default=16, show_default=True, help="Turns between the booking code and the question."
)
@click.option(
    "--keep", is_flag=True, help="Keep the gateway up afterwards, for the dashboard (Ctrl+C stops)."
)
def demo(turns: int, keep: bool) -> None:
    """Play a scripted story through the gateway against a built-in local stand-in model: retrieval from
    far back, a summary, and memory in a new conversation."""
    from gateway.demo import run_demo

    sys.exit(run_demo(turns, click.echo, keep=keep))


__all__ = ["DEFAULT_UPSTREAM", "default_config", "main", "resolve_config", "worker_app"]
