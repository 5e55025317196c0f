"""Typed, frozen configuration: `load_config(path)` reads YAML, interpolates `${ENV}` and validates.

Every key is documented in `config.example.yaml`; a test keeps the two in step. Validation errors name
the dotted key (`tenants[0].upstream.base_url`) and the problem, and surface as `ConfigError`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from gateway.config_sections import (
    LOCAL_MODELS,
    CompactionConfig,
    ContextConfig,
    EmbedderConfig,
    IdentityConfig,
    LimitsConfig,
    MemoryConfig,
    ModelPrice,
    PricingConfig,
    RetrievalConfig,
    _Frozen,
)
from gateway.errors import ConfigError

# The tenant's sections live in config_sections.py; importers name them from here.
__all__ = [
    "LOCAL_MODELS",
    "CompactionConfig",
    "ConfigError",
    "ContextConfig",
    "EmbedderConfig",
    "GatewayConfig",
    "IdentityConfig",
    "LimitsConfig",
    "MemoryConfig",
    "ModelPrice",
    "PricingConfig",
    "RetrievalConfig",
    "TenantConfig",
]

DEFAULT_DATABASE_URL = "sqlite:///./data/gateway.db"
DEFAULT_DATA_DIR = "./data"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 600.0
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


class ServerConfig(_Frozen):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # text: "time level logger: message"; json: one JSON object per line (request lines with their fields)
    log_format: Literal["text", "json"] = "text"
    # On SIGTERM (or Ctrl-C) the server stops accepting, lets the requests and streams in flight finish
    # for up to this long, then cancels what is left; the job workers then stop (jobs still running are
    # handed back to the queue).
    shutdown_grace_seconds: int = Field(default=30, ge=0)
    # How long an idle client connection stays open. Longer than the clients' own pool expiry (httpx, under
    # the OpenAI and Anthropic SDKs, drops idle connections after 5 s): a server that closes first races
    # the client's next request on that connection, which then fails with a reset. 75 s is nginx's default.
    keep_alive_seconds: int = Field(default=75, ge=1)
    # Signs the dashboard's login cookies; None: a secret drawn at start (sign-ins end with the process,
    # and replicas behind one address need the same value).
    dashboard_secret: str | None = None
    # A key (in clear, or `sha256:<hex>`) that signs in to the dashboard for every tenant (one at a time,
    # switched in its header). Not a gateway key: it sends no chat requests. None: no admin.
    admin_key: str | None = None


class StorageConfig(_Frozen):
    database_url: str = DEFAULT_DATABASE_URL
    data_dir: str = DEFAULT_DATA_DIR
    node_cache_size: int = Field(default=100_000, ge=0)
    # Bytes each process keeps, per tenant, of the histories its conversations last sent (a resent history
    # is then hashed only where it is new; ~830 bytes a message of 400 characters); 0: off.
    history_memo_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    # Bytes each process keeps, per tenant, of the large chat bodies its conversations last sent (a
    # resent history is then parsed only where it is new); 0: off.
    body_memo_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    # LanceDB location (vectors + full-text index): a directory or an object-store URI; None: data_dir/lancedb.
    index_uri: str | None = None
    # Object-store settings for LanceDB when index_uri is s3://, gs://, az:// (e.g. aws_endpoint,
    # allow_http, aws_region, keys from ${ENV}); empty: LanceDB reads them from the environment.
    index_storage_options: dict[str, str] = Field(default_factory=dict)
    # Memory per process (and per embedding model) for searched conversations' vectors; 0: off.
    vector_cache_mb: int = Field(default=150, ge=0)
    # Where vectors and the full-text index live: "lancedb" (at index_uri), or "memory" (in the process,
    # lost at exit: for tests and demos).
    index: Literal["lancedb", "memory"] = "lancedb"

    @model_validator(mode="before")
    @classmethod
    def _memo_in_bytes(cls, data: object) -> object:
        # history_memo_messages (a count) became history_memo_bytes; a count still reads, at 1 KB a message.
        if isinstance(data, dict) and "history_memo_messages" in data:
            if "history_memo_bytes" in data:
                raise ValueError("history_memo_messages was replaced by history_memo_bytes: keep that one")
            count = data["history_memo_messages"]
            try:  # a number, or its text (from ${ENV})
                messages = int(count) if not isinstance(count, bool) else None
            except (TypeError, ValueError):
                messages = None
            if messages is None:
                raise ValueError(f"history_memo_messages must be a whole number, not {count!r}")
            rest = {k: v for k, v in data.items() if k != "history_memo_messages"}
            return {**rest, "history_memo_bytes": messages * 1024}
        return data

    @property
    def index_location(self) -> str:
        return self.index_uri or str(Path(self.data_dir) / "lancedb")


class LocalEmbedderConfig(_Frozen):
    """The built-in ONNX embedder, shared by every tenant that uses it."""

    threads: int = Field(default=1, ge=1)
    batch_size: int = Field(default=16, ge=1)


class TracingConfig(_Frozen):
    # OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces): each chat request is exported as
    # a trace (needs `pip install "context-gateway[otel]"`). None: no tracing, nothing of it loaded.
    otlp_endpoint: str | None = None
    service_name: str = "context-gateway"
    # Spans are batched and sent at least this often (and whatever is left at shutdown).
    flush_seconds: float = Field(default=5.0, gt=0)


class JobsConfig(_Frozen):
    """The background job queue's workers (compaction, embedding, memory extraction)."""

    workers: int = Field(default=2, ge=0)
    poll_seconds: float = Field(default=1.0, gt=0)
    lease_seconds: float = Field(default=60.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)
    retry_base_seconds: float = Field(default=2.0, ge=0)
    retry_max_seconds: float = Field(default=300.0, ge=0)
    keep_done_seconds: float = Field(default=86_400.0, ge=0)
    # Longest a leased job waits for the requests being worked on to leave the gateway's hands before it
    # starts anyway (0: never waits); a job outlives this only by its own run, bounded by its lease.
    yield_seconds: float = Field(default=1.0, ge=0)
    # A question whose answer was never stored (its process was killed mid-stream) is indexed this long
    # after it arrived; an answer stored meanwhile indexes both and drops that job.
    unanswered_index_seconds: float = Field(default=300.0, ge=0)

    @model_validator(mode="after")
    def _yield_within_lease(self) -> JobsConfig:
        if self.yield_seconds >= self.lease_seconds / 2:
            raise ValueError(
                f"jobs.yield_seconds ({self.yield_seconds:g}) must be under half of jobs.lease_seconds "
                f"({self.lease_seconds:g}): a job waits that long before it starts, within its lease"
            )
        return self


class UpstreamConfig(_Frozen):
    provider: str = "openai"
    base_url: str | None = None
    api_key: str | None = None
    pass_through_client_key: bool = False
    # Streams through one process held with zero loss: 4,000 (BENCHMARKS.md, issue 16); more queue here.
    max_connections: int = Field(default=4000, gt=0)
    # Below common server idle timeouts (uvicorn 5 s, nginx 75 s): a pooled connection is dropped before
    # the upstream can close it under us.
    keepalive_seconds: float = Field(default=4.0, gt=0)
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_SECONDS, gt=0)
    connect_timeout_seconds: float = Field(default=DEFAULT_CONNECT_TIMEOUT_SECONDS, gt=0)
    request_stream_usage: bool = True
    models: tuple[str, ...] = ()
    # How /v1/responses reaches this upstream: converted to chat completions (every server speaks them),
    # or forwarded to its own /v1/responses (OpenAI, vLLM: built-in tools and reasoning items work).
    responses: Literal["chat", "native"] = "chat"
    # OpenAI-compatible upstreams: send a `prompt_cache_key` per conversation (OpenAI routes a key's
    # requests to the same cache); off for a server that refuses fields it does not know.
    prompt_cache_key: bool = True

    @model_validator(mode="before")
    @classmethod
    def _no_http_client(cls, data: object) -> object:
        # The httpx clients were dropped (aiohttp won every figure, BENCHMARKS.md); "aiohttp" still reads.
        if isinstance(data, dict) and "http_client" in data:
            if data["http_client"] != "aiohttp":
                raise ValueError(
                    f"http_client {data['http_client']!r} was removed: OpenAI-compatible upstreams are "
                    "reached over aiohttp; delete the key"
                )
            data = {k: v for k, v in data.items() if k != "http_client"}
        return data

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @property
    def is_openai_compatible(self) -> bool:
        return self.provider == "openai"

    @model_validator(mode="after")
    def _needs_base_url(self) -> UpstreamConfig:
        if self.is_openai_compatible and self.base_url is None:
            raise ValueError("base_url is required when provider is 'openai' (any OpenAI-compatible API)")
        if self.responses == "native" and not self.is_openai_compatible:
            raise ValueError("responses: native needs an OpenAI-compatible upstream (provider 'openai')")
        # No api_key and no pass-through is allowed: keyless local servers (llama.cpp, vLLM) are common.
        return self


class TenantConfig(_Frozen):
    name: str = Field(min_length=1)
    api_keys: tuple[str, ...] = ()
    upstream: UpstreamConfig
    store_conversations: bool = True
    context: ContextConfig = ContextConfig()
    identity: IdentityConfig = IdentityConfig()
    compaction: CompactionConfig = CompactionConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    memory: MemoryConfig = MemoryConfig()
    limits: LimitsConfig = LimitsConfig()
    pricing: PricingConfig = PricingConfig()

    @model_validator(mode="after")
    def _keys_or_pass_through(self) -> TenantConfig:
        if not self.api_keys and not self.upstream.pass_through_client_key:
            raise ValueError(
                "api_keys is empty: give at least one gateway key, or set upstream.pass_through_client_key"
            )
        retrieval = self.retrieval
        if (
            retrieval.enabled
            and retrieval.embedder.provider == "upstream"
            and self.upstream.pass_through_client_key
            and not self.upstream.api_key
        ):
            raise ValueError(
                "retrieval.embedder.provider 'upstream' needs a key of the gateway's own for background "
                "embedding calls: with upstream.pass_through_client_key set upstream.api_key too, or use "
                "provider 'local'"
            )
        return self

    def key_digests(self) -> tuple[str, ...]:
        """sha256 hex digests of the gateway keys; keys may be given in clear or as `sha256:<hex>`."""
        return tuple(hash_key(key) for key in self.api_keys)


class GatewayConfig(_Frozen):
    server: ServerConfig = ServerConfig()
    storage: StorageConfig = StorageConfig()
    jobs: JobsConfig = JobsConfig()
    embeddings: LocalEmbedderConfig = LocalEmbedderConfig()
    tracing: TracingConfig = TracingConfig()
    tenants: tuple[TenantConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        names = [tenant.name for tenant in self.tenants]
        dupes = sorted({name for name in names if names.count(name) > 1})
        if dupes:
            raise ValueError(f"tenant names must be unique; repeated: {', '.join(dupes)}")
        seen: dict[str, str] = {}
        for tenant in self.tenants:
            for digest in tenant.key_digests():
                if digest in seen and seen[digest] != tenant.name:
                    raise ValueError(f"tenants {seen[digest]!r} and {tenant.name!r} share a gateway key")
                seen[digest] = tenant.name
        admin = self.server.admin_key
        if admin and hash_key(admin) in seen:
            raise ValueError(f"server.admin_key is also a gateway key of tenant {seen[hash_key(admin)]!r}")
        open_tenants = [t.name for t in self.tenants if not t.api_keys]
        if len(open_tenants) > 1:
            raise ValueError(
                "only one tenant may have no api_keys (it receives every unrecognised key); found: "
                + ", ".join(open_tenants)
            )
        return self


def hash_key(key: str) -> str:
    if key.startswith("sha256:"):
        return key.removeprefix("sha256:").lower()
    return hashlib.sha256(key.encode()).hexdigest()


def interpolate_env(value: object, env: Mapping[str, str], path: str = "") -> object:
    """Replace `${NAME}` / `${NAME:-default}` in every string; an unset name without default is an error."""
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(f"{path or '<root>'}: environment variable {name} is not set")

        return _ENV_PATTERN.sub(substitute, value)
    if isinstance(value, list):
        return [interpolate_env(item, env, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {
            key: interpolate_env(item, env, f"{path}.{key}" if path else str(key))
            for key, item in value.items()
        }
    return value


def _format_location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "<root>"


def _merge(into: dict[str, object], extra: Mapping[str, object], path: str) -> None:
    for key, value in extra.items():
        here = into.get(key)
        if isinstance(here, dict) and isinstance(value, Mapping):
            _merge(here, value, f"{path}.{key}")
        elif key in into:
            raise ConfigError(f"{path}.{key} is set twice: under advanced and beside it; keep one")
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _fold(section: dict[str, object], model: type[BaseModel], path: str) -> dict[str, object]:
    """`advanced:` beside a config's sections, merged into them (where the internal knobs are written)."""
    advanced = section.pop("advanced", None)
    if advanced is None:
        return section
    where = f"{path}.advanced" if path else "advanced"
    if not isinstance(advanced, Mapping):
        raise ConfigError(f"{where}: must be a mapping of sections ({', '.join(model.model_fields)})")
    for name, extra in advanced.items():
        field = model.model_fields.get(name)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise ConfigError(f"{where}.{name}: not a section of {path or 'the config'}")
        if not isinstance(extra, Mapping):
            raise ConfigError(f"{where}.{name}: must be a mapping")
        target = section.setdefault(name, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{path + '.' if path else ''}{name}: must be a mapping")
        _merge(target, extra, f"{path + '.' if path else ''}{name}")
    return section


def fold_advanced(data: object) -> object:
    """The config with every `advanced:` block (at the top and in each tenant) merged into the sections
    beside it: internal knobs may be written there or in place, not both."""
    if not isinstance(data, dict):
        return data
    folded = _fold(dict(data), GatewayConfig, "")
    tenants = folded.get("tenants")
    if isinstance(tenants, list):
        folded["tenants"] = [
            _fold(dict(t), TenantConfig, f"tenants[{i}]") if isinstance(t, dict) else t
            for i, t in enumerate(tenants)
        ]
    return folded


def parse_config(data: object, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Validate an already-parsed YAML document."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("<root>: the configuration must be a mapping")
    resolved = fold_advanced(interpolate_env(data, os.environ if env is None else env))
    try:
        return GatewayConfig.model_validate(resolved)
    except ValidationError as exc:
        problems = []
        errors = exc.errors()
        nested = {str(e["loc"][0]) for e in errors if len(e["loc"]) > 1}
        for error in errors:
            if len(error["loc"]) == 1 and error["type"] == "too_short" and str(error["loc"][0]) in nested:
                continue  # pydantic repeats a failed item as "too short"; the item's own error says more

            # A model-level validator reports its own location; strip pydantic's wording around it.
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{_format_location(tuple(error['loc']))}: {message}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems)) from exc


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
    return parse_config(data, env)
