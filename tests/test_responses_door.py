"""`/v1/responses` in front of a chat-completions upstream, driven by the official openai SDK's
`client.responses` (create, stream, retrieve, delete; previous_response_id chains; function tools)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.fakes.openai_upstream import Reply, ToolCall
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, recorded, tenant, wait_for_jobs

MODEL = "gpt-4.1-mini"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


def stored(gateway: Gateway, conversation_id: str) -> list[dict[str, Any]]:
    nodes = api(gateway, f"/conversations/{conversation_id}/messages")["data"]
    return [node["message"] for node in sorted(nodes, key=lambda n: n["depth"])]


def test_a_response_is_created_stored_and_retrieved(gateway: Gateway, upstream: Upstream) -> None:
    client = gateway.client()
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        instructions="You are terse.",
        input="Name a prime above 100.",
        max_output_tokens=200,
        temperature=0.3,
        metadata={"ticket": "T-1"},
        user="u-ben",
    )
    response = raw.parse()
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed"
    assert "You said: Name a prime above 100." in response.output_text
    assert response.usage is not None and response.usage.output_tokens > 0
    assert response.instructions == "You are terse." and response.metadata == {"ticket": "T-1"}
    body = upstream.fake.last_chat().body
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime above 100."},
    ]
    assert body["max_tokens"] == 200 and body["temperature"] == 0.3 and body["user"] == "u-ben"
    assert "metadata" not in body and "store" not in body

    again = client.responses.retrieve(response.id)
    assert again.id == response.id and again.output_text == response.output_text
    conversation = api(gateway, f"/conversations/{raw.headers['x-conversation-id']}")
    assert conversation["user_id"] == "u-ben"
    deleted = httpx.delete(
        f"{gateway.base_url}/responses/{response.id}", headers={"Authorization": f"Bearer {GATEWAY_KEY}"}
    )
    assert deleted.json() == {"id": response.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_previous_response_id_chains_through_the_gateways_own_tree(
    gateway: Gateway, upstream: Upstream
) -> None:
    upstream.fake.enqueue(Reply("Noted: order A-77."), Reply("Your order is A-77."), Reply("Still A-77."))
    client = gateway.client()
    first = client.responses.with_raw_response.create(model=MODEL, input="My order number is A-77.")
    second = client.responses.with_raw_response.create(
        model=MODEL, input="What is my order number?", previous_response_id=first.parse().id
    )
    assert second.parse().output_text == "Your order is A-77."
    # The client sent one new message; the upstream got the whole chain, from the gateway's store.
    assert upstream.fake.last_chat().body["messages"] == [
        {"role": "user", "content": "My order number is A-77."},
        {"role": "assistant", "content": "Noted: order A-77."},
        {"role": "user", "content": "What is my order number?"},
    ]
    assert second.parse().previous_response_id == first.parse().id
    assert second.headers["x-conversation-id"] == first.headers["x-conversation-id"]
    # Chaining from the first response again is a branch, not a continuation of the second.
    third = client.responses.create(model=MODEL, input="Repeat it.", previous_response_id=first.parse().id)
    assert third.output_text == "Still A-77."
    assert [m["role"] for m in upstream.fake.last_chat().body["messages"]] == ["user", "assistant", "user"]
    recorded(gateway, second.headers["x-gateway-request-id"])
    nodes = api(gateway, f"/conversations/{first.headers['x-conversation-id']}/messages")["data"]
    assert len(nodes) == 6


def test_a_streamed_response_has_the_responses_events_and_chains(
    gateway: Gateway, upstream: Upstream
) -> None:
    upstream.fake.enqueue(Reply("Streaming words arrive one by one."), Reply("Chained after a stream."))
    client = gateway.client()
    with client.responses.stream(model=MODEL, input="Stream something.") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.completed"
    assert final.output_text == "Streaming words arrive one by one."
    assert final.usage is not None and final.usage.input_tokens > 0
    # Stored before response.completed was released: a chain can start at once.
    chained = client.responses.create(model=MODEL, input="And then?", previous_response_id=final.id)
    assert chained.output_text == "Chained after a stream."
    assert upstream.fake.last_chat().body["messages"][1] == {
        "role": "assistant",
        "content": "Streaming words arrive one by one.",
    }
    assert client.responses.retrieve(final.id).output_text == final.output_text


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_function_tools_round_trip_by_chain_and_by_resent_items(
    gateway: Gateway, upstream: Upstream, stream: bool
) -> None:
    call = ToolCall("get_weather", '{"city": "Paris"}', id="call_w1")
    upstream.fake.enqueue(Reply(None, tool_calls=(call,)), Reply("18 degrees in Paris."), Reply("Still 18."))
    client = gateway.client()
    question = "Weather in Paris?"
    if stream:
        with client.responses.stream(model=MODEL, input=question, tools=[WEATHER]) as events:  # type: ignore[list-item]
            first = events.get_final_response()
    else:
        first = client.responses.create(model=MODEL, input=question, tools=[WEATHER])  # type: ignore[list-item]
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    assert calls[0].call_id == "call_w1" and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    sent = upstream.fake.last_chat().body
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {k: WEATHER[k] for k in ("name", "description", "parameters", "strict")},
        }
    ]
    output = {"type": "function_call_output", "call_id": "call_w1", "output": "18C, sunny"}
    chained = client.responses.create(
        model=MODEL,
        input=[output],  # type: ignore[list-item]
        previous_response_id=first.id,
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert chained.output_text == "18 degrees in Paris."
    chat = upstream.fake.last_chat().body["messages"]
    assert chat[-2]["tool_calls"][0]["id"] == "call_w1"
    assert chat[-1] == {"role": "tool", "tool_call_id": "call_w1", "content": "18C, sunny"}

    wait_for_jobs(gateway)
    # A client that keeps its own items (no previous_response_id) resends them: recognised, no branch.
    items = [
        {"role": "user", "content": question},
        *[item.model_dump(exclude_none=True) for item in first.output],
        output,
    ]
    resent = client.responses.with_raw_response.create(model=MODEL, input=items, tools=[WEATHER])  # type: ignore[arg-type]
    assert resent.parse().output_text == "Still 18."
    recorded(gateway, resent.headers["x-gateway-request-id"])
    messages = stored(gateway, resent.headers["x-conversation-id"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "assistant"]


def test_store_false_responses_cannot_be_fetched_or_chained(gateway: Gateway) -> None:
    client = gateway.client()
    response = client.responses.create(model=MODEL, input="Keep this off the record.", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as chained:
        client.responses.create(model=MODEL, input="And?", previous_response_id=response.id)
    assert chained.value.code == "previous_response_not_found"
    assert chained.value.param == "previous_response_id"


def test_bad_input_gets_openai_errors_naming_the_field(gateway: Gateway, upstream: Upstream) -> None:
    client = gateway.client()
    with pytest.raises(openai.BadRequestError) as missing:
        client.responses.create(model=MODEL)  # type: ignore[call-overload]
    assert missing.value.param == "input"
    with pytest.raises(openai.BadRequestError) as item:
        client.responses.create(model=MODEL, input=[{"type": "hologram", "data": "x"}])  # type: ignore[list-item]
    assert item.value.param == "input[0].type"
    with pytest.raises(openai.BadRequestError) as part:
        client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_audio", "data": "x"}]}],  # type: ignore[list-item]
        )
    assert part.value.param == "input[0].content[0].type"
    assert upstream.fake.chat_requests() == []
    assert api(gateway, "/conversations")["data"] == []


def test_built_in_tools_are_left_out_for_a_chat_upstream_and_named(
    gateway: Gateway, upstream: Upstream
) -> None:
    raw = gateway.client().responses.with_raw_response.create(
        model=MODEL,
        input="Search the web for the weather.",
        tools=[{"type": "web_search"}, WEATHER],  # type: ignore[list-item]
        reasoning={"effort": "low"},
        truncation="auto",
    )
    assert raw.headers["x-gateway-dropped-params"] == "truncation,tools[0](web_search)"
    body = upstream.fake.last_chat().body
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    assert body["reasoning_effort"] == "low"


def test_upstream_errors_keep_their_shape(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(
        Reply(status=429, error={"message": "Slow down", "type": "rate_limit_error", "code": "rate_limit"}),
        Reply("This stream breaks", break_after_chunks=2),
    )
    client = gateway.client()
    with pytest.raises(openai.RateLimitError) as limited:
        client.responses.create(model=MODEL, input="hi")
    assert limited.value.code == "rate_limit"
    with client.responses.stream(model=MODEL, input="again") as stream:
        kinds = [event.type for event in stream]
    assert kinds[-2:] == ["error", "response.failed"]


def test_the_async_client_chains_too(gateway: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply("First."), Reply("Second."))

    async def run() -> tuple[str, str]:
        async with gateway.async_client() as client:
            first = await client.responses.create(model=MODEL, input="One.")
            second = await client.responses.create(model=MODEL, input="Two.", previous_response_id=first.id)
            return first.output_text, second.output_text

    assert asyncio.run(run()) == ("First.", "Second.")


def test_200_turns_stay_bounded_keep_the_tail_branch_on_edit_and_retrieve_an_old_identifier(
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
    client = gateway.client()
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "The deploy failed."},
        {"role": "assistant", "content": "deploy_api.sh stopped with ERR-KESTREL-5512."},
    ]
    for n in range(200):
        items.append({"role": "user", "content": f"Step {n}: we renamed module_{n}.py and kept notes."})
        items.append({"role": "assistant", "content": f"Noted step {n}."})
    items.append({"role": "user", "content": "OK."})
    first = client.responses.with_raw_response.create(model=MODEL, input=items)  # type: ignore[arg-type]
    assert int(first.headers["x-context-tokens-sent"]) <= budget
    chat = upstream.fake.last_chat().body["messages"]
    assert chat[-1] == {"role": "user", "content": "OK."} and chat[-2] == {
        "role": "assistant",
        "content": "Noted step 199.",
    }
    recorded(gateway, first.headers["x-gateway-request-id"])
    wait_for_jobs(gateway, timeout=300)

    question = client.responses.with_raw_response.create(
        model=MODEL, input="Which error did deploy_api.sh stop with?", previous_response_id=first.parse().id
    )
    context = "\n".join(
        str(m["content"]) for m in upstream.fake.last_chat().body["messages"] if m["role"] == "system"
    )
    assert "ERR-KESTREL-5512" in context
    assert int(question.headers["x-context-tokens-sent"]) <= budget
    edited = client.responses.with_raw_response.create(
        model=MODEL, input="Which script failed?", previous_response_id=first.parse().id
    )
    assert edited.headers["x-conversation-id"] == first.headers["x-conversation-id"]
    recorded(gateway, edited.headers["x-gateway-request-id"])
    nodes = api(gateway, f"/conversations/{first.headers['x-conversation-id']}/messages")["data"]
    questions = [
        n
        for n in nodes
        if n["message"]["content"] in ("Which error did deploy_api.sh stop with?", "Which script failed?")
    ]
    assert len(questions) == 2 and questions[0]["parent_id"] == questions[1]["parent_id"]
