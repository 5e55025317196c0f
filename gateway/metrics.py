"""Process-local counters, owned by the app state and shown on `/healthz`."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class Counters:
    chat_requests: int = 0
    upstream_errors: int = 0
    fail_open: int = 0
    complete_errors: int = 0
    client_disconnects: int = 0
    body_messages_reused: int = 0  # messages of resent bodies not parsed again (storage.body_memo_bytes)

    def snapshot(self) -> dict[str, int]:
        return asdict(self)
