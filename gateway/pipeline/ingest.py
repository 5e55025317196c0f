"""Identify + ingest step: recognise the conversation from its history and store new messages first.

The client's messages are chain-hashed; the store is asked about the newest hashes first (a chat app
resends what the gateway stored one turn ago), so the work per request does not grow with the number of
stored messages. With a history memo (history_memo.py), only what follows the prefix the conversation
sent last time is hashed and looked at message by message. Everything after the deepest stored node is appended as its children: an edit or a
regeneration becomes a sibling branch. Token counts come from the store (counted once per message); only
the newest messages the budget can hold are read, and the history's total is the deepest node's
`path_tokens`. Thin mode: a client naming a stored conversation and sending only new messages gets the
rest of the path from the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar, TypeVar

import anyio.to_thread

from gateway.config import IdentityConfig
from gateway.errors import ConversationDeleted
from gateway.pipeline.call import CallState, ChatCall, HistoryItem
from gateway.pipeline.canonical import chain_hashes, root_hash
from gateway.pipeline.history_memo import HistoryMemo, Seen, running_bytes
from gateway.pipeline.identify import Identity, explicit_identity
from gateway.ports import ChatPayload, JSONObject, MessageStore, Tokenizer, Tokenizers
from gateway.records import AppendRequest, Conversation, NewMessage, StoredNode, unanswered_embed_job
from gateway.tracing import spanned

_SYSTEM_ROLES = frozenset({"system", "developer"})
_ON_LOOP = 64  # messages hashed or counted on the event loop; more go to a thread (a hop costs ~0.2 ms)
_T = TypeVar("_T")
TAIL = 32  # hashes asked about first: covers the usual "history + one new turn" in one query


def split_leading_system(messages: list[JSONObject]) -> int:
    """How many messages at the start are system/developer instructions."""
    count = 0
    for message in messages:
        if message.get("role") not in _SYSTEM_ROLES:
            break
        count += 1
    return count


def chain_root(tenant: str, conversation_id: str | None, user_id: str | None) -> bytes:
    """Explicit conversations hash in their own space; implicit ones per user, so equal first messages of
    different users never share nodes."""
    if conversation_id is not None:
        return root_hash(tenant, "conversation", conversation_id)
    return root_hash(tenant, "user", user_id or "")


def _deepest(hashes: list[str], nodes: dict[str, StoredNode], start: int = 0) -> int:
    for index in range(len(hashes) - 1, start - 1, -1):
        if hashes[index] in nodes:
            return index
    return -1


@dataclass(slots=True)
class _Identified:
    """What the store knows of the client's chain."""

    key: str | None  # the memo's key for this chain
    seen: Seen | None  # what the memo last saw there
    shared: int  # how much of it this chain shares
    hashes: list[str]
    nodes: dict[str, StoredNode]  # the stored nodes among `hashes`
    deepest: int  # index of the deepest stored hash; -1: none
    conversation: Conversation | None  # the explicit conversation, if named and stored


@dataclass(slots=True)
class _Placed:
    """The chain's new messages: under `parent`, at `depth`, after `base_tokens` of path."""

    parent: StoredNode | None
    new: list[JSONObject]
    depth: int
    base_tokens: int
    hashes: list[str]  # the chain's hashes (from the parent, in thin mode)
    conversation_id: str | None


@dataclass(slots=True)
class IngestStep:
    span_name: ClassVar[str] = "ingest"  # its span in a request trace

    store: MessageStore
    tokenizers: Tokenizers
    identity: IdentityConfig
    # Read stored token counts for at least this many tokens of newest history (the context budget).
    coverage_tokens: int = 0
    # The messages each conversation sent last: a resent history is hashed only where it is new.
    memo: HistoryMemo | None = None
    # With retrieval on: new messages get an embed job this many seconds later in case their answer is
    # never persisted (`unanswered_embed_job`); None: retrieval is off.
    unanswered_index_seconds: float | None = None

    async def __call__(self, call: ChatCall, payload: ChatPayload) -> ChatPayload:
        try:
            return await self._ingest(call, payload)
        except ConversationDeleted:
            # Recognised from a cache that still held a conversation deleted meanwhile (through another
            # replica): the store has forgotten it now, so identify the request once more.
            return await self._ingest(call, payload)

    async def _ingest(self, call: ChatCall, payload: ChatPayload) -> ChatPayload:
        body = payload.data
        messages = [m for m in body["messages"] if isinstance(m, dict)]  # type: ignore[union-attr]
        tokenizer = self.tokenizers.for_model(str(body.get("model")))
        ident = explicit_identity(call.headers, body)
        state = call.state
        state.user_id = ident.user_id
        state.incognito = ident.memory_off
        state.explicit = ident.conversation_id is not None

        leading = 0 if self.identity.system_in_chain else split_leading_system(messages)
        system, chain = messages[:leading], messages[leading:]
        state.items = [HistoryItem(m, tokenizer.count_message(m)) for m in system]
        state.history_tokens = sum(item.tokens or 0 for item in state.items)
        found = await self._identify(call, ident, chain, leading)
        placed = await self._place(call, ident, chain, leading, found)
        parent, hashes, conversation_id = placed.parent, placed.hashes, placed.conversation_id
        if parent is not None:
            state.history_tokens += parent.path_tokens
            conversation_id = conversation_id or parent.conversation_id

        new = placed.new
        appended = await _sized(
            len(new),
            _new_messages,
            new,
            hashes[len(hashes) - len(new) :],
            parent,
            placed.depth,
            placed.base_tokens,
            tokenizer,
        )
        state.items += [HistoryItem(m.data, m.token_count, m.id) for m in appended]
        state.history_tokens += sum(m.token_count for m in appended)
        state.appended = len(appended)
        await self._store(call, state, ident, conversation_id, appended)
        if found.key is not None and self.memo is not None and not state.thin:
            sizes = running_bytes(found.seen, found.shared, chain)
            self.memo.keep(found.key, Seen(chain, hashes, state.items[len(system) :], sizes))
        last = appended[-1] if appended else parent
        if last is not None:
            state.leaf_id, state.leaf_depth = last.id, last.depth
            state.leaf_path_tokens = last.path_tokens
        if state.thin:
            # The upstream needs the whole history even though the client sent only the new turn.
            return ChatPayload({**body, "messages": [item.message for item in state.items]})
        return payload

    async def _identify(
        self, call: ChatCall, ident: Identity, chain: list[JSONObject], leading: int
    ) -> _Identified:
        """The chain's hashes (only where new since the memo's last look) and the stored nodes among
        them, the newest asked about first."""
        with spanned(call.trace, "identify") as span:
            root = chain_root(call.tenant, ident.conversation_id, ident.user_id)
            key, seen, shared = self._recall(root, chain, leading)
            hashes = list(seen.hashes[:shared]) if seen is not None else []
            start = bytes.fromhex(hashes[-1]) if hashes else root
            hashes += await _sized(len(chain) - shared, _hex_hashes, start, chain[shared:], leading + shared)

            tail = max(len(hashes) - TAIL, 0)
            lookup = await self.store.lookup(call.tenant, hashes[tail:], ident.conversation_id)
            nodes = dict(lookup.nodes)
            deepest = _deepest(hashes, nodes, tail)
            if deepest < 0 and tail > 0:
                # Diverged further back (an old message edited) or a long history seen for the first time.
                nodes.update((await self.store.lookup(call.tenant, hashes[:tail], None)).nodes)
                deepest = _deepest(hashes, nodes)
            span.set({"gateway.messages": len(chain), "gateway.messages.known": deepest + 1})
        return _Identified(key, seen, shared, hashes, nodes, deepest, lookup.conversation)

    async def _place(
        self, call: ChatCall, ident: Identity, chain: list[JSONObject], leading: int, found: _Identified
    ) -> _Placed:
        """Where the chain's new messages go; the history before them joins `call.state.items`."""
        hashes, deepest = found.hashes, found.deepest
        conversation_id = found.conversation.id if found.conversation is not None else None
        # Thin mode: the client named a stored conversation (or a branch point) and sent only new turns.
        # A client that sends assistant turns sends its history: a miss then means an edited first
        # message, a new branch from the root, not a continuation.
        thin_parent = ident.parent_id
        if thin_parent is None and found.conversation is not None and ident.thin_capable:
            sends_history = any(m.get("role") == "assistant" for m in chain)
            thin_parent = None if sends_history else found.conversation.last_message_id
        # A thin client's new message may equal the conversation's first one ("continue", "yes"): a match
        # at the root then still means "after the newest message", unless that message is the root.
        at_root = deepest < 0 or (deepest == 0 and thin_parent != hashes[0])
        if at_root and self.identity.thin_mode and thin_parent is not None:
            parent = await self._thin(call, call.state, thin_parent)
            if parent is None:
                return _Placed(None, chain, 0, 0, hashes, conversation_id)
            hashes = [h.hex() for h in chain_hashes(bytes.fromhex(parent.id), chain, leading)]
            # The branch point decides: new messages join the conversation their parent is in.
            return _Placed(
                parent, chain, parent.depth + 1, parent.path_tokens, hashes, parent.conversation_id
            )
        parent = found.nodes[hashes[deepest]] if deepest >= 0 else None
        call.state.items += await self._stored_items(call.tenant, chain, found, parent)
        base_tokens = parent.path_tokens if parent is not None else 0
        return _Placed(parent, chain[deepest + 1 :], deepest + 1, base_tokens, hashes, conversation_id)

    async def _stored_items(
        self, tenant: str, chain: list[JSONObject], found: _Identified, parent: StoredNode | None
    ) -> list[HistoryItem]:
        """The chain's stored prefix as items, with the token counts read for its newest stretch."""
        hashes, nodes, deepest = found.hashes, found.nodes, found.deepest
        known = deepest + 1
        if parent is not None:
            known = await self._cover(tenant, hashes, deepest, nodes)
        # The stored prefix the memo already holds items for is taken as it is (every node above the
        # deepest stored one is stored); only the rest is looked at message by message.
        reused = min(found.shared, deepest + 1)
        items = list(found.seen.items[:reused]) if found.seen is not None else []
        for index in range(reused, deepest + 1):
            node = nodes.get(hashes[index])
            items.append(HistoryItem(chain[index], node.token_count if node else None, hashes[index]))
        for index in range(min(known, reused), reused):  # counts read now that were unknown then
            node = nodes.get(hashes[index])
            if items[index].tokens is None and node is not None:
                items[index] = HistoryItem(items[index].message, node.token_count, hashes[index])
        return items

    async def _thin(self, call: ChatCall, state: CallState, node_id: str) -> StoredNode | None:
        # With a context budget only its newest stretch of the path is read; without one, all of it.
        path = await self.store.path(call.tenant, node_id, self.coverage_tokens or None)
        if not path:
            return None
        state.thin = True
        leaf = path[-1].node
        if path[0].node.parent_id is not None:
            # Cut by the budget: start at a user message, so no answer or tool result loses its question.
            while path and path[0].node.role != "user":
                path = path[1:]
        state.items += [HistoryItem(m.data, m.node.token_count, m.node.id) for m in path]
        return leaf

    async def _cover(self, tenant: str, hashes: list[str], deepest: int, nodes: dict[str, StoredNode]) -> int:
        """Read token counts of older stored messages until the newest `coverage_tokens` are known;
        returns where the stretch of known counts (in `nodes`) begins."""
        newest = nodes[hashes[deepest]]
        known = deepest
        while known > 0 and hashes[known - 1] in nodes:
            known -= 1
        while known > 0:
            covered = newest.path_tokens - nodes[hashes[known]].path_tokens + nodes[hashes[known]].token_count
            if covered >= self.coverage_tokens:
                return known
            average = max(newest.path_tokens // (deepest + 1), 1)
            start = max(known - ((self.coverage_tokens - covered) // average * 3 // 2 + 16), 0)
            found = (await self.store.lookup(tenant, hashes[start:known], None)).nodes
            if len(found) < known - start:
                return known  # the prefix is not all stored (deleted): unknown counts count as too big
            nodes.update(found)
            known = start
        return known

    def _recall(
        self, root: bytes, chain: list[JSONObject], leading: int
    ) -> tuple[str | None, Seen | None, int]:
        """The memo's key for this chain, what it last saw there and how much of it this chain shares."""
        if self.memo is None or not chain:
            return None, None, 0
        key = next(chain_hashes(root, chain[:1], leading)).hex()
        seen, shared = self.memo.recall(key, chain)
        return key, seen, shared

    async def _store(
        self,
        call: ChatCall,
        state: CallState,
        ident: Identity,
        conversation_id: str | None,
        appended: list[NewMessage],
    ) -> None:
        if ident.user_id is not None or ident.memory_off:
            # Whose turns these are, and whether memory may learn from them (incognito: never).
            appended = [
                replace(m, author=ident.user_id if m.role == "user" else None, remember=not ident.memory_off)
                for m in appended
            ]
        if appended or (conversation_id is None and ident.conversation_id is not None):
            delay = self.unanswered_index_seconds
            jobs = (
                (unanswered_embed_job(call.tenant, conversation_id, appended[-1].id, len(appended), delay),)
                if delay is not None and appended
                else ()
            )
            conversation_id = await self.store.append(
                AppendRequest(
                    call.tenant, conversation_id, ident.user_id, ident.conversation_id, tuple(appended), jobs
                )
            )
        state.conversation_id = conversation_id


async def _sized(count: int, work: Callable[..., _T], *args: object) -> _T:
    """`work(*args)` over `count` messages: on the event loop, or past `_ON_LOOP` in a thread, since a
    long history's hashing and counting held the loop other chats share for over 100 ms (BENCHMARKS.md,
    issue 28)."""
    return await anyio.to_thread.run_sync(work, *args) if count > _ON_LOOP else work(*args)


def _hex_hashes(start: bytes, messages: list[JSONObject], first_index: int) -> list[str]:
    return [h.hex() for h in chain_hashes(start, messages, first_index)]


def _new_messages(
    messages: list[JSONObject],
    hashes: list[str],
    parent: StoredNode | None,
    depth: int,
    base_tokens: int,
    tokenizer: Tokenizer,
) -> list[NewMessage]:
    out: list[NewMessage] = []
    # History the client had before this request (everything before its last question, when that holds
    # an answer) was said at times nobody told us: stored undated. A fresh agent loop (question, tool
    # call, results) is all from now.
    last_question = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=0)
    before = messages[:last_question]
    undated = last_question if any(m.get("role") == "assistant" for m in before) else 0
    parent_id = parent.id if parent is not None else None
    path_tokens = base_tokens
    for offset, (message, chain_hash) in enumerate(zip(messages, hashes, strict=True)):
        role = message.get("role")
        tokens = tokenizer.count_message(message)
        path_tokens += tokens
        out.append(
            NewMessage(
                id=chain_hash,
                parent_id=parent_id,
                depth=depth + offset,
                role=role if isinstance(role, str) else "user",
                data=message,
                token_count=tokens,
                path_tokens=path_tokens,
                dated=offset >= undated,
            )
        )
        parent_id = chain_hash
    return out
