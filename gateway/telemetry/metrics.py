"""Prometheus metrics of one app: a registry of its own (no process-global state), filled as requests and
jobs finish; the process counters and the job queue are read at each scrape of `GET /metrics`.

Every metric is listed in docs/operations.md ("Metrics"); tests/test_metrics.py fails when one is not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from gateway.metrics import Counters
from gateway.ports import JSON

CONTENT_TYPE = CONTENT_TYPE_LATEST

# The gateway's own time is sub-millisecond to tens of milliseconds; upstream calls last up to minutes.
_OVERHEAD_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_UPSTREAM_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_SECTION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_JOB_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1200.0)

_EVENTS = {
    "fail_open": "Pipeline steps that failed, the request then forwarded as the client sent it.",
    "upstream_errors": "Upstream calls that failed (unreachable, timed out, broken mid-answer).",
    "client_disconnects": "Clients that left before their answer was complete.",
    "complete_errors": "After-answer steps (persist, jobs) that failed.",
}


# Bytes held, by (cache, owner), read at scrape time (telemetry/cache_sizes.py).
CacheReader = Callable[[], Mapping[tuple[str, str], int]]


class _Snapshot(Collector):
    """The process counters (upstream input tokens among them) and the last queue counts, read at
    scrape time."""

    def __init__(self, counters: Counters, caches: CacheReader | None) -> None:
        self._counters = counters
        self._caches = caches
        self.queue: Mapping[str, int] = {}
        self.oldest: Mapping[str, float] = {}

    def collect(self) -> Iterator[Metric]:
        values = self._counters.snapshot()
        for name, text in _EVENTS.items():
            family = CounterMetricFamily(f"gateway_{name}", text)
            family.add_metric([], values.get(name, 0))
            yield family
        tokens = CounterMetricFamily(
            "gateway_upstream_input_tokens",
            "Input tokens the upstream reported, by kind: read from its prompt cache (cached), written to "
            "it (cache_write), neither (uncached).",
            labels=["tenant", "kind"],
        )
        for (tenant, kind), count in sorted(self._counters.input_tokens.items()):
            tokens.add_metric([tenant, kind], count)
        yield tokens
        jobs = GaugeMetricFamily("gateway_jobs", "Background jobs by status (all kinds).", labels=["status"])
        for status, count in sorted(self.queue.items()):
            jobs.add_metric([status], count)
        yield jobs
        oldest = GaugeMetricFamily(
            "gateway_jobs_oldest_queued_seconds",
            "Seconds the oldest queued job that is due has waited, by kind (kinds with none are absent).",
            labels=["kind"],
        )
        for kind, seconds in sorted(self.oldest.items()):
            oldest.add_metric([kind], seconds)
        yield oldest
        caches = GaugeMetricFamily(
            "gateway_cache_bytes",
            "Bytes each cache holds now, by cache and owner (a tenant, or process for what tenants share).",
            labels=["cache", "owner"],
        )
        for (cache, owner), size in sorted((self._caches or dict)().items()):
            caches.add_metric([cache, owner], size)
        yield caches


class Metrics:
    def __init__(self, counters: Counters, caches: CacheReader | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._snapshot = _Snapshot(counters, caches)
        r.register(self._snapshot)
        self.requests = Counter(
            "gateway_requests", "Chat requests by front door, tenant, HTTP status and streaming.",
            ["route", "tenant", "status", "stream"], registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "gateway_context_tokens", "Prompt tokens of the history as the client sent it (original) and "
            "as the gateway forwarded it (sent).", ["tenant", "kind"], registry=r,
        )  # fmt: skip
        self.overhead = Histogram(
            "gateway_overhead_seconds", "Time spent in the gateway per request, the upstream call excluded "
            "(for streams: until the response headers).", ["route"], buckets=_OVERHEAD_BUCKETS, registry=r,
        )  # fmt: skip
        self.upstream = Histogram(
            "gateway_upstream_seconds", "Upstream time per request: to its response headers for streams, to "
            "the whole answer otherwise.", ["route"], buckets=_UPSTREAM_BUCKETS, registry=r,
        )  # fmt: skip
        self.sections = Histogram(
            "gateway_context_section_seconds", "Time each context section (summary, retrieval, memory) took "
            "to propose its part of a request's context.", ["section"], buckets=_SECTION_BUCKETS, registry=r,
        )  # fmt: skip
        self.job_runs = Counter(
            "gateway_job_runs", "Background job runs by kind and outcome (done, retried, failed, lost, released, postponed; absorbed: folded into a running job of its kind).",
            ["kind", "outcome"], registry=r,
        )  # fmt: skip
        self.job_seconds = Histogram(
            "gateway_job_seconds", "Background job run time by kind.", ["kind"], buckets=_JOB_BUCKETS,
            registry=r,
        )  # fmt: skip

    def overhead_mean_ms(self) -> float | None:
        """The gateway's own time per request, mean over this process's requests (all routes, all
        tenants); None before the first."""
        total = count = 0.0
        for metric in self.overhead.collect():
            for sample in metric.samples:
                if sample.name.endswith("_sum"):
                    total += sample.value
                elif sample.name.endswith("_count"):
                    count += sample.value
        return total / count * 1000 if count else None

    def request(
        self,
        route: str,
        tenant: str,
        status: int,
        stream: bool,
        timings: tuple[float, float] | None,
        report: Mapping[str, JSON] | None,
    ) -> None:
        """One finished exchange; `timings` (gateway overhead, upstream) in seconds, None for a request
        the gateway refused before calling the upstream."""
        self.requests.labels(route, tenant, str(status), "true" if stream else "false").inc()
        if timings is not None:
            self.overhead.labels(route).observe(max(timings[0], 0.0))
            self.upstream.labels(route).observe(max(timings[1], 0.0))
        if report is None:
            return
        for kind in ("original", "sent"):
            value = report.get(f"{kind}_tokens")
            if isinstance(value, int):
                self.tokens.labels(tenant, kind).inc(value)
        sections = report.get("sections")
        for name, detail in sections.items() if isinstance(sections, dict) else ():
            ms = detail.get("ms") if isinstance(detail, dict) else None
            if isinstance(ms, int | float) and not isinstance(ms, bool):
                self.sections.labels(name).observe(ms / 1000)

    def job(self, kind: str, outcome: str, seconds: float | None) -> None:
        self.job_runs.labels(kind, outcome).inc()
        if seconds is not None:
            self.job_seconds.labels(kind).observe(seconds)

    def exposition(self, queue: Mapping[str, int], oldest: Mapping[str, float] | None = None) -> bytes:
        """The text format, with the queue counts and the backlog's age by kind just read."""
        self._snapshot.queue = dict(queue)
        self._snapshot.oldest = dict(oldest or {})
        return generate_latest(self.registry)
