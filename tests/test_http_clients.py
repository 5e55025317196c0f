"""The upstream HTTP client (aiohttp) on a real gateway: upstream errors pass through; broken, slow and
abandoned streams end the way OpenAI clients expect."""

from __future__ import annotations

import gzip
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai import OpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.fakes.openai_upstream import Reply, ToolCall
from gateway.fakes.server import BackgroundServer
from tests.conftest import Gateway, Upstream, free_port, tenant

VOLATILE = {"id", "created"}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of Portugal?"}]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
WEATHER = ToolCall(name="get_weather", arguments='{"city": "Lisbon", "unit": "celsius"}', id="call_abc")


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def gw(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway([tenant("acme", upstream.base_url)])


def direct(upstream: Upstream) -> OpenAI:
    return OpenAI(base_url=upstream.base_url, api_key="sk-upstream", max_retries=0)


def dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(exclude=VOLATILE)  # type: ignore[no-any-return]


def test_the_client_is_aiohttp_and_a_removed_one_is_named(upstream: Upstream) -> None:
    from gateway.adapters.aiohttp_upstream import AiohttpUpstream
    from gateway.config import parse_config
    from gateway.errors import ConfigError
    from gateway.wiring import build_upstream

    config = parse_config({"tenants": [tenant("acme", upstream.base_url, http_client="aiohttp")]}, {})
    assert isinstance(build_upstream(config.tenants[0]), AiohttpUpstream)
    with pytest.raises(ConfigError, match=r"tenants\[0\]\.upstream: http_client 'httpx' was removed"):
        parse_config({"tenants": [tenant("acme", upstream.base_url, http_client="httpx")]}, {})


def test_non_stream_and_stream_equal_direct(gw: Gateway, upstream: Upstream) -> None:
    text = "Lisbon is the capital and largest city of Portugal."
    upstream.fake.enqueue(*(Reply(text) for _ in range(4)))
    want = direct(upstream).chat.completions.create(model="m", messages=MESSAGES)
    got = gw.client().chat.completions.create(model="m", messages=MESSAGES)
    assert dump(got) == dump(want)
    want_chunks = [
        dump(c) for c in direct(upstream).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ]
    got_chunks = [
        dump(c) for c in gw.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ]
    assert got_chunks == want_chunks
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in got_chunks if c["choices"]) == text
    assert upstream.fake.last().headers["authorization"] == "Bearer sk-upstream"


def test_tool_call_stream_equals_direct(gw: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(*(Reply(None, tool_calls=(WEATHER,)) for _ in range(2)))
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True}
    want = [dump(c) for c in direct(upstream).chat.completions.create(**kwargs)]
    got = [dump(c) for c in gw.client().chat.completions.create(**kwargs)]
    assert got == want
    arguments = "".join(
        d["function"]["arguments"]
        for c in got
        if c["choices"]
        for d in c["choices"][0]["delta"]["tool_calls"] or []
    )
    assert arguments == WEATHER.arguments


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_error_status_passes_through(gw: Gateway, upstream: Upstream, stream: bool) -> None:
    error = {
        "message": "Rate limit reached",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    upstream.fake.enqueue(Reply(status=429, error=error))
    with pytest.raises(openai.RateLimitError) as caught:
        gw.client().chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
    assert caught.value.status_code == 429
    assert caught.value.body == error


def test_unreachable_upstream_is_502(make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", f"http://127.0.0.1:{free_port()}/v1")])
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as caught:
            gateway.client().chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
        assert caught.value.status_code == 502
        assert caught.value.body["code"] == "upstream_unreachable"  # type: ignore[index]
        assert caught.value.body["type"] == "upstream_error"  # type: ignore[index]
    response = httpx.get(f"{gateway.base_url}/models", headers={"Authorization": "Bearer sk-gw-acme"})
    assert response.status_code == 502


def test_slow_upstream_is_504(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, timeout_seconds=0.3)])
    upstream.fake.enqueue(Reply("late", delay=1.5))
    with pytest.raises(openai.APIStatusError) as caught:
        gateway.client().chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == 504
    assert caught.value.body["code"] == "upstream_timeout"  # type: ignore[index]


def test_stalled_stream_times_out_in_band(upstream: Upstream, make_gateway: Callable[..., Gateway]) -> None:
    gateway = make_gateway([tenant("acme", upstream.base_url, timeout_seconds=0.3)])
    upstream.fake.enqueue(Reply("first then a long silence", chunk_delay=1.0))
    stream = gateway.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError) as caught:
        for _ in stream:
            pass
    assert "timed out" in caught.value.message


def test_stream_broken_mid_way_ends_with_in_band_error(gw: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply("one two three four five six seven", break_after_chunks=3))
    stream = gw.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "one two"
    assert "upstream" in caught.value.message


def test_client_disconnect_cancels_the_upstream(gw: Gateway, upstream: Upstream) -> None:
    upstream.fake.enqueue(Reply(" ".join(f"w{i}" for i in range(200)), chunk_delay=0.05))
    stream = gw.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    for number, _ in enumerate(stream):
        if number == 2:
            break
    stream.close()
    assert wait_for(lambda: upstream.fake.disconnects == 1), "upstream never saw the cancellation"
    assert httpx.get(f"{gw.server.url}/healthz").json()["counters"]["client_disconnects"] == 1
    # The connection was dropped, not poisoned: the next request still works.
    upstream.fake.enqueue(Reply("after"))
    assert (
        gw.client().chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
        == "after"
    )


def test_embeddings_and_models_pass_through(gw: Gateway, upstream: Upstream) -> None:
    want = direct(upstream).embeddings.create(model="emb", input=["a", "bcd"])
    got = gw.client().embeddings.create(model="emb", input=["a", "bcd"])
    assert got.model_dump() == want.model_dump()
    assert orjson.loads(upstream.fake.last().raw)["input"] == ["a", "bcd"]
    assert gw.client().models.list().model_dump() == direct(upstream).models.list().model_dump()
    received = upstream.fake.last()
    assert received.path == "/v1/models"
    assert received.headers["authorization"] == "Bearer sk-upstream"
    assert "content-type" not in received.headers  # a GET without body gets no invented headers


BLOB = gzip.compress(b'{"object": "list", "data": []}' * 50, mtime=0)


async def _gzipped(request: Request) -> Response:
    return Response(BLOB, media_type="application/json", headers={"content-encoding": "gzip"})


def test_encoded_body_passes_through_byte_exact(make_gateway: Callable[..., Gateway]) -> None:
    app = Starlette(routes=[Route("/v1/files", _gzipped)])
    with BackgroundServer(app) as server:
        gateway = make_gateway([tenant("acme", f"{server.url}/v1")])
        headers = {"Authorization": "Bearer sk-gw-acme", "Accept-Encoding": "gzip"}
        with httpx.stream("GET", f"{gateway.base_url}/files", headers=headers) as response:
            raw = b"".join(response.iter_raw())
        assert response.status_code == 200
        assert response.headers["content-encoding"] == "gzip"
        assert raw == BLOB


class _OneRequestPerConnection(socketserver.ThreadingTCPServer):
    """Answers the first request on each connection with keep-alive, then closes the connection when a
    second request arrives without answering it: the race where a server times out an idle connection
    just as the client reuses it."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, reset: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.reset = reset
        self.connections = 0
        self.requests = 0
        self.lock = threading.Lock()


class _Handler(socketserver.BaseRequestHandler):
    server: _OneRequestPerConnection

    def handle(self) -> None:
        sock: socket.socket = self.request
        with self.server.lock:
            self.server.connections += 1
        stream = sock.makefile("rb")
        for number in range(2):
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = stream.readline()
                if not line:
                    return
                head += line
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            stream.read(length)
            with self.server.lock:
                self.server.requests += 1
            if number == 1:
                if self.server.reset:  # RST instead of FIN: the client sees ECONNRESET
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    stream.close()
                    sock.close()
                return
            body = orjson.dumps(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )
            sock.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )


@pytest.fixture(params=[False, True], ids=["fin", "rst"])
def closing_server(request: pytest.FixtureRequest) -> Iterator[_OneRequestPerConnection]:
    server = _OneRequestPerConnection(reset=bool(request.param))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_aiohttp_retries_a_request_on_a_stale_pooled_connection(
    closing_server: _OneRequestPerConnection, make_gateway: Callable[..., Gateway]
) -> None:
    port = closing_server.server_address[1]
    gateway = make_gateway([tenant("acme", f"http://127.0.0.1:{port}/v1", store_conversations=False)])
    client = gateway.client()
    for _ in range(3):
        assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "ok"
    # Requests 2 and 3 each hit a connection the server closed, and were sent again on a new one.
    assert closing_server.connections == 3
    assert closing_server.requests == 5


def test_aiohttp_does_not_retry_on_a_fresh_connection(make_gateway: Callable[..., Gateway]) -> None:
    """A connection that dies before answering its first request may have run it upstream: 502, no retry."""
    seen: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            seen.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        port = listener.getsockname()[1]
        gateway = make_gateway([tenant("acme", f"http://127.0.0.1:{port}/v1")])
        with pytest.raises(openai.APIStatusError) as caught:
            gateway.client().chat.completions.create(model="m", messages=MESSAGES)
        assert caught.value.status_code == 502
        assert len(seen) == 1
    finally:
        listener.close()
