"""Request traces without a tracing backend: the no-op tracer every app has unless an OTLP endpoint is
configured (then `adapters/otel_tracer.py`), and `spanned`, the `with` form the pipeline uses."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from gateway.ports import Span, Trace, TraceValue


class _NullSpan:
    def set(self, attributes: Mapping[str, TraceValue]) -> None:
        pass

    def fail(self, message: str) -> None:
        pass

    def end(self) -> None:
        pass


NULL_SPAN = _NullSpan()


class _NullTrace:
    @property
    def root(self) -> Span:
        return NULL_SPAN

    def start(
        self, name: str, attributes: Mapping[str, TraceValue] | None = None, *, client: bool = False
    ) -> Span:
        return NULL_SPAN


NULL_TRACE = _NullTrace()


class NullTracer:
    """Traces nothing (no OTLP endpoint configured): nothing of OpenTelemetry is imported."""

    recording = False

    def trace(self, name: str, attributes: Mapping[str, TraceValue]) -> Trace:
        return NULL_TRACE

    def shutdown(self) -> None:
        pass


@contextmanager
def spanned(trace: Trace, name: str, attributes: Mapping[str, TraceValue] | None = None) -> Iterator[Span]:
    """A child span of the request around a block; an exception marks it failed (and goes on)."""
    span = trace.start(name, attributes)
    try:
        yield span
    except BaseException as exc:
        span.fail(type(exc).__name__)
        raise
    finally:
        span.end()
