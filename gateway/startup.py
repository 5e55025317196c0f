"""The block `serve` prints at start-up: where the gateway listens, and per tenant which features are on
and, for each one that is off, why and the one line that turns it on."""

from __future__ import annotations

from gateway.config import GatewayConfig, TenantConfig
from gateway.features import compacts, learns, remembers, retrieves

_WIDTH = 11


def _line(feature: str, detail: str) -> str:
    return f"    {feature:<{_WIDTH}} {detail}"


def _no_key(tenant: TenantConfig) -> str:
    return (
        "off: the gateway has no key of its own for background calls (each client's key is passed "
        "through); set OPENAI_API_KEY, or upstream.api_key in the config"
        if tenant.upstream.pass_through_client_key
        else "off"
    )


def _tenant(tenant: TenantConfig) -> list[str]:
    upstream = tenant.upstream
    where = upstream.base_url or upstream.provider
    keys = "the tenant's key"
    if upstream.pass_through_client_key:
        own = ", the gateway's own for background calls" if upstream.api_key else ""
        keys = "each client's own key" + own
    lines = [f"  tenant {tenant.name}: {where}, {keys}"]
    if not tenant.store_conversations:
        return [*lines, _line("everything", "off: store_conversations is false (a plain proxy)")]
    context = tenant.context
    if not context.enabled:
        return [*lines, _line("context", "off: context.enabled is false (histories go out as sent)")]
    lines.append(_line("context", f"on: prompts bounded at {context.budget_tokens:,} tokens, cache-stable"))
    retrieval = tenant.retrieval
    lines.append(
        _line(
            "retrieval",
            f"on: {retrieval.embedder.provider} embedder {retrieval.embedder.model or retrieval.embedder.local_model}"
            if retrieves(tenant)
            else "off: retrieval.enabled is false",
        )
    )
    if compacts(tenant):
        summaries = f"on: {tenant.compaction.model or 'the request model'} folds old turns"
    elif not tenant.compaction.enabled:
        summaries = "off: compaction.enabled is false"
    else:
        summaries = _no_key(tenant)
    lines.append(_line("summaries", summaries))
    if learns(tenant):
        memory = "on: learnt from each exchange, read back per user (X-User-Id or `user`)"
    elif not remembers(tenant):
        memory = "off: memory.enabled is false"
    elif not tenant.memory.extraction:
        memory = "read only: memory.extraction is false (memories come from the API)"
    else:
        memory = "read only: " + _no_key(tenant).removeprefix("off: ")
    lines.append(_line("memory", memory))
    return lines


def startup_block(config: GatewayConfig, host: str, port: int) -> str:
    lines = [
        f"context-gateway on http://{host}:{port}/v1 (chat completions, Anthropic messages, responses); "
        f"dashboard http://{host}:{port}/dashboard",
        f"  storage: {config.storage.database_url}, index {config.storage.index_location}",
    ]
    for tenant in config.tenants:
        lines += _tenant(tenant)
    return "\n".join(lines)
