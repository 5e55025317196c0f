"""`context-gateway demo`: a real gateway, a local stand-in upstream and the official OpenAI SDK.

The story, in about a minute and with no provider key: a long trip-planning chat whose first message
holds a booking code; many turns later the user asks for it, and retrieval brings it back although the
recent window dropped it long ago and the rolling summary of the old turns (the stand-in model's, which
keeps only the newest questions) lost it; then a new conversation of
the same user starts with what memory learnt (vegetarian, no early flights). Each turn prints what the
client sent and what the gateway forwarded; the turns that matter print the injected context. With
`--keep` the gateway stays up afterwards, for the dashboard.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

import httpx

from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer
from gateway.app import create_app
from gateway.config import GatewayConfig, parse_config
from gateway.fakes.openai_upstream import FakeUpstream
from gateway.fakes.server import BackgroundServer

DEMO_KEY = "demo-key"
DEMO_USER = "demo-user"
DEMO_BUDGET = 600
FIRST = "Hi! I'm planning a trip to Lisbon in May. I'm vegetarian and I hate early flights. My booking code is LX-4471."
FILLER = (
    "Which neighbourhood should I stay in for good food and a short walk to the river?",
    "Is the tram 28 worth it or is it just for tourists?",
    "Which museums open on Mondays?",
    "How do I get from the airport to Baixa?",
    "What is a good day trip: Sintra or Cascais?",
    "Where can I hear fado without a tourist menu?",
    "Do I need to book the Jerónimos monastery in advance?",
    "What should I pack for May weather?",
)
RECALL = "Remind me: what was my booking code?"
NEW_CHAT = "Suggest a dinner place for tonight, and a flight home."


def _wait_for_jobs(base: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = httpx.get(f"{base}/healthz").json()["jobs"]
        if not jobs.get("queued") and not jobs.get("running"):
            return
        time.sleep(0.1)


def _sections(base: str, request_id: str) -> str:
    """The request's ContextReport as `name tokens` per section that sent something (once it is stored:
    after the last byte)."""
    for _ in range(200):
        response = httpx.get(
            f"{base}/api/requests/{request_id}", headers={"Authorization": f"Bearer {DEMO_KEY}"}
        )
        if response.status_code == 200:
            report = response.json().get("report") or {}
            sections = report.get("sections") or {}
            used = [
                f"{name} {d['tokens']}" + (f" ({d['exchanges']} exchanges)" if "exchanges" in d else "")
                for name, d in sections.items()
                if isinstance(d, dict) and d.get("tokens")
            ]
            return ", ".join(used) if used else "sent as the client sent it"
        time.sleep(0.02)
    return "?"


def _context(forwarded: list[Any]) -> str | None:
    """The gateway's blocks as sent: the stable one after the system prompt, the tail before the question."""
    blocks = [
        str(message["content"])
        for message in forwarded
        if isinstance(message, dict) and "<gateway_context>" in str(message.get("content"))
    ]
    return "\n".join(blocks) if blocks else None


def run_demo(turns: int, echo: Callable[[str], None], *, keep: bool = False) -> int:
    """`turns`: filler turns between the booking code and the question about it (the longer, the
    further back the code lies)."""
    from openai import OpenAI

    upstream = FakeUpstream(model="stand-in", readable_summaries=True)
    tokenizer = TiktokenTokenizer.for_model("gpt-4o")
    with (
        tempfile.TemporaryDirectory(prefix="context-gateway-demo-") as data,
        BackgroundServer(upstream.app()) as fake,
    ):
        config = _demo_config(fake.url, data)
        with BackgroundServer(create_app(config)) as gateway:
            client = OpenAI(
                base_url=f"{gateway.url}/v1", api_key=DEMO_KEY, default_headers={"X-User-Id": DEMO_USER}
            )
            echo(f"gateway on {gateway.url}, stand-in model on {fake.url}; budget {DEMO_BUDGET} tokens\n")

            def say(messages: list[Any], text: str, number: int, show: bool) -> str:
                messages.append({"role": "user", "content": text})
                raw = client.chat.completions.with_raw_response.create(model="stand-in", messages=messages)
                answer = raw.parse().choices[0].message.content or ""
                messages.append({"role": "assistant", "content": answer})
                forwarded = upstream.last_chat().body.get("messages")
                fwd = forwarded if isinstance(forwarded, list) else []
                echo(
                    f"turn {number:>2}  client sent {len(messages) - 1:3d} messages / "
                    f"{tokenizer.count_messages(messages[:-1]):5d} tokens  ->  gateway sent {len(fwd):3d} / "
                    f"{tokenizer.count_messages(fwd):5d}   user: {text[:60]}"
                )
                request_id = raw.headers.get("x-gateway-request-id", "")
                echo(f"          [{_sections(gateway.url, request_id)}]")
                context = _context(fwd)
                if show and context:
                    echo(
                        "          injected context:\n"
                        + "\n".join(f"          | {line}" for line in context.splitlines())
                    )
                _wait_for_jobs(gateway.url)  # indexing, summaries and memory run in the background
                return request_id

            echo("Conversation 1: a long trip-planning chat")
            messages: list[Any] = [{"role": "system", "content": "You are a helpful travel assistant."}]
            say(messages, FIRST, 1, False)
            for number in range(max(turns, 1)):
                say(messages, FILLER[number % len(FILLER)], number + 2, False)
            request_id = say(messages, RECALL, max(turns, 1) + 2, True)
            echo(f"\n  (context of that request: context-gateway context --tenant demo {request_id})\n")

            echo("Conversation 2: a new chat of the same user starts with what memory holds")
            say([{"role": "system", "content": "You are a helpful travel assistant."}], NEW_CHAT, 1, True)
            _linger(gateway.url, keep, echo)
    echo(
        "\nDone. Point any OpenAI SDK at the gateway: OpenAI(base_url='http://HOST:PORT/v1', api_key=GATEWAY_KEY)"
    )
    return 0


def _demo_config(fake_url: str, data: str) -> GatewayConfig:
    """One tenant on the stand-in model, on a throwaway store under `data`."""
    return parse_config(
        {
            "storage": {"database_url": f"sqlite:///{data}/demo.db", "data_dir": data},
            "jobs": {"poll_seconds": 0.05},
            "tenants": [
                {
                    "name": "demo",
                    "api_keys": [DEMO_KEY],
                    "upstream": {"base_url": f"{fake_url}/v1", "api_key": "stand-in"},
                    # A small budget so the prompt is cut after a few turns, and summaries early.
                    "context": {"budget_tokens": DEMO_BUDGET, "recent_tokens": 250},
                    "compaction": {"threshold_tokens": 150, "chunk_tokens": 300, "summary_tokens": 200},
                    "memory": {"extract_delay_seconds": 0, "profile_delay_seconds": 0},
                }
            ],
        },
        {},
    )


def _linger(gateway_url: str, keep: bool, echo: Callable[[str], None]) -> None:
    """With `keep`, the gateway stays up for its dashboard until Ctrl+C."""
    if keep:
        echo(f"\nDashboard: {gateway_url}/dashboard (sign in with the key {DEMO_KEY!r}). Ctrl+C stops.")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    else:
        echo(
            "\n`context-gateway demo --keep` leaves this gateway running: open its /dashboard to see "
            "each request's context as a bar, the conversation tree, the summaries and the memories."
        )
