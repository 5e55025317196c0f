"""What one chat request carries through the pipeline: the parsed call in, the outcome out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from gateway.ports import Headers, JSONObject, Trace
from gateway.tracing import NULL_TRACE

OutcomeStatus = Literal["complete", "partial", "failed"]


@dataclass(slots=True)
class HistoryItem:
    """One message of the history the model should see, with its stored node and token count."""

    message: JSONObject
    tokens: int | None  # None: an old stored message whose count was not read (beyond the budget)
    node_id: str | None = None


@dataclass(frozen=True, slots=True)
class QuestionVector:
    """The question's embedding, started as the request arrived (context/prefetch.py)."""

    text: str
    future: asyncio.Future[list[float]]
    # The question as written, where `text` leaves out the participants it names (ranking.for_meaning):
    # both rankings by meaning are searched.
    written: QuestionVector | None = None

    def of(self, text: str) -> asyncio.Future[list[float]] | None:
        """The embedding begun for `text` (None: none was, or it was cancelled)."""
        for vector in (self, self.written):
            if vector is not None and vector.text == text and not vector.future.cancelled():
                return vector.future
        return None


@dataclass(frozen=True, slots=True)
class MemoryScope:
    """Whose long-term memory a call reads and feeds, and which of it: the user's own scope and, inside a
    project, that project's."""

    user_id: str
    project: str | None = None

    @property
    def scopes(self) -> tuple[str, ...]:
        return ("user",) if self.project is None else ("user", self.project)

    @property
    def scope(self) -> str:
        """Where a memory learnt in this call goes unless it is about the user at large."""
        return self.project or "user"


@dataclass(slots=True)
class CallState:
    """What the pipeline steps learn about a call and hand to each other (identify -> build -> persist)."""

    conversation_id: str | None = None
    user_id: str | None = None
    leaf_id: str | None = None  # the newest stored message of the request: the answer's parent
    answer_id: str | None = None  # the stored answer's node, once persisted
    # The conversation was deleted while this request answered: its answer is kept nowhere.
    conversation_deleted: bool = False
    leaf_depth: int = -1
    leaf_path_tokens: int = 0
    appended: int = 0  # messages this request added to the store (the answer not counted)
    items: list[HistoryItem] = field(default_factory=list)
    history_tokens: int = 0  # tokens of all items, known even where single counts were not read
    summary_path_tokens: int = 0  # how much of the path the summary used for this request covers
    # The client named the conversation: it may rely on the store for history (thin mode), so the answer
    # is stored before the response completes rather than after.
    explicit: bool = False
    thin: bool = False
    report: JSONObject | None = None
    sent_context: JSONObject | None = None  # the injected block as sent (kept with the request record)
    question: QuestionVector | None = None
    original_tokens: int | None = None
    sent_tokens: int | None = None
    memory: MemoryScope | None = None  # None: this call neither reads nor feeds memory
    incognito: bool = False  # the client asked for no memory (X-Gateway-Memory: off)
    memory_tool: bool = False  # the gateway offered the model its memory_search tool (it answers it)
    # Where a provider's prompt-cache breakpoint belongs in the rebuilt request: indices into the sent
    # chat `messages` (the end of the stable prefix, the end of the window); the Anthropic doors mark the
    # last content block of each, within Anthropic's limit of four with the client's own.
    cache_breaks: tuple[int, ...] = ()
    # The history holds the provider's own compaction (provider_compaction.py): forwarded as sent, and
    # the gateway queues no summary of its own across it.
    provider_compaction: bool = False


@dataclass(slots=True)
class ChatCall:
    request_id: str
    tenant: str
    body: JSONObject
    raw: bytes
    headers: Headers
    started: float
    state: CallState = field(default_factory=CallState)
    trace: Trace = NULL_TRACE  # the request's spans (no-op unless tracing is configured)
    # The edge can answer the gateway's own tool calls on this request's way (a chat-completions
    # upstream); False on the native doors, where the memory tool is then not offered.
    answers_tools: bool = True

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def client_wants_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True


@dataclass(slots=True)
class ChatOutcome:
    """What came back: the assembled assistant message(s), usage, and how the exchange ended."""

    status: OutcomeStatus
    http_status: int
    choices: list[JSONObject] = field(default_factory=list)
    usage: JSONObject | None = None
    error: str | None = None
    model: str | None = None
    client_disconnected: bool = False  # the client left before the answer was complete
