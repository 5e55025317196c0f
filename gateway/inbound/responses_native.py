"""`/v1/responses` to an upstream that serves the Responses API itself (`upstream.responses: native`).

Going out, a request the pipeline left unchanged is the client's own bytes. A rebuilt one (a budgeted
window, injected context, or a `previous_response_id` chain the gateway expanded from its own tree) is
written back as Responses input items by `to_responses`: every item the client sent comes back where it
was (reasoning, built-in tool calls and their outputs kept verbatim in the chat form), the injected
context as a developer message, the client's other fields unchanged. Coming back, the answer reaches the
client as the provider sent it, and is read into the chat form the store keeps (`outcome_of`,
`NativeResponsesRelay`).
"""

from __future__ import annotations

import orjson

from gateway.cache_usage import normalise
from gateway.inbound.chat_form import calls_of, text_of
from gateway.inbound.event_relay import BeforeDone, EventRelay
from gateway.inbound.responses_in import input_messages
from gateway.pipeline.call import ChatOutcome, OutcomeStatus
from gateway.pipeline.stream import parse_chunk
from gateway.ports import JSON, JSONObject, UpstreamResponse

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


# ------------------------------------------------------------------------------- chat -> Responses items


def _input_part(part: JSON) -> JSON:
    if not isinstance(part, dict):
        return {"type": "input_text", "text": str(part)}
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        out: JSONObject = {
            "type": "input_image",
            "image_url": image.get("url") if isinstance(image, dict) else None,
        }
        if isinstance(image, dict) and isinstance(image.get("detail"), str):
            out["detail"] = image["detail"]
        return out
    if kind == "file":
        file = part.get("file")
        return {"type": "input_file", **(file if isinstance(file, dict) else {})}
    return {"type": "input_text", "text": str(part.get("text", ""))}


def _input_content(content: JSON) -> JSON:
    if isinstance(content, list):
        return [_input_part(p) for p in content]
    return "" if content is None else str(content)


def _kept(message: JSONObject, key: str) -> list[JSON]:
    items = message.get(key)
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _items(message: JSONObject, instructions: JSON) -> list[JSON]:
    role = message.get("role")
    out: list[JSON] = _kept(message, "response_items")
    if role in ("system", "developer"):
        if message.get("content") != instructions:  # the client's instructions stay in their own field
            out.append(
                {"type": "message", "role": "developer", "content": _input_content(message.get("content"))}
            )
    elif role == "tool":
        out.append(
            {
                "type": "function_call_output",
                "call_id": message.get("tool_call_id"),
                "output": text_of(message.get("content"))
                if not isinstance(message.get("content"), list)
                else _input_content(message.get("content")),
            }
        )
    elif role == "assistant":
        content: list[JSON] = []
        text = text_of(message.get("content"))
        if text:
            content.append({"type": "output_text", "text": text, "annotations": []})
        if isinstance(message.get("refusal"), str) and message["refusal"]:
            content.append({"type": "refusal", "refusal": message["refusal"]})
        if content:
            out.append({"type": "message", "role": "assistant", "content": content})
        for call in calls_of(message):
            out.append(
                {"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments}
            )
    else:
        out.append({"type": "message", "role": "user", "content": _input_content(message.get("content"))})
    out.extend(_kept(message, "trailing_items"))
    return out


def to_responses(chat: JSONObject, original: JSONObject) -> JSONObject:
    """The Responses request for a rebuilt chat body: its messages as input items; every other field as
    the client sent it, but `previous_response_id` (the gateway wrote out the whole chain)."""
    instructions = original.get("instructions")
    items: list[JSON] = []
    messages = chat.get("messages")
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(message, dict):
            # Only the first message can be the instructions; a later system message (the gateway's
            # volatile tail) stays an input item where it stands, so the items before it stay cached.
            items.extend(_items(message, instructions if index == 0 else None))
    body: JSONObject = {k: v for k, v in original.items() if k not in ("input", "previous_response_id")}
    body["input"] = items
    return body


# ------------------------------------------------------------------------------- Responses -> chat


def _usage(usage: JSON) -> JSONObject | None:
    """Responses usage as chat usage: both count cache reads in the input, and say how many apart."""
    reading = normalise(usage)
    if reading is None:
        return None
    out: JSONObject = {
        "prompt_tokens": reading.input_tokens,
        "completion_tokens": reading.output_tokens,
        "total_tokens": reading.input_tokens + reading.output_tokens,
    }
    if reading.cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": reading.cached_tokens}
    return out


def answer_message(output: JSON) -> JSONObject | None:
    """A response's output items as the one assistant message the store keeps (the same chat form a
    client's resent items give: input_messages reads them)."""
    if not isinstance(output, list) or not output:
        return None
    items = [
        {**i, "role": "assistant"} if isinstance(i, dict) and i.get("type") == "message" else i
        for i in output
    ]
    try:
        messages = input_messages(items, native=True)
    except Exception:  # an item the reader refuses: keep the raw items rather than lose the answer
        return {"role": "assistant", "content": None, "response_items": list(output)}
    if len(messages) == 1:
        return messages[0]
    merged: JSONObject = {
        "role": "assistant",
        "content": "".join(text_of(m.get("content")) for m in messages) or None,
    }
    calls: list[JSON] = [c for m in messages for c in _kept(m, "tool_calls")]
    if calls:
        merged["tool_calls"] = calls
    kept = [i for m in messages for key in ("response_items", "trailing_items") for i in _kept(m, key)]
    if kept:
        merged["response_items"] = kept
    return merged


def outcome_of_response(
    http_status: int, response: JSONObject | None, raw_error: str | None = None
) -> ChatOutcome:
    if http_status >= 400 or response is None:
        return ChatOutcome(status="failed", http_status=http_status, error=raw_error or "upstream error")
    state = response.get("status")
    message = answer_message(response.get("output"))
    finish = (
        "length"
        if state == "incomplete"
        else ("tool_calls" if message and message.get("tool_calls") else "stop")
    )
    status: OutcomeStatus = (
        "complete" if state in ("completed", "incomplete") else ("partial" if message else "failed")
    )
    error = response.get("error")
    model = response.get("model")
    return ChatOutcome(
        status=status,
        http_status=http_status,
        choices=[{"index": 0, "message": message, "finish_reason": finish}] if message else [],
        usage=_usage(response.get("usage")),
        error=str(error) if error else None,
        model=model if isinstance(model, str) else None,
    )


def outcome_of(http_status: int, body: bytes) -> ChatOutcome:
    parsed = parse_chunk(body)
    if http_status >= 400 or parsed is None:
        return outcome_of_response(http_status, None, body.decode("utf-8", "replace")[:2000])
    return outcome_of_response(http_status, parsed)


def error_event(number: int, message: str) -> bytes:
    data = {
        "type": "error",
        "code": "upstream_error",
        "message": message,
        "param": None,
        "sequence_number": number,
    }
    return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"


class NativeResponsesRelay(EventRelay):
    """A Responses event stream relayed as it arrives; the terminal event's response is what is stored.

    `before_done` runs before `response.completed` (or `.incomplete`) is released.
    """

    def __init__(self, response: UpstreamResponse, before_done: BeforeDone | None = None) -> None:
        super().__init__(response, before_done)
        self.final: JSONObject | None = None
        self._items: dict[int, JSON] = {}
        self._number = -1  # the last event's sequence_number

    def _ended(self) -> bool:
        return self.final is not None or self._error is not None

    def _error_frame(self, status: int, message: str) -> bytes:
        return error_event(self._number + 1, message)

    async def _read(self, event: JSONObject) -> None:
        kind = event.get("type")
        if isinstance(event.get("sequence_number"), int):
            number = event["sequence_number"]
            assert isinstance(number, int)
            self._number = number
        if kind == "response.output_item.done" and isinstance(event.get("output_index"), int):
            index = event["output_index"]
            assert isinstance(index, int)
            self._items[index] = event.get("item")
        elif kind in _TERMINAL and isinstance(event.get("response"), dict):
            final = event["response"]
            assert isinstance(final, dict)
            self.final = final
            if kind != "response.failed":
                await self._release_done()
        elif kind == "error":
            self._error = str(event.get("message") or "upstream error")

    def outcome(self, http_status: int, *, disconnected: bool) -> ChatOutcome:
        if self.final is not None:
            outcome = outcome_of_response(http_status, self.final)
            if not self.final.get("output") and self._items:  # some servers leave the final output empty
                outcome = outcome_of_response(
                    http_status, {**self.final, "output": [self._items[i] for i in sorted(self._items)]}
                )
            return outcome
        partial: JSONObject = {
            "status": "in_progress",
            "output": [self._items[i] for i in sorted(self._items)],
        }
        outcome = outcome_of_response(http_status, partial)
        outcome.error = self._error or (
            "client disconnected" if disconnected else "upstream stream ended early"
        )
        outcome.client_disconnected = disconnected
        return outcome
