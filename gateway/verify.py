"""Checks of what is stored: every tree consistent, every message indexed once per view, the job queue
drained. `context-gateway verify` runs them; the soak and scale-out checks assert they find nothing.

Per conversation:
- every parent exists in the same conversation; a root has depth 0, a child its parent's depth + 1;
- `path_tokens` is the parent's plus the message's own `token_count`;
- a child's id is its chain hash (sha256 of the parent's hash and the canonical message): the message
  stored is the message that was sent, and the same path is never stored twice;
- the conversation's `message_count` is its number of messages, and its `last_message_id` one of them;
- with an index: the rows held are exactly the views the embed job writes (`index_rows`: "m", "p",
  "w"), each once, and (reported apart) whether each has its vector yet.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.pipeline.canonical import HASH_BYTES, canonical
from gateway.ports import JobQueue, MessageStore, VectorIndex
from gateway.records import StoredMessage
from gateway.text import message_text


@dataclass(frozen=True, slots=True)
class Finding:
    conversation_id: str
    node_id: str | None
    problem: str

    def __str__(self) -> str:
        where = self.conversation_id if self.node_id is None else f"{self.conversation_id}/{self.node_id}"
        return f"{where}: {self.problem}"


@dataclass(slots=True)
class Verified:
    tenant: str
    conversations: int = 0
    messages: int = 0
    index_rows: int = 0
    rows_without_vector: int = 0
    jobs: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing inconsistent (rows still waiting for their vectors and queued jobs are not faults)."""
        return not self.findings

    @property
    def settled(self) -> bool:
        """Consistent, no job queued, running or failed, and every index row with its vector."""
        pending = sum(self.jobs.get(status, 0) for status in ("queued", "running", "failed"))
        return self.ok and pending == 0 and self.rows_without_vector == 0


def tree_findings(conversation_id: str, messages: list[StoredMessage]) -> list[Finding]:
    nodes = {m.node.id: m for m in messages}
    found: list[Finding] = []

    def bad(node_id: str, problem: str) -> None:
        found.append(Finding(conversation_id, node_id, problem))

    for m in messages:
        node = m.node
        if node.conversation_id != conversation_id:
            bad(node.id, f"listed under this conversation but stored under {node.conversation_id}")
        if node.parent_id is None:
            if node.depth != 0:
                bad(node.id, f"a root at depth {node.depth}")
            if node.path_tokens != node.token_count:
                bad(node.id, f"a root with path_tokens {node.path_tokens} != token_count {node.token_count}")
            continue
        parent = nodes.get(node.parent_id)
        if parent is None:
            bad(node.id, f"parent {node.parent_id} is not in the conversation")
            continue
        if node.depth != parent.node.depth + 1:
            bad(node.id, f"depth {node.depth}, its parent's is {parent.node.depth}")
        if node.path_tokens != parent.node.path_tokens + node.token_count:
            bad(
                node.id,
                f"path_tokens {node.path_tokens} != parent's {parent.node.path_tokens} + own {node.token_count}",
            )
        expected = hashlib.sha256(bytes.fromhex(node.parent_id) + canonical(m.data)).digest()[:HASH_BYTES]
        if expected.hex() != node.id:
            bad(node.id, "id is not the chain hash of its parent and its content (content changed?)")
    return found


def expected_rows(messages: list[StoredMessage]) -> set[str]:
    """The index rows the embed job writes for these messages (jobs/embed.py `index_rows`, node by node:
    every node has one parent, so its views do not depend on the branch read)."""
    nodes = {m.node.id: m for m in messages}
    texts = {m.node.id: message_text(m.data).strip() for m in messages}
    rows: set[str] = set()
    for m in messages:
        node = m.node
        if not texts[node.id]:
            continue
        rows.add(f"{node.id}:m")
        parent = nodes.get(node.parent_id) if node.parent_id is not None else None
        if parent is not None and texts[parent.node.id]:
            rows.add(f"{node.id}:p")
            rows.add(f"{parent.node.id}:w:{node.id}")
    return rows


async def verify_tenant(
    tenant: str,
    store: MessageStore,
    jobs: JobQueue,
    index: VectorIndex | None,
    progress: Callable[[int], None] | None = None,
    *,
    neighbour_vectors: bool = True,
) -> Verified:
    """Check every conversation of `tenant` (paged, 200 at a time); `progress` gets the count done.
    Without `neighbour_vectors` (the embed job's setting), only each message's own view needs a vector."""
    result = Verified(tenant)
    offset = 0
    while page := await store.list_conversations(tenant, limit=200, offset=offset):
        offset += len(page)
        for conversation in page:
            messages = await store.conversation_messages(tenant, conversation.id)
            result.conversations += 1
            result.messages += len(messages)
            result.findings += tree_findings(conversation.id, messages)
            ids = {m.node.id for m in messages}
            if conversation.message_count != len(messages):
                result.findings.append(
                    Finding(
                        conversation.id,
                        None,
                        f"message_count {conversation.message_count}, {len(messages)} stored",
                    )
                )
            if conversation.last_message_id is not None and conversation.last_message_id not in ids:
                result.findings.append(
                    Finding(
                        conversation.id, None, f"last_message_id {conversation.last_message_id} not stored"
                    )
                )
            if index is not None:
                held = await index.rows_of(tenant, conversation.id)
                if not neighbour_vectors:  # the views with neighbours are texts only, by design
                    held = [(row_id, has or row_id.split(":")[1] != "m") for row_id, has in held]
                await _check_index(result, conversation.id, messages, held)
        if progress is not None:
            progress(result.conversations)
    result.jobs = await jobs.counts(tenant)
    return result


async def _check_index(
    result: Verified, conversation_id: str, messages: list[StoredMessage], held: list[tuple[str, bool]]
) -> None:
    result.index_rows += len(held)
    result.rows_without_vector += sum(1 for _, has_vector in held if not has_vector)
    counts = Counter(row_id for row_id, _ in held)
    for row_id, times in counts.items():
        if times > 1:
            result.findings.append(Finding(conversation_id, row_id, f"index row held {times} times"))
    expected = expected_rows(messages)
    missing = expected - counts.keys()
    extra = counts.keys() - expected
    if missing:
        result.findings.append(
            Finding(conversation_id, None, f"{len(missing)} index rows missing, e.g. {sorted(missing)[:3]}")
        )
    if extra:
        result.findings.append(
            Finding(
                conversation_id,
                None,
                f"{len(extra)} index rows of no stored message, e.g. {sorted(extra)[:3]}",
            )
        )
