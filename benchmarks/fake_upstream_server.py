"""Run the fake OpenAI-compatible upstream in its own process, for the benchmarks.

    python benchmarks/fake_upstream_server.py --port 9101

Same server stack as the gateway (uvicorn + uvloop + httptools), `record=False` so it keeps nothing in
memory. Streams are paced per request: a chat body carrying `"metadata": {"bench_chunk_delay": "0.1"}`
gets that many seconds between its SSE frames (the gateway forwards `metadata` untouched); without it,
the default deterministic answer comes back at once.
"""

from __future__ import annotations

import argparse
import resource

import uvicorn

from gateway.fakes.openai_upstream import FakeUpstream, Reply, default_answer
from gateway.ports import JSONObject


class PacedFakeUpstream(FakeUpstream):
    def next_reply(self, body: JSONObject) -> Reply:
        reply = super().next_reply(body)
        metadata = body.get("metadata")
        delay = metadata.get("bench_chunk_delay") if isinstance(metadata, dict) else None
        if isinstance(delay, str | int | float):
            return Reply(content=default_answer(body), chunk_delay=float(delay))
        return reply


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    raise_fd_limit()
    fake = PacedFakeUpstream(record=False)
    uvicorn.run(
        fake.app(),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        backlog=4096,
    )


if __name__ == "__main__":
    main()
