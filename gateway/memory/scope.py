"""Prepare step, before the context is built: whose memory this call may read and feed, if any.

No memory without a user (unless the tenant names a default one), none when the client says
`X-Gateway-Memory: off` (incognito), and a project's memories only inside that project.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gateway.config import MemoryConfig
from gateway.pipeline.call import ChatCall, MemoryScope
from gateway.pipeline.identify import memory_off
from gateway.ports import ChatPayload, Headers, JSONObject

PROJECT_HEADER = "x-gateway-project"
MAX_PROJECT_CHARS = 200


def _header(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.strip() or None
    return None


def project_of(headers: Headers, body: JSONObject) -> str | None:
    """The project a request names: the header, else `metadata.project`; "user" names no project (it is
    the user's own scope)."""
    project = _header(headers, PROJECT_HEADER)
    metadata = body.get("metadata")
    if project is None and isinstance(metadata, dict):
        value = metadata.get("project")
        project = value.strip() or None if isinstance(value, str) else None
    if project is None or project == "user":
        return None
    return project[:MAX_PROJECT_CHARS]


def incognito(headers: Headers) -> bool:
    return memory_off(headers)


@dataclass(slots=True)
class MemoryScopeStep:
    span_name: ClassVar[str] = "memory.scope"  # its span in a request trace

    config: MemoryConfig

    async def __call__(self, call: ChatCall, payload: ChatPayload) -> ChatPayload:
        state = call.state
        state.incognito = state.incognito or incognito(call.headers)
        user = state.user_id or self.config.default_user
        if state.incognito or not self.config.enabled or user is None:
            state.memory = None
            return payload
        project = project_of(call.headers, payload.data) if self.config.project_scopes else None
        state.memory = MemoryScope(user, project)
        return payload
