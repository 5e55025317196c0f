"""litellm's answers in OpenAI's own shape: the fields OpenAI sends, and none of litellm's extras."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.ports import JSONObject


def frame(chunk: Any) -> bytes:
    return b"data: " + orjson.dumps(_chunk(chunk.model_dump())) + b"\n\n"


# What OpenAI itself sends: litellm's objects also carry provider_specific_fields, thinking_blocks,
# function_call/audio nulls and Anthropic cache counters, which OpenAI clients do not know.
_TOP_FIELDS = ("id", "object", "created", "model", "system_fingerprint", "service_tier")
_MESSAGE_FIELDS = ("role", "content", "refusal", "reasoning_content", "annotations", "audio")
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")
_USAGE_DETAILS = {
    "prompt_tokens_details": ("cached_tokens", "audio_tokens"),
    "completion_tokens_details": (
        "reasoning_tokens",
        "audio_tokens",
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
    ),
}


def completion(data: Mapping[str, Any]) -> JSONObject:
    out = _pick(data, _TOP_FIELDS)
    out["choices"] = [_choice(choice, "message") for choice in data.get("choices") or []]
    usage = _usage(data.get("usage"))
    if usage is not None:
        out["usage"] = usage
    return out


def _chunk(data: Mapping[str, Any]) -> JSONObject:
    out = _pick(data, _TOP_FIELDS)
    out["object"] = "chat.completion.chunk"
    out["choices"] = [_choice(choice, "delta") for choice in data.get("choices") or []]
    usage = _usage(data.get("usage"))
    if usage is not None:
        out["usage"] = usage
    return out


def _choice(choice: Mapping[str, Any], part: str) -> JSONObject:
    message = choice.get(part) or {}
    body = _pick(message, _MESSAGE_FIELDS)
    calls = message.get("tool_calls")
    if calls:
        body["tool_calls"] = [_tool_call(call, with_index=part == "delta") for call in calls]
        if part == "delta" and body.get("content") == "":
            del body["content"]  # litellm pads tool-call deltas with "", OpenAI sends no content there
    if part == "message":
        body.setdefault("content", None)  # OpenAI always sends the key, null beside tool calls
    return {
        "index": choice.get("index", 0),
        part: body,
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice.get("finish_reason"),
    }


def _tool_call(call: Mapping[str, Any], *, with_index: bool) -> JSONObject:
    out = _pick(call, ("index", "id", "type") if with_index else ("id", "type"))
    function = call.get("function")
    if isinstance(function, Mapping):
        out["function"] = _pick(function, ("name", "arguments"))
    return out


def _usage(usage: Any) -> JSONObject | None:
    if not isinstance(usage, Mapping):
        return None
    out = _pick(usage, _USAGE_FIELDS)
    for key, fields in _USAGE_DETAILS.items():
        details = usage.get(key)
        if isinstance(details, Mapping):
            picked = _pick(details, fields)
            if picked:
                out[key] = picked
    return out


def _pick(data: Mapping[str, Any], fields: tuple[str, ...]) -> JSONObject:
    return {key: data[key] for key in fields if data.get(key) is not None}
