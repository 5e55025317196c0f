"""The memory half's ports: memories in SQL (the source of truth) and their vectors (LanceDB).

Both are always scoped by tenant and user; shipped fakes live in `gateway.fakes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.memory.records import (
    Memory,
    MemoryChanges,
    MemoryFilter,
    MemoryQuery,
    MemoryRow,
    MemorySearchResult,
    Profile,
)


class MemoryStore(Protocol):
    async def get(self, tenant: str, memory_id: str) -> Memory | None:
        """One memory with its sources and history (any status)."""
        ...

    async def many(self, tenant: str, memory_ids: Sequence[str]) -> list[Memory]:
        """The memories of these ids that exist in the tenant, in no particular order."""
        ...

    async def find(self, tenant: str, where: MemoryFilter) -> list[Memory]:
        """Newest first (by `updated_at`)."""
        ...

    async def by_hash(self, tenant: str, user_id: str, scope: str, hashes: Sequence[str]) -> list[Memory]:
        """Active memories of the user and scope whose normalised content has one of these hashes."""
        ...

    async def save(self, changes: MemoryChanges) -> None:
        """Apply everything in one transaction: all of it is stored or none."""
        ...

    async def delete(self, tenant: str, memory_ids: Sequence[str]) -> int:
        """Remove these memories for good (rows, sources); returns how many there were."""
        ...

    async def delete_user(self, tenant: str, user_id: str) -> list[str]:
        """Remove every memory of the user with its sources, and their profile; returns the ids removed. The extraction
        cursors stay (they hold no words): the user's conversations are not read again from the root, so
        what was deleted is not learnt again from old turns."""
        ...

    async def cursor(self, tenant: str, conversation_id: str) -> str | None:
        """The message extraction has read up to in this conversation."""
        ...

    async def profile(self, tenant: str, user_id: str) -> Profile | None: ...

    async def save_profile(
        self,
        tenant: str,
        user_id: str,
        *,
        generated: str | None = None,
        memories: Sequence[Memory] = (),
    ) -> None:
        """Store the job's text, written from `memories` (the user's own edit, if any, is left as it is)."""
        ...

    async def edit_profile(self, tenant: str, user_id: str, edited: str | None) -> Profile:
        """Store the user's own version (None: back to the generated one)."""
        ...

    async def forget_conversations(self, tenant: str, conversation_ids: Sequence[str]) -> None:
        """The conversations were deleted: drop their cursors and the source links to their messages
        (the memories stay: they are the user's, deleted through the memory API)."""
        ...


class MemoryVectors(Protocol):
    """Active memories' texts and vectors: semantic and full-text search, filtered by tenant, user and
    scope. Keyed by memory id: upserting a memory again replaces its row."""

    async def upsert(self, rows: Sequence[MemoryRow]) -> None: ...

    async def delete(self, tenant: str, memory_ids: Sequence[str]) -> None: ...

    async def delete_user(self, tenant: str, user_id: str) -> None: ...

    async def search(self, query: MemoryQuery) -> MemorySearchResult:
        """Both rankings, best first."""
        ...

    async def count(self, tenant: str, user_id: str | None = None) -> int: ...

    async def aclose(self) -> None: ...
