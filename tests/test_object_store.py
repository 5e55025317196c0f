"""The LanceDB index on an S3-compatible object store: moto's S3 emulator in server mode on loopback.

The gateway's object-store settings are `storage.index_storage_options` (LanceDB's storage options), or,
when that is empty, the environment as LanceDB reads it: AWS_ENDPOINT_URL, AWS_ALLOW_HTTP, AWS_REGION and
the keys. Lance commits a version on S3 with a conditional PUT (`If-None-Match: *` on the
manifest), which moto honours (412 when the version exists), so concurrent writers conflict and retry
there as they do on S3 itself."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("moto")

# boto3 comes with moto (a dependency of it).
import boto3

from gateway.adapters.lance_index import LanceIndex
from gateway.records import SearchQuery
from gateway.wiring import index_table
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, api, free_port, recorded, tenant, wait_for_jobs

# The model and LanceDB are what these tests are about.
pytestmark = pytest.mark.real

REGION = "us-east-1"
KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 emulator as a server process on a free loopback port."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"moto_server exited: {log.read_text()}"
            try:
                httpx.get(f"{url}/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, f"moto_server never listened: {log.read_text()}"
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def s3_client(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, **KEYS)


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"gw-{uuid.uuid4().hex[:12]}"
    s3_client(s3_endpoint).create_bucket(Bucket=name)
    return name


def storage_options(endpoint: str) -> dict[str, str]:
    """The same settings as LanceDB storage options (what LanceIndex.open takes)."""
    return {"aws_endpoint": endpoint, "allow_http": "true", "aws_region": REGION, **KEYS}


def injected(upstream: Upstream) -> str:
    messages = upstream.fake.last_chat().body["messages"]
    return "\n".join(
        str(m["content"])
        for m in messages
        if m["role"] == "system" and "<gateway_context>" in str(m["content"])
    )


TOPICS = [
    "the weather in Lisbon was mild and sunny all week",
    "we compared three sourdough recipes and their hydration",
    "the football match went to extra time before a late goal",
    "a long walk along the river with the dog after lunch",
    "notes on a novel about a lighthouse keeper and his brother",
    "planning a birthday dinner with pasta and a lemon tart",
]


def test_a_gateway_indexes_and_retrieves_from_an_s3_bucket(
    s3_endpoint: str,
    bucket: str,
    upstream: Upstream,
    make_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    gateway = make_gateway(
        [
            tenant(
                "acme",
                upstream.base_url,
                api_keys=[GATEWAY_KEY],
                context={"budget_tokens": 400},
                compaction={"enabled": False},
            )
        ],
        storage={
            "database_url": f"sqlite:///{tmp_path}/gateway.db",
            "data_dir": str(tmp_path / "data"),
            "index_uri": f"s3://{bucket}/lancedb",
            # As a deployment writes it (LanceDB's AWS_* environment variables work too).
            "index_storage_options": storage_options(s3_endpoint),
        },
    )
    client = gateway.client()
    thin = {"X-Conversation-Id": "ops-1"}
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "user", "content": "The staging proxy listens on port 8443, see staging_proxy.conf."}
        ],
        extra_headers=thin,
    )
    for i in range(12):
        topic = TOPICS[i % len(TOPICS)]
        client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": f"Let us talk about this: {topic}."}],
            extra_headers=thin,
        )
    wait_for_jobs(gateway)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Which port does the staging proxy listen on?"}],
        extra_headers=thin,
    )
    request_id = raw.headers["x-gateway-request-id"]
    recorded(gateway, request_id)
    assert "port 8443, see staging_proxy.conf" in injected(upstream)
    retrieval = api(gateway, f"/requests/{request_id}")["report"]["sections"]["retrieval"]
    assert retrieval["message_ids"], retrieval

    # The table lives in the bucket: data files, and a manifest per version.
    s3 = s3_client(s3_endpoint)
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="lancedb/")
        for o in page.get("Contents", [])
    ]
    table = index_table(gateway.config.tenants[0].retrieval.embedder.local_model)
    assert any(k.startswith(f"lancedb/{table}.lance/data/") for k in keys), keys
    assert any(k.startswith(f"lancedb/{table}.lance/_versions/") for k in keys), keys

    # Deleting the conversation deletes its rows in the bucket.
    conversation = api(gateway, "/conversations")["data"][0]["id"]

    async def rows() -> int:
        index = LanceIndex.open(
            f"s3://{bucket}/lancedb", table, 384, storage_options=storage_options(s3_endpoint)
        )
        query = SearchQuery(
            tenant="acme", text="8443 staging proxy", vector=None, limit=50, conversation_id=conversation
        )
        found = await index.search(query)
        await index.aclose()
        return len(found.keyword)

    assert asyncio.run(rows()) > 0
    gone = httpx.delete(
        f"{gateway.server.url}/api/conversations/{conversation}",
        headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
    )
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert asyncio.run(rows()) == 0


# One writer process: `batches` adds of 20 rows of its own, and a compaction every 4 writes, so merges
# and rewrites of the two processes race for the same versions: a loser's conditional PUT of the
# manifest gets 412 and lance rebases and retries it (through a logging proxy: 2 to 7 such 412s a run).
# The ids are disjoint on purpose: two writers inserting the SAME new ids duplicate them once the table
# has been optimized, on local disk as on S3 (lance 13 / LanceDB 0.40: a merge on a scalar-indexed key
# records no inserted-key filter, so the declared primary key detects no conflict; lance-format/lance
# PR 9238). That is the engine's, not the object store's, and is left to the index's own tests.
# Prints the errors it met as JSON.
WRITER = """
import asyncio, json, sys, time
from datetime import UTC, datetime
from gateway.adapters.lance_index import LanceIndex
from gateway.records import IndexRow

uri, table, writer, batches, start, options = sys.argv[1:7]
writer, batches, start, options = int(writer), int(batches), float(start), json.loads(options)

def rows(batch):
    out = []
    for i in range(20):
        n = batch * 20 + i
        key = f"w{writer}-{n}"
        vector = [float(writer), 1.0, float(i), 0.0]
        out.append(IndexRow(key, "acme", "u", "c-1", key, "m", n, datetime.now(UTC), f"row {key}", vector))
    return out

async def main():
    index = LanceIndex.open(uri, table, 4, storage_options=options, optimize_every_writes=4)
    while time.time() < start:
        await asyncio.sleep(0.01)
    errors = []
    for batch in range(batches):
        try:
            await index.add(rows(batch))
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    await index.aclose()
    return errors

print(json.dumps(asyncio.run(main())))
"""


def test_two_writer_processes_share_one_s3_table(s3_endpoint: str, bucket: str) -> None:
    uri, table, batches = f"s3://{bucket}/lancedb", "messages_shared", 8
    options = storage_options(s3_endpoint)
    asyncio.run(LanceIndex.open(uri, table, 4, storage_options=options).aclose())  # the table, created once
    start = time.time() + 3  # both past their imports and open before either writes
    root = str(Path(__file__).resolve().parents[1])
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, uri, table, str(w), str(batches), str(start), json.dumps(options)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=root,
            env={**os.environ, "PYTHONPATH": root},
        )
        for w in (1, 2)
    ]
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err.decode()
        assert json.loads(out.decode().strip().splitlines()[-1]) == [], err.decode()

    async def ids() -> list[str]:
        index = LanceIndex.open(uri, table, 4, storage_options=options)
        found = [key for key, _ in await index.rows_of("acme", "c-1")]
        await index.aclose()
        return found

    found = asyncio.run(ids())
    expected = {f"w{w}-{n}" for w in (1, 2) for n in range(batches * 20)}
    assert len(found) == len(set(found)), "duplicated rows"
    assert set(found) == expected
