"""Identify + ingest step: recognise the conversation from its history and store new messages first.

The client's messages are chain-hashed; one store lookup finds the deepest stored node, and everything
after it is appended as its children (an edit or a regeneration therefore becomes a sibling branch).
Thin mode: a client naming a stored conversation and sending only new messages gets the rest of the
path from the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import IdentityConfig
from gateway.pipeline.call import ChatCall, HistoryItem
from gateway.pipeline.canonical import chain_hashes, root_hash
from gateway.pipeline.identify import explicit_identity
from gateway.ports import ChatPayload, JSONObject, MessageStore, Tokenizer, Tokenizers
from gateway.records import AppendRequest, NewMessage, StoredNode

_SYSTEM_ROLES = frozenset({"system", "developer"})


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


@dataclass(slots=True)
class IngestStep:
    store: MessageStore
    tokenizers: Tokenizers
    identity: IdentityConfig

    async def __call__(self, call: ChatCall, payload: ChatPayload) -> ChatPayload:
        body = payload.data
        messages = [m for m in body["messages"] if isinstance(m, dict)]  # type: ignore[union-attr]
        tokenizer = self.tokenizers.for_model(str(body.get("model")))
        ident = explicit_identity(call.headers, body)
        state = call.state
        state.user_id = ident.user_id
        state.explicit = ident.conversation_id is not None

        leading = 0 if self.identity.system_in_chain else split_leading_system(messages)
        system, chain = messages[:leading], messages[leading:]
        root = chain_root(call.tenant, ident.conversation_id, ident.user_id)
        hashes = [h.hex() for h in chain_hashes(root, chain)]
        lookup = await self.store.lookup(call.tenant, hashes, ident.conversation_id)

        deepest = -1
        for index in range(len(hashes) - 1, -1, -1):
            if hashes[index] in lookup.nodes:
                deepest = index
                break

        items = [HistoryItem(m, tokenizer.count_message(m)) for m in system]
        conversation_id = lookup.conversation.id if lookup.conversation is not None else None
        parent: StoredNode | None = lookup.nodes[hashes[deepest]] if deepest >= 0 else None
        new = chain[deepest + 1 :]
        parent_hash = hashes[deepest] if deepest >= 0 else None
        depth = deepest + 1

        thin_parent = ident.parent_id or (
            lookup.conversation.last_message_id if lookup.conversation else None
        )
        if deepest < 0 and self.identity.thin_mode and thin_parent is not None:
            # Thin mode: the client sent only new messages; the history is the stored path.
            path = await self.store.path(call.tenant, thin_parent)
            if path:
                state.thin = True
                items += [HistoryItem(m.data, m.node.token_count, m.node.id) for m in path]
                parent = path[-1].node
                parent_hash = parent.id
                depth = parent.depth + 1
                hashes = [h.hex() for h in chain_hashes(bytes.fromhex(parent.id), chain)]
                new = chain
        else:
            for index, message in enumerate(chain[: deepest + 1]):
                node = lookup.nodes.get(hashes[index])
                tokens = node.token_count if node is not None else tokenizer.count_message(message)
                items.append(HistoryItem(message, tokens, hashes[index]))
        if conversation_id is None and parent is not None:
            conversation_id = parent.conversation_id

        new_hashes = hashes[len(hashes) - len(new) :] if new else []
        appended = _new_messages(new, new_hashes, parent_hash, depth, tokenizer)
        items += [HistoryItem(m.data, m.token_count, m.id) for m in appended]
        if appended or (conversation_id is None and ident.conversation_id is not None):
            conversation_id = await self.store.append(
                AppendRequest(
                    call.tenant, conversation_id, ident.user_id, ident.conversation_id, tuple(appended)
                )
            )
        state.conversation_id = conversation_id
        state.items = items
        if appended:
            state.leaf_id, state.leaf_depth = appended[-1].id, appended[-1].depth
        elif parent is not None:
            state.leaf_id, state.leaf_depth = parent.id, parent.depth
        if state.thin:
            # The upstream needs the whole history even though the client sent only the new turn.
            return ChatPayload({**body, "messages": [item.message for item in items]})
        return payload


def _new_messages(
    messages: list[JSONObject], hashes: list[str], parent: str | None, depth: int, tokenizer: Tokenizer
) -> list[NewMessage]:
    out: list[NewMessage] = []
    for offset, (message, chain_hash) in enumerate(zip(messages, hashes, strict=True)):
        role = message.get("role")
        out.append(
            NewMessage(
                id=chain_hash,
                parent_id=parent,
                depth=depth + offset,
                role=role if isinstance(role, str) else "user",
                data=message,
                token_count=tokenizer.count_message(message),
            )
        )
        parent = chain_hash
    return out
