"""Process-local counters, owned by the app state and shown on `/healthz`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from gateway.cache_usage import CacheUsage

INPUT_KINDS = ("cached", "cache_write", "uncached")  # gateway_upstream_input_tokens' `kind` label


@dataclass(slots=True)
class Counters:
    chat_requests: int = 0
    upstream_errors: int = 0
    fail_open: int = 0
    complete_errors: int = 0
    client_disconnects: int = 0
    body_messages_reused: int = 0  # messages of resent bodies not parsed again (storage.body_memo_bytes)
    # Upstream input tokens by (tenant, kind), as the provider reported them: labelled, so not in the
    # snapshot's totals (GET /metrics reads them).
    input_tokens: dict[tuple[str, str], int] = field(default_factory=dict)

    def count_input(self, tenant: str, usage: CacheUsage) -> None:
        parts = (usage.cached_tokens, usage.cache_write_tokens, usage.uncached_tokens)
        for kind, tokens in zip(INPUT_KINDS, parts, strict=True):
            key = (tenant, kind)
            self.input_tokens[key] = self.input_tokens.get(key, 0) + tokens

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "input_tokens"}
