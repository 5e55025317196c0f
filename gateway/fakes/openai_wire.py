"""The fake OpenAI provider's wire format: scripted replies (`Reply`) and the chat completion and
Responses bodies and stream frames built from them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import orjson
from starlette.responses import Response

from gateway.fakes.prompt_cache import CacheUsage
from gateway.ports import JSON, JSONObject


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str
    id: str = "call_fake_1"


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer. Defaults give a normal, complete answer."""

    content: str | None = "Hello from the fake upstream."
    tool_calls: tuple[ToolCall, ...] = ()
    status: int = 200
    error: JSONObject | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    break_after_chunks: int | None = None
    finish_reason: str | None = None
    reasoning: str | None = None  # /v1/responses only: a reasoning item before the answer


def finish_reason(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def chat_usage(body: JSONObject, reply: Reply, measured: CacheUsage | None = None) -> JSONObject:
    """Chat usage; without `measured` the prompt is estimated as its JSON bytes / 4 (the fast fake's way)."""
    completion = len((reply.content or "").split()) + sum(len(c.arguments) // 4 for c in reply.tool_calls)
    if measured is None:
        prompt = len(orjson.dumps(body.get("messages"))) // 4
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    prompt = measured.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": measured.cached_tokens},
    }


def stream_frames(cid: str, created: int, model: str, reply: Reply, usage: JSONObject | None) -> list[bytes]:
    def chunk(delta: JSONObject, finish: str | None = None) -> bytes:
        body: JSONObject = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            body["usage"] = None
        return b"data: " + orjson.dumps(body) + b"\n\n"

    frames = [chunk({"role": "assistant", "content": "", "refusal": None})]
    if reply.content:
        words = reply.content.split(" ")
        frames += [chunk({"content": w if i == 0 else " " + w}) for i, w in enumerate(words)]
    for position, call in enumerate(reply.tool_calls):
        head: JSONObject = {
            "index": position,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        frames.append(chunk({"tool_calls": [head]}))
        for start in range(0, len(call.arguments), 8):
            piece = call.arguments[start : start + 8]
            frames.append(chunk({"tool_calls": [{"index": position, "function": {"arguments": piece}}]}))
    frames.append(chunk({}, finish_reason(reply)))
    if usage is not None:
        tail: JSONObject = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [],
            "usage": usage,
        }
        frames.append(b"data: " + orjson.dumps(tail) + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return frames


def error_answer(reply: Reply) -> Response:
    """A scripted failure in OpenAI's error shape (the same for chat completions and responses)."""
    error = reply.error or {
        "message": "fake upstream error",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    return Response(orjson.dumps({"error": error}), status_code=reply.status, media_type="application/json")


def responses_messages(items: JSON) -> list[JSON]:
    """The user messages of a Responses input, for the default echo answer."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[JSON] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            out.append({"role": "user", "content": content})
    return out


def responses_output(body: JSONObject, reply: Reply, number: int) -> list[JSON]:
    """A Responses answer's output items: a reasoning item, a web_search_call when the request offers web
    search, the message, function calls."""
    output: list[JSON] = []
    if reply.reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_fake{number}",
                "summary": [{"type": "summary_text", "text": reply.reasoning}],
                "encrypted_content": f"enc:{reply.reasoning}",
            }
        )
    tools = body.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and t.get("type") == "web_search" for t in tools):
        output.append(
            {
                "type": "web_search_call",
                "id": f"ws_fake{number}",
                "status": "completed",
                "action": {"type": "search", "query": "fake"},
            }
        )
    if reply.content:
        part: JSONObject = {
            "type": "output_text",
            "text": reply.content,
            "annotations": [],
            "logprobs": [],
        }
        output.append(
            {
                "type": "message",
                "id": f"msg_fake{number}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for index, call in enumerate(reply.tool_calls):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_fake{number}_{index}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return output


def responses_frames(response: JSONObject) -> list[bytes]:
    """The event sequence OpenAI streams for a finished `response` (text in words, arguments in pieces)."""
    counter = itertools.count()

    def event(kind: str, **data: JSON) -> bytes:
        payload = {"type": kind, "sequence_number": next(counter), **data}
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    frames = [event("response.created", response=started), event("response.in_progress", response=started)]
    output = response["output"]
    assert isinstance(output, list)
    for index, item in enumerate(output):
        assert isinstance(item, dict)
        if item["type"] == "message":
            frames.append(
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
            )
            part = item["content"][0]  # type: ignore[index]
            assert isinstance(part, dict)
            ids: dict[str, JSON] = {"item_id": item["id"], "output_index": index, "content_index": 0}
            frames.append(event("response.content_part.added", **ids, part={**part, "text": ""}))
            for position, word in enumerate(str(part["text"]).split(" ")):
                frames.append(
                    event(
                        "response.output_text.delta",
                        **ids,
                        delta=word if position == 0 else " " + word,
                        logprobs=[],
                    )
                )
            frames.append(event("response.output_text.done", **ids, text=part["text"], logprobs=[]))
            frames.append(event("response.content_part.done", **ids, part=part))
        elif item["type"] == "function_call":
            frames.append(
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
            )
            arguments = str(item["arguments"])
            for start in range(0, len(arguments), 8):
                frames.append(
                    event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=arguments[start : start + 8],
                    )
                )
            frames.append(
                event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=arguments,
                )
            )
        else:
            frames.append(event("response.output_item.added", output_index=index, item=item))
        frames.append(event("response.output_item.done", output_index=index, item=item))
    frames.append(event("response.completed", response=response))
    return frames
