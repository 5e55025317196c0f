"""MessageStore decorator: an in-process cache of message nodes in front of the database.

Nodes are content-addressed (the id is the chain hash of the whole path), so a cached node never goes
stale. A chat app resends the same history every turn; with the cache, recognising it and reading the
token counts of its newest stretch costs dictionary look-ups instead of queries. When every requested
hash is either cached or after the deepest cached one, the database is not asked at all: those are the
new messages, and appending them is idempotent (another replica may have stored them already).
Conversations are mutable rows and are never cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime

from gateway.errors import ConversationDeleted
from gateway.ports import MessageStore
from gateway.records import (
    AppendRequest,
    Conversation,
    Lookup,
    RequestRecord,
    StoredMessage,
    StoredNode,
)

# What one cached node costs (fixed size: ids, depth, counts; docs/operations.md, "Sizing").
NODE_BYTES = 560


class CachedMessageStore:
    def __init__(self, inner: MessageStore, size: int) -> None:
        self.inner = inner
        self._size = size
        self._nodes: OrderedDict[tuple[str, str], StoredNode] = OrderedDict()

    def cache_bytes(self) -> dict[str, int]:
        return {"nodes": len(self._nodes) * NODE_BYTES}

    def _get(self, tenant: str, node_id: str) -> StoredNode | None:
        node = self._nodes.get((tenant, node_id))
        if node is not None:
            self._nodes.move_to_end((tenant, node_id))
        return node

    def _put(self, tenant: str, node: StoredNode) -> None:
        self._nodes[(tenant, node.id)] = node
        self._nodes.move_to_end((tenant, node.id))
        if len(self._nodes) > self._size:
            self._nodes.popitem(last=False)

    async def lookup(self, tenant: str, hashes: Sequence[str], external_id: str | None) -> Lookup:
        nodes: dict[str, StoredNode] = {}
        misses: list[str] = []
        for node_id in hashes:
            node = self._get(tenant, node_id)
            if node is None:
                misses.append(node_id)
            else:
                nodes[node_id] = node
        if external_id is None and (not misses or _only_new_tail(hashes, nodes)):
            return Lookup(None, nodes)
        found = await self.inner.lookup(tenant, misses, external_id)
        for node in found.nodes.values():
            self._put(tenant, node)
        return Lookup(found.conversation, {**nodes, **found.nodes})

    async def path(
        self,
        tenant: str,
        node_id: str,
        newest_tokens: int | None = None,
        newest_messages: int | None = None,
        through_depth: int | None = None,
    ) -> list[StoredMessage]:
        path = await self.inner.path(tenant, node_id, newest_tokens, newest_messages, through_depth)
        for message in path:
            self._put(tenant, message.node)
        return path

    async def append(self, request: AppendRequest) -> str:
        try:
            conversation_id = await self.inner.append(request)
        except ConversationDeleted:
            # Deleted, perhaps through another replica: this cache must stop recognising it.
            if request.conversation_id is not None:
                self._forget(request.tenant, {request.conversation_id})
            raise
        self._remember(request, conversation_id)
        return conversation_id

    async def complete(self, record: RequestRecord, answer: AppendRequest | None) -> bool:
        stored = await self.inner.complete(record, answer)
        if answer is not None and answer.conversation_id is not None:
            if stored:
                self._remember(answer, answer.conversation_id)
            else:
                self._forget(answer.tenant, {answer.conversation_id})
        return stored

    def _remember(self, request: AppendRequest, conversation_id: str) -> None:
        for m in request.messages:
            node = StoredNode(
                m.id, conversation_id, m.parent_id, m.depth, m.role, m.token_count, m.path_tokens
            )
            self._put(request.tenant, node)

    async def list_conversations(
        self,
        tenant: str,
        *,
        limit: int = 50,
        user_id: str | None = None,
        offset: int = 0,
        text: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[Conversation]:
        return await self.inner.list_conversations(
            tenant, limit=limit, user_id=user_id, offset=offset, text=text, since=since, until=until
        )

    async def get_conversation(self, tenant: str, conversation_id: str) -> Conversation | None:
        return await self.inner.get_conversation(tenant, conversation_id)

    async def conversation_messages(self, tenant: str, conversation_id: str) -> list[StoredMessage]:
        return await self.inner.conversation_messages(tenant, conversation_id)

    async def get_request(self, tenant: str, request_id: str) -> RequestRecord | None:
        return await self.inner.get_request(tenant, request_id)

    async def list_requests(
        self, tenant: str, *, conversation_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[RequestRecord]:
        return await self.inner.list_requests(
            tenant, conversation_id=conversation_id, limit=limit, offset=offset
        )

    async def delete_conversations(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> list[str]:
        deleted = set(
            await self.inner.delete_conversations(tenant, conversation_id=conversation_id, user_id=user_id)
        )
        # A deleted history sent again must be stored again, not recognised from this cache. Other
        # replicas find out on their next write to it (ConversationDeleted, above).
        self._forget(tenant, deleted)
        return sorted(deleted)

    async def set_title(self, tenant: str, conversation_id: str, title: str, gist: str | None) -> bool:
        return await self.inner.set_title(tenant, conversation_id, title, gist)

    async def forget_sent_context(self, tenant: str, user_id: str) -> int:
        return await self.inner.forget_sent_context(tenant, user_id)

    def _forget(self, tenant: str, conversations: set[str]) -> None:
        stale = [
            key
            for key, node in self._nodes.items()
            if key[0] == tenant and node.conversation_id in conversations
        ]
        for key in stale:
            del self._nodes[key]

    async def aclose(self) -> None:
        await self.inner.aclose()


def _only_new_tail(hashes: Sequence[str], nodes: dict[str, StoredNode]) -> bool:
    """True when the misses are a suffix right after a cached node: the client's new messages."""
    deepest = max((i for i, h in enumerate(hashes) if h in nodes), default=-1)
    return deepest >= 0 and all(h in nodes for h in hashes[: deepest + 1])
