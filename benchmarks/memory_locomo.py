"""Cross-conversation recall through long-term memory on LoCoMo (issue 12's benchmark).

Each LoCoMo session is replayed through the real gateway server as a conversation of its own, by one
user (speaker A; speaker B's turns are the fake upstream's answers), turn by turn with the official SDK
and the gateway's clock at the session's date. Memory extraction runs in the background on the shipped
fake upstream, whose answers are an *extractive stand-in* for a model (`gateway/fakes/memory_llm.py`):
every sentence of a user turn that says something about the speaker ("I", "my", "we"...) becomes a
memory holding that sentence. No real LLM runs here, so these figures measure the pipeline around the
model (what is kept, found and fitted), not a model's extraction.

Then every question of categories 1-4 is asked in a *new* conversation of that user, and scored on what
the gateway forwarded: the share of the question's evidence turns that reach the prompt, either verbatim
or through an injected memory whose text is a sentence of that turn. Variants, side by side:
  no memory          the question alone (what the app sends; nothing added)
  last conversation  the user's last session resent with the question (an app that keeps one thread)
  memory @ N         the question in a new conversation, memory allowance N tokens
Evidence said by speaker B can never be a memory (memory learns from the user's own turns only); the
share of such evidence is printed. Also printed: the memory section's own time (p50/p95, from its
ContextReport) next to the query embedding's time in the same process, and the extraction cost (calls
and tokens per 100 user turns, tokens counted with tiktoken over the calls' messages and answers).

    python benchmarks/memory_locomo.py [--data ../shared/locomo/locomo-dev.json] [--allowances 500,1000,2000]

The data is CC BY-NC 4.0: read from its path, never copied into this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import orjson
from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.locomo import CATEGORIES, DEFAULT_DATA, Clock, Sample, load  # noqa: E402
from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizers  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from gateway.fakes.memory_llm import memory_answer  # noqa: E402
from gateway.fakes.openai_upstream import FakeUpstream, Reply  # noqa: E402
from gateway.fakes.server import BackgroundServer  # noqa: E402
from gateway.wiring import build_deps  # noqa: E402

_LINE = re.compile(r"^- \[\d{4}-\d{2}-\d{2}\] (.+)$", re.M)


def tenant(name: str, upstream: str, allowance: int) -> dict[str, Any]:
    return {
        "name": name,
        "api_keys": [f"sk-gw-{name}"],
        "upstream": {"base_url": upstream, "api_key": "sk-upstream"},
        "compaction": {"enabled": False},
        "retrieval": {"enabled": False},
        # No profile: the stand-in would list every memory in it (a model writes a short one).
        "memory": {"extract_delay_seconds": 0, "allowance_tokens": allowance, "top_n": 50, "profile": False},
    }


def wait(http: httpx.Client) -> None:
    while True:
        jobs = http.get("/healthz").json()["jobs"] or {}
        if not jobs.get("queued") and not jobs.get("running"):
            if jobs.get("failed"):
                print(f"  warning: {jobs['failed']} failed jobs", file=sys.stderr)
            return
        time.sleep(0.2)


def sessions(sample: Sample) -> list[list[tuple[str, str, str, Any]]]:
    """The sample's turns split where the date jumps (a new LoCoMo session)."""
    out: list[list[tuple[str, str, str, Any]]] = []
    for turn in sample.turns:
        if not out or (turn[3] - out[-1][-1][3]).total_seconds() > 3600:
            out.append([])
        out[-1].append(turn)
    return out


def replay(
    client: OpenAI, fake: FakeUpstream, clock: Clock, user: str, session: list[Any]
) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    for _, role, content, when in session:
        clock.now = when
        if role == "user" or not messages or messages[-1]["role"] != "user":
            messages.append({"role": role, "content": content})
            continue
        fake.enqueue(Reply(content=content))
        answer = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, extra_headers={"X-User-Id": user}
        )
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    if messages and messages[-1]["role"] == "user":  # a session ending on the user's turn
        fake.enqueue(Reply(content="OK."))
        client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, extra_headers={"X-User-Id": user}
        )
    return messages


def reached(evidence: list[str], contents: dict[str, str], forwarded: str) -> list[str]:
    memories = [m for m in _LINE.findall(forwarded) if len(m) >= 8]
    return [e for e in evidence if contents[e] in forwarded or any(m in contents[e] for m in memories)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--allowances", default="500,1000,2000")
    parser.add_argument("--limit", type=int, default=0, help="only the first N conversations")
    args = parser.parse_args()
    allowances = [int(a) for a in args.allowances.split(",")]
    samples = load(args.data)[: args.limit or None]
    tokenizer = TiktokenTokenizers().for_model("gpt-4o-mini")
    variants = ["no memory", "last conversation", *(f"memory @ {a}" for a in allowances)]
    recall: dict[str, dict[int, list[float]]] = {v: defaultdict(list) for v in variants}
    section_ms: list[float] = []
    embed_ms: list[float] = []
    parts_ms: dict[str, list[float]] = defaultdict(list)
    user_turns = calls = call_in = call_out = memories_total = 0
    speaker_b_evidence = evidence_total = 0
    fake = FakeUpstream()
    with BackgroundServer(fake.app()) as upstream, tempfile.TemporaryDirectory() as tmp:
        for number, sample in enumerate(samples):
            data = Path(tmp) / f"s{number}"
            clock = Clock()
            names = [f"m{a}" for a in allowances]
            config = parse_config(
                {
                    "tenants": [
                        tenant(n, f"{upstream.url}/v1", a) for n, a in zip(names, allowances, strict=True)
                    ],
                    "storage": {"database_url": f"sqlite:///{data}/gateway.db", "data_dir": str(data)},
                    "jobs": {"workers": 1, "poll_seconds": 0.05},
                },
                {},
            )
            deps = build_deps(config, clock=clock)
            embedder = next(iter(deps.memory.values())).embedder
            with (
                BackgroundServer(create_app(config, deps)) as server,
                httpx.Client(base_url=server.url) as http,
            ):
                user = sample.sample_id
                learner = OpenAI(base_url=f"{server.url}/v1", api_key=f"sk-gw-{names[0]}", max_retries=0)
                started = time.perf_counter()
                fake.received.clear()
                last: list[dict[str, str]] = []
                for session in sessions(sample):
                    last = replay(learner, fake, clock, user, session)
                    wait(http)
                user_turns += sum(1 for t in sample.turns if t[1] == "user")
                for request in fake.memory_requests():
                    calls += 1
                    call_in += sum(tokenizer.count(str(m.get("content"))) for m in request.body["messages"])  # type: ignore[union-attr]
                    call_out += tokenizer.count(memory_answer(request.body) or "")
                exported = http.get(
                    f"/api/users/{user}/memories/export",
                    headers={"authorization": f"Bearer sk-gw-{names[0]}"},
                ).json()["memories"]
                memories_total += len(exported)
                for name in names[1:]:  # the same memories for every allowance
                    http.post(
                        f"/api/users/{user}/memories/import",
                        content=orjson.dumps({"memories": exported}),
                        headers={"authorization": f"Bearer sk-gw-{name}"},
                    ).raise_for_status()
                print(
                    f"{user}: {len(sample.turns)} turns in {len(sessions(sample))} sessions replayed and learnt in "
                    f"{time.perf_counter() - started:.0f} s; {len(exported)} memories",
                    file=sys.stderr,
                )
                contents = {dia: content for dia, _, content, _ in sample.turns}
                speakers = {dia: role for dia, role, _, _ in sample.turns}
                loop = asyncio.new_event_loop()
                for question, evidence, category in sample.questions:
                    evidence_total += len(evidence)
                    speaker_b_evidence += sum(1 for e in evidence if speakers[e] == "assistant")
                    recall["no memory"][category].append(0.0)  # a new conversation holds none of it
                    found = reached(evidence, contents, "\n".join(m["content"] for m in last))
                    recall["last conversation"][category].append(len(found) / len(evidence))
                    t0 = time.perf_counter()
                    loop.run_until_complete(embedder.embed_query(question))
                    embed_ms.append((time.perf_counter() - t0) * 1000)
                    for name, allowance in zip(names, allowances, strict=True):
                        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}]}
                        headers = {"authorization": f"Bearer sk-gw-{name}", "x-user-id": user}
                        response = http.post(
                            "/v1/chat/completions", content=orjson.dumps(body), headers=headers
                        )
                        response.raise_for_status()
                        forwarded = "\n".join(
                            str(m.get("content")) for m in fake.last_chat().body["messages"]
                        )
                        found = reached(evidence, contents, forwarded)
                        recall[f"memory @ {allowance}"][category].append(len(found) / len(evidence))
                        record = http.get(
                            f"/api/requests/{response.headers['x-gateway-request-id']}", headers=headers
                        )
                        section = ((record.json().get("report") or {}).get("sections") or {}).get(
                            "memory"
                        ) or {}
                        if "ms" in section:
                            section_ms.append(float(section["ms"]))
                        for part, ms in (section.get("timings_ms") or {}).items():
                            parts_ms[part].append(float(ms))
                loop.close()
            asyncio.run(deps.aclose())
    print(f"\n{len(samples)} conversations, {sum(len(s.questions) for s in samples)} questions; extraction by the "
          "extractive stand-in (no real model)")  # fmt: skip
    print(
        f"evidence turns said by speaker B (never a memory): {speaker_b_evidence / max(evidence_total, 1):.1%}"
    )
    header = "| variant | all | " + " | ".join(CATEGORIES.values()) + " |"
    print(header)
    print("|" + " --- |" * (2 + len(CATEGORIES)))
    for variant in variants:
        scores = recall[variant]
        everything = [v for values in scores.values() for v in values]
        cells = [f"{statistics.mean(scores[c]):.1%}" if scores[c] else "-" for c in CATEGORIES.values()]
        print(f"| {variant} | {statistics.mean(everything):.1%} | " + " | ".join(cells) + " |")
    print(
        f"\nmemory section p50/p95: {percentile(section_ms, 0.5):.2f} / {percentile(section_ms, 0.95):.2f} ms; "
        f"query embedding in the same run p50/p95: {percentile(embed_ms, 0.5):.2f} / {percentile(embed_ms, 0.95):.2f} ms"
    )
    print(
        "  of which p50: "
        + ", ".join(f"{part} {percentile(values, 0.5):.2f} ms" for part, values in parts_ms.items())
        + " (embed: the wait for the question's vector, begun as the request arrived)"
    )
    per = 100 / max(user_turns, 1)
    print(
        f"extraction: {calls * per:.1f} calls, {call_in * per:.0f} input and {call_out * per:.0f} output tokens per 100 "
        f"user turns (extract_delay_seconds 0: one call per exchange); {memories_total} memories from {user_turns} user turns"
    )


if __name__ == "__main__":
    main()
