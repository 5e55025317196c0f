"""Narrow interfaces between the pipeline and the adapters at the edge (upstreams, later stores/indexes).

The pipeline depends only on these; `wiring.py` picks the implementations. Every port has a shipped
fake or a real loopback stand-in (`gateway.fakes`) so tests never patch modules.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    from gateway.records import (
        AppendRequest,
        Conversation,
        IndexRow,
        Job,
        JobState,
        Lookup,
        NewJob,
        NewSummary,
        RequestRecord,
        SearchQuery,
        SearchResult,
        StoredMessage,
        StoredResponse,
        Summary,
    )

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
JSONObject: TypeAlias = "dict[str, JSON]"
Headers: TypeAlias = "list[tuple[str, str]]"


@dataclass(slots=True)
class ChatPayload:
    """The chat-completion body to send upstream.

    `raw` is the client's exact bytes when nothing was changed, so the hot path re-serialises nothing.
    """

    data: JSONObject
    raw: bytes | None = None


@dataclass(slots=True)
class UpstreamResponse:
    """An upstream answer whose body has not been read yet.

    Iterating `body` may raise `UpstreamError` (a broken or timed-out stream); `close()` must always be
    awaited, it releases the connection and cancels an unfinished upstream request.
    """

    status: int
    headers: Headers
    body: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]
    extra: dict[str, str] = field(default_factory=dict)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.body])


class Upstream(Protocol):
    """A provider the gateway forwards to."""

    name: str

    async def chat_completions(
        self, payload: ChatPayload, headers: Headers, client_key: str | None
    ) -> UpstreamResponse:
        """Send a chat completion; the body is OpenAI's JSON or SSE chunk format, whatever the provider."""
        ...

    async def forward(
        self,
        method: str,
        path: str,
        query: str,
        headers: Headers,
        body: AsyncIterator[bytes] | bytes,
        client_key: str | None,
    ) -> UpstreamResponse:
        """Pass any other `/v1/*` request through; `path` is relative to `/v1` (e.g. `/embeddings`)."""
        ...

    async def aclose(self) -> None: ...


class MessagesUpstream(Protocol):
    """A provider that speaks Anthropic's Messages API natively (`/v1/messages` is forwarded as is)."""

    async def messages(self, body: bytes, headers: Headers, client_key: str | None) -> UpstreamResponse:
        """POST /v1/messages; the answer is Anthropic's JSON or its named SSE events."""
        ...

    async def count_tokens(self, body: bytes, headers: Headers, client_key: str | None) -> UpstreamResponse:
        """POST /v1/messages/count_tokens."""
        ...

    async def aclose(self) -> None: ...


class Tokenizer(Protocol):
    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int:
        """Tokens of `text`. Additive over lines: cut right after a line break that is followed by a
        letter, a digit or one of `[#…<`, a text counts the sum of its parts (the tiktoken encodings'
        pre-tokenizers never run a chunk across such a break; tests/test_tokenizer.py checks it), so
        a text made of known lines is counted from their counts."""
        ...

    def count_concat(self, parts: Sequence[tuple[str, int | None]]) -> int:
        """Tokens of the texts of `parts` joined with nothing between them, given each one's own count
        where known (None: counted here): only the text around each join is counted again."""
        ...

    def count_message(self, message: object) -> int: ...

    def count_messages(self, messages: Sequence[object]) -> int: ...


@runtime_checkable
class HoldsCaches(Protocol):
    """A part that keeps caches between requests (an adapter, a memo): what they hold, for /metrics."""

    def cache_bytes(self) -> dict[str, int]:
        """Bytes each cache holds now, by its name in `gateway_cache_bytes`; estimates where a cache
        counts entries (docs/operations.md, "Sizing")."""
        ...


class Tokenizers(Protocol):
    def for_model(self, model: str) -> Tokenizer: ...


class ModelCatalog(Protocol):
    def context_window(self, model: str) -> int | None:
        """Input tokens the model accepts, or None when unknown."""
        ...


class MessageStore(Protocol):
    """The source of truth: every raw message as a tree, conversations, and request records."""

    async def lookup(self, tenant: str, hashes: Sequence[str], external_id: str | None) -> Lookup: ...

    async def path(
        self,
        tenant: str,
        node_id: str,
        newest_tokens: int | None = None,
        newest_messages: int | None = None,
        through_depth: int | None = None,
    ) -> list[StoredMessage]:
        """Root-to-node path, oldest first; with `newest_tokens`, only the newest messages that cover at
        least that many tokens; with `newest_messages`, at most that many (the node included); with
        `through_depth`, none deeper than that (a stretch read from its older end)."""
        ...

    async def append(self, request: AppendRequest) -> str:
        """Store new messages (creating the conversation when `conversation_id` is None); raises
        ConversationDeleted when the named conversation no longer exists."""
        ...

    async def complete(self, record: RequestRecord, answer: AppendRequest | None) -> bool:
        """Store the request record and its answer in one transaction; False when the answer's
        conversation was deleted meanwhile (the answer is dropped, the record kept unlinked)."""
        ...

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
        """Newest first; with `text`, only those with a message holding it (case-insensitive for
        ASCII); `since`/`until` bound the time of their latest message (until exclusive)."""
        ...

    async def get_conversation(self, tenant: str, conversation_id: str) -> Conversation | None: ...

    async def conversation_messages(self, tenant: str, conversation_id: str) -> list[StoredMessage]: ...

    async def get_request(self, tenant: str, request_id: str) -> RequestRecord | None: ...

    async def list_requests(
        self, tenant: str, *, conversation_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[RequestRecord]:
        """Request records, newest first (of one conversation, if given)."""
        ...

    async def delete_conversations(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> list[str]:
        """Delete one conversation, or every conversation of one user, with everything stored about it
        (the injected blocks kept with the user's other requests too, which may quote it); returns the
        ids deleted."""
        ...

    async def set_title(self, tenant: str, conversation_id: str, title: str, gist: str | None) -> bool:
        """Store a conversation's title and gist; False when it is gone."""
        ...

    async def forget_sent_context(self, tenant: str, user_id: str) -> int:
        """Drop the injected blocks kept with a user's request records (something they may hold, a
        memory, was deleted); returns how many records had one."""
        ...

    async def aclose(self) -> None: ...


class ResponseStore(Protocol):
    """Responses API responses the client asked to store (`store: true`, the default)."""

    async def save_response(self, response: StoredResponse) -> None: ...

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def delete_response(self, tenant: str, response_id: str) -> bool: ...


class JobQueue(Protocol):
    """The durable job table: background work (embed, compact, extract memory) that survives restarts.

    Jobs can also be enqueued in the same transaction as the messages that cause them
    (`AppendRequest.jobs`). A job with a `key` is not enqueued again while one with the same kind and key
    is queued or running. Leasing is exclusive: two workers, in one process or several sharing a database,
    never hold the same job; a lease that expires (a worker died) makes the job leasable again.
    """

    async def enqueue(self, job: NewJob) -> str | None:
        """Returns the job id, or None when an identical keyed job is already pending."""
        ...

    async def lease(
        self, worker: str, kinds: Sequence[str], lease_seconds: float, limit: int = 1
    ) -> list[Job]: ...

    async def complete(self, job: Job, worker: str) -> bool:
        """Mark done; False when the lease was lost (expired and taken by another worker)."""
        ...

    async def fail(self, job: Job, worker: str, error: str, retry_in: float | None) -> None:
        """Record a failed attempt: retried after `retry_in` seconds, or failed for good when None."""
        ...

    async def release(self, job: Job, worker: str, delay_seconds: float = 0.0) -> bool:
        """Hand a leased job back unfinished (its worker is shutting down, or it waits for other work):
        queued again after `delay_seconds`, the attempt not counted. False when the lease was already
        lost."""
        ...

    async def counts(self, tenant: str | None = None) -> dict[str, int]:
        """Jobs per status (queued, running, done, failed)."""
        ...

    async def oldest_queued(self) -> dict[str, float]:
        """Per kind, the seconds the oldest queued job that is due has waited since it became due (a
        delayed or backed-off job counts from its run-after time, not before); kinds with none are left
        out, so an empty queue gives {}. One query, all tenants."""
        ...

    async def pending(self, kind: str, key_prefix: str, tenant: str | None = None) -> list[JSONObject]:
        """Payloads of the queued and running jobs of `kind` whose key starts with `key_prefix` (e.g. one
        conversation's indexing backlog)."""
        ...

    async def queued(self, kind: str, key_prefix: str, tenant: str) -> list[tuple[str, JSONObject]]:
        """(key, payload) of the jobs of `kind` waiting to run (not running) whose key starts with
        `key_prefix`, oldest first: what a running job may `absorb`."""
        ...

    async def absorb(self, job: Job, keys: Sequence[str], payload: JSONObject) -> list[str]:
        """Fold queued jobs of `job`'s kind and tenant into `job`, which is leased (`job.worker`): in one
        transaction, those with these keys still queued are deleted and `job`'s payload becomes `payload`
        (the caller's union of their work and its own, so a retry of `job` still does all of it). Returns
        the keys absorbed: none when the lease was lost, and never a job another worker leased meanwhile."""
        ...

    async def failures(self, tenant: str | None = None, limit: int = 20) -> list[JobState]:
        """The newest jobs that failed for good, with their errors."""
        ...

    async def retry(self, tenant: str, job_id: str) -> bool:
        """Queue a job that failed for good once more; False when it is not one (or its key is pending)."""
        ...

    async def prune(self, done_for_seconds: float) -> int:
        """Delete jobs done longer ago than that; failed jobs stay for inspection. Returns how many."""
        ...


class SummaryStore(Protocol):
    """Rolling summaries keyed by the node they cover up to, and each conversation's compaction cursor."""

    async def summaries(self, tenant: str, conversation_id: str, level: str = "global") -> list[Summary]:
        """A conversation's summaries of one level, deepest first."""
        ...

    async def cursor(self, tenant: str, conversation_id: str) -> tuple[str | None, int]:
        """(node the newest compaction reached, version): read before compacting."""
        ...

    async def save(self, tenant: str, conversation_id: str, version: int, rows: Sequence[NewSummary]) -> bool:
        """Store `rows` and move the cursor to the last one, only if the cursor is still at `version`
        (`UPDATE ... WHERE version = ?`): of two workers racing, one wins and the other's work is dropped."""
        ...


class EpochStore(Protocol):
    """A conversation's prompt epochs, each keyed by the stored message its window starts at (valid for
    every branch through it), with what its stable block was pinned to (design.md section 14)."""

    async def epochs(self, tenant: str, conversation_id: str) -> list[tuple[str, JSONObject]]:
        """(start node, pins) of every epoch of a conversation, the deepest start first."""
        ...

    async def pin_epoch(
        self, tenant: str, conversation_id: str, node_id: str, depth: int, pins: JSONObject
    ) -> None:
        """Store an epoch; one already stored at that node wins (replicas racing agree on the first)."""
        ...


TraceValue: TypeAlias = "str | int | float | bool | None"  # None: the attribute is left out


class Span(Protocol):
    """One timed step of a request (OpenTelemetry's span, behind the port)."""

    def set(self, attributes: Mapping[str, TraceValue]) -> None: ...

    def fail(self, message: str) -> None:
        """Mark the span as failed (an error status with the message; never message text)."""
        ...

    def end(self) -> None: ...


class Trace(Protocol):
    """One request's spans: `root` is the request's own, `start` opens a child of it (explicitly: a
    stream's spans end after the handler returned, outside its context)."""

    @property
    def root(self) -> Span: ...

    def start(
        self, name: str, attributes: Mapping[str, TraceValue] | None = None, *, client: bool = False
    ) -> Span:
        """A child of the root; `client`: a call out of the gateway (the provider's)."""
        ...


class Tracer(Protocol):
    # False for the no-op tracer: the request path then builds no attributes at all.
    recording: bool

    def trace(self, name: str, attributes: Mapping[str, TraceValue]) -> Trace:
        """A new request trace, its root span a server span called `name`."""
        ...

    def shutdown(self) -> None:
        """Export what is buffered and stop."""
        ...


@dataclass(frozen=True, slots=True)
class Similarity:
    """Where an embedding model's cosines fall, as the thresholds that read them.

    The defaults are MiniLM's; a model whose cosines sit in another band gives its own, at the same
    quantiles of what unrelated turns score on the LoCoMo dev questions (benchmarks/similarity_bands.py:
    MiniLM's 0.35 and 0.5 lie at their 77th and 97th percentiles; e5 puts the median unrelated turn at
    0.78 where MiniLM puts it at 0.25).
    """

    fair: float = 0.35  # a question's best match worth history at all
    close: float = 0.5  # a match worth more room than the recent window's tail
    # A statement's match earns the volatile tail (uncached on every turn it appears) only this close:
    # the best of hundreds of old turns passes `close` by chance in most turns of a long chat.
    tail: float = 0.6
    relevant: float = 0.30  # a memory relevant to the question
    duplicate: float = 0.92  # two memories say the same
    # Related enough for the model to decide: low on purpose ("I live in Lisbon" / "I moved to Berlin":
    # 0.36 with MiniLM); showing a few unrelated memories costs only tokens in one call.
    related: float = 0.33
    # Reads English only: on a question mostly in Chinese, Japanese or Korean its ranking is near noise.
    english_only: bool = False


class Embedder(Protocol):
    """Text to unit-length vectors. Batches run off the event loop; one query is the request path's cost."""

    @property
    def model(self) -> str:
        """Stable id of the model: vectors of different models never share an index table."""
        ...

    @property
    def similarity(self) -> Similarity:
        """Where this model's cosines fall (the thresholds retrieval and memory read them by)."""
        ...

    @property
    def dimensions(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised vector per text, in order. Raises `EmbeddingError` on failure."""
        ...

    async def embed_query(self, text: str) -> list[float]:
        """One text on the request path: it must not queue behind background batches."""
        ...

    async def aclose(self) -> None: ...


class VectorIndex(Protocol):
    """Message texts and their vectors (LanceDB): semantic and full-text search, always tenant-filtered.

    Rows are added with their vectors, or with none (texts first for a long stretch, or the embedder
    failed: keyword search still finds them); adding them again with vectors fills those in, as
    `set_vectors` does by id. Both are idempotent (keyed by `IndexRow.id`).
    """

    async def add(self, rows: Sequence[IndexRow]) -> None:
        """Insert rows not held yet; a row held without a vector gets the one given now. A vector already
        set is never changed, so adding the same rows again is harmless."""
        ...

    async def set_vectors(self, tenant: str, vectors: dict[str, list[float]]) -> None:
        """Fill in the vectors of rows already added (row id -> vector)."""
        ...

    async def search(self, query: SearchQuery) -> SearchResult:
        """Semantic (when `query.vector` is set) and keyword rankings, each best first."""
        ...

    async def prepare(self, query: SearchQuery) -> None:
        """Get ready for a semantic search like `query` whose vector is still being computed (e.g. read
        the conversation's vectors into memory meanwhile). Optional: may do nothing."""
        ...

    async def delete(
        self, tenant: str, *, conversation_id: str | None = None, user_id: str | None = None
    ) -> None:
        """Remove the rows of one conversation, or of every conversation of one user."""
        ...

    async def rows_of(self, tenant: str, conversation_id: str) -> list[tuple[str, bool]]:
        """The row ids held for one conversation, each with whether its vector is set (one pair per row
        stored: an id held twice shows twice). For checks of the store, not the request path."""
        ...

    async def aclose(self) -> None: ...
