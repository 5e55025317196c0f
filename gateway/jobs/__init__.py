"""Background work off the request path: the worker pool and, per job kind, the handlers it runs."""

from gateway.jobs.worker import JobHandler, Postponed, WorkerPool, WorkerStats, retry_delay

__all__ = ["JobHandler", "Postponed", "WorkerPool", "WorkerStats", "retry_delay"]
