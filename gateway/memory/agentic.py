"""Agentic recall: the model may search the user's memory itself, through a `memory_search` tool the
gateway adds to the request and answers on its own.

`OfferMemoryTool` (a prepare step) adds the tool when the tenant enables it and the call has memory,
unless the client forces a tool of its own or already has one of that name. `ToolLoop` (run by the
edge on the upstream's non-streamed answer) answers the model's calls of the tool, asks again with the
results, and hands the client one ordinary answer with the usage of every round summed; on a stream,
`tool_stream.ToolStream` does the same while the stream goes on. A client's own
tool calls go back to the client as they are (the gateway's own, made in the same message, are
dropped: the client could not answer them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar

import orjson

from gateway.config import MemoryConfig
from gateway.errors import EmbeddingError, StoreError
from gateway.memory.arguments import parse_arguments, search_parameters
from gateway.memory.conversation_search import CONVERSATION_TOOL, CONVERSATION_TOOL_NAME, ConversationSearch
from gateway.memory.records import USER_SCOPE
from gateway.memory.service import MemoryService
from gateway.pipeline.call import ChatCall, MemoryScope
from gateway.ports import JSON, ChatPayload, JSONObject

log = logging.getLogger(__name__)

TOOL_NAME = "memory_search"
TOOL_NAMES = frozenset({TOOL_NAME, CONVERSATION_TOOL_NAME})  # the gateway's own tools, answered by it
RESULTS = 8
TOOL: JSONObject = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Search what is remembered about the user from earlier conversations (preferences, facts, "
            "projects, events). Use it when the answer may depend on something the user said before."
        ),
        "parameters": search_parameters(
            "memories",
            scope={
                "type": "string",
                "enum": ["all", "user", "project"],
                "description": "The user's own memories, the current project's, or both (default).",
            },
        ),
    },
}


def _names(tools: JSON) -> set[str]:
    out: set[str] = set()
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out.add(str(function["name"]))
    return out


@dataclass(slots=True)
class OfferMemoryTool:
    span_name: ClassVar[str] = "memory.tool"  # its span in a request trace

    config: MemoryConfig
    conversations: bool = False  # also conversation_search (the tenant has a retrieval index)

    async def __call__(self, call: ChatCall, payload: ChatPayload) -> ChatPayload:
        body = payload.data
        if not self.config.agentic or call.state.memory is None or not call.answers_tools:
            return payload
        if _names(body.get("tools")) & TOOL_NAMES:
            return payload  # the client has a tool of that name
        # Offered even where the client forces a tool or allows none (the model cannot call it then): a
        # tools list that changes between turns breaks the provider's prompt cache.
        tools = body.get("tools")
        offered = [TOOL, CONVERSATION_TOOL] if self.conversations and call.state.user_id else [TOOL]
        call.state.memory_tool = True
        return ChatPayload({**body, "tools": [*(tools if isinstance(tools, list) else []), *offered]})


async def search_memory(service: MemoryService, tenant: str, scope: MemoryScope, arguments: str) -> str:
    """The tool's answer: the memories found, one per line with its date, or why there are none."""
    parsed = parse_arguments(arguments)
    if isinstance(parsed, str):
        return parsed
    query, since, until = parsed
    args = orjson.loads(arguments or "{}")
    wanted = args.get("scope") if isinstance(args, dict) else None
    scopes = scope.scopes
    if wanted == "user":
        scopes = (USER_SCOPE,)
    elif wanted == "project" and scope.project is not None:
        scopes = (scope.project,)
    try:
        found = await service.search(tenant, scope.user_id, scopes, query, RESULTS * 2)
    except (StoreError, EmbeddingError) as exc:  # the model is told, and answers without it
        log.warning("memory_search failed: %s", exc)
        return "error: memory is unavailable right now"
    lines = []
    for memory, _ in found:
        when = memory.event_at or memory.created_at
        if (since and when < since) or (until and when.date() > until.date()):
            continue
        lines.append(f"- [{when:%Y-%m-%d}] {memory.content}")
    return "\n".join(lines[:RESULTS]) or "nothing found"


Post = Callable[[JSONObject], Awaitable[tuple[int, bytes]]]


@dataclass(slots=True)
class ToolLoop:
    service: MemoryService
    rounds: int
    conversations: ConversationSearch | None = None  # conversation_search (None: not offered)

    async def answer(self, call: ChatCall, name: str, arguments: str) -> str:
        """What the gateway answers a call of one of its tools."""
        scope = call.state.memory
        if name == CONVERSATION_TOOL_NAME and self.conversations is not None:
            return await self.conversations(call, arguments)
        if scope is None:
            return "error: memory is off for this request"
        return await search_memory(self.service, call.tenant, scope, arguments)

    async def finish(
        self, call: ChatCall, request: JSONObject, status: int, body: bytes, post: Post
    ) -> tuple[int, bytes]:
        """The answer for the client, after answering the model's memory_search calls (at most
        `rounds` times; then once more without the tool)."""
        scope = call.state.memory
        if scope is None:
            return status, body
        usage: list[JSONObject] = []
        messages = list(request.get("messages") or [])  # type: ignore[arg-type]
        for round_number in range(self.rounds + 1):
            if status != 200:
                return status, body
            data = orjson.loads(body)
            reported = data.get("usage")
            if isinstance(reported, dict):
                usage.append(reported)
            choice = (data.get("choices") or [{}])[0]
            message = choice.get("message") or {}
            calls = message.get("tool_calls") or []
            ours = [c for c in calls if (c.get("function") or {}).get("name") in TOOL_NAMES]
            if not ours:
                return status, _with_usage(data, usage)
            if len(ours) < len(calls):  # the client's own calls go back to it, without ours
                message["tool_calls"] = [c for c in calls if c not in ours]
                return status, _with_usage(data, usage)
            messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
            for tool_call in ours:
                function = tool_call.get("function") or {}
                arguments = str(function.get("arguments") or "")
                result = await self.answer(call, str(function.get("name")), arguments)
                messages.append({"role": "tool", "tool_call_id": tool_call.get("id"), "content": result})
            again: JSONObject = {**request, "messages": messages}
            if round_number + 1 >= self.rounds:  # the last round: an answer, not another search
                again = without_tool(again)
            status, body = await post(again)
        return status, body


def without_tool(request: JSONObject) -> JSONObject:
    """The request without the gateway's tools (the last round: an answer, not another search)."""
    tools = [t for t in request.get("tools") or [] if not _names([t]) & TOOL_NAMES]  # type: ignore[union-attr]
    out = {k: v for k, v in request.items() if k not in ("tools", "tool_choice")}
    if tools:
        out["tools"] = tools
        if "tool_choice" in request:
            out["tool_choice"] = request["tool_choice"]
    return out


def summed_usage(usage: list[JSONObject]) -> JSONObject:
    """The token counts of every round, added up (what the client pays for)."""
    summed: dict[str, int] = {}
    for part in usage:
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = part.get(key)
            if isinstance(value, int):
                summed[key] = summed.get(key, 0) + value
    return dict[str, JSON](summed)


def _with_usage(data: JSONObject, usage: list[JSONObject]) -> bytes:
    if len(usage) > 1:  # every round the client did not see is in what it pays for
        data["usage"] = summed_usage(usage)
    return orjson.dumps(data)
