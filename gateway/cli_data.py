"""`context-gateway` commands that change what the gateway stored: import, reindex, memories."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import click

from gateway.cli_common import CONFIG_OPTION, TENANT_OPTION, config_of


@click.command("import")
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
                ops.import_history(config_of(config_path), tenant, conversations, model, progress)
            )
        except LookupError as exc:
            raise click.ClickException(str(exc)) from exc
    messages = sum(len(c.messages) for c in conversations)
    click.echo(f"imported {len(ids)} conversations ({messages} messages) into tenant {tenant!r}")
    for conversation, conversation_id in zip(conversations, ids, strict=True):
        click.echo(
            f"  {conversation_id}  {len(conversation.messages):>5} messages  {conversation.title or ''}"
        )


@click.command()
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
                    config_of(config_path), tenant, conversation_id, run=not queue_only, progress=progress
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


@click.group()
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
        found = asyncio.run(ops.memories_of(config_of(config_path), tenant, user, limit))
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
        document = asyncio.run(ops.export_memories(config_of(config_path), tenant, user))
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
        count = asyncio.run(ops.delete_memories(config_of(config_path), tenant, memory_ids))
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"deleted {count} of {len(memory_ids)}")
