"""Operator actions the CLI runs against the configured store, outside a serving gateway."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from gateway.config import GatewayConfig
from gateway.records import compact_job
from gateway.wiring import build_deps


async def compact_now(
    config: GatewayConfig,
    tenant: str,
    conversation_id: str,
    model: str | None,
    wait_seconds: float,
    echo: Callable[[str], None],
) -> str | None:
    """Queue a forced compaction and run the job workers until it is done; returns the newest summary.

    It goes through the same durable queue as the gateway's own jobs, so a running gateway may pick the
    job up instead: either way the result lands in the same store."""
    deps = build_deps(config)
    try:
        conversation = await deps.store.get_conversation(tenant, conversation_id)
        if conversation is None or conversation.last_message_id is None:
            raise LookupError(f"no conversation {conversation_id!r} with messages for tenant {tenant!r}")
        tenant_config = next((t for t in config.tenants if t.name == tenant), None)
        model = model or (tenant_config.compaction.model if tenant_config else None)
        if not model:
            raise LookupError(
                f"no model for the summarisation calls: pass --model or set compaction.model for {tenant!r}"
            )
        queued = await deps.jobs.enqueue(
            compact_job(tenant, conversation.id, conversation.last_message_id, model, force=True)
        )
        echo(
            "compaction queued" if queued else "a compaction of this conversation is already pending; waiting"
        )
        deadline = time.monotonic() + wait_seconds
        async with deps.workers.running():
            deps.workers.notify()
            while time.monotonic() < deadline:
                counts = await deps.jobs.counts(tenant)
                if counts.get("queued", 0) == 0 and counts.get("running", 0) == 0:
                    break
                await anyio.sleep(0.1)
            else:
                raise LookupError(f"the compaction did not finish within {wait_seconds:.0f} s")
        summaries = await deps.summaries.summaries(tenant, conversation.id, "global")
        return summaries[0].content if summaries else None
    finally:
        await deps.aclose()
