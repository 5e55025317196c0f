"""Plain records that cross the store port: what the pipeline hands the store and gets back."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import NamedTuple

from gateway.ports import JSON, JSONObject


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
    # False for history a client had before sending it (a long chat arriving in one request): stored
    # now, but said at a time nobody told the gateway. Kept as `meta["undated"]`.
    dated: bool = True
    # Who said it, when the request named a user (a conversation may be shared); kept as
    # `meta["user_id"]` on user turns, so memory is learnt for the one who said it.
    author: str | None = None
    # False: said in an incognito call (X-Gateway-Memory: off): memory never learns from it
    # (`meta["no_memory"]`).
    remember: bool = True

    def meta(self) -> JSONObject:
        meta: JSONObject = {}
        if not self.dated:
            meta["undated"] = True
        if self.author is not None:
            meta["user_id"] = self.author
        if not self.remember:
            meta["no_memory"] = True
        return meta


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
    title: str | None = None  # written in the background (a title job), for the recent-conversations digest
    gist: str | None = None  # one line on what it is about, with the title


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
    priority: int = 0  # higher is leased first among due jobs


# Work that can wait (titles, profiles, neighbours' views embedded again): leased when nothing else is
# due, so a backlog defers it; it stays queued (one title a conversation, one profile a user).
CAN_WAIT = -1

# -- job descriptions: what each kind's payload holds (the pipeline enqueues them, handlers read them) --

COMPACT = "compact"
EMBED = "embed"


def compaction_job_key(conversation_id: str) -> str:
    """One pending compaction per conversation: it folds up to the newest answer when it runs."""
    return f"{COMPACT}:{conversation_id}"


def compact_job(
    tenant: str, conversation_id: str, leaf_id: str, model: JSON, *, force: bool = False
) -> NewJob:
    """Summarise the conversation up to `leaf_id` with `model`; `force`: whatever the threshold says."""
    payload: JSONObject = {"conversation_id": conversation_id, "leaf_id": leaf_id, "model": model}
    if force:
        payload["force"] = True
    return NewJob(COMPACT, tenant, payload, key=compaction_job_key(conversation_id))


EMBED_MODES = ("all", "texts", "vectors", "context")
BULK_MESSAGES = 16  # an embed job of more messages than this carries a history that arrived at once


def unanswered_embed_job(
    tenant: str, conversation_id: str | None, leaf_id: str, count: int, delay_seconds: float
) -> NewJob:
    """A request's new messages are indexed by the job its answer queues (question and answer in one
    batch). So that a question whose request never completes (its process killed mid-stream) is indexed
    all the same, the ingest queues this delayed job with the messages, in the same transaction; the
    answer's persist drops it while it is still queued (`jobs.unanswered_index_seconds`)."""
    job = EmbedWork(conversation_id, leaf_id, count).job(tenant)
    return replace(job, key=unanswered_embed_key(leaf_id), delay_seconds=delay_seconds)


def unanswered_embed_key(leaf_id: str) -> str:
    return f"{EMBED}-unanswered:{leaf_id}"


def embed_key_prefix(conversation_id: str) -> str:
    """What every pending embed job of one conversation's key starts with (its indexing backlog)."""
    return f"{EMBED}:{conversation_id}:"


@dataclass(frozen=True, slots=True)
class EmbedWork:
    """An embed job: index the `count` newest messages of the path ending at `leaf_id`.

    `mode` "all" writes texts and vectors; "texts" writes only texts (a large stretch is made findable by
    keyword first); "vectors" embeds each message of a stretch whose texts were written already, alone
    (findable by meaning); "context" then embeds its views with its neighbours. Large stretches are
    split by the handler into bounded jobs of these kinds, newest messages first. `then` is the whole
    stretch (leaf, count) a "vectors" chain hands to a "context" chain when it ends.
    """

    conversation_id: str | None  # None: jobs queued before the field existed (read from the path)
    leaf_id: str
    count: int
    mode: str = "all"
    then: tuple[str, int] | None = None

    def job(self, tenant: str) -> NewJob:
        payload: JSONObject = {"leaf_id": self.leaf_id, "count": self.count, "mode": self.mode}
        if self.conversation_id is not None:
            payload["conversation_id"] = self.conversation_id
        if self.then is not None:
            payload["then"] = [self.then[0], self.then[1]]
        prefix = embed_key_prefix(self.conversation_id) if self.conversation_id else f"{EMBED}:"
        return NewJob(
            EMBED, tenant, payload, key=f"{prefix}{self.mode}:{self.leaf_id}", priority=self.priority
        )

    @property
    def priority(self) -> int:
        """A long stretch's keyword and first meaning passes go before per-exchange jobs (an app that
        brings its history asks about it at once: its own new turns are in the recent window meanwhile),
        the views with neighbours after everything."""
        if self.mode == "context":
            return CAN_WAIT
        return 1 if self.mode in ("texts", "vectors") or self.count > BULK_MESSAGES else 0

    @classmethod
    def parse(cls, payload: JSONObject) -> EmbedWork | None:
        """The work a payload describes, or None when it is malformed (nothing to do)."""
        leaf_id, count = payload.get("leaf_id"), payload.get("count")
        mode, conversation_id = payload.get("mode", "all"), payload.get("conversation_id")
        if not isinstance(leaf_id, str) or not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return None
        if mode not in EMBED_MODES or not isinstance(conversation_id, str | None):
            return None
        then = payload.get("then")
        if then is not None:
            match then:
                case [str(then_leaf), int(then_count)] if then_count >= 1 and then_count is not True:
                    return cls(conversation_id, leaf_id, count, str(mode), (then_leaf, then_count))
                case _:
                    return None
        return cls(conversation_id, leaf_id, count, str(mode))


@dataclass(frozen=True, slots=True)
class IndexBacklog:
    """Messages of a conversation still waiting for the index: without any row yet (`unsearchable`, not
    even found by keyword), without vectors (`unembedded`, not found by meaning), and found by meaning
    alone but not yet with their neighbours (`alone`). Derived from the pending embed jobs, so it is
    exact whichever replica runs them."""

    unsearchable: int = 0
    unembedded: int = 0
    alone: int = 0

    @classmethod
    def of(cls, pending: Sequence[JSONObject]) -> IndexBacklog:
        unsearchable = unembedded = alone = 0
        for payload in pending:
            work = EmbedWork.parse(payload)
            if work is None:
                continue
            # A "texts" job's messages are also in the "vectors" job that will follow them, and those in
            # the "context" job that follows the vectors chain.
            if work.mode == "context":
                alone += work.count
                continue
            if work.mode == "vectors" and work.then is not None:
                alone += work.then[1] - work.count  # embedded alone by the chain's jobs before it
            if work.mode != "texts":
                unembedded += work.count
            if work.mode != "vectors":
                unsearchable += work.count
        return cls(unsearchable, unembedded, alone)

    def __bool__(self) -> bool:
        return bool(self.unsearchable or self.unembedded or self.alone)


EXTRACT_MEMORY = "extract_memory"


@dataclass(frozen=True, slots=True)
class MemoryWork:
    """An extraction job: learn memories from the user turns of a conversation not read yet.

    One pending job per conversation (the turns arriving meanwhile are read by it); `after` names the
    message a previous job stopped at when it queued this one for the rest of a long backlog.
    """

    conversation_id: str
    user_id: str
    scope: str  # where memories learnt here go unless they are about the user at large
    model: str | None
    after: str | None = None

    def job(self, tenant: str, delay_seconds: float = 0.0) -> NewJob:
        payload: JSONObject = {
            "conversation_id": self.conversation_id,
            "user_id": self.user_id,
            "scope": self.scope,
            "model": self.model,
        }
        # One pending job per conversation: it learns each author's turns for that author.
        key = f"{EXTRACT_MEMORY}:{self.conversation_id}"
        if self.after is not None:
            payload["after"] = self.after
            key += f":{self.after}"
        return NewJob(EXTRACT_MEMORY, tenant, payload, key=key, delay_seconds=delay_seconds)

    @classmethod
    def parse(cls, payload: JSONObject) -> MemoryWork | None:
        conversation_id, user_id, scope = (payload.get(k) for k in ("conversation_id", "user_id", "scope"))
        model, after = payload.get("model"), payload.get("after")
        if not (isinstance(conversation_id, str) and isinstance(user_id, str) and isinstance(scope, str)):
            return None
        return cls(
            conversation_id,
            user_id,
            scope,
            model if isinstance(model, str) else None,
            after if isinstance(after, str) else None,
        )


PROFILE = "memory_profile"


TITLE = "title"
TITLE_EVERY_MESSAGES = 20  # a conversation's title is written after its first exchange, then this often


def title_job(tenant: str, conversation_id: str, model: str | None, delay_seconds: float = 0.0) -> NewJob:
    """Write a conversation's title and one-line gist; one pending job per conversation."""
    payload: JSONObject = {"conversation_id": conversation_id, "model": model}
    key = f"{TITLE}:{conversation_id}"
    return NewJob(TITLE, tenant, payload, key=key, delay_seconds=delay_seconds, priority=CAN_WAIT)


def profile_job(tenant: str, user_id: str, model: str | None, delay_seconds: float = 0.0) -> NewJob:
    """Rewrite a user's profile document from their active memories; one pending job per user."""
    payload: JSONObject = {"user_id": user_id, "model": model}
    key = f"{PROFILE}:{hashlib.sha256(f'{tenant}/{user_id}'.encode()).hexdigest()[:32]}"
    return NewJob(PROFILE, tenant, payload, key=key, delay_seconds=delay_seconds, priority=CAN_WAIT)


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    kind: str
    tenant: str
    payload: JSONObject
    key: str | None
    attempts: int  # including the current one
    lease_until: datetime
    worker: str | None = None  # the lease's holder (what `JobQueue.absorb` fences on)


@dataclass(frozen=True, slots=True)
class AppendRequest:
    tenant: str
    conversation_id: str | None  # None: start a new conversation
    user_id: str | None
    external_id: str | None
    messages: tuple[NewMessage, ...]
    jobs: tuple[NewJob, ...] = ()  # enqueued in the same transaction as the messages
    # Queue the jobs even when every message was stored already. An answer's jobs also cover the
    # question its request stored earlier; a next turn sent before this answer was persisted (a fast
    # client) stores the answer first, with jobs that do not reach back to that question.
    jobs_even_if_stored: bool = False
    # (kind, key) of queued jobs to drop in the same transaction (work this append makes redundant).
    cancel_jobs: tuple[tuple[str, str], ...] = ()


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
    # The gateway's injected context block exactly as sent (a system message), None when it sent none or
    # when something it held was deleted since (`MessageStore.forget_sent_context`).
    sent_context: JSONObject | None = None


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A Responses API response kept for `GET /v1/responses/{id}` and `previous_response_id` chains."""

    id: str
    tenant: str
    conversation_id: str | None
    answer_message_id: str | None  # the stored answer a chained request continues from
    body: JSONObject
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
    dated: bool = True  # False: `created_at` is when the gateway stored it, not when it was said


def message_views(present: Sequence[bool], start: int = 0) -> list[tuple[int, str, tuple[int, ...]]]:
    """The `IndexRow` views of messages `start`.. of a path whose messages have text where `present`:
    (the message the view belongs to, its kind, the messages whose texts it joins, oldest first). A message
    without text gets no view of its own; a "w" view is made when its child arrives, so it follows it."""
    views: list[tuple[int, str, tuple[int, ...]]] = []
    for i in range(start, len(present)):
        if not present[i]:
            continue
        views.append((i, "m", (i,)))
        if i >= 1 and present[i - 1]:
            views.append((i, "p", (i - 1, i)))
            before = (i - 2,) if i >= 2 and present[i - 2] else ()
            views.append((i - 1, "w", (*before, i - 1, i)))
    return views


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
    # Only messages said in this range; undated ones pass (they may well be from then).
    since: datetime | None = None
    until: datetime | None = None


class IndexHit(NamedTuple):
    """One row a search found. (A named tuple, not a frozen dataclass: a request makes hundreds, and a
    frozen dataclass takes 1.1 µs to make against 0.18.)"""

    node_id: str
    conversation_id: str
    view: str
    depth: int
    created_at: datetime
    score: float  # the engine's own: cosine similarity for semantic hits, BM25 for keyword hits
    dated: bool = True  # False: when it was said is unknown (`created_at` is when it was stored)


@dataclass(frozen=True, slots=True)
class SearchResult:
    semantic: list[IndexHit]
    keyword: list[IndexHit]


@dataclass(frozen=True, slots=True)
class JobState:
    """A job as stored, for inspection (tests, the dashboard); workers use `Job`."""

    id: str
    kind: str
    tenant: str
    payload: JSONObject
    key: str | None
    status: str
    attempts: int
    run_after: datetime
    lease_owner: str | None
    lease_until: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    priority: int = 0
