"""`context-gateway` command line: serve the gateway, read what it stored (conversations, show, context,
jobs, memories), load exported histories (import), summarise now (compact), index again (reindex), or
play the built-in demo."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
from starlette.types import ASGIApp

from gateway.collector import tune_for_serving
from gateway.config import GatewayConfig, PricingConfig, load_config, parse_config
from gateway.errors import ConfigError
from gateway.records import RequestRecord
from gateway.telemetry.logs import configure as configure_logging

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
@click.option(
    "--workers",
    default=1,
    type=click.IntRange(1, 64),
    help="Processes serving the port (default 1): each with its own caches and job workers, all on the "
    "same database and index. BENCHMARKS.md says when more help.",
)
def serve(config_path: str | None, host: str | None, port: int | None, workers: int) -> None:
    """Run the gateway."""
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
        uvicorn.run(app, **options)
        return
    if config_path:  # each worker process reads the same file (worker_app)
        os.environ["GATEWAY_CONFIG"] = str(Path(config_path).resolve())
    uvicorn.run("gateway.cli:worker_app", factory=True, workers=workers, **options)


def worker_app() -> ASGIApp:
    """The app of each `serve --workers N` process, built from $GATEWAY_CONFIG (or the defaults)."""
    from gateway.app import create_app

    config = resolve_config(None)
    configure_logging(config.server.log_level, config.server.log_format)
    app = create_app(config)
    tune_for_serving()
    return app


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (or $GATEWAY_CONFIG)."
)
def worker(config_path: str | None) -> None:
    """Run the background jobs only, no HTTP (summaries, embedding, memory), on the same database and
    index as `serve`: give background work cores of its own and run the server with `jobs.workers: 0`."""
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
    try:
        async with deps.workers.running():
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


CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config (or $GATEWAY_CONFIG)."
)
TENANT_OPTION = click.option("--tenant", required=True, help="The tenant whose data to read.")


def _config(config_path: str | None) -> GatewayConfig:
    try:
        return resolve_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _echo_all(lines: Iterable[str]) -> None:
    for line in lines:
        click.echo(line)


@main.command()
@CONFIG_OPTION
@TENANT_OPTION
@click.option("--user", default=None, help="Only this user's conversations.")
@click.option("--limit", default=50, show_default=True, help="How many, newest first.")
@click.option("--text", default="", help="Only those with a message holding this text.")
@click.option("--since", default="", help="Active since (a date, 2026-03-01, or an ISO time).")
@click.option("--until", default="", help="Active until (a date: that whole day, or an ISO time).")
def conversations(
    config_path: str | None,
    tenant: str,
    user: str | None,
    limit: int,
    text: str,
    since: str,
    until: str,
) -> None:
    """List a tenant's conversations, newest first."""
    from gateway import ops
    from gateway.cli_views import conversation_rows
    from gateway.errors import InvalidRequest
    from gateway.http.api import conversation_filter

    try:
        where = conversation_filter({"q": text, "since": since, "until": until})
    except InvalidRequest as exc:
        raise click.BadParameter(exc.message.replace("'q'", "'text'")) from exc
    found = asyncio.run(
        ops.list_conversations(
            _config(config_path), tenant, user, limit, where.text, where.since, where.until
        )
    )
    _echo_all(conversation_rows(found))


@main.command()
@CONFIG_OPTION
@TENANT_OPTION
@click.argument("conversation_id")
def show(config_path: str | None, tenant: str, conversation_id: str) -> None:
    """Show a conversation as its message tree, branches drawn."""
    from gateway import ops
    from gateway.cli_views import tree_lines

    try:
        conversation, messages = asyncio.run(
            ops.conversation_tree(_config(config_path), tenant, conversation_id)
        )
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    _echo_all(tree_lines(conversation, messages))


@main.command()
@CONFIG_OPTION
@TENANT_OPTION
@click.option("--messages", is_flag=True, help="Also print every message sent, whole, in order.")
@click.argument("request_or_conversation_id")
def context(config_path: str | None, tenant: str, request_or_conversation_id: str, messages: bool) -> None:
    """Show what a request sent upstream and why (its ContextReport) and what the provider's prompt cache
    did (cached, written and uncached input tokens).

    Given a conversation's id instead: each of its requests with those figures and its cost, then the
    conversation's cache-hit share (cached input over all input) and its effective cost against full
    replay, priced by the tenant's `pricing`. Full replay is an estimate: each request's input plus what
    the gateway left out of the history, the share of it that the previous request's history covers
    (its original tokens over this one's, at most 1) priced as cached.
    """
    from gateway import ops
    from gateway.cli_views import context_lines, conversation_cost_lines, sent_lines

    config = _config(config_path)
    wanted = request_or_conversation_id
    try:
        record, path = asyncio.run(ops.request_record(config, tenant, wanted))
    except LookupError as exc:
        records = asyncio.run(_conversation_requests(config, tenant, wanted))
        if not records:
            raise click.ClickException(f"{exc}; no conversation with requests either") from exc
        from gateway.cache_cost import conversation_cost

        pricing = next((t.pricing for t in config.tenants if t.name == tenant), PricingConfig())
        _echo_all(conversation_cost_lines(wanted, conversation_cost(records, pricing)))
        return
    _echo_all(context_lines(record))
    _echo_all(sent_lines(record, path, whole=messages))


async def _conversation_requests(
    config: GatewayConfig, tenant: str, conversation_id: str
) -> list[RequestRecord]:
    """Every request record of a conversation, oldest first."""
    from gateway.adapters.sql.store import SqlStore

    store = SqlStore.open(config.storage.database_url)
    found: list[RequestRecord] = []
    try:
        while True:
            page = await store.list_requests(
                tenant, conversation_id=conversation_id, limit=500, offset=len(found)
            )
            found += page
            if len(page) < 500:
                break
    finally:
        await store.aclose()
    return sorted(found, key=lambda r: r.created_at)


@main.command()
@CONFIG_OPTION
@click.option("--tenant", default=None, help="Only this tenant's jobs (default: all).")
def jobs(config_path: str | None, tenant: str | None) -> None:
    """Background job counts by status, and the newest jobs that failed for good."""
    from gateway import ops
    from gateway.cli_views import job_lines

    counts, failures = asyncio.run(ops.job_summary(_config(config_path), tenant))
    _echo_all(job_lines(counts, failures))


@main.command("import")
@CONFIG_OPTION
@TENANT_OPTION
@click.option("--user", default=None, help="Owner of conversations that do not name one.")
@click.option(
    "--model", default="gpt-4o", show_default=True, help="Model whose tokenizer counts the messages."
)
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
def import_file(config_path: str | None, tenant: str, user: str | None, model: str, file: str) -> None:
    """Load exported chat histories (the gateway's JSON, or ChatGPT's conversations.json) through the
    same ingest path as requests; a gateway running on the same store indexes them."""
    import orjson

    from gateway import ops
    from gateway.errors import InvalidRequest
    from gateway.inbound.exports import read_export

    try:
        conversations = read_export(orjson.loads(Path(file).read_bytes()), user)
    except orjson.JSONDecodeError as exc:
        raise click.ClickException(f"{file} is not JSON: {exc}") from exc
    except InvalidRequest as exc:
        raise click.ClickException(f"{file}: {exc.message}; nothing was imported") from exc
    with click.progressbar(length=len(conversations), label="importing", file=sys.stderr) as bar:
        shown = 0

        def progress(done: int) -> None:
            nonlocal shown
            bar.update(done - shown)
            shown = done

        try:
            ids = asyncio.run(
                ops.import_history(_config(config_path), tenant, conversations, model, progress)
            )
        except LookupError as exc:
            raise click.ClickException(str(exc)) from exc
    messages = sum(len(c.messages) for c in conversations)
    click.echo(f"imported {len(ids)} conversations ({messages} messages) into tenant {tenant!r}")
    for conversation, conversation_id in zip(conversations, ids, strict=True):
        click.echo(
            f"  {conversation_id}  {len(conversation.messages):>5} messages  {conversation.title or ''}"
        )


@main.command()
@CONFIG_OPTION
@TENANT_OPTION
@click.option(
    "--queue-only", is_flag=True, help="Queue the jobs and return: a gateway serving this store runs them."
)
@click.argument("conversation_id", required=False)
def reindex(config_path: str | None, tenant: str, queue_only: bool, conversation_id: str | None) -> None:
    """Index a tenant's conversations (or one) again, every branch: after a change of embedding model,
    or to fill what a failed job left out. Runs the embedding here, with a progress bar."""
    from gateway import ops

    with contextlib.ExitStack() as stack:
        bar: Any = None  # opened at the first report, when the backlog's size is known
        total = 0

        def progress(left: int) -> None:
            nonlocal bar, total
            if bar is None:
                total = max(left, 1)
                bar = stack.enter_context(
                    click.progressbar(length=total, label="embedding messages", file=sys.stderr)
                )
            bar.update(max(total - left - bar.pos, 0))

        try:
            done = asyncio.run(
                ops.reindex(
                    _config(config_path), tenant, conversation_id, run=not queue_only, progress=progress
                )
            )
        except LookupError as exc:
            raise click.ClickException(str(exc)) from exc
    already = done.branches - done.queued
    click.echo(
        f"{done.conversations} conversations, {done.branches} branches: {done.queued} embed jobs queued"
        + (f" ({already} were pending already)" if already else "")
    )
    if queue_only:
        click.echo("a gateway serving this store runs them; /healthz 'indexing' shows what is left")
    elif done.failed:
        raise click.ClickException(f"{done.failed} embed jobs failed for good: see `context-gateway jobs`")
    else:
        click.echo("indexed: every branch's messages are searchable and embedded")


@main.command()
@CONFIG_OPTION
@click.option("--tenant", default=None, help="One tenant (default: every tenant in the config).")
def verify(config_path: str | None, tenant: str | None) -> None:
    """Check what is stored: every conversation's tree (parents, depths, token counts, chain hashes,
    counts), the index (each message once per view, vectors set) and the job queue. Exits 1 on a fault."""
    from gateway import ops

    def progress(name: str, done: int) -> None:
        click.echo(f"{name}: {done} conversations checked", err=True)

    try:
        results = asyncio.run(ops.verify(_config(config_path), tenant, progress))
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    faults = 0
    for r in results:
        jobs = ", ".join(f"{n} {status}" for status, n in sorted(r.jobs.items())) or "none"
        click.echo(
            f"{r.tenant}: {r.conversations} conversations, {r.messages} messages, {r.index_rows} index rows "
            f"({r.rows_without_vector} without their vector yet); jobs: {jobs}"
        )
        for finding in r.findings:
            click.echo(f"  FAULT {finding}")
        faults += len(r.findings)
    if faults:
        raise click.ClickException(f"{faults} faults found")
    click.echo("consistent" if all(r.settled for r in results) else "consistent (background work pending)")


@main.group()
def memories() -> None:
    """A user's long-term memories: list, export, delete (as the memory API does)."""


@memories.command("list")
@CONFIG_OPTION
@TENANT_OPTION
@click.option("--user", required=True, help="Whose memories.")
@click.option("--limit", default=100, show_default=True, help="How many, newest first.")
def memories_list(config_path: str | None, tenant: str, user: str, limit: int) -> None:
    """The user's active memories: id, type, scope, content."""
    from gateway import ops

    try:
        found = asyncio.run(ops.memories_of(_config(config_path), tenant, user, limit))
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    for memory in found:
        click.echo(f"{memory.id}  {memory.type:<11} {memory.scope:<12} {memory.content}")
    click.echo(f"{len(found)} memories")


@memories.command("export")
@CONFIG_OPTION
@TENANT_OPTION
@click.option("--user", required=True, help="Whose memories.")
def memories_export(config_path: str | None, tenant: str, user: str) -> None:
    """Every memory of the user as JSON on stdout (what POST .../memories/import takes back)."""
    import orjson

    from gateway import ops

    try:
        document = asyncio.run(ops.export_memories(_config(config_path), tenant, user))
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())


@memories.command("delete")
@CONFIG_OPTION
@TENANT_OPTION
@click.argument("memory_ids", nargs=-1, required=True)
def memories_delete(config_path: str | None, tenant: str, memory_ids: tuple[str, ...]) -> None:
    """Delete memories by id (their vectors too)."""
    from gateway import ops

    try:
        count = asyncio.run(ops.delete_memories(_config(config_path), tenant, memory_ids))
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"deleted {count} of {len(memory_ids)}")


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
