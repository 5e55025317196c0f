"""Canonical form and chain hashes of chat messages: how a conversation is recognised from its history.

`chain_hash = H(parent.chain_hash, canonical(message))`. The canonical form keeps what a message means
(role, content, tool calls, name, tool_call_id) and drops what clients change between calls without
meaning to: key order, JSON whitespace, null or empty fields, and extra fields SDKs add to assistant
messages they send back (refusal, annotations, audio), and `cache_control` on content parts. Tool-call arguments are compared as JSON values:
an Anthropic client sends a call back as an `input` object, which cannot restore the model's spacing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import orjson

from gateway.errors import InvalidRequest
from gateway.ports import JSON, JSONObject

HASH_BYTES = 16


def _clean(value: JSON) -> JSON:
    """Drop nulls recursively so `{"name": null}` and a missing name hash alike."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _content(value: JSON) -> JSON:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        # [{"type": "text", "text": "a"}] and "a" mean the same to the model; clients switch between them.
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    if isinstance(value, list):
        # cache_control is a caching hint that clients (Claude Code) move to the newest turn each call.
        return [
            _clean({k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p)
            for p in value
        ]
    return _clean(value)


# orjson reads 1,024 levels of nesting and writes 254: arguments that may nest deeper stay a string.
_MAX_BRACKETS = 200


def _arguments(value: JSON) -> JSON:
    if isinstance(value, str) and value[:1] == "{" and value.count("{") + value.count("[") <= _MAX_BRACKETS:
        try:
            parsed: JSON = orjson.loads(value)
            return parsed
        except orjson.JSONDecodeError:
            return value
    return value


def _tool_calls(value: JSON) -> JSON:
    if not isinstance(value, list) or not value:
        return None
    calls: list[JSON] = []
    for call in value:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        calls.append(
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "name": function.get("name"),
                "arguments": _arguments(function.get("arguments")),
            }
        )
    return calls


STORABLE_DEPTH = 254
_PLAIN_KEYS = frozenset({"role", "content"})


def canonical(message: JSONObject) -> bytes:
    """A positional JSON array, cheaper to build and encode than a sorted object (hot path: every
    message of every request is hashed)."""
    role = message.get("role")
    if role == "developer":
        role = "system"
    content = message.get("content")
    if type(content) is str and content and message.keys() <= _PLAIN_KEYS:
        return orjson.dumps((role, content))
    name = message.get("name")
    call_id = message.get("tool_call_id")
    form: list[JSON] = [
        role,
        _content(content),
        _tool_calls(message.get("tool_calls")),
        name if isinstance(name, str) and name else None,
        call_id if isinstance(call_id, str) and call_id else None,
    ]
    while form[-1] is None and len(form) > 1:
        form.pop()  # so the fast path above and this one agree on plain messages
    return orjson.dumps(form, option=orjson.OPT_SORT_KEYS)


def root_hash(*scope: str) -> bytes:
    """The chain's starting point: a scope (tenant, user or explicit conversation id) keeps chats apart."""
    return hashlib.sha256("\x1f".join(scope).encode()).digest()[:HASH_BYTES]


def chain_hashes(root: bytes, messages: Iterable[JSONObject], first_index: int = 0) -> Iterator[bytes]:
    """The chain's hashes; `first_index` is the first message's place in the request (for errors)."""
    previous = root
    for n, message in enumerate(messages):
        try:
            form = canonical(message)
        except orjson.JSONEncodeError as exc:  # nested deeper than JSON can be written back (254 levels)
            raise InvalidRequest(
                f"messages[{first_index + n}] nests its content deeper than the {STORABLE_DEPTH} levels "
                f"the gateway can store: {exc}",
                param=f"messages[{first_index + n}]",
            ) from exc
        previous = hashlib.sha256(previous + form).digest()[:HASH_BYTES]
        yield previous
