"""Which features a tenant's config turns on: read by the composition root, the start-up block and the
edge alike, so they live apart from all three."""

from __future__ import annotations

from gateway.config import TenantConfig


def own_key(tenant: TenantConfig) -> bool:
    """The gateway has a key of its own for background calls: the tenant's, or with pass-through client
    keys, a non-empty `upstream.api_key` beside them (`${OPENAI_API_KEY:-}` unset reads as ""; the
    no-config default takes OPENAI_API_KEY)."""
    return not tenant.upstream.pass_through_client_key or bool(tenant.upstream.api_key)


def compacts(tenant: TenantConfig) -> bool:
    """Background summaries need the context builder and a key of the gateway's own for the calls."""
    return (
        tenant.store_conversations
        and tenant.context.enabled
        and tenant.compaction.enabled
        and own_key(tenant)
    )


def retrieves(tenant: TenantConfig) -> bool:
    return tenant.store_conversations and tenant.context.enabled and tenant.retrieval.enabled


def remembers(tenant: TenantConfig) -> bool:
    """Memory is read into the context builder's prompts, so it needs them."""
    return tenant.store_conversations and tenant.context.enabled and tenant.memory.enabled


def learns(tenant: TenantConfig) -> bool:
    """Extraction calls are the gateway's own: they need a key of its own, as compaction does."""
    return remembers(tenant) and tenant.memory.extraction and own_key(tenant)
