"""Request traces through a real OTLP/HTTP exporter to a real receiver on loopback (a Starlette app that
decodes OpenTelemetry's protobuf), driven by the official SDK; and nothing of OpenTelemetry loaded when
no endpoint is configured."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.fakes.openai_upstream import Reply
from gateway.fakes.server import BackgroundServer
from tests.conftest import GATEWAY_KEY, Gateway, Upstream, tenant

SECRET = "The courier's door code is 4417-ZETA."


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it was sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[ProtoSpan] = []
        self.service_names: set[str] = set()
        self._lock = threading.Lock()

    async def traces(self, request: Request) -> Response:
        export = ExportTraceServiceRequest.FromString(await request.body())
        with self._lock:
            for resource in export.resource_spans:
                for attribute in resource.resource.attributes:
                    if attribute.key == "service.name":
                        self.service_names.add(attribute.value.string_value)
                for scope in resource.scope_spans:
                    self.spans.extend(scope.spans)
        return Response(b"", media_type="application/x-protobuf")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/traces", self.traces, methods=["POST"])])


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, BackgroundServer]]:
    collector = Receiver()
    with BackgroundServer(collector.app()) as server:
        yield collector, server


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attributes(span: ProtoSpan) -> dict[str, Any]:
    return {a.key: value(a.value) for a in span.attributes}


def test_each_request_is_a_trace_of_its_steps_and_the_provider_call(
    upstream: Upstream,
    make_gateway: Callable[..., Gateway],
    receiver: tuple[Receiver, BackgroundServer],
) -> None:
    collector, server = receiver
    gateway = make_gateway(
        [tenant("acme", upstream.base_url, api_keys=[GATEWAY_KEY], context={"budget_tokens": 300})],
        tracing={"otlp_endpoint": f"{server.url}/v1/traces", "flush_seconds": 0.2, "service_name": "gw-test"},
    )
    client = gateway.client()
    history: list[Any] = [{"role": "user", "content": SECRET}]
    upstream.fake.enqueue(Reply("Noted."))
    first = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    usage = first.parse().usage
    history += [{"role": "assistant", "content": "Noted."}]
    for n in range(8):  # past the 300-token budget: the next request is rebuilt, section by section
        history += [
            {"role": "user", "content": f"Another long remark number {n} " * 6},
            {"role": "assistant", "content": f"Reply {n}."},
        ]
    history.append({"role": "user", "content": "What was the door code?"})
    upstream.fake.enqueue(Reply("4417-ZETA, streamed."))
    stream = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history, stream=True)
    chunks = list(stream.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "4417-ZETA, streamed."
    gateway.server.stop()  # the lifespan closes the tracer: what is batched is exported

    roots = {attributes(s).get("gateway.request_id"): s for s in collector.spans if not s.parent_span_id}
    assert collector.service_names == {"gw-test"}
    for raw, streamed in ((first, False), (stream, True)):
        root = roots[raw.headers["x-gateway-request-id"]]
        assert root.kind == ProtoSpan.SPAN_KIND_SERVER and root.name == "POST /v1/chat/completions"
        top = attributes(root)
        assert top["http.response.status_code"] == 200 and top["gateway.stream"] is streamed
        assert top["gen_ai.request.model"] == "gpt-4o" and top["gateway.tenant"] == "acme"
        assert top["gen_ai.conversation.id"] == raw.headers["x-conversation-id"]
        children = [s for s in collector.spans if s.parent_span_id == root.span_id]
        assert all(s.trace_id == root.trace_id for s in children)
        names = [s.name for s in children]
        for step in ("ingest", "identify", "build", "persist", "chat gpt-4o"):
            assert step in names, names
        call = next(s for s in children if s.name == "chat gpt-4o")
        assert call.kind == ProtoSpan.SPAN_KIND_CLIENT
        genai = attributes(call)
        assert genai["gen_ai.operation.name"] == "chat" and genai["gen_ai.provider.name"] == "openai"
        assert genai["gen_ai.response.finish_reasons"] == "stop" and genai["server.address"] == "127.0.0.1"
        assert genai["gen_ai.usage.input_tokens"] > 0 and genai["gen_ai.usage.output_tokens"] > 0
        # The provider call lies within the request, and the steps before it end before it starts.
        assert root.start_time_unix_nano <= call.start_time_unix_nano <= call.end_time_unix_nano
        assert call.end_time_unix_nano <= root.end_time_unix_nano
        build = next(s for s in children if s.name == "build")
        assert build.end_time_unix_nano <= call.start_time_unix_nano
    first_root = roots[first.headers["x-gateway-request-id"]]
    first_call = next(
        x
        for x in collector.spans
        if x.parent_span_id == first_root.span_id and x.kind == ProtoSpan.SPAN_KIND_CLIENT
    )
    assert usage is not None and attributes(first_call)["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    rebuilt = [
        s for s in collector.spans if s.trace_id == roots[stream.headers["x-gateway-request-id"]].trace_id
    ]
    sections = {s.name: attributes(s) for s in rebuilt if s.name.startswith("build.")}
    assert {"build.summary", "build.retrieval"} <= set(sections), sections
    assert all("gateway.section.allowance" in a for a in sections.values())
    # Ids, counts and times only: no message text in any span.
    every = [str(v) for s in collector.spans for v in attributes(s).values()]
    # "4417-ZETA", not "4417": four digits turn up in random ids and token counts.
    assert not any("4417-ZETA" in v or "door code" in v for v in every)


def test_without_an_endpoint_nothing_of_opentelemetry_is_loaded(tmp_path: Any) -> None:
    program = f"""
import sys
from gateway.config import parse_config
from gateway.wiring import build_deps
import gateway.app
config = parse_config({{
    "storage": {{"database_url": "sqlite:///{tmp_path}/g.db", "data_dir": "{tmp_path}/data"}},
    "tenants": [{{"name": "t", "api_keys": ["k"], "upstream": {{"base_url": "http://127.0.0.1:9/v1"}}}}],
}}, {{}})
deps = build_deps(config)
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") or m.endswith("otel_tracer"))
print(type(deps.tracer).__name__, loaded)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "NullTracer []"
