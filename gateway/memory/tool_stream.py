"""Agentic recall on a stream: the model's `memory_search` calls are answered by the gateway while the
client's stream goes on, so the client gets one clean stream.

Everything the model streams passes through at once except what must be held: the tool-call deltas of
the gateway's own tool, each round's finish chunk, usage chunk and `[DONE]`. When a round ends in calls
of the gateway's tool only, the gateway answers them, asks again (streamed) with the results, and relays
the next round in the same stream. At the end the client gets the last finish chunk, one usage chunk
with every round summed, and `[DONE]`. A client's own tool calls in the same message pass through
(renumbered, as if the gateway's were never made) and end the stream, as in the buffered loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from gateway.memory.agentic import TOOL_NAMES, ToolLoop, summed_usage, without_tool
from gateway.pipeline.call import ChatCall
from gateway.pipeline.stream import FrameSplitter, frame_data, parse_chunk
from gateway.ports import JSON, JSONObject, UpstreamResponse

PostStream = Callable[[JSONObject], Awaitable[UpstreamResponse]]


@dataclass(slots=True)
class _Round:
    """What one round held back: the gateway's calls (by the model's index), the finish and usage
    chunks, and where the client's own calls go in the client's numbering."""

    ours: dict[int, JSONObject] = field(default_factory=dict)
    theirs: dict[int, int] = field(default_factory=dict)  # the model's index -> the client's
    content: list[str] = field(default_factory=list)
    finish: JSONObject | None = None
    usage: JSONObject | None = None
    done: bool = False  # the round's stream ended with `[DONE]` (else it was cut short)


def _frame(chunk: JSONObject) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class ToolStream:
    """The client's stream over as many upstream streams as the rounds take; `close()` closes the one
    being read."""

    def __init__(self, loop: ToolLoop, call: ChatCall, request: JSONObject, post: PostStream) -> None:
        self._loop = loop
        self._rounds = loop.rounds
        self._call = call
        self._request = request
        self._post = post
        self.current: UpstreamResponse | None = None

    async def close(self) -> None:
        if self.current is not None:
            await self.current.close()

    async def frames(self, first: UpstreamResponse) -> AsyncIterator[bytes]:
        scope = self._call.state.memory
        messages: list[JSON] = list(self._request.get("messages") or [])  # type: ignore[arg-type]
        usage: list[JSONObject] = []
        template: JSONObject | None = None  # the last usage chunk, to carry the sum
        held = _Round()
        self.current = first
        for number in range(self._rounds + 1):
            held = _Round()
            async for out in self._relay(self.current, held):
                yield out
            if held.usage is not None:
                template = held.usage
                reported = held.usage.get("usage")
                if isinstance(reported, dict):
                    usage.append(reported)
            calls: list[JSON] = [held.ours[i] for i in sorted(held.ours)]
            cut = not held.done and held.finish is None  # ended early: the relay reports it
            if cut or not calls or held.theirs or scope is None or number >= self._rounds:
                break  # an answer, or the client's own calls: the stream ends here
            messages.append(
                {"role": "assistant", "content": "".join(held.content) or None, "tool_calls": calls}
            )
            for tool_call in (held.ours[i] for i in sorted(held.ours)):
                function = tool_call.get("function")
                assert isinstance(function, dict)
                arguments, name = str(function.get("arguments") or ""), str(function.get("name"))
                result = await self._loop.answer(self._call, name, arguments)
                messages.append({"role": "tool", "tool_call_id": tool_call.get("id"), "content": result})
            again: JSONObject = {**self._request, "messages": messages}
            if number + 1 >= self._rounds:  # the last round: an answer, not another search
                again = without_tool(again)
            await self.current.close()
            self.current = await self._post(again)
            if self.current.status != 200:  # the provider refused the next round: say so in-band
                body = (await self.current.read()).decode("utf-8", "replace")[:500]
                error: JSONObject = {
                    "message": f"upstream answered {self.current.status}: {body}",
                    "type": "upstream_error",
                }
                yield _frame({"error": error})
                return
        if held.finish is not None:
            yield _frame(held.finish)
        if template is not None:
            yield _frame({**template, "usage": usage[0] if len(usage) == 1 else summed_usage(usage)})
        if held.done:  # a stream that ended early stays so: the relay tells the client
            yield b"data: [DONE]\n\n"

    async def _relay(self, response: UpstreamResponse, held: _Round) -> AsyncIterator[bytes]:
        """One round's frames, less what is held back (recorded in `held`)."""
        splitter = FrameSplitter()
        async for raw in response.body:
            for frame in splitter.feed(raw):
                data = frame_data(frame)
                if data is None:
                    yield frame
                    continue
                if data == b"[DONE]":
                    held.done = True
                    return
                chunk = parse_chunk(data)
                if chunk is None:
                    yield frame
                    continue
                if isinstance(chunk.get("usage"), dict) and not chunk.get("choices"):
                    held.usage = chunk  # summed with the other rounds' at the end
                    continue
                shown = _split(chunk, held)
                if shown is not None:
                    yield frame if shown is chunk else _frame(shown)


def _split(chunk: JSONObject, held: _Round) -> JSONObject | None:
    """The chunk as the client sees it (None: nothing left of it): the gateway's tool-call deltas and
    the finish reason held back, the client's calls renumbered."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return chunk
    choice: JSONObject = choices[0]
    delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
    assert isinstance(delta, dict)
    changed = False
    if isinstance(delta.get("content"), str):
        held.content.append(str(delta["content"]))
    calls = delta.get("tool_calls")
    if isinstance(calls, list) and calls:
        kept: list[JSON] = []
        for part in calls:
            if not isinstance(part, dict):
                continue
            index = part.get("index") if isinstance(part.get("index"), int) else 0
            assert isinstance(index, int)
            function = part.get("function") if isinstance(part.get("function"), dict) else {}
            assert isinstance(function, dict)
            if index not in held.ours and index not in held.theirs:  # the call's first delta names it
                if function.get("name") in TOOL_NAMES:
                    held.ours[index] = {
                        "id": part.get("id"),
                        "type": "function",
                        "function": {"name": str(function.get("name")), "arguments": ""},
                    }
                else:
                    held.theirs[index] = len(held.theirs)
            if index in held.ours:
                target = held.ours[index]["function"]
                assert isinstance(target, dict)
                target["arguments"] = str(target["arguments"]) + str(function.get("arguments") or "")
            else:
                kept.append({**part, "index": held.theirs[index]})
        delta = (
            {**delta, "tool_calls": kept} if kept else {k: v for k, v in delta.items() if k != "tool_calls"}
        )
        changed = True
    if choice.get("finish_reason") is not None:
        held.finish = {**chunk, "choices": [{**choice, "delta": {}}]}
        rest = {k: v for k, v in delta.items() if k != "role"}
        if not rest:
            return None
        choice = {**choice, "finish_reason": None}
        changed = True
    if not changed:
        return chunk
    if not any(v not in (None, "", []) for k, v in delta.items() if k != "role") and "role" not in delta:
        return None
    return {**chunk, "choices": [{**choice, "delta": delta}]}
