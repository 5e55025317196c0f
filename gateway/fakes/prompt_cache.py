"""The fake upstreams' prompt cache: OpenAI's automatic prefix cache and Anthropic's `cache_control` breakpoints.

A request is linearised into real tokens (o200k_base, or the model's own tiktoken encoding, loaded offline
as `gateway/adapters/tiktoken_tokenizer.py` does) in prompt order, each piece encoded on its own, so two
requests that share a leading run of messages share a leading run of tokens:

* chat completions: tools (their JSON), then each message framed as OpenAI counts it (3 tokens of framing,
  the role, name, tool_call_id, content, tool calls' JSON), then 3 tokens priming the reply; the count
  equals `TiktokenTokenizer.count_messages` plus the tools;
* responses: tools, instructions, then each input item (messages as above, other items as their JSON);
* Anthropic messages: blocks in the order tools, system, messages (the role's framing opens a message's
  first block); `cache_control` is not part of a block's tokens.

OpenAI (`openai_chat`, `openai_responses`): prompts of `min_tokens` (1,024) or more are cacheable; the
cached part is the longest prefix of `min_tokens + step * k` tokens seen within the TTL, and every request
stores its own boundaries (refreshing those it hit). Caches are isolated by (model, prompt_cache_key).

Anthropic (`anthropic`): each breakpoint's prefix (up to and including its block) is an entry. A request
reads the longest live entry ending at a block boundary at or up to `lookback_blocks` before one of its
breakpoints, writes its breakpoints past that point (`cache_creation_input_tokens`) and refreshes the rest;
prefixes under `min_tokens` are never cached; more than 4 breakpoints is `BreakpointLimitError`.

Every measurement is kept as a `CacheUsage` (`records()`, `totals()`), for tests and benchmarks.
"""

from __future__ import annotations

import hashlib
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import orjson
import tiktoken

from gateway.adapters.tiktoken_tokenizer import TOKENS_PER_IMAGE, encoding_name, load_encoding
from gateway.ports import JSON, JSONObject

DEFAULT_TTL = 300.0  # seconds of inactivity (OpenAI's in-memory retention; Anthropic's default "5m")
ANTHROPIC_TTLS = {"5m": 300.0, "1h": 3600.0}
MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20

# Token ids above every encoding's vocabulary stand for the chat template's special tokens.
_IM_START, _IM_SEP, _IM_END, _TOOLS, _SYSTEM = 200_264, 200_266, 200_265, 200_270, 200_271
_IMAGE_BASE = 1 << 30  # an image's stand-in tokens, derived from its bytes so distinct images differ
_HASH_BYTES = 16
_TOKEN_CACHE_CHARS = 16_000_000  # the encoded texts kept, least recently used dropped first
_TOKEN_CACHE_MIN_CHARS = 48  # shorter texts are encoded again: cheaper than keeping them


class BreakpointLimitError(ValueError):
    """More `cache_control` blocks than Anthropic accepts (its 400 invalid_request_error)."""

    def __init__(self, found: int, limit: int = MAX_BREAKPOINTS) -> None:
        super().__init__(f"A maximum of {limit} blocks with cache_control may be provided. Found {found}.")
        self.found = found


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """One request as the provider bills it: prompt_tokens = uncached + cached + cache_write."""

    prompt_tokens: int
    cached_tokens: int  # read from the cache
    cache_write_tokens: int = 0  # Anthropic's cache_creation_input_tokens; OpenAI bills no writes: 0
    tag: str = ""  # what the fake says the request was ("chat", "summary", "memory", "responses"...)

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens - self.cache_write_tokens


@dataclass(frozen=True, slots=True)
class CacheTotals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens - self.cache_write_tokens

    def add(self, usage: CacheUsage) -> CacheTotals:
        return CacheTotals(
            self.requests + 1,
            self.prompt_tokens + usage.prompt_tokens,
            self.cached_tokens + usage.cached_tokens,
            self.cache_write_tokens + usage.cache_write_tokens,
        )


@dataclass(frozen=True, slots=True)
class Block:
    """A piece of an Anthropic prompt: its tokens (uint32 bytes) and, at a breakpoint, its TTL."""

    tokens: bytes
    ttl: float | None = None

    @property
    def count(self) -> int:
        return len(self.tokens) // 4


class Encoder:
    """Text to token bytes (uint32 per token) for one encoding; long texts' tokens are kept (they recur)."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._encoding = encoding
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def text(self, text: str) -> bytes:
        if len(text) < _TOKEN_CACHE_MIN_CHARS:
            return array("I", self._encoding.encode_ordinary(text)).tobytes()
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                return cached
        tokens = array("I", self._encoding.encode_ordinary(text)).tobytes()
        with self._lock:
            if text not in self._cache and len(text) <= _TOKEN_CACHE_CHARS // 8:
                self._cache[text] = tokens
                self._chars += len(text)
                while self._chars > _TOKEN_CACHE_CHARS:
                    dropped, _ = self._cache.popitem(last=False)
                    self._chars -= len(dropped)
        return tokens

    def json(self, value: JSON) -> bytes:
        return self.text(orjson.dumps(value).decode())

    @staticmethod
    def image(part: JSON) -> bytes:
        # OpenAI's low-detail price, as the gateway's tokenizer counts an image; the ids follow its bytes.
        seed = hashlib.blake2b(orjson.dumps(part), digest_size=8).digest()
        start = _IMAGE_BASE + int.from_bytes(seed[:3], "big")
        return array("I", range(start, start + TOKENS_PER_IMAGE)).tobytes()


def _special(*ids: int) -> bytes:
    return array("I", ids).tobytes()


_IMAGE_TYPES = frozenset(
    {"image_url", "input_image", "image", "input_audio", "file", "input_file", "document"}
)


def _parts(encoder: Encoder, content: JSON) -> bytes:
    """Message content: a string, or parts whose text counts as text and images as a fixed price."""
    if isinstance(content, str):
        return encoder.text(content)
    if not isinstance(content, list):
        return b""
    out = bytearray()
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            out += encoder.text(str(part["text"]))
        elif isinstance(part, dict) and part.get("type") in _IMAGE_TYPES:
            out += encoder.image(part)
        else:
            out += encoder.json(part)
    return bytes(out)


def chat_message(encoder: Encoder, message: JSON) -> bytes:
    """One chat message as OpenAI frames it: <start> role [name] <sep> content ... <end>."""
    if not isinstance(message, dict):
        return _special(_IM_START, _IM_SEP, _IM_END)
    out = bytearray(_special(_IM_START))
    for key in ("role", "name"):
        value = message.get(key)
        if isinstance(value, str):
            out += encoder.text(value)
    out += _special(_IM_SEP)
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        out += encoder.text(call_id)
    out += _parts(encoder, message.get("content"))
    for key in ("tool_calls", "function_call"):
        value = message.get(key)
        if value is not None:
            out += encoder.json(value)
    out += _special(_IM_END)
    return bytes(out)


def _reply_primer(encoder: Encoder) -> bytes:
    return _special(_IM_START) + encoder.text("assistant") + _special(_IM_SEP)


def chat_segments(encoder: Encoder, body: JSONObject) -> list[bytes]:
    """A chat completion request's prompt in order: tools, each message, the reply's primer."""
    segments: list[bytes] = []
    tools = body.get("tools") or body.get("functions")
    if tools:
        segments.append(_special(_TOOLS) + encoder.json(tools))
    messages = body.get("messages")
    segments.extend(chat_message(encoder, m) for m in (messages if isinstance(messages, list) else []))
    segments.append(_reply_primer(encoder))
    return segments


def responses_segments(encoder: Encoder, body: JSONObject) -> list[bytes]:
    """A Responses request's prompt in order: tools, instructions, each input item, the reply's primer."""
    segments: list[bytes] = []
    tools = body.get("tools")
    if tools:
        segments.append(_special(_TOOLS) + encoder.json(tools))
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        segments.append(chat_message(encoder, {"role": "system", "content": instructions}))
    items = body.get("input")
    if isinstance(items, str):
        segments.append(chat_message(encoder, {"role": "user", "content": items}))
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and "role" in item:
            segments.append(chat_message(encoder, item))
        else:  # function calls, their outputs, reasoning: their JSON, framed as one message
            segments.append(_special(_IM_START) + encoder.json(item) + _special(_IM_END))
    segments.append(_reply_primer(encoder))
    return segments


def _breakpoint(block: JSON, default_ttl: float) -> float | None:
    control = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(control, dict):
        return None
    ttl = control.get("ttl")
    return ANTHROPIC_TTLS.get(ttl, default_ttl) if isinstance(ttl, str) else default_ttl


def count_breakpoints(body: JSONObject) -> int:
    """The `cache_control` blocks of a Messages request: tools, system blocks, messages' content blocks."""
    tools, system, messages = body.get("tools"), body.get("system"), body.get("messages")
    blocks: list[JSON] = [
        *(tools if isinstance(tools, list) else []),
        *(system if isinstance(system, list) else []),
    ]
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        blocks.extend(content if isinstance(content, list) else [])
    return sum(
        1 for block in blocks if isinstance(block, dict) and isinstance(block.get("cache_control"), dict)
    )


def _anthropic_block(encoder: Encoder, block: JSON) -> bytes:
    if isinstance(block, str):
        return encoder.text(block)
    if not isinstance(block, dict):
        return encoder.json(block)
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return encoder.text(str(block["text"]))
    if block.get("type") in _IMAGE_TYPES:
        return encoder.image({k: v for k, v in block.items() if k != "cache_control"})
    return encoder.json({k: v for k, v in block.items() if k != "cache_control"})


def anthropic_blocks(encoder: Encoder, body: JSONObject, default_ttl: float = DEFAULT_TTL) -> list[Block]:
    """An Anthropic request's prompt as blocks in Anthropic's order: tools, system, messages."""
    blocks: list[Block] = []
    tools = body.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        head = _special(_TOOLS) if index == 0 else b""
        blocks.append(Block(head + _anthropic_block(encoder, tool), _breakpoint(tool, default_ttl)))
    system = body.get("system")
    system_blocks: list[JSON] = system if isinstance(system, list) else [system] if system else []
    for index, block in enumerate(system_blocks):
        head = _special(_SYSTEM) if index == 0 else b""
        blocks.append(Block(head + _anthropic_block(encoder, block), _breakpoint(block, default_ttl)))
    messages = body.get("messages")
    turns = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
    for position, message in enumerate(turns):
        # A turn's end opens the next one: a block's prefix ends with its own text, last in its turn or not.
        head = _special(_IM_END) if position else b""
        head += _special(_IM_START) + encoder.text(str(message.get("role"))) + _special(_IM_SEP)
        content = message.get("content")
        parts: list[JSON] = (content or [""]) if isinstance(content, list) else [content]
        for index, part in enumerate(parts):
            tokens = _anthropic_block(encoder, part)
            blocks.append(Block(head + tokens if index == 0 else tokens, _breakpoint(part, default_ttl)))
    return blocks


def _digest(previous: bytes, data: bytes) -> bytes:
    # A chained hash: a prefix's key follows from the previous boundary's key and the tokens since.
    return hashlib.blake2b(previous + data, digest_size=_HASH_BYTES).digest()


class PromptCache:
    """A provider's prompt cache, shared by every request to one fake; thread-safe."""

    def __init__(
        self,
        *,
        ttl: float = DEFAULT_TTL,
        min_tokens: int = 1024,
        step: int = 128,
        lookback_blocks: int = LOOKBACK_BLOCKS,
        max_breakpoints: int = MAX_BREAKPOINTS,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 2_000_000,
        max_records: int = 200_000,
    ) -> None:
        self.ttl = ttl
        self.min_tokens = min_tokens  # Anthropic: 1,024, or 2,048 / 4,096 for some models
        self.step = step
        self.lookback_blocks = lookback_blocks
        self.max_breakpoints = max_breakpoints
        self.clock = clock
        self._max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # key -> (expiry, ttl)
        self._records: deque[CacheUsage] = deque(maxlen=max_records)
        self._totals = CacheTotals()
        self._lock = threading.Lock()
        self._encoders: dict[str, Encoder] = {}

    # ------------------------------------------------------------------------------------ tokens

    def encoder(self, model: str) -> Encoder:
        name = encoding_name(model)
        with self._lock:
            found = self._encoders.get(name)
        if found is not None:
            return found
        loaded = Encoder(load_encoding(name))  # outside the lock: loading takes a while
        with self._lock:
            return self._encoders.setdefault(name, loaded)

    def count_chat(self, body: JSONObject) -> int:
        return sum(len(s) for s in chat_segments(self.encoder(_model(body)), body)) // 4

    def count_responses(self, body: JSONObject) -> int:
        return sum(len(s) for s in responses_segments(self.encoder(_model(body)), body)) // 4

    def count_anthropic(self, body: JSONObject) -> int:
        return sum(b.count for b in anthropic_blocks(self.encoder(_model(body)), body))

    # ------------------------------------------------------------------------------------ OpenAI

    def openai_chat(self, body: JSONObject, tag: str = "chat") -> CacheUsage:
        """Measures a chat completion request against the cache, then stores its prefix."""
        return self._automatic(body, chat_segments(self.encoder(_model(body)), body), tag)

    def openai_responses(self, body: JSONObject, tag: str = "responses") -> CacheUsage:
        return self._automatic(body, responses_segments(self.encoder(_model(body)), body), tag)

    def _automatic(self, body: JSONObject, segments: Iterable[bytes], tag: str) -> CacheUsage:
        data = b"".join(segments)
        total = len(data) // 4
        key = body.get("prompt_cache_key")
        scope = f"openai\0{_model(body)}\0{key if isinstance(key, str) else ''}".encode()
        keys: list[tuple[int, bytes]] = []  # (prefix length, key) at each cacheable boundary
        digest, done = hashlib.blake2b(scope, digest_size=_HASH_BYTES).digest(), 0
        for boundary in range(self.min_tokens, total + 1, self.step):
            digest, done = _digest(digest, data[4 * done : 4 * boundary]), boundary
            keys.append((boundary, digest))
        cached = 0
        with self._lock:
            now = self.clock()
            for boundary, digest in keys:
                if not self._live(digest, now):
                    break
                cached = boundary
            for _, digest in keys:
                self._put(digest, now, self.ttl)
            return self._record(CacheUsage(total, cached, 0, tag))

    # ------------------------------------------------------------------------------------ Anthropic

    def anthropic(self, body: JSONObject, tag: str = "messages") -> CacheUsage:
        """Measures a Messages request at its breakpoints, then writes them (BreakpointLimitError: >4)."""
        blocks = anthropic_blocks(self.encoder(_model(body)), body, self.ttl)
        breakpoints = [i for i, block in enumerate(blocks) if block.ttl is not None]
        if len(breakpoints) > self.max_breakpoints:
            raise BreakpointLimitError(len(breakpoints), self.max_breakpoints)
        digest = hashlib.blake2b(f"anthropic\0{_model(body)}".encode(), digest_size=_HASH_BYTES).digest()
        keys: list[bytes] = []
        ends: list[int] = []
        for block in blocks:
            digest = _digest(digest, block.tokens)
            keys.append(digest)
            ends.append((ends[-1] if ends else 0) + block.count)
        total = ends[-1] if ends else 0
        with self._lock:
            now = self.clock()
            read = -1  # the block the longest live entry ends at
            for point in breakpoints:
                for index in range(point, max(point - self.lookback_blocks, 0) - 1, -1):
                    if read >= 0 and ends[index] <= ends[read]:
                        break  # nothing further back is longer
                    if self._live(keys[index], now):
                        read = index
                        break
            cached = ends[read] if read >= 0 else 0
            written = cached
            if read >= 0:
                self._put(keys[read], now, self._entries[keys[read]][1])
            for point in breakpoints:
                if ends[point] < self.min_tokens:
                    continue  # too short to cache, as Anthropic silently skips it
                ttl = blocks[point].ttl
                assert ttl is not None
                self._put(keys[point], now, ttl)  # past the read point it is a write, before it a refresh
                written = max(written, ends[point])
            return self._record(CacheUsage(total, cached, written - cached, tag))

    # ------------------------------------------------------------------------------------ store

    def _live(self, key: bytes, now: float) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            return False
        if entry[0] <= now:
            del self._entries[key]
            return False
        return True

    def _put(self, key: bytes, now: float, ttl: float) -> None:
        self._entries[key] = (now + ttl, ttl)
        self._entries.move_to_end(key)  # least recently used first: expired entries gather at the front
        while self._entries:
            oldest_key, (expiry, _) = next(iter(self._entries.items()))
            if expiry > now and len(self._entries) <= self._max_entries:
                break
            del self._entries[oldest_key]

    def _record(self, usage: CacheUsage) -> CacheUsage:
        self._records.append(usage)
        self._totals = self._totals.add(usage)
        return usage

    # ------------------------------------------------------------------------------------ stats

    def records(self, tag: str | None = None) -> list[CacheUsage]:
        """Each request measured, oldest first (the newest `max_records`), of one tag or all."""
        with self._lock:
            return [r for r in self._records if tag is None or r.tag == tag]

    def totals(self, tag: str | None = None) -> CacheTotals:
        """Sums over every request measured (with a tag: over the kept records of that tag)."""
        if tag is None:
            with self._lock:
                return self._totals
        totals = CacheTotals()
        for usage in self.records(tag):
            totals = totals.add(usage)
        return totals

    def reset_stats(self) -> None:
        with self._lock:
            self._records.clear()
            self._totals = CacheTotals()

    def clear(self) -> None:
        """Forgets every cached prefix (as if each had expired) and the stats."""
        with self._lock:
            self._entries.clear()
        self.reset_stats()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _model(body: JSONObject) -> str:
    model = body.get("model")
    return model if isinstance(model, str) else ""
