"""Resolution quality on a small hand-written set: facts, then updates and contradictions, then questions.

Each scenario is one user telling the gateway facts over several conversations (one message each,
in order), then asking a question in a new conversation. It passes when the *current* fact reaches the
forwarded prompt and the superseded one does not. Extraction and resolution are answered by the fake
upstream's stand-in (`gateway/fakes/memory_llm.py`: a sentence per self-statement; SUPERSEDE only when the
newer sentence says the fact changed, "now", "moved to", "switched", "no longer"...), so this measures the
gateway's part (duplicate guard, what reaches the model, what is injected) with a rule-based model: the
scenarios a real model is needed for (a contradiction without such words) are expected to fail here
and are counted apart.

    python benchmarks/memory_resolution.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.app import create_app  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from gateway.fakes.openai_upstream import FakeUpstream  # noqa: E402
from gateway.fakes.server import BackgroundServer  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    said: tuple[str, ...]
    question: str
    current: str  # must be injected
    stale: str | None  # must not be
    needs_model: bool = False  # the contradiction carries no "changed" word: only a model can see it


SCENARIOS = (
    Scenario(
        ("Our API runs on Postgres 16.", "We moved the API to Postgres 17 now."),
        "Which Postgres does our API run on?",
        "Postgres 17",
        "Postgres 16",
    ),
    Scenario(
        ("I live in Lisbon.", "I moved to Berlin last spring."),
        "Which city do I live in?",
        "Berlin",
        "Lisbon",
    ),
    Scenario(("My manager is Carla.", "My manager is now Tomas."), "Who is my manager?", "Tomas", "Carla"),
    Scenario(
        ("We deploy on Thursdays.", "We switched deploys to Mondays."),
        "When do we deploy?",
        "Mondays",
        "Thursdays",
    ),
    Scenario(
        ("I drink coffee every morning.", "I no longer drink coffee, only green tea."),
        "What do I drink in the morning?",
        "green tea",
        "every morning.",
    ),
    Scenario(
        ("Our staging cluster is in eu-west-1.", "Staging is now in us-east-2."),
        "Where is our staging cluster?",
        "us-east-2",
        "eu-west-1",
    ),
    Scenario(
        ("I am allergic to peanuts.", "Remember, I am allergic to peanuts."),
        "Any allergies I have?",
        "allergic to peanuts",
        None,
    ),
    Scenario(
        ("My daughter Mia is 7.", "My daughter Mia turned 8 today."),
        "How old is my daughter Mia?",
        "turned 8",
        "is 7",
        needs_model=True,  # "turned" is not among the stand-in's words for a change
    ),
    Scenario(
        ("I use vim for everything.", "I use VS Code these days instead of vim."),
        "Which editor do I use?",
        "VS Code",
        "vim for everything",
    ),
    Scenario(
        ("I'm vegetarian.", "I eat fish again since March."),
        "What food do I eat?",
        "fish",
        "vegetarian",
        needs_model=True,
    ),
    Scenario(
        ("Our team has 5 engineers.", "Our team has 7 engineers after the hires."),
        "How many engineers are in our team?",
        "7 engineers",
        "5 engineers",
        needs_model=True,
    ),
    Scenario(
        ("My laptop is a ThinkPad X1.", "My laptop is a MacBook Air."),
        "What laptop do I have?",
        "MacBook Air",
        "ThinkPad",
        needs_model=True,
    ),
)


def main() -> None:
    fake = FakeUpstream()
    passed = {False: 0, True: 0}
    total = {False: 0, True: 0}
    with BackgroundServer(fake.app()) as upstream, tempfile.TemporaryDirectory() as tmp:
        tenant = {
            "name": "bench",
            "api_keys": ["sk-gw-bench"],
            "upstream": {"base_url": f"{upstream.url}/v1", "api_key": "sk-upstream"},
            "compaction": {"enabled": False},
            "memory": {"extract_delay_seconds": 0, "profile": False},
        }
        storage = {"database_url": f"sqlite:///{tmp}/gateway.db", "data_dir": tmp}
        config = parse_config({"tenants": [tenant], "storage": storage, "jobs": {"poll_seconds": 0.05}}, {})
        with BackgroundServer(create_app(config)) as server, httpx.Client(base_url=server.url) as http:
            client = OpenAI(base_url=f"{server.url}/v1", api_key="sk-gw-bench", max_retries=0)
            for number, scenario in enumerate(SCENARIOS):
                user = f"user{number}"
                for text in scenario.said:
                    raw = client.chat.completions.with_raw_response.create(
                        model="m",
                        messages=[{"role": "user", "content": text}],
                        extra_headers={"X-User-Id": user},
                    )
                    # Its jobs are queued with its record, just after the last byte.
                    record = f"/api/requests/{raw.headers['x-gateway-request-id']}"
                    while (
                        http.get(record, headers={"authorization": "Bearer sk-gw-bench"}).status_code != 200
                    ):
                        time.sleep(0.01)
                    while (jobs := http.get("/healthz").json()["jobs"]).get("queued") or jobs.get("running"):
                        time.sleep(0.05)
                client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": scenario.question}],
                    extra_headers={"X-User-Id": user},
                )
                sent = "\n".join(str(m.get("content")) for m in fake.last_chat().body["messages"])
                ok = scenario.current in sent and (scenario.stale is None or scenario.stale not in sent)
                passed[scenario.needs_model] += ok
                total[scenario.needs_model] += 1
                print(f"{'pass' if ok else 'FAIL'}  {' -> '.join(scenario.said)}  |  {scenario.question}")
                if not ok:
                    print("      sent:", sent.replace("\n", " / ")[-300:])
    print(
        f"\ncurrent fact injected and superseded one not: {passed[False]}/{total[False]} scenarios whose change "
        f"is said in words; {passed[True]}/{total[True]} that need a model to see the contradiction "
        "(the stand-in cannot)"
    )


if __name__ == "__main__":
    main()
