"""The memory calls' one way to the model: a chat completion through the tenant's upstream, asked for
structured output, read tolerantly, retried once with a note when the reply is junk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson

from gateway.errors import UpstreamError
from gateway.memory.prompts import with_repair
from gateway.memory.replies import Junk, reply_text
from gateway.ports import ChatPayload, JSONObject, Upstream

T = TypeVar("T")


class ExtractionFailed(Exception):
    """A memory call failed or its reply stayed unusable: the job is retried, nothing is stored."""


@dataclass(slots=True)
class CallStats:
    """What the memory calls cost (reported by the provider), for `/healthz` and the benchmarks."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    repairs: int = 0


async def _post(upstream: Upstream, request: JSONObject, stats: CallStats) -> tuple[int, bytes]:
    stats.calls += 1
    try:
        response = await upstream.chat_completions(ChatPayload(request), [], None)
        try:
            return response.status, await response.read()
        finally:
            await response.close()
    except UpstreamError as exc:
        raise ExtractionFailed(f"memory call failed: {exc.message}") from exc


async def ask(upstream: Upstream, request: JSONObject, parse: Callable[[str], T], stats: CallStats) -> T:
    """`parse` of the model's reply to `request`. A provider refusing `response_format` (400) is asked
    again without it; a reply `parse` cannot use (`Junk`) is answered with a repair note once."""
    status, body = await _post(upstream, request, stats)
    if status == 400 and "response_format" in request:
        request = {k: v for k, v in request.items() if k != "response_format"}
        status, body = await _post(upstream, request, stats)
    for attempt in range(2):
        if status != 200:
            raise ExtractionFailed(f"memory call answered {status}: {body[:300]!r}")
        text = body.decode("utf-8", "replace")
        try:
            data = orjson.loads(body)
            usage = data.get("usage") if isinstance(data, dict) else None
            if isinstance(usage, dict):
                stats.input_tokens += int(usage.get("prompt_tokens") or 0)
                stats.output_tokens += int(usage.get("completion_tokens") or 0)
            if not isinstance(data, dict):
                raise Junk("the reply is not a chat completion")
            text = reply_text(data)
            return parse(text)
        except (Junk, orjson.JSONDecodeError) as exc:
            if attempt == 1:
                raise ExtractionFailed(f"memory call reply unusable after a repair: {exc}") from exc
            stats.repairs += 1
            request = with_repair(request, text)
            status, body = await _post(upstream, request, stats)
    raise AssertionError("unreachable")
