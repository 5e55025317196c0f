"""`context-gateway` commands that read what the gateway stored: conversations, show, context, jobs,
verify."""

from __future__ import annotations

import asyncio

import click

from gateway.cli_common import CONFIG_OPTION, TENANT_OPTION, config_of, echo_all
from gateway.config import GatewayConfig, PricingConfig
from gateway.records import RequestRecord


@click.command()
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
            config_of(config_path), tenant, user, limit, where.text, where.since, where.until
        )
    )
    echo_all(conversation_rows(found))


@click.command()
@CONFIG_OPTION
@TENANT_OPTION
@click.argument("conversation_id")
def show(config_path: str | None, tenant: str, conversation_id: str) -> None:
    """Show a conversation as its message tree, branches drawn."""
    from gateway import ops
    from gateway.cli_views import tree_lines

    try:
        conversation, messages = asyncio.run(
            ops.conversation_tree(config_of(config_path), tenant, conversation_id)
        )
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    echo_all(tree_lines(conversation, messages))


@click.command()
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

    config = config_of(config_path)
    wanted = request_or_conversation_id
    try:
        record, path = asyncio.run(ops.request_record(config, tenant, wanted))
    except LookupError as exc:
        records = asyncio.run(_conversation_requests(config, tenant, wanted))
        if not records:
            raise click.ClickException(f"{exc}; no conversation with requests either") from exc
        from gateway.cache_cost import conversation_cost

        pricing = next((t.pricing for t in config.tenants if t.name == tenant), PricingConfig())
        echo_all(conversation_cost_lines(wanted, conversation_cost(records, pricing)))
        return
    echo_all(context_lines(record))
    echo_all(sent_lines(record, path, whole=messages))


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


@click.command()
@CONFIG_OPTION
@click.option("--tenant", default=None, help="Only this tenant's jobs (default: all).")
def jobs(config_path: str | None, tenant: str | None) -> None:
    """Background job counts by status, and the newest jobs that failed for good."""
    from gateway import ops
    from gateway.cli_views import job_lines

    counts, failures = asyncio.run(ops.job_summary(config_of(config_path), tenant))
    echo_all(job_lines(counts, failures))


@click.command()
@CONFIG_OPTION
@click.option("--tenant", default=None, help="One tenant (default: every tenant in the config).")
def verify(config_path: str | None, tenant: str | None) -> None:
    """Check what is stored: every conversation's tree (parents, depths, token counts, chain hashes,
    counts), the index (each message once per view, vectors set) and the job queue. Exits 1 on a fault."""
    from gateway import ops

    def progress(name: str, done: int) -> None:
        click.echo(f"{name}: {done} conversations checked", err=True)

    try:
        results = asyncio.run(ops.verify(config_of(config_path), tenant, progress))
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
