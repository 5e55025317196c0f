"""Prompt-cache hints (design.md section 14): what each provider is told so that it caches the rebuilt
prompt's stable prefix.

Anthropic (natively on `/v1/messages`, or through litellm): the gateway's own `cache_control` breakpoints
at the end of the stable block and of the window, beside the client's own (kept byte for byte) and never
past Anthropic's four; the volatile tail, a system message after the window, opens the current user turn
instead of joining `system`. OpenAI-compatible upstreams: one `prompt_cache_key` per conversation, unless
the client sent its own or the tenant turned it off. Driven by the official SDKs over HTTP against the
shipped fakes; the conversion functions are also checked on their own, with breakpoints given.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.adapters.litellm_upstream import LiteLLMUpstream, load_litellm, system_in_place
from gateway.config import UpstreamConfig
from gateway.fakes.anthropic_upstream import FakeAnthropic
from gateway.fakes.server import BackgroundServer
from gateway.inbound.messages_in import end_user, to_chat
from gateway.inbound.messages_native import to_messages
from gateway.inbound.responses_native import to_responses
from gateway.pipeline.forward import (
    MAX_CACHE_BREAKPOINTS,
    cache_marks,
    chat_with_breakpoints,
    conversation_cache_key,
    with_field,
)
from gateway.ports import ChatPayload
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, recorded, tenant, wait_for_jobs

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
TAIL = "<gateway_context>\nRetrieved: the parcel P-3 left Lisbon on Monday.\n</gateway_context>"
STABLE = "<gateway_context>\nSummary: the user tracks parcels.\n</gateway_context>"
TOOLS = [
    {"name": "track", "description": "Track a parcel.", "input_schema": {"type": "object"}},
    {"name": "cancel", "description": "Cancel an order.", "input_schema": {"type": "object"}},
]
# Long enough for OpenAI to cache (1,024 tokens): only such prompts get a prompt_cache_key.
LONG_SYSTEM = "You are the parcel desk. " + " ".join(f"Rule {n}: answer in one line." for n in range(220))


def blocks(content: Any) -> list[Any]:
    """Anthropic content as blocks (one plain text block may be sent as a string)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def marks_of(body: dict[str, Any]) -> list[Any]:
    """Every cache_control of an Anthropic request, in the order Anthropic reads them."""
    blocks: list[Any] = [*body.get("tools", []), *(body.get("system") or [])]
    for turn in body["messages"]:
        if isinstance(turn["content"], list):
            blocks += turn["content"]
    return [b["cache_control"] for b in blocks if isinstance(b, dict) and "cache_control" in b]


# ----------------------------------------------------------------------------- to_messages, on its own


CLIENT_SPOTS = ("system", "question", "tool0", "tool1")


def rebuilt_chat(
    client_marks: int = 0, spots: tuple[str, ...] = (), mark: Any = EPHEMERAL
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A rebuilt chat body as the builder lays it out (client system, stable block, window, tail,
    current question), and the client's Anthropic request, with `client_marks` breakpoints of its own
    (on its system prompt, its question and its two tools, in that order), or `mark` on `spots`."""
    spots = spots or CLIENT_SPOTS[:client_marks]
    system_block: dict[str, Any] = {"type": "text", "text": "You are the parcel desk."}
    question: dict[str, Any] = {"type": "text", "text": "Where is parcel P-3?"}
    tools = copy.deepcopy(TOOLS)
    if "system" in spots:
        system_block["cache_control"] = mark
    if "question" in spots:
        question["cache_control"] = mark
    for n in range(2):
        if f"tool{n}" in spots:
            tools[n]["cache_control"] = mark
    original = {
        "model": "claude-fake",
        "max_tokens": 50,
        "system": [system_block],
        "tools": tools,
        "messages": [
            {"role": "user", "content": "Track P-1."},
            {"role": "assistant", "content": "P-1 is in Porto."},
            {"role": "user", "content": [question]},
        ],
    }
    chat = to_chat(original).body
    messages = chat["messages"]
    chat["messages"] = [
        messages[0],
        {"role": "system", "content": STABLE},
        *messages[1:3],
        {"role": "system", "content": TAIL},
        messages[3],
    ]
    return chat, original


STABLE_AT, WINDOW_END = 1, 3  # the stable block's and the window's last message in rebuilt_chat()


def test_the_tail_opens_the_current_user_turn_and_the_leading_system_messages_stay_in_system() -> None:
    chat, original = rebuilt_chat()
    body = to_messages(chat, original)
    assert body["system"] == [
        {"type": "text", "text": "You are the parcel desk."},
        {"type": "text", "text": STABLE},
    ]
    assert body["messages"] == [
        {"role": "user", "content": "Track P-1."},
        {"role": "assistant", "content": "P-1 is in Porto."},
        {
            "role": "user",
            "content": [{"type": "text", "text": TAIL}, {"type": "text", "text": "Where is parcel P-3?"}],
        },
    ]
    assert body["tools"] == TOOLS and body["max_tokens"] == 50  # the client's other fields as sent


def test_the_tail_follows_tool_results_in_their_user_turn() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Track P-1."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "track", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "Porto"},
            {"role": "system", "content": TAIL},
            {"role": "user", "content": "And P-3?"},
        ]
    }
    body = to_messages(chat, {"model": "claude-fake"})
    assert body["system"] == [{"type": "text", "text": "Be brief."}]
    last = body["messages"][-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "text", "text"]  # tool results first
    assert [b.get("text") for b in last["content"][1:]] == [TAIL, "And P-3?"]


def test_the_native_responses_door_keeps_the_tail_where_it_stands() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": STABLE},
            {"role": "user", "content": "Track P-1."},
            {"role": "assistant", "content": "P-1 is in Porto."},
            {"role": "system", "content": TAIL},
            {"role": "user", "content": "Where is parcel P-3?"},
        ]
    }
    original = {"model": "gpt-5-mini", "instructions": "Be brief.", "input": "Where is parcel P-3?"}
    body = to_responses(chat, original)
    assert body["instructions"] == "Be brief."  # the client's, in its own field
    assert [(i.get("role"), i["type"]) for i in body["input"]] == [
        ("developer", "message"),
        ("user", "message"),
        ("assistant", "message"),
        ("developer", "message"),
        ("user", "message"),
    ]
    assert body["input"][0]["content"] == STABLE and body["input"][3]["content"] == TAIL


@pytest.mark.parametrize("client_marks", [0, 1, 2, 3, 4])
def test_breakpoints_within_the_limit_the_window_end_first(client_marks: int) -> None:
    chat, original = rebuilt_chat(client_marks)
    client_before = copy.deepcopy(original)
    body = to_messages(chat, original, (STABLE_AT, WINDOW_END))
    marks = marks_of(body)
    added = min(2, MAX_CACHE_BREAKPOINTS - client_marks)
    assert len(marks) == client_marks + added <= MAX_CACHE_BREAKPOINTS
    window_end = body["messages"][1]["content"]  # the assistant turn before the question
    stable = body["system"][-1]
    assert (isinstance(window_end, list) and window_end[-1]["cache_control"] == EPHEMERAL) == (added >= 1)
    assert (stable.get("cache_control") == EPHEMERAL) == (added >= 2)
    # The client's own marks as it sent them, and its request untouched.
    assert body["tools"] == client_before["tools"]
    assert body["system"][0] == client_before["system"][0]
    assert body["messages"][-1]["content"][-1] == client_before["messages"][-1]["content"][0]
    assert original == client_before


def test_a_breakpoint_before_a_one_hour_mark_of_the_client_lasts_an_hour_too() -> None:
    chat, original = rebuilt_chat(spots=("question",), mark=HOUR)
    body = to_messages(chat, original, (STABLE_AT, WINDOW_END))
    # Anthropic refuses a shorter ttl before a longer one: the gateway's marks come first, so they match.
    assert marks_of(body) == [HOUR, HOUR, HOUR]


def test_a_spot_the_client_marked_already_takes_no_second_mark() -> None:
    chat, original = rebuilt_chat()
    chat["messages"][STABLE_AT] = {
        "role": "system",
        "content": [{"type": "text", "text": STABLE, "cache_control": HOUR}],
    }
    body = to_messages(chat, original, (STABLE_AT, WINDOW_END))
    assert body["system"][-1]["cache_control"] == HOUR
    assert marks_of(body) == [HOUR, EPHEMERAL]


def test_cache_marks_counts_the_clients_and_keeps_the_most_wanted() -> None:
    assert cache_marks([], [9, 4]) == {9: EPHEMERAL, 4: EPHEMERAL}
    assert cache_marks([(0, EPHEMERAL), (1, EPHEMERAL), (2, EPHEMERAL)], [9, 4]) == {9: EPHEMERAL}
    assert cache_marks([(n, EPHEMERAL) for n in range(4)], [9, 4]) == {}
    assert cache_marks([(4, EPHEMERAL)], [9, 4]) == {9: EPHEMERAL}  # 4 is the client's already
    assert cache_marks([(10, HOUR)], [9, 4]) == {9: HOUR, 4: HOUR}


# ----------------------------------------------------------------------------- litellm's chat form


def test_litellm_gets_the_tail_in_the_user_message_and_marks_where_it_reads_them() -> None:
    chat, _ = rebuilt_chat()
    stored = copy.deepcopy(chat)
    marked = chat_with_breakpoints(chat, (STABLE_AT, WINDOW_END))
    assert chat == stored  # the stored messages are never changed
    assert marked["messages"][STABLE_AT]["cache_control"] == EPHEMERAL  # string content: message level
    assert marked["messages"][WINDOW_END]["cache_control"] == EPHEMERAL
    moved = system_in_place(marked["messages"])
    assert [m["role"] for m in moved] == ["system", "system", "user", "assistant", "user"]
    assert moved[-1]["content"][0] == {"type": "text", "text": TAIL}
    assert moved[-1]["content"][1]["text"] == "Where is parcel P-3?"
    assert system_in_place(stored["messages"][:3]) == stored["messages"][:3]  # nothing later: as it was


def test_litellm_sends_anthropic_the_tail_in_the_user_turn_and_the_breakpoints() -> None:
    """The real litellm adapter against the fake Anthropic server: what Anthropic would receive."""
    load_litellm()
    fake = FakeAnthropic()
    with BackgroundServer(fake.app()) as server:
        config = UpstreamConfig(provider="anthropic", base_url=server.url, api_key="sk-ant-test")
        upstream = LiteLLMUpstream("claude", config)
        chat, _ = rebuilt_chat()
        chat = {"model": "claude-fake", "max_tokens": 50, "messages": chat["messages"]}
        payload = ChatPayload(chat_with_breakpoints(chat, (STABLE_AT, WINDOW_END)))

        async def send() -> int:
            response = await upstream.chat_completions(payload, [], None)
            await response.read()
            await response.close()
            return response.status

        assert asyncio.run(send()) == 200
    sent = fake.last().body
    assert [b["text"] for b in sent["system"]] == ["You are the parcel desk.", STABLE]
    assert sent["system"][-1]["cache_control"] == EPHEMERAL
    assert sent["messages"][1]["content"][-1] == {
        "type": "text",
        "text": "P-1 is in Porto.",
        "cache_control": EPHEMERAL,
    }
    assert [b["text"] for b in sent["messages"][-1]["content"]] == [TAIL, "Where is parcel P-3?"]


# ----------------------------------------------------------------------------- Claude Code's user


@pytest.mark.parametrize(
    ("sent", "user"),
    [
        ('{"device_id":"d1e2","account_uuid":"7c9a-11","session_id":"5f0b-22"}', "7c9a-11"),
        ('{"device_id":"d1e2","account_uuid":"","session_id":"5f0b-22"}', "d1e2"),
        ('{"device_id":"d1e2","session_id":"5f0b-22"}', "d1e2"),
        ('{"session_id":"5f0b-22"}', None),  # a session alone names nobody
        ("user_d1e2_account_7c9a-11_session_5f0b-22", "7c9a-11"),  # Claude Code before its JSON form
        ("user_d1e2_account__session_5f0b-22", "d1e2"),
        ("u-anna", "u-anna"),  # any other id is the user as sent
        ('{"team":"x"}', '{"team":"x"}'),
        ("{not json", "{not json"),
    ],
)
def test_claude_codes_metadata_names_the_account_else_the_device(sent: str, user: str | None) -> None:
    assert end_user(sent) == user
    body = to_chat(
        {
            "model": "m",
            "max_tokens": 5,
            "metadata": {"user_id": sent},
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).body
    assert body.get("user") == user


# ----------------------------------------------------------------------------- native /v1/messages


@pytest.fixture
def claude() -> Iterator[tuple[FakeAnthropic, BackgroundServer]]:
    fake = FakeAnthropic()
    with BackgroundServer(fake.app()) as server:
        yield fake, server


def native_gateway(make_gateway: Callable[..., Gateway], server: BackgroundServer, **extra: Any) -> Gateway:
    upstream = {"provider": "anthropic", "api_key": "sk-ant-tenant", "api_keys": [GATEWAY_KEY], **extra}
    return make_gateway([tenant("claude", server.url, **upstream)])


def parcels(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for n in range(turns):
        history.append({"role": "user", "content": f"Order question {n}: where is parcel P-{n}?"})
        history.append({"role": "assistant", "content": f"Parcel P-{n} is on its way from depot {n}."})
    return history


def test_an_unchanged_anthropic_request_gets_no_breakpoint_of_the_gateways(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    fake, server = claude
    gateway = native_gateway(make_gateway, server)
    body = orjson.dumps(
        {
            "model": "claude-fake",
            "max_tokens": 20,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}],
            "messages": [*parcels(3), {"role": "user", "content": "Thanks."}],
        }
    )
    response = httpx.post(
        f"{gateway.server.url}/v1/messages",
        content=body,
        headers={
            "x-api-key": GATEWAY_KEY,
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
        },
    )
    assert response.status_code == 200, response.text
    assert fake.last().raw == body


@pytest.mark.parametrize("client_marks", [0, 1, 2, 3, 4])
def test_a_rebuilt_anthropic_prompt_gets_breakpoints_beside_the_clients(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway], client_marks: int
) -> None:
    fake, server = claude
    gateway = native_gateway(
        make_gateway,
        server,
        context={"budget_tokens": 900, "recent_tokens": 300},
        compaction={"enabled": False},
    )
    _, original = rebuilt_chat(client_marks)
    messages = [*parcels(60), original["messages"][-1]]
    response = gateway.anthropic().messages.with_raw_response.create(
        model="claude-fake",
        max_tokens=20,
        system=original["system"],
        tools=original["tools"],
        messages=messages,
    )
    sent = fake.last().body
    assert len(sent["messages"]) < len(messages), "not rebuilt: the budget did not cut the history"
    # The client's breakpoints byte for byte, and no more than four in all.
    assert sent["tools"] == original["tools"]
    assert sent["system"][0] == original["system"][0]
    assert blocks(sent["messages"][-1]["content"])[-1] == original["messages"][-1]["content"][0]
    marks = marks_of(sent)
    assert len(marks) <= MAX_CACHE_BREAKPOINTS
    # The gateway's own: the window's end first (the answer before the question), while there is room.
    window_end = sent["messages"][-2]
    assert window_end["role"] == "assistant"
    last_block = window_end["content"][-1] if isinstance(window_end["content"], list) else {}
    assert (last_block.get("cache_control") == EPHEMERAL) == (client_marks < MAX_CACHE_BREAKPOINTS)
    assert len(marks) > client_marks or client_marks == MAX_CACHE_BREAKPOINTS
    recorded(gateway, response.headers["x-gateway-request-id"])


def test_the_retrieved_tail_reaches_anthropic_in_the_current_user_turn(
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
    system = [{"type": "text", "text": "You are the order desk."}]
    history = [*parcels(60), {"role": "user", "content": "Thanks."}]
    first = client.messages.with_raw_response.create(
        model="claude-fake", max_tokens=20, system=system, messages=history
    )  # type: ignore[arg-type]
    recorded(gateway, first.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)  # indexed: retrieval can bring parcel P-3 back
    history.append({"role": "assistant", "content": first.parse().content[0].text})  # type: ignore[union-attr]
    history.append({"role": "user", "content": "Where is parcel P-3 now?"})
    client.messages.create(model="claude-fake", max_tokens=20, system=system, messages=history)  # type: ignore[arg-type]
    sent = fake.last().body
    texts = [b.get("text", "") for b in sent["system"]]
    assert not any("depot 3." in t for t in texts), "the retrieved tail went to system"
    question = sent["messages"][-1]
    assert question["role"] == "user" and isinstance(question["content"], list)
    assert "depot 3." in question["content"][0]["text"]  # the tail opens the current user turn
    assert question["content"][-1] == {"type": "text", "text": "Where is parcel P-3 now?"}


# ----------------------------------------------------------------------------- litellm, over HTTP


def test_a_rebuilt_prompt_through_litellm_gets_the_window_breakpoint(
    claude: tuple[FakeAnthropic, BackgroundServer], make_gateway: Callable[..., Gateway]
) -> None:
    load_litellm()
    fake, server = claude
    gateway = make_gateway(
        [
            tenant(
                "claude",
                server.url,
                provider="anthropic",
                api_key="sk-ant-test",
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": 900, "recent_tokens": 300},
                compaction={"enabled": False},
            )
        ]
    )
    messages: list[Any] = [{"role": "system", "content": "Be brief."}, *parcels(60)]
    messages.append({"role": "user", "content": "Thanks."})
    gateway.client().chat.completions.create(model="claude-fake", max_tokens=20, messages=messages)
    sent = fake.last().body
    assert len(sent["messages"]) < len(messages) - 1, "not rebuilt: the budget did not cut the history"
    window_end = sent["messages"][-2]
    assert window_end["role"] == "assistant"
    assert window_end["content"][-1]["cache_control"] == EPHEMERAL
    assert len(marks_of(sent)) <= MAX_CACHE_BREAKPOINTS
    assert "prompt_cache_key" not in sent


# ----------------------------------------------------------------------------- OpenAI prompt_cache_key


def chat_body(question: str, history: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": LONG_SYSTEM},
        *(history or []),
        {"role": "user", "content": question},
    ]
    return {"model": "gpt-5-mini", "messages": messages, **extra}


def post_chat(gateway: Gateway, raw: bytes) -> httpx.Response:
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=raw,
        headers={"Authorization": f"Bearer {GATEWAY_KEY}", "content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    return response


def test_each_conversation_gets_its_own_prompt_cache_key_in_the_clients_own_bytes(
    gateway: Gateway, upstream: Upstream
) -> None:
    raw = orjson.dumps(chat_body("Where is parcel P-3?", temperature=0.5)).replace(
        b',"temperature"', b',  "temperature"'
    )
    first = post_chat(gateway, raw)
    conversation = first.headers["x-conversation-id"]
    key = conversation_cache_key("acme", conversation)
    assert conversation not in key
    received = upstream.fake.last_chat()
    assert received.raw == with_field(raw, "prompt_cache_key", key)  # the client's bytes, one field added
    assert received.raw.startswith(raw[:-1])

    answer = first.json()["choices"][0]["message"]
    history = [
        {"role": "user", "content": "Where is parcel P-3?"},
        {"role": "assistant", "content": answer["content"]},
    ]
    client = gateway.client()
    second = client.chat.completions.create(**chat_body("And P-4?", history, temperature=0.5))
    assert upstream.fake.last_chat().body["prompt_cache_key"] == key  # the same conversation, the same key
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) >= 1024  # the provider found its cache

    client.chat.completions.create(**chat_body("Another matter entirely."))
    other = upstream.fake.last_chat().body["prompt_cache_key"]
    assert isinstance(other, str) and other != key


def test_a_clients_own_prompt_cache_key_is_kept(gateway: Gateway, upstream: Upstream) -> None:
    raw = orjson.dumps(chat_body("Where is parcel P-3?", prompt_cache_key="client-chosen"))
    post_chat(gateway, raw)
    assert upstream.fake.last_chat().raw == raw


def test_no_prompt_cache_key_when_turned_off_or_too_short_to_cache(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    off = make_gateway([tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], prompt_cache_key=False)])
    raw = orjson.dumps(chat_body("Where is parcel P-3?"))
    post_chat(off, raw)
    assert upstream.fake.last_chat().raw == raw
    on = make_gateway([tenant("other", upstream.base_url, api_keys=["sk-gw-other"])])
    short = orjson.dumps({"model": "gpt-5-mini", "messages": [{"role": "user", "content": "Hi"}]})
    response = httpx.post(
        f"{on.base_url}/chat/completions",
        content=short,
        headers={"Authorization": "Bearer sk-gw-other", "content-type": "application/json"},
    )
    assert response.status_code == 200
    assert upstream.fake.last_chat().raw == short  # OpenAI caches nothing under 1,024 tokens


def test_a_rebuilt_prompt_and_the_other_doors_carry_the_key(
    upstream: Upstream, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": 2500, "recent_tokens": 600},
                compaction={"enabled": False},
            ),
            tenant("native", upstream.base_url, api_keys=["sk-gw-native"], responses="native"),
        ]
    )
    history = parcels(60)
    rebuilt = gateway.client().chat.completions.with_raw_response.create(**chat_body("Thanks.", history))
    sent = upstream.fake.last_chat().body
    assert len(sent["messages"]) < len(history) + 2  # rebuilt under the budget
    assert sent["prompt_cache_key"] == conversation_cache_key("acme", rebuilt.headers["x-conversation-id"])

    # /v1/messages in front of the same upstream: converted to chat, the key added.
    anthropic = gateway.anthropic().messages.with_raw_response.create(
        model="gpt-5-mini",
        max_tokens=20,
        system=LONG_SYSTEM,
        messages=[{"role": "user", "content": "Hi there"}],
    )
    assert upstream.fake.last_chat().body["prompt_cache_key"] == conversation_cache_key(
        "acme", anthropic.headers["x-conversation-id"]
    )

    # /v1/responses converted to chat completions, and forwarded natively.
    converted = gateway.client().responses.with_raw_response.create(
        model="gpt-5-mini", instructions=LONG_SYSTEM, input="Hello"
    )
    assert upstream.fake.last_chat().body["prompt_cache_key"] == conversation_cache_key(
        "acme", converted.headers["x-conversation-id"]
    )
    native = gateway.client(api_key="sk-gw-native").responses.with_raw_response.create(
        model="gpt-5-mini", instructions=LONG_SYSTEM, input="Hello"
    )
    received = next(r for r in reversed(upstream.fake.received) if r.path == "/v1/responses")
    assert received.body["prompt_cache_key"] == conversation_cache_key(
        "native", native.headers["x-conversation-id"]
    )
    own = gateway.client(api_key="sk-gw-native").responses.create(
        model="gpt-5-mini", instructions=LONG_SYSTEM, input="Hello again", prompt_cache_key="mine"
    )
    assert own.id
    received = next(r for r in reversed(upstream.fake.received) if r.path == "/v1/responses")
    assert received.body["prompt_cache_key"] == "mine"
    assert api(gateway, "/conversations")["data"]
