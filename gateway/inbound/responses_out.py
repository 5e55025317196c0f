"""The chat answer -> OpenAI Responses wire format: the response object and its stream events.

`Shell` holds what a response echoes of its request (model, instructions, tools, previous_response_id,
store...). `ResponsesStream` turns chat chunks into the Responses event sequence the official SDK's
accumulator checks: `response.created` and `response.in_progress`, then per output item
`response.output_item.added`, its content events (`response.content_part.added`,
`response.output_text.delta`/`done`, `response.content_part.done`, or
`response.function_call_arguments.delta`/`done`), `response.output_item.done`, and finally
`response.completed` (or `response.incomplete`) with the whole response; every event numbered.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson

from gateway.inbound.chat_form import call_delta, calls_of, text_of
from gateway.ports import JSON, JSONObject

_ECHOED = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "previous_response_id",
    "reasoning",
    "service_tier",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "truncation",
    "user",
)
_DEFAULTS: JSONObject = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "service_tier": "auto",
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
}
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


@dataclass(slots=True)
class Shell:
    """The fields of a response that come from its request."""

    id: str
    model: str
    store: bool
    echoed: JSONObject = field(default_factory=dict)
    created_at: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def of(cls, response_id: str, request: JSONObject, store: bool) -> Shell:
        echoed = {**_DEFAULTS, **{k: request[k] for k in _ECHOED if request.get(k) is not None}}
        return cls(response_id, str(request.get("model")), store, echoed)

    def response(
        self, status: str, output: list[JSON], usage: JSON = None, model: str | None = None
    ) -> JSONObject:
        body: JSONObject = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": model or self.model,
            "output": output,
            "store": self.store,
            "usage": usage,
            **self.echoed,
        }
        return body


def usage(chat_usage: JSON) -> JSONObject | None:
    if not isinstance(chat_usage, dict):
        return None

    def count(value: JSON) -> int:
        return value if isinstance(value, int) else 0

    prompt, completion = count(chat_usage.get("prompt_tokens")), count(chat_usage.get("completion_tokens"))
    prompt_details = chat_usage.get("prompt_tokens_details")
    completion_details = chat_usage.get("completion_tokens_details")
    cached = count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else 0
    reasoning = (
        count(completion_details.get("reasoning_tokens")) if isinstance(completion_details, dict) else 0
    )
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> JSONObject:
    part: JSONObject = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> JSONObject:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _status(finish: JSON, response: JSONObject) -> None:
    reason = _INCOMPLETE.get(finish) if isinstance(finish, str) else None
    if reason is not None:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": reason}


def response_from_chat(completion: JSONObject, shell: Shell) -> JSONObject:
    """The Responses object for a chat completion (its first choice)."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    output: list[JSON] = []
    key = shell.id.removeprefix("resp_")
    text = text_of(message.get("content"))
    if text:
        output.append(message_item(f"msg_{key}", text))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        refused: JSONObject = {"type": "refusal", "refusal": refusal}
        output.append(
            {
                "type": "message",
                "id": f"msg_{key}_r",
                "status": "completed",
                "role": "assistant",
                "content": [refused],
            }
        )
    for index, call in enumerate(calls_of(message)):
        call_id = call.id or f"call_{index}"
        output.append(call_item(f"fc_{key}_{index}", call_id, call.name, call.arguments))
    model = completion.get("model")
    response = shell.response(
        "completed", output, usage(completion.get("usage")), model if isinstance(model, str) else None
    )
    _status(choice.get("finish_reason"), response)
    return response


def _event(kind: str, number: int, data: JSONObject) -> bytes:
    payload = {"type": kind, "sequence_number": number, **data}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class ResponsesStream:
    """Chat chunks in, Responses events out (one open output item at a time, as OpenAI streams them)."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell
        self._number = 0
        self._started = False
        self._ended = False
        self._output: list[JSON] = []  # finished items
        self._open: JSONObject | None = None  # the item being streamed
        self._calls: dict[int, int] = {}  # chat tool-call index -> output index
        self._finish: str | None = None
        self._usage: JSON = None
        self._model: str | None = None
        self.final: JSONObject | None = None  # the whole response, once [DONE] was seen

    @property
    def _key(self) -> str:
        return self._shell.id.removeprefix("resp_")

    def _emit(self, kind: str, data: JSONObject) -> bytes:
        out = _event(kind, self._number, data)
        self._number += 1
        return out

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        shell = self._shell.response("in_progress", [])
        return [
            self._emit("response.created", {"response": shell}),
            self._emit("response.in_progress", {"response": shell}),
        ]

    def _close(self) -> list[bytes]:
        item = self._open
        if item is None:
            return []
        self._open = None
        index = len(self._output)
        out: list[bytes] = []
        if item["type"] == "message":
            content = item["content"]
            assert isinstance(content, list)
            part = content[0]
            assert isinstance(part, dict)
            ids: JSONObject = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self._emit("response.output_text.done", {**ids, "text": part["text"], "logprobs": []}))
            out.append(self._emit("response.content_part.done", {**ids, "part": part}))
        else:
            done: JSONObject = {
                "item_id": item["id"],
                "output_index": index,
                "arguments": item["arguments"],
                "name": item["name"],
            }
            out.append(self._emit("response.function_call_arguments.done", done))
        item["status"] = "completed"
        out.append(self._emit("response.output_item.done", {"output_index": index, "item": item}))
        self._output.append(item)
        return out

    def _open_item(self, item: JSONObject) -> list[bytes]:
        out = self._close()
        self._open = item
        index = len(self._output)
        out.append(
            self._emit(
                "response.output_item.added",
                {
                    "output_index": index,
                    "item": {**item, "content": []} if item["type"] == "message" else dict(item),
                },
            )
        )
        if item["type"] == "message":
            part: JSONObject = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ids: JSONObject = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(self._emit("response.content_part.added", {**ids, "part": part}))
        return out

    def feed(self, chunk: JSONObject) -> list[bytes]:
        if self._ended:
            return []
        error = chunk.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            return self.failed_frames(str(message or "upstream error"), "upstream_error")
        out = self._start()
        model = chunk.get("model")
        if isinstance(model, str) and model:
            self._model = model
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._choice(choice)
        return out

    def _choice(self, choice: JSONObject) -> list[bytes]:
        out: list[bytes] = []
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open is None or self._open["type"] != "message":
                out += self._open_item(message_item(f"msg_{self._key}", "", "in_progress"))
            item = self._open
            assert item is not None
            content = item["content"]
            assert isinstance(content, list) and isinstance(content[0], dict)
            content[0]["text"] = str(content[0]["text"]) + text
            ids: JSONObject = {"item_id": item["id"], "output_index": len(self._output), "content_index": 0}
            out.append(self._emit("response.output_text.delta", {**ids, "delta": text, "logprobs": []}))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                out += self._call(call)
        finish = choice.get("finish_reason")
        if isinstance(finish, str):
            self._finish = finish
            out += self._close()
        return out

    def _call(self, part: JSONObject) -> list[bytes]:
        out: list[bytes] = []
        position, call = call_delta(part, len(self._calls))
        if position not in self._calls:
            item = call_item(
                f"fc_{self._key}_{position}", call.id or f"call_{position}", call.name, "", "in_progress"
            )
            out += self._open_item(item)
            self._calls[position] = len(self._output)
        elif self._open is None or self._calls[position] != len(self._output):
            return out  # a late fragment of a call already closed
        if call.arguments and self._open is not None:
            self._open["arguments"] = str(self._open["arguments"]) + call.arguments
            data: JSONObject = {
                "item_id": self._open["id"],
                "output_index": len(self._output),
                "delta": call.arguments,
            }
            out.append(self._emit("response.function_call_arguments.delta", data))
        return out

    def failed_frames(self, message: str, code: str) -> list[bytes]:
        self._ended = True
        out = self._start()
        out.append(self._emit("error", {"code": code, "message": message, "param": None}))
        failed = self._shell.response("failed", [*self._output], usage(self._usage), self._model)
        failed["error"] = {"code": "server_error", "message": message}
        out.append(self._emit("response.failed", {"response": failed}))
        return out

    def failed(self, message: str, error_type: str, code: str | None) -> bytes:
        return b"".join(self.failed_frames(message, code or error_type))

    def done(self) -> list[bytes]:
        if self._ended:
            return []
        self._ended = True
        out = self._start() + self._close()
        response = self.finish()
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        out.append(self._emit(kind, {"response": response}))
        return out

    def finish(self) -> JSONObject:
        """The whole response as it stands (called at [DONE], before the last event is released)."""
        if self.final is None:
            response = self._shell.response("completed", [*self._output], usage(self._usage), self._model)
            _status(self._finish, response)
            self.final = response
        return self.final
