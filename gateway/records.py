"""Plain records that cross the store port: what the pipeline hands the store and gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gateway.ports import JSONObject


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append; `id` is its chain hash (hex), so the same node is never stored twice."""

    id: str
    parent_id: str | None
    depth: int
    role: str
    data: JSONObject
    token_count: int
    path_tokens: int  # tokens of the whole path root..this message: a history's size without reading it


@dataclass(frozen=True, slots=True)
class StoredNode:
    id: str
    conversation_id: str
    parent_id: str | None
    depth: int
    role: str
    token_count: int
    path_tokens: int


@dataclass(frozen=True, slots=True)
class StoredMessage:
    node: StoredNode
    data: JSONObject
    created_at: datetime
    meta: JSONObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    tenant: str
    user_id: str | None
    external_id: str | None
    root_id: str | None
    last_message_id: str | None
    message_count: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the store knows of an incoming history: the explicit conversation, if named, and every
    stored node among the client's chain hashes."""

    conversation: Conversation | None
    nodes: dict[str, StoredNode]


@dataclass(frozen=True, slots=True)
class NewJob:
    kind: str  # "compact", "embed", "extract_memory"
    tenant: str
    payload: JSONObject
    key: str | None = None  # dedupe: not enqueued again while a job with this kind and key is pending
    delay_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    kind: str
    tenant: str
    payload: JSONObject
    key: str | None
    attempts: int  # including the current one
    lease_until: datetime


@dataclass(frozen=True, slots=True)
class AppendRequest:
    tenant: str
    conversation_id: str | None  # None: start a new conversation
    user_id: str | None
    external_id: str | None
    messages: tuple[NewMessage, ...]
    jobs: tuple[NewJob, ...] = ()  # enqueued in the same transaction as the messages


@dataclass(frozen=True, slots=True)
class RequestRecord:
    id: str
    tenant: str
    conversation_id: str | None
    user_id: str | None
    parent_message_id: str | None
    model: str | None
    stream: bool
    status: str
    http_status: int
    original_tokens: int | None
    sent_tokens: int | None
    report: JSONObject | None
    usage: JSONObject | None
    error: str | None
    latency_ms: float
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewSummary:
    """A summary of the path root..`node_id` (level "global"), or of the messages after `from_node_id`
    up to `node_id` (level "chunk"). Keyed by the node it covers up to, so it is valid for every branch
    through that node."""

    tenant: str
    conversation_id: str
    node_id: str
    from_node_id: str | None
    level: str  # "chunk" or "global"
    depth: int
    path_tokens: int
    content: str
    token_count: int
    source_tokens: int  # tokens of the messages (or summaries) folded into it
    model: str | None
    llm_input_tokens: int = 0  # what the summarisation calls cost, as the provider reported it
    llm_output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Summary:
    id: str
    tenant: str
    conversation_id: str
    node_id: str
    from_node_id: str | None
    level: str
    depth: int
    path_tokens: int
    content: str
    token_count: int
    source_tokens: int
    model: str | None
    llm_input_tokens: int
    llm_output_tokens: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One searchable text of a message: the message alone ("m"), with its parent ("p"), or with its
    parent and one child ("w"; keyed by that child, since branches give a node several). Short replies
    carry their meaning in their neighbours, so each message is found through all of its views."""

    id: str  # f"{node_id}:{view}" (+ f":{child_id}" for "w")
    tenant: str
    user_id: str | None
    conversation_id: str
    node_id: str
    view: str
    depth: int
    created_at: datetime
    text: str
    vector: list[float] | None = None


@dataclass(frozen=True, slots=True)
class SearchQuery:
    tenant: str
    text: str
    vector: list[float] | None  # None: keyword search only (the embedder failed or is disabled)
    limit: int
    conversation_id: str | None = None  # one conversation ...
    user_id: str | None = None  # ... and/or every conversation of one user
    exclude_conversation_id: str | None = None
    max_depth: int | None = None  # only messages shallower than this (older than the recent window)
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class IndexHit:
    node_id: str
    conversation_id: str
    view: str
    depth: int
    created_at: datetime
    score: float  # the engine's own: cosine similarity for semantic hits, BM25 for keyword hits


@dataclass(frozen=True, slots=True)
class SearchResult:
    semantic: list[IndexHit]
    keyword: list[IndexHit]
