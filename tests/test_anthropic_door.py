"""`/v1/messages` in front of an OpenAI-compatible upstream, driven by the official Anthropic SDK.

What counts is what the SDK gets back (its own types, its own stream accumulator, its own exceptions)
and what the fake upstream received (a chat-completions request carrying the rebuilt context).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from gateway.fakes.openai_upstream import Reply, ToolCall
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, recorded, tenant, wait_for_jobs

MODEL = "claude-sonnet-4-5"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def stored_messages(gateway: Gateway, conversation_id: str) -> list[dict[str, Any]]:
    """The stored chat messages of a conversation, oldest first."""
    nodes = api(gateway, f"/conversations/{conversation_id}/messages")["data"]
    return [node["message"] for node in sorted(nodes, key=lambda n: n["depth"])]


def test_a_message_goes_upstream_as_chat_and_comes_back_as_anthropic(
    gateway: Gateway, upstream: Upstream
) -> None:
    client = gateway.anthropic()
    raw = client.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=300,
        system="You are terse.",
        messages=[{"role": "user", "content": "Name a prime above 100."}],
        metadata={"user_id": "u-anna"},
        stop_sequences=["\n\n"],
        output_config={"effort": "low"},
        thinking={"type": "adaptive"},
        extra_headers={"anthropic-beta": "some-beta-2025"},
        extra_body={"temperature": 0.2},  # older models take it; this SDK release no longer offers it
    )
    message = raw.parse()
    assert isinstance(message, anthropic.types.Message)
    assert message.role == "assistant" and message.stop_reason == "end_turn"
    assert message.content[0].type == "text"
    assert "You said: Name a prime above 100." in message.content[0].text
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.id.startswith("msg_")

    received = upstream.fake.last_chat()
    assert received.path == "/v1/chat/completions"
    body = received.body
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime above 100."},
    ]
    assert body["max_tokens"] == 300 and body["temperature"] == 0.2 and body["stop"] == ["\n\n"]
    assert body["user"] == "u-anna" and body["reasoning_effort"] == "low"
    assert "thinking" not in body and raw.headers["x-gateway-dropped-params"] == "thinking"
    # The gateway key (x-api-key) and Anthropic's own headers never reach the chat upstream.
    assert received.headers["authorization"] == "Bearer sk-upstream"
    assert "x-api-key" not in received.headers and "anthropic-beta" not in received.headers

    conversation_id = raw.headers["x-conversation-id"]
    recorded(gateway, raw.headers["x-gateway-request-id"])
    conversation = api(gateway, f"/conversations/{conversation_id}")
    assert conversation["user_id"] == "u-anna"
    stored = stored_messages(gateway, conversation_id)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == message.content[0].text
    record = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")
    assert record["usage"]["completion_tokens"] == message.usage.output_tokens


def test_a_streamed_message_arrives_as_anthropic_events_and_is_stored(
    gateway: Gateway, upstream: Upstream
) -> None:
    upstream.fake.enqueue(Reply("Seventeen is prime and so is one hundred and one."))
    client = gateway.anthropic()
    with client.messages.stream(
        model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "Primes, please."}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
        request_id = stream.response.headers["x-gateway-request-id"]
        conversation_id = stream.response.headers["x-conversation-id"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert final.content[0].type == "text"
    assert final.content[0].text == "Seventeen is prime and so is one hundred and one."
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0
    # The gateway asked the chat upstream for its usage chunk, and read it into message_delta.
    assert upstream.fake.last_chat().body["stream_options"] == {"include_usage": True}

    recorded(gateway, request_id)
    record = api(gateway, f"/requests/{request_id}")
    assert (
        record["status"] == "complete" and record["usage"]["completion_tokens"] == final.usage.output_tokens
    )
    assert stored_messages(gateway, conversation_id)[-1]["content"] == final.content[0].text


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_tool_use_round_trip_stays_one_conversation(
    gateway: Gateway, upstream: Upstream, stream: bool
) -> None:
    upstream.fake.enqueue(
        Reply("Let me look.", tool_calls=(ToolCall("get_weather", '{"city": "Paris"}', id="call_w1"),)),
        Reply("It is 18 degrees and sunny in Paris."),
    )
    client = gateway.anthropic()
    question = {"role": "user", "content": "What is the weather in Paris?"}
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 200,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "auto"},
    }
    if stream:
        with client.messages.stream(messages=[question], **kwargs) as events:
            first = events.get_final_message()
            first_conversation = events.response.headers["x-conversation-id"]
    else:
        raw = client.messages.with_raw_response.create(messages=[question], **kwargs)
        first, first_conversation = raw.parse(), raw.headers["x-conversation-id"]
    assert first.stop_reason == "tool_use"
    assert [block.type for block in first.content] == ["text", "tool_use"]
    tool_use = first.content[1]
    assert tool_use.type == "tool_use"
    assert tool_use.id == "call_w1" and tool_use.name == "get_weather" and tool_use.input == {"city": "Paris"}
    sent = upstream.fake.last_chat().body
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER_TOOL["input_schema"],
                "description": "Current weather in a city.",
            },
        }
    ]
    assert sent["tool_choice"] == "auto"

    wait_for_jobs(gateway)
    history = [
        question,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_w1", "content": "18C, sunny"},
                {"type": "text", "text": "Thanks! Short answer please."},
            ],
        },
    ]
    raw = client.messages.with_raw_response.create(messages=history, **kwargs)
    answer = raw.parse()
    assert answer.content[0].type == "text" and "18 degrees" in answer.content[0].text
    # The SDK's echo of the tool call (input as an object) is recognised as the stored answer.
    assert raw.headers["x-conversation-id"] == first_conversation
    chat = upstream.fake.last_chat().body["messages"]
    assert chat[-3]["tool_calls"][0]["id"] == "call_w1"
    assert json.loads(chat[-3]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert chat[-2] == {"role": "tool", "tool_call_id": "call_w1", "content": "18C, sunny"}
    assert chat[-1] == {"role": "user", "content": "Thanks! Short answer please."}
    recorded(gateway, raw.headers["x-gateway-request-id"])
    roles = [m["role"] for m in stored_messages(gateway, first_conversation)]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]


def test_blocks_images_and_thinking_are_kept_in_the_store_and_cut_for_a_chat_upstream(
    gateway: Gateway, upstream: Upstream
) -> None:
    thinking = {"type": "thinking", "thinking": "The user wants a colour.", "signature": "sig-abc"}
    history = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What colour is this?", "cache_control": {"type": "ephemeral"}},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
            ],
        },
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "It is red."}]},
        {"role": "user", "content": "And the border?"},
    ]
    raw = gateway.anthropic().messages.with_raw_response.create(
        model=MODEL,
        max_tokens=100,
        system=[{"type": "text", "text": "Describe images.", "cache_control": {"type": "ephemeral"}}],
        messages=history,
    )
    assert raw.parse().content[0].type == "text"
    chat = upstream.fake.last_chat().body["messages"]
    assert chat[0] == {"role": "system", "content": [{"type": "text", "text": "Describe images."}]}
    assert chat[1]["content"] == [
        {"type": "text", "text": "What colour is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    assert chat[2] == {"role": "assistant", "content": "It is red."}  # no thinking_blocks for a chat server
    recorded(gateway, raw.headers["x-gateway-request-id"])
    stored = stored_messages(gateway, raw.headers["x-conversation-id"])
    assert stored[1]["thinking_blocks"] == [thinking]  # signature and all, for the way back
    assert stored[0]["content"][0]["cache_control"] == {"type": "ephemeral"}


def test_bad_requests_get_anthropic_errors_naming_the_field(gateway: Gateway, upstream: Upstream) -> None:
    client = gateway.anthropic()
    # The SDK itself refuses a call without max_tokens; other clients send one.
    missing = httpx.post(
        f"{gateway.server.url}/v1/messages",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": GATEWAY_KEY, "anthropic-version": "2023-06-01"},
    )
    assert missing.status_code == 400
    assert missing.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    with pytest.raises(anthropic.BadRequestError) as block:
        client.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=[{"role": "user", "content": [{"type": "hologram", "data": "x"}]}],  # type: ignore[list-item]
        )
    assert "messages.0.content.0.type" in block.value.message
    with pytest.raises(anthropic.BadRequestError) as role:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "robot", "content": "hi"}])  # type: ignore[misc,list-item]
    assert "messages.0.role" in role.value.message
    broken = httpx.post(
        f"{gateway.server.url}/v1/messages",
        content=b"{not json",
        headers={"x-api-key": GATEWAY_KEY, "content-type": "application/json"},
    )
    assert broken.status_code == 400 and broken.json()["type"] == "error"
    with pytest.raises(anthropic.AuthenticationError) as denied:
        gateway.anthropic(api_key="sk-wrong").messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert upstream.fake.chat_requests() == []  # nothing was forwarded, nothing stored half-way
    assert api(gateway, "/conversations")["data"] == []


def test_upstream_errors_come_back_in_anthropic_shape(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(
        Reply(status=429, error={"message": "Slow down", "type": "rate_limit_error", "code": None}),
        Reply("Only half of this arrives", break_after_chunks=2),
    )
    client = gateway.anthropic()
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert limited.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Slow down"},
    }
    with (
        pytest.raises(anthropic.APIStatusError) as broken,
        client.messages.stream(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "again"}]
        ) as s,
    ):
        for _ in s:
            pass
    assert "upstream" in str(broken.value.message)


def test_count_tokens_is_estimated_and_says_so(gateway: Gateway) -> None:
    client = gateway.anthropic()
    short = client.messages.with_raw_response.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    long = client.messages.count_tokens(
        model=MODEL,
        system="You are a careful assistant.",
        messages=[{"role": "user", "content": "Tell me about the history of Roman roads. " * 20}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert short.headers["x-gateway-token-count"].startswith("estimated")
    assert 0 < short.parse().input_tokens < long.input_tokens
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model=MODEL, messages=[])


def test_the_async_client_streams_too(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply("Async hello there."))

    async def run() -> str:
        async with gateway.async_anthropic() as client:
            parts: list[str] = []
            async with client.messages.stream(
                model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "Say hello."}]
            ) as stream:
                async for text in stream.text_stream:
                    parts.append(text)
            return "".join(parts)

    assert asyncio.run(run()) == "Async hello there."


def turn(n: int) -> str:
    return f"Step {n}: we renamed module_{n}.py and kept the notes brief."


def test_a_200_turn_conversation_stays_bounded_keeps_its_tail_and_branches_on_edit(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    budget = 1_500
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": budget, "recent_tokens": 500},
                compaction={"enabled": False},
            )
        ]
    )
    client = gateway.anthropic()
    history: list[dict[str, Any]] = []
    for n in range(200):
        history.append({"role": "user", "content": turn(n)})
        history.append({"role": "assistant", "content": f"Noted step {n}."})
    history.append({"role": "user", "content": "What did we rename last?"})
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=50, messages=history)
    assert int(raw.headers["x-context-tokens-sent"]) <= budget
    assert int(raw.headers["x-context-tokens-original"]) > 4 * budget
    chat = upstream.fake.last_chat().body["messages"]
    assert chat[-1] == {"role": "user", "content": "What did we rename last?"}
    # The verbatim tail, then the question; retrieved context may stand between them (the history has
    # no vectors yet, so the question is asked over it as if it matched: docs/retrieval.md).
    kept = [m for m in chat if not str(m["content"]).startswith("<gateway_context>")]
    assert kept[-3] == {"role": "user", "content": turn(199)}
    conversation_id = raw.headers["x-conversation-id"]
    recorded(gateway, raw.headers["x-gateway-request-id"])

    edited = [*history[:-1], {"role": "user", "content": "What did we rename first?"}]
    again = client.messages.with_raw_response.create(model=MODEL, max_tokens=50, messages=edited)
    assert again.headers["x-conversation-id"] == conversation_id  # the same conversation, a new branch
    recorded(gateway, again.headers["x-gateway-request-id"])
    nodes = api(gateway, f"/conversations/{conversation_id}/messages")["data"]
    questions = [n for n in nodes if str(n["message"]["content"]).startswith("What did we rename")]
    assert len(questions) == 2 and questions[0]["parent_id"] == questions[1]["parent_id"]
    assert len(nodes) == 401 + 1 + 1 + 1  # the history, the first answer, the edit, its answer


def test_an_identifier_150_turns_back_is_retrieved(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": 600},
                compaction={"enabled": False},
            )
        ]
    )
    client = gateway.anthropic()
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "The nightly export failed again."},
        {"role": "assistant", "content": "The log says export_ledger.py died with ERR-BLUEHERON-4471."},
    ]
    for n in range(150):
        history.append({"role": "user", "content": f"Unrelated chat number {n} about gardening and tea."})
        history.append({"role": "assistant", "content": f"Sure, gardening note {n}."})
    history.append({"role": "user", "content": "OK."})
    first = client.messages.with_raw_response.create(model=MODEL, max_tokens=20, messages=history)
    recorded(gateway, first.headers["x-gateway-request-id"])
    wait_for_jobs(gateway, timeout=300)
    history += [
        {"role": "assistant", "content": first.parse().content[0].text},  # type: ignore[union-attr]
        {"role": "user", "content": "Which error code did export_ledger.py fail with?"},
    ]
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=20, messages=history)
    forwarded = upstream.fake.last_chat().body["messages"]
    context = "\n".join(str(m["content"]) for m in forwarded if m["role"] == "system")
    assert "ERR-BLUEHERON-4471" in context
    report = api(gateway, f"/requests/{raw.headers['x-gateway-request-id']}")["report"]
    assert report["sections"]["retrieval"]["message_ids"]


def test_a_claude_code_style_session_stays_one_conversation(gateway: Gateway, upstream: Upstream) -> None:
    """Streams always, system blocks, cache_control moved to the newest turn on every call, a server tool
    among the client tools, `thinking` asked for: the chat upstream gets what it can serve, and each call
    continues the same stored path."""
    client = gateway.anthropic()
    system = [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Work in /repo."},
    ]
    tools = [WEATHER_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]

    def turn(messages: list[dict[str, Any]]) -> tuple[str, str]:
        last = messages[-1]
        marked = [
            *messages[:-1],
            {
                **last,
                "content": [
                    {"type": "text", "text": last["content"], "cache_control": {"type": "ephemeral"}}
                ],
            },
        ]
        with client.messages.stream(
            model=MODEL,
            max_tokens=512,
            system=system,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            thinking={"type": "enabled", "budget_tokens": 1024},
            metadata={"user_id": "user_dev_session_1"},
            messages=marked,  # type: ignore[arg-type]
        ) as stream:
            text = stream.get_final_message().content[0].text  # type: ignore[union-attr]
            headers = stream.response.headers
        assert headers["x-gateway-dropped-params"] == "thinking,tools.1(web_search_20250305)"
        return text, headers["x-conversation-id"]

    history: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    answer, conversation = turn(history)
    sent = upstream.fake.last_chat().body
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"]
    wait_for_jobs(gateway)
    for question in ("Open the README.", "Now run the tests."):
        history += [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
        answer, again = turn(history)
        assert again == conversation
        wait_for_jobs(gateway)
    nodes = api(gateway, f"/conversations/{conversation}/messages")["data"]
    assert len(nodes) == 6  # three questions, three answers: no branch, nothing stored twice
