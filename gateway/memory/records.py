"""Plain records that cross the memory ports: memories, their sources and history, and searches."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime

from gateway.ports import JSONObject

MEMORY_TYPES = ("preference", "profile", "project", "constraint", "stable_fact", "event")
ACTIVE, SUPERSEDED, DELETED = "active", "superseded", "deleted"
MEMORY_STATUSES = (ACTIVE, SUPERSEDED, DELETED)
USER_SCOPE = "user"  # read in every conversation of the user; any other scope is a project key

_SPACE = re.compile(r"\s+")
_PUNCT_END = re.compile(r"[\s.!?。]+$")  # after NFKC, fullwidth ! and ? are ASCII


def normalised(content: str) -> str:
    """The form two memories are compared in for exact duplicates: NFKC, case-folded, one space, no
    trailing full stop."""
    text = unicodedata.normalize("NFKC", content).casefold()
    return _PUNCT_END.sub("", _SPACE.sub(" ", text).strip())


def content_hash(content: str) -> str:
    return hashlib.sha256(normalised(content).encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class MemorySource:
    """A message a memory was learnt from (or confirmed by)."""

    message_id: str
    conversation_id: str | None


@dataclass(frozen=True, slots=True)
class Memory:
    """One atomic memory: a short statement that stands alone (names, not pronouns).

    `history` lists every change, oldest first, each `{"at", "by", "action", "content"}` where
    `content` is the text *before* the change (None for creation). `superseded_by` links a memory a newer
    fact contradicted to that newer memory.
    """

    id: str
    tenant: str
    user_id: str
    scope: str
    type: str
    content: str
    tags: tuple[str, ...]
    confidence: float
    event_at: datetime | None  # when what it says happened or was true, when stated
    status: str
    superseded_by: str | None
    created_at: datetime
    updated_at: datetime
    sources: tuple[MemorySource, ...] = ()
    history: tuple[JSONObject, ...] = ()

    @property
    def hash(self) -> str:
        return content_hash(self.content)


@dataclass(frozen=True, slots=True)
class MemoryDraft:
    """A memory before it is stored: what extraction or the user (create, import) says."""

    content: str
    type: str = "stable_fact"
    scope: str = USER_SCOPE
    tags: tuple[str, ...] = ()
    confidence: float = 1.0
    event_at: datetime | None = None
    status: str = ACTIVE


@dataclass(frozen=True, slots=True)
class Profile:
    """One user's profile document: `generated` by the profile job from their active memories, and
    `edited`, the user's own version, which is shown instead whenever it is set and which the job never
    touches."""

    tenant: str
    user_id: str
    generated: str | None
    edited: str | None
    memories: int  # active memories the generated text was written from
    generated_at: datetime | None
    edited_at: datetime | None
    # `covers(memory)` keys of the memories the generated text was written from (as they read then)
    covered: frozenset[str] = frozenset()

    @property
    def shown(self) -> str | None:
        return self.edited if self.edited is not None else self.generated

    @staticmethod
    def key(memory: Memory) -> str:
        return f"{memory.id}:{memory.hash}"

    def covers(self, memory: Memory) -> bool:
        """Whether the shown text already says what `memory` says: the user's own edit covers what was
        known when they made it; the generated text, exactly the memories (and contents) it was written
        from, whatever was committed while the model wrote it."""
        if self.edited is not None and self.edited_at is not None:
            return memory.updated_at <= self.edited_at
        return self.key(memory) in self.covered


@dataclass(frozen=True, slots=True)
class MemoryFilter:
    """Which memories of one user to list; every field narrows, None means any."""

    user_id: str
    scopes: tuple[str, ...] | None = None
    types: tuple[str, ...] | None = None
    tag: str | None = None
    statuses: tuple[str, ...] | None = (ACTIVE,)
    since: datetime | None = None  # by event time, else creation time
    until: datetime | None = None
    text: str | None = None  # case-insensitive substring of the content
    limit: int = 100
    offset: int = 0


@dataclass(frozen=True, slots=True)
class MemoryChanges:
    """What one write does, in one transaction: new memories, memories replaced whole (edited,
    superseded), sources linked to existing memories, and the extraction cursor of a conversation."""

    tenant: str
    added: tuple[Memory, ...] = ()
    updated: tuple[Memory, ...] = ()
    sources: tuple[tuple[str, MemorySource], ...] = ()  # (memory id, source) for existing memories
    cursor: tuple[str, str] | None = None  # (conversation id, node id extraction read up to)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """One active memory in the vector index (superseded and deleted ones are removed from it)."""

    id: str
    tenant: str
    user_id: str
    scope: str
    type: str
    text: str
    created_at: datetime  # the event time when known, else when it was stored (recency weight)
    vector: list[float] | None = None


@dataclass(frozen=True, slots=True)
class MemoryQuery:
    tenant: str
    user_id: str
    scopes: tuple[str, ...]  # the memories of these scopes only (e.g. ("user", "project-a"))
    text: str
    vector: list[float] | None  # None: keyword search only
    limit: int


@dataclass(frozen=True, slots=True)
class MemoryHit:
    memory_id: str
    scope: str
    created_at: datetime
    score: float  # cosine similarity for semantic hits, BM25 for keyword hits


@dataclass(frozen=True, slots=True)
class MemorySearchResult:
    semantic: list[MemoryHit] = field(default_factory=list)
    keyword: list[MemoryHit] = field(default_factory=list)
