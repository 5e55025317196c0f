"""`/v1/messages` to an Anthropic tenant: forwarded natively to the shipped fake Anthropic server.

Unchanged requests must arrive as the client's own bytes; rebuilt ones as native Anthropic requests with
the injected context in `system` after the client's own text, cache_control and thinking signatures kept.
Answers reach the client as the provider sent them and are stored in the chat form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from gateway.fakes.anthropic_upstream import THINKING_SIGNATURE, FakeAnthropic, Reply, ToolUse
from gateway.fakes.server import BackgroundServer
from tests.conftest import GATEWAY_KEY, Gateway, api, recorded, tenant, wait_for_jobs

MODEL = "claude-fake"
TOOL = {
    "name": "lookup_order",
    "description": "Find an order by its number.",
    "input_schema": {"type": "object", "properties": {"number": {"type": "string"}}},
}


@pytest.fixture
def claude() -> Iterator[tuple[FakeAnthropic, BackgroundServer]]:
    fake = FakeAnthropic()
    with BackgroundServer(fake.app()) as server:
        yield fake, server


def native_gateway(make_gateway: Callable[..., Gateway], server: BackgroundServer, **extra: Any) -> Gateway:
    upstream = {"provider": "anthropic", "api_key": "sk-ant-tenant", "api_keys": [GATEWAY_KEY], **extra}
    return make_gateway([tenant("claude", server.url, **upstream)])


def compaction_runs(gateway: Gateway) -> float:
    metrics = httpx.get(f"{gateway.server.url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("gateway_job_runs_total{") and 'kind="compact"' in line
    )


def stored(gateway: Gateway, conversation_id: str) -> list[dict[str, Any]]:
    nodes = api(gateway, f"/conversations/{conversation_id}/messages")["data"]
    return [node["message"] for node in sorted(nodes, key=lambda n: n["depth"])]


def test_an_unchanged_request_is_forwarded_byte_for_byte(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    gateway = native_gateway(make_gateway, server)
    body = (
        b'{"model":"claude-fake","max_tokens":64,"thinking":{"type":"adaptive"},'
        b'"messages":[{"role":"user","content":"Hi there"}],  "service_tier":"auto"}'
    )
    response = httpx.post(
        f"{gateway.server.url}/v1/messages",
        content=body,
        headers={
            "x-api-key": GATEWAY_KEY,
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "interleaved-thinking-2025-05-14",
            "content-type": "application/json",
        },
    )
    assert response.status_code == 200, response.text
    received = fake.last()
    assert received.raw == body  # spacing, key order and fields Anthropic alone knows: all as sent
    assert received.headers["x-api-key"] == "sk-ant-tenant"  # the tenant's key, never the gateway key
    assert received.headers["anthropic-version"] == "2023-06-01"
    assert received.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert response.json()["content"][0]["text"].startswith("(fake claude)")
    assert response.headers["request-id"] == "req_fake"  # the provider's own headers come back
    recorded(gateway, response.headers["x-gateway-request-id"])
    messages = stored(gateway, response.headers["x-conversation-id"])
    assert [m["role"] for m in messages] == ["user", "assistant"]
    record = api(gateway, f"/requests/{response.headers['x-gateway-request-id']}")
    assert record["usage"]["completion_tokens"] == response.json()["usage"]["output_tokens"]


def test_a_rebuilt_request_stays_native_with_the_context_after_the_clients_system(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    gateway = native_gateway(
        make_gateway,
        server,
        context={"budget_tokens": 900, "recent_tokens": 300},
        compaction={"enabled": False},
    )
    client = gateway.anthropic()
    system = [{"type": "text", "text": "You are the order desk.", "cache_control": {"type": "ephemeral"}}]
    history: list[dict[str, Any]] = []
    for n in range(60):
        history.append({"role": "user", "content": f"Order question {n}: where is parcel P-{n}?"})
        history.append({"role": "assistant", "content": f"Parcel P-{n} is on its way."})
    history.append({"role": "user", "content": "Thanks."})
    imported = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=20, system=system, messages=history
    )  # type: ignore[arg-type]
    assert len(fake.last().body["messages"]) < len(history)  # bounded from the first request on
    recorded(gateway, imported.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)  # the history is indexed: retrieval can bring parcel P-3 back
    history.append({"role": "assistant", "content": imported.parse().content[0].text})  # type: ignore[union-attr]
    fake.enqueue(
        Reply(
            text="Checking.",
            tool_uses=(ToolUse("lookup_order", {"number": "A-77"}, id="toolu_1"),),
            thinking="Look it up.",
        )
    )
    history.append({"role": "user", "content": "Where is parcel P-3 now, and order A-77?"})
    first = client.messages.create(model=MODEL, max_tokens=100, system=system, tools=[TOOL], messages=history)  # type: ignore[arg-type]
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    sent = fake.last().body
    assert sent["tools"] == [TOOL] and sent["max_tokens"] == 100
    assert sent["system"][0] == system[0]  # the client's block, cache_control and all
    assert len(sent["messages"]) < len(history)  # bounded
    # Retrieved history is the volatile tail: it opens the current user turn (Anthropic has no system
    # role mid-conversation), so everything before that turn stays as the previous request sent it.
    tail, question = sent["messages"][-1]["content"][0], sent["messages"][-1]["content"][-1]
    assert sent["messages"][-1]["role"] == "user"
    assert "<gateway_context>" in tail["text"] and "Parcel P-3 is on its way." in tail["text"]
    assert question["text"] == "Where is parcel P-3 now, and order A-77?"
    assert all("<gateway_context>" not in str(m["content"]) for m in sent["messages"][:-1])

    history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    history.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "A-77 shipped Monday"}],
        }
    )
    fake.enqueue(Reply(text="A-77 shipped on Monday."))
    second = client.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=100,
        system=system,
        tools=[TOOL],
        messages=history,  # type: ignore[arg-type]
    )
    assert second.parse().content[0].text == "A-77 shipped on Monday."  # type: ignore[union-attr]
    turns = fake.last().body["messages"]
    # The tool round trip goes back as Anthropic blocks, the thinking block with its signature.
    assert turns[-2]["role"] == "assistant"
    assert turns[-2]["content"][0] == {
        "type": "thinking",
        "thinking": "Look it up.",
        "signature": THINKING_SIGNATURE,
    }
    assert turns[-2]["content"][2] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "lookup_order",
        "input": {"number": "A-77"},
    }
    assert turns[-1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "A-77 shipped Monday"}],
    }
    recorded(gateway, second.headers["x-gateway-request-id"])
    messages = stored(gateway, second.headers["x-conversation-id"])
    assert len(messages) == len(history) + 1  # one conversation: the echoed answer was recognised
    assert messages[-3]["thinking_blocks"][0]["signature"] == THINKING_SIGNATURE


def test_a_native_stream_is_relayed_as_sent_and_stored(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    gateway = native_gateway(make_gateway, server)
    fake.enqueue(Reply(text="Streaming from the native side.", thinking="Short thought."))
    with gateway.anthropic().messages.stream(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Stream please."}]
    ) as stream:
        final = stream.get_final_message()
        request_id = stream.response.headers["x-gateway-request-id"]
        conversation_id = stream.response.headers["x-conversation-id"]
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].signature == THINKING_SIGNATURE  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0
    recorded(gateway, request_id)
    answer = stored(gateway, conversation_id)[-1]
    assert answer["content"] == "Streaming from the native side."
    assert answer["thinking_blocks"] == [
        {"type": "thinking", "thinking": "Short thought.", "signature": THINKING_SIGNATURE}
    ]
    record = api(gateway, f"/requests/{request_id}")
    assert (
        record["status"] == "complete" and record["usage"]["completion_tokens"] == final.usage.output_tokens
    )


def test_provider_errors_and_count_tokens_are_the_providers_own(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    gateway = native_gateway(make_gateway, server)
    client = gateway.anthropic()
    fake.enqueue(Reply(status=529, error_type="overloaded_error", error_message="Overloaded"))
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert overloaded.value.status_code == 529
    assert overloaded.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    fake.enqueue(Reply(text="one two three four five", stream_error_after=3))
    with (
        pytest.raises(anthropic.APIStatusError) as mid_stream,
        client.messages.stream(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "again"}]
        ) as s,
    ):
        for _ in s:
            pass
    assert "fake upstream error" in str(mid_stream.value)

    counted = client.messages.with_raw_response.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "How many tokens is this?"}]
    )
    assert counted.parse().input_tokens > 0
    assert "x-gateway-token-count" not in counted.headers  # the provider counted, not the gateway
    assert fake.last().path == "/v1/messages/count_tokens"


def test_the_memory_tool_is_not_offered_where_the_gateway_cannot_answer_it(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    """Agentic recall answers the model's calls on chat-completions upstreams only: a native Anthropic
    request neither carries memory_search nor spends its budget on the tool's definition (it did: the
    window was cut to make room for a tool that was then not sent)."""
    fake, server = claude
    native = {
        "provider": "anthropic",
        "api_key": "sk-ant-tenant",
        "context": {"budget_tokens": 300},
        "compaction": {"enabled": False},  # no background calls to the fake in between
        "retrieval": {"enabled": False},
    }
    agentic = {"enabled": True, "agentic": True, "extraction": False}
    gateway = make_gateway(
        [
            tenant("agentic", server.url, api_keys=[GATEWAY_KEY], memory=agentic, **native),
            tenant("plain", server.url, api_keys=["sk-gw-plain"], **native),
        ]
    )
    history: list[dict[str, str]] = []
    for n in range(12):
        history += [
            {"role": "user", "content": f"long remark {n} " * 10},
            {"role": "assistant", "content": f"ok {n}"},
        ]
    history.append({"role": "user", "content": "Hi there"})
    body = orjson.dumps({"model": "claude-fake", "max_tokens": 64, "messages": history})
    sent = []
    for key in (GATEWAY_KEY, "sk-gw-plain"):
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01", "x-user-id": "ana"}
        response = httpx.post(f"{gateway.server.url}/v1/messages", content=body, headers=headers)
        assert response.status_code == 200, response.text
        recorded(gateway, response.headers["x-gateway-request-id"], key)
        record = api(gateway, f"/requests/{response.headers['x-gateway-request-id']}", key)
        sent.append((orjson.loads(fake.last().raw)["messages"], record["report"]["original_tokens"]))
    assert "memory_search" not in str(sent[0][0])
    assert sent[0] == sent[1]  # the same history kept, the same tokens counted, as without memory


def test_the_providers_compaction_passes_through_and_nothing_is_folded_across_it(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    gateway = native_gateway(
        make_gateway,
        server,
        context={"budget_tokens": 900, "recent_tokens": 300},
        compaction={"threshold_tokens": 150, "chunk_tokens": 300, "summary_tokens": 200, "model": MODEL},
    )
    client = gateway.anthropic()
    edits = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}}]}
    history: list[dict[str, Any]] = []
    for n in range(40):
        history.append({"role": "user", "content": f"Order question {n}: where is parcel P-{n}?"})
        history.append({"role": "assistant", "content": f"Parcel P-{n} is on its way."})
    history.append({"role": "user", "content": "Sum it up, then tell me about P-7."})
    summary = "Summary: forty parcels, P-0 to P-39, all on their way."
    fake.enqueue(Reply(text="P-7 is on its way.", compaction=summary))
    with client.beta.messages.stream(
        model=MODEL, max_tokens=50, messages=history, betas=["compact-2026-01-12"], context_management=edits
    ) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["compaction", "text"]
    assert fake.last().body["context_management"] == edits  # the client's fields reach the provider
    recorded(gateway, stream.response.headers["x-gateway-request-id"])
    answer = stored(gateway, conversation := stream.response.headers["x-conversation-id"])[-1]
    assert answer["compaction_blocks"] == [{"type": "compaction", "content": summary}]
    wait_for_jobs(gateway)  # the gateway may fold what came before any provider compaction
    before = len(fake.received), compaction_runs(gateway)

    # As Anthropic's docs say: the answer goes back whole, compaction block first, and the chat goes on.
    history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
    history.append({"role": "user", "content": "And P-39?"})
    response = client.beta.messages.with_raw_response.create(
        model=MODEL, max_tokens=50, messages=history, betas=["compact-2026-01-12"], context_management=edits
    )  # type: ignore[arg-type]
    assert response.headers["x-conversation-id"] == conversation  # recognised with the block sent back
    sent = fake.last().body
    assert sent["messages"] == history  # as the client sent it: the provider reads from its own summary
    assert sent["messages"][-2]["content"][0] == {"type": "compaction", "content": summary}
    request_id = response.headers["x-gateway-request-id"]
    recorded(gateway, request_id)
    report = api(gateway, f"/requests/{request_id}")["report"]
    assert report["unchanged"] is True
    assert report["provider_compaction"] == {"message": len(history) - 2}
    wait_for_jobs(gateway)
    # The request itself went upstream, and no compaction of the gateway's own was queued.
    assert (len(fake.received), compaction_runs(gateway)) == (before[0] + 1, before[1])
    assert [m["role"] for m in stored(gateway, conversation)][-3:] == ["assistant", "user", "assistant"]
