"""The chat answer -> Anthropic Messages wire format: the message object, the named SSE events, errors.

`MessagesStream` turns chat-completion chunk frames, as the relay releases them, into Anthropic's event
sequence (`message_start`, `ping`, `content_block_start/delta/stop` per block, `message_delta` with the
stop reason and usage, `message_stop`), the way the official SDK's accumulator expects it: one block
open at a time, text, thinking and tool-use blocks numbered in order.
"""

from __future__ import annotations

import orjson

from gateway.inbound.chat_form import call_delta, calls_of, text_of
from gateway.ports import JSON, JSONObject

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type(status), "message": message}})


def error_message(body: bytes) -> str:
    """The message of an upstream error body in OpenAI's (or any) shape."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:2000] or "upstream error"
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return body.decode("utf-8", "replace")[:2000]


def message_id(chat_id: JSON) -> str:
    text = chat_id if isinstance(chat_id, str) and chat_id else "gateway"
    return text if text.startswith("msg_") else f"msg_{text}"


def usage(chat_usage: JSON) -> JSONObject:
    """Anthropic counts cache reads apart from input tokens; OpenAI includes them in prompt_tokens."""
    if not isinstance(chat_usage, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    prompt = chat_usage.get("prompt_tokens")
    completion = chat_usage.get("completion_tokens")
    details = chat_usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) else 0
    prompt = prompt if isinstance(prompt, int) else 0
    out: JSONObject = {
        "input_tokens": max(prompt - cached, 0),
        "output_tokens": completion if isinstance(completion, int) else 0,
    }
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


def tool_input(arguments: JSON) -> JSONObject:
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            return {"_unparsed_arguments": arguments}  # the model wrote broken JSON: kept, not lost
        if isinstance(value, dict):
            return value
        return {"_unparsed_arguments": arguments}
    return arguments if isinstance(arguments, dict) else {}


def _thinking(message: JSONObject) -> list[JSON]:
    blocks = message.get("thinking_blocks")
    if isinstance(blocks, list) and blocks:
        return [b for b in blocks if isinstance(b, dict)]
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:  # llama.cpp, vLLM, DeepSeek: unsigned reasoning text
        return [{"type": "thinking", "thinking": reasoning, "signature": ""}]
    return []


def message_from_chat(completion: JSONObject, model: str) -> JSONObject:
    """The Anthropic message for a chat completion (its first choice: Anthropic has no `n`)."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    content: list[JSON] = [*_thinking(message)]
    text = text_of(message.get("content")) or text_of(message.get("refusal"))
    if text:
        content.append({"type": "text", "text": text})
    for index, call in enumerate(calls_of(message)):
        content.append(
            {
                "type": "tool_use",
                "id": call.id or f"toolu_gateway_{index}",
                "name": call.name,
                "input": tool_input(call.arguments),
            }
        )
    finish = choice.get("finish_reason")
    stop_reason = _STOP_REASONS.get(finish, "end_turn") if isinstance(finish, str) else "end_turn"
    if message.get("refusal") and not message.get("content"):
        stop_reason = "refusal"
    answered = completion.get("model")
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": answered if isinstance(answered, str) and answered else model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage(completion.get("usage")),
    }


def event(kind: str, data: JSONObject) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def error_event(status: int, message: str) -> bytes:
    return event("error", {"error": {"type": error_type(status), "message": message}})


class MessagesStream:
    """Chat-completion chunks in, Anthropic events out; `feed` one parsed chunk (or `done()` at [DONE])."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._started = False
        self._ended = False
        self._block = -1  # index of the last block started
        self._open: str | None = None  # kind of the open block: text, thinking, tool_use
        self._tools: dict[int, int] = {}  # chat tool-call index -> block index
        self._stop_reason: str | None = None
        self._usage: JSON = None
        self._id: JSON = None

    def _start(self, chunk: JSONObject) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        self._id = chunk.get("id")
        model = chunk.get("model")
        message: JSONObject = {
            "id": message_id(self._id),
            "type": "message",
            "role": "assistant",
            "model": model if isinstance(model, str) and model else self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [event("message_start", {"message": message}), event("ping", {})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [event("content_block_stop", {"index": self._block})]

    def _open_block(self, kind: str, block: JSONObject) -> list[bytes]:
        out = self._close()
        self._block += 1
        self._open = kind
        out.append(event("content_block_start", {"index": self._block, "content_block": block}))
        return out

    def _delta(self, delta: JSONObject) -> bytes:
        return event("content_block_delta", {"index": self._block, "delta": delta})

    def feed(self, chunk: JSONObject) -> list[bytes]:
        if self._ended:
            return []
        error = chunk.get("error")
        if error is not None:
            self._ended = True
            message = error.get("message") if isinstance(error, dict) else error
            return [error_event(502, str(message or "upstream error"))]
        out = self._start(chunk)
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out.extend(self._choice(choice))
        return out

    def _choice(self, choice: JSONObject) -> list[bytes]:
        out: list[bytes] = []
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            if self._open != "thinking":
                out += self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open != "text":
                out += self._open_block("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": text}))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                out += self._tool_call(call)
        finish = choice.get("finish_reason")
        if isinstance(finish, str):
            self._stop_reason = _STOP_REASONS.get(finish, "end_turn")
            out += self._close()
        return out

    def _tool_call(self, part: JSONObject) -> list[bytes]:
        out: list[bytes] = []
        position, call = call_delta(part, len(self._tools))
        if position not in self._tools:
            block: JSONObject = {
                "type": "tool_use",
                "id": call.id or f"toolu_gateway_{position}",
                "name": call.name,
                "input": {},
            }
            out += self._open_block("tool_use", block)
            self._tools[position] = self._block
        elif self._tools[position] != self._block or self._open != "tool_use":
            return out  # a late fragment of an earlier call: Anthropic streams blocks one after another
        if call.arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return out

    def failed(self, message: str, error_type: str, code: str | None) -> bytes:
        """An upstream failure mid-stream: Anthropic's in-band `error` event (the SDK raises on it)."""
        self._ended = True
        return error_event(504 if code == "upstream_timeout" else 500, message)

    def done(self) -> list[bytes]:
        """At the chat stream's [DONE]: close the message (the usage chunk has arrived by now)."""
        if self._ended:
            return []
        self._ended = True
        out = self._start({}) + self._close()
        out.append(
            event(
                "message_delta",
                {
                    "delta": {"stop_reason": self._stop_reason or "end_turn", "stop_sequence": None},
                    "usage": usage(self._usage),
                },
            )
        )
        out.append(event("message_stop", {}))
        return out
