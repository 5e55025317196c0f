"""SSE plumbing for chat streams: split upstream bytes into frames, and assemble the answer from them.

Frames are forwarded as the exact bytes the provider sent; parsing only feeds the accumulator (the tee
that later persists the assistant message) and spots the usage chunk the gateway itself asked for.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from gateway.ports import JSON, JSONObject

_SEPARATORS = (b"\r\n\r\n", b"\n\n")


class FrameSplitter:
    """Incrementally cuts a byte stream into complete SSE events (separator included)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        buffer = self._buffer + chunk if self._buffer else chunk
        start = 0
        while True:
            end = -1
            width = 0
            for separator in _SEPARATORS:
                found = buffer.find(separator, start)
                if found != -1 and (end == -1 or found < end):
                    end, width = found, len(separator)
            if end == -1:
                break
            yield buffer[start : end + width]
            start = end + width
        self._buffer = buffer[start:]

    def rest(self) -> bytes:
        """Bytes after the last separator (a stream cut mid-frame)."""
        rest, self._buffer = self._buffer, b""
        return rest


def frame_data(frame: bytes) -> bytes | None:
    """The joined `data:` payload of one SSE event, or None for comments and other fields."""
    parts = [line[5:].lstrip(b" ") for line in frame.splitlines() if line.startswith(b"data:")]
    if not parts:
        return None
    return b"\n".join(parts)


def _text(value: JSON) -> str:
    return value if isinstance(value, str) else ""


class ChatAccumulator:
    """Rebuilds the final assistant message(s) from chat-completion chunks, as OpenAI's SDK does."""

    def __init__(self) -> None:
        self._choices: dict[int, dict[str, JSON]] = {}
        self._content: dict[int, list[str]] = {}
        self._tool_calls: dict[int, dict[int, dict[str, JSON]]] = {}
        self.usage: JSONObject | None = None
        self.model: str | None = None
        self.saw_done = False
        self.finished = False

    def add(self, chunk: JSONObject) -> None:
        model = chunk.get("model")
        if isinstance(model, str):
            self.model = model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if isinstance(choice, dict):
                self._add_choice(choice)

    def _add_choice(self, choice: JSONObject) -> None:
        index = choice.get("index")
        index = index if isinstance(index, int) else 0
        state = self._choices.setdefault(index, {"index": index, "finish_reason": None})
        finish = choice.get("finish_reason")
        if isinstance(finish, str):
            state["finish_reason"] = finish
            self.finished = True
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        role = delta.get("role")
        if isinstance(role, str):
            state["role"] = role
        content = delta.get("content")
        if isinstance(content, str):
            self._content.setdefault(index, []).append(content)
        refusal = delta.get("refusal")
        if isinstance(refusal, str):
            state["refusal"] = _text(state.get("refusal")) + refusal
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            calls = self._tool_calls.setdefault(index, {})
            for part in tool_calls:
                if isinstance(part, dict):
                    self._add_tool_call(calls, part)

    @staticmethod
    def _add_tool_call(calls: dict[int, dict[str, JSON]], part: JSONObject) -> None:
        position = part.get("index")
        position = position if isinstance(position, int) else len(calls)
        call = calls.setdefault(position, {"id": None, "type": "function", "name": "", "arguments": ""})
        for key in ("id", "type"):
            value = part.get(key)
            if isinstance(value, str):
                call[key] = value
        function = part.get("function")
        if isinstance(function, dict):
            call["name"] = _text(call["name"]) + _text(function.get("name"))
            call["arguments"] = _text(call["arguments"]) + _text(function.get("arguments"))

    def choices(self) -> list[JSONObject]:
        out: list[JSONObject] = []
        for index in sorted(self._choices):
            state = self._choices[index]
            message: JSONObject = {"role": state.get("role", "assistant")}
            content = self._content.get(index)
            message["content"] = "".join(content) if content is not None else None
            if "refusal" in state:
                message["refusal"] = state["refusal"]
            calls = self._tool_calls.get(index)
            if calls:
                message["tool_calls"] = [
                    {
                        "id": call["id"],
                        "type": call["type"],
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                    for _, call in sorted(calls.items())
                ]
            out.append({"index": index, "message": message, "finish_reason": state["finish_reason"]})
        return out


def parse_chunk(data: bytes) -> JSONObject | None:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def is_usage_only(chunk: JSONObject) -> bool:
    """The trailing chunk that `stream_options.include_usage` adds: no choices, a usage object."""
    return chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict)
