"""Request traces to an OTLP/HTTP collector, through OpenTelemetry's SDK (`pip install
"context-gateway[otel]"`). Only imported when `server.otlp_traces_endpoint` is set.

Each chat request is a server span (`POST /v1/chat/completions`, HTTP attributes, the gateway's tenant,
request and conversation ids); its children are the pipeline's steps (identify, ingest, build and one
span per context section, persist) and the provider call, a client span named `chat {model}` with the
GenAI semantic conventions' attributes (operation, provider, request and response model, token usage,
finish reasons). Attributes carry ids, counts and timings, never message text or keys.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.ports import Span, Trace, TraceValue


def _clean(attributes: Mapping[str, TraceValue] | None) -> dict[str, str | int | float | bool]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}


class _OtelSpan:
    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def set(self, attributes: Mapping[str, TraceValue]) -> None:
        self.span.set_attributes(_clean(attributes))

    def fail(self, message: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, message))

    def end(self) -> None:
        self.span.end()


class _OtelTrace:
    def __init__(self, tracer: trace.Tracer, root: trace.Span) -> None:
        self._tracer = tracer
        self._root = _OtelSpan(root)
        self._context = trace.set_span_in_context(root)

    @property
    def root(self) -> Span:
        return self._root

    def start(
        self, name: str, attributes: Mapping[str, TraceValue] | None = None, *, client: bool = False
    ) -> Span:
        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        span = self._tracer.start_span(name, context=self._context, kind=kind, attributes=_clean(attributes))
        return _OtelSpan(span)


class OtelTracer:
    recording = True
    """A tracer provider of the app's own (not the process-global one), batching spans to `endpoint`."""

    def __init__(self, endpoint: str, service_name: str, flush_seconds: float) -> None:
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        exporter = OTLPSpanExporter(endpoint=endpoint)
        self._provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=flush_seconds * 1000)
        )
        self._tracer = self._provider.get_tracer("context-gateway")

    def trace(self, name: str, attributes: Mapping[str, TraceValue]) -> Trace:
        root = self._tracer.start_span(name, kind=SpanKind.SERVER, attributes=_clean(attributes))
        return _OtelTrace(self._tracer, root)

    def shutdown(self) -> None:
        self._provider.shutdown()  # exports what the batch still holds
