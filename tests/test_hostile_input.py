"""Hostile and malformed input at every door: bad JSON, wrong types, NUL characters, odd headers and ids.

Each test drives a real gateway on loopback in front of the real fake upstream, and checks what a client
sees (status, OpenAI's error shape naming the bad field), what reached the upstream, and what was stored.
Tests marked `xfail(strict=True)` state the behaviour the gateway should have and does not have yet: each
reason names the function at fault.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.config import parse_config
from gateway.fakes.openai_upstream import FakeUpstream
from gateway.fakes.server import BackgroundServer
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, recorded, tenant, wait_for_jobs

AUTH = {"Authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = "/v1/chat/completions"
NESTED = b"[" * 100_000 + b"]" * 100_000


def post(
    gateway: Gateway,
    body: bytes | Any,
    path: str = CHAT,
    headers: dict[str, str] | list[tuple[str, bytes]] | None = None,
    content_type: str | None = "application/json",
) -> httpx.Response:
    """POST `body` (bytes as they are, anything else as JSON) to the gateway with the tenant's key."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    sent: list[tuple[str, str | bytes]] = [*AUTH.items()]
    if content_type is not None:
        sent.append(("Content-Type", content_type))
    sent += list(headers.items() if isinstance(headers, dict) else headers or [])
    return httpx.post(f"{gateway.server.url}{path}", content=raw, headers=sent, timeout=60)


def get(gateway: Gateway, path: str) -> httpx.Response:
    return httpx.get(f"{gateway.server.url}{path}", headers=AUTH, timeout=60)


def chat(content: Any, role: Any = "user", **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": role, "content": content}], **fields}


def assert_openai_error(response: httpx.Response, status: int, **expected: Any) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    for key, value in expected.items():
        assert error[key] == value, (key, error)
    return error  # type: ignore[no-any-return]


def assert_anthropic_error(response: httpx.Response, status: int) -> str:
    """/v1/messages answers in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["message"], body
    return str(body["error"]["message"])


def conversations(gateway: Gateway) -> list[dict[str, Any]]:
    return api(gateway, "/conversations?limit=500")["data"]  # type: ignore[no-any-return]


def messages_of(gateway: Gateway, conversation_id: str) -> list[dict[str, Any]]:
    return [m["message"] for m in api(gateway, f"/conversations/{conversation_id}/messages")["data"]]


def request_recorded(gateway: Gateway, response: httpx.Response) -> bool:
    request_id = response.headers["x-gateway-request-id"]
    return get(gateway, f"/api/requests/{request_id}").status_code == 200


def assert_healthy(gateway: Gateway) -> None:
    response = httpx.get(f"{gateway.server.url}/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok", response.text


def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def assert_nothing_stored(gateway: Gateway, upstream: Upstream, response: httpx.Response) -> None:
    """Refused at the edge: nothing reached the upstream and nothing was stored, not even a record."""
    assert_healthy(gateway)
    wait_for_jobs(gateway)
    assert upstream.fake.received == []
    assert conversations(gateway) == []
    assert not request_recorded(gateway, response)


def only_conversation(gateway: Gateway, response: httpx.Response) -> dict[str, Any]:
    recorded(gateway, response.headers["x-gateway-request-id"])
    assert_healthy(gateway)
    wait_for_jobs(gateway)
    [conversation] = conversations(gateway)
    return conversation


def conversation_of(gateway: Gateway, response: httpx.Response) -> str:
    """The conversation a request was stored in, from its request record."""
    request_id = response.headers["x-gateway-request-id"]
    recorded(gateway, request_id)
    assert_healthy(gateway)
    wait_for_jobs(gateway)
    conversation_id = api(gateway, f"/requests/{request_id}")["conversation_id"]
    assert isinstance(conversation_id, str), conversation_id
    return conversation_id


def raw_http(gateway: Gateway, request: bytes) -> tuple[int, bytes]:
    """One request written byte for byte (clients refuse CR, LF and NUL in header values)."""
    with socket.create_connection((gateway.server.host, gateway.server.port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        lengths = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
        expected = int(lengths[0].split(b":")[1]) if lengths else 0
        while len(body) < expected:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(head.split(b" ")[1]), body


def raw_chat(gateway: Gateway, extra_header: bytes, body: bytes) -> tuple[int, bytes]:
    return raw_http(
        gateway,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        + f"Authorization: Bearer {GATEWAY_KEY}\r\nContent-Type: application/json\r\n".encode()
        + extra_header
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body,
    )


@pytest.fixture
def store_gateway(
    database_url: str, upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> Gateway:
    """The gateway on `database_url` (SQLite, then Postgres)."""
    storage = {"database_url": database_url, "data_dir": str(tmp_path / "data")}
    return make_gateway([tenant("acme", upstream.base_url)], storage=storage)


@contextmanager
def module_gateway(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Gateway, Upstream]]:
    fake = FakeUpstream()
    with BackgroundServer(fake.app()) as upstream_server:
        upstream = Upstream(fake, upstream_server)
        data = tmp_path_factory.mktemp(name)
        storage = {"database_url": f"sqlite:///{data}/gateway.db", "data_dir": str(data / "data")}
        config = parse_config({"tenants": [tenant("acme", upstream.base_url)], "storage": storage}, {})
        with BackgroundServer(
            create_app(config), keep_alive_seconds=config.server.keep_alive_seconds
        ) as server:
            yield Gateway(server, config), upstream


@pytest.fixture(scope="module")
def edge_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Upstream]]:
    """One gateway (and upstream) for the tests of requests refused at the edge: none of them may ever
    forward or store anything, so they share it (a gateway per test costs a second each)."""
    with module_gateway(tmp_path_factory, "edge") as pair:
        yield pair


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Upstream]]:
    """One gateway for the tests of requests that go through: each finds its own conversation by its
    request record."""
    with module_gateway(tmp_path_factory, "shared") as pair:
        yield pair


@pytest.fixture
def shared(shared_pair: tuple[Gateway, Upstream]) -> Gateway:
    return shared_pair[0]


@pytest.fixture
def shared_upstream(shared_pair: tuple[Gateway, Upstream]) -> Upstream:
    return shared_pair[1]


@pytest.fixture
def edge(edge_pair: tuple[Gateway, Upstream]) -> Gateway:
    return edge_pair[0]


@pytest.fixture
def edge_upstream(edge_pair: tuple[Gateway, Upstream]) -> Upstream:
    return edge_pair[1]


# --- bodies that are not a JSON object --------------------------------------------------------------------

UNPARSEABLE = {
    "malformed": b"{not json",
    "truncated": b'{"model": "m", "messages": [{"role": "user", "con',
    "empty": b"",
    "non_utf8": b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "lone_surrogate": b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
    "utf8_bom": b"\xef\xbb\xbf" + orjson.dumps(chat("hi")),
    "nested_100k_in_content": b'{"model": "m", "messages": [{"role": "user", "content": ' + NESTED + b"}]}",
    "nested_100k_in_unknown_field": b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": '
    + NESTED
    + b"}",
    "form_encoded": b"model=m&messages=hi",
}


@pytest.mark.parametrize("body", UNPARSEABLE.values(), ids=UNPARSEABLE.keys())
def test_unparseable_chat_body_is_400_invalid_json(
    edge: Gateway, edge_upstream: Upstream, body: bytes
) -> None:
    response = post(edge, body)
    assert_openai_error(response, 400, type="invalid_request_error", param=None, code="invalid_json")
    assert_nothing_stored(edge, edge_upstream, response)


def test_unparseable_body_at_the_other_doors(edge: Gateway, edge_upstream: Upstream) -> None:
    for name in ("malformed", "non_utf8", "nested_100k_in_content"):
        assert_openai_error(post(edge, UNPARSEABLE[name], "/v1/responses"), 400, code="invalid_json")
        assert "parse" in assert_anthropic_error(post(edge, UNPARSEABLE[name], "/v1/messages"), 400)
        assert_anthropic_error(post(edge, UNPARSEABLE[name], "/v1/messages/count_tokens"), 400)
    deep = b'{"model": "m", "input": ' + NESTED + b"}"
    response = post(edge, deep, "/v1/responses")
    assert_openai_error(response, 400, code="invalid_json")
    assert_nothing_stored(edge, edge_upstream, response)


# --- body size ----------------------------------------------------------------------------------------------

LIMIT = 64 * 1024


@pytest.fixture
def small_limit(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> Gateway:
    # No prompt_cache_key (spliced into a long prompt's bytes): these tests compare the forwarded bytes.
    return make_gateway(
        [tenant("acme", upstream.base_url, prompt_cache_key=False)], server={"max_body_bytes": LIMIT}
    )


def sized(total: int) -> bytes:
    """A chat body of exactly `total` bytes; the message is words (a long unbroken run is its own case)."""
    frame = orjson.dumps(chat(""))
    text = ("hello world " * total)[: total - len(frame)]
    body = orjson.dumps(chat(text))
    assert len(body) == total
    return body


def test_body_at_the_limit_is_served_and_stored(small_limit: Gateway, upstream: Upstream) -> None:
    body = sized(LIMIT)
    response = post(small_limit, body)
    assert response.status_code == 200, response.text
    assert upstream.fake.last_chat().raw == body
    conversation = only_conversation(small_limit, response)
    [question, answer] = messages_of(small_limit, conversation["id"])
    assert question == orjson.loads(body)["messages"][0]
    assert answer["role"] == "assistant"


@pytest.mark.parametrize("total", [LIMIT + 1, 2 * LIMIT])
def test_body_over_the_limit_is_413(small_limit: Gateway, upstream: Upstream, total: int) -> None:
    response = post(small_limit, sized(total))
    assert_openai_error(response, 413, code="payload_too_large", param=None)
    assert_nothing_stored(small_limit, upstream, response)


def test_long_unbroken_word_is_answered_promptly(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """16 KB of one letter (a base64 blob, a minified line) over a small budget: the context builder runs."""
    budget = tenant("acme", upstream.base_url, context={"budget_tokens": 200})
    gateway = make_gateway([budget])
    started = time.monotonic()
    response = post(gateway, chat("x" * 16_000))
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert elapsed < 2.0, f"took {elapsed:.1f}s"


# --- roles, content and other fields of the wrong type -------------------------------------------------------


@pytest.mark.parametrize("role", ["hacker", 5, None, True, "", "USER"])
def test_invalid_role_is_400_naming_the_field(edge: Gateway, edge_upstream: Upstream, role: Any) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": role, "content": "x"}]}
    response = post(edge, body)
    assert_openai_error(response, 400, type="invalid_request_error", param="messages[1].role")
    assert_nothing_stored(edge, edge_upstream, response)


def test_missing_role_is_400_naming_the_field(edge: Gateway, edge_upstream: Upstream) -> None:
    response = post(edge, {"model": "m", "messages": [{"content": "x"}]})
    assert_openai_error(response, 400, param="messages[0].role")
    assert_nothing_stored(edge, edge_upstream, response)


@pytest.mark.parametrize("role", [[], {}, ["user"], {"role": "user"}])
def test_unhashable_role_is_400_naming_the_field(edge: Gateway, edge_upstream: Upstream, role: Any) -> None:
    response = post(edge, chat("x", role=role))
    assert_openai_error(response, 400, type="invalid_request_error", param="messages[0].role")
    assert_nothing_stored(edge, edge_upstream, response)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": [], "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "", "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": {"role": "user"}}, "messages"),
        ({"model": "m", "messages": [5]}, "messages[0]"),
        ({"model": "m", "messages": [None]}, "messages[0]"),
        (chat("x", stream="true"), "stream"),
        (chat("x", stream=1), "stream"),
    ],
)
def test_wrong_type_of_a_checked_field_is_400_naming_it(
    edge: Gateway, edge_upstream: Upstream, body: dict[str, Any], param: str
) -> None:
    response = post(edge, body)
    assert_openai_error(response, 400, type="invalid_request_error", param=param)
    assert_nothing_stored(edge, edge_upstream, response)


@pytest.mark.parametrize(
    "content",
    [5, 1.5, True, None, {"text": "hi"}, [{"type": "bogus", "x": 1}], [5], ["hi"], [None], [[]]],
    ids=repr,
)
def test_content_of_any_type_goes_upstream_untouched_and_is_stored(
    shared: Gateway, shared_upstream: Upstream, content: Any
) -> None:
    """The gateway checks only what it relies on: the provider judges the content (and says so)."""
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    response = post(shared, body)
    assert response.status_code == 200, response.text
    assert shared_upstream.fake.last_chat().body["messages"] == body["messages"]
    conversation_id = conversation_of(shared, response)
    question = messages_of(shared, conversation_id)[0]
    assert question["role"] == "user"
    assert question.get("content") == content


def test_wrong_types_at_the_messages_door_are_400_in_anthropic_shape(
    edge: Gateway, edge_upstream: Upstream
) -> None:
    bodies = {
        "messages.0.role": {"model": "m", "max_tokens": 5, "messages": [{"role": "hacker", "content": "x"}]},
        "messages.0.role ": {"model": "m", "max_tokens": 5, "messages": [{"role": [], "content": "x"}]},
        "messages.0.content": {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 5}]},
        "messages.0.content.0.type": {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "bogus"}]}],
        },
        "max_tokens": {"model": "m", "max_tokens": "abc", "messages": [{"role": "user", "content": "x"}]},
        "max_tokens ": {"model": "m", "max_tokens": -1, "messages": [{"role": "user", "content": "x"}]},
        "system": {
            "model": "m",
            "max_tokens": 5,
            "system": 5,
            "messages": [{"role": "user", "content": "x"}],
        },
    }
    for field, body in bodies.items():
        message = assert_anthropic_error(post(edge, body, "/v1/messages"), 400)
        assert message.startswith(field.strip() + ":"), (field, message)
    assert edge_upstream.fake.received == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": [5]}, "input[0]"),
        ({"model": "m", "input": [{"role": "hacker", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"type": "bogus"}]}, "input[0].type"),
        ({"model": "m", "input": [{"role": "user", "content": 5}]}, "input[0].content"),
        ({"model": "m", "input": "x", "previous_response_id": 5}, "previous_response_id"),
        ({"model": "m", "input": "x", "max_output_tokens": "abc"}, "max_output_tokens"),
    ],
)
def test_wrong_types_at_the_responses_door_are_400_naming_the_field(
    edge: Gateway, edge_upstream: Upstream, body: dict[str, Any], param: str
) -> None:
    response = post(edge, body, "/v1/responses")
    assert_openai_error(response, 400, type="invalid_request_error", param=param)
    assert_nothing_stored(edge, edge_upstream, response)


@pytest.mark.parametrize("max_tokens", [b"-1", b"0", b'"abc"', b"1.5", b"[]", b"null", b"1" + b"0" * 30])
def test_absurd_max_tokens_goes_upstream_untouched(
    shared: Gateway, shared_upstream: Upstream, max_tokens: bytes
) -> None:
    """The provider judges max_tokens; the gateway's budget ignores what is not a positive integer."""
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + max_tokens + b"}"
    )
    response = post(shared, body)
    assert response.status_code == 200, response.text
    assert shared_upstream.fake.last_chat().raw == body
    conversation_of(shared, response)


# --- deep but parseable JSON ---------------------------------------------------------------------------------


def test_deep_unknown_field_goes_upstream_as_sent(shared: Gateway, shared_upstream: Upstream) -> None:
    deep = b"[" * 1000 + b"]" * 1000  # orjson parses up to 1024 levels
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ' + deep + b"}"
    response = post(shared, body)
    assert response.status_code == 200, response.text
    assert shared_upstream.fake.last_chat().raw == body
    conversation_of(shared, response)


def fail_open_count(gateway: Gateway) -> int:
    return int(httpx.get(f"{gateway.server.url}/healthz").json()["counters"]["fail_open"])


def test_content_nested_deeper_than_the_store_takes_is_refused_or_stored(
    gateway: Gateway, upstream: Upstream
) -> None:
    deep = b"[" * 300 + b"]" * 300
    before = fail_open_count(gateway)
    response = post(gateway, b'{"model": "m", "messages": [{"role": "user", "content": ' + deep + b"}]}")
    wait_for_jobs(gateway)
    assert fail_open_count(gateway) == before, "the pipeline failed open"
    if response.status_code == 400:
        error = assert_openai_error(response, 400)
        assert error["param"] is not None and error["param"].startswith("messages[0]"), error
        assert upstream.fake.received == []
    else:
        [conversation] = conversations(gateway)
        assert messages_of(gateway, conversation["id"])[0]["content"] == orjson.loads(deep)


def test_deeply_nested_tool_arguments_string_is_stored(gateway: Gateway, upstream: Upstream) -> None:
    arguments = '{"a":' * 300 + "1" + "}" * 300
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        ],
    }
    before = fail_open_count(gateway)
    response = post(gateway, body)
    assert response.status_code == 200, response.text
    assert fail_open_count(gateway) == before, "the pipeline failed open"
    conversation = only_conversation(gateway, response)
    assert messages_of(gateway, conversation["id"])[1]["tool_calls"] == [call]


# --- NUL characters ------------------------------------------------------------------------------------------


def test_nul_in_content_name_and_tool_calls_round_trips_exactly(
    store_gateway: Gateway, upstream: Upstream
) -> None:
    """Postgres's jsonb cannot hold U+0000: the store packs it, and reads back exactly what was sent."""
    sent = [
        {"role": "system", "content": "sys\x00tem"},
        {"role": "user", "content": "a\x00b \ue000 \\u0000 literal", "name": "n\x00m"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call\x001",
                    "type": "function",
                    "function": {"name": "w\x00", "arguments": '{"a":"\x00"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call\x001", "content": "sun\x00"},
        {"role": "user", "content": [{"type": "text", "text": "part\x00"}]},
        {"role": "assistant", "content": "ok\x00"},
        {"role": "user", "content": "last\x00"},
    ]
    response = post(store_gateway, {"model": "m", "messages": sent})
    assert response.status_code == 200, response.text
    assert "\x00" in response.json()["choices"][0]["message"]["content"]  # the fake echoes it back
    assert upstream.fake.last_chat().body["messages"] == sent
    conversation = only_conversation(store_gateway, response)
    stored = messages_of(store_gateway, conversation["id"])
    # The system prompt is kept out of the chain (identity.system_in_chain is off).
    assert stored[:-1] == sent[1:]
    assert stored[-1]["content"] == response.json()["choices"][0]["message"]["content"]
    # The same history again is the same conversation (the hashes of NUL text are stable).
    again = post(store_gateway, {"model": "m", "messages": sent})
    assert again.status_code == 200
    recorded(store_gateway, again.headers["x-gateway-request-id"])
    assert len(conversations(store_gateway)) == 1


def test_nul_in_model_metadata_and_user_is_forwarded_and_recorded(
    store_gateway: Gateway, upstream: Upstream
) -> None:
    body = chat(
        "hi", model="gpt\x00x", metadata={"k\x00": "v\x00", "conversation_id": "c\x00d"}, user="u\x00v"
    )
    response = post(store_gateway, body)
    assert response.status_code == 200, response.text
    assert upstream.fake.last_chat().body == body  # untouched
    conversation = only_conversation(store_gateway, response)
    # Ids holding NUL are kept as their digest (Postgres text columns refuse it), the same each time.
    assert conversation["external_id"].startswith("sha256:")
    assert conversation["user_id"].startswith("sha256:")
    record = api(store_gateway, f"/requests/{response.headers['x-gateway-request-id']}")
    assert record["model"] == "gpt\ufffdx"


def test_nul_at_the_messages_door_round_trips(store_gateway: Gateway, upstream: Upstream) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "msg\x00nul"}]}
    response = post(store_gateway, body, "/v1/messages")
    assert response.status_code == 200, response.text
    conversation = only_conversation(store_gateway, response)
    assert messages_of(store_gateway, conversation["id"])[0] == {"role": "user", "content": "msg\x00nul"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "database_url",
    ["sqlite", "postgres"],
    indirect=True,
)
def test_nul_at_the_responses_door_is_answered_and_stored(
    store_gateway: Gateway, upstream: Upstream, stream: bool
) -> None:
    body = {"model": "m", "input": "resp\x00nul", "metadata": {"k": "v\x00"}, "stream": stream}
    response = post(store_gateway, body, "/v1/responses")
    assert response.status_code == 200, response.text
    if stream:
        events = [orjson.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == "response.completed", events[-1]
        response_id = events[-1]["response"]["id"]
    else:
        response_id = response.json()["id"]
    stored = get(store_gateway, f"/v1/responses/{response_id}")
    assert stored.status_code == 200, stored.text
    assert stored.json()["metadata"] == {"k": "v\x00"}
    conversation = only_conversation(store_gateway, response)
    assert messages_of(store_gateway, conversation["id"])[0]["content"] == "resp\x00nul"


@pytest.mark.parametrize(
    "database_url",
    ["sqlite", "postgres"],
    indirect=True,
)
def test_nul_in_previous_response_id_is_not_found(store_gateway: Gateway, upstream: Upstream) -> None:
    body = {"model": "m", "input": "x", "previous_response_id": "resp_\x00"}
    response = post(store_gateway, body, "/v1/responses")
    assert_openai_error(response, 400, param="previous_response_id", code="previous_response_not_found")
    assert upstream.fake.received == []


# --- Content-Type --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
def test_json_body_is_read_whatever_the_content_type(
    shared: Gateway, shared_upstream: Upstream, content_type: str | None
) -> None:
    """Lenient, as `curl -d` users need: the body is JSON whatever the header says (a form is refused above)."""
    body = orjson.dumps(chat("hi"))
    response = post(shared, body, content_type=content_type)
    assert response.status_code == 200, response.text
    assert shared_upstream.fake.last_chat().raw == body
    conversation_of(shared, response)


# --- unknown fields ------------------------------------------------------------------------------------------


def test_unknown_top_level_fields_go_upstream_untouched(shared: Gateway, shared_upstream: Upstream) -> None:
    body = (
        b'{"model": "m", "x_z": 1, "messages": [{"role": "user", "content": "hi"}], "x_float": 1.0, '
        b'"x_exp": 1e2, "x_str": "\\u00e9\\u0000", "x_obj": {"nested": [1, {"a": null}]}, '
        b'"x_big": 123456789012345678901234567890, "frobnicate": true}'
    )
    response = post(shared, body)
    assert response.status_code == 200, response.text
    assert shared_upstream.fake.last_chat().raw == body  # byte for byte: nothing was rebuilt


@pytest.mark.xfail(
    reason="gateway/pipeline/validate.py parse_json_object(): orjson reads integers past 64 bits as floats, "
    "so when the pipeline rebuilds the body (history added in thin mode) an unknown field's "
    "123456789012345678901234567890 goes upstream as 1.2345678901234568e+29",
    strict=True,
)
def test_unknown_big_integer_survives_a_rebuilt_body(gateway: Gateway, upstream: Upstream) -> None:
    first = post(gateway, chat("one"), headers={"X-Conversation-Id": "big"})
    assert first.status_code == 200
    recorded(gateway, first.headers["x-gateway-request-id"])
    body = b'{"model": "m", "messages": [{"role": "user", "content": "two"}], "x_big": 123456789012345678901234567890}'
    response = post(gateway, body, headers={"X-Conversation-Id": "big"})
    assert response.status_code == 200, response.text
    sent = upstream.fake.last_chat()
    assert len(sent.body["messages"]) == 3  # rebuilt: the stored history came first
    assert b'"x_big":123456789012345678901234567890' in sent.raw.replace(b" ", b"")


# --- tool-call ordering --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [
            {"role": "user", "content": "q calls"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "user", "content": "no results in between"},
        ],
        [
            {"role": "user", "content": "q orphan"},
            {"role": "tool", "tool_call_id": "nope", "content": "orphan"},
        ],
        [
            {"role": "assistant", "content": "x", "tool_calls": "zzz"},
            {"role": "user", "content": "q not a list"},
        ],
        [
            {"role": "assistant", "content": None, "tool_calls": [5, None, {"function": 3}]},
            {"role": "user", "content": "q junk"},
        ],
    ],
    ids=["calls_without_results", "result_without_call", "tool_calls_not_a_list", "tool_calls_junk"],
)
def test_tool_call_ordering_is_the_providers_to_judge(
    shared: Gateway, shared_upstream: Upstream, messages: list[dict[str, Any]]
) -> None:
    response = post(shared, {"model": "m", "messages": messages})
    assert response.status_code == 200, response.text
    assert shared_upstream.fake.last_chat().body["messages"] == messages
    conversation_id = conversation_of(shared, response)
    assert messages_of(shared, conversation_id)[: len(messages)] == messages


# --- conversation and user ids in headers and fields ---------------------------------------------------------


def test_long_and_odd_conversation_ids(gateway: Gateway, upstream: Upstream) -> None:
    for value in ("c" * 4096, "z" * 16384, "../../etc/passwd"):
        for _ in range(2):  # the same id twice is one conversation
            response = post(gateway, chat(f"hi {len(value)}"), headers={"X-Conversation-Id": value})
            assert response.status_code == 200, response.text
            recorded(gateway, response.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)
    external = sorted(c["external_id"] for c in conversations(gateway))
    assert len(external) == 3
    assert "../../etc/passwd" in external
    digests = [e for e in external if e.startswith("sha256:")]
    assert len(digests) == 2 and all(len(e) <= 200 for e in digests)


def test_unicode_conversation_id_names_one_conversation_by_header_or_metadata(
    gateway: Gateway, upstream: Upstream
) -> None:
    value = "会话-ü"
    one = post(gateway, chat("one"), headers=[("X-Conversation-Id", value.encode())])
    recorded(gateway, one.headers["x-gateway-request-id"])
    two = post(gateway, {**chat("two"), "metadata": {"conversation_id": value}})
    recorded(gateway, two.headers["x-gateway-request-id"])
    assert [c["external_id"] for c in conversations(gateway)] == [value]


def test_crlf_in_a_header_cannot_smuggle_anything(gateway: Gateway, upstream: Upstream) -> None:
    body = orjson.dumps(chat("hi"))
    for header in (b"X-Conversation-Id: a\nInjected: 1\r\n", b"X-Conversation-Id: a\rInjected: 1\r\n"):
        status, answer = raw_chat(gateway, header, body)
        assert status == 400, answer  # the HTTP server refuses a bare CR or LF before the app sees it
    status, answer = raw_chat(gateway, b"X-Conversation-Id: a\r\n b\r\n", body)  # obsolete line folding
    assert status == 400, answer
    status, answer = raw_chat(gateway, b"X-User-Id: a\x00b\r\n", body)
    assert status == 400, answer
    assert upstream.fake.received == []
    # CRLF ends the header: what follows is one more header of the client's own, nothing else.
    status, answer = raw_chat(gateway, b"X-Conversation-Id: a\r\nX-Injected: 1\r\n", body)
    assert status == 200, answer
    assert upstream.fake.last_chat().headers.get("x-injected") == "1"
    wait_for_jobs(gateway)
    assert [c["external_id"] for c in conversations(gateway)] == ["a"]


def test_long_and_nul_user_field(gateway: Gateway, upstream: Upstream) -> None:
    for user in ("u" * 10240, "u" * 10240, "u\x00v"):
        response = post(gateway, chat(f"hi {user[-1]}", user=user))
        assert response.status_code == 200, response.text
        assert upstream.fake.last_chat().body["user"] == user
        recorded(gateway, response.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)
    users = {c["user_id"] for c in conversations(gateway)}
    assert len(users) == 2 and all(u.startswith("sha256:") and len(u) <= 200 for u in users)


@pytest.mark.parametrize(
    "database_url",
    ["sqlite", "postgres"],
    indirect=True,
)
def test_long_model_name_is_answered_and_fully_stored(store_gateway: Gateway, upstream: Upstream) -> None:
    response = post(store_gateway, chat("hi", model="m" * 300))
    assert response.status_code == 200, response.text
    assert upstream.fake.last_chat().body["model"] == "m" * 300
    assert eventually(lambda: request_recorded(store_gateway, response)), "the request was never recorded"
    wait_for_jobs(store_gateway)
    [conversation] = conversations(store_gateway)
    assert [m["role"] for m in messages_of(store_gateway, conversation["id"])] == ["user", "assistant"]


# --- REST API ids and queries --------------------------------------------------------------------------------


def test_path_traversal_and_long_ids_are_404(edge: Gateway) -> None:
    for path in (
        "/api/conversations/..%2F..%2Fetc",
        "/api/conversations/..%2F..%2Fetc/messages",
        "/api/conversations/" + "a" * 5000,
        "/api/conversations/%ff%fe",
        "/api/requests/" + "r" * 5000,
        "/api/conversations/x/path/" + "n" * 5000,
        "/v1/responses/" + "r" * 5000,
    ):
        assert_openai_error(get(edge, path), 404, code="not_found")
    response = httpx.delete(f"{edge.server.url}/api/conversations/..%2F..%2Fetc", headers=AUTH)
    assert_openai_error(response, 404, code="not_found")


def test_request_line_too_long_is_refused_by_the_http_server(edge: Gateway) -> None:
    status, _ = raw_http(
        edge,
        b"GET /api/conversations/" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert status == 400


NUL_PATHS = [
    "/api/conversations/abc%00def",
    "/api/conversations/%00",
    "/api/conversations/abc%00def/messages",
    "/api/conversations/abc%00def/summaries",
    "/api/conversations/abc%00def/path/x%00y",
    "/api/requests/abc%00def",
    "/v1/responses/abc%00def",
]


@pytest.mark.parametrize(
    "database_url",
    ["sqlite", "postgres"],
    indirect=True,
)
def test_nul_in_rest_ids_is_404(store_gateway: Gateway) -> None:
    wrong = []
    for path in NUL_PATHS:
        response = get(store_gateway, path)
        if response.status_code != 404:
            wrong.append((path, response.status_code, response.text[:120]))
        else:
            assert_openai_error(response, 404, code="not_found")
    for path in ("/api/conversations/abc%00def", "/v1/responses/a%00b"):
        response = httpx.delete(f"{store_gateway.server.url}{path}", headers=AUTH)
        if response.status_code != 404:
            wrong.append((f"DELETE {path}", response.status_code, response.text[:120]))
    response = post(store_gateway, b"{}", "/api/conversations/abc%00def/compact")
    if response.status_code != 404:
        wrong.append(("POST compact", response.status_code, response.text[:120]))
    assert wrong == []


@pytest.mark.parametrize(
    "database_url",
    ["sqlite", "postgres"],
    indirect=True,
)
def test_nul_in_rest_queries_finds_nothing(store_gateway: Gateway) -> None:
    wrong = []
    for query in ("q=%00", "q=a%00b", "user_id=%00"):
        response = get(store_gateway, f"/api/conversations?{query}")
        if response.status_code != 200 or response.json()["data"] != []:
            wrong.append((query, response.status_code, response.text[:120]))
    response = httpx.delete(f"{store_gateway.server.url}/api/users/u%00v", headers=AUTH)
    if response.status_code != 200 or response.json()["conversations"] != []:
        wrong.append(("DELETE /api/users/u%00v", response.status_code, response.text[:120]))
    assert wrong == []


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("limit=-1", "limit"),
        ("limit=abc", "limit"),
        ("limit=501", "limit"),
        ("limit=" + "9" * 30, "limit"),
        ("offset=" + "9" * 30, "offset"),
        ("q=" + "x" * 201, "q"),
        ("since=garbage", "since"),
        ("since=2026-13-45", "since"),
        ("since=2026-03-01T09:30:00%2B99:00", "since"),
        ("until=%00" * 10, "until"),
    ],
)
def test_bad_listing_query_is_400_naming_the_parameter(edge: Gateway, query: str, param: str) -> None:
    assert_openai_error(
        get(edge, f"/api/conversations?{query}"), 400, type="invalid_request_error", param=param
    )


@pytest.mark.parametrize(
    "query",
    [
        "since=9999-12-31",
        "since=0001-01-01",
        "until=0001-01-01T00:00:00-23:59",
        "q=%25_%5C",
        "offset=1000000000",
    ],
)
def test_extreme_but_valid_listing_query_is_answered(edge: Gateway, query: str) -> None:
    response = get(edge, f"/api/conversations?{query}")
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "list"


@pytest.mark.parametrize("query", ["limit=%C2%B2", "offset=%C2%B2"])
def test_superscript_digit_limit_is_400(edge: Gateway, query: str) -> None:
    assert_openai_error(get(edge, f"/api/conversations?{query}"), 400, param=query.split("=")[0])


def test_last_representable_until_date_is_answered(edge: Gateway) -> None:
    response = get(edge, "/api/conversations?until=9999-12-31")
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert_openai_error(response, 400, param="until")


def test_quoted_ids_never_reach_another_tenants_data(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    """An id is looked up within the caller's tenant, however it is spelt."""
    gateway = make_gateway([tenant("acme", upstream.base_url), tenant("other", upstream.base_url)])
    response = post(gateway, chat("secret"), headers={"Authorization": "Bearer sk-gw-other"})
    assert response.status_code == 200
    recorded(gateway, response.headers["x-gateway-request-id"], key="sk-gw-other")
    [theirs] = api(gateway, "/conversations", key="sk-gw-other")["data"]
    for spelt in (theirs["id"], quote(theirs["id"] + "\x00"), theirs["id"].upper(), f"..%2F{theirs['id']}"):
        assert_openai_error(get(gateway, f"/api/conversations/{spelt}"), 404, code="not_found")
