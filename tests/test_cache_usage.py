"""What the provider's prompt cache did, for every request: each provider's usage shape read into one
record (streamed and not), kept with the request record and its ContextReport, counted in /metrics, and
priced against full replay.

End to end, the official SDKs talk to a real gateway in front of `provider_app`: a small real server
speaking the chat completions, Responses and Anthropic wire formats, answering with fixed usage that
holds each API's cache fields.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.cache_cost import TOKENS, USD, conversation_cost, price_of
from gateway.cache_usage import CacheUsage, normalise, stored_usage
from gateway.config import ModelPrice, PricingConfig
from gateway.fakes.server import BackgroundServer
from gateway.inbound import messages_native, responses_native
from gateway.metrics import Counters
from gateway.pipeline.call import ChatOutcome
from gateway.ports import JSONObject, UpstreamResponse
from gateway.records import RequestRecord
from tests.conftest import Gateway, api, recorded, tenant

ANSWER = "Cached answer."
CHAT_USAGE: JSONObject = {
    "prompt_tokens": 2000,
    "completion_tokens": 50,
    "total_tokens": 2050,
    "prompt_tokens_details": {"cached_tokens": 1536, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
}
RESPONSES_USAGE: JSONObject = {
    "input_tokens": 2000,
    "input_tokens_details": {"cached_tokens": 1536},
    "output_tokens": 50,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 2050,
}
# Anthropic's input_tokens counts neither cache reads nor cache writes.
ANTHROPIC_USAGE: JSONObject = {
    "input_tokens": 300,
    "cache_creation_input_tokens": 200,
    "cache_read_input_tokens": 1500,
    "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 0},
    "output_tokens": 40,
    "service_tier": "standard",
}
OPENAI_READING = CacheUsage(
    input_tokens=2000, cached_tokens=1536, cache_write_tokens=0, uncached_tokens=464, output_tokens=50
)
ANTHROPIC_READING = CacheUsage(
    input_tokens=2000, cached_tokens=1500, cache_write_tokens=200, uncached_tokens=300, output_tokens=40
)


# ------------------------------------------------------------------------------- the reading, unit by unit


@pytest.mark.parametrize(
    ("usage", "reading"),
    [
        pytest.param(CHAT_USAGE, OPENAI_READING, id="openai-chat"),
        pytest.param(RESPONSES_USAGE, OPENAI_READING, id="openai-responses"),
        pytest.param(ANTHROPIC_USAGE, ANTHROPIC_READING, id="anthropic"),
        pytest.param(
            {**ANTHROPIC_USAGE, "cache_creation_input_tokens": None, "cache_read_input_tokens": None},
            CacheUsage(300, 0, 0, 300, 40),
            id="anthropic-nulls",
        ),
        pytest.param(
            {  # LiteLLM's chat usage for an Anthropic model: reads and writes at the top level too
                "prompt_tokens": 2000,
                "completion_tokens": 40,
                "prompt_tokens_details": {"cached_tokens": 1500},
                "cache_read_input_tokens": 1500,
                "cache_creation_input_tokens": 200,
            },
            ANTHROPIC_READING,
            id="litellm-chat",
        ),
        pytest.param(
            {"prompt_tokens": 900, "completion_tokens": 9, "prompt_cache_hit_tokens": 640},
            CacheUsage(900, 640, 0, 260, 9),
            id="deepseek",
        ),
        pytest.param(
            {"prompt_tokens": 300, "completion_tokens": 40, "cache_read_input_tokens": 1500},
            CacheUsage(1800, 1500, 0, 300, 40),
            id="chat-counting-reads-apart",
        ),
        pytest.param(
            {"prompt_tokens": 12, "completion_tokens": 3}, CacheUsage(12, 0, 0, 12, 3), id="no-cache"
        ),
        pytest.param({"input_tokens": 12, "output_tokens": 3}, CacheUsage(12, 0, 0, 12, 3), id="bare-input"),
        pytest.param(
            {"prompt_tokens": 1, "normalised": ANTHROPIC_READING.to_json()}, ANTHROPIC_READING, id="stored"
        ),
    ],
)
def test_every_usage_shape_reads_into_one_record(usage: JSONObject, reading: CacheUsage) -> None:
    assert normalise(usage) == reading
    assert (
        reading.input_tokens == reading.cached_tokens + reading.cache_write_tokens + reading.uncached_tokens
    )


@pytest.mark.parametrize("usage", [None, "12", [], {}, {"total_tokens": 5}])
def test_what_is_not_a_usage_reads_as_none(usage: Any) -> None:
    assert normalise(usage) is None
    assert stored_usage(usage if isinstance(usage, dict) else None, normalise(usage)) == (
        usage if isinstance(usage, dict) else None
    )


def test_the_stored_usage_keeps_the_providers_fields_and_the_reading_beside_them() -> None:
    kept = stored_usage(CHAT_USAGE, OPENAI_READING)
    assert kept == {**CHAT_USAGE, "normalised": OPENAI_READING.to_json()}
    assert normalise(kept) == OPENAI_READING
    assert OPENAI_READING.report() == {"cached": 1536, "written": 0, "uncached": 464}
    assert OPENAI_READING.hit_share == pytest.approx(0.768)
    assert CacheUsage.of(0, 0, 0, 0).hit_share is None


def test_counters_add_each_kind_per_tenant() -> None:
    counters = Counters()
    counters.count_input("acme", ANTHROPIC_READING)
    counters.count_input("acme", OPENAI_READING)
    assert counters.input_tokens == {
        ("acme", "cached"): 3036,
        ("acme", "cache_write"): 200,
        ("acme", "uncached"): 764,
    }
    assert "input_tokens" not in counters.snapshot()  # /healthz keeps its plain totals


# Anthropic streams: message_start carries the input counts, message_delta the final output count; newer
# servers repeat the input counts in message_delta, and a 0 there must not erase message_start's.
ANTHROPIC_STREAMS = {
    "start-then-output": (ANTHROPIC_USAGE, {"output_tokens": 40}),
    "delta-repeats-all": (ANTHROPIC_USAGE, ANTHROPIC_USAGE),
    "delta-says-zero": (
        ANTHROPIC_USAGE,
        {
            "output_tokens": 40,
            "input_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": None,
        },
    ),
    "delta-has-them": (
        {
            "input_tokens": 300,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": 1,
        },
        {"output_tokens": 40, "cache_read_input_tokens": 1500, "cache_creation_input_tokens": 200},
    ),
}


def _anthropic_message(usage: JSONObject) -> JSONObject:
    return {
        "id": "msg_cache",
        "type": "message",
        "role": "assistant",
        "model": "claude-cache",
        "content": [{"type": "text", "text": ANSWER}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


def _sse(kind: str, data: JSONObject) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def anthropic_frames(start: JSONObject, delta: JSONObject) -> list[bytes]:
    message = {**_anthropic_message({**start, "output_tokens": 1}), "content": [], "stop_reason": None}
    return [
        _sse("message_start", {"message": message}),
        _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        _sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": ANSWER}}),
        _sse("content_block_stop", {"index": 0}),
        _sse("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": delta}),
        _sse("message_stop", {}),
    ]


def _response(usage: JSONObject | None, status: str = "completed") -> JSONObject:
    return {
        "id": "resp_cache",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "model": "gpt-5",
        "output": [
            {
                "type": "message",
                "id": "msg_cache",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
            }
        ]
        if status == "completed"
        else [],
        "usage": usage,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
    }


def responses_frames() -> list[bytes]:
    numbers = itertools.count()

    def event(kind: str, **data: Any) -> bytes:
        return _sse(kind, {"sequence_number": next(numbers), **data})

    final = _response(RESPONSES_USAGE)
    item: Any = final["output"][0]  # type: ignore[index]
    ids = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    return [
        event("response.created", response=_response(None, "in_progress")),
        event(
            "response.output_item.added",
            output_index=0,
            item={**item, "status": "in_progress", "content": []},
        ),
        event(
            "response.content_part.added", **ids, part={"type": "output_text", "text": "", "annotations": []}
        ),
        event("response.output_text.delta", **ids, delta=ANSWER, logprobs=[]),
        event("response.output_text.done", **ids, text=ANSWER, logprobs=[]),
        event("response.content_part.done", **ids, part=item["content"][0]),
        event("response.output_item.done", output_index=0, item=item),
        event("response.completed", response=final),
    ]


def upstream_response(frames: list[bytes]) -> UpstreamResponse:
    async def body() -> AsyncIterator[bytes]:
        for frame in frames:
            yield frame

    async def close() -> None:
        return None

    return UpstreamResponse(200, [(b"content-type", b"text/event-stream")], body(), close)


def relayed(relay: messages_native.NativeRelay | responses_native.NativeResponsesRelay) -> ChatOutcome:
    """The relay run to its end, as the gateway runs it for a client reading the whole stream."""

    async def run() -> ChatOutcome:
        async for _ in relay.frames():
            pass
        return relay.outcome(200, disconnected=False)

    return asyncio.run(run())


@pytest.mark.parametrize("name", list(ANTHROPIC_STREAMS))
def test_an_anthropic_stream_keeps_cache_reads_and_writes_from_whichever_event_has_them(name: str) -> None:
    start, delta = ANTHROPIC_STREAMS[name]
    outcome = relayed(messages_native.NativeRelay(upstream_response(anthropic_frames(start, delta))))
    assert outcome.status == "complete"
    assert normalise(outcome.usage) == ANTHROPIC_READING
    # The chat form the store keeps says it too, in OpenAI's and in Anthropic's names.
    assert outcome.usage is not None
    assert outcome.usage["prompt_tokens"] == 2000
    assert outcome.usage["prompt_tokens_details"] == {"cached_tokens": 1500}
    assert outcome.usage["cache_creation_input_tokens"] == 200


def test_an_anthropic_answer_reads_into_the_chat_form_with_its_cache_figures() -> None:
    outcome = messages_native.outcome_of(200, orjson.dumps(_anthropic_message(ANTHROPIC_USAGE)))
    assert normalise(outcome.usage) == ANTHROPIC_READING
    assert outcome.usage is not None and outcome.usage["cache_read_input_tokens"] == 1500


def test_a_responses_answer_keeps_its_cached_tokens_streamed_and_not() -> None:
    buffered = responses_native.outcome_of(200, orjson.dumps(_response(RESPONSES_USAGE)))
    streamed = relayed(responses_native.NativeResponsesRelay(upstream_response(responses_frames())))
    for outcome in (buffered, streamed):
        assert outcome.status == "complete"
        assert normalise(outcome.usage) == OPENAI_READING
        assert outcome.usage is not None and outcome.usage["prompt_tokens_details"] == {"cached_tokens": 1536}


# ----------------------------------------------------------------------------------------- pricing


GPT5 = ModelPrice(model="gpt-5", input=1.25, cached_input=0.125, output=10.0)
CLAUDE = ModelPrice(model="claude-sonnet", input=3.0, cached_input=0.3, cache_write=3.75, output=15.0)


def record(
    number: int, original: int, sent: int, usage: JSONObject | None, model: str = "gpt-5"
) -> RequestRecord:
    return RequestRecord(
        id=f"r{number}",
        tenant="acme",
        conversation_id="c",
        user_id=None,
        parent_message_id=None,
        model=model,
        stream=False,
        status="complete" if usage else "failed",
        http_status=200 if usage else 502,
        original_tokens=original,
        sent_tokens=sent,
        report=None,
        usage=usage,
        error=None,
        latency_ms=1.0,
        created_at=datetime(2026, 3, 1, 12, number, tzinfo=UTC),
    )


def test_a_price_is_found_by_name_or_the_longest_name_a_model_starts_with() -> None:
    mini = ModelPrice(model="gpt-5-mini", input=0.25, cached_input=0.025, output=2.0)
    pricing = PricingConfig(models=(GPT5, mini))
    assert price_of(pricing, "gpt-5") == GPT5
    assert price_of(pricing, "gpt-5-2025-08-07") == GPT5
    assert price_of(pricing, "gpt-5-mini-2025-08-07") == mini
    assert price_of(pricing, "gpt-4o") is None and price_of(pricing, None) is None


def test_effective_cost_against_full_replay_with_prices() -> None:
    """Turn 2 sent 1,000 of a 3,000-token history: replay would have sent its 2,000 input plus the 2,000
    left out, two thirds of it (turn 1's history over turn 2's) cached."""
    usage = {
        "prompt_tokens": 2000,
        "completion_tokens": 100,
        "prompt_tokens_details": {"cached_tokens": 1000},
    }
    records = [
        record(1, 1000, 1000, {"prompt_tokens": 1000, "completion_tokens": 100}),
        record(2, 2000, 2000, None),  # failed: no usage, but its history still sets the next replay share
        record(3, 3000, 1000, usage),
    ]
    cost = conversation_cost(records, PricingConfig(models=(GPT5,)))
    assert cost.unit == USD
    first, failed, third = cost.turns
    assert failed.usage is None and failed.cost is None
    assert first.cost == pytest.approx((1000 * 1.25 + 100 * 10) / 1e6)
    assert first.replay_cost == first.cost  # the first request: nothing cached either way
    assert third.replay_cached_share == pytest.approx(2 / 3)
    assert third.cost == pytest.approx((1000 * 1.25 + 1000 * 0.125 + 100 * 10) / 1e6)
    replay = 2000 + 2000
    assert third.replay_cost == pytest.approx((replay / 3 * 1.25 + replay * 2 / 3 * 0.125 + 100 * 10) / 1e6)
    assert cost.hit_share == pytest.approx(1000 / 3000)
    assert cost.ratio == pytest.approx(cost.cost / cost.replay_cost)
    assert cost.text(0.0123) == "$0.0123"


def test_cache_writes_have_their_price_and_unpriced_models_count_in_uncached_tokens() -> None:
    claude = conversation_cost(
        [record(1, 2000, 2000, ANTHROPIC_USAGE, "claude-sonnet-4-5")], PricingConfig(models=(CLAUDE,))
    )
    assert claude.turns[0].cost == pytest.approx((300 * 3.0 + 1500 * 0.3 + 200 * 3.75 + 40 * 15.0) / 1e6)
    # No price for this model: cached input at the default 10 %, written at the input price, output out.
    plain = conversation_cost(
        [record(1, 2000, 2000, ANTHROPIC_USAGE, "other")], PricingConfig(models=(CLAUDE,))
    )
    assert plain.unit == TOKENS
    assert plain.turns[0].cost == pytest.approx(300 + 150 + 200)
    assert plain.turns[0].replay_cost == pytest.approx(2000)
    assert plain.text(650.0) == "650 uncached input tokens"
    # Mixed with an unpriced model, a priced one counts in its own uncached tokens (its own cached ratio).
    mixed = conversation_cost(
        [record(1, 2000, 2000, ANTHROPIC_USAGE, "claude-sonnet"), record(2, 10, 10, CHAT_USAGE, "x")],
        PricingConfig(models=(CLAUDE,), cached_share=0.5),
    )
    assert mixed.unit == TOKENS
    assert mixed.turns[0].cost == pytest.approx(300 + 1500 * 0.1 + 200 * 1.25)
    assert mixed.turns[1].cost == pytest.approx(464 + 1536 * 0.5)


# -------------------------------------------------------------------------- a provider speaking all three


async def _chat(request: Request) -> Response:
    body = orjson.loads(await request.body())
    completion: JSONObject = {
        "id": "chatcmpl-cache",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body.get("model", "gpt-5"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": CHAT_USAGE,
    }
    if not body.get("stream"):
        return JSONResponse(completion)
    options = body.get("stream_options") or {}

    def chunk(delta: JSONObject, finish: str | None = None, **extra: Any) -> bytes:
        data = {
            "id": "chatcmpl-cache",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": completion["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            **extra,
        }
        return b"data: " + orjson.dumps(data) + b"\n\n"

    frames = [chunk({"role": "assistant", "content": ""}), chunk({"content": ANSWER}), chunk({}, "stop")]
    if options.get("include_usage"):
        usage = {"id": "chatcmpl-cache", "object": "chat.completion.chunk", "created": 1_700_000_000}
        frames.append(
            b"data: "
            + orjson.dumps({**usage, "model": completion["model"], "choices": [], "usage": CHAT_USAGE})
            + b"\n\n"
        )
    frames.append(b"data: [DONE]\n\n")
    return _stream(frames)


async def _messages(request: Request) -> Response:
    body = orjson.loads(await request.body())
    if not body.get("stream"):
        return JSONResponse(_anthropic_message(ANTHROPIC_USAGE))
    return _stream(anthropic_frames(ANTHROPIC_USAGE, {"output_tokens": 40}))


async def _responses(request: Request) -> Response:
    body = orjson.loads(await request.body())
    if not body.get("stream"):
        return JSONResponse(_response(RESPONSES_USAGE))
    return _stream(responses_frames())


def _stream(frames: list[bytes]) -> StreamingResponse:
    async def gen() -> AsyncIterator[bytes]:
        for frame in frames:
            yield frame

    return StreamingResponse(gen(), media_type="text/event-stream")


def provider_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/chat/completions", _chat, methods=["POST"]),
            Route("/v1/messages", _messages, methods=["POST"]),
            Route("/v1/responses", _responses, methods=["POST"]),
        ]
    )


@pytest.fixture
def provider() -> Iterator[BackgroundServer]:
    with BackgroundServer(provider_app()) as server:
        yield server


OPENAI_KEY, NATIVE_KEY, CLAUDE_KEY = "sk-gw-openai", "sk-gw-native", "sk-gw-claude"


@pytest.fixture
def doors(provider: BackgroundServer, make_gateway: Callable[..., Gateway]) -> Gateway:
    """Three tenants before the one provider: OpenAI-compatible (Responses converted to chat), the same
    with Responses forwarded natively, and Anthropic (/v1/messages forwarded natively)."""
    plain = {"retrieval": {"enabled": False}}  # no index: nothing here reads it
    return make_gateway(
        [
            tenant("openai", f"{provider.url}/v1", api_keys=[OPENAI_KEY], **plain),
            tenant("native", f"{provider.url}/v1", api_keys=[NATIVE_KEY], responses="native", **plain),
            tenant("claude", provider.url, api_keys=[CLAUDE_KEY], provider="anthropic", **plain),
        ]
    )


def _chat_door(gateway: Gateway, key: str, stream: bool) -> tuple[str, Any]:
    messages: Any = [{"role": "user", "content": "Hello, cache."}]
    create = gateway.client(key).chat.completions.with_raw_response.create
    if not stream:
        raw = create(model="gpt-5", messages=messages)
        return raw.headers["x-gateway-request-id"], raw.parse().usage.model_dump()
    raw = create(model="gpt-5", messages=messages, stream=True, stream_options={"include_usage": True})
    chunks = list(raw.parse())
    return raw.headers["x-gateway-request-id"], next(c.usage for c in chunks if c.usage).model_dump()


def _messages_door(gateway: Gateway, key: str, stream: bool) -> tuple[str, Any]:
    client: anthropic.Anthropic = gateway.anthropic(key)
    ask: dict[str, Any] = {
        "model": "claude-cache",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hello, cache."}],
    }
    if not stream:
        raw = client.messages.with_raw_response.create(**ask)
        return raw.headers["x-gateway-request-id"], raw.parse().usage.model_dump()
    with client.messages.stream(**ask) as events:
        final = events.get_final_message()
        request_id = events.response.headers["x-gateway-request-id"]
    return request_id, final.usage.model_dump()


def _responses_door(gateway: Gateway, key: str, stream: bool) -> tuple[str, Any]:
    client = gateway.client(key)
    if not stream:
        raw = client.responses.with_raw_response.create(model="gpt-5", input="Hello, cache.")
        usage = raw.parse().usage
        assert usage is not None
        return raw.headers["x-gateway-request-id"], usage.model_dump()
    raw = client.responses.with_raw_response.create(model="gpt-5", input="Hello, cache.", stream=True)
    final = [e.response for e in raw.parse() if e.type == "response.completed"]
    assert len(final) == 1 and final[0].usage is not None
    return raw.headers["x-gateway-request-id"], final[0].usage.model_dump()


CASES = {
    # door, tenant's key, what the store reads, what the client's usage says of the cache
    "chat": (_chat_door, OPENAI_KEY, OPENAI_READING, ("prompt_tokens_details", "cached_tokens"), 1536),
    "messages-converted": (_messages_door, OPENAI_KEY, OPENAI_READING, ("cache_read_input_tokens",), 1536),
    "messages-native": (_messages_door, CLAUDE_KEY, ANTHROPIC_READING, ("cache_creation_input_tokens",), 200),
    "responses-converted": (
        _responses_door,
        OPENAI_KEY,
        OPENAI_READING,
        ("input_tokens_details", "cached_tokens"),
        1536,
    ),
    "responses-native": (
        _responses_door,
        NATIVE_KEY,
        OPENAI_READING,
        ("input_tokens_details", "cached_tokens"),
        1536,
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_door_records_what_the_cache_did(doors: Gateway, case: str, stream: bool) -> None:
    door, key, reading, path, shown = CASES[case]
    request_id, client_usage = door(doors, key, stream)
    value: Any = client_usage
    for part in path:
        value = value[part]
    assert value == shown  # the client's own usage carries the cache figures in its API's names
    recorded(doors, request_id, key)
    stored = api(doors, f"/requests/{request_id}", key)
    assert stored["usage"]["normalised"] == reading.to_json()
    assert stored["report"]["cache"] == {
        "cached": reading.cached_tokens,
        "written": reading.cache_write_tokens,
        "uncached": reading.uncached_tokens,
    }


def _input_tokens(gateway: Gateway) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{gateway.server.url}/metrics").text
    return {
        (s.labels["tenant"], s.labels["kind"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gateway_upstream_input_tokens_total"
    }


def test_metrics_count_upstream_input_tokens_by_kind_and_tenant(doors: Gateway) -> None:
    assert _input_tokens(doors) == {}
    for door, key, *_ in (CASES["chat"], CASES["messages-native"], CASES["messages-native"]):
        request_id, _ = door(doors, key, True)
        recorded(doors, request_id, key)
    assert _input_tokens(doors) == {
        ("openai", "cached"): 1536,
        ("openai", "cache_write"): 0,
        ("openai", "uncached"): 464,
        ("claude", "cached"): 3000,
        ("claude", "cache_write"): 400,
        ("claude", "uncached"): 600,
    }
