"""First pipeline step: parse and validate a chat-completion body, with OpenAI-style 400 errors."""

from __future__ import annotations

import orjson

from gateway.errors import InvalidRequest
from gateway.pipeline.body_memo import BodyMemo
from gateway.ports import JSONObject

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def parse_json_object(raw: bytes, memo: BodyMemo | None = None) -> JSONObject:
    try:
        data = orjson.loads(raw) if memo is None else memo.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from exc
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return data


def parse_chat_request(raw: bytes, memo: BodyMemo | None = None) -> JSONObject:
    """Check only what the gateway relies on; every other field goes upstream untouched. With a memo,
    the history a resent body shares with an earlier one is not parsed again (body_memo.py)."""
    body = parse_json_object(raw, memo)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string.", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' is required and must be a non-empty array.", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{index}] must be an object.", param=f"messages[{index}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise InvalidRequest(
                f"messages[{index}].role must be one of {', '.join(sorted(_ROLES))}; got {role!r}.",
                param=f"messages[{index}].role",
            )
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    return body
