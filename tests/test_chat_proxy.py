"""Chat completions through the gateway equal what the client gets from the provider directly."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from openai import OpenAI

from gateway.fakes.openai_upstream import Reply, ToolCall
from tests.conftest import Gateway, Upstream

VOLATILE = {"id", "created"}
MESSAGES: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of Portugal?"},
]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
WEATHER = ToolCall(name="get_weather", arguments='{"city": "Lisbon", "unit": "celsius"}', id="call_abc")


def direct(upstream: Upstream) -> OpenAI:
    return OpenAI(base_url=upstream.base_url, api_key="sk-upstream", max_retries=0)


def dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(exclude=VOLATILE)


def test_non_stream_equals_direct(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply("Lisbon."), Reply("Lisbon."))
    want = direct(upstream).chat.completions.create(model="m", messages=MESSAGES)
    got = gateway.client().chat.completions.create(model="m", messages=MESSAGES)
    assert got.choices[0].message.content == "Lisbon."
    assert dump(got) == dump(want)


def test_stream_equals_direct_and_usage_chunk_is_hidden(gateway: Gateway, upstream: Upstream) -> None:
    text = "Lisbon is the capital and largest city of Portugal."
    upstream.fake.enqueue(Reply(text), Reply(text))
    want = [
        dump(c) for c in direct(upstream).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ]
    got = [
        dump(c) for c in gateway.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ]
    assert got == want
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in got if c["choices"]) == text
    assert all(c["usage"] is None for c in got)
    # The gateway asked the provider for usage on its own, to meter the request.
    assert upstream.fake.last_chat().body["stream_options"] == {"include_usage": True}


def test_stream_usage_reaches_a_client_that_asked(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply("One two three."), Reply("One two three."))
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
    kwargs["stream_options"] = {"include_usage": True}
    want = [dump(c) for c in direct(upstream).chat.completions.create(**kwargs)]
    got = [dump(c) for c in gateway.client().chat.completions.create(**kwargs)]
    assert got == want
    assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] == 3


def test_tool_calls_non_stream_and_stream(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(*(Reply(None, tool_calls=(WEATHER,)) for _ in range(4)))
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"}
    want = direct(upstream).chat.completions.create(**kwargs)
    got = gateway.client().chat.completions.create(**kwargs)
    assert dump(got) == dump(want)
    call = got.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_abc",
        "get_weather",
        WEATHER.arguments,
    )  # type: ignore[union-attr]

    want_chunks = [dump(c) for c in direct(upstream).chat.completions.create(stream=True, **kwargs)]
    got_chunks = [dump(c) for c in gateway.client().chat.completions.create(stream=True, **kwargs)]
    assert got_chunks == want_chunks
    arguments = "".join(
        d["function"]["arguments"]
        for c in got_chunks
        if c["choices"]
        for d in c["choices"][0]["delta"]["tool_calls"] or []
    )
    assert arguments == WEATHER.arguments
    assert got_chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_every_request_field_is_forwarded_as_sent(gateway: Gateway, upstream: Upstream) -> None:
    fields: dict[str, Any] = {
        "model": "m",
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_object"},
        "logprobs": True,
        "top_logprobs": 2,
        "n": 2,
        "seed": 7,
        "temperature": 0.2,
        "max_tokens": 64,
        "stop": ["\n\n"],
        "user": "user-1",
        "metadata": {"conversation_id": "c-1"},
    }
    raw = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={**fields, "x_vendor_extension": {"keep": [1, None]}},
        headers={"Authorization": "Bearer sk-gw-acme", "OpenAI-Organization": "org-1", "X-Custom": "yes"},
    )
    assert raw.status_code == 200
    received = upstream.fake.last()
    assert received.body == {**fields, "x_vendor_extension": {"keep": [1, None]}}
    assert received.headers["openai-organization"] == "org-1"
    assert received.headers["x-custom"] == "yes"
    assert received.headers["authorization"] == "Bearer sk-upstream"


def test_unchanged_request_is_forwarded_byte_for_byte(gateway: Gateway, upstream: Upstream) -> None:
    body = b'{"model":"m",  "messages":[{"role":"user","content":"hi","name":null}],"temperature":1.0}'
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=body,
        headers={"Authorization": "Bearer sk-gw-acme", "Content-Type": "application/json"},
    )
    assert response.status_code == 200
    assert upstream.fake.last_chat().raw == body


def test_response_headers(gateway: Gateway) -> None:
    response = gateway.client().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert float(response.headers["x-gateway-overhead-ms"]) >= 0
    assert len(response.headers["x-gateway-request-id"]) == 32
    assert response.headers["content-type"] == "application/json"


def test_async_client_stream_and_non_stream(gateway: Gateway, upstream: Upstream) -> None:
    async def scenario() -> tuple[str | None, str]:
        client = gateway.async_client()
        completion = await client.chat.completions.create(model="m", messages=MESSAGES)
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        await client.close()
        return completion.choices[0].message.content, "".join(parts)

    upstream.fake.enqueue(Reply("Lisbon."), Reply("It is Lisbon."))
    assert asyncio.run(scenario()) == ("Lisbon.", "It is Lisbon.")


def test_concurrent_async_streams_keep_their_own_frames(gateway: Gateway) -> None:
    async def one(client: Any, n: int) -> str:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"number {n}"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def scenario() -> list[str]:
        client = gateway.async_client()
        try:
            return await asyncio.gather(*(one(client, n) for n in range(40)))
        finally:
            await client.close()

    answers = asyncio.run(scenario())
    assert answers == [f"(fake model) I read 1 messages. You said: number {n}" for n in range(40)]
