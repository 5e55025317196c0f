"""Per-tenant request rate limits: a token bucket per tenant, in each process.

`requests_per_minute` tokens flow in evenly; a request takes one; `burst` is the bucket's size (requests
that may arrive at once after a quiet spell). The bucket lives in the process: behind N replicas a
tenant gets up to N times the figure (give each replica rate / N).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class RateLimiter:
    def __init__(
        self, per_minute: int, burst: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = per_minute / 60.0
        self._size = float(burst if burst is not None else max(1, per_minute))
        self._clock = clock
        self._tokens = self._size
        self._at = clock()

    def take(self) -> float | None:
        """Takes a token: None when the request may go, or the seconds until one is there (Retry-After)."""
        now = self._clock()
        self._tokens = min(self._size, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (1.0 - self._tokens) / self._rate


def retry_after_header(seconds: float) -> bytes:
    """Whole seconds, rounded up (HTTP's Retry-After has no fractions), at least 1."""
    return str(max(1, math.ceil(seconds))).encode()
