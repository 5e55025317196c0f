"""Adapters by the config strings that name them: upstreams, embedders and indexes, the shipped
fakes registered beside the real ones (`embedder: {provider: fake}`, `storage.index: memory`), so a test
or a demo runs the real server without a model or LanceDB. Each factory imports its adapter only when
called: an unused adapter costs no memory."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.config import LOCAL_MODELS, EmbedderConfig, GatewayConfig, TenantConfig
from gateway.errors import ConfigError
from gateway.memory.ports import MemoryVectors
from gateway.ports import Embedder, Tokenizers, Upstream, VectorIndex


def _aiohttp(tenant: TenantConfig) -> Upstream:
    from gateway.adapters.aiohttp_upstream import AiohttpUpstream

    return AiohttpUpstream(tenant.name, tenant.upstream)


def _litellm(tenant: TenantConfig) -> Upstream:
    from gateway.adapters.litellm_upstream import LiteLLMUpstream

    return LiteLLMUpstream(tenant.name, tenant.upstream)


def upstream(tenant: TenantConfig) -> Upstream:
    if tenant.upstream.is_openai_compatible:
        return _aiohttp(tenant)
    return _litellm(tenant)


@dataclass(frozen=True, slots=True)
class EmbedderContext:
    """What an embedder factory may need besides the tenant's spec."""

    config: GatewayConfig
    upstream: Upstream  # the tenant's, with the gateway's own key
    tokenizers: Tokenizers


def _local(spec: EmbedderConfig, context: EmbedderContext) -> Embedder:
    """The built-in model, loaded by its first call (lazy_embedder.py)."""
    from gateway.adapters.lazy_embedder import LazyEmbedder

    threads, batch = context.config.embeddings.threads, context.config.embeddings.batch_size
    if spec.local_model == LOCAL_MODELS[1]:
        from gateway.adapters import e5_embedder as e5

        # OpenMP reads it once, when the engine loads: set here, before threads start, not in the load.
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        return LazyEmbedder(
            e5.MODEL_ID, e5.SIMILARITY, e5.DIMENSIONS, lambda: e5.E5Embedder.load(threads, batch)
        )
    from gateway.adapters import onnx_embedder as minilm

    return LazyEmbedder(
        minilm.MODEL_ID,
        minilm.SIMILARITY,
        minilm.DIMENSIONS,
        lambda: minilm.OnnxEmbedder.load(threads, batch),
    )


def _api(spec: EmbedderConfig, context: EmbedderContext) -> Embedder:
    from gateway.adapters.api_embedder import ApiEmbedder

    if spec.model is None or spec.dimensions is None:
        raise ConfigError("retrieval.embedder.provider 'upstream' needs model and dimensions")
    return ApiEmbedder(
        context.upstream,
        spec.model,
        spec.dimensions,
        spec.batch_size,
        max_input_tokens=spec.max_input_tokens,
        count=context.tokenizers.for_model(spec.model).count,
    )


def _fake(spec: EmbedderConfig, context: EmbedderContext) -> Embedder:
    from gateway.fakes.embedder import HashingEmbedder

    return HashingEmbedder(spec.dimensions or 64)


EMBEDDERS: Mapping[str, Callable[[EmbedderConfig, EmbedderContext], Embedder]] = {
    "local": _local,
    "upstream": _api,
    "fake": _fake,
}


def embedder_key(spec: EmbedderConfig) -> str | None:
    """Tenants whose specs share a key share one embedder (a local model is loaded once); None: each
    tenant gets its own (an API embedder calls its tenant's upstream)."""
    if spec.provider == "local":
        return f"local:{spec.local_model}"
    if spec.provider == "fake":
        return f"fake:{spec.dimensions or 64}"
    return None


def embedder(spec: EmbedderConfig, context: EmbedderContext) -> Embedder:
    return EMBEDDERS[spec.provider](spec, context)


@dataclass(frozen=True, slots=True)
class IndexSpec:
    """One table of an index backend: its name, its vectors' length and where the backend keeps it."""

    config: GatewayConfig
    table: str
    dimensions: int


def _lance_index(spec: IndexSpec) -> VectorIndex:
    from gateway.adapters.lance_index import LanceIndex  # LanceDB: ~90 MB, imported at first use
    from gateway.adapters.vector_cache import rows_within

    storage = spec.config.storage
    return LanceIndex.open(
        storage.index_location,
        spec.table,
        spec.dimensions,
        storage_options=storage.index_storage_options or None,
        cache_rows=rows_within(storage.vector_cache_mb, spec.dimensions),
    )


def _lance_memories(spec: IndexSpec) -> MemoryVectors:
    from gateway.adapters.lance_memories import LanceMemoryVectors

    storage = spec.config.storage
    return LanceMemoryVectors.open(
        storage.index_location,
        spec.table,
        spec.dimensions,
        storage_options=storage.index_storage_options or None,
    )


def _memory_index(spec: IndexSpec) -> VectorIndex:
    from gateway.fakes.memory_index import MemoryIndex

    return MemoryIndex(spec.dimensions)


def _memory_vectors(spec: IndexSpec) -> MemoryVectors:
    from gateway.fakes.memory_vectors import InMemoryMemoryVectors

    return InMemoryMemoryVectors(spec.dimensions)


# By `storage.index`: messages' index and memories' vectors. `memory` keeps them in the process (lost at
# exit): for tests and demos.
INDEXES: Mapping[str, tuple[Callable[[IndexSpec], VectorIndex], Callable[[IndexSpec], MemoryVectors]]] = {
    "lancedb": (_lance_index, _lance_memories),
    "memory": (_memory_index, _memory_vectors),
}


def message_index(spec: IndexSpec) -> VectorIndex:
    return INDEXES[spec.config.storage.index][0](spec)


def memory_vectors(spec: IndexSpec) -> MemoryVectors:
    return INDEXES[spec.config.storage.index][1](spec)
