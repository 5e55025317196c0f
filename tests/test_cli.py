"""The read-only CLI commands against a store the real gateway filled (official SDK, real SQLite), and
the docs listing every command (docs/dashboard-and-cli.md)."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lancedb
import pytest
from click.testing import CliRunner

from gateway.cli import main
from gateway.fakes.openai_upstream import Reply
from gateway.fakes.server import BackgroundServer
from gateway.wiring import index_table
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, recorded, tenant, wait_for_jobs
from tests.test_cache_usage import ANSWER, provider_app

# The model and LanceDB are what these tests are about.
pytestmark = pytest.mark.real

COMMANDS_DOC = Path(__file__).resolve().parent.parent / "docs" / "dashboard-and-cli.md"


def test_conversations_show_context_and_jobs_read_what_the_gateway_stored(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], context={"budget_tokens": 300})]
    gateway = make_gateway(tenants)
    upstream.fake.enqueue(Reply("A1"), Reply("A2"), Reply("B2"))
    client = gateway.client(default_headers={"X-User-Id": "u-cli"})
    history: list[Any] = [{"role": "user", "content": "First question about the parcel PX-11."}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    history += [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    edited = [*history[:2], {"role": "user", "content": "Q2 edited"}]
    system = {"role": "system", "content": "You answer in one sentence, citing parcel codes."}
    long_history = [system, *edited] + [
        m
        for n in range(12)
        for m in (
            {"role": "assistant", "content": f"note {n}"},
            {"role": "user", "content": f"more {n} " * 20},
        )
    ]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=long_history)
    recorded(gateway, raw.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)
    conversation_id = raw.headers["x-conversation-id"]

    config = tmp_path / "cli.yaml"
    config.write_text(json.dumps({"storage": gateway.config.storage.model_dump(), "tenants": tenants}))
    runner = CliRunner()

    listed = runner.invoke(main, ["conversations", "--config", str(config), "--tenant", "acme"])
    assert listed.exit_code == 0, listed.output
    assert conversation_id in listed.output and "u-cli" in listed.output
    base = ["conversations", "--config", str(config), "--tenant", "acme"]
    found = runner.invoke(main, [*base, "--text", "px-11", "--since", "2000-01-01"])
    assert found.exit_code == 0 and conversation_id in found.output, found.output
    for option, value in [("--text", "no such words"), ("--until", "2000-01-01")]:
        none = runner.invoke(main, [*base, option, value])
        assert none.exit_code == 0 and conversation_id not in none.output, none.output
    bad = runner.invoke(main, [*base, "--since", "last week"])
    assert bad.exit_code == 2 and "'since' must be a date" in bad.output, bad.output

    shown = runner.invoke(main, ["show", "--config", str(config), "--tenant", "acme", conversation_id])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    branches = [line for line in lines if "Q2" in line]
    assert len(branches) == 2  # the edit is a sibling of the original question
    assert branches[0].lstrip().startswith("├─") and "PX-11" in shown.output

    explained = runner.invoke(
        main, ["context", "--config", str(config), "--tenant", "acme", raw.headers["x-gateway-request-id"]]
    )
    assert explained.exit_code == 0, explained.output
    assert re.search(r"tokens: \d+ in the history, \d+ sent \(budget 300, \d+% saved\)", explained.output)
    assert "window" in explained.output and "retrieval" in explained.output
    received = upstream.fake.last_chat().body["messages"]
    assert f"sent, in order ({len(received)} messages):" in explained.output
    whole = runner.invoke(
        main,
        [
            "context",
            "--config",
            str(config),
            "--tenant",
            "acme",
            "--messages",
            raw.headers["x-gateway-request-id"],
        ],
    )
    numbered = [line for line in whole.output.splitlines() if re.match(r"  \d+\. ", line)]
    assert [line.split()[1] for line in numbered] == [m["role"] for m in received]
    assert received[-1]["content"].strip() in whole.output  # each message whole
    assert received[0] == system and system["content"] in whole.output  # outside the stored chain, kept

    queued = runner.invoke(main, ["jobs", "--config", str(config), "--tenant", "acme"])
    assert queued.exit_code == 0 and re.search(r"done [1-9]", queued.output), queued.output

    missing = runner.invoke(main, ["show", "--config", str(config), "--tenant", "acme", "nope"])
    assert missing.exit_code == 1 and "no conversation 'nope'" in missing.output
    other = runner.invoke(main, ["conversations", "--config", str(config), "--tenant", "globex"])
    assert conversation_id not in other.output  # another tenant sees none of it


def test_context_shows_what_the_cache_did_per_request_and_the_conversations_cost_against_replay(
    make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """A provider that reports 1,536 of every request's 2,000 input tokens cached, priced as gpt-5."""
    price = {"model": "gpt-5", "input": 1.25, "cached_input": 0.125, "output": 10.0}
    with BackgroundServer(provider_app()) as provider:
        tenants = [
            {
                **tenant("acme", f"{provider.url}/v1", api_keys=[GATEWAY_KEY], retrieval={"enabled": False}),
                "pricing": {"models": [price]},
            }
        ]
        gateway = make_gateway(tenants)
        client = gateway.client()
        history: list[Any] = [{"role": "user", "content": "First question about the parcel PX-11."}]
        first = client.chat.completions.with_raw_response.create(model="gpt-5", messages=history)
        history += [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And the second?"}]
        second = client.chat.completions.with_raw_response.create(model="gpt-5", messages=history)
        ids = [r.headers["x-gateway-request-id"] for r in (first, second)]
        for request_id in ids:
            recorded(gateway, request_id)
    conversation_id = second.headers["x-conversation-id"]
    assert first.headers["x-conversation-id"] == conversation_id
    config = tmp_path / "cli.yaml"
    config.write_text(json.dumps({"storage": gateway.config.storage.model_dump(), "tenants": tenants}))
    base = ["context", "--config", str(config), "--tenant", "acme"]
    runner = CliRunner()

    one = runner.invoke(main, [*base, ids[1]])
    assert one.exit_code == 0, one.output
    assert "cache: 1536 cached, 0 written, 464 uncached of 2000 input tokens (77% cached)" in one.output

    whole = runner.invoke(main, [*base, conversation_id])
    assert whole.exit_code == 0, whole.output
    lines = whole.output.splitlines()
    assert lines[0].startswith(f"conversation {conversation_id}  2 requests  costs in USD")
    rows = [line for line in lines if line.startswith(tuple(ids))]
    assert [row.split()[0] for row in rows] == ids  # oldest first
    assert all(row.split()[6:10] == ["2000", "1536", "0", "464"] for row in rows)
    assert "cache hits: 77% of 4000 input tokens read from the provider's cache" in whole.output
    # Full replay: the first request's history is what the second's starts with, priced as cached.
    originals = [api(gateway, f"/requests/{i}")["original_tokens"] for i in ids]
    share = originals[0] / originals[1]
    cost = 2 * (464 * 1.25 + 1536 * 0.125 + 50 * 10) / 1e6
    replay = (2000 * 1.25 + 500 + 2000 * (1 - share) * 1.25 + 2000 * share * 0.125 + 500) / 1e6
    assert (
        f"effective cost ${cost:,.4f} against ${replay:,.4f} for full replay ({100 * cost / replay:.0f}% of it)"
        in whole.output
    )

    missing = runner.invoke(main, [*base, "nope"])
    assert missing.exit_code == 1 and "no request 'nope'" in missing.output, missing.output
    assert "no conversation with requests either" in missing.output


def test_every_command_is_documented() -> None:
    text = COMMANDS_DOC.read_text()
    documented = set(re.findall(r"context-gateway ([a-z]+)", text))
    assert set(main.commands) - documented == set(), "undocumented CLI commands"


CHATGPT_EXPORT = [
    {
        "title": "Trip planning",
        "current_node": "n4",
        "mapping": {
            "root": {"id": "root", "message": None, "parent": None, "children": ["n1"]},
            "n1": {
                "id": "n1",
                "message": {
                    "author": {"role": "user"},
                    "content": {"content_type": "text", "parts": ["Plan a week in Porto."]},
                },
                "parent": "root",
                "children": ["n2", "n3"],
            },
            "n2": {
                "id": "n2",
                "message": {
                    "author": {"role": "assistant"},
                    "content": {"content_type": "text", "parts": ["A draft nobody kept."]},
                },
                "parent": "n1",
                "children": [],
            },
            "n3": {
                "id": "n3",
                "message": {
                    "author": {"role": "assistant"},
                    "content": {"content_type": "text", "parts": ["Day 1: Ribeira."]},
                },
                "parent": "n1",
                "children": ["n4"],
            },
            "n4": {
                "id": "n4",
                "message": {
                    "author": {"role": "user"},
                    "content": {"content_type": "text", "parts": ["Add a food tour."]},
                },
                "parent": "n3",
                "children": [],
            },
        },
    }
]


def test_import_loads_exports_through_the_ingest_path_once(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    tenants = [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])]
    gateway = make_gateway(tenants)
    config = tmp_path / "cli.yaml"
    config.write_text(json.dumps({"storage": gateway.config.storage.model_dump(), "tenants": tenants}))
    ours = tmp_path / "ours.json"
    history = [
        {"role": "user", "content": "Our staging database is db-stg-7."},
        {"role": "assistant", "content": "Noted: db-stg-7."},
    ]
    ours.write_text(json.dumps({"conversations": [{"user": "u-imp", "title": "Ops", "messages": history}]}))
    theirs = tmp_path / "conversations.json"
    theirs.write_text(json.dumps(CHATGPT_EXPORT))
    runner = CliRunner()
    base = ["--config", str(config), "--tenant", "acme"]

    first = runner.invoke(main, ["import", *base, str(ours)])
    assert first.exit_code == 0, first.output
    assert "imported 1 conversations (2 messages)" in first.output
    chatgpt = runner.invoke(main, ["import", *base, "--user", "u-gpt", str(theirs)])
    assert chatgpt.exit_code == 0, chatgpt.output
    conversations = {c["user_id"]: c for c in api(gateway, "/conversations")["data"]}
    assert conversations["u-imp"]["message_count"] == 2
    assert (
        conversations["u-gpt"]["message_count"] == 3
    )  # the path to current_node: the dropped draft left out
    again = runner.invoke(main, ["import", *base, str(ours)])
    assert again.exit_code == 0 and conversations["u-imp"]["id"] in again.output
    assert len(api(gateway, "/conversations")["data"]) == 2  # nothing stored twice

    # The app that owned the history continues it through the gateway: recognised, and indexed.
    wait_for_jobs(gateway)
    raw = gateway.client(default_headers={"X-User-Id": "u-imp"}).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[*history, {"role": "user", "content": "Which staging database?"}]
    )
    assert raw.headers["x-conversation-id"] == conversations["u-imp"]["id"]

    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"conversations": [{"messages": [{"role": "robot", "content": "x"}]}]}))
    refused = runner.invoke(main, ["import", *base, str(broken)])
    assert refused.exit_code == 1 and "conversations[0].messages[0]" in refused.output
    assert "nothing was imported" in refused.output
    assert len(api(gateway, "/conversations")["data"]) == 2


def test_reindex_after_a_model_change_embeds_every_branch_in_the_new_models_table(
    upstream: Upstream, make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY])])  # MiniLM
    client = gateway.client()
    upstream.fake.enqueue(Reply("Noted."), Reply("Second answer."), Reply("Edited answer."))
    history: list[Any] = [{"role": "user", "content": "The vault code is QX-5521."}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    history += [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Second question."}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    edited = [*history[:2], {"role": "user", "content": "An edited second question."}]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=edited)
    recorded(gateway, raw.headers["x-gateway-request-id"])
    wait_for_jobs(gateway)
    conversation_id = raw.headers["x-conversation-id"]
    stored = {m["id"] for m in api(gateway, f"/conversations/{conversation_id}/messages")["data"]}
    assert len(stored) == 6  # two branches after the first exchange
    gateway.server.stop()

    # The same store, now with the multilingual model: its index is a table of its own, empty.
    e5 = "multilingual-e5-small-q4"
    tenants = [
        tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], retrieval={"embedder": {"model": e5}})
    ]
    config = tmp_path / "e5.yaml"
    config.write_text(json.dumps({"storage": gateway.config.storage.model_dump(), "tenants": tenants}))

    def embedded(model: str) -> list[str]:
        """Message ids with a vector in the model's table (a row per view)."""
        db = lancedb.connect(gateway.config.storage.index_location)
        if index_table(model) not in db.table_names():
            return []
        rows = db.open_table(index_table(model)).to_arrow().to_pylist()
        return [r["node_id"] for r in rows if r["conversation_id"] == conversation_id and r["vector"]]

    assert set(embedded("all-MiniLM-L6-v2-int8")) == stored and embedded(e5) == []
    runner = CliRunner()
    done = runner.invoke(main, ["reindex", "--config", str(config), "--tenant", "acme"])
    assert done.exit_code == 0, done.output
    assert "1 conversations, 2 branches: 2 embed jobs queued" in done.output
    assert "indexed: every branch's messages are searchable and embedded" in done.output
    views = embedded(e5)
    assert set(views) == stored  # both branches, the shared first exchange included
    again = runner.invoke(main, ["reindex", "--config", str(config), "--tenant", "acme", conversation_id])
    assert again.exit_code == 0 and "2 embed jobs queued" in again.output, again.output
    assert sorted(embedded(e5)) == sorted(views)  # merged on row id: nothing twice

    queued = runner.invoke(main, ["reindex", "--config", str(config), "--tenant", "acme", "--queue-only"])
    assert queued.exit_code == 0 and "a gateway serving this store runs them" in queued.output
    pending = runner.invoke(main, ["jobs", "--config", str(config), "--tenant", "acme"])
    assert re.search(r"queued 2\b", pending.output), pending.output  # left for a serving gateway
    missing = runner.invoke(main, ["reindex", "--config", str(config), "--tenant", "acme", "nope"])
    assert missing.exit_code == 1 and "no conversation 'nope'" in missing.output
    off = tmp_path / "off.yaml"
    tenants[0]["retrieval"] = {"enabled": False}
    off.write_text(json.dumps({"storage": gateway.config.storage.model_dump(), "tenants": tenants}))
    refused = runner.invoke(main, ["reindex", "--config", str(off), "--tenant", "acme"])
    assert refused.exit_code == 1 and "has no retrieval" in refused.output


def test_a_serving_process_keeps_what_startup_built_out_of_the_collectors_scans() -> None:
    """`serve` tunes the interpreter once the app is built (gateway/collector.py): in a fresh interpreter
    that built the app, everything alive then is frozen (no later collection scans it), young
    collections come after tens of thousands of allocations, not 700, and the GIL changes hands every
    millisecond, not every 5."""
    probe = (
        "import gc, sys; from gateway.app import create_app; from gateway.cli import resolve_config; "
        "from gateway.collector import tune_for_serving, YOUNG_THRESHOLD; "
        "app = create_app(resolve_config(None)); before = gc.get_threshold(); "
        "switch = sys.getswitchinterval(); tune_for_serving(); "
        "print(before[0], gc.get_threshold()[0] == YOUNG_THRESHOLD, gc.get_freeze_count(), len(gc.get_objects()), "
        "switch, sys.getswitchinterval())"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    default, tuned, frozen, scanned, switch, tuned_switch = out.split()
    assert default == "700" and tuned == "True"
    assert float(switch) == 0.005 and float(tuned_switch) == 0.001
    assert int(frozen) > 20_000 and int(scanned) < int(frozen) // 10


def test_a_serving_process_gives_large_blocks_pages_of_their_own_at_a_fixed_threshold() -> None:
    """`serve` and `worker` set glibc's allocator first (collector.tune_malloc). glibc's own mmap
    threshold rises to the largest block freed, after which blocks of a few hundred KB were carved out of
    the heap and fragmented it; tuned, a 300 KB block still gets pages of its own (counted by mallinfo2)
    after a 20 MB one was freed, and untuned it does not."""
    probe = (
        "import ctypes, sys\n"
        "from gateway.collector import tune_malloc\n"
        "class Info(ctypes.Structure):\n"
        "    _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd',"
        " 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]\n"
        "libc = ctypes.CDLL('libc.so.6'); libc.mallinfo2.restype = Info\n"
        "tuned = tune_malloc() if sys.argv[1] == 'tuned' else None\n"
        "big = bytes(20_000_000); del big\n"
        "before = libc.mallinfo2().hblks; block = bytes(300_000)\n"
        "print(tuned, libc.mallinfo2().hblks - before)\n"
    )

    def run(mode: str) -> str:
        argv = [sys.executable, "-c", probe, mode]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()

    assert run("tuned") == "True 1"
    assert run("plain") == "None 0"


def test_a_serving_process_gives_arrow_buffers_to_the_system_allocator_unless_told_otherwise() -> None:
    """pyarrow's own pool (mimalloc) kept the memory LanceDB's rows passed through; `tune_malloc` sets
    its default pool to the system's allocator before pyarrow's first allocation, and an operator's own
    ARROW_DEFAULT_MEMORY_POOL stands."""
    probe = (
        "from gateway.collector import tune_malloc\n"
        "tune_malloc()\n"
        "import gateway.app, pyarrow\n"
        "print(pyarrow.default_memory_pool().backend_name)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    argv = [sys.executable, "-c", probe]
    tuned = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    assert tuned.stdout.strip() == "system"
    chosen = {**env, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    kept = subprocess.run(argv, capture_output=True, text=True, check=True, env=chosen)
    assert kept.stdout.strip() == "mimalloc"


def test_a_process_on_jemalloc_is_left_to_it() -> None:
    """The Docker image preloads jemalloc (its own decay returns freed pages, without the fixed
    threshold's cost to the jobs): then glibc's settings and trims are skipped, not set on a heap nothing
    uses."""
    library = next(iter(sorted(glob.glob("/usr/lib/*-linux-gnu/libjemalloc.so.2"))), None)
    assert library, "libjemalloc2 is installed by .ci/run"
    probe = (
        "from gateway.collector import jemalloc_loaded, release_free_heap, tune_malloc\n"
        "print(jemalloc_loaded(), tune_malloc(), release_free_heap())\n"
    )
    argv = [sys.executable, "-c", probe]
    preloaded = subprocess.run(
        argv, capture_output=True, text=True, check=True, env={**os.environ, "LD_PRELOAD": library}
    )
    assert preloaded.stdout.split() == ["True", "False", "False"]
    plain = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert plain.stdout.split() == ["False", "True", "True"]
