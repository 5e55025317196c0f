"""The litellm upstream: an OpenAI SDK talks to the gateway, the gateway talks Anthropic to a fake Claude."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.adapters.litellm_upstream import LiteLLMUpstream, load_litellm
from gateway.config import UpstreamConfig
from gateway.fakes.anthropic_upstream import FakeAnthropic, Reply, ToolUse
from gateway.fakes.server import BackgroundServer
from gateway.ports import ChatPayload
from tests.conftest import Gateway, tenant

KEY = "sk-gw-claude"
MODELS = ["claude-fake", "claude-other"]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module", autouse=True)
def _litellm_imported() -> None:
    # Pay litellm's multi-second import once, outside any server's start-up deadline.
    load_litellm()


@pytest.fixture
def claude() -> Iterator[tuple[FakeAnthropic, BackgroundServer]]:
    fake = FakeAnthropic()
    with BackgroundServer(fake.app()) as server:
        yield fake, server


@pytest.fixture
def fake(claude: tuple[FakeAnthropic, BackgroundServer]) -> FakeAnthropic:
    return claude[0]


@pytest.fixture
def gateway(claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]) -> Gateway:
    # litellm appends /v1/messages itself, so the base URL is the server root, as for api.anthropic.com.
    upstream = {"provider": "anthropic", "api_key": "sk-ant-test", "models": MODELS}
    return make_gateway([tenant("claude", claude[1].url, api_keys=[KEY], **upstream)])


def user(text: str) -> Any:
    return [{"role": "user", "content": text}]


def test_non_stream_text(gateway: Gateway, fake: FakeAnthropic) -> None:
    fake.enqueue(Reply(text="Bonjour from Claude."))
    completion = gateway.client(KEY).chat.completions.create(model="claude-fake", messages=user("hello"))
    assert completion.object == "chat.completion"
    assert completion.model == "claude-fake"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Bonjour from Claude."
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3  # the fake counts words
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 3
    # Clean OpenAI shape: none of litellm's private fields reach the client.
    assert completion.model_extra == {}
    assert choice.model_extra == {}
    assert choice.message.model_extra == {}  # no provider_specific_fields, thinking_blocks...
    assert completion.usage.model_extra == {}  # no cache_creation_input_tokens...
    received = fake.last()
    assert received.path == "/v1/messages"
    assert received.body["model"] == "claude-fake"
    assert received.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]


def test_stream_text_assembles(gateway: Gateway, fake: FakeAnthropic) -> None:
    fake.enqueue(Reply(text="one two three four"))
    stream = gateway.client(KEY).chat.completions.create(
        model="claude-fake", messages=user("count"), stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four"
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert all(c.model_extra == {} and all(ch.delta.model_extra == {} for ch in c.choices) for c in chunks)
    # The gateway asked for usage on its own and strips it: the client did not ask.
    assert all(c.usage is None for c in chunks)
    assert fake.last().body["stream"] is True


def test_stream_usage_when_asked(gateway: Gateway, fake: FakeAnthropic) -> None:
    fake.enqueue(Reply(text="a b c d e"))
    stream = gateway.client(KEY).chat.completions.create(
        model="claude-fake", messages=user("hi"), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 5  # Anthropic's message_delta count, not a litellm estimate
    assert last.usage.prompt_tokens > 0
    assert last.usage.model_extra == {}


def test_tool_call_non_stream(gateway: Gateway, fake: FakeAnthropic) -> None:
    fake.enqueue(
        Reply(text=None, tool_uses=(ToolUse("get_weather", {"city": "Paris", "days": 3}, "toolu_7"),))
    )
    completion = gateway.client(KEY).chat.completions.create(
        model="claude-fake", messages=user("weather?"), tools=[WEATHER_TOOL], tool_choice="auto"
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].id == "toolu_7"
    assert calls[0].type == "function"
    function = calls[0].function
    assert function.name == "get_weather"
    assert json.loads(function.arguments) == {"city": "Paris", "days": 3}  # litellm re-serialises it
    sent = fake.last().body
    (tool,) = sent["tools"]
    assert tool["name"] == "get_weather"
    assert tool["description"] == "Weather for a city"
    assert tool["input_schema"] == WEATHER_TOOL["function"]["parameters"]
    assert sent["tool_choice"] == {"type": "auto"}


def test_tool_call_stream(gateway: Gateway, fake: FakeAnthropic) -> None:
    arguments = {"city": "Reykjavík", "note": "long enough to arrive in several input_json_delta pieces"}
    fake.enqueue(Reply(text="Let me check.", tool_uses=(ToolUse("get_weather", arguments, "toolu_9"),)))
    stream = gateway.client(KEY).chat.completions.create(
        model="claude-fake", messages=user("weather?"), tools=[WEATHER_TOOL], stream=True
    )
    text, name, ids, pieces, finish = "", "", set(), [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or []:
            assert call.index == 0
            if call.id:
                ids.add(call.id)
            if call.function and call.function.name:
                name += call.function.name
            if call.function and call.function.arguments:
                pieces.append(call.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert text == "Let me check."
    assert ids == {"toolu_9"}
    assert name == "get_weather"
    assert len(pieces) > 1
    assert json.loads("".join(pieces)) == arguments
    assert finish == "tool_calls"


def test_system_prompt_and_tool_results_converted(gateway: Gateway, fake: FakeAnthropic) -> None:
    messages: Any = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "-3C, snow"},
    ]
    completion = gateway.client(KEY).chat.completions.create(
        model="claude-fake", messages=messages, tools=[WEATHER_TOOL], max_tokens=77, temperature=0.2
    )
    # The last Anthropic "user" turn holds only the tool result, no text.
    assert completion.choices[0].message.content == "(fake claude) I read 3 messages. You said: nothing"
    sent = fake.last().body
    assert sent["system"] == [{"type": "text", "text": "You are terse."}]
    assert sent["max_tokens"] == 77
    assert sent["temperature"] == 0.2
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["user", "assistant", "user"]  # Anthropic has no system or tool roles
    assistant, result = sent["messages"][1], sent["messages"][2]
    tool_use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    assert tool_use in assistant["content"]
    block = result["content"][0]
    assert block["type"] == "tool_result"
    assert block["tool_use_id"] == "toolu_1"


def test_api_key_reaches_provider_not_gateway_key(gateway: Gateway, fake: FakeAnthropic) -> None:
    gateway.client(KEY).chat.completions.create(model="claude-fake", messages=user("hi"))
    headers = fake.last().headers
    assert headers["x-api-key"] == "sk-ant-test"
    assert headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers
    assert KEY not in str(headers)


def test_pass_through_client_key(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    upstream = {"provider": "anthropic", "api_key": None, "pass_through_client_key": True}
    gateway = make_gateway([tenant("byok", server.url, api_keys=["sk-gw-byok"], **upstream)])
    client = gateway.client("sk-ant-client-own", default_headers={"X-Gateway-Key": "sk-gw-byok"})
    client.chat.completions.create(model="claude-fake", messages=user("hi"))
    assert fake.last().headers["x-api-key"] == "sk-ant-client-own"


def test_pass_through_without_client_key_never_uses_server_key(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    upstream = {"provider": "anthropic", "api_key": None, "pass_through_client_key": True}
    gateway = make_gateway([tenant("byok", server.url, api_keys=["sk-gw-byok"], **upstream)])
    # The gateway key as bearer names the tenant but carries no provider key: litellm must not fall back
    # to an ANTHROPIC_API_KEY in the server's environment.
    with pytest.raises(openai.AuthenticationError) as caught:
        gateway.client("sk-gw-byok").chat.completions.create(model="claude-fake", messages=user("hi"))
    assert caught.value.code == "missing_api_key"
    assert fake.received == []


@pytest.mark.parametrize(
    ("status", "error_type", "exception"),
    [
        (429, "rate_limit_error", openai.RateLimitError),
        (400, "invalid_request_error", openai.BadRequestError),
        (401, "authentication_error", openai.AuthenticationError),
        (529, "overloaded_error", openai.InternalServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_provider_error_keeps_status_and_message(
    gateway: Gateway,
    fake: FakeAnthropic,
    status: int,
    error_type: str,
    exception: type[openai.APIStatusError],
    stream: bool,
) -> None:
    fake.enqueue(Reply(status=status, error_type=error_type, error_message=f"provider says {status}"))
    with pytest.raises(exception) as caught:
        gateway.client(KEY).chat.completions.create(model="claude-fake", messages=user("hi"), stream=stream)
    assert caught.value.status_code == status
    assert caught.value.body == {
        "message": f"provider says {status}",
        "type": error_type,
        "param": None,
        "code": None,
    }
    if status == 429:
        assert caught.value.response.headers["retry-after"] == "7"
    assert len(fake.received) == 1  # litellm did not retry behind the client's back


def test_error_mid_stream_arrives_in_band(gateway: Gateway, fake: FakeAnthropic) -> None:
    fake.enqueue(Reply(text="one two three four five", stream_error_after=5, error_message="Overloaded"))
    stream = gateway.client(KEY).chat.completions.create(
        model="claude-fake", messages=user("hi"), stream=True
    )
    text = ""
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            text += chunk.choices[0].delta.content or "" if chunk.choices else ""
    assert text == "one two"  # what came before the failure still reached the client
    assert "Overloaded" in caught.value.message


def test_client_disconnect_cancels_provider_stream(gateway: Gateway, fake: FakeAnthropic) -> None:
    fake.enqueue(Reply(text=" ".join(["word"] * 40), event_delay=0.05))
    with gateway.client(KEY).chat.completions.create(
        model="claude-fake", messages=user("hi"), stream=True
    ) as stream:
        first = next(iter(stream))
        assert first.choices[0].delta.content == "word"
    deadline = time.monotonic() + 5
    while fake.disconnects == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.disconnects == 1


def test_close_cancels_an_unfinished_stream(claude: tuple[FakeAnthropic, BackgroundServer]) -> None:
    fake, server = claude
    fake.enqueue(Reply(text=" ".join(["word"] * 40), event_delay=0.05))
    config = UpstreamConfig(provider="anthropic", base_url=server.url, api_key="sk-ant-test")

    async def read_one_then_close() -> tuple[bytes, int]:
        upstream = LiteLLMUpstream("claude", config)
        payload = ChatPayload({"model": "claude-fake", "messages": user("hi"), "stream": True})
        response = await upstream.chat_completions(payload, [], None)
        first = await anext(response.body)
        await response.close()  # no cancellation, no loop shutdown: close() alone must end it
        for _ in range(100):
            if fake.disconnects:
                break
            await asyncio.sleep(0.02)
        return first, fake.disconnects

    first, disconnects = asyncio.run(read_one_then_close())
    assert first.startswith(b"data: {") and b'"content":"word"' in first
    assert disconnects == 1


def test_unreachable_provider_is_502(make_gateway: Callable[..., Gateway]) -> None:
    with BackgroundServer(FakeAnthropic().app()) as server:
        port = server.port
    gateway = make_gateway(
        [tenant("claude", f"http://127.0.0.1:{port}", api_keys=[KEY], provider="anthropic")]
    )
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.client(KEY).chat.completions.create(model="claude-fake", messages=user("hi"))
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_unreachable"


def test_slow_provider_is_504(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    upstream = {"provider": "anthropic", "timeout_seconds": 0.3}
    gateway = make_gateway([tenant("claude", server.url, api_keys=[KEY], **upstream)])
    fake.enqueue(Reply(delay=1.0))
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.client(KEY).chat.completions.create(model="claude-fake", messages=user("hi"))
    assert caught.value.status_code == 504
    assert caught.value.body["code"] == "upstream_timeout"


def test_unsupported_hints_dropped_and_named(gateway: Gateway, fake: FakeAnthropic) -> None:
    response = gateway.client(KEY).chat.completions.with_raw_response.create(
        model="claude-fake", messages=user("hi"), seed=7, n=1, frequency_penalty=0.5, top_p=0.9
    )
    assert set(response.headers["x-gateway-dropped-params"].split(",")) == {"seed", "n", "frequency_penalty"}
    assert response.parse().choices[0].message.content
    sent = fake.last().body
    assert sent["top_p"] == 0.9
    assert not {"seed", "n", "frequency_penalty"} & set(sent)


def test_unsupported_shape_changing_param_is_refused(gateway: Gateway, fake: FakeAnthropic) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client(KEY).chat.completions.create(model="claude-fake", messages=user("hi"), n=2)
    assert "'n'" in caught.value.message
    assert fake.received == []


def test_litellm_controls_in_body_are_ignored(gateway: Gateway, fake: FakeAnthropic) -> None:
    # litellm takes api_base/api_key/mock_response as keywords; from a client body they must not count.
    extra = {"api_base": "http://203.0.113.1", "api_key": "stolen", "mock_response": "fake!"}
    completion = gateway.client(KEY).chat.completions.create(
        model="claude-fake", messages=user("hi"), extra_body=extra
    )
    assert completion.choices[0].message.content == "(fake claude) I read 1 messages. You said: hi"
    assert fake.last().headers["x-api-key"] == "sk-ant-test"


def test_models_lists_configured_models(gateway: Gateway) -> None:
    models = gateway.client(KEY).models.list()
    assert [m.id for m in models.data] == MODELS
    assert {m.owned_by for m in models.data} == {"anthropic"}


def test_other_endpoints_are_501(gateway: Gateway, fake: FakeAnthropic) -> None:
    response = httpx.post(
        f"{gateway.base_url}/embeddings",
        json={"model": "claude-fake", "input": "hi"},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 501
    error = response.json()["error"]
    assert error["code"] == "not_supported"
    assert error["type"] == "invalid_request_error"
    assert "anthropic" in error["message"] and "/v1/embeddings" in error["message"]
    assert fake.received == []
