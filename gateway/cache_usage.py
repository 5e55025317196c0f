"""What the provider's prompt cache did for one request: any provider's usage object read into one record.

Shapes read (`normalise`):
- OpenAI chat completions: `prompt_tokens` (cache reads included), `prompt_tokens_details.cached_tokens`;
  the chat form the gateway stores for other providers adds Anthropic's `cache_read_input_tokens` and
  `cache_creation_input_tokens` at the top level, as LiteLLM does; DeepSeek's `prompt_cache_hit_tokens`.
- OpenAI Responses: `input_tokens` (cache reads included), `input_tokens_details.cached_tokens`.
- Anthropic messages: `input_tokens` counts neither `cache_read_input_tokens` nor
  `cache_creation_input_tokens`.
- A stored chat usage with the gateway's own reading under `normalised` (persist writes it).

The three input kinds part the input: cached (read from the cache), written (to it: Anthropic bills
these above the input price) and uncached (neither).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.ports import JSON, JSONObject
from gateway.prefix_ledger import CACHE_TTL_SECONDS, PreviousTurn

STORED_KEY = "normalised"  # the key persist adds to a request's stored usage


@dataclass(frozen=True, slots=True)
class CacheUsage:
    input_tokens: int  # every input token: cached, written and uncached
    cached_tokens: int
    cache_write_tokens: int
    uncached_tokens: int
    output_tokens: int

    @classmethod
    def of(cls, input_tokens: int, cached: int, written: int, output: int) -> CacheUsage:
        """From the provider's counts; an input smaller than its cached part counted them apart."""
        cached, written = max(cached, 0), max(written, 0)
        if input_tokens < cached + written:
            input_tokens += cached + written
        return cls(input_tokens, cached, written, input_tokens - cached - written, max(output, 0))

    @property
    def hit_share(self) -> float | None:
        """Cached input over all input; None without input."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else None

    def to_json(self) -> JSONObject:
        return {
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "uncached_tokens": self.uncached_tokens,
            "output_tokens": self.output_tokens,
        }

    def report(self) -> JSONObject:
        """The ContextReport's `cache` entry."""
        return {
            "cached": self.cached_tokens,
            "written": self.cache_write_tokens,
            "uncached": self.uncached_tokens,
        }


def normalise(usage: JSON) -> CacheUsage | None:
    """Any of the shapes above as one record; None when `usage` is not a usage object."""
    if not isinstance(usage, dict):
        return None
    stored = usage.get(STORED_KEY)
    if isinstance(stored, dict) and isinstance(stored.get("input_tokens"), int):
        return CacheUsage.of(
            _count(stored, "input_tokens"),
            _count(stored, "cached_tokens"),
            _count(stored, "cache_write_tokens"),
            _count(stored, "output_tokens"),
        )
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        details = _details(usage, "prompt_tokens_details")
        cached = (
            _count(details, "cached_tokens")
            or _count(usage, "cache_read_input_tokens")
            or _count(usage, "prompt_cache_hit_tokens")
        )
        written = (
            _count(usage, "cache_creation_input_tokens")
            or _count(details, "cache_creation_tokens")
            or _count(details, "cache_write_tokens")
        )
        return CacheUsage.of(
            _count(usage, "prompt_tokens"), cached, written, _count(usage, "completion_tokens")
        )
    anthropic = "input_tokens_details" not in usage and any(
        key in usage for key in ("cache_read_input_tokens", "cache_creation_input_tokens")
    )
    if anthropic:
        cached, written = (
            _count(usage, "cache_read_input_tokens"),
            _count(usage, "cache_creation_input_tokens"),
        )
        return CacheUsage.of(
            _count(usage, "input_tokens") + cached + written, cached, written, _count(usage, "output_tokens")
        )
    if "input_tokens" in usage or "output_tokens" in usage:  # Responses (or Anthropic without cache fields)
        cached = _count(_details(usage, "input_tokens_details"), "cached_tokens")
        return CacheUsage.of(_count(usage, "input_tokens"), cached, 0, _count(usage, "output_tokens"))
    return None


def stored_usage(usage: JSONObject | None, reading: CacheUsage | None) -> JSONObject | None:
    """A request's usage as the store keeps it: the provider's fields, the gateway's reading beside them."""
    if usage is None or reading is None:
        return usage
    return {**usage, STORED_KEY: reading.to_json()}


def _details(usage: JSONObject, key: str) -> JSONObject:
    details = usage.get(key)
    return details if isinstance(details, dict) else {}


def _count(data: JSONObject, key: str) -> int:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# OpenAI caches in 128-token steps from 1,024: a prefix that long may still show up to a step short.
CACHE_STEP_TOKENS = 128
CACHE_MIN_TOKENS = 1024


def miss_reason(report: JSONObject, reading: CacheUsage, previous: PreviousTurn | None = None) -> str | None:
    """Why the provider's cache held less of the prompt than the previous turn also sent (the report's
    `cache_prefix_tokens`), or None when it held that much (what follows it is new, or the tail, by
    design). `previous`: when this conversation's previous turn came, and whether the client's own
    prefix has changed since."""
    prefix = report.get("cache_prefix_tokens")
    if (
        not isinstance(prefix, int)
        or reading.cached_tokens + reading.cache_write_tokens + CACHE_STEP_TOKENS > prefix
    ):
        return None
    epoch = report.get("epoch")
    if isinstance(epoch, dict) and epoch.get("new") and not report.get("history_unchanged"):
        return "an epoch began: the window moved and the stable block was rebuilt"
    if isinstance(epoch, dict) and epoch.get("borrowed"):
        return "the volatile tail took the window's room for a question about the past (this turn only)"
    if prefix < CACHE_MIN_TOKENS:
        return "the prefix is shorter than the provider caches"
    if previous is None:
        return "the cache no longer held the prefix (expired or evicted), or the client changed it since its last turn"
    if previous.prefix_changed:
        return "the client changed its prefix (model, system prompt or tools) since its last turn"
    if previous.seconds_ago > CACHE_TTL_SECONDS:
        return f"expired: {previous.seconds_ago / 60:.0f} minutes since the previous turn, past the provider's cache lifetime"
    return "the provider evicted the prefix (within its lifetime, the client's prefix unchanged)"
