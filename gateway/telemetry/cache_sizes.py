"""What the process's caches hold, read at each scrape: every part that keeps a cache (`HoldsCaches`) is
registered once with its owner (a tenant, or "process" for what tenants share)."""

from __future__ import annotations

import logging
from collections import Counter

from gateway.ports import HoldsCaches

log = logging.getLogger(__name__)

PROCESS = "process"  # the owner of what every tenant shares (the node cache, the tokenizers, an index)


class CacheSizes:
    def __init__(self) -> None:
        self._parts: list[tuple[str, HoldsCaches]] = []
        self._seen: set[int] = set()  # one part shared by several tenants (an index) is counted once

    def add(self, owner: str, part: object) -> None:
        """Count `part`'s caches under `owner`, if it keeps any; a part already added is left as it is."""
        if isinstance(part, HoldsCaches) and id(part) not in self._seen:
            self._seen.add(id(part))
            self._parts.append((owner, part))

    def read(self) -> dict[tuple[str, str], int]:
        """Bytes held, by (cache, owner); a part that cannot say now (its engine failing) is left out."""
        held: Counter[tuple[str, str]] = Counter()
        for owner, part in self._parts:
            try:
                sizes = part.cache_bytes()
            except Exception:  # a gauge must never fail the scrape: any engine's error, logged
                log.warning("cannot read the cache sizes of %r", part, exc_info=True)
                continue
            for cache, size in sizes.items():
                held[(cache, owner)] += size
        return dict(held)
