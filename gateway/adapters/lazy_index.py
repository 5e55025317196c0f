"""A `VectorIndex` and a `MemoryVectors` opened on first use, not at start-up.

LanceDB and pyarrow take ~90 MB resident once imported (BENCHMARKS.md, issue 29): a gateway that has
indexed nothing yet, or serves pass-through traffic only, holds none of it. The first call (the first
embed job, or a request's retrieval or memory search) imports them and opens the table (creating it when
missing) in a worker thread; calls arriving meanwhile wait for that one open. An open that fails raises
`SearchIndexError` to its caller and is tried again by the next call (a storage outage at the first use
does not disable the index for the life of the process). Nothing of LanceDB is imported by this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

import anyio
import anyio.to_thread

from gateway.errors import SearchIndexError
from gateway.memory.ports import MemoryVectors
from gateway.memory.records import MemoryQuery, MemoryRow, MemorySearchResult
from gateway.ports import HoldsCaches, VectorIndex
from gateway.records import IndexRow, SearchQuery, SearchResult


class _Closable(Protocol):
    async def aclose(self) -> None: ...


T = TypeVar("T", bound=_Closable)


class OpenedOnFirstUse(Generic[T]):
    """`open` (blocking) run once, in a worker thread, by the first caller of `get`; after `aclose`,
    `get` raises `closed()` (what the caller's port raises) and nothing is opened any more."""

    def __init__(self, open: Callable[[], T], closed: Callable[[], Exception]) -> None:
        self._open = open
        self._closed_error = closed
        self._opened: T | None = None
        self._closed = False
        self._lock = anyio.Lock()

    @property
    def opened(self) -> bool:
        return self._opened is not None

    async def get(self) -> T:
        if self._opened is None:
            async with self._lock:
                if self._closed:
                    raise self._closed_error()
                if self._opened is None:
                    self._opened = await anyio.to_thread.run_sync(self._open)
        return self._opened

    def cache_bytes(self) -> dict[str, int]:
        """The opened part's caches (none before it is opened)."""
        opened = self._opened
        return opened.cache_bytes() if isinstance(opened, HoldsCaches) else {}

    async def aclose(self) -> None:
        # Under the lock: an open under way finishes first, and is closed here, not kept.
        async with self._lock:
            self._closed = True
            opened, self._opened = self._opened, None
        if opened is not None:
            await opened.aclose()


class LazyVectorIndex:
    """A `VectorIndex` whose table is opened by its first call (see the module's docstring)."""

    def __init__(self, open: Callable[[], VectorIndex]) -> None:
        self._index = OpenedOnFirstUse(open, lambda: SearchIndexError("the index is closed"))

    @property
    def opened(self) -> bool:
        return self._index.opened

    def cache_bytes(self) -> dict[str, int]:
        return self._index.cache_bytes()

    async def add(self, rows: Sequence[IndexRow]) -> None:
        await (await self._index.get()).add(rows)

    async def set_vectors(self, tenant: str, vectors: dict[str, list[float]]) -> None:
        await (await self._index.get()).set_vectors(tenant, vectors)

    async def search(self, query: SearchQuery) -> SearchResult:
        return await (await self._index.get()).search(query)

    async def prepare(self, query: SearchQuery) -> None:
        # Opening here starts it while the request's question is still being embedded.
        await (await self._index.get()).prepare(query)

    async def delete(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> None:
        await (await self._index.get()).delete(tenant, conversation_id=conversation_id, user_id=user_id)

    async def rows_of(self, tenant: str, conversation_id: str) -> list[tuple[str, bool]]:
        return await (await self._index.get()).rows_of(tenant, conversation_id)

    async def aclose(self) -> None:
        await self._index.aclose()


class LazyMemoryVectors:
    """A `MemoryVectors` whose table is opened by its first call (see the module's docstring)."""

    def __init__(self, open: Callable[[], MemoryVectors]) -> None:
        self._vectors = OpenedOnFirstUse(open, lambda: SearchIndexError("the memory index is closed"))

    @property
    def opened(self) -> bool:
        return self._vectors.opened

    def cache_bytes(self) -> dict[str, int]:
        return {f"memory_{name}": size for name, size in self._vectors.cache_bytes().items()}

    async def upsert(self, rows: Sequence[MemoryRow]) -> None:
        await (await self._vectors.get()).upsert(rows)

    async def delete(self, tenant: str, memory_ids: Sequence[str]) -> None:
        await (await self._vectors.get()).delete(tenant, memory_ids)

    async def delete_user(self, tenant: str, user_id: str) -> None:
        await (await self._vectors.get()).delete_user(tenant, user_id)

    async def search(self, query: MemoryQuery) -> MemorySearchResult:
        return await (await self._vectors.get()).search(query)

    async def count(self, tenant: str, user_id: str | None = None) -> int:
        return await (await self._vectors.get()).count(tenant, user_id)

    async def aclose(self) -> None:
        await self._vectors.aclose()
