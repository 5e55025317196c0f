"""The gateway forwards a chat completion through the official SDK."""

from tests.conftest import Gateway, Upstream


def test_chat_completion_round_trip(gateway: Gateway, upstream: Upstream) -> None:
    completion = gateway.client().chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "ping"}]
    )
    assert completion.choices[0].message.content == "(fake model) I read 1 messages. You said: ping"
    received = upstream.fake.last()
    assert received.body["messages"] == [{"role": "user", "content": "ping"}]
    assert received.headers["authorization"] == "Bearer sk-upstream"
