"""`/v1/responses` to an upstream that serves the Responses API itself (`upstream.responses: native`),
driven by the official openai SDK against the fake upstream's `/v1/responses`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from gateway.fakes.openai_upstream import Reply
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, recorded, tenant, wait_for_jobs

MODEL = "gpt-5-mini"


def native(make_gateway: Callable[..., Gateway], upstream: Upstream, **extra: Any) -> Gateway:
    return make_gateway(
        [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], responses="native", **extra)]
    )


def last_responses_call(upstream: Upstream) -> Any:
    return next(r for r in reversed(upstream.fake.received) if r.path == "/v1/responses")


def test_an_unchanged_request_goes_as_sent_and_built_in_tools_work(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = native(make_gateway, upstream)
    upstream.fake.enqueue(Reply("It is sunny in Lisbon.", reasoning="Search first."))
    body = (
        b'{"model":"gpt-5-mini","input":"Weather in Lisbon?",  "tools":[{"type":"web_search"}],'
        b'"include":["reasoning.encrypted_content"],"reasoning":{"effort":"low"}}'
    )
    response = httpx.post(
        f"{gateway.base_url}/responses",
        content=body,
        headers={"Authorization": f"Bearer {GATEWAY_KEY}", "content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    received = last_responses_call(upstream)
    assert received.raw == body and received.headers["authorization"] == "Bearer sk-upstream"
    answer = response.json()
    assert answer["id"].startswith("resp_fake")  # the provider's own id reaches the client
    assert [item["type"] for item in answer["output"]] == ["reasoning", "web_search_call", "message"]
    recorded(gateway, response.headers["x-gateway-request-id"])
    nodes = api(gateway, f"/conversations/{response.headers['x-conversation-id']}/messages")["data"]
    stored = max(nodes, key=lambda n: n["depth"])["message"]
    assert stored["content"] == "It is sunny in Lisbon."
    assert [item["type"] for item in stored["response_items"]] == ["reasoning", "web_search_call"]
    assert gateway.client().responses.retrieve(answer["id"]).output_text == "It is sunny in Lisbon."


def test_a_chain_is_written_out_from_the_gateways_tree_with_every_item_in_place(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = native(make_gateway, upstream)
    client = gateway.client()
    upstream.fake.enqueue(Reply("Sunny, 24C.", reasoning="Look it up."), Reply("Take a hat."))
    first = client.responses.create(
        model=MODEL, instructions="Be brief.", input="Weather in Lisbon?", tools=[{"type": "web_search"}]
    )
    second = client.responses.create(
        model=MODEL,
        instructions="Be brief.",
        input="What should I wear?",
        previous_response_id=first.id,
        tools=[{"type": "web_search"}],
    )
    assert second.output_text == "Take a hat."
    sent = last_responses_call(upstream).body
    assert "previous_response_id" not in sent  # the gateway wrote the chain out itself
    assert sent["instructions"] == "Be brief." and sent["tools"] == [{"type": "web_search"}]
    kinds = [(item["type"], item.get("role")) for item in sent["input"]]
    assert kinds == [
        ("message", "user"),
        ("reasoning", None),
        ("web_search_call", None),
        ("message", "assistant"),
        ("message", "user"),
    ]
    reasoning = sent["input"][1]
    assert reasoning["encrypted_content"] == "enc:Look it up."  # verbatim, as the provider gave it


def test_a_native_stream_is_relayed_stored_and_chainable_at_once(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = native(make_gateway, upstream)
    client = gateway.client()
    upstream.fake.enqueue(Reply("Streamed natively to you."), Reply("Chained."))
    with client.responses.stream(model=MODEL, input="Stream, please.") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_text == "Streamed natively to you." and final.id.startswith("resp_fake")
    chained = client.responses.create(model=MODEL, input="And?", previous_response_id=final.id)
    assert chained.output_text == "Chained."
    items = last_responses_call(upstream).body["input"]
    assert items[1]["content"] == [
        {"type": "output_text", "text": "Streamed natively to you.", "annotations": []}
    ]


def test_a_long_history_is_rebuilt_natively_with_the_context_as_a_developer_message(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = native(make_gateway, upstream, context={"budget_tokens": 700}, compaction={"enabled": False})
    client = gateway.client()
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "The build broke."},
        {"role": "assistant", "content": "make_release.sh failed with ERR-OSPREY-3301."},
    ]
    for n in range(80):
        items += [
            {"role": "user", "content": f"Chat {n} about lunch and the weather."},
            {"role": "assistant", "content": f"Lunch note {n}."},
        ]
    items.append({"role": "user", "content": "OK."})
    first = client.responses.with_raw_response.create(model=MODEL, input=items, instructions="Be brief.")  # type: ignore[arg-type]
    assert len(last_responses_call(upstream).body["input"]) < len(items)  # bounded natively
    recorded(gateway, first.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)
    client.responses.create(
        model=MODEL,
        instructions="Be brief.",
        input="Which error did make_release.sh fail with?",
        previous_response_id=first.parse().id,
    )
    sent = last_responses_call(upstream).body
    assert sent["instructions"] == "Be brief."
    developer = [i for i in sent["input"] if i.get("role") == "developer"]
    assert len(developer) == 1 and "ERR-OSPREY-3301" in developer[0]["content"]
    assert sent["input"][-1] == {
        "type": "message",
        "role": "user",
        "content": "Which error did make_release.sh fail with?",
    }


def test_openais_compaction_item_makes_a_long_history_go_as_sent(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = native(make_gateway, upstream, context={"budget_tokens": 700}, compaction={"enabled": False})
    items: list[dict[str, Any]] = []
    for n in range(80):
        items += [
            {"role": "user", "content": f"Chat {n} about lunch and the weather."},
            {"role": "assistant", "content": f"Lunch note {n}."},
        ]
    # What `responses.compact` gave back: the provider's own summary, encrypted; the history goes on after it.
    items += [
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA-opaque"},
        {"role": "user", "content": "Where were we?"},
    ]
    response = gateway.client().responses.with_raw_response.create(model=MODEL, input=items)  # type: ignore[arg-type]
    sent = last_responses_call(upstream).body
    assert sent["input"] == items  # over the budget, yet as sent: the provider reads from its summary on
    recorded(gateway, request_id := response.headers["x-gateway-request-id"])
    report = api(gateway, f"/requests/{request_id}")["report"]
    assert report["unchanged"] is True and report["provider_compaction"] == {"message": 160}
