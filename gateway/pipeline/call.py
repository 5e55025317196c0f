"""What one chat request carries through the pipeline: the parsed call in, the outcome out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gateway.ports import Headers, JSONObject

OutcomeStatus = Literal["complete", "partial", "failed"]


@dataclass(slots=True)
class ChatCall:
    request_id: str
    tenant: str
    body: JSONObject
    raw: bytes
    headers: Headers
    started: float

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def client_wants_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True


@dataclass(slots=True)
class ChatOutcome:
    """What came back: the assembled assistant message(s), usage, and how the exchange ended."""

    status: OutcomeStatus
    http_status: int
    choices: list[JSONObject] = field(default_factory=list)
    usage: JSONObject | None = None
    error: str | None = None
    model: str | None = None
