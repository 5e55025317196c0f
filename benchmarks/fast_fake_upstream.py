"""A fast fake OpenAI-compatible upstream for the overhead benchmark: raw asyncio (uvloop) + httptools.

    python benchmarks/fast_fake_upstream.py --port 9101

The starlette fake (`benchmarks/fake_upstream_server.py`) tops out near 4,700 req/s on the benchmark
machine, under what the cheapest proxies can relay; this one answers the same bytes for far less CPU:

  * `POST /v1/chat/completions`: the answer `FakeUpstream` would give (`next_reply`: the default echo of
    the last user message, or the deterministic answers to the gateway's own summarisation and memory
    calls), as the same chat-completion JSON, or the same SSE frames (`Transfer-Encoding: chunked`, one
    HTTP chunk per frame, the usage chunk when `stream_options.include_usage` asks for it). The response
    is built once per distinct request body and cached; only its id (`chatcmpl-fake<n>`, fixed width) is
    filled in per response.
  * a chat body carrying `"metadata": {"bench_chunk_delay": "<seconds>"}` (the paced streams of the
    benchmark's phase 4) gets `default_answer(body)` split in words as `FakeUpstream` does, with that
    many seconds between frames; never cached (every such stream is unique).
  * `POST /v1/embeddings` (as `FakeUpstream` answers it) and `GET /v1/models`; anything else is a 404.

Keep-alive HTTP/1.1 with Content-Length or chunked request bodies; pipelined requests are answered in
order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import time
from collections import deque
from dataclasses import dataclass

import httptools
import orjson
import uvloop

from gateway.fakes.openai_upstream import (
    FakeUpstream,
    Reply,
    _finish,
    _stream_frames,
    _usage,
    default_answer,
)
from gateway.ports import JSONObject

ID_PREFIX = b"chatcmpl-fake"
ID_WIDTH = 12
SENTINEL = "chatcmpl-fake" + "~" * ID_WIDTH  # where the id goes in a prepared response (same width)
CACHE_LIMIT = 4096
MODEL = "fake-model"

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 429: b"Too Many Requests"}


def status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Error"))


def fixed(status: int, body: bytes, media: bytes = b"application/json") -> bytes:
    head = status_line(status) + b"content-type: " + media + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
    return head + body


STREAM_HEAD = status_line(200) + (
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def chunk(frame: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(frame), frame)


MODELS = fixed(
    200,
    orjson.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "fake"}]}
    ),
)
NOT_FOUND = fixed(404, orjson.dumps({"detail": "Not Found"}))


@dataclass(frozen=True, slots=True)
class Prepared:
    """A whole response, split where the completion id goes."""

    parts: tuple[bytes, ...]

    def render(self, number: int) -> bytes:
        if len(self.parts) == 1:
            return self.parts[0]
        return (ID_PREFIX + b"%0*d" % (ID_WIDTH, number)).join(self.parts)


class Answers:
    """What FakeUpstream would answer, as bytes: cached per distinct chat body."""

    def __init__(self) -> None:
        self.fake = FakeUpstream(record=False)
        self.cache: dict[bytes, Prepared] = {}
        self.ids = 0

    def next_id(self) -> int:
        self.ids += 1
        return self.ids

    def chat(self, raw: bytes) -> Prepared | tuple[list[bytes], float]:
        """A prepared response, or (SSE frames, delay) for a paced stream."""
        prepared = self.cache.get(raw)
        if prepared is not None:
            return prepared
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            return Prepared((fixed(400, orjson.dumps({"error": {"message": "invalid JSON"}})),))
        if not isinstance(body, dict):
            body = {}
        metadata = body.get("metadata")
        delay = metadata.get("bench_chunk_delay") if isinstance(metadata, dict) else None
        if isinstance(delay, str | int | float) and body.get("stream") is True:
            reply = Reply(content=default_answer(body), chunk_delay=float(delay))
            return self._frames(body, reply, f"chatcmpl-fake{self.next_id()}"), reply.chunk_delay
        prepared = self._prepare(body, self.fake.next_reply(body))
        if len(self.cache) >= CACHE_LIMIT:
            self.cache.clear()
        self.cache[raw] = prepared
        return prepared

    @staticmethod
    def _frames(body: JSONObject, reply: Reply, cid: str) -> list[bytes]:
        model = body.get("model") if isinstance(body.get("model"), str) else MODEL
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        usage = _usage(body, reply) if with_usage else None
        return _stream_frames(cid, int(time.time()), str(model), reply, usage)

    def _prepare(self, body: JSONObject, reply: Reply) -> Prepared:
        if reply.status != 200:
            error = reply.error or {
                "message": "fake upstream error",
                "type": "server_error",
                "param": None,
                "code": None,
            }
            return Prepared((fixed(reply.status, orjson.dumps({"error": error})),))
        if body.get("stream") is True:
            frames = self._frames(body, reply, SENTINEL)
            whole = STREAM_HEAD + b"".join(chunk(f) for f in frames) + LAST_CHUNK
        else:
            model = body.get("model") if isinstance(body.get("model"), str) else MODEL
            message: JSONObject = {"role": "assistant", "content": reply.content, "refusal": None}
            if reply.tool_calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in reply.tool_calls
                ]
            out = {
                "id": SENTINEL,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(reply)}
                ],
                "usage": _usage(body, reply),
                "system_fingerprint": "fp_fake",
            }
            whole = fixed(200, orjson.dumps(out))
        return Prepared(tuple(whole.split(SENTINEL.encode())))

    @staticmethod
    def embeddings(raw: bytes) -> bytes:
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            body = {}
        body = body if isinstance(body, dict) else {}
        inputs = body.get("input")
        texts = inputs if isinstance(inputs, list) else [inputs]
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(str(t)) % 7), 0.5, -0.25]}
            for i, t in enumerate(texts)
        ]
        out = {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
        return fixed(200, orjson.dumps(out))


class Server(asyncio.Protocol):
    """One client connection."""

    __slots__ = (
        "answers",
        "body",
        "busy",
        "closed",
        "keep_alive",
        "pacer",
        "parser",
        "queue",
        "transport",
        "url",
    )

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.pacer: asyncio.Future[None] | None = None
        self.busy = False  # a paced stream is being written: later answers wait, in order
        self.queue: deque[tuple[bytes, bytes, bytes, bool]] = deque()
        self.keep_alive = True
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(fixed(400, b'{"error":{"message":"bad request"}}'))
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        request = (self.parser.get_method(), self.url, b"".join(self.body), self.parser.should_keep_alive())
        if self.busy:
            self.queue.append(request)
        else:
            self.answer(*request)

    # answers
    def answer(self, method: bytes, url: bytes, raw: bytes, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        path = url.split(b"?", 1)[0]
        if method == b"POST" and path == b"/v1/chat/completions":
            answer = self.answers.chat(raw)
            if isinstance(answer, Prepared):
                transport.write(answer.render(self.answers.next_id()))
            else:
                self.busy = True
                self.pacer = asyncio.ensure_future(self.paced(*answer, keep_alive))
                return
        elif method == b"GET" and path == b"/v1/models":
            transport.write(MODELS)
        elif method == b"POST" and path == b"/v1/embeddings":
            transport.write(Answers.embeddings(raw))
        else:
            transport.write(NOT_FOUND)
        if not keep_alive:
            transport.close()

    async def paced(self, frames: list[bytes], delay: float, keep_alive: bool) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(STREAM_HEAD + chunk(frames[0]))
        for frame in frames[1:]:
            await asyncio.sleep(delay)
            if self.closed:
                return
            transport.write(chunk(frame))
        transport.write(LAST_CHUNK)
        self.busy = False
        if not keep_alive:
            transport.close()
            return
        while self.queue and not self.busy:
            self.answer(*self.queue.popleft())


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def serve(host: str, port: int) -> None:
    answers = Answers()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Server(answers), host, port, backlog=4096, reuse_address=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    raise_fd_limit()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
