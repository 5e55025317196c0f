"""The front door a recall benchmark speaks (`locomo.py --door`): how a history and a question reach
the gateway through each of its three doors, and what text the fake upstream then received.

- chat: `/v1/chat/completions` with string contents, to an OpenAI upstream (the default);
- messages: `/v1/messages` to an Anthropic upstream, every message's content a list of text blocks, as
  Claude Code sends them; the history by the official `anthropic` SDK;
- responses: `/v1/responses` to an OpenAI upstream, the history as typed input items (`input_text`,
  `output_text`); the history by the official `openai` SDK's Responses API. At the default
  `upstream.responses: chat` the gateway forwards chat completions: what arrived is read either way.

A door keeps the history in its own wire form; questions go as raw JSON on one connection (locomo.py's
`ask` says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from anthropic import Anthropic
from openai import OpenAI
from starlette.applications import Starlette

from gateway.fakes.anthropic_upstream import FakeAnthropic
from gateway.fakes.anthropic_upstream import Reply as AnthropicReply
from gateway.fakes.openai_upstream import FakeUpstream, Reply

Message = dict[str, Any]
CLOSING = "Thanks, talk soon."
ANSWER = "Talk soon!"


class Door(Protocol):
    name: str

    def app(self) -> Starlette:
        """The fake upstream this door's gateway forwards to."""

    def upstream(self, url: str) -> dict[str, Any]:
        """The tenant's upstream settings for the fake served at `url`."""

    def send(self, gateway_url: str, key: str, turns: Sequence[tuple[str, str]], user: str) -> list[Message]:
        """The whole history (role, text pairs) in one request, by the official SDK; the history as the
        app then holds it, the upstream's answer included."""

    def question(self, history: list[Message], question: str) -> tuple[str, dict[str, Any]]:
        """The path and body asking `question` at the end of `history`."""

    def clear(self) -> None:
        """Forget what the upstream received (before a question)."""

    def forwarded(self) -> str:
        """Every text the upstream received in the last client request, joined by line breaks."""


def _closed(turns: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The history ending on a user turn (a request needs one)."""
    return [*turns, ("user", CLOSING)] if turns and turns[-1][0] == "assistant" else list(turns)


def _texts(content: Any) -> list[str]:
    """The text of a content field: a string, or the `text` of each block."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(b.get("text", "")) for b in content if isinstance(b, dict)]
    return []


class ChatDoor:
    name = "chat"

    def __init__(self) -> None:
        self.fake = FakeUpstream()

    def app(self) -> Starlette:
        return self.fake.app()

    def upstream(self, url: str) -> dict[str, Any]:
        return {"base_url": f"{url}/v1", "api_key": "sk-upstream"}

    def send(self, gateway_url: str, key: str, turns: Sequence[tuple[str, str]], user: str) -> list[Message]:
        messages: list[Message] = [{"role": r, "content": c} for r, c in _closed(turns)]
        self.fake.enqueue(Reply(content=ANSWER))
        client = OpenAI(base_url=f"{gateway_url}/v1", api_key=key, max_retries=0)
        answer = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,  # type: ignore[arg-type]
            extra_headers={"X-User-Id": user},
        )
        return [*messages, {"role": "assistant", "content": answer.choices[0].message.content or ""}]

    def question(self, history: list[Message], question: str) -> tuple[str, dict[str, Any]]:
        return "/v1/chat/completions", {
            "model": "gpt-4o-mini",
            "messages": [*history, {"role": "user", "content": question}],
        }

    def clear(self) -> None:
        self.fake.received.clear()

    def forwarded(self) -> str:
        return self.texts(self.fake.last_chat().body)

    @staticmethod
    def texts(body: dict[str, Any]) -> str:
        messages = body["messages"]
        return (
            "\n".join(str(m.get("content")) for m in messages if isinstance(m, dict))
            if isinstance(messages, list)
            else ""
        )


class MessagesDoor:
    name = "messages"
    model = "claude-sonnet-4-5"

    def __init__(self) -> None:
        self.fake = FakeAnthropic()

    def app(self) -> Starlette:
        return self.fake.app()

    def upstream(self, url: str) -> dict[str, Any]:
        return {"provider": "anthropic", "base_url": url, "api_key": "sk-ant-upstream"}

    def send(self, gateway_url: str, key: str, turns: Sequence[tuple[str, str]], user: str) -> list[Message]:
        messages = [self._message(r, c) for r, c in _closed(turns)]
        self.fake.enqueue(AnthropicReply(text=ANSWER))
        client = Anthropic(base_url=gateway_url, api_key=key, max_retries=0)
        answer = client.messages.create(
            model=self.model,
            max_tokens=1024,
            messages=messages,  # type: ignore[arg-type]
            extra_headers={"X-User-Id": user},
        )
        text = "".join(b.text for b in answer.content if b.type == "text")
        return [*messages, self._message("assistant", text)]

    @staticmethod
    def _message(role: str, text: str) -> Message:
        return {"role": role, "content": [{"type": "text", "text": text}]}

    def question(self, history: list[Message], question: str) -> tuple[str, dict[str, Any]]:
        return "/v1/messages", {
            "model": self.model,
            "max_tokens": 1024,
            "messages": [*history, self._message("user", question)],
        }

    def clear(self) -> None:
        self.fake.received.clear()

    def forwarded(self) -> str:
        body = self.fake.last().body
        texts = _texts(body.get("system"))
        messages = body.get("messages")
        for message in messages if isinstance(messages, list) else []:
            texts += _texts(message.get("content")) if isinstance(message, dict) else []
        return "\n".join(texts)


class ResponsesDoor(ChatDoor):
    """The chat door's fake upstream and settings; Responses input items going in."""

    name = "responses"

    def send(self, gateway_url: str, key: str, turns: Sequence[tuple[str, str]], user: str) -> list[Message]:
        items = [self._item(r, c) for r, c in _closed(turns)]
        self.fake.enqueue(Reply(content=ANSWER))
        client = OpenAI(base_url=f"{gateway_url}/v1", api_key=key, max_retries=0)
        answer = client.responses.create(
            model="gpt-4o-mini",
            input=items,  # type: ignore[arg-type]
            store=False,
            extra_headers={"X-User-Id": user},
        )
        return [*items, self._item("assistant", answer.output_text)]

    @staticmethod
    def _item(role: str, text: str) -> Message:
        kind = "output_text" if role == "assistant" else "input_text"
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    def question(self, history: list[Message], question: str) -> tuple[str, dict[str, Any]]:
        return "/v1/responses", {
            "model": "gpt-4o-mini",
            "store": False,
            "input": [*history, self._item("user", question)],
        }

    def forwarded(self) -> str:
        last = self.fake.last()
        if last.path.endswith("/chat/completions"):  # the default upstream.responses: converted
            return ChatDoor.texts(last.body)
        body = last.body
        texts = _texts(body.get("instructions"))
        items = body.get("input")
        for item in items if isinstance(items, list) else [items]:
            texts += _texts(item.get("content")) if isinstance(item, dict) else _texts(item)
        return "\n".join(texts)


DOORS: dict[str, type[ChatDoor] | type[MessagesDoor]] = {
    "chat": ChatDoor,
    "messages": MessagesDoor,
    "responses": ResponsesDoor,
}
