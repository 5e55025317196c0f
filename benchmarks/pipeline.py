"""Full-pipeline overhead (identify + store + build) and input tokens per turn, measured side by side.

    python benchmarks/pipeline.py            # full run, ~10 minutes
    python benchmarks/pipeline.py --quick    # smoke run, ~2 minutes

Part 1, overhead. Processes on 127.0.0.1: the fake upstream (`benchmarks/fake_upstream_server.py`), one
gateway per scenario started through the real CLI on a fresh SQLite data directory, and this process as
the client (httpx, one keep-alive connection, bodies serialised once up front). Each measured request
sends a conversation's full history plus one new question, as chat apps do; the same body is sent to the
fake directly, interleaved, so `added` is a side-by-side difference. `gateway` is the gateway's own
`x-gateway-overhead-ms` (time in the gateway, upstream excluded).
  a. growth of the store: a 1,000-message conversation while the database holds 1k / 10k / 100k messages
     (the rest in other conversations of the same tenant, written through the store beforehand);
  b. growth of the conversation: 100 / 1,000 / 5,000 messages in full-history mode, and the same in thin
     mode (X-Conversation-Id + only the new message; the history comes from the store).

Part 2, tokens. The scenario of seed 002 (system prompt 500 tokens, question 50, answer 250) replayed for
40 and for 300 turns through a real gateway with an in-process fake upstream that answers 250 tokens:
input tokens of the last turn and in total, for full replay, a sliding window of the same budget, and the
gateway at budgets of 4,000 / 8,000 / 16,000 tokens, without and with compaction. With compaction, the
tokens of the gateway's own summarisation calls (input counted from the requests the fake received,
output = the fake's ~800-token summaries) are counted separately and included in "saved".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.adapters.sql.store import SqlStore  # noqa: E402
from gateway.adapters.tiktoken_tokenizer import TiktokenTokenizer  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from gateway.fakes.openai_upstream import FakeUpstream, Reply, summarisation_answer  # noqa: E402
from gateway.fakes.server import BackgroundServer  # noqa: E402
from gateway.ports import JSONObject  # noqa: E402
from gateway.records import AppendRequest, NewMessage  # noqa: E402

KEY = "sk-bench"
TOKENIZER = TiktokenTokenizer.for_model("gpt-4o")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


@contextmanager
def process(args: list[str], ready_url: str, cwd: Path = ROOT) -> Iterator[None]:
    """`args` run from `cwd` (`python -m gateway` then runs that checkout's code); its log goes to a
    file (a pipe nobody reads would fill and stall the gateway)."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_ready(ready_url)
            yield
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def text_of(tokens: int, seed: int) -> str:
    """Deterministic prose of about `tokens` tokens."""
    words = ["alpha", "river", "port", "config", "deploy", "metric", "cache", "thread", "error", "budget"]
    out = [f"(#{seed})"]
    while len(out) < tokens * 3 // 4:
        out.append(words[(seed + len(out) * 7) % len(words)])
    return " ".join(out)


def conversation(length: int, seed: int = 0) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a precise assistant."}]
    for turn in range(length // 2):
        messages.append({"role": "user", "content": text_of(40, seed * 100_000 + turn)})
        messages.append({"role": "assistant", "content": text_of(80, seed * 100_000 + turn + 50_000)})
    return messages


def prefill(database_url: str, tenant: str, messages: int, per_conversation: int = 1000) -> None:
    """Write `messages` messages in conversations of `per_conversation` through the store itself."""

    async def run() -> None:
        store = SqlStore.open(database_url)
        written = 0
        conversation_number = 0
        while written < messages:
            count = min(per_conversation, messages - written)
            parent: str | None = None
            batch: list[NewMessage] = []
            path_tokens = 0
            for depth in range(count):
                node_id = f"{conversation_number:08x}{depth:024x}"
                content = text_of(40, conversation_number * 10_000 + depth)
                path_tokens += 50
                role = "user" if depth % 2 == 0 else "assistant"
                batch.append(
                    NewMessage(
                        node_id, parent, depth, role, {"role": role, "content": content}, 50, path_tokens
                    )
                )
                parent = node_id
            conversation_id = None
            for start in range(0, len(batch), 500):
                chunk = tuple(batch[start : start + 500])
                conversation_id = await store.append(
                    AppendRequest(tenant, conversation_id, None, None, chunk)
                )
            written += count
            conversation_number += 1
        await store.aclose()

    asyncio.run(run())


def config_file(
    directory: Path,
    upstream_url: str,
    *,
    memo_messages: int | None = None,
    body_memo: bool = True,
    everything: bool = False,
    pass_through: bool = False,
    api_embedder: bool = False,
    **context: Any,
) -> Path:
    """`everything`: summaries (compaction) and memory on as well, as a default tenant runs them;
    `pass_through`: nothing stored, the prompt never rebuilt (the pure proxy)."""
    storage: dict[str, Any] = {
        "database_url": f"sqlite:///{directory}/gateway.db",
        "data_dir": str(directory),
    }
    if memo_messages is not None:
        storage["history_memo_bytes"] = memo_messages * 1024  # ~1 KiB a message
    if not body_memo:
        storage["body_memo_bytes"] = 0
    tenant: dict[str, Any] = {
        "name": "bench",
        "api_keys": [KEY],
        "upstream": {"base_url": upstream_url, "api_key": "sk-x"},
        "context": context or {"budget_tokens": 16_000},
        # The request path is measured here; background summaries are measured in part 2.
        "compaction": {"enabled": everything},
        # Memory's extraction would call the fake upstream too: measured in its own benchmarks.
        "memory": {"enabled": everything},
    }
    if api_embedder:  # embeddings from the provider's /v1/embeddings (the fake's: 3 dimensions)
        tenant["retrieval"] = {"embedder": {"provider": "upstream", "model": "fake-embed", "dimensions": 3}}
    if pass_through:
        tenant.update(store_conversations=False, context={"enabled": False})
    path = directory / "config.yaml"
    path.write_text(json.dumps({"storage": storage, "tenants": [tenant]}))  # JSON is YAML
    return path


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    gateway_url: str,
    upstream_url: str,
    bodies: list[bytes],
    headers: dict[str, str] | None = None,
    settle: bool = False,
) -> dict[str, float]:
    """Interleave each body through the gateway and directly; returns p50/p99 figures in ms. `settle`:
    wait after each request until the background jobs it queued have run (a turn every few seconds, as
    people chat) instead of sending the next one while they run."""
    via: list[float] = []
    direct: list[float] = []
    overhead: list[float] = []
    retrieval: list[float] = []
    base = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as gateway_client, httpx.Client(timeout=60) as direct_client:
        for body in bodies:
            start = time.perf_counter()
            response = gateway_client.post(
                f"{gateway_url}/v1/chat/completions", content=body, headers={**base, **(headers or {})}
            )
            via.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200, response.text
            overhead.append(float(response.headers["x-gateway-overhead-ms"]))
            if settle:
                wait_idle(gateway_url)
                record = gateway_client.get(
                    f"{gateway_url}/api/requests/{response.headers['x-gateway-request-id']}", headers=base
                ).json()
                section = (record.get("report") or {}).get("sections", {}).get("retrieval") or {}
                retrieval.append(float(section.get("ms") or 0.0))
            start = time.perf_counter()
            response = direct_client.post(f"{upstream_url}/chat/completions", content=body, headers=base)
            direct.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200
    return {
        "gateway_p50": percentile(overhead, 0.5),
        "gateway_p99": percentile(overhead, 0.99),
        "added_p50": percentile(via, 0.5) - percentile(direct, 0.5),
        "added_p99": percentile(via, 0.99) - percentile(direct, 0.99),
        "direct_p50": percentile(direct, 0.5),
        **({"retrieval_p50": percentile(retrieval, 0.5)} if retrieval else {}),
    }


def full_history_bodies(length: int, count: int) -> tuple[bytes, list[bytes]]:
    """The import body (the whole history once) and `count` bodies each adding one more turn."""
    messages = conversation(length)
    warm = orjson.dumps({"model": "gpt-4o", "messages": messages})
    bodies = []
    for turn in range(count):
        messages = [*messages, {"role": "user", "content": text_of(40, 9_000_000 + turn)}]
        bodies.append(orjson.dumps({"model": "gpt-4o", "messages": messages}))
        messages = [
            *messages,
            {"role": "assistant", "content": f"(fake model) I read {len(messages)} messages."},
        ]
    return warm, bodies


def overhead_scenario(
    upstream_url: str, stored: int, length: int, requests: int, thin: bool
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        directory = Path(tmp)
        config = config_file(directory, upstream_url)
        if stored > length:
            prefill(f"sqlite:///{directory}/gateway.db", "bench", stored - length)
        port = free_port()
        args = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
        gateway_url = f"http://127.0.0.1:{port}"
        with process(args, f"{gateway_url}/healthz"):
            warm, bodies = full_history_bodies(length, requests)
            headers = {"X-Conversation-Id": f"bench-{length}"} if thin else None
            auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(headers or {})}
            assert (
                httpx.post(
                    f"{gateway_url}/v1/chat/completions", content=warm, headers=auth, timeout=120
                ).status_code
                == 200
            )
            # The warm-up stored the conversation and queued its indexing (embedding + LanceDB): measure
            # once that is done, as a conversation that has been going on for a while would be.
            wait_idle(gateway_url, timeout=1800)
            if thin:
                bodies = [
                    orjson.dumps(
                        {
                            "model": "gpt-4o",
                            "messages": [{"role": "user", "content": text_of(40, 8_000_000 + i)}],
                        }
                    )
                    for i in range(requests)
                ]
            return measure(gateway_url, upstream_url.removesuffix("/v1") + "/v1", bodies, headers)


class RealisticSummaries(FakeUpstream):
    """Summaries of a realistic size (about 800 tokens) instead of the test fake's short lists, so the
    tokens a summary costs in every prompt, and in every merge call, are counted fairly."""

    def next_reply(self, body: JSONObject) -> Reply:
        if summarisation_answer(body) is not None:
            with self._lock:
                self.summary_calls += 1
            return Reply(text_of(800, 42))
        return super().next_reply(body)


def wait_idle(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = httpx.get(f"{url}/healthz").json()["jobs"] or {}
        if jobs.get("queued", 0) == 0 and jobs.get("running", 0) == 0:
            return
        time.sleep(0.02)
    raise TimeoutError("background jobs did not finish")


def token_scenario(turns: int, budget: int | None, compaction: bool = False) -> dict[str, int]:
    """Seed 002's chat: last-turn and total input tokens sent upstream for the chat itself, and the input
    and output tokens of the gateway's own summarisation calls."""
    fake = RealisticSummaries(record=True)
    system = {"role": "system", "content": text_of(500, 1)}
    answers = [text_of(250, 7_000 + t) for t in range(turns)]
    fake.enqueue(*(Reply(a) for a in answers))
    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as tmp, BackgroundServer(fake.app()) as up:
        context: dict[str, Any] = {"budget_tokens": budget} if budget else {"enabled": False}
        tenant = {"name": "t", "api_keys": [KEY], "upstream": {"base_url": f"{up.url}/v1", "api_key": "k"}}
        # Memory off: its extraction jobs (queued 20 s after each turn) would keep `wait_idle` waiting and
        # take the scripted answers meant for the chat and its summaries.
        tenant |= {"context": context, "compaction": {"enabled": compaction}, "memory": {"enabled": False}}
        config = parse_config(
            {
                "storage": {"database_url": f"sqlite:///{tmp}/g.db", "data_dir": tmp},
                "jobs": {"poll_seconds": 0.05},
                "tenants": [tenant],
            },
            {},
        )
        with BackgroundServer(create_app(config)) as gateway, httpx.Client(timeout=60) as client:
            messages: list[dict[str, Any]] = [system]
            sent: list[int] = []
            for turn in range(turns):
                messages.append({"role": "user", "content": text_of(50, 3_000 + turn)})
                response = client.post(
                    f"{gateway.url}/v1/chat/completions",
                    json={"model": "gpt-4o", "messages": messages},
                    headers={"Authorization": f"Bearer {KEY}"},
                )
                assert response.status_code == 200, response.text
                sent.append(TOKENIZER.count_messages(fake.chat_requests()[-1].body["messages"]))  # type: ignore[arg-type]
                messages.append(
                    {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}
                )
                if compaction:
                    wait_idle(gateway.url)  # the user reads the answer; background work catches up
        calls = [r.body for r in fake.received if summarisation_answer(r.body) is not None]
    llm_in = sum(TOKENIZER.count_messages(c["messages"]) for c in calls)  # type: ignore[arg-type]
    llm_out = len(calls) * TOKENIZER.count(text_of(800, 42))
    return {
        "last": sent[-1],
        "total": sum(sent),
        "llm_in": llm_in,
        "llm_out": llm_out,
        "llm_calls": len(calls),
    }


def sliding_window(turns: int, budget: int) -> dict[str, int]:
    """System prompt + the newest whole exchanges that fit the budget, computed without the gateway."""
    system = {"role": "system", "content": text_of(500, 1)}
    exchanges: list[list[dict[str, Any]]] = []
    sent = []
    for turn in range(turns):
        question = {"role": "user", "content": text_of(50, 3_000 + turn)}
        room = budget - TOKENIZER.count_messages([system, question])
        window: list[dict[str, Any]] = []
        for exchange in reversed(exchanges):
            cost = sum(TOKENIZER.count_message(m) for m in exchange)
            if cost > room:
                break
            room -= cost
            window[:0] = exchange
        sent.append(TOKENIZER.count_messages([system, *window, question]))
        exchanges.append([question, {"role": "assistant", "content": text_of(250, 7_000 + turn)}])
    return {"last": sent[-1], "total": sum(sent)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--part",
        type=int,
        choices=(1, 2, 3, 4),
        help="run only part 1 (overhead), 2 (tokens), 3 (length: 1,000 vs 10,000 messages) or 4 "
        "(32 connections over many 1,000-message conversations)",
    )
    parser.add_argument("--conversations", type=int, default=64, help="part 4: conversations (64)")
    parser.add_argument("--connections", type=int, default=32, help="part 4: connections (32)")
    parser.add_argument("--lengths", default="1000,10000", help="part 3: conversation lengths")
    parser.add_argument(
        "--api-embedder",
        action="store_true",
        help="part 3: embeddings from the fake provider's /v1/embeddings (3 dimensions) instead of the "
        "local model, for the import and the requests; the goal then counts that call as the query "
        "embedding",
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="parts 3 and 4: a checkout of an older commit, measured last in the same run (part 4: its "
        "full pipeline with one worker)",
    )
    parser.add_argument(
        "--rows",
        help="part 4: only these rows, e.g. 'pass-through:1,full:1' (default: pass-through and full "
        "pipeline with 1 and 2 workers)",
    )
    parser.add_argument(
        "--data-cache",
        type=Path,
        help="part 3: keep each imported conversation's data here and copy it on later runs (the 10,000-"
        "message import takes 15-25 minutes); e.g. benchmarks/results/data",
    )
    args = parser.parse_args()
    requests = 60 if args.quick else 300
    results: dict[str, Any] = {"overhead": [], "tokens": [], "length": [], "throughput": []}
    if args.part == 3:
        length_part(args, 40 if args.quick else 150, results)
    if args.part == 4:
        throughput_part(args, results)
    if args.part in (None, 1):
        overhead_part(args, requests, results)
    if args.part in (None, 2):
        tokens_part(args, results)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    name = "pipeline.json" if args.part is None else f"pipeline-part{args.part}.json"
    (out / name).write_text(json.dumps(results, indent=2))
    print(f"\nwritten: {out / name}  (cpu count {os.cpu_count()})")


def imported(
    length: int, upstream_url: str, directory: Path, cache: Path | None, api_embedder: bool = False
) -> float | None:
    """Fill `directory` with one conversation of `length` messages imported in one request, indexed,
    summarised and with its memory learnt, by a gateway with every feature on; with `cache`, copied from
    there when an earlier run saved it (the bodies are deterministic), else saved there afterwards.
    Returns the import's seconds (None: from the cache). `api_embedder`: the provider's embeddings (the
    fake's, 3 dimensions) instead of the local model, whose 10,000-message import takes about an hour."""
    name = f"length-{length}-api-v1" if api_embedder else f"length-{length}-v2"
    saved = cache / name if cache is not None else None
    if saved is not None and (saved / "gateway.db").exists():
        shutil.copytree(saved, directory, dirs_exist_ok=True)
        return None
    warm, _ = full_history_bodies(length, 0)
    directory.mkdir(parents=True, exist_ok=True)
    config = config_file(directory, upstream_url, everything=True, api_embedder=api_embedder)
    port = free_port()
    args = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
    gateway_url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    with process(args, f"{gateway_url}/healthz"):
        auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        response = httpx.post(f"{gateway_url}/v1/chat/completions", content=warm, headers=auth, timeout=600)
        assert response.status_code == 200, response.text
        wait_idle(gateway_url, timeout=7200)  # embedding + LanceDB, summaries, memory extraction
    seconds = time.perf_counter() - started
    if saved is not None:
        shutil.copytree(directory, saved, ignore=shutil.ignore_patterns("config.yaml"))
    return seconds


def length_scenario(
    upstream_url: str,
    length: int,
    requests: int,
    before: Path | None,
    cache: Path | None,
    api_embedder: bool = False,
) -> dict[str, dict[str, float]]:
    """One conversation of `length` messages resent in full with one new turn per request. The pure
    pass-through gateway first (nothing stored), then on one data directory (the imported conversation)
    gateways with every feature on (store, identify, window, summaries, retrieval, memory): with the
    body memo, without it, and (with `before`) the gateway of that older checkout; the conversation goes
    on from one to the next. Each gateway's first request is not measured (it fills the process's
    caches); after each measured request the benchmark waits until the jobs it queued have run."""
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-length-") as tmp:
        directory = Path(tmp) / "data"
        seconds = imported(length, upstream_url, directory, cache, api_embedder)
        print(
            f"  {length:,} messages "
            + (f"imported and processed in {seconds:.0f} s" if seconds else f"copied from {cache}"),
            flush=True,
        )
        runs: list[tuple[str, dict[str, Any], Path]] = [
            ("pass-through", {"pass_through": True}, ROOT),
            ("memo on", {"everything": True}, ROOT),
            ("memo off", {"everything": True, "body_memo": False}, ROOT),
        ]
        if before is not None:
            runs.append(("before", {"everything": True}, before))
        _, bodies = full_history_bodies(length, len(runs) * requests)
        for number, (label, options, cwd) in enumerate(runs):
            chunk = bodies[number * requests : (number + 1) * requests]
            where = Path(tmp) / "pass" if options.get("pass_through") else directory
            where.mkdir(exist_ok=True)
            config = config_file(where, upstream_url, api_embedder=api_embedder, **options)
            if cwd != ROOT:  # an older checkout may not know the newer settings
                config = config_file(where, upstream_url, api_embedder=api_embedder)
            port = free_port()
            args = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
            gateway_url = f"http://127.0.0.1:{port}"
            with process(args, f"{gateway_url}/healthz", cwd):
                auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
                response = httpx.post(
                    f"{gateway_url}/v1/chat/completions", content=chunk[0], headers=auth, timeout=600
                )
                assert response.status_code == 200, response.text
                wait_idle(gateway_url, timeout=3600)
                figures[label] = measure(gateway_url, upstream_url, chunk[1:], settle=True)
                health = httpx.get(f"{gateway_url}/healthz").json()
                figures[label]["body_messages_reused"] = health["counters"].get("body_messages_reused", 0)
    return figures


def api_embedding_ms(upstream_url: str, count: int = 60) -> float:
    """p50 of one question embedded by the fake provider's /v1/embeddings, over a kept connection."""
    times = []
    with httpx.Client(timeout=60) as client:
        for i in range(count):
            started = time.perf_counter()
            body = {"model": "fake-embed", "input": [text_of(40, 7_000_000 + i)], "dimensions": 3}
            client.post(f"{upstream_url}/embeddings", json=body).raise_for_status()
            times.append((time.perf_counter() - started) * 1000)
    return percentile(times[5:], 0.5)


def query_embedding_ms(count: int = 60) -> float:
    """p50 of embedding one question with the local embedder the gateway loads (one thread, as its
    default `embeddings.threads`), in this process while nothing else runs."""
    from gateway.adapters.onnx_embedder import OnnxEmbedder

    embedder = OnnxEmbedder.load(threads=1)

    async def run() -> list[float]:
        times = []
        for i in range(count):
            started = time.perf_counter()
            await embedder.embed_query(text_of(40, 7_000_000 + i))
            times.append((time.perf_counter() - started) * 1000)
        await embedder.aclose()
        return times[5:]

    return percentile(asyncio.run(run()), 0.5)


def fake_upstream(upstream_url: str) -> contextlib.AbstractContextManager[None]:
    """The fast fake provider (`fake_upstream_server.py`) as a process of its own at `upstream_url`."""
    port = upstream_url.rsplit(":", 1)[1].split("/", 1)[0]
    fake = [sys.executable, str(ROOT / "benchmarks" / "fake_upstream_server.py"), "--port", port]
    return process(fake, f"{upstream_url}/models")


def length_part(args: argparse.Namespace, requests: int, results: dict[str, Any]) -> None:
    upstream_url = f"http://127.0.0.1:{free_port()}/v1"
    cache = args.data_cache
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    print("Part 3: a conversation resent in full, 1 connection, jobs settled between turns, ms")
    header = (
        f"{'length':>8s} {'gateway':13s} {'gateway p50':>11s} {'gateway p99':>11s} {'added p50':>9s} "
        f"{'added p99':>9s} {'retrieval p50':>13s} {'reused':>8s}"
    )
    rows = results["length"]
    with fake_upstream(upstream_url):
        for length in (int(n) for n in args.lengths.split(",")):
            figures = length_scenario(upstream_url, length, requests, args.before, cache, args.api_embedder)
            print(header)
            for label, f in figures.items():
                rows.append({"length": length, "gateway": label, **f})
                print(
                    f"{length:8,d} {label:13s} {f['gateway_p50']:11.2f} {f['gateway_p99']:11.2f} "
                    f"{f['added_p50']:9.2f} {f['added_p99']:9.2f} {f.get('retrieval_p50', 0.0):13.2f}"
                    f" {f['body_messages_reused']:8,d}",
                    flush=True,
                )
    if args.api_embedder:
        with fake_upstream(upstream_url):
            embedding = api_embedding_ms(upstream_url)
        print(f"query embedding (the fake provider's /v1/embeddings, one request) p50: {embedding:.2f} ms")
    else:
        embedding = query_embedding_ms()
        print(f"query embedding (local MiniLM, 1 thread) p50: {embedding:.2f} ms")
    results["query_embedding_p50_ms"] = embedding
    results["embedder"] = "provider (fake, 3 dimensions)" if args.api_embedder else "local MiniLM"
    added = {(r["length"], r["gateway"]): r["added_p50"] for r in rows}
    lengths = sorted({r["length"] for r in rows})
    goals: dict[str, Any] = {}
    for length in lengths:
        if (length, "memo on") in added and (length, "pass-through") in added:
            allowed = 3 * max(added[(length, "pass-through")], 0.0) + embedding
            mine = added[(length, "memo on")]
            goals[f"{length}: added p50 <= 3x pass-through + query embedding"] = {
                "measured": round(mine, 2),
                "allowed": round(allowed, 2),
                "verdict": "met" if mine <= allowed else "MISSED",
            }
    if len(lengths) >= 2 and (lengths[0], "memo on") in added and (lengths[-1], "memo on") in added:
        ratio = added[(lengths[-1], "memo on")] / added[(lengths[0], "memo on")]
        goals[f"added p50 at {lengths[-1]:,} / at {lengths[0]:,} <= 1.2"] = {
            "measured": round(ratio, 2),
            "verdict": "met" if ratio <= 1.2 else "MISSED",
        }
    results["length_goals"] = goals
    for name, goal in goals.items():
        print(f"goal {name}: {goal}")


THROUGHPUT_LENGTH = 1_000


def throughput_data(
    upstream_url: str, conversations: int, directory: Path, cache: Path | None
) -> float | None:
    """`conversations` conversations of 1,000 messages each (distinct texts), imported one request each
    (four at a time) by a gateway with every feature on and the provider's embeddings, and processed
    (indexed, summarised, memory learnt); from `cache` when an earlier run saved them."""
    saved = cache / f"throughput-{conversations}x{THROUGHPUT_LENGTH}-v2" if cache is not None else None
    if saved is not None and (saved / "gateway.db").exists():
        shutil.copytree(saved, directory, dirs_exist_ok=True)
        return None
    directory.mkdir(parents=True, exist_ok=True)
    config = config_file(directory, upstream_url, everything=True, api_embedder=True)
    port = free_port()
    args = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
    gateway_url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}

    async def post_all() -> None:
        async with httpx.AsyncClient(timeout=600) as client:
            gate = asyncio.Semaphore(4)

            async def one(number: int) -> None:
                body = orjson.dumps(
                    {"model": "gpt-4o", "messages": conversation(THROUGHPUT_LENGTH, number + 1)}
                )
                async with gate:
                    response = await client.post(
                        f"{gateway_url}/v1/chat/completions", content=body, headers=auth
                    )
                assert response.status_code == 200, response.text

            await asyncio.gather(*(one(n) for n in range(conversations)))

    with process(args, f"{gateway_url}/healthz"):
        asyncio.run(post_all())
        wait_idle(gateway_url, timeout=7200)
    seconds = time.perf_counter() - started
    if saved is not None:
        shutil.copytree(directory, saved, ignore=shutil.ignore_patterns("config.yaml"))
    return seconds


async def closed_loop(
    port: int, conversations: int, connections: int, seconds: float, pids: list[int], warmup: float = 10.0
) -> dict[str, Any]:
    """`connections` clients, each going on with its own conversations (resent in full with one new
    question, the answer appended as a chat app does), back to back: `warmup` seconds not counted (every
    process meets each conversation once), then `seconds` measured."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from loadgen import build_request, connect

    histories = [conversation(THROUGHPUT_LENGTH, n + 1) for n in range(conversations)]
    latencies: list[float] = []
    errors = 0
    done = 0
    measured_from = time.perf_counter() + warmup
    deadline = measured_from + seconds
    cpu_before = 0.0

    async def client(number: int) -> None:
        nonlocal errors, done
        conn = await connect("127.0.0.1", port, keep_body=True)
        turn = 0
        try:
            while time.perf_counter() < deadline:
                history = histories[(number + turn * connections) % conversations]
                turn += 1
                question = {"role": "user", "content": text_of(40, 5_000_000 + number * 100_000 + turn)}
                body = orjson.dumps({"model": "gpt-4o", "messages": [*history, question]})
                request = build_request(
                    "127.0.0.1", port, "/v1/chat/completions", body, {"Authorization": f"Bearer {KEY}"}
                )
                started = time.perf_counter()
                finished = await conn.send(request)
                counted = started >= measured_from
                if conn.status != 200:
                    errors += counted
                    continue
                if counted:
                    latencies.append(finished - started)
                    done += 1
                answer = orjson.loads(b"".join(conn.body))["choices"][0]["message"]
                history.extend([question, {"role": "assistant", "content": answer["content"]}])
        finally:
            conn.close()

    metrics_before: dict[tuple[str, str], tuple[float, float]] = {}

    async def meter() -> None:
        nonlocal cpu_before, metrics_before
        await asyncio.sleep(max(measured_from - time.perf_counter(), 0.0))
        cpu_before = sum(map(_cpu_seconds, pids))
        metrics_before = await asyncio.to_thread(_time_sums, port)

    await asyncio.gather(meter(), *(client(n) for n in range(connections)))
    wall = time.perf_counter() - measured_from
    latencies.sort()
    cpu = sum(map(_cpu_seconds, pids)) - cpu_before
    breakdown = _time_breakdown(metrics_before, _time_sums(port))
    return {
        "requests": done,
        "errors": errors,
        "rps": done / wall,
        "p50_ms": percentile(latencies, 0.5) * 1000 if latencies else None,
        "p99_ms": percentile(latencies, 0.99) * 1000 if latencies else None,
        "gateway_cpu_us_per_request": round(cpu / max(done, 1) * 1e6),
        "wall_s": wall,
        "mean_ms_in_window": breakdown,
    }


def _time_sums(port: int) -> dict[tuple[str, str], tuple[float, float]]:
    """(histogram, its label) -> (sum of seconds, count) from the gateway's /metrics: its own time per
    request, the upstream's, each context section's and each job kind's."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    sums: dict[tuple[str, str], list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")) and family.type == "histogram":
                label = next(iter(sample.labels.values()), "")
                held = sums.setdefault((family.name, label), [0.0, 0.0])
                held[0 if sample.name.endswith("_sum") else 1] += sample.value
    return {key: (total, count) for key, (total, count) in sums.items()}


def _time_breakdown(
    before: dict[tuple[str, str], tuple[float, float]], after: dict[tuple[str, str], tuple[float, float]]
) -> dict[str, Any]:
    """Mean ms and count of each histogram over the measured window (after minus before)."""
    out: dict[str, Any] = {}
    for key, (total, count) in sorted(after.items()):
        total_before, count_before = before.get(key, (0.0, 0.0))
        runs = count - count_before
        if runs:
            name = key[0].removeprefix("gateway_").removesuffix("_seconds")
            out[f"{name}:{key[1]}"] = {
                "mean_ms": round((total - total_before) / runs * 1000, 2),
                "n": int(runs),
            }
    return out


def _children(pid: int) -> list[int]:
    """The worker processes of `serve --workers N` (none for one)."""
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(p) for p in found]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput_part(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """32 connections over many 1,000-message conversations, jobs running: the pure pass-through and
    the full pipeline (every feature on, the provider's embeddings) on the same bodies, one after the
    other in one run."""
    upstream_url = f"http://127.0.0.1:{free_port()}/v1"
    cache = args.data_cache
    conversations, connections = args.conversations, args.connections
    seconds = 20.0 if args.quick else 60.0
    if conversations < connections:
        raise SystemExit("part 4 needs at least as many conversations as connections (one client each)")
    print(
        f"Part 4: {connections} connections over {conversations} conversations of {THROUGHPUT_LENGTH:,} messages"
    )
    rows = results["throughput"]
    with fake_upstream(upstream_url), tempfile.TemporaryDirectory(prefix="bench-tput-") as tmp:
        directory = Path(tmp) / "data"
        took = throughput_data(upstream_url, conversations, directory, cache)
        print(
            "  data " + (f"imported and processed in {took:.0f} s" if took else f"copied from {cache}"),
            flush=True,
        )
        full = {"everything": True, "api_embedder": True}
        runs: list[tuple[str, str, dict[str, Any], int, Path]] = [
            ("pass-through:1", "pass-through", {"pass_through": True}, 1, ROOT),
            ("pass-through:2", "pass-through", {"pass_through": True}, 2, ROOT),
            ("full:1", "full pipeline", full, 1, ROOT),
            ("full:2", "full pipeline", full, 2, ROOT),
        ]
        if args.rows:
            wanted = set(args.rows.split(","))
            runs = [run for run in runs if run[0] in wanted]
        if args.before is not None:  # the older checkout's full pipeline, one worker, last
            runs.append(("before", "full pipeline, before", full, 1, args.before.resolve()))
        for _, label, options, workers, checkout in runs:
            where = Path(tmp) / f"run-{len(rows)}"
            if not options.get("pass_through"):  # each run on a copy of the imported data as it was
                shutil.copytree(directory, where)
            where.mkdir(exist_ok=True)
            config = config_file(where, upstream_url, **options)
            port = free_port()
            argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
            argv += ["--workers", str(workers)]
            proc = subprocess.Popen(argv, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                gateway_url = f"http://127.0.0.1:{port}"
                wait_ready(f"{gateway_url}/healthz")
                pids = [proc.pid, *_children(proc.pid)]
                figures = asyncio.run(closed_loop(port, conversations, connections, seconds, pids))
                figures["workers"] = workers
                jobs = httpx.get(f"{gateway_url}/healthz").json()["jobs"] or {}
                figures["jobs_queued_at_end"] = jobs.get("queued", 0)
                drained = time.perf_counter()
                wait_idle(gateway_url, timeout=1800)
                figures["jobs_drain_s"] = round(time.perf_counter() - drained, 1)
                # What the machine keeps up with: the minute's requests over the minute and the drain.
                figures["sustained_rps"] = figures["requests"] / (figures["wall_s"] + figures["jobs_drain_s"])
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=30)
            rows.append(
                {"gateway": label, "connections": connections, "conversations": conversations, **figures}
            )
            print(
                f"  {label:22s} x{workers} {figures['rps']:7.1f} req/s  p50 {figures['p50_ms']:.1f} ms  p99 {figures['p99_ms']:.1f} ms"
                f"  errors {figures['errors']}  gateway CPU {figures['gateway_cpu_us_per_request']:,} us/req"
                f"  jobs queued at the end {figures['jobs_queued_at_end']}, drained in {figures['jobs_drain_s']} s"
                f"  sustained {figures['sustained_rps']:.1f} req/s",
                flush=True,
            )
            print(
                "    mean ms in the window: "
                + ", ".join(
                    f"{k} {v['mean_ms']} (n {v['n']})" for k, v in figures["mean_ms_in_window"].items()
                ),
                flush=True,
            )
    measured = [r for r in rows if r["gateway"] == "full pipeline"]
    if not measured:
        return
    full = max(measured, key=lambda r: float(r["rps"]))
    results["throughput_goal"] = {
        "measured_rps": round(full["rps"], 1),
        "goal_rps": 300,
        "verdict": "met" if full["rps"] >= 300 else "MISSED",
    }
    print(f"goal >= 300 req/s at 32 connections, full pipeline: {results['throughput_goal']}")


def overhead_part(args: argparse.Namespace, requests: int, results: dict[str, Any]) -> None:
    upstream_url = f"http://127.0.0.1:{free_port()}/v1"
    print(
        "Part 1: pipeline overhead, 1 connection, ms (gateway = x-gateway-overhead-ms; added = side by side)"
    )
    print(f"{'scenario':46s} {'gateway p50':>11s} {'gateway p99':>11s} {'added p50':>9s} {'added p99':>9s}")
    with fake_upstream(upstream_url):
        scenarios = [
            ("store holds 1k, conversation 1,000", 1_000, 1_000, False),
            ("store holds 10k, conversation 1,000", 10_000, 1_000, False),
            ("store holds 100k, conversation 1,000", 100_000, 1_000, False),
            ("full history, conversation 100", 100, 100, False),
            ("full history, conversation 5,000", 5_000, 5_000, False),
            ("thin mode, conversation 100", 100, 100, True),
            ("thin mode, conversation 1,000", 1_000, 1_000, True),
            ("thin mode, conversation 5,000", 5_000, 5_000, True),
        ]
        if args.quick:
            scenarios = [s for s in scenarios if s[1] <= 10_000]
        for name, stored, length, thin in scenarios:
            figures = overhead_scenario(upstream_url, stored, length, requests, thin)
            results["overhead"].append(
                {"scenario": name, "stored": stored, "length": length, "thin": thin, **figures}
            )
            print(
                f"{name:46s} {figures['gateway_p50']:11.2f} {figures['gateway_p99']:11.2f} "
                f"{figures['added_p50']:9.2f} {figures['added_p99']:9.2f}",
                flush=True,
            )
    growth = {
        r["stored"]: r["gateway_p50"] for r in results["overhead"] if r["length"] == 1_000 and not r["thin"]
    }
    if 1_000 in growth and max(growth) > 1_000:
        ratio = growth[max(growth)] / growth[1_000]
        results["growth_ratio"] = ratio
        print(f"growth: p50 at {max(growth):,} stored / p50 at 1,000 stored = {ratio:.2f}x (goal <= 1.5x)")


def tokens_part(args: argparse.Namespace, results: dict[str, Any]) -> None:
    print("\nPart 2: input tokens (seed 002: system 500, question 50, answer 250; summaries ~800 tokens)")
    print(
        f"{'turns':>5s} {'strategy':34s} {'last turn':>9s} {'chat total':>10s} {'LLM in+out':>10s} {'saved':>7s}"
    )
    for turns in (40, 300) if not args.quick else (40,):
        full = token_scenario(turns, None)
        rows: list[tuple[str, dict[str, int]]] = [("full replay", full)]
        for budget in (4_000, 8_000, 16_000):
            rows.append((f"sliding window {budget:,}", sliding_window(turns, budget)))
            rows.append((f"gateway window only {budget:,}", token_scenario(turns, budget)))
            rows.append((f"gateway + compaction {budget:,}", token_scenario(turns, budget, compaction=True)))
        for name, figures in rows:
            background = figures.get("llm_in", 0) + figures.get("llm_out", 0)
            saved = 1 - (figures["total"] + background) / full["total"]
            results["tokens"].append({"turns": turns, "strategy": name, **figures, "saved": saved})
            print(
                f"{turns:5d} {name:34s} {figures['last']:9,d} {figures['total']:10,d} {background:10,d} {saved:6.1%}",
                flush=True,
            )


if __name__ == "__main__":
    main()
