"""`context-gateway demo`: a real gateway, a local stand-in upstream and the official OpenAI SDK.

It shows, per turn, what the chat app sent and what the gateway forwarded, so a newcomer sees the
product work in one command, with no provider key.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer
from gateway.app import create_app
from gateway.config import parse_config
from gateway.fakes.openai_upstream import FakeUpstream
from gateway.fakes.server import BackgroundServer

SCRIPT = (
    "Hi! I'm planning a trip to Lisbon in May. I'm vegetarian and I hate early flights.",
    "Which neighbourhood should I stay in for good food and a short walk to the river?",
    "Remind me: what did I say about flights?",
    "Summarise my constraints for the trip in one line.",
    "Thanks. Which museums open on Mondays?",
    "And is the tram 28 worth it?",
)
DEMO_KEY = "demo-key"
DEMO_BUDGET = 250


def run_demo(turns: int, echo: Callable[[str], None]) -> int:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionMessageParam

    upstream = FakeUpstream(model="stand-in")
    tokenizer = TiktokenTokenizer.for_model("gpt-4o")
    with (
        tempfile.TemporaryDirectory(prefix="context-gateway-demo-") as data,
        BackgroundServer(upstream.app()) as fake,
    ):
        config = parse_config(
            {
                "storage": {"database_url": f"sqlite:///{data}/demo.db", "data_dir": data},
                "tenants": [
                    {
                        "name": "demo",
                        "api_keys": [DEMO_KEY],
                        "upstream": {"base_url": f"{fake.url}/v1"},
                        # A tiny budget so the demo shows the prompt being cut after a few turns.
                        "context": {"budget_tokens": DEMO_BUDGET},
                    }
                ],
            },
            {},
        )
        with BackgroundServer(create_app(config)) as gateway:
            client = OpenAI(base_url=f"{gateway.url}/v1", api_key=DEMO_KEY)
            echo(f"gateway on {gateway.url}, stand-in model on {fake.url}\n")
            messages: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": "You are a helpful travel assistant."}
            ]
            for number, text in enumerate(SCRIPT[: max(1, turns)], start=1):
                messages.append({"role": "user", "content": text})
                response = client.chat.completions.with_raw_response.create(
                    model="stand-in", messages=messages
                )
                completion = response.parse()
                answer = completion.choices[0].message.content or ""
                forwarded = upstream.last().body.get("messages")
                sent_tokens = tokenizer.count_messages(messages)
                fwd = forwarded if isinstance(forwarded, list) else []
                echo(f"turn {number}  user: {text}")
                echo(f"  client sent    {len(messages):3d} messages, {sent_tokens:5d} tokens")
                echo(
                    f"  gateway sent   {len(fwd):3d} messages, {tokenizer.count_messages(fwd):5d} tokens upstream"
                )
                echo(
                    f"  conversation   {response.headers.get('x-conversation-id')} (budget {DEMO_BUDGET} tokens)"
                )
                echo(f"  overhead       {response.headers.get('x-gateway-overhead-ms')} ms")
                echo(f"  assistant: {answer}\n")
                messages.append({"role": "assistant", "content": answer})
    echo(
        "Done. Point any OpenAI SDK at the gateway: OpenAI(base_url='http://HOST:PORT/v1', api_key=GATEWAY_KEY)"
    )
    return 0
